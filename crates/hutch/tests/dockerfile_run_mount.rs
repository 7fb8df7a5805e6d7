//! `RUN --mount` in Dockerfiles built through the API, and wildcards in `COPY --from`:
//! caches that outlive a build and stay out of the template, binds of context and stage
//! files that are there for their step only and key its cache, secrets that reach the
//! step and never the template or the log, and tmpfs directories that vanish.

use base64::Engine as _;
use hutch_testkit::{context_of, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// The build's log text.
async fn log_of(s: &TestServer, name: &str, build: &Value) -> String {
    s.build_log(&s.key, name, build).await
}

async fn build(s: &TestServer, name: &str, dockerfile: &str) -> Value {
    s.build_dockerfile_as(&s.key, name, dockerfile).await
}

fn succeeded(v: &Value) {
    assert_eq!(v["status"], "succeeded", "{v}");
}

/// Delete the volume named `name` (a build cache), which must exist.
async fn delete_volume(s: &TestServer, name: &str) {
    let (status, v) = s
        .request(Method::DELETE, &format!("/v1/volumes/{name}"), None)
        .await;
    assert_eq!(status, 204, "{name}: {v}");
}

#[tokio::test]
async fn cache_mounts_keep_their_files_between_builds_and_out_of_the_template() {
    let s = TestServer::start().await;
    let pid = std::process::id();
    let name = format!("run-cache-{pid}");
    let dockerfile = |n: u32| {
        format!(
            "FROM base\n\
             RUN --mount=type=cache,id=counter-{pid},target=/var/cache/counter \
             sh -c 'echo build-{n} >> /var/cache/counter/runs; wc -l < /var/cache/counter/runs > /runs-seen'\n\
             RUN --mount=type=cache,id=owned-{pid},target=/home/owned,uid=1000,gid=1000,mode=0700 \
             sh -c 'stat -c \"%u %g %a\" /home/owned > /owner-seen; echo {n} > /home/owned/x'\n"
        )
    };
    succeeded(&build(&s, &name, &dockerfile(1)).await);
    let id = s.create_id(json!({"template": name})).await;
    assert_eq!(
        s.sh_ok(&id, "cat /runs-seen /owner-seen").await,
        "1\n1000 1000 700\n"
    );
    // The cache's files are not in the template.
    assert_eq!(
        s.sh_ok(
            &id,
            "ls -A /var/cache/counter /home/owned 2>&1 | grep -v : | grep . || echo none"
        )
        .await,
        "none\n"
    );

    // A changed step runs again and finds what the last build left in the cache.
    succeeded(&build(&s, &name, &dockerfile(2)).await);
    let id = s.create_id(json!({"template": name})).await;
    assert_eq!(
        s.sh_ok(&id, "cat /runs-seen /owner-seen").await,
        "2\n1000 1000 700\n"
    );

    // The caches are the tenant's volumes, named after their ids.
    let (status, v) = s.request(Method::GET, "/v1/volumes", None).await;
    assert_eq!(status, 200, "{v}");
    let names: Vec<String> = v["volumes"]
        .as_array()
        .or_else(|| v["items"].as_array())
        .expect("a list of volumes")
        .iter()
        .filter_map(|v| v["name"].as_str().map(String::from))
        .filter(|n| n.starts_with("build-cache-"))
        .collect();
    assert_eq!(names.len(), 2, "{v}");
    assert!(
        names
            .iter()
            .any(|n| n.starts_with(&format!("build-cache-counter-{pid}-"))),
        "{names:?}"
    );
    for n in &names {
        delete_volume(&s, n).await;
    }
}

#[tokio::test]
async fn bind_mounts_show_context_and_stage_files_to_their_step_only() {
    let s = TestServer::start().await;
    let name = format!("run-bind-{}", std::process::id());
    let dockerfile = "FROM base AS tools\n\
         RUN mkdir -p /out && echo tool > /out/tool.txt && echo more > /out/more.txt && echo no > /out/skip.md\n\
         FROM base\n\
         RUN mkdir -p /src && echo keep > /src/existing\n\
         WORKDIR /src\n\
         RUN --mount=target=. --mount=type=bind,from=tools,source=/out,target=/opt/tools \
         sh -c 'cat data/a.txt /opt/tools/tool.txt > /seen; ls /src > /listing'\n\
         RUN --mount=type=tmpfs,target=/scratch sh -c 'echo x > /scratch/f && cat /scratch/f > /tmpfs-seen'\n\
         COPY --from=tools /out/*.txt /picked/\n";
    let context = |a: &str| {
        context_of(&[
            ("Dockerfile", dockerfile.as_bytes()),
            ("data/a.txt", a.as_bytes()),
        ])
    };
    let first = s
        .build_context_as(&s.key, &name, context("alpha\n"), &[])
        .await;
    succeeded(&first);
    let id = s.create_id(json!({"template": name})).await;
    assert_eq!(s.sh_ok(&id, "cat /seen").await, "alpha\ntool\n");
    assert_eq!(s.sh_ok(&id, "cat /listing").await, "Dockerfile\ndata\n");
    // What the binds covered is back as it was, and nothing they brought stayed.
    assert_eq!(
        s.sh_ok(&id, "ls -A /src; cat /src/existing").await,
        "existing\nkeep\n"
    );
    assert_eq!(
        s.sh_ok(&id, "test -e /opt/tools || test -e /scratch || echo gone")
            .await,
        "gone\n"
    );
    assert_eq!(s.sh_ok(&id, "cat /tmpfs-seen").await, "x\n");
    // COPY --from with a wildcard.
    assert_eq!(s.sh_ok(&id, "ls /picked").await, "more.txt\ntool.txt\n");

    // The bound files are part of the step's cache key.
    let same = s
        .build_context_as(&s.key, &name, context("alpha\n"), &[])
        .await;
    succeeded(&same);
    let log = log_of(&s, &name, &same).await;
    assert_eq!(log.matches("CACHED").count(), 6, "{log}");
    let changed = s
        .build_context_as(&s.key, &name, context("beta\n"), &[])
        .await;
    succeeded(&changed);
    let log = log_of(&s, &name, &changed).await;
    assert_eq!(
        log.matches("CACHED").count(),
        3,
        "only the steps before the bind: {log}"
    );
    let id = s.create_id(json!({"template": name})).await;
    assert_eq!(s.sh_ok(&id, "cat /seen").await, "beta\ntool\n");

    // A wildcard that matches nothing fails the build, naming it.
    let none = build(
        &s,
        &name,
        "FROM base AS a\nRUN true\nFROM base\nCOPY --from=a /etc/*.nothing /x/\n",
    )
    .await;
    assert_eq!(none["status"], "failed", "{none}");
    assert!(
        none["error"]
            .as_str()
            .unwrap_or("")
            .contains("no files match /etc/*.nothing"),
        "{none}"
    );
}

#[tokio::test]
async fn secrets_reach_their_step_and_never_the_template_or_the_log() {
    let s = TestServer::start().await;
    let name = format!("run-secret-{}", std::process::id());
    let value = "s3cret-value-4711";
    // The step records the secret's hashes (file and variable), never the secret.
    let dockerfile = "FROM base\n\
         RUN --mount=type=secret,id=tok --mount=type=secret,id=tok,env=TOK,target=/root/tok2,mode=0440 \
         sh -c 'sha256sum < /run/secrets/tok > /sums && printf %s \"$TOK\" | sha256sum >> /sums \
         && stat -c %a /run/secrets/tok /root/tok2 > /modes'\n";
    let sha = {
        use sha2::Digest as _;
        let d = sha2::Sha256::digest(value.as_bytes());
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    let header = (
        "x-hutch-build-secret",
        format!(
            "tok={}",
            base64::engine::general_purpose::STANDARD.encode(value)
        ),
    );
    let done = s
        .build_context_as(
            &s.key,
            &name,
            context_of(&[("Dockerfile", dockerfile.as_bytes())]),
            &[header],
        )
        .await;
    succeeded(&done);
    let log = log_of(&s, &name, &done).await;
    assert!(!log.contains(value), "the secret is not in the log: {log}");
    let id = s.create_id(json!({"template": name})).await;
    assert_eq!(s.sh_ok(&id, "cat /modes").await, "400\n440\n");
    assert_eq!(
        s.sh_ok(&id, "cat /sums").await,
        format!("{sha}  -\n{sha}  -\n")
    );
    assert_eq!(
        s.sh_ok(
            &id,
            "test -e /run/secrets/tok || test -e /root/tok2 || echo gone; echo \"[$TOK]\""
        )
        .await,
        "gone\n[]\n"
    );
    let (status, template) = s
        .request(Method::GET, &format!("/v1/templates/{name}"), None)
        .await;
    assert_eq!(status, 200, "{template}");
    assert!(!template.to_string().contains(value), "{template}");

    // Without the secret: a required one fails the build naming it; an optional one is
    // simply not there.
    let required = build(
        &s,
        &format!("{name}-req"),
        "FROM base\nRUN --mount=type=secret,id=npm_token,required cat /run/secrets/npm_token\n",
    )
    .await;
    assert_eq!(required["status"], "failed", "{required}");
    assert!(
        required["error"]
            .as_str()
            .unwrap_or("")
            .contains("\"npm_token\""),
        "{required}"
    );
    let optional = build(
        &s,
        &format!("{name}-opt"),
        "FROM base\nRUN --mount=type=secret,id=npm_token sh -c 'test ! -e /run/secrets/npm_token'\n",
    )
    .await;
    succeeded(&optional);

    // A malformed secret header is a 400 before anything is built.
    let resp = s
        .http
        .post(format!("{}/v1/templates?name={name}", s.url))
        .bearer_auth(&s.key)
        .header("content-type", "application/x-tar")
        .header("x-hutch-build-secret", "tok=not base64!")
        .body(context_of(&[("Dockerfile", dockerfile.as_bytes())]))
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status().as_u16(), 400);
    let v: Value = resp.json().await.expect("json");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("not base64"),
        "{v}"
    );
}

#[tokio::test]
async fn a_tenants_step_cache_is_never_another_tenants() {
    let s = TestServer::start().await;
    let pid = std::process::id();
    let acme = s.tenant_key("acme", "full").await;
    let globex = s.tenant_key("globex", "full").await;
    // What a step fetched (here: made up) is the building tenant's alone.
    let dockerfile = "FROM base\nRUN head -c 16 /dev/urandom | od -An -tx1 > /nonce\n";
    let nonce = |name: String| {
        let s = &s;
        async move {
            let id = s.create_id(json!({"template": name})).await;
            s.sh_ok(&id, "cat /nonce").await
        }
    };
    let a = s
        .build_dockerfile_as(&acme, &format!("cache-a-{pid}"), dockerfile)
        .await;
    succeeded(&a);
    let b = s
        .build_dockerfile_as(&globex, &format!("cache-b-{pid}"), dockerfile)
        .await;
    succeeded(&b);
    let log = log_of(&s, &format!("cache-b-{pid}"), &b).await;
    assert_eq!(
        log.matches("CACHED").count(),
        0,
        "another tenant's step is no hit: {log}"
    );
    assert_ne!(
        nonce(format!("cache-a-{pid}")).await,
        nonce(format!("cache-b-{pid}")).await
    );
    // Within a tenant the cache works as before.
    let again = s
        .build_dockerfile_as(&acme, &format!("cache-a2-{pid}"), dockerfile)
        .await;
    succeeded(&again);
    let log = log_of(&s, &format!("cache-a2-{pid}"), &again).await;
    assert_eq!(log.matches("CACHED").count(), 1, "{log}");
    assert_eq!(
        nonce(format!("cache-a-{pid}")).await,
        nonce(format!("cache-a2-{pid}")).await
    );
}

#[tokio::test]
async fn a_build_fits_its_sandboxes_to_a_disk_pool_smaller_than_its_setting() {
    // A 1 GiB ns disk pool (as on a small or nearly full disk, where the pool gets half the
    // free space), well under the build sandboxes' 8 GiB: builds still run.
    let s = TestServer::start_with(&["--ns-disk-pool-gib", "1"]).await;
    let name = format!("small-pool-{}", std::process::id());
    let built = build(&s, &name, "FROM minimal\nRUN echo ok > /ok\n").await;
    succeeded(&built);
    let id = s.create_id(json!({"template": name})).await;
    assert_eq!(s.sh_ok(&id, "cat /ok").await, "ok\n");
}
