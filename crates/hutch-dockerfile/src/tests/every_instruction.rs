//! One Dockerfile using every instruction, and the plan asserted step by step.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{args, plan_ok, steps, strings};
use crate::{
    plan, Base, CopyKind, CopySource, CopyStep, HealthTest, Healthcheck, HeredocScript,
    Instruction, RunStep, DEFAULT_PATH,
};

const EVERYTHING: &str = r#"# syntax=docker/dockerfile:1
ARG BASE=debian:12
FROM ${BASE} AS base
LABEL org.example.team="agents" version=1
MAINTAINER Jane <jane@example.com>
ENV APP_HOME=/srv/app GREETING="hello world"
ENV LEGACY value with spaces
ARG VERSION=1.0
ARG UNSET_ARG
WORKDIR $APP_HOME
WORKDIR sub
USER 1000:1000
EXPOSE 8080 53/udp ${PORT:-9000}/tcp
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN echo "$VERSION" > /version && \
    echo done
RUN ["/bin/echo", "exec form"]
RUN <<EOF
echo from heredoc
EOF
COPY --chown=1000:1000 --chmod=0644 app.py config/ ./
ADD https://example.com/file.tar.gz /opt/
COPY <<EOF /etc/motd
Welcome $GREETING
EOF
VOLUME /data
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --retries=5 CMD curl -f http://localhost:8080/ || exit 1
ENTRYPOINT ["/srv/app/run"]
CMD serve --port 8080
"#;

fn bash(command: &str) -> Vec<String> {
    let mut argv = strings(&["/bin/bash", "-o", "pipefail", "-c"]);
    argv.push(command.to_owned());
    argv
}

#[test]
fn every_instruction_is_planned() {
    let plan = plan_ok(EVERYTHING);
    assert_eq!(plan.stages.len(), 1);
    let stage = plan.target();
    assert_eq!(stage.name.as_deref(), Some("base"));
    assert_eq!(stage.line, 3);
    assert_eq!(stage.text, "FROM ${BASE} AS base");
    assert_eq!(
        stage.base,
        Base::Image {
            reference: "debian:12".to_owned()
        }
    );
    let got: Vec<(usize, Instruction)> = steps(&plan)
        .iter()
        .map(|s| (s.line, s.instruction.clone()))
        .collect();
    let expected: Vec<(usize, Instruction)> = vec![
        (
            4,
            Instruction::Label(BTreeMap::from([
                ("org.example.team".to_owned(), "agents".to_owned()),
                ("version".to_owned(), "1".to_owned()),
            ])),
        ),
        (
            5,
            Instruction::Label(BTreeMap::from([(
                "maintainer".to_owned(),
                "Jane <jane@example.com>".to_owned(),
            )])),
        ),
        (
            6,
            Instruction::Env(vec![
                ("APP_HOME".to_owned(), "/srv/app".to_owned()),
                ("GREETING".to_owned(), "hello world".to_owned()),
            ]),
        ),
        (
            7,
            Instruction::Env(vec![("LEGACY".to_owned(), "value with spaces".to_owned())]),
        ),
        (
            8,
            Instruction::Arg(vec![("VERSION".to_owned(), Some("1.0".to_owned()))]),
        ),
        (9, Instruction::Arg(vec![("UNSET_ARG".to_owned(), None)])),
        (
            10,
            Instruction::Workdir {
                path: "/srv/app".to_owned(),
            },
        ),
        (
            11,
            Instruction::Workdir {
                path: "/srv/app/sub".to_owned(),
            },
        ),
        (
            12,
            Instruction::User {
                user: "1000:1000".to_owned(),
            },
        ),
        (
            13,
            Instruction::Expose(strings(&["8080/tcp", "53/udp", "9000/tcp"])),
        ),
        (
            14,
            Instruction::Shell(strings(&["/bin/bash", "-o", "pipefail", "-c"])),
        ),
        (
            15,
            Instruction::Run(RunStep {
                argv: bash("echo \"$VERSION\" > /version &&     echo done"),
                script: None,
                network: None,
                mounts: vec![],
            }),
        ),
        (
            17,
            Instruction::Run(RunStep {
                argv: strings(&["/bin/echo", "exec form"]),
                script: None,
                network: None,
                mounts: vec![],
            }),
        ),
        (
            18,
            Instruction::Run(RunStep {
                argv: bash("echo from heredoc\n"),
                script: None,
                network: None,
                mounts: vec![],
            }),
        ),
        (
            21,
            Instruction::Copy(CopyStep {
                kind: CopyKind::Copy,
                from: None,
                sources: vec![
                    CopySource::Path("app.py".to_owned()),
                    CopySource::Path("config/".to_owned()),
                ],
                dest: "/srv/app/sub/".to_owned(),
                dest_is_dir: true,
                chown: Some("1000:1000".to_owned()),
                chmod: Some(0o644),
                link: false,
                checksum: None,
            }),
        ),
        (
            22,
            Instruction::Copy(CopyStep {
                kind: CopyKind::Add,
                from: None,
                sources: vec![CopySource::Url(
                    "https://example.com/file.tar.gz".to_owned(),
                )],
                dest: "/opt/".to_owned(),
                dest_is_dir: true,
                chown: None,
                chmod: None,
                link: false,
                checksum: None,
            }),
        ),
        (
            23,
            Instruction::Copy(CopyStep {
                kind: CopyKind::Copy,
                from: None,
                sources: vec![CopySource::Inline {
                    name: "EOF".to_owned(),
                    content: "Welcome hello world\n".to_owned(),
                }],
                dest: "/etc/motd".to_owned(),
                dest_is_dir: false,
                chown: None,
                chmod: None,
                link: false,
                checksum: None,
            }),
        ),
        (26, Instruction::Volume(strings(&["/data"]))),
        (27, Instruction::StopSignal("SIGTERM".to_owned())),
        (
            28,
            Instruction::Healthcheck(Some(Healthcheck {
                test: HealthTest::Shell("curl -f http://localhost:8080/ || exit 1".to_owned()),
                interval: Duration::from_secs(10),
                timeout: Duration::from_secs(30),
                start_period: Duration::ZERO,
                start_interval: Duration::from_secs(5),
                retries: 5,
            })),
        ),
        (29, Instruction::Entrypoint(strings(&["/srv/app/run"]))),
        (30, Instruction::Cmd(bash("serve --port 8080"))),
    ];
    assert_eq!(got.len(), expected.len(), "{got:#?}");
    for (got, expected) in got.iter().zip(&expected) {
        assert_eq!(got, expected);
    }
}

#[test]
fn the_final_configuration_holds_every_setting_but_no_args() {
    let plan = plan_ok(EVERYTHING);
    let config = plan.config();
    assert_eq!(
        config.env,
        vec![
            ("APP_HOME".to_owned(), "/srv/app".to_owned()),
            ("GREETING".to_owned(), "hello world".to_owned()),
            ("LEGACY".to_owned(), "value with spaces".to_owned()),
        ]
    );
    assert!(
        config.env_var("VERSION").is_none(),
        "ARGs are not saved in the image"
    );
    assert_eq!(config.workdir, "/srv/app/sub");
    assert_eq!(config.user.as_deref(), Some("1000:1000"));
    assert_eq!(
        config.shell,
        strings(&["/bin/bash", "-o", "pipefail", "-c"])
    );
    assert_eq!(config.labels.len(), 3);
    assert_eq!(config.labels["maintainer"], "Jane <jane@example.com>");
    assert_eq!(
        config.exposed_ports,
        BTreeSet::from([
            "8080/tcp".to_owned(),
            "53/udp".to_owned(),
            "9000/tcp".to_owned()
        ])
    );
    assert_eq!(config.entrypoint, strings(&["/srv/app/run"]));
    assert_eq!(config.cmd, bash("serve --port 8080"));
    assert_eq!(
        config.start_command(),
        [strings(&["/srv/app/run"]), bash("serve --port 8080")].concat()
    );
    assert_eq!(config.healthcheck.as_ref().map(|h| h.retries), Some(5));
    assert_eq!(config.volumes, BTreeSet::from(["/data".to_owned()]));
    assert_eq!(config.stop_signal.as_deref(), Some("SIGTERM"));

    assert!(plan.warnings.iter().any(|w| w.contains("syntax directive")));
    assert!(plan
        .warnings
        .iter()
        .any(|w| w.contains("line 26: VOLUME /data is recorded but has no effect")));
    assert_eq!(plan.images(), strings(&["debian:12"]));
}

#[test]
fn each_step_carries_its_text_and_the_configuration_after_it() {
    let plan = plan_ok(EVERYTHING);
    let steps = steps(&plan);
    let run = &steps[11];
    assert_eq!(
        run.text,
        "RUN echo \"$VERSION\" > /version && \\\n    echo done"
    );
    assert_eq!(run.keyword(), "RUN");
    assert!(run.changes_filesystem());
    let heredoc = &steps[13];
    assert_eq!(heredoc.text, "RUN <<EOF\necho from heredoc\nEOF");
    let copy_heredoc = &steps[16];
    assert_eq!(
        copy_heredoc.text,
        "COPY <<EOF /etc/motd\nWelcome $GREETING\nEOF"
    );
    // The configuration as it stands after each step.
    assert_eq!(steps[0].config.labels.len(), 2);
    assert_eq!(steps[1].config.labels.len(), 3);
    assert_eq!(steps[6].config.workdir, "/srv/app");
    assert_eq!(steps[7].config.workdir, "/srv/app/sub");
    assert!(steps[7].config.user.is_none());
    assert_eq!(steps[8].config.user.as_deref(), Some("1000:1000"));
    assert_eq!(steps[9].config.shell[0], "/bin/sh");
    assert_eq!(steps[10].config.shell[0], "/bin/bash");
    assert!(
        !steps[8].changes_filesystem(),
        "USER only changes the configuration"
    );
    assert!(
        steps[6].changes_filesystem(),
        "WORKDIR creates its directory"
    );
    // ENTRYPOINT clears a CMD not set in this stage; the CMD after it sets one.
    assert_eq!(steps[20].keyword(), "ENTRYPOINT");
    assert!(steps[20].config.cmd.is_empty());
    assert_eq!(steps[21].config.cmd, bash("serve --port 8080"));
}

#[test]
fn run_sees_args_and_env_but_the_image_keeps_only_env() {
    let plan = plan(
        EVERYTHING,
        &args(&[
            ("VERSION", "2.0"),
            ("NOPE", "x"),
            ("HTTP_PROXY", "http://proxy:3128"),
        ]),
        None,
    )
    .expect("plans");
    let run = &steps(&plan)[11];
    let env = run.environment();
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(
        get("VERSION"),
        Some("2.0"),
        "a build arg overrides the ARG default"
    );
    assert_eq!(get("APP_HOME"), Some("/srv/app"));
    assert_eq!(
        get("UNSET_ARG"),
        None,
        "a declared ARG without value is not set"
    );
    assert_eq!(get("HTTP_PROXY"), Some("http://proxy:3128"));
    assert_eq!(get("PATH"), Some(DEFAULT_PATH));
    assert!(plan.config().env_var("VERSION").is_none());
    assert_eq!(plan.unused_build_args, strings(&["NOPE"]));
    assert!(plan.warnings[0].contains("NOPE"));
}

#[test]
fn a_shebang_heredoc_runs_as_its_own_script_and_others_go_to_the_shell() {
    let plan = plan_ok(
        "FROM scratch\nRUN <<EOF\n#!/usr/bin/env python3\nprint('hi')\nEOF\n\
         RUN <<EOF bash -e\necho a\nEOF\nRUN <<-'END'\n\techo $HOME\n\tEND\n",
    );
    let steps = steps(&plan);
    assert_eq!(
        steps[0].instruction,
        Instruction::Run(RunStep {
            argv: strings(&["/dev/pipes/EOF"]),
            script: Some(HeredocScript {
                path: "/dev/pipes/EOF".to_owned(),
                content: "#!/usr/bin/env python3\nprint('hi')\n".to_owned(),
            }),
            network: None,
            mounts: vec![],
        })
    );
    let Instruction::Run(second) = &steps[1].instruction else {
        panic!("RUN expected")
    };
    assert_eq!(
        second.argv,
        strings(&["/bin/sh", "-c", "<<EOF bash -e\necho a\nEOF"])
    );
    let Instruction::Run(third) = &steps[2].instruction else {
        panic!("RUN expected")
    };
    assert_eq!(
        third.argv,
        strings(&["/bin/sh", "-c", "echo $HOME\n"]),
        "tabs are stripped with <<-, and the shell expands $HOME"
    );
}

#[test]
fn copy_and_add_options_and_destinations() {
    let plan = plan_ok(
        "FROM scratch\nWORKDIR /app\nCOPY --link a.txt .\nCOPY [\"with space.txt\", \"b\"]\n\
         ADD --checksum=sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef https://example.com/x /x\n\
         ADD local.tar.gz /opt\nRUN --network=none true\n",
    );
    let steps = steps(&plan);
    let Instruction::Copy(link) = &steps[1].instruction else {
        panic!("COPY")
    };
    assert!(link.link);
    assert_eq!(link.dest, "/app/");
    assert!(link.dest_is_dir, "`.` is a directory");
    let Instruction::Copy(json) = &steps[2].instruction else {
        panic!("COPY")
    };
    assert_eq!(
        json.sources,
        vec![CopySource::Path("with space.txt".to_owned())]
    );
    assert_eq!(json.dest, "/app/b");
    assert!(!json.dest_is_dir);
    let Instruction::Copy(download) = &steps[3].instruction else {
        panic!("ADD")
    };
    assert_eq!(
        download.checksum.as_deref(),
        Some("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
    );
    let Instruction::Copy(archive) = &steps[4].instruction else {
        panic!("ADD")
    };
    assert_eq!(archive.kind, CopyKind::Add);
    assert_eq!(
        archive.sources,
        vec![CopySource::Path("local.tar.gz".to_owned())]
    );
    let Instruction::Run(run) = &steps[5].instruction else {
        panic!("RUN")
    };
    assert_eq!(run.network, Some(crate::RunNetwork::None));
}

#[test]
fn healthcheck_defaults_flags_and_none() {
    let plan = plan_ok(
        "FROM scratch\nHEALTHCHECK CMD true\n\
         HEALTHCHECK --interval=1m30s --timeout=5s --start-period=10s --start-interval=2s --retries=2 \\\n  CMD [\"curl\", \"-f\", \"http://localhost/\"]\n\
         HEALTHCHECK --interval=0s CMD check\nHEALTHCHECK NONE\n",
    );
    let steps = steps(&plan);
    let defaults = Healthcheck {
        test: HealthTest::Shell("true".to_owned()),
        interval: Duration::from_secs(30),
        timeout: Duration::from_secs(30),
        start_period: Duration::ZERO,
        start_interval: Duration::from_secs(5),
        retries: 3,
    };
    assert_eq!(
        steps[0].instruction,
        Instruction::Healthcheck(Some(defaults.clone()))
    );
    assert_eq!(
        steps[1].instruction,
        Instruction::Healthcheck(Some(Healthcheck {
            test: HealthTest::Exec(strings(&["curl", "-f", "http://localhost/"])),
            interval: Duration::from_secs(90),
            timeout: Duration::from_secs(5),
            start_period: Duration::from_secs(10),
            start_interval: Duration::from_secs(2),
            retries: 2,
        }))
    );
    let Instruction::Healthcheck(Some(zero)) = &steps[2].instruction else {
        panic!("HEALTHCHECK")
    };
    assert_eq!(
        zero.interval,
        Duration::from_secs(30),
        "0 means the default"
    );
    assert!(steps[2].config.healthcheck.is_some());
    assert_eq!(steps[3].instruction, Instruction::Healthcheck(None));
    assert!(
        steps[3].config.healthcheck.is_none(),
        "NONE clears the check"
    );
    assert_eq!(
        defaults.argv(&strings(&["/bin/sh", "-c"])),
        strings(&["/bin/sh", "-c", "true"])
    );
}

#[test]
fn entrypoint_cmd_and_shell_interplay() {
    // Shell forms use the SHELL in force when they appear.
    let plan = plan_ok(
        "FROM scratch AS a\nCMD [\"default\"]\nENTRYPOINT run it\n\
         FROM a AS b\nSHELL [\"/bin/bash\", \"-c\"]\nENTRYPOINT [\"/entry\"]\n\
         FROM b AS c\nCMD echo hi\n",
    );
    let a = plan.stage(0).expect("a");
    assert_eq!(
        a.config().cmd,
        strings(&["default"]),
        "a CMD of the same stage survives ENTRYPOINT"
    );
    assert_eq!(a.config().entrypoint, strings(&["/bin/sh", "-c", "run it"]));
    let b = plan.stage(1).expect("b");
    assert_eq!(b.base_config.cmd, strings(&["default"]), "inherited from a");
    assert!(
        b.config().cmd.is_empty(),
        "ENTRYPOINT resets an inherited CMD"
    );
    assert_eq!(b.config().entrypoint, strings(&["/entry"]));
    let c = plan.target();
    assert_eq!(c.config().entrypoint, strings(&["/entry"]));
    assert_eq!(c.config().cmd, strings(&["/bin/bash", "-c", "echo hi"]));
}
