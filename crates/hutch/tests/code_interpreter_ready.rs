//! A `code-interpreter` sandbox comes up with its Python kernel already running (issue 18,
//! item 4): the template's start command runs the kernel driver, which starts the default
//! Python context before it listens, and the create returns once it listens. The first
//! `run_code` then runs in that kernel — the same process, execution count 1 — instead of
//! starting one. On `vm` the template's bake is taken with the kernel up, so a restore has it.

use hutch_testkit::{both_backends, on, TestServer};
use serde_json::{json, Value};

both_backends!(the_first_run_code_after_a_create_runs_in_the_kernel_the_sandbox_started_with);

/// Pids of the sandbox's kernel processes (`python3 -m ipykernel_launcher …`), found
/// without naming the module in this script's own command line.
const KERNEL_PIDS: &str = "python3 -c \"import os; k = 'ipykernel' + '_launcher'; \
    print(' '.join(p for p in os.listdir('/proc') if p.isdigit() and \
    k in open('/proc/%s/cmdline' % p, 'rb').read().decode(errors='replace')))\"";

async fn the_first_run_code_after_a_create_runs_in_the_kernel_the_sandbox_started_with(
    isolation: &str,
) {
    hutch_testkit::ensure_template("code-interpreter");
    let s = TestServer::start().await;
    let mut body = on(isolation, json!({"template": "code-interpreter"}));
    if isolation == "vm" {
        body["memory_mib"] = json!(1024);
    }
    let id = s.create_id(body).await;
    // Before any code call: the driver listens and the kernel runs.
    let pids = s.sh_ok(&id, KERNEL_PIDS).await;
    let pids: Vec<&str> = pids.split_whitespace().collect();
    assert_eq!(pids.len(), 1, "one kernel is running at create: {pids:?}");
    let (status, v) = s
        .post(
            &format!("/v1/sandboxes/{id}/code"),
            json!({"code": "import os\nos.getpid()"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let main: Vec<&Value> = v["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|r| r["is_main_result"] == true)
        .collect();
    assert_eq!(
        main.first().and_then(|r| r["data"]["text/plain"].as_str()),
        Some(pids[0]),
        "the cell ran in the kernel that was already running: {v}"
    );
    assert_eq!(v["execution_count"], 1, "{v}");
    assert_eq!(v["context_restarted"], false, "{v}");
    let (out, _) = s.sh(&id, "ls /var/lib/hutch-interp").await;
    assert!(
        out.contains("contexts.json"),
        "the default context is recorded: {out}"
    );
}
