//! A template built from a Dockerfile through the API serves at once: its `CMD` is the start
//! command and its `HEALTHCHECK` the ready check, so a sandbox's service answers through the
//! port proxy as soon as the create returns — on `ns` (started at create) and on `vm`
//! (baked with the service up). Its last `WORKDIR` and `USER` are where and as whom commands
//! run when they name neither, as with `docker exec`.

use std::time::{Duration, Instant};

use hutch_testkit::{both_backends, on, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

const DOCKERFILE: &str = "FROM minimal
RUN mkdir -p /www && echo built-from-a-dockerfile > /www/index.html
HEALTHCHECK --interval=1s --timeout=2s CMD wget -qO- http://127.0.0.1:8080/ >/dev/null
CMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]
";

/// The context (the Dockerfile `dockerfile` only) as a tar stream.
fn context(dockerfile: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("Dockerfile"), dockerfile).expect("write");
    let mut writer = hutch_proto::archive::ArchiveWriter::open(dir.path()).expect("archive");
    let mut out = Vec::new();
    while let Some(chunk) = writer.next_chunk(1 << 16).expect("chunk") {
        out.extend(chunk);
    }
    out
}

/// Build `name` from `dockerfile` through the API and wait for it.
async fn build(s: &TestServer, name: &str, dockerfile: &str) -> Value {
    build_with(s, name, dockerfile, "").await
}

/// [`build`] with more of the query (`&cpus=…`).
async fn build_with(s: &TestServer, name: &str, dockerfile: &str, query: &str) -> Value {
    let resp = s
        .http
        .post(format!("{}/v1/templates?name={name}{query}", s.url))
        .bearer_auth(&s.key)
        .header("content-type", "application/x-tar")
        .body(context(dockerfile))
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
    // One warm guest on vm: the second create below claims it.
    let s = TestServer::start_with(&["--vm-warm", "1"]).await;
    let name = format!("df-web-{isolation}-{}", std::process::id());
    build(&s, &name, DOCKERFILE).await;
    let (status, t) = s
        .request(Method::GET, &format!("/v1/templates/{name}"), None)
        .await;
    assert_eq!(status, 200, "{t}");
    assert!(
        t["start"]["ready"].is_object(),
        "HEALTHCHECK is the ready check: {t}"
    );

    let create = on(isolation, json!({"template": name, "disk_mib": 512}));
    let id = s.create_id(create.clone()).await;
    assert_serves(&s, &id).await;
    assert_eq!(s.kill(&id).await, 204);

    if isolation == "vm" {
        // A warm guest ran the ready check while it was warmed; claimed, it only confirms
        // the start command still runs — and it answers at once all the same.
        let warm = warm_guest_ids(&s).await;
        let id = s.create_id(create).await;
        assert!(
            warm.contains(&id),
            "{id} was claimed from the pool {warm:?}"
        );
        assert_serves(&s, &id).await;
        assert_eq!(s.kill(&id).await, 204);
    }

    let (status, v) = s
        .request(Method::DELETE, &format!("/v1/templates/{name}"), None)
        .await;
    assert!(status == 204 || status == 200, "{status} {v}");
}

/// The service of sandbox `id` answers through the port proxy now.
async fn assert_serves(s: &TestServer, id: &str) {
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
}

/// The ids of the server's warm vm guests once one is ready: guest directories the API does
/// not list, while the warm-guest gauge says 1.
async fn warm_guest_ids(s: &TestServer) -> std::collections::BTreeSet<String> {
    let t0 = Instant::now();
    loop {
        let metrics = s.metrics_text().await;
        let gauge = metrics
            .lines()
            .find_map(|l| l.strip_prefix("hutch_vm_warm_guests "))
            .map(str::trim)
            .unwrap_or("0")
            .to_owned();
        let (status, listed) = s.request(Method::GET, "/v1/sandboxes", None).await;
        assert_eq!(status, 200, "{listed}");
        let listed: Vec<&str> = listed
            .as_array()
            .or_else(|| listed["sandboxes"].as_array())
            .expect("a list")
            .iter()
            .filter_map(|x| x["id"].as_str())
            .collect();
        let hidden: std::collections::BTreeSet<String> =
            std::fs::read_dir(s.state_dir.join("sandboxes"))
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| e.file_name().into_string().ok())
                        .filter(|n| !listed.contains(&n.as_str()))
                        .collect()
                })
                .unwrap_or_default();
        if gauge == "1" && hidden.len() == 1 {
            return hidden;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "a warm guest is ready (gauge {gauge}, hidden {hidden:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const DOCKERFILE_WORKDIR_USER: &str = "FROM minimal
RUN echo 'app:x:1234:1234:app:/app:/bin/sh' >> /etc/passwd && echo 'app:x:1234:' >> /etc/group
RUN mkdir -p /app && chown 1234:1234 /app
WORKDIR /app
USER app
";

both_backends!(commands_run_in_the_templates_workdir_as_its_user_unless_told_otherwise);

async fn commands_run_in_the_templates_workdir_as_its_user_unless_told_otherwise(isolation: &str) {
    let s = TestServer::start().await;
    let name = format!("df-defaults-{isolation}-{}", std::process::id());
    build(&s, &name, DOCKERFILE_WORKDIR_USER).await;
    let (status, t) = s
        .request(Method::GET, &format!("/v1/templates/{name}"), None)
        .await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(
        t["defaults"]["exec"],
        json!({"cwd": "/app", "user": "app"}),
        "{t}"
    );
    let id = s
        .create_id(on(isolation, json!({"template": name, "disk_mib": 512})))
        .await;
    let v = s.exec(&id, json!({"cmd": "pwd; id -u; touch mine"})).await;
    assert_eq!(v["stdout"], "/app\n1234\n", "{v}");
    let v = s
        .exec(
            &id,
            json!({"cmd": "pwd; id -u", "cwd": "/tmp", "user": "root"}),
        )
        .await;
    assert_eq!(
        v["stdout"], "/tmp\n0\n",
        "a request's own cwd and user win: {v}"
    );
    if isolation == "ns" {
        // Kept through a snapshot: its sandboxes run commands where the template's did.
        let (status, snap) = s
            .request(
                Method::POST,
                &format!("/v1/sandboxes/{id}/snapshots"),
                Some(json!({"name": "with-defaults"})),
            )
            .await;
        assert_eq!(status, 201, "{snap}");
        let from = s
            .create_id(json!({"snapshot": snap["id"], "isolation": "ns"}))
            .await;
        let v = s
            .exec(&from, json!({"cmd": "pwd; id -u; ls -n mine"}))
            .await;
        let out = v["stdout"].as_str().unwrap_or_default();
        assert!(out.starts_with("/app\n1234\n"), "{v}");
        assert!(
            out.contains(" 1234 "),
            "the file the template's user made: {v}"
        );
        assert_eq!(s.kill(&from).await, 204);
        let (status, _) = s
            .request(
                Method::DELETE,
                &format!("/v1/snapshots/{}", snap["id"].as_str().unwrap_or_default()),
                None,
            )
            .await;
        assert!(status == 204 || status == 200);
    }
    assert_eq!(s.kill(&id).await, 204);
    let (status, v) = s
        .request(Method::DELETE, &format!("/v1/templates/{name}"), None)
        .await;
    assert!(status == 204 || status == 200, "{status} {v}");
}

/// `cpus=`, `memory_mib=` and `disk_mib=` of a build are what the template's sandboxes get
/// when a create names none; a rebuild with other values is not skipped as cached.
#[tokio::test]
async fn a_builds_resources_are_its_sandboxes_defaults() {
    let s = TestServer::start().await;
    let dockerfile = "FROM minimal\nRUN echo sized > /sized\n";
    build_with(
        &s,
        "sized",
        dockerfile,
        "&cpus=1.5&memory_mib=384&disk_mib=600",
    )
    .await;
    let mut made = Vec::new();
    let v = s
        .create(json!({"template": "sized", "isolation": "ns"}))
        .await;
    made.push(v["id"].as_str().expect("id").to_string());
    assert_eq!(
        (&v["cpus"], &v["memory_mib"], &v["disk_mib"]),
        (&json!(1.5), &json!(384), &json!(600)),
        "{v}"
    );
    let v = s
        .create(json!({"template": "sized", "isolation": "ns", "memory_mib": 200}))
        .await;
    made.push(v["id"].as_str().expect("id").to_string());
    assert_eq!(
        (&v["cpus"], &v["memory_mib"]),
        (&json!(1.5), &json!(200)),
        "{v}"
    );
    build_with(&s, "sized", dockerfile, "&memory_mib=512").await;
    let v = s
        .create(json!({"template": "sized", "isolation": "ns"}))
        .await;
    made.push(v["id"].as_str().expect("id").to_string());
    assert_eq!(v["memory_mib"], 512, "the rebuild's default: {v}");
    let resp = s
        .http
        .post(format!(
            "{}/v1/templates?name=sized&memory_mib=a+lot",
            s.url
        ))
        .bearer_auth(&s.key)
        .header("content-type", "application/x-tar")
        .body(context(dockerfile))
        .send()
        .await
        .expect("POST");
    assert_eq!(resp.status().as_u16(), 400);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(
        v["error"]["message"], "memory_mib must be a number from 16 to 1048576, got \"a lot\"",
        "{v}"
    );
    for id in &made {
        assert_eq!(s.kill(id).await, 204);
    }
    // A killed sandbox lets go of its template revision once it is gone.
    let deleted = hutch_testkit::wait_until(Duration::from_secs(30), async || {
        let (st, _) = s.request(Method::DELETE, "/v1/templates/sized", None).await;
        (st == 200 || st == 204).then_some(())
    })
    .await;
    assert!(
        deleted.is_some(),
        "the template is deleted once its sandboxes are gone"
    );
}
