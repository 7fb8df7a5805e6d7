//! TLS served by Hutch itself (`hutch serve --tls-cert --tls-key`): every listener speaks
//! TLS with the given certificate, ALPN offers `h2` only on the E2B API's, the URLs the
//! server hands out say `https`, and Hutch's own CLI talks to it (HTTP and WebSocket),
//! trusting the CA through `SSL_CERT_FILE`. A plaintext client and a client that does not
//! trust the CA get nothing; a key that does not fit the certificate stops the server.
//! The E2B SDKs over TLS (HTTP/2 by ALPN) are in `e2b_python.rs` and `e2b_js.rs`.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use hutch_testkit::{hutch_bin, TestCa, TestServer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn tls_server(ca: &TestCa) -> TestServer {
    TestServer::start_with_tls(ca, &["--e2b-listen", "127.0.0.1:0"]).await
}

/// `host:port` of an `https://host:port` URL.
fn authority(url: &str) -> &str {
    url.strip_prefix("https://")
        .unwrap_or_else(|| panic!("{url} is not an https URL"))
        .trim_end_matches('/')
}

/// The protocol `openssl s_client` negotiates with `addr` when it offers `offer` by ALPN.
fn negotiated(addr: &str, offer: &str, ca: &TestCa) -> String {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", addr, "-alpn", offer, "-CAfile"])
        .arg(ca.root())
        .arg("-verify_return_error")
        .stdin(Stdio::null())
        .output()
        .expect("run openssl s_client");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("Verify return code: 0 (ok)"),
        "{addr} did not present the certificate the CA signed:\n{text}"
    );
    text.lines()
        .find_map(|l| l.trim().strip_prefix("ALPN protocol: "))
        .unwrap_or("none")
        .to_string()
}

#[tokio::test]
async fn every_listener_serves_tls_with_its_certificate_and_alpn() {
    let ca = TestCa::new();
    let s = tls_server(&ca).await;
    let preview = s.preview_url.clone().expect("a preview origin");
    let e2b = s.e2b_url.clone().expect("an E2B listener");
    for url in [&s.url, &preview, &e2b] {
        assert!(url.starts_with("https://"), "{url}");
    }

    // The API works over TLS, and the URLs it hands out point back at https.
    let id = s.create_id(json!({})).await;
    let (out, code) = s.sh(&id, "echo over-$((40+2))").await;
    assert_eq!((out.as_str(), code), ("over-42\n", 0));
    s.put_file(&id, "/tmp/f.txt", "0644", b"signed bytes".to_vec())
        .await;
    let (status, answer) = s
        .post(
            &format!("/v1/sandboxes/{id}/files/url"),
            json!({"path": "/tmp/f.txt", "op": "read"}),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let signed = answer["url"].as_str().expect("a url");
    assert!(signed.starts_with("https://"), "{signed}");
    let got = s.http.get(signed).send().await.expect("GET the signed URL");
    assert_eq!(got.status(), 200);
    assert_eq!(got.text().await.expect("body"), "signed bytes");
    let (status, link) = s
        .post(
            &format!("/v1/sandboxes/{id}/port-tokens"),
            json!({"port": 8000}),
        )
        .await;
    assert_eq!(status, 201, "{link}");
    let browser = link["url"].as_str().expect("a browser url");
    assert!(browser.starts_with("https://8000-"), "{browser}");

    // ALPN: HTTP/2 only where the E2B SDKs want it; the others keep HTTP/1.1 (their
    // WebSockets and tunnels are HTTP/1.1 upgrades).
    assert_eq!(negotiated(authority(&e2b), "h2,http/1.1", &ca), "h2");
    assert_eq!(negotiated(authority(&e2b), "http/1.1", &ca), "http/1.1");
    assert_eq!(
        negotiated(authority(&s.url), "h2,http/1.1", &ca),
        "http/1.1"
    );
    assert_eq!(
        negotiated(authority(&preview), "h2,http/1.1", &ca),
        "http/1.1"
    );

    // A client that does not trust the CA gets no answer.
    let untrusting = reqwest::Client::new()
        .get(format!("{}/v1/sandboxes", s.url))
        .bearer_auth(&s.key)
        .send()
        .await;
    let err = untrusting.expect_err("an unknown CA must fail the handshake");
    assert!(err.is_connect(), "{err:?}");

    // Plaintext HTTP on a TLS listener gets no HTTP answer, and the server stays up.
    for url in [&s.url, &e2b] {
        let mut tcp = tokio::net::TcpStream::connect(authority(url))
            .await
            .expect("connect");
        tcp.write_all(b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut buf)).await;
        assert!(
            !buf.starts_with(b"HTTP/"),
            "a plaintext request was answered: {:?}",
            String::from_utf8_lossy(&buf)
        );
    }
    let (out, _) = s.sh(&id, "echo still-up").await;
    assert_eq!(out, "still-up\n");
}

#[tokio::test]
async fn the_cli_calls_an_https_server_and_opens_a_terminal_over_wss() {
    let ca = TestCa::new();
    let s = tls_server(&ca).await;
    let id = s.create_id(json!({})).await;
    let hutch = |args: &[&str]| {
        let mut cmd = Command::new(hutch_bin());
        cmd.args(args)
            .env("HUTCH_URL", &s.url)
            .env("HUTCH_API_KEY", &s.key)
            .env("SSL_CERT_FILE", ca.root())
            .env("HUTCH_STATE_DIR", &s.state_dir);
        cmd
    };
    let ls = hutch(&["ls"]).output().expect("hutch ls");
    assert!(
        ls.status.success() && String::from_utf8_lossy(&ls.stdout).contains(&id),
        "hutch ls: {}{}",
        String::from_utf8_lossy(&ls.stdout),
        String::from_utf8_lossy(&ls.stderr)
    );
    let exec = hutch(&["exec", &id, "--", "sh", "-c", "echo cli-$((6*7))"])
        .output()
        .expect("hutch exec");
    assert_eq!(
        String::from_utf8_lossy(&exec.stdout),
        "cli-42\n",
        "{exec:?}"
    );

    // `hutch shell` is a WebSocket terminal: wss here.
    let mut shell = hutch(&["shell", &id])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hutch shell");
    shell
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"echo wss-$((40+2)); exit\n")
        .expect("type into the shell");
    let out = shell.wait_with_output().expect("hutch shell ends");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("wss-42"),
        "hutch shell over wss: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Without the CA the CLI refuses the server's certificate, and says so.
    let refused = Command::new(hutch_bin())
        .args(["ls"])
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_API_KEY", &s.key)
        .env_remove("SSL_CERT_FILE")
        .output()
        .expect("hutch ls");
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr).to_lowercase();
    assert!(err.contains("certificate"), "{err}");
}

#[test]
fn a_key_that_does_not_fit_the_certificate_stops_the_server_at_start() {
    let ca = TestCa::new();
    let other = TestCa::new();
    let state = tempfile::tempdir().expect("tempdir");
    let out = Command::new(hutch_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--preview-listen",
            "off",
        ])
        .arg("--tls-cert")
        .arg(ca.cert())
        .arg("--tls-key")
        .arg(other.key())
        .arg("--state-dir")
        .arg(state.path())
        .stdin(Stdio::null())
        .output()
        .expect("hutch serve");
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot be used together"), "{err}");
    assert!(
        std::fs::read_dir(state.path())
            .expect("state dir")
            .next()
            .is_none(),
        "nothing is made before the certificate is checked"
    );

    let out = Command::new(hutch_bin())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .arg("--tls-cert")
        .arg(ca.cert())
        .stdin(Stdio::null())
        .output()
        .expect("hutch serve");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--tls-key"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
