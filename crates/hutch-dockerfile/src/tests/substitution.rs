//! Variable substitution where Docker applies it, and ARG scoping.

use std::collections::BTreeMap;

use super::{args, env_of, plan_ok, steps, strings};
use crate::{plan, Base, CopySource, DockerfileError, Instruction};

#[test]
fn global_args_reach_from_lines_and_build_args_override_them() {
    let dockerfile = "ARG TAG=12\nARG REPO=debian\nFROM $REPO:${TAG}-slim\n";
    let default = plan_ok(dockerfile);
    assert_eq!(
        default.target().base,
        Base::Image {
            reference: "debian:12-slim".to_owned()
        }
    );
    let overridden = plan(dockerfile, &args(&[("TAG", "13")]), None).expect("plans");
    assert_eq!(
        overridden.target().base,
        Base::Image {
            reference: "debian:13-slim".to_owned()
        }
    );
    assert!(overridden.unused_build_args.is_empty(), "TAG was consumed");
}

#[test]
fn a_global_arg_is_visible_in_a_stage_only_once_declared_again() {
    let plan = plan(
        "ARG G=global\nFROM scratch\nENV BEFORE=[$G]\nARG G\nENV AFTER=[$G]\n",
        &BTreeMap::new(),
        None,
    )
    .expect("plans");
    let steps = steps(&plan);
    assert_eq!(env_of(&steps[0].instruction)[0].1, "[]");
    assert_eq!(
        steps[1].instruction,
        Instruction::Arg(vec![("G".to_owned(), Some("global".to_owned()))])
    );
    assert_eq!(env_of(&steps[2].instruction)[0].1, "[global]");
}

#[test]
fn build_args_override_arg_defaults_and_defaults_can_use_earlier_values() {
    let dockerfile = "FROM scratch\nARG A=x\nARG B=${A}y\nENV OUT=$A-$B\n";
    let plain = plan_ok(dockerfile);
    assert_eq!(env_of(&steps(&plain)[2].instruction)[0].1, "x-xy");
    let with_args = plan(dockerfile, &args(&[("A", "p")]), None).expect("plans");
    assert_eq!(env_of(&steps(&with_args)[2].instruction)[0].1, "p-py");
    let b_given = plan(dockerfile, &args(&[("B", "given")]), None).expect("plans");
    assert_eq!(env_of(&steps(&b_given)[2].instruction)[0].1, "x-given");
}

#[test]
fn defaults_alternatives_unset_and_escapes() {
    let plan = plan_ok(
        "FROM scratch\nENV SET=yes EMPTY=\n\
         ENV D1=${UNSET:-def} D2=${EMPTY:-def} D3=${EMPTY-def} A1=${SET:+alt} A2=${UNSET:+alt} \
         U=[$UNSET] E1=\\$SET E2='$SET' E3=\"$SET and \\$SET\"\n",
    );
    let got = env_of(&steps(&plan)[1].instruction);
    let expected = vec![
        ("D1", "def"),
        ("D2", "def"),
        ("D3", ""),
        ("A1", "alt"),
        ("A2", ""),
        ("U", "[]"),
        ("E1", "$SET"),
        ("E2", "$SET"),
        ("E3", "yes and $SET"),
    ];
    let expected: Vec<(String, String)> = expected
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn one_env_instruction_sees_the_values_from_before_it() {
    let plan = plan_ok("FROM scratch\nENV A=1\nENV A=2 B=$A\n");
    assert_eq!(
        env_of(&steps(&plan)[1].instruction),
        vec![
            ("A".to_owned(), "2".to_owned()),
            ("B".to_owned(), "1".to_owned())
        ]
    );
    assert_eq!(plan.config().env_var("A"), Some("2"));
}

#[test]
fn env_overrides_an_arg_of_the_same_name() {
    let plan = plan(
        "FROM scratch\nARG V=from-arg\nENV W=$V\nENV V=from-env\nENV X=$V\nRUN true\n",
        &BTreeMap::new(),
        None,
    )
    .expect("plans");
    let steps = steps(&plan);
    assert_eq!(env_of(&steps[1].instruction)[0].1, "from-arg");
    assert_eq!(env_of(&steps[3].instruction)[0].1, "from-env");
    let env = steps[4].environment();
    let values: Vec<&str> = env
        .iter()
        .filter(|(k, _)| k == "V")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(values, vec!["from-env"], "one V, the ENV's");
}

#[test]
fn run_cmd_and_entrypoint_are_left_to_the_shell() {
    let plan = plan_ok(
        "FROM scratch\nENV A=1\nRUN echo $A ${A}\nCMD echo $A\nENTRYPOINT [\"echo\", \"$A\"]\n",
    );
    let steps = steps(&plan);
    let Instruction::Run(run) = &steps[1].instruction else {
        panic!("RUN")
    };
    assert_eq!(run.argv, strings(&["/bin/sh", "-c", "echo $A ${A}"]));
    assert_eq!(
        steps[2].instruction,
        Instruction::Cmd(strings(&["/bin/sh", "-c", "echo $A"]))
    );
    assert_eq!(
        steps[3].instruction,
        Instruction::Entrypoint(strings(&["echo", "$A"]))
    );
}

#[test]
fn substitution_in_copy_workdir_user_label_expose_volume_and_stopsignal() {
    let plan = plan_ok(
        "FROM scratch\nARG APP=web\nARG SIG=SIGINT\nENV DIR=/srv UID=1000\n\
         WORKDIR $DIR/$APP\nUSER ${UID}:${UID}\nLABEL app=$APP\nEXPOSE ${PORT:-8080}\n\
         VOLUME [\"$DIR/data\"]\nSTOPSIGNAL $SIG\nCOPY --chown=$UID $APP.conf ${DIR}/\n",
    );
    let config = plan.config();
    assert_eq!(config.workdir, "/srv/web");
    assert_eq!(config.user.as_deref(), Some("1000:1000"));
    assert_eq!(config.labels["app"], "web");
    assert!(config.exposed_ports.contains("8080/tcp"));
    assert!(config.volumes.contains("/srv/data"));
    assert_eq!(config.stop_signal.as_deref(), Some("SIGINT"));
    let Instruction::Copy(copy) = &steps(&plan).last().expect("steps").instruction else {
        panic!("COPY")
    };
    assert_eq!(copy.sources, vec![CopySource::Path("web.conf".to_owned())]);
    assert_eq!(copy.dest, "/srv/");
    assert_eq!(copy.chown.as_deref(), Some("1000"));
}

#[test]
fn the_escape_directive_changes_the_escape_character() {
    let plan = plan_ok("# escape=`\nFROM scratch\nENV A=`$B C=\\path\nRUN echo a `\n  b\n");
    assert_eq!(
        env_of(&steps(&plan)[0].instruction),
        vec![
            ("A".to_owned(), "$B".to_owned()),
            ("C".to_owned(), "\\path".to_owned())
        ]
    );
    let Instruction::Run(run) = &steps(&plan)[1].instruction else {
        panic!("RUN")
    };
    assert_eq!(run.argv[2], "echo a   b");
}

#[test]
fn platform_args_are_predefined_and_only_linux_amd64_builds() {
    let plan =
        plan_ok("FROM --platform=$BUILDPLATFORM scratch\nARG TARGETARCH\nENV ARCH=$TARGETARCH\n");
    assert_eq!(plan.config().env_var("ARCH"), Some("amd64"));
    let err = crate::plan(
        "FROM --platform=linux/arm64 scratch\n",
        &BTreeMap::new(),
        None,
    )
    .expect_err("arm64");
    assert_eq!(
        err.to_string(),
        "Dockerfile line 1: FROM --platform=linux/arm64 is not supported: Hutch builds linux/amd64 only"
    );
}

#[test]
fn a_required_variable_that_is_unset_stops_the_plan() {
    let err = crate::plan(
        "FROM scratch\nWORKDIR ${APP:?set APP}\n",
        &BTreeMap::new(),
        None,
    )
    .expect_err("unset");
    assert!(
        matches!(err, DockerfileError::Invalid { line: 2, .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "Dockerfile line 2: APP: set APP: WORKDIR ${APP:?set APP}"
    );
}

#[test]
fn with_base_configurations_env_extends_the_image_s() {
    let base = crate::StageConfig {
        env: vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())],
        workdir: "/home/app".to_owned(),
        cmd: strings(&["python3"]),
        ..crate::StageConfig::default()
    };
    let bases = BTreeMap::from([("python:3".to_owned(), base.clone())]);
    let plan = crate::plan_with_bases(
        "FROM python:3\nENV PATH=/opt/venv/bin:$PATH\nWORKDIR src\n",
        &BTreeMap::new(),
        None,
        &bases,
    )
    .expect("plans");
    assert_eq!(plan.target().base_config, base);
    assert_eq!(
        plan.config().env_var("PATH"),
        Some("/opt/venv/bin:/usr/bin:/bin")
    );
    assert_eq!(plan.config().workdir, "/home/app/src");
    assert_eq!(
        plan.config().cmd,
        strings(&["python3"]),
        "the image's CMD is kept"
    );
    // An image without a working directory or shell starts at `/` with `/bin/sh -c`.
    let bare = crate::StageConfig {
        workdir: String::new(),
        shell: Vec::new(),
        ..crate::StageConfig::default()
    };
    let bare_plan = crate::plan_with_bases(
        "FROM bare\nWORKDIR app\nCMD run\n",
        &BTreeMap::new(),
        None,
        &BTreeMap::from([("bare".to_owned(), bare)]),
    )
    .expect("plans");
    assert_eq!(bare_plan.config().workdir, "/app");
    assert_eq!(bare_plan.config().cmd, strings(&["/bin/sh", "-c", "run"]));
    let without = plan_ok("FROM python:3\nENV PATH=/opt/venv/bin:$PATH\n");
    assert_eq!(without.config().env_var("PATH"), Some("/opt/venv/bin:"));
}

#[test]
fn patterns_trim_and_replace_as_the_shell_does() {
    let dockerfile = "ARG VERSION=1.24.3\nFROM scratch\nARG VERSION\n\
                      ENV MINOR=${VERSION%.*} MAJOR=${VERSION%%.*} PATCH=${VERSION##*.} \
                      DASHED=${VERSION//./-}\n\
                      WORKDIR /opt/go-${VERSION/.3}\n";
    let plan = plan_ok(dockerfile);
    let steps = steps(&plan);
    let env = env_of(&steps[1].instruction);
    let value = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{name} in {env:?}"))
    };
    assert_eq!(value("MINOR"), "1.24");
    assert_eq!(value("MAJOR"), "1");
    assert_eq!(value("PATCH"), "3");
    assert_eq!(value("DASHED"), "1-24-3");
    assert_eq!(
        steps[2].instruction,
        Instruction::Workdir {
            path: "/opt/go-1.24".to_owned()
        }
    );
}
