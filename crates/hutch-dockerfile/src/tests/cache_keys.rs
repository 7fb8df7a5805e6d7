//! Step cache keys: same input, same key; a change changes its step's key and every key
//! after it, and none before.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use super::{args, plan_ok};
use crate::{
    base_key, needs_inputs, plan, step_key, BuildPlan, Context, DockerIgnore, Instruction,
};

const DOCKERFILE: &str = "\
FROM scratch
ENV MODE=dev
RUN echo one
COPY app/ /app/
RUN echo two
LABEL stage=final
CMD [\"/app/run\"]
";

/// The key of every step of the target, chained from `scratch`, with COPY inputs hashed
/// from `context`.
fn keys(plan: &BuildPlan, context: &Context) -> Vec<String> {
    let mut parent = base_key("scratch");
    let mut out = Vec::new();
    for step in &plan.target().steps {
        let inputs = match &step.instruction {
            Instruction::Copy(copy) if needs_inputs(step) => {
                let sources = copy.path_sources();
                let entries = context
                    .resolve(&sources, &DockerIgnore::none())
                    .expect("resolves");
                Some(context.hash_entries(&entries).expect("hashes"))
            }
            _ => None,
        };
        let key = step_key(&parent, step, inputs.as_deref());
        out.push(key.clone());
        parent = key;
    }
    out
}

fn context_with(files: &[(&str, &str)]) -> (tempfile::TempDir, Context) {
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, content) in files {
        let path = dir.path().join(path);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(path, content).expect("write");
    }
    let context = Context::open(dir.path()).expect("open");
    (dir, context)
}

/// How many leading keys two runs share, asserting the rest all differ.
fn shared_prefix(a: &[String], b: &[String]) -> usize {
    assert_eq!(a.len(), b.len());
    let same = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    for (x, y) in a.iter().zip(b).skip(same) {
        assert_ne!(x, y, "every key after the first change differs");
    }
    same
}

#[test]
fn the_same_input_gives_the_same_keys() {
    let (_dir, context) = context_with(&[("app/run", "#!/bin/sh\n"), ("app/lib/x", "x")]);
    let first = keys(&plan_ok(DOCKERFILE), &context);
    let again = keys(&plan_ok(DOCKERFILE), &context);
    assert_eq!(first, again);
    assert_eq!(first.len(), 6);
    assert!(first
        .iter()
        .all(|k| k.len() == 64 && k.bytes().all(|b| b.is_ascii_hexdigit())));
    let unique: std::collections::BTreeSet<&String> = first.iter().collect();
    assert_eq!(unique.len(), 6, "every step has its own key");
    // Spacing, comments and line positions are not part of a key.
    let respaced = "# a comment\nFROM scratch\nENV   MODE=dev\nRUN echo one\n\nCOPY app/   /app/\n\
                    RUN echo two\nLABEL stage=final\nCMD [ \"/app/run\" ]\n";
    assert_eq!(keys(&plan_ok(respaced), &context), first);
}

#[test]
fn changed_file_content_changes_the_copy_step_and_those_after_it() {
    let (dir, context) = context_with(&[("app/run", "#!/bin/sh\n"), ("app/lib/x", "x")]);
    let plan = plan_ok(DOCKERFILE);
    let before = keys(&plan, &context);
    fs::write(dir.path().join("app/lib/x"), "changed").expect("write");
    let after = keys(&plan, &context);
    assert_eq!(
        shared_prefix(&before, &after),
        2,
        "ENV and RUN one keep their keys"
    );

    fs::write(dir.path().join("app/lib/x"), "x").expect("write");
    assert_eq!(
        keys(&plan, &context),
        before,
        "back to the same content, same keys"
    );
    fs::set_permissions(
        dir.path().join("app/run"),
        fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    assert_eq!(
        shared_prefix(&before, &keys(&plan, &context)),
        2,
        "a mode change counts"
    );
    fs::write(dir.path().join("app/new"), "").expect("write");
    let with_new_file = keys(&plan, &context);
    assert_eq!(
        shared_prefix(&before, &with_new_file),
        2,
        "a new file counts"
    );
    fs::write(dir.path().join("unrelated"), "not copied").expect("write");
    assert_eq!(
        keys(&plan, &context),
        with_new_file,
        "files the step does not copy do not"
    );
}

#[test]
fn a_changed_env_earlier_changes_every_later_key() {
    let (_dir, context) = context_with(&[("app/run", "#!/bin/sh\n")]);
    let before = keys(&plan_ok(DOCKERFILE), &context);
    let after = keys(
        &plan_ok(&DOCKERFILE.replace("MODE=dev", "MODE=prod")),
        &context,
    );
    assert_eq!(shared_prefix(&before, &after), 0);
}

#[test]
fn a_changed_instruction_changes_its_key_and_later_ones_only() {
    let (_dir, context) = context_with(&[("app/run", "#!/bin/sh\n")]);
    let before = keys(&plan_ok(DOCKERFILE), &context);
    let run_changed = keys(
        &plan_ok(&DOCKERFILE.replace("echo two", "echo 2")),
        &context,
    );
    assert_eq!(shared_prefix(&before, &run_changed), 3);
    let label_changed = keys(
        &plan_ok(&DOCKERFILE.replace("stage=final", "stage=last")),
        &context,
    );
    assert_eq!(
        shared_prefix(&before, &label_changed),
        4,
        "metadata steps chain too"
    );
    let appended = keys(&plan_ok(&format!("{DOCKERFILE}EXPOSE 80\n")), &context);
    assert_eq!(
        &appended[..6],
        &before[..],
        "appending a step keeps the keys before it"
    );
}

#[test]
fn args_change_run_keys_but_proxy_args_do_not() {
    let dockerfile = "FROM scratch\nARG V=1\nRUN echo $V\n";
    let (_dir, context) = context_with(&[]);
    let base = keys(&plan_ok(dockerfile), &context);
    let overridden = plan(dockerfile, &args(&[("V", "2")]), None).expect("plans");
    assert_eq!(shared_prefix(&base, &keys(&overridden, &context)), 0);
    let proxied = plan(
        dockerfile,
        &args(&[("HTTPS_PROXY", "http://proxy:3128")]),
        None,
    )
    .expect("plans");
    assert_eq!(keys(&proxied, &context), base);
}

#[test]
fn the_parent_key_is_part_of_every_key() {
    let plan = plan_ok(DOCKERFILE);
    let step = &plan.target().steps[1];
    assert_ne!(
        step_key(&base_key("scratch"), step, None),
        step_key(&base_key("sha256:abc"), step, None)
    );
    assert_ne!(
        step_key("p", step, None),
        step_key("p", step, Some("inputs"))
    );
}
