//! `hutch serve --config FILE`: a TOML file fills in the flags the command line did not
//! give, and a bad file stops the server before it starts, naming what is wrong.

use hutch_testkit::TestServer;
use serde_json::json;

#[tokio::test]
async fn a_config_file_sets_flags_the_command_line_did_not_give() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("hutch.toml");
    std::fs::write(
        &config,
        // `listen` is on the test server's command line, which wins: a server listening on
        // port 9 would never answer.
        "listen = \"127.0.0.1:9\"\ndefault_ttl = 1234\nmax-json-body = 4096\n",
    )
    .expect("write the config");
    let s = TestServer::start_with(&["--config", config.to_str().expect("utf-8")]).await;
    let created = s.create(json!({})).await;
    assert_eq!(created["ttl_seconds"], 1234, "{created}");
    let big = "x".repeat(8192);
    let (status, v) = s
        .post("/v1/sandboxes", json!({"metadata": {"big": big}}))
        .await;
    assert_eq!(status, 413, "{v}");
}

#[test]
fn a_bad_config_file_is_refused_before_the_server_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (text, expected) in [
        (
            "lisen = \"127.0.0.1:7700\"",
            "`lisen` is not a flag of hutch serve",
        ),
        (
            "default-ttl = \"soon\"",
            "invalid value 'soon' for '--default-ttl",
        ),
        ("listen = ", "not valid TOML"),
    ] {
        let config = dir.path().join("bad.toml");
        std::fs::write(&config, text).expect("write the config");
        let out = std::process::Command::new(hutch_testkit::hutch_bin())
            .args(["serve", "--config"])
            .arg(&config)
            .args(["--state-dir"])
            .arg(dir.path().join("state"))
            .output()
            .expect("run hutch serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {stderr}");
        assert!(stderr.contains(expected), "{text}: {stderr}");
        assert!(
            !dir.path().join("state").exists(),
            "{text}: nothing was made"
        );
    }
}
