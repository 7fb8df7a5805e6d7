//! `RUN --mount`: every type parsed as BuildKit reads it, with its defaults, and the
//! mistakes refused naming the line.

use std::collections::BTreeMap;

use super::{args, plan_ok, steps};
use crate::{
    plan, BindMount, CacheMount, CacheSharing, CopyFrom, Instruction, RunMount, SecretMount,
};

fn mounts_of(dockerfile: &str) -> Vec<RunMount> {
    let plan = plan_ok(dockerfile);
    let run = steps(&plan)
        .iter()
        .find_map(|s| match &s.instruction {
            Instruction::Run(r) => Some(r.clone()),
            _ => None,
        })
        .expect("a RUN step");
    run.mounts
}

fn refused(dockerfile: &str) -> String {
    plan(dockerfile, &BTreeMap::new(), None)
        .expect_err("the Dockerfile is refused")
        .to_string()
}

#[test]
fn a_cache_mount_defaults_its_id_to_the_target_and_takes_its_options() {
    let m = mounts_of("FROM base\nRUN --mount=type=cache,target=/root/.cache/pip pip install x\n");
    assert_eq!(
        m,
        vec![RunMount::Cache(CacheMount {
            target: "/root/.cache/pip".into(),
            id: "/root/.cache/pip".into(),
            sharing: CacheSharing::Shared,
            read_only: false,
            uid: 0,
            gid: 0,
            mode: 0o755,
        })]
    );
    let m = mounts_of(
        "FROM base\nWORKDIR /src\nRUN --mount=type=cache,id=gomod,dst=.cache,sharing=locked,uid=1000,gid=100,mode=0700,ro go build\n",
    );
    assert_eq!(
        m,
        vec![RunMount::Cache(CacheMount {
            target: "/src/.cache".into(),
            id: "gomod".into(),
            sharing: CacheSharing::Locked,
            read_only: true,
            uid: 1000,
            gid: 100,
            mode: 0o700,
        })]
    );
}

#[test]
fn binds_read_the_context_by_default_or_an_earlier_stage() {
    let m = mounts_of("FROM base\nWORKDIR /src\nRUN --mount=target=. make\n");
    assert_eq!(
        m,
        vec![RunMount::Bind(BindMount {
            target: "/src".into(),
            source: ".".into(),
            from: None,
            read_write: false,
        })]
    );
    let plan = plan_ok(
        "FROM base AS tools\nRUN make\nFROM base\nRUN --mount=type=bind,from=tools,source=out/bin,target=/opt/tools,rw /opt/tools/x\n",
    );
    let Instruction::Run(run) = &plan.target().steps[0].instruction else {
        panic!("a RUN");
    };
    assert_eq!(
        run.mounts,
        vec![RunMount::Bind(BindMount {
            target: "/opt/tools".into(),
            source: "/out/bin".into(),
            from: Some(CopyFrom::Stage { index: 0 }),
            read_write: true,
        })]
    );
    assert!(
        plan.target().depends_on.contains(&0),
        "the stage a bind reads is built first"
    );
    let plan =
        plan_ok("FROM base\nRUN --mount=from=registry.test/tools:1,source=/bin,target=/t ls\n");
    assert!(
        plan.images().contains(&"registry.test/tools:1".to_owned()),
        "the image a bind reads is pulled: {:?}",
        plan.images()
    );
}

#[test]
fn secrets_default_to_run_secrets_and_can_be_variables() {
    let m = mounts_of(
        "FROM base\nRUN --mount=type=secret,id=npmrc --mount=type=secret,id=token,env=TOKEN,required \
         --mount=type=secret,id=key,target=/root/key,mode=0440,uid=5 true\n",
    );
    let secret = |id: &str, target: Option<&str>, env: Option<&str>, required, uid, mode| {
        RunMount::Secret(SecretMount {
            id: id.into(),
            target: target.map(Into::into),
            env: env.map(Into::into),
            required,
            uid,
            gid: 0,
            mode,
        })
    };
    assert_eq!(
        m,
        vec![
            secret("npmrc", Some("/run/secrets/npmrc"), None, false, 0, 0o400),
            secret("token", None, Some("TOKEN"), true, 0, 0o400),
            secret("key", Some("/root/key"), None, false, 5, 0o440),
        ]
    );
    let m = mounts_of("FROM base\nRUN --mount=type=secret,target=/etc/pip.conf true\n");
    assert_eq!(
        m,
        vec![secret(
            "pip.conf",
            Some("/etc/pip.conf"),
            None,
            false,
            0,
            0o400
        )]
    );
}

#[test]
fn mount_options_take_build_args() {
    let plan = plan(
        "FROM base\nARG CACHE=/var/cache/apt\nRUN --mount=type=cache,target=${CACHE} apt-get update\n",
        &args(&[("CACHE", "/var/cache/x")]),
        None,
    )
    .expect("plans");
    let Instruction::Run(run) = &plan.target().steps[1].instruction else {
        panic!("a RUN");
    };
    assert_eq!(run.mounts[0].target(), Some("/var/cache/x"));
}

#[test]
fn a_run_without_mounts_keeps_its_cache_key_json() {
    let plan = plan_ok("FROM base\nRUN true\n");
    let json = serde_json::to_string(&plan.target().steps[0].instruction).expect("json");
    assert!(!json.contains("mounts"), "{json}");
}

#[test]
fn mount_mistakes_are_refused_naming_the_line() {
    let cases = [
        ("RUN --mount=type=cache true", "a target=/path is needed"),
        (
            "RUN --mount=type=volume,target=/x true",
            "type=volume is not a mount type",
        ),
        (
            "RUN --mount=type=cache,target=/x,env=A true",
            "`env` is not an option of type=cache",
        ),
        (
            "RUN --mount=type=cache,target=/x,target=/y true",
            "`target` is given twice",
        ),
        (
            "RUN --mount=type=cache,target=/x,sharing=all true",
            "sharing=all must be shared",
        ),
        (
            "RUN --mount=type=cache,target=/x,uid=me true",
            "`uid=me` must be a number",
        ),
        (
            "RUN --mount=type=cache,target=/ true",
            "a mount cannot cover `/`",
        ),
        ("RUN --mount=type=secret true", "a secret needs id=NAME"),
        (
            "RUN --mount=type=secret,id=a,env=1X true",
            "env=1X is not an environment variable name",
        ),
        (
            "RUN --mount=type=tmpfs,target=/t --mount=type=cache,target=/t true",
            "two mounts have the target /t",
        ),
        ("RUN --mount true", "--mount needs a value"),
        (
            "RUN --mount=type=bind,from=base,target=/t true",
            "of a whole root is not supported",
        ),
    ];
    for (run, want) in cases {
        let err = refused(&format!("FROM base\n{run}\n"));
        assert!(err.starts_with("Dockerfile line 2"), "{run}: {err}");
        assert!(err.contains(want), "{run}: {err} (wanted {want:?})");
    }
}
