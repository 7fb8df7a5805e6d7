//! Running one behaviour case on every backend: `both_backends!` turns `async fn case(isolation:
//! &str)` into a `case::ns` and a `case::vm` test; the `vm` one is skipped, loudly, on a host
//! where `hutch doctor` says the vm backend cannot run.

use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use crate::paths::{agent_bin, hutch_bin};

/// Run behaviour cases (`async fn case(isolation: &str)`) against both backends: makes
/// `case::ns` and `case::vm` tests. Shared cases are written once and parameterised, not
/// copied (see STYLE.md). The `vm` test skips with a message when
/// [`vm_unavailable`](crate::vm_unavailable) gives a reason.
#[macro_export]
macro_rules! both_backends {
    ($($case:ident),+ $(,)?) => {$(
        mod $case {
            #[::tokio::test]
            async fn ns() {
                super::$case("ns").await
            }
            #[::tokio::test]
            async fn vm() {
                if $crate::skip_without_vm(module_path!()) {
                    return;
                }
                super::$case("vm").await
            }
        }
    )+};
}

/// `body` with `"isolation": isolation` added (a create request).
pub fn on(isolation: &str, mut body: Value) -> Value {
    body["isolation"] = Value::String(isolation.to_string());
    body
}

/// Why the vm backend cannot run on this host (`hutch doctor`'s own verdict, asked once per
/// test process), or `None` when it can.
pub fn vm_unavailable() -> Option<&'static str> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| {
        let out = Command::new(hutch_bin())
            .args(["--json", "doctor"])
            .env("HUTCH_AGENT", agent_bin())
            .output()
            .expect("run hutch doctor");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "hutch doctor printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        vm_verdict(&report)
    })
    .as_deref()
}

/// The vm backend's verdict in a doctor report: `None` when available, else its reason.
fn vm_verdict(report: &Value) -> Option<String> {
    let vm = &report["backends"]["vm"];
    match vm["available"].as_bool() {
        Some(true) => None,
        Some(false) => Some(
            vm["detail"]
                .as_str()
                .unwrap_or("no reason given")
                .to_string(),
        ),
        None => panic!("hutch doctor's report has no backends.vm.available: {report}"),
    }
}

/// For the `vm` half of a `both_backends!` case named `test`: `true` (after saying so on
/// stderr) when the vm backend cannot run here and the test is to return without running.
pub fn skip_without_vm(test: &str) -> bool {
    let Some(why) = vm_unavailable() else {
        return false;
    };
    eprintln!("\n!!!! SKIPPED: {test}: the vm backend cannot run on this host: {why} !!!!\n");
    true
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_verdict_follows_doctors_vm_line() {
        let ok = json!({"backends": {"vm": {"available": true, "detail": "TCG"}}});
        assert_eq!(vm_verdict(&ok), None);
        let missing = json!({"backends": {"vm": {"available": false, "detail": "no qemu-img"}}});
        assert_eq!(vm_verdict(&missing).as_deref(), Some("no qemu-img"));
    }

    #[test]
    #[should_panic(expected = "no backends.vm.available")]
    fn a_report_without_a_vm_line_is_an_error_not_a_skip() {
        vm_verdict(&json!({"backends": {}}));
    }

    #[test]
    fn on_sets_the_isolation_of_a_create_body() {
        assert_eq!(
            on("vm", json!({"ttl_seconds": 5})),
            json!({"ttl_seconds": 5, "isolation": "vm"})
        );
    }
}
