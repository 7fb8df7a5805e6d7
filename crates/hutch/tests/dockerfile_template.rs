//! A template built from a Dockerfile through the API serves at once: its `CMD` is the start
//! command and its `HEALTHCHECK` the ready check, so a sandbox's service answers through the
//! port proxy as soon as the create returns — on `ns` (started at create) and on `vm`
//! (baked with the service up).

use std::time::{Duration, Instant};

use hutch_testkit::{both_backends, on, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

const DOCKERFILE: &str = "FROM minimal
RUN mkdir -p /www && echo built-from-a-dockerfile > /www/index.html
HEALTHCHECK --interval=1s --timeout=2s CMD wget -qO- http://127.0.0.1:8080/ >/dev/null
CMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]
";

/// The context (a Dockerfile only) as a tar stream.
fn context() -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("Dockerfile"), DOCKERFILE).expect("write");
    let mut writer = hutch_proto::archive::ArchiveWriter::open(dir.path()).expect("archive");
    let mut out = Vec::new();
    while let Some(chunk) = writer.next_chunk(1 << 16).expect("chunk") {
        out.extend(chunk);
    }
    out
}

/// Build `name` through the API and wait for it.
async fn build(s: &TestServer, name: &str) -> Value {
    let resp = s
        .http
        .post(format!("{}/v1/templates?name={name}", s.url))
        .bearer_auth(&s.key)
        .header("content-type", "application/x-tar")
        .body(context())
        .send()
        .await
        .expect("POST /v1/templates");
    assert_eq!(resp.status().as_u16(), 202);
    let started: Value = resp.json().await.expect("json");
    let id = started["id"].as_str().expect("build id").to_string();
    let t0 = Instant::now();
    loop {
        let (status, v) = s
            .request(
                Method::GET,
                &format!("/v1/templates/{name}/builds/{id}"),
                None,
            )
            .await;
        assert_eq!(status, 200, "{v}");
        match v["status"].as_str() {
            Some("succeeded") => return v,
            Some("failed") | Some("cancelled") => panic!("the build ended: {v}"),
            _ => {}
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the build ends: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

both_backends!(its_service_answers_through_the_port_proxy_right_after_create);

async fn its_service_answers_through_the_port_proxy_right_after_create(isolation: &str) {
    let s = TestServer::start().await;
    let name = format!("df-web-{isolation}-{}", std::process::id());
    build(&s, &name).await;
    let (status, t) = s
        .request(Method::GET, &format!("/v1/templates/{name}"), None)
        .await;
    assert_eq!(status, 200, "{t}");
    assert!(
        t["start"]["ready"].is_object(),
        "HEALTHCHECK is the ready check: {t}"
    );

    let id = s
        .create_id(on(isolation, json!({"template": name, "disk_mib": 512})))
        .await;
    let resp = s
        .http
        .get(format!("{}/v1/sandboxes/{id}/ports/8080/", s.url))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("port proxy");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.text().await.expect("body"),
        "built-from-a-dockerfile\n"
    );

    assert_eq!(s.kill(&id).await, 204);
    let (status, v) = s
        .request(Method::DELETE, &format!("/v1/templates/{name}"), None)
        .await;
    assert!(status == 204 || status == 200, "{status} {v}");
}
