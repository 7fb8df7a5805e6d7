//! The served OpenAPI document against what the server does: schemathesis (from PyPI, in the
//! tests' own virtual environment, `scripts/venv.sh`) generates requests for every
//! operation from the document — its examples, the boundaries of every schema, then
//! random data — with a fixed seed and a bounded number of cases, and checks each answer:
//! no 5xx, a status and a content type the document lists for the operation, a body (and
//! every SSE event) its schema allows.
//!
//! One worker: the cases then come in the seed's order on every run, and schemathesis's
//! workers are threads that, on CPython 3.11, can trip over each other's `ast` parsing
//! inside hypothesis ("AST constructor recursion depth mismatch", seen in CI).
//!
//! Left out, each for a reason schemathesis cannot work around: `DELETE` and `PATCH
//! /v1/keys/{id}` (a generated id can be the run's own admin key: revoked, every call is
//! 401; given a budget of 0, every call on a sandbox is 429 `quota_exceeded`; seen in CI),
//! `PUT /v1/sandboxes/{id}/files/archive` (a tar body schemathesis cannot generate),
//! `GET /v1/sandboxes/{id}/logs` (`follow=true` streams until the sandbox ends, which the
//! run's read timeout reports as a network error), the WebSocket routes (`pty`, `tunnel`:
//! a 101 and then frames, which schemathesis does not speak; `tests/pty.rs` and
//! `tests/ports.rs` cover them, their HTTP errors included) and the port proxy
//! (`/ports/{port}/…` relays whatever the sandbox's service answers, its own 5xx included,
//! and is a 502 when nothing listens, as a gateway should be).

use std::path::PathBuf;
use std::process::Command;

use hutch_testkit::TestServer;
use serde_json::json;

/// The schemathesis of the tests' environment: `<venv>-schemathesis/bin/schemathesis`
/// beside the venv whose python `HUTCH_TEST_PYTHON` names.
fn schemathesis() -> PathBuf {
    let python = std::env::var("HUTCH_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "HUTCH_TEST_PYTHON is not set: run the tests with HUTCH_TEST_PYTHON=$(scripts/venv.sh)"
        )
    });
    let venv = PathBuf::from(python)
        .parent()
        .and_then(|bin| bin.parent())
        .map(PathBuf::from)
        .expect("the venv of HUTCH_TEST_PYTHON");
    let mut name = venv.file_name().expect("venv name").to_os_string();
    name.push("-schemathesis");
    let exe = venv.with_file_name(name).join("bin/schemathesis");
    assert!(
        exe.exists(),
        "{} is missing: scripts/venv.sh installs it",
        exe.display()
    );
    exe
}

#[tokio::test]
async fn every_operation_answers_as_the_openapi_document_says() {
    let exe = schemathesis();
    // Builds may pull only from a registry on a dead local port: an image the fuzzer names
    // is refused before its name is even resolved (nothing leaves the machine).
    // Its own templates directory: the fuzzer deletes and PATCHes templates (a fuzzed start
    // command on the shared `minimal` broke every later test that used it).
    let templates = tempfile::Builder::new()
        .prefix("hutch-fuzz-templates-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    hutch_testkit::private_templates(templates.path());
    let s = TestServer::start_in(
        templates.path().to_path_buf(),
        &["--allowed-registry", "127.0.0.1:9"],
    )
    .await;
    // One real sandbox, so that routes on a sandbox meet one as well as unknown ids.
    let _id = s.create_id(json!({})).await;
    let reports = tempfile::tempdir().expect("tempdir");
    let (url, key) = (s.url.clone(), s.key.clone());
    let report_dir = reports.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(&exe)
            .arg("run")
            .arg(format!("{url}/v1/openapi.json"))
            .args(["--url", &url])
            .args(["-H", &format!("Authorization: Bearer {key}")])
            .args(["--seed", "1", "--max-examples", "3", "--workers", "1"])
            .args(["--phases", "examples,coverage,fuzzing"])
            .args([
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            ])
            .args(["--request-timeout", "20"])
            .args(["--exclude-name", "DELETE /v1/keys/{id}"])
            .args(["--exclude-name", "PATCH /v1/keys/{id}"])
            .args(["--exclude-name", "PUT /v1/sandboxes/{id}/files/archive"])
            .args(["--exclude-name", "GET /v1/sandboxes/{id}/logs"])
            .args(["--exclude-name", "GET /v1/sandboxes/{id}/pty"])
            .args(["--exclude-name", "GET /v1/sandboxes/{id}/tunnel/{port}"])
            .args(["--exclude-path-regex", "/ports/\\{port\\}"])
            .args(["--report", "junit", "--report-dir"])
            .arg(&report_dir)
            .env("NO_COLOR", "1")
            .output()
            .expect("run schemathesis")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "schemathesis found answers the document does not allow:\n{stdout}\n{stderr}"
    );
    // Not vacuous: (nearly) every operation was tested.
    let tested: usize = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Tested: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no 'Tested:' line in:\n{stdout}"));
    assert!(tested >= 75, "only {tested} operations tested:\n{stdout}");
}
