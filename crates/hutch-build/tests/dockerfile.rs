//! Dockerfile builds on a real manager (ns build sandboxes, real snapshots): a Dockerfile
//! using every instruction the engine runs becomes a template whose sandboxes have its
//! files, owners, environment and start command; an unchanged rebuild is all cache hits;
//! a changed COPY source rebuilds from that step; a failing RUN fails the build with its
//! output and leaves the previous template serving; a bad instruction is refused naming
//! its line. Nothing needs the network (the bases are the `minimal` template).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hutch_build::{BuildRequest, BuildSettings, BuildStatus, BuildView, Builder, StepStatus};
use hutch_core::model::{CreateSandbox, IsolationRequest};
use hutch_core::net::policy::{Egress, PolicySpec};
use hutch_core::{Config, Manager};
use hutch_proto::{Command, ExecRequest};

const DOCKERFILE: &str = r#"# syntax=docker/dockerfile:1
ARG BASE=minimal
FROM ${BASE} AS tools
RUN mkdir -p /out && echo made-in-stage-one > /out/tool.txt

FROM minimal
ARG GREETING=hello
ENV APP_HOME=/srv/app MODE=test
LABEL org.example.name="demo"
WORKDIR $APP_HOME
COPY --chown=1000:1000 --chmod=640 app.txt ./app.txt
COPY dir/ ./dir/
ADD notes.txt /notes/
ADD bundle.tar.gz /bundle/
COPY --from=tools /out/tool.txt /opt/tool.txt
RUN echo "$GREETING from $(pwd) in $MODE" > run.txt
SHELL ["/bin/sh", "-c"]
RUN <<EOF
echo from-a-heredoc >> /srv/app/run.txt
EOF
USER 1000
RUN id -u > /home/user/uid.txt
USER root
EXPOSE 8080
HEALTHCHECK --interval=1s --timeout=2s CMD wget -qO- http://127.0.0.1:8080/app.txt
CMD ["httpd", "-f", "-p", "8080", "-h", "/srv/app"]
"#;

struct World {
    _state: tempfile::TempDir,
    manager: Arc<Manager>,
    builder: Arc<Builder>,
    scratch: PathBuf,
}

impl World {
    async fn new() -> Self {
        let state = tempfile::Builder::new()
            .prefix("hutch-test-build-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let mut cfg = Config::new(
            state.path().join("state"),
            hutch_testkit::hutch_bin().canonicalize().expect("hutch"),
            hutch_testkit::agent_bin().canonicalize().expect("agent"),
        );
        cfg.templates_dir = state.path().join("templates");
        // The disk pool is allocated up front: keep it small.
        cfg.ns_disk_pool_bytes = Some(1 << 30);
        std::fs::create_dir_all(&cfg.templates_dir).expect("templates dir");
        hutch_template::TemplateStore::open(&cfg.templates_dir)
            .expect("store")
            .build("minimal", &Default::default(), &mut |_| {})
            .expect("minimal");
        let manager = Manager::start(cfg).await.expect("manager");
        let settings = BuildSettings {
            cpus: 1.0,
            memory_mib: 256,
            disk_mib: 512,
            pids_max: 256,
            network: PolicySpec {
                egress: Egress::None,
                ..PolicySpec::default()
            },
            step_timeout: Duration::from_secs(60),
            ..BuildSettings::default()
        };
        let builder = Builder::new(manager.clone(), settings);
        let scratch = state.path().join("contexts");
        std::fs::create_dir_all(&scratch).expect("contexts");
        Self {
            _state: state,
            manager,
            builder,
            scratch,
        }
    }

    /// A copy of `context` for one build (the build deletes it).
    fn context(&self, context: &Path) -> PathBuf {
        let dir = self.scratch.join(hutch_core::ids::random_token(8));
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(context)
            .arg(&dir)
            .status()
            .expect("cp");
        assert!(status.success());
        dir
    }

    fn request(&self, template: &str, context: &Path) -> BuildRequest {
        BuildRequest {
            sandbox_resources: Default::default(),
            template: template.into(),
            context_dir: self.context(context),
            dockerfile: "Dockerfile".into(),
            build_args: BTreeMap::new(),
            target: None,
            no_cache: false,
            tenant: None,
            registry: Default::default(),
            image: None,
            tag: None,
            secrets: Default::default(),
        }
    }

    async fn build(&self, template: &str, context: &Path) -> (BuildView, String) {
        let started = self
            .builder
            .start(self.request(template, context))
            .await
            .expect("start");
        let mut follow = self.builder.follow(template, &started.id).expect("follow");
        tokio::time::timeout(Duration::from_secs(300), async {
            while !follow.done.borrow().is_done() {
                follow.done.changed().await.expect("done");
            }
        })
        .await
        .expect("the build ends");
        let view = self.builder.get(template, &started.id).expect("view");
        let log = self
            .builder
            .follow(template, &started.id)
            .expect("follow")
            .backlog;
        let text: Vec<String> = log.iter().map(|l| l.text.clone()).collect();
        (view, text.join("\n"))
    }

    async fn sh(&self, id: &str, script: &str) -> (String, i32) {
        let id = id.parse().expect("id");
        let client = self.manager.agent(&id).await.expect("agent");
        let done = client
            .exec_collect(
                ExecRequest {
                    cmd: Command::Shell(script.into()),
                    env: Default::default(),
                    cwd: None,
                    user: None,
                    timeout_ms: Some(30_000),
                    pty: None,
                    stdin: false,
                    background: false,
                    handle: None,
                },
                None,
                1 << 20,
            )
            .await
            .expect("exec");
        (
            String::from_utf8_lossy(&done.stdout).into_owned()
                + &String::from_utf8_lossy(&done.stderr),
            done.exit.exit_code,
        )
    }

    async fn create(&self, template: &str) -> String {
        self.manager
            .create(CreateSandbox {
                template: Some(template.into()),
                isolation: IsolationRequest::Ns,
                ..CreateSandbox::default()
            })
            .await
            .expect("create")
            .id
            .to_string()
    }

    /// Remove every sandbox and unmount the disk pool, so the state directory can go.
    async fn clean_up(&self) {
        let all = self
            .manager
            .list(
                &Default::default(),
                &hutch_core::tenant::TenantScope::All,
                &Default::default(),
            )
            .await
            .expect("list");
        for s in all.items {
            let _ = self.manager.kill(&s.id).await;
        }
        self.manager.release_disk_pool().await;
    }

    async fn kill(&self, id: &str) {
        self.manager
            .kill(&id.parse().expect("id"))
            .await
            .expect("kill");
    }
}

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

fn statuses(view: &BuildView) -> Vec<StepStatus> {
    view.steps.iter().map(|s| s.status).collect()
}

/// Run `body` on a new world and clean the world up whether it passed or panicked.
async fn in_world<F, Fut>(body: F)
where
    F: FnOnce(Arc<World>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let w = Arc::new(World::new().await);
    let result = tokio::spawn(body(w.clone())).await;
    w.clean_up().await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

#[tokio::test]
async fn a_dockerfile_builds_caches_rebuilds_from_a_change_and_keeps_serving_after_a_failure() {
    in_world(every_step_kind).await;
}

async fn every_step_kind(w: Arc<World>) {
    let src = w.scratch.join("src");
    write(&src, "Dockerfile", DOCKERFILE);
    write(&src, "app.txt", "version one\n");
    write(&src, "dir/a.txt", "a\n");
    write(&src, "dir/sub/b.txt", "b\n");
    write(&src, "dir/secret.key", "do not send\n");
    write(&src, "notes.txt", "notes\n");
    write(&src, ".dockerignore", "**/*.key\nbundle-src\n");
    write(&src, "bundle-src/inner/x.txt", "from the archive\n");
    let tarred = std::process::Command::new("tar")
        .arg("-czf")
        .arg(src.join("bundle.tar.gz"))
        .arg("-C")
        .arg(src.join("bundle-src"))
        .arg("inner")
        .status()
        .expect("tar");
    assert!(tarred.success());

    let (first, log) = w.build("web", &src).await;
    assert_eq!(first.status, BuildStatus::Succeeded, "{first:?}\n{log}");
    assert!(
        !statuses(&first).contains(&StepStatus::Cached),
        "a first build caches nothing: {first:?}"
    );
    let info = w.manager.templates().get("web").expect("template");
    assert!(info.ready);
    assert_eq!(
        info.defaults.env.get("APP_HOME").map(String::as_str),
        Some("/srv/app")
    );
    assert!(
        !info.defaults.env.contains_key("GREETING"),
        "ARGs are not kept"
    );
    let start = info.start.clone().expect("CMD is the start command");
    assert_eq!(start.cwd.as_deref(), Some("/srv/app"));
    assert!(start.ready.is_some(), "HEALTHCHECK is the ready check");

    // A sandbox of it: the files, owners, modes and the service, ready at create.
    let id = w.create("web").await;
    let (out, code) = w
        .sh(
            &id,
            "cat /srv/app/app.txt; stat -c '%u:%g %a' /srv/app/app.txt; cat /opt/tool.txt \
             /notes/notes.txt /bundle/inner/x.txt /srv/app/run.txt /home/user/uid.txt /srv/app/dir/sub/b.txt; \
             test -e /srv/app/dir/secret.key && echo KEY-SENT; echo \"$MODE\"; \
             wget -qO- http://127.0.0.1:8080/app.txt",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    for want in [
        "version one\n1000:1000 640\n",
        "made-in-stage-one",
        "notes",
        "from the archive",
        "hello from /srv/app in test",
        "from-a-heredoc",
        "1000\n",
        "b\n",
        "test\nversion one",
    ] {
        assert!(out.contains(want), "{want:?} in {out}");
    }
    assert!(!out.contains("KEY-SENT"), ".dockerignore holds: {out}");
    w.kill(&id).await;

    // Unchanged: every step that changes files is a cache hit.
    let (again, log) = w.build("web", &src).await;
    assert_eq!(again.status, BuildStatus::Succeeded, "{log}");
    assert!(
        again
            .steps
            .iter()
            .all(|s| s.status == StepStatus::Cached || s.duration_ms == Some(0)),
        "nothing runs again: {again:?}"
    );

    let rev_one = w.manager.templates().get("web").expect("web").rev;
    let keeps_rev_one = w.create("web").await;

    // A changed COPY source: the steps before it stay cached, it and the later ones run.
    write(&src, "app.txt", "version two\n");
    let (changed, log) = w.build("web", &src).await;
    assert_eq!(changed.status, BuildStatus::Succeeded, "{log}");
    let at = changed
        .steps
        .iter()
        .position(|s| s.instruction.contains("app.txt"))
        .expect("the COPY step");
    assert!(
        changed.steps[..at]
            .iter()
            .filter(|s| s.instruction.starts_with("RUN"))
            .all(|s| s.status == StepStatus::Cached),
        "{changed:?}"
    );
    assert_eq!(changed.steps[at].status, StepStatus::Done, "{changed:?}");
    let id = w.create("web").await;
    assert!(w
        .sh(&id, "cat /srv/app/app.txt")
        .await
        .0
        .contains("version two"));
    w.kill(&id).await;

    // The rebuild is a new revision; a sandbox of the old one keeps it, across a wake too.
    let templates = w.manager.templates();
    assert!(templates.get("web").expect("web").rev > rev_one);
    assert_eq!(templates.old_revisions("web"), vec![rev_one]);
    let old = w.sh(&keeps_rev_one, "cat /srv/app/app.txt").await.0;
    assert!(old.contains("version one"), "{old}");
    let sid = keeps_rev_one.parse().expect("id");
    w.manager.hibernate(&sid).await.expect("hibernate");
    w.manager.wake(&sid).await.expect("wake");
    let old = w.sh(&keeps_rev_one, "cat /srv/app/app.txt").await.0;
    assert!(old.contains("version one"), "after a wake: {old}");
    let pinned = w
        .manager
        .create(CreateSandbox {
            template: Some(format!("web@{rev_one}")),
            isolation: IsolationRequest::Ns,
            ..CreateSandbox::default()
        })
        .await
        .expect("create web@rev");
    assert_eq!(pinned.template_rev, Some(rev_one));
    w.kill(pinned.id.as_str()).await;
    w.kill(&keeps_rev_one).await;
    assert_eq!(
        w.manager
            .collect_template_revisions()
            .await
            .expect("collect"),
        1
    );
    assert!(
        templates.old_revisions("web").is_empty(),
        "unused, it is collected"
    );

    // A failing RUN: the build fails with the step's output; the template keeps serving.
    let bad = w.scratch.join("bad");
    write(
        &bad,
        "Dockerfile",
        "FROM minimal\nRUN echo about to fail >&2; exit 7\n",
    );
    let (failed, log) = w.build("web", &bad).await;
    assert_eq!(failed.status, BuildStatus::Failed, "{log}");
    let error = failed.error.clone().unwrap_or_default();
    assert!(
        error.contains("exit code 7") && error.contains("line 2"),
        "{error}"
    );
    assert!(log.contains("about to fail"), "{log}");
    let id = w.create("web").await;
    assert!(w
        .sh(&id, "cat /srv/app/app.txt")
        .await
        .0
        .contains("version two"));
    w.kill(&id).await;

    // A bad instruction is refused before anything runs, naming its line.
    let worse = w.scratch.join("worse");
    write(
        &worse,
        "Dockerfile",
        "FROM minimal\n# a comment\nFROB the thing\n",
    );
    let refused = w
        .builder
        .start(w.request("web", &worse))
        .await
        .expect_err("refused");
    assert!(refused.to_string().contains("line 3"), "{refused}");
    let left = w
        .manager
        .list(
            &Default::default(),
            &hutch_core::tenant::TenantScope::All,
            &Default::default(),
        )
        .await
        .expect("list");
    assert!(
        left.items.is_empty(),
        "no build sandbox is left: {:?}",
        left.items
    );
}

#[tokio::test]
async fn a_template_built_on_another_keeps_its_start_command_unless_it_sets_its_own() {
    in_world(inherited_start).await;
}

async fn inherited_start(w: Arc<World>) {
    let build = |name: &'static str, dockerfile: &'static str| {
        let w = w.clone();
        async move {
            let dir = w.scratch.join(format!("src-{name}"));
            write(&dir, "Dockerfile", dockerfile);
            let (view, log) = w.build(name, &dir).await;
            assert_eq!(view.status, BuildStatus::Succeeded, "{name}: {log}");
            w.manager.templates().get(name).expect("built").start
        }
    };
    let argv = |spec: &Option<hutch_proto::ServiceSpec>| match spec.as_ref().map(|s| &s.cmd) {
        Some(Command::Argv(argv)) => argv.clone(),
        other => panic!("an argv start command: {other:?}"),
    };
    let service = build(
        "svc",
        "FROM minimal\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\"]\nHEALTHCHECK CMD [\"true\"]\n",
    )
    .await;
    assert_eq!(argv(&service), ["httpd", "-f", "-p", "8080"]);
    // No CMD of its own: the base's start command and ready check carry over.
    let child = build("svc-child", "FROM svc\nRUN echo child > /child\n").await;
    assert_eq!(child, service);
    // Its own HEALTHCHECK replaces the ready check, not the command.
    let checked = build("svc-checked", "FROM svc\nHEALTHCHECK CMD [\"false\"]\n").await;
    assert_eq!(argv(&checked), argv(&service));
    assert_ne!(
        checked.as_ref().map(|s| &s.ready),
        service.as_ref().map(|s| &s.ready)
    );
    // Its own CMD wins.
    let own = build("svc-own", "FROM svc\nCMD [\"sleep\", \"1000\"]\n").await;
    assert_eq!(argv(&own), ["sleep", "1000"]);
}

#[tokio::test]
async fn a_scratch_stage_holds_only_what_it_copies_in() {
    in_world(scratch_stage).await;
}

async fn scratch_stage(w: Arc<World>) {
    let dir = w.scratch.join("src-scratch");
    write(
        &dir,
        "Dockerfile",
        "FROM minimal AS tools\nRUN mkdir -p /out && echo built > /out/file\n\
         FROM scratch\nCOPY --from=tools /out/file /file\nCOPY --from=tools /bin/busybox /bin/busybox\n",
    );
    let (view, log) = w.build("from-scratch", &dir).await;
    assert_eq!(view.status, BuildStatus::Succeeded, "{log}");
    let root = w.manager.templates().rootfs("from-scratch");
    assert_eq!(
        std::fs::read_to_string(root.join("file")).expect("copied"),
        "built\n"
    );
    assert!(root.join("bin/busybox").is_file());
    // Nothing of minimal's: no shell, no symlinks to busybox.
    assert!(
        std::fs::symlink_metadata(root.join("bin/sh")).is_err(),
        "{log}"
    );
    assert!(root.join("etc/hosts").is_file(), "what every template has");
    // A sandbox of it runs the copied program (an image's default disk, 2 GiB, is more
    // than this world's pool).
    let id = w
        .manager
        .create(CreateSandbox {
            template: Some("from-scratch".into()),
            isolation: IsolationRequest::Ns,
            disk_mib: Some(256),
            ..CreateSandbox::default()
        })
        .await
        .expect("create")
        .id
        .to_string();
    let client = w
        .manager
        .agent(&id.parse().expect("id"))
        .await
        .expect("agent");
    let done = client
        .exec_collect(
            ExecRequest {
                cmd: Command::Argv(vec!["/bin/busybox".into(), "cat".into(), "/file".into()]),
                env: Default::default(),
                cwd: None,
                user: None,
                timeout_ms: Some(30_000),
                pty: None,
                stdin: false,
                background: false,
                handle: None,
            },
            None,
            1 << 20,
        )
        .await
        .expect("exec");
    assert_eq!(String::from_utf8_lossy(&done.stdout), "built\n");
    w.kill(&id).await;
    // A RUN in a scratch stage has no shell to run in: the build fails at that step.
    let dir = w.scratch.join("src-scratch-run");
    write(&dir, "Dockerfile", "FROM scratch\nRUN echo hi\n");
    let (view, log) = w.build("scratch-run", &dir).await;
    assert_eq!(view.status, BuildStatus::Failed, "{log}");
    assert!(
        view.error.as_deref().unwrap_or("").contains("step 1"),
        "{:?}",
        view.error
    );
}

#[tokio::test]
async fn add_unpacks_bzip2_and_xz_archives_as_docker_does() {
    in_world(compressed_archives).await;
}

/// A tar holding `inner/<name>.txt` with `text`.
fn tar_of(name: &str, text: &str) -> Vec<u8> {
    let mut header = tar::Header::new_gnu();
    header.set_size(text.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    let mut b = tar::Builder::new(Vec::new());
    b.append_data(&mut header, format!("inner/{name}.txt"), text.as_bytes())
        .expect("tar");
    b.into_inner().expect("tar")
}

async fn compressed_archives(w: Arc<World>) {
    use std::io::Write;
    let dir = w.scratch.join("src-compressed");
    write(
        &dir,
        "Dockerfile",
        "FROM minimal\nADD a.tar.bz2 /from-bz2/\nADD b.tar.xz /from-xz/\nADD c.xz-but-not /kept/\n",
    );
    let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::default());
    bz.write_all(&tar_of("bz", "from bzip2\n")).expect("bzip2");
    std::fs::write(dir.join("a.tar.bz2"), bz.finish().expect("bzip2")).expect("write");
    let mut xz = Vec::new();
    lzma_rs::xz_compress(&mut tar_of("xz", "from xz\n").as_slice(), &mut xz).expect("xz");
    std::fs::write(dir.join("b.tar.xz"), &xz).expect("write");
    // Not an archive by its bytes: copied as it is, whatever its name says.
    write(&dir, "c.xz-but-not", "plain text\n");
    let (view, log) = w.build("compressed", &dir).await;
    assert_eq!(view.status, BuildStatus::Succeeded, "{log}");
    let root = w.manager.templates().rootfs("compressed");
    let read = |p: &str| {
        std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}\n{log}"))
    };
    assert_eq!(read("from-bz2/inner/bz.txt"), "from bzip2\n");
    assert_eq!(read("from-xz/inner/xz.txt"), "from xz\n");
    assert_eq!(read("kept/c.xz-but-not"), "plain text\n");
}
