//! Multi-stage builds: `COPY --from`, `FROM <stage>`, target selection, skipped stages.

use std::collections::BTreeMap;

use super::{plan_ok, strings};
use crate::{plan, Base, CopyFrom, DockerfileError, Instruction, StageConfig};

const MULTI: &str = "\
FROM debian:12 AS build
RUN make
FROM scratch AS unused
RUN echo never
FROM alpine AS runtime
COPY --from=build /out/app /app
COPY --from=0 /etc/x /x
COPY --from=busybox:latest /bin/busybox /bin/
ENV MODE=prod
FROM runtime AS final
CMD [\"/app\"]
";

fn copy_froms(plan: &crate::BuildPlan, stage: usize) -> Vec<CopyFrom> {
    plan.stage(stage)
        .expect("planned")
        .steps
        .iter()
        .filter_map(|s| match &s.instruction {
            Instruction::Copy(c) => c.from.clone(),
            _ => None,
        })
        .collect()
}

#[test]
fn the_last_stage_is_built_with_what_it_reads_and_unused_stages_are_skipped() {
    let plan = plan_ok(MULTI);
    let indices: Vec<usize> = plan.stages.iter().map(|s| s.index).collect();
    assert_eq!(indices, vec![0, 2, 3]);
    assert_eq!(plan.skipped_stages, vec![1]);
    assert_eq!(plan.stage_count, 4);
    assert_eq!(plan.target().name.as_deref(), Some("final"));
    assert_eq!(plan.target().base, Base::Stage { index: 2 });
    assert_eq!(plan.target().depends_on, vec![2]);
    assert_eq!(plan.stage(2).expect("runtime").depends_on, vec![0]);
    assert_eq!(
        copy_froms(&plan, 2),
        vec![
            CopyFrom::Stage { index: 0 },
            CopyFrom::Stage { index: 0 },
            CopyFrom::Image {
                reference: "busybox:latest".to_owned()
            },
        ]
    );
    assert_eq!(
        plan.images(),
        strings(&["debian:12", "alpine", "busybox:latest"])
    );
    // A stage FROM another starts with that stage's final configuration.
    let runtime = plan.stage(2).expect("runtime");
    assert_eq!(&plan.target().base_config, runtime.config());
    assert_eq!(plan.config().env_var("MODE"), Some("prod"));
    assert_eq!(plan.config().cmd, strings(&["/app"]));
    assert_eq!(plan.target().display_name(), "final");
}

#[test]
fn a_target_builds_only_what_it_needs() {
    let runtime = plan(MULTI, &BTreeMap::new(), Some("runtime")).expect("plans");
    let indices: Vec<usize> = runtime.stages.iter().map(|s| s.index).collect();
    assert_eq!(indices, vec![0, 2]);
    assert_eq!(runtime.skipped_stages, vec![1, 3]);
    assert_eq!(runtime.target().name.as_deref(), Some("runtime"));

    let build = plan(MULTI, &BTreeMap::new(), Some("BUILD")).expect("names are case-insensitive");
    assert_eq!(build.stages.len(), 1);
    assert_eq!(build.images(), strings(&["debian:12"]));

    let unused = plan(MULTI, &BTreeMap::new(), Some("unused")).expect("plans");
    assert_eq!(unused.target().index, 1);
    assert_eq!(unused.target().base, Base::Scratch);
    assert_eq!(unused.target().base_config, StageConfig::scratch());

    let err = plan(MULTI, &BTreeMap::new(), Some("nope")).expect_err("unknown");
    assert_eq!(
        err.to_string(),
        "target stage \"nope\" is not in the Dockerfile (stages: build, unused, runtime, final)"
    );
}

#[test]
fn build_args_only_used_by_skipped_stages_are_unused() {
    let dockerfile = "FROM scratch AS a\nARG ONLY_A\nFROM scratch AS b\nARG ONLY_B\n";
    let args = super::args(&[("ONLY_A", "1"), ("ONLY_B", "2")]);
    let plan = plan(dockerfile, &args, Some("b")).expect("plans");
    assert_eq!(plan.unused_build_args, strings(&["ONLY_A"]));
}

#[test]
fn copy_from_a_later_stage_or_itself_is_refused() {
    let err = plan(
        "FROM scratch AS first\nCOPY --from=second /x /x\nFROM scratch AS second\n",
        &BTreeMap::new(),
        None,
    );
    // `first` is not needed by the last stage, so ask for it.
    assert!(err.is_ok(), "an unused stage is not evaluated");
    let err = plan(
        "FROM scratch AS first\nCOPY --from=second /x /x\nFROM scratch AS second\n",
        &BTreeMap::new(),
        Some("first"),
    )
    .expect_err("later stage");
    assert!(
        matches!(err, DockerfileError::Invalid { line: 2, .. }),
        "{err}"
    );
    let err = plan(
        "FROM scratch\nCOPY --from=0 /x /x\n",
        &BTreeMap::new(),
        None,
    )
    .expect_err("itself");
    assert!(
        err.to_string().contains("must name an earlier stage"),
        "{err}"
    );
}

#[test]
fn a_syntax_error_in_an_unused_stage_still_fails() {
    let err = plan(
        "FROM scratch AS unused\nONBUILD RUN x\nFROM scratch\n",
        &BTreeMap::new(),
        None,
    )
    .expect_err("ONBUILD anywhere");
    assert_eq!(err.line(), Some(2));
}
