//! The `hutch` CLI against a real server.

use std::process::{Command, Output};

use hutch_testkit::{both_backends, hutch_bin, TestServer};

fn hutch(s: &TestServer, args: &[&str]) -> Output {
    Command::new(hutch_bin())
        .args(args)
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_STATE_DIR", &s.state_dir)
        .env_remove("HUTCH_API_KEY")
        .output()
        .expect("run hutch")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

both_backends!(
    run_prints_output_and_exits_with_the_commands_code,
    create_exec_cp_inspect_kill,
    run_python_on_the_base_template
);

async fn run_prints_output_and_exits_with_the_commands_code(isolation: &str) {
    let s = TestServer::start().await;
    let o = hutch(
        &s,
        &[
            "run",
            "--template",
            "minimal",
            "--isolation",
            isolation,
            "--",
            "sh",
            "-c",
            "echo hello; echo oops >&2; exit 3",
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert_eq!(stdout(&o), "hello\n");
    assert!(String::from_utf8_lossy(&o.stderr).contains("oops"));
    // run destroys its sandbox.
    let ls = hutch(&s, &["ls", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&ls.stdout).expect("json");
    assert_eq!(v["sandboxes"].as_array().map(Vec::len), Some(0), "{v}");
}

async fn create_exec_cp_inspect_kill(isolation: &str) {
    let s = TestServer::start().await;
    let o = hutch(
        &s,
        &[
            "create",
            "--template",
            "minimal",
            "--isolation",
            isolation,
            "--meta",
            "owner=cli",
        ],
    );
    assert!(o.status.success(), "{o:?}");
    let id = stdout(&o).trim().to_string();
    assert!(id.starts_with("sbx_"), "{id}");

    let o = hutch(&s, &["exec", &id, "--", "sh", "-c", "echo $((2+2))"]);
    assert_eq!(stdout(&o), "4\n");
    let o = hutch(&s, &["--json", "exec", &id, "--", "false"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["exit_code"], 1);

    let dir = tempfile::tempdir().expect("tmp");
    let local = dir.path().join("in.txt");
    std::fs::write(&local, "payload\n").expect("write");
    let o = hutch(
        &s,
        &[
            "cp",
            local.to_str().expect("utf8"),
            &format!("{id}:/root/in.txt"),
        ],
    );
    assert!(o.status.success(), "{o:?}");
    let back = dir.path().join("out.txt");
    let o = hutch(
        &s,
        &[
            "cp",
            &format!("{id}:/root/in.txt"),
            back.to_str().expect("utf8"),
        ],
    );
    assert!(o.status.success(), "{o:?}");
    assert_eq!(std::fs::read_to_string(&back).expect("read"), "payload\n");

    let o = hutch(&s, &["inspect", &id]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["metadata"]["owner"], "cli");
    assert_eq!(v["state"], "running");
    assert_eq!(v["isolation"], isolation);

    let o = hutch(&s, &["ls"]);
    assert!(stdout(&o).contains(&id));
    let o = hutch(&s, &["kill", &id]);
    assert!(o.status.success(), "{o:?}");
    let o = hutch(&s, &["inspect", &id]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("does not exist"),
        "{o:?}"
    );
}

#[tokio::test]
async fn errors_are_clear_in_human_and_json_modes() {
    let s = TestServer::start().await;
    let o = hutch(&s, &["exec", "sbx_missing", "--", "true"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("sbx_missing does not exist"),
        "{o:?}"
    );
    let o = hutch(&s, &["--json", "inspect", "sbx_missing"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["error"]["code"], "not_found", "{v}");
}

fn doctor_json(path: Option<&std::path::Path>) -> (serde_json::Value, Option<i32>) {
    let mut cmd = Command::new(hutch_bin());
    cmd.args(["--json", "doctor"])
        .env("HUTCH_AGENT", hutch_testkit::agent_bin());
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    let o = cmd.output().expect("doctor");
    let v = serde_json::from_slice(&o.stdout).expect("json");
    (v, o.status.code())
}

/// On a host without `qemu-img`, doctor marks `vm` unavailable and names the package; ns
/// still runs (exit 0).
#[test]
fn doctor_names_the_package_of_a_missing_vm_tool() {
    let bin = hutch_testkit::path_without(&["qemu-img"]);
    let (v, code) = doctor_json(Some(bin.path()));
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["backends"]["vm"]["available"], false, "{v}");
    let why = v["backends"]["vm"]["detail"].as_str().unwrap_or("");
    assert!(
        why.contains("qemu-img") && why.contains("apt-get install qemu-utils"),
        "{v}"
    );
    assert_eq!(v["isolation"]["vm"], false, "{v}");
    let tool = v["tools"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["command"] == "qemu-img"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (tool["found"].clone(), tool["package"].clone()),
        (false.into(), "qemu-utils".into()),
        "{v}"
    );
    assert_eq!(v["backends"]["ns"]["available"], true, "{v}");
}

/// After `scripts/deps.sh` (which CI runs first), every tool every feature needs is here and
/// both backends are available: a missing install step fails here, not halfway through.
#[test]
fn doctor_is_all_ok_after_deps() {
    let (v, code) = doctor_json(None);
    assert_eq!(code, Some(0), "{v}");
    let missing: Vec<String> = v["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter(|t| t["found"] != true)
        .map(|t| format!("{} ({})", t["command"], t["package"]))
        .collect();
    assert!(missing.is_empty(), "missing: {missing:?}");
    for b in ["ns", "vm"] {
        assert_eq!(v["backends"][b]["available"], true, "{b}: {v}");
    }
    for f in ["volumes", "template_builds", "network"] {
        assert_eq!(v[f]["ok"], true, "{f}: {v}");
    }
    assert_eq!(v["ns_disk_quota"]["enforced"], true, "{v}");
}

#[test]
fn doctor_reports_namespace_support() {
    let o = Command::new(hutch_bin())
        .args(["--json", "doctor"])
        .env("HUTCH_AGENT", hutch_testkit::agent_bin())
        .output()
        .expect("doctor");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["isolation"]["ns"], true, "{v}");
    assert_eq!(v["isolation"]["auto"], "ns", "{v}");
    assert!(
        !v["isolation"]["why"].as_str().unwrap_or("").is_empty(),
        "{v}"
    );
    // This machine has btrfs and mkfs.btrfs: a server would enforce disk_mib on ns.
    assert_eq!(v["ns_disk_quota"]["enforced"], true, "{v}");
    assert!(
        v["ns_disk_quota"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("GiB")),
        "{v}"
    );
}

/// The "done when": `hutch run -- python3 -c 'print(6*7)'` on the `base` template.
/// On `vm` the first run on a machine also makes the template's image and snapshot.
async fn run_python_on_the_base_template(isolation: &str) {
    hutch_testkit::ensure_template("base");
    let s = TestServer::start().await;
    let o = hutch(
        &s,
        &[
            "run",
            "--template",
            "base",
            "--isolation",
            isolation,
            "--",
            "python3",
            "-c",
            "print(6*7)",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(stdout(&o), "42\n");
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `hutch create` of a minimal sandbox; its id.
fn create_minimal(s: &TestServer) -> String {
    let o = hutch(s, &["create", "--template", "minimal", "--isolation", "ns"]);
    assert!(o.status.success(), "{o:?}");
    stdout(&o).trim().to_string()
}

/// `hutch exec` waits like `docker exec` (the server's default timeout, 1 s here, does not
/// apply); `--timeout N` kills and says so; `-e`, `--cwd` and `--user` reach the command, on
/// `exec` and on `run`.
#[tokio::test]
async fn exec_waits_without_a_timeout_and_passes_env_cwd_user() {
    let s = TestServer::start_with(&["--default-exec-timeout", "1"]).await;
    let id = create_minimal(&s);
    let o = hutch(&s, &["exec", &id, "--", "sh", "-c", "sleep 2; echo done"]);
    assert_eq!(
        (o.status.code(), stdout(&o)),
        (Some(0), "done\n".into()),
        "{o:?}"
    );

    let o = hutch(&s, &["exec", "--timeout", "1", &id, "--", "sleep", "30"]);
    assert_ne!(o.status.code(), Some(0), "{o:?}");
    assert!(
        stderr(&o).contains("hutch: the command was killed after 1 s (--timeout 1)"),
        "{o:?}"
    );
    let o = hutch(
        &s,
        &["--json", "exec", "--timeout", "1", &id, "--", "sleep", "30"],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["timed_out"], true, "{v}");
    assert!(stderr(&o).contains("killed after 1 s"), "{o:?}");

    let script = "echo \"$GREETING $(pwd) $(id -u)\"";
    let o = hutch(
        &s,
        &[
            "exec",
            "-e",
            "GREETING=hi",
            "--cwd",
            "/tmp",
            "--user",
            "user",
            &id,
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    assert_eq!(stdout(&o), "hi /tmp 1000\n", "{o:?}");
    let o = hutch(&s, &["exec", "-e", "NOEQUALS", &id, "--", "true"]);
    assert!(
        stderr(&o).contains("--env \"NOEQUALS\" must be KEY=VALUE"),
        "{o:?}"
    );
    let o = hutch(
        &s,
        &[
            "run",
            "--template",
            "minimal",
            "--isolation",
            "ns",
            "-e",
            "GREETING=yo",
            "-w",
            "/tmp",
            "-u",
            "user",
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    assert_eq!(stdout(&o), "yo /tmp 1000\n", "{o:?}");
    hutch(&s, &["kill", &id]);
}

/// A create naming a template the server lacks says which it has and how to make one,
/// instead of a `hutch template build NAME` that cannot work for a custom name.
#[tokio::test]
async fn unknown_template_names_the_servers_templates_and_how_to_make_one() {
    let s = TestServer::start().await;
    let o = hutch(&s, &["create", "--template", "my-env"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let e = stderr(&o);
    assert!(e.contains("template \"my-env\" does not exist"), "{e}");
    assert!(
        e.contains("templates on this server: ") && e.contains("minimal"),
        "{e}"
    );
    assert!(e.contains("hutch snapshot ID --name NAME"), "{e}");
    assert!(!e.contains("hutch template build my-env"), "{e}");
    // A built-in recipe that is not built is named as such.
    let o = hutch(&s, &["create", "--template", "base"]);
    let e = stderr(&o);
    if !o.status.success() {
        assert!(e.contains("`hutch template build base`"), "{e}");
    } else {
        hutch(&s, &["kill", stdout(&o).trim()]);
    }
}

/// `hutch template ls` and `inspect` ask the server at HUTCH_URL, not this host's state
/// dir (the test's state dir holds no templates; the server's templates dir does).
#[tokio::test]
async fn template_ls_and_inspect_ask_the_server() {
    let s = TestServer::start().await;
    assert!(!s.state_dir.join("templates").exists());
    let o = hutch(&s, &["--json", "template", "ls"]);
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let names: Vec<&str> = v["templates"]
        .as_array()
        .expect("templates")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"minimal"), "{v}");
    let o = hutch(&s, &["template", "ls"]);
    assert!(
        stdout(&o)
            .lines()
            .any(|l| l.starts_with("minimal") && l.contains("ready")),
        "{o:?}"
    );
    let o = hutch(&s, &["template", "inspect", "minimal"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(
        (v["name"].clone(), v["ready"].clone()),
        ("minimal".into(), true.into()),
        "{v}"
    );
    let o = hutch(&s, &["template", "inspect", "nope"]);
    assert!(
        stderr(&o).contains("the server has no template \"nope\""),
        "{o:?}"
    );
    // A server that is not there is an error, not an empty local list.
    let o = Command::new(hutch_bin())
        .args(["template", "ls"])
        .env("HUTCH_URL", "http://127.0.0.1:9")
        .env("HUTCH_STATE_DIR", &s.state_dir)
        .output()
        .expect("run hutch");
    assert!(
        stderr(&o).contains("cannot reach the Hutch server"),
        "{o:?}"
    );
}

/// Snapshots need no name (named by their id), and `--snapshot NAME` finds a unique name;
/// two snapshots of one name make it ambiguous: 409 naming both ids.
#[tokio::test]
async fn snapshot_names_are_optional_and_resolve_when_unique() {
    let s = TestServer::start().await;
    let id = create_minimal(&s);
    let o = hutch(
        &s,
        &["exec", &id, "--", "sh", "-c", "echo warm > /root/mark"],
    );
    assert!(o.status.success(), "{o:?}");
    let o = hutch(&s, &["--json", "snapshot", &id]);
    assert!(o.status.success(), "{o:?}");
    let unnamed: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(unnamed["name"], unnamed["id"], "{unnamed}");
    let (status, v) = s
        .request(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{id}/snapshots"),
            None,
        )
        .await;
    assert_eq!(status, 201, "{v}");

    let o = hutch(&s, &["snapshot", &id, "--name", "warm"]);
    let first = stdout(&o).trim().to_string();
    assert!(first.starts_with("snap_"), "{o:?}");
    let o = hutch(&s, &["create", "--snapshot", "warm"]);
    assert!(o.status.success(), "{o:?}");
    let child = stdout(&o).trim().to_string();
    let o = hutch(&s, &["exec", &child, "--", "cat", "/root/mark"]);
    assert_eq!(stdout(&o), "warm\n", "{o:?}");

    let o = hutch(&s, &["snapshot", &id, "--name", "warm"]);
    let second = stdout(&o).trim().to_string();
    let o = hutch(&s, &["--json", "create", "--snapshot", "warm"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["error"]["status"], 409, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("2 snapshots are named \"warm\"")
            && msg.contains(&first)
            && msg.contains(&second),
        "{v}"
    );
    let o = hutch(&s, &["--json", "create", "--snapshot", "cold"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["error"]["status"], 404, "{v}");
    hutch(&s, &["kill", &child, &id]);
}

/// `explore ID -- a ::: b --timeout 3` would run `b --timeout 3`: refused, naming the option.
#[tokio::test]
async fn explore_refuses_its_options_after_the_commands() {
    let s = TestServer::start().await;
    let o = hutch(
        &s,
        &[
            "explore",
            "sbx_any",
            "--",
            "true",
            ":::",
            "false",
            "--timeout",
            "3",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        stderr(&o).contains("hutch: --timeout after `--` would be part of a candidate command"),
        "{o:?}"
    );
}
