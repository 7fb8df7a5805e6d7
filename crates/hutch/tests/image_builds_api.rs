//! Template builds through the API that pull images, against a real registry on loopback
//! whose every image needs a login: a Dockerfile on an image and copying from one, whose
//! credentials a build pulls with, where it may pull from, and who sees what it pulled. The host's Docker
//! `config.json` (here `DOCKER_CONFIG`, holding the registry's password) is lent to admin
//! keys' builds only; a tenant's pull of a `FROM` image is that tenant's own template, so
//! another tenant neither sees it nor builds on it without logging in itself.

#[path = "../../hutch-image/tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::Method;
use serde_json::{json, Value};
use support::oci::{self, busybox_layer, LayerBlob};
use support::registry::{Registry, PASSWORD, USER};

use hutch_testkit::TestServer;

/// A build context holding only `dockerfile`, as a tar.
fn context(dockerfile: &str) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(dockerfile.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, "Dockerfile", dockerfile.as_bytes())
        .expect("append");
    builder.into_inner().expect("tar")
}

/// Wait for build `started` (the answer to `POST /v1/templates`) to end; its last view.
async fn ended(s: &TestServer, key: &str, started: &Value) -> Value {
    let path = format!(
        "/v1/templates/{}/builds/{}",
        started["template"].as_str().expect("template"),
        started["id"].as_str().expect("id")
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, v) = s.request_as(key, Method::GET, &path, None).await;
        assert_eq!(status, 200, "{v}");
        if ["succeeded", "failed", "cancelled"].contains(&v["status"].as_str().unwrap_or("")) {
            return v;
        }
        assert!(Instant::now() < deadline, "the build did not end: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An image build of `reference` as `key` (JSON body, no credentials); how it ended.
async fn image_build(s: &TestServer, key: &str, name: &str, reference: &str) -> Value {
    let (status, started) = s
        .request_as(
            key,
            Method::POST,
            "/v1/templates",
            Some(json!({"name": name, "from_image": reference})),
        )
        .await;
    assert_eq!(status, 202, "{started}");
    ended(s, key, &started).await
}

/// A Dockerfile build as `key`, with `auth` in `X-Hutch-Registry-Auth`; how it ended.
async fn dockerfile_build(
    s: &TestServer,
    key: &str,
    name: &str,
    dockerfile: &str,
    auth: Option<&str>,
) -> Value {
    let mut req = s
        .http
        .post(format!("{}/v1/templates?name={name}", s.url))
        .bearer_auth(key)
        .header("content-type", "application/x-tar")
        .body(context(dockerfile));
    if let Some(auth) = auth {
        req = req.header("x-hutch-registry-auth", auth);
    }
    let resp = req.send().await.expect("post");
    assert_eq!(resp.status().as_u16(), 202);
    let started: Value = resp.json().await.expect("json");
    ended(s, key, &started).await
}

/// A registry holding `repo:1`: a busybox layer whose `/from-image` says `marker`, with the
/// image config `config`.
fn registry_with_image(repo: &str, marker: &str, config: Value) -> (Registry, String) {
    let registry = Registry::start();
    let layout = registry.dir.path().join("layout");
    let top = oci::image(
        &layout,
        "amd64",
        &[LayerBlob::gzip(&busybox_layer(marker))],
        config,
    );
    oci::finish(&layout, "1", top);
    let reference = registry.push(&layout, "1", repo, false, false);
    (registry, reference)
}

/// The names of the templates `key` lists.
async fn listed(s: &TestServer, key: &str) -> Vec<String> {
    let (status, v) = s.request_as(key, Method::GET, "/v1/templates", None).await;
    assert_eq!(status, 200, "{v}");
    v["templates"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|t| t["name"].as_str().map(String::from))
        .collect()
}

#[tokio::test]
async fn tenants_pull_with_their_own_credentials_and_keep_what_they_pulled() {
    let work = tempfile::Builder::new()
        .prefix("hutch-image-tenants-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let templates = work.path().join("templates");
    hutch_testkit::private_templates(&templates);
    let (registry, reference) = registry_with_image(
        "team/private",
        "private image",
        json!({"Env": ["PATH=/bin"]}),
    );
    // The host's Docker config can log in to the registry.
    let docker = work.path().join("docker");
    std::fs::create_dir_all(&docker).expect("mkdir");
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    std::fs::write(
        docker.join("config.json"),
        json!({"auths": {registry.host.clone(): {"auth": auth}}}).to_string(),
    )
    .expect("config");
    let ca = registry.ca.display().to_string();
    let docker_dir = docker.display().to_string();
    let a_server = TestServer::start_in_with_env(
        templates.clone(),
        &["--registry-ca", &ca],
        &[("DOCKER_CONFIG", &docker_dir)],
    )
    .await;
    // Without an allow list a tenant's pull never reaches the host's own addresses (the
    // registry is on loopback): refused before any connection to it.
    let a = a_server.tenant_key("team-a", "full").await;
    let local = image_build(&a_server, &a, "a-local", &reference).await;
    assert_eq!(local["status"], "failed", "{local}");
    assert!(
        local["error"]
            .as_str()
            .unwrap_or("")
            .contains("an address of the server's own host"),
        "{local}"
    );
    drop(a_server);
    // With the registry allowed by the operator, tenants pull from it, as themselves.
    let s = TestServer::start_in_with_env(
        templates.clone(),
        &["--registry-ca", &ca, "--allowed-registry", &registry.host],
        &[("DOCKER_CONFIG", &docker_dir)],
    )
    .await;
    let a = s.tenant_key("team-a", "full").await;
    let b = s.tenant_key("team-b", "full").await;

    // A tenant is not lent the host's credentials; an admin key is.
    let refused = image_build(&s, &a, "a-image", &reference).await;
    assert_eq!(refused["status"], "failed", "{refused}");
    assert!(
        refused["error"].as_str().unwrap_or("").contains("401"),
        "{refused}"
    );
    let admin = image_build(&s, &s.key, "shared-image", &reference).await;
    assert_eq!(admin["status"], "succeeded", "{admin}");

    // Tenant A logs in itself: its FROM image is pulled into a template of its own.
    let dockerfile = format!("FROM {reference}\nENV BUILT_BY=a\n");
    let login = format!("{USER}:{PASSWORD}");
    let a_built = dockerfile_build(&s, &a, "a-app", &dockerfile, Some(&login)).await;
    assert_eq!(a_built["status"], "succeeded", "{a_built}");
    let a_sees = listed(&s, &a).await;
    let a_pull: Vec<&String> = a_sees.iter().filter(|n| n.starts_with("image-")).collect();
    assert_eq!(a_pull.len(), 1, "{a_sees:?}");
    // Tenant B sees neither A's template nor A's pull, and cannot build on it unseen.
    let b_sees = listed(&s, &b).await;
    assert!(
        !b_sees.iter().any(|n| n == "a-app" || n == a_pull[0]),
        "{b_sees:?}"
    );
    let (status, _) = s
        .request_as(
            &b,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"template": a_pull[0], "isolation": "ns"})),
        )
        .await;
    assert_eq!(
        status, 404,
        "another tenant's pull is not B's to create from"
    );
    let b_built = dockerfile_build(&s, &b, "b-app", &dockerfile, None).await;
    assert_eq!(b_built["status"], "failed", "{b_built}");
    assert!(
        b_built["error"].as_str().unwrap_or("").contains("401"),
        "B's FROM pulls anonymously and is refused: {b_built}"
    );
}

#[tokio::test]
async fn a_dockerfile_builds_on_an_image_and_copies_from_one() {
    let work = tempfile::Builder::new()
        .prefix("hutch-image-dockerfile-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let templates = work.path().join("templates");
    hutch_testkit::private_templates(&templates);
    let (registry, reference) = registry_with_image(
        "team/tools",
        "made by the image",
        json!({"Env": ["PATH=/bin", "FROM_IMAGE=yes"]}),
    );
    let ca = registry.ca.display().to_string();
    let s = TestServer::start_in(templates, &["--registry-ca", &ca]).await;
    let login = format!("{USER}:{PASSWORD}");
    // On the image: RUN uses its programs and its environment.
    let on_image =
        format!("FROM {reference}\nRUN echo \"$FROM_IMAGE $(cat /from-image)\" > /seen\n");
    let v = dockerfile_build(&s, &s.key, "on-image", &on_image, Some(&login)).await;
    assert_eq!(v["status"], "succeeded", "{v}");
    let id = s
        .create_id(json!({"template": "on-image", "isolation": "ns"}))
        .await;
    let (out, code) = s.sh(&id, "cat /seen").await;
    assert_eq!((out.as_str(), code), ("yes made by the image\n", 0));
    // From the image: its file lands in a stage of another template.
    let copying = format!(
        "FROM minimal\nCOPY --from={reference} /from-image /copied\nRUN cat /copied > /seen\n"
    );
    let v = dockerfile_build(&s, &s.key, "copies-image", &copying, Some(&login)).await;
    assert_eq!(v["status"], "succeeded", "{v}");
    let id = s
        .create_id(json!({"template": "copies-image", "isolation": "ns"}))
        .await;
    let (out, code) = s
        .sh(&id, "cat /seen; test -e /bin/busybox && echo minimal")
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("made by the image"), "{out}");
    // The same build again is all cache hits (the image's identity is its digest).
    let again = dockerfile_build(&s, &s.key, "copies-image", &copying, Some(&login)).await;
    assert_eq!(again["status"], "succeeded", "{again}");
    let steps: Vec<&str> = again["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|st| st["status"].as_str())
        .collect();
    assert_eq!(steps, ["cached", "cached"], "{again}");
}
