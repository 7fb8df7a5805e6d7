//! The `hutch` CLI against a real server.

#[macro_use]
mod common;

use std::process::{Command, Output};

use common::{hutch_bin, TestServer};

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
        .env("HUTCH_AGENT", common::agent_bin());
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
    let bin = common::path_without(&["qemu-img"]);
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
        .env("HUTCH_AGENT", common::agent_bin())
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
    common::ensure_template("base");
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
