//! Tenant isolation on every route, from the attacker's side: tenant B holds a full key of
//! its own and aims it at tenant A's objects (a sandbox, a snapshot, a volume, a key, a
//! private template and its build). Every route of `docs/openapi.json` is walked: a route
//! naming one of A's objects must answer 404 (never 403: no existence oracle), a listing
//! must not show A's objects, and a route this table does not know fails the test, so a
//! route added without the tenant check (or without a row here) cannot slip through.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use hutch_testkit::{templates_dir, wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// Removes its template from the shared templates directory when dropped.
struct TemplateGuard(String);

impl Drop for TemplateGuard {
    fn drop(&mut self) {
        if let Ok(store) = hutch_template::TemplateStore::open(templates_dir()) {
            let _ = store.remove(&self.0);
        }
        let _ = std::fs::remove_file(templates_dir().join(format!(".lock-{}", self.0)));
    }
}

/// A tar stream holding one Dockerfile.
fn context(dockerfile: &str) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(dockerfile.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "Dockerfile", dockerfile.as_bytes())
        .expect("append");
    b.into_inner().expect("tar")
}

/// Start a build of template `name` with `key`: status and body.
async fn build(s: &TestServer, key: &str, name: &str) -> (u16, Value) {
    let resp = s
        .http
        .post(format!("{}/v1/templates?name={name}", s.url))
        .bearer_auth(key)
        .header("content-type", "application/x-tar")
        .body(context("FROM minimal\nRUN echo private > /made-by-a\n"))
        .send()
        .await
        .expect("post the context");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A's objects, by the name of the path parameter they fill.
struct Objects {
    sandbox: String,
    snapshot: String,
    volume: String,
    key: String,
    template: String,
    build: String,
}

impl Objects {
    /// `route` (an OpenAPI path template) with A's objects in its parameters.
    fn fill(&self, route: &str) -> String {
        let id = if route.starts_with("/v1/sandboxes/") {
            &self.sandbox
        } else if route.starts_with("/v1/snapshots/") {
            &self.snapshot
        } else if route.starts_with("/v1/volumes/") {
            &self.volume
        } else if route.starts_with("/v1/keys/") {
            &self.key
        } else {
            &self.build
        };
        let name = if route.starts_with("/v1/tenants/") {
            "team-a"
        } else {
            &self.template
        };
        route
            .replace("{id}", id)
            .replace("{name}", name)
            .replace("{port}", "8080")
            .replace("{cid}", "ctx_anything")
            .replace("{process}", "1")
            .replace("{path}", "index.html")
    }
}

/// A plausible body for `method route`, so a route missing its check would act.
fn body_for(method: &Method, route: &str) -> Option<Value> {
    if *method == Method::GET || *method == Method::DELETE {
        return None;
    }
    let tail = route.rsplit('/').next().unwrap_or_default();
    Some(match tail {
        "exec" | "stream" => json!({"cmd": ["true"]}),
        "code" => json!({"code": "1"}),
        "fork" => json!({"count": 1}),
        "explore" => json!({"commands": [["true"]]}),
        "network" => json!({"egress": "none"}),
        "mkdir" => json!({"path": "/tmp/b"}),
        "move" => json!({"from": "/etc/hostname", "to": "/tmp/h"}),
        "{id}" if route.starts_with("/v1/sandboxes/") => json!({"ttl_seconds": 60}),
        _ => json!({}),
    })
}

/// The query a route needs to get past its own parsing.
fn query_for(route: &str) -> &'static str {
    if route.contains("/files") {
        "?path=/etc/hostname"
    } else {
        ""
    }
}

/// The routes of `docs/openapi.json`, with their methods.
fn documented_routes() -> Vec<(Method, String)> {
    let doc: Value =
        serde_json::from_str(include_str!("../../../docs/openapi.json")).expect("openapi.json");
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in ["get", "post", "put", "patch", "delete"] {
            if item.get(m).is_some() {
                out.push((m.to_uppercase().parse().expect("method"), path.clone()));
            }
        }
    }
    out
}

/// Ids in a listing's `collection`.
fn ids(v: &Value, collection: &str, field: &str) -> Vec<String> {
    v[collection]
        .as_array()
        .unwrap_or_else(|| panic!("no {collection} in {v}"))
        .iter()
        .filter_map(|x| x[field].as_str().map(String::from))
        .collect()
}

#[tokio::test]
async fn another_tenants_objects_are_404_on_every_route() {
    let template = TemplateGuard(format!("tenant-walk-{}", std::process::id()));
    let s = TestServer::start().await;
    let a = s.tenant_key("team-a", "full").await;
    let b = s.tenant_key("team-b", "full").await;
    let (_, a_keys) = s.request_as(&a, Method::GET, "/v1/keys", None).await;
    let a_key = ids(&a_keys, "keys", "id").pop().expect("A's key");
    let call = |key: &str, method: Method, path: &str, body: Option<Value>| {
        let (key, path) = (key.to_string(), path.to_string());
        let s = &s;
        async move { s.request_as(&key, method, &path, body).await }
    };
    let (status, v) = call(&a, Method::POST, "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(status, 201, "{v}");
    let sandbox = v["id"].as_str().expect("id").to_string();
    s.sh_ok(&sandbox, "echo a-secret > /tmp/a").await;
    let (status, v) = call(
        &a,
        Method::POST,
        &format!("/v1/sandboxes/{sandbox}/snapshots"),
        Some(json!({"name": "a-snap"})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let snapshot = v["id"].as_str().expect("id").to_string();
    let (status, v) = call(
        &a,
        Method::POST,
        "/v1/volumes",
        Some(json!({"name": "a-vol", "size_mib": 8})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let volume = v["id"].as_str().expect("id").to_string();
    let (status, v) = build(&s, &a, &template.0).await;
    assert_eq!(status, 202, "{v}");
    let build_id = v["id"].as_str().expect("build id").to_string();
    let done = wait_until(Duration::from_secs(120), async || {
        let (_, v) = call(
            &a,
            Method::GET,
            &format!("/v1/templates/{}/builds/{build_id}", template.0),
            None,
        )
        .await;
        matches!(v["status"].as_str(), Some("succeeded" | "failed")).then_some(v)
    })
    .await
    .expect("the build ended");
    assert_eq!(done["status"], "succeeded", "{done}");
    let objects = Objects {
        sandbox: sandbox.clone(),
        snapshot: snapshot.clone(),
        volume: volume.clone(),
        key: a_key.clone(),
        template: template.0.clone(),
        build: build_id.clone(),
    };
    // A sees each of its objects (so B's 404s are about B, not about missing objects).
    for route in [
        "/v1/sandboxes/{id}",
        "/v1/snapshots/{id}",
        "/v1/volumes/{id}",
        "/v1/keys/{id}",
        "/v1/templates/{name}",
        "/v1/templates/{name}/builds/{id}",
    ] {
        let (status, v) = call(&a, Method::GET, &objects.fill(route), None).await;
        assert_eq!(status, 200, "A's own {route}: {v}");
    }

    // The routes without a parameter: what B's key gets there.
    let listings: BTreeMap<&str, (&str, &str, String)> = [
        ("/v1/sandboxes", ("sandboxes", "id", sandbox.clone())),
        ("/v1/snapshots", ("snapshots", "id", snapshot.clone())),
        ("/v1/volumes", ("volumes", "id", volume.clone())),
        ("/v1/keys", ("keys", "id", a_key.clone())),
        ("/v1/templates", ("templates", "name", template.0.clone())),
    ]
    .into_iter()
    .collect();
    let mut walked = 0;
    for (method, route) in documented_routes() {
        let path = format!("{}{}", objects.fill(&route), query_for(&route));
        if !route.contains('{') {
            match (method.as_str(), route.as_str()) {
                // Public, or nobody's objects.
                ("GET", "/healthz" | "/metrics" | "/v1/openapi.json") => {}
                // B's own creates; B using A's objects in them is checked below.
                ("POST", "/v1/sandboxes" | "/v1/volumes" | "/v1/keys" | "/v1/templates") => {}
                ("GET", "/v1/metrics") => {
                    let (status, v) = call(&b, method.clone(), &path, None).await;
                    assert_eq!(status, 404, "per-sandbox metrics name every tenant's: {v}");
                }
                ("GET", "/v1/build-cache") | ("POST", "/v1/build-cache/prune") => {
                    let (status, v) = call(&b, method.clone(), &path, body_for(&method, &route)).await;
                    assert_eq!(status, 403, "the build cache is the server's: {method} {route}: {v}");
                }
                ("GET" | "POST", "/v1/tenants") => {
                    let (status, v) = call(&b, method.clone(), &path, body_for(&method, &route)).await;
                    assert_eq!(status, 403, "{method} {route}: {v}");
                }
                ("GET", "/v1/events") => {} // below: a stream
                ("GET", "/v1/audit") => {
                    let (status, v) = call(&b, Method::GET, &path, None).await;
                    assert_eq!(status, 200, "{v}");
                    assert!(
                        v["entries"].as_array().is_some_and(|e| e.iter().all(|x| x["tenant"] == "team-b")),
                        "B reads another tenant's audit entries: {v}"
                    );
                    let (status, v) = call(&b, Method::GET, "/v1/audit?tenant=team-a", None).await;
                    assert_eq!(status, 403, "{v}");
                }
                ("GET", "/v1/usage") => {
                    let (status, v) = call(&b, Method::GET, "/v1/usage?group_by=tenant", None).await;
                    assert_eq!(status, 200, "{v}");
                    assert!(
                        v["groups"].as_array().is_some_and(|g| g.iter().all(|x| x["tenant"] == "team-b")),
                        "B reads another tenant's usage: {v}"
                    );
                    let (status, v) = call(&b, Method::GET, "/v1/usage?tenant=team-a", None).await;
                    assert_eq!(status, 403, "{v}");
                    let (status, v) =
                        call(&b, Method::GET, &format!("/v1/usage?sandbox_id={sandbox}"), None).await;
                    assert_eq!((status, v["total"]["intervals"].clone()), (200, json!(0)), "{v}");
                }
                ("GET", listing) if listings.contains_key(listing) => {
                    let (collection, field, a_id) = &listings[listing];
                    let (status, v) = call(&b, Method::GET, &path, None).await;
                    assert_eq!(status, 200, "{route}: {v}");
                    assert!(
                        !ids(&v, collection, field).contains(a_id),
                        "B lists A's {a_id} at {route}: {v}"
                    );
                }
                // Cluster mode's routes do not exist on this single server (a tenant's key
                // is 403 on them in a cluster: tests/cluster/placement.rs).
                ("GET", "/v1/cluster/nodes") => {
                    let (status, v) = call(&b, Method::GET, &path, None).await;
                    assert_eq!(status, 404, "{v}");
                }
                _ => panic!(
                    "{method} {route} has no row in this test: say what tenant B's key must get there"
                ),
            }
            walked += 1;
            continue;
        }
        if route.starts_with("/v1/cluster/") {
            // As above: no such route here.
            let (status, v) = call(&b, method.clone(), &path, body_for(&method, &route)).await;
            assert_eq!(status, 404, "{method} {route}: {v}");
            walked += 1;
            continue;
        }
        if route.starts_with("/v1/tenants/") {
            let (status, v) = call(&b, method.clone(), &path, body_for(&method, &route)).await;
            assert_eq!(
                status, 403,
                "tenants are admin keys': {method} {route}: {v}"
            );
            walked += 1;
            continue;
        }
        let resp = {
            let mut req = s
                .http
                .request(method.clone(), format!("{}{path}", s.url))
                .bearer_auth(&b);
            match body_for(&method, &route) {
                Some(body) if route.ends_with("/files") => req = req.body(body.to_string()),
                Some(body) => req = req.json(&body),
                None => {}
            }
            req.send().await.expect("request")
        };
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(
            status, 404,
            "tenant B reached A's object: {method} {route}: {v}"
        );
        if route.starts_with("/v1/sandboxes/{id}") {
            assert_eq!(
                v["error"]["message"],
                format!("sandbox {sandbox} does not exist"),
                "{method} {route}: the words of an unknown sandbox"
            );
        }
        walked += 1;
    }
    assert!(walked > 50, "walked only {walked} routes");

    // B's event stream shows none of A's events (A created, snapshotted, built meanwhile).
    let events = s
        .http
        .get(format!("{}/v1/events?since=0", s.url))
        .bearer_auth(&b)
        .send()
        .await
        .expect("events");
    assert_eq!(events.status(), 200);
    let mut stream = events.bytes_stream();
    let mut seen = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(chunk)) = stream.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(!seen.contains(&sandbox), "B saw A's events: {seen}");

    // B cannot use A's snapshot, volume or private template in a create, nor take the
    // template's name.
    for body in [
        json!({"snapshot": snapshot}),
        json!({"snapshot": "a-snap"}),
        json!({"volumes": [{"volume": volume, "path": "/data"}]}),
        json!({"volumes": [{"volume": "a-vol", "path": "/data"}]}),
        json!({"template": template.0}),
    ] {
        let (status, v) = call(&b, Method::POST, "/v1/sandboxes", Some(body.clone())).await;
        assert_eq!(status, 404, "{body}: {v}");
    }
    let (status, v) = call(
        &b,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"template": template.0})),
    )
    .await;
    let message = v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(status, 404);
    assert!(
        !message
            .replacen(&format!("{:?}", template.0), "", 1)
            .contains(&template.0),
        "B's answer lists A's private template: {message}"
    );
    let (status, v) = build(&s, &b, &template.0).await;
    assert_eq!(status, 409, "{v}");
    // Nothing of A's changed, and A still uses its template.
    assert_eq!(s.state(&sandbox).await, "running");
    assert_eq!(s.sh_ok(&sandbox, "cat /tmp/a").await, "a-secret\n");
    let (status, v) = call(
        &a,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"template": template.0})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let on_template = v["id"].as_str().expect("id").to_string();
    assert_eq!(s.sh_ok(&on_template, "cat /made-by-a").await, "private\n");
    // Deleting a tenant that owns things is refused, naming them.
    let (status, v) = s.request(Method::DELETE, "/v1/tenants/team-a", None).await;
    assert_eq!(status, 409, "{v}");
    let owned = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        owned.contains("2 sandboxes")
            && owned.contains("1 snapshot")
            && owned.contains("1 volume")
            && owned.contains("1 template"),
        "{owned}"
    );
    for id in [&sandbox, &on_template] {
        assert_eq!(s.kill(id).await, 204);
    }
    for path in [
        format!("/v1/snapshots/{snapshot}"),
        format!("/v1/volumes/{volume}"),
        format!("/v1/templates/{}", template.0),
    ] {
        let (status, v) = call(&a, Method::DELETE, &path, None).await;
        assert_eq!(status, 204, "A deletes its {path}: {v}");
    }
    let (status, v) = s.request(Method::DELETE, "/v1/tenants/team-a", None).await;
    assert_eq!(status, 204, "{v}");
    let (status, _) = call(&a, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, 401, "a deleted tenant's keys stop working");
}
