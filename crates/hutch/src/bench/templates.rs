//! Template series: a Dockerfile build through the API cold (`no_cache`) and fully cached,
//! and create-to-ready of a template whose start command must pass its ready check, next to
//! create-to-first-exec of the plain template in the same run. Skipped when the server has
//! no build API.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use super::baselines::Skipped;
use super::server::BenchServer;
use super::stats::{summarize, Summary};

/// The template the series build.
pub(super) const NAME: &str = "bench-web";

/// Three RUN steps, a COPY, a start command with a ready check.
const DOCKERFILE: &str = "FROM minimal
RUN echo one > /one
RUN echo two > /two
COPY app.txt /srv/app.txt
RUN cat /srv/app.txt > /three
HEALTHCHECK --interval=1s --timeout=2s CMD wget -qO- http://127.0.0.1:8080/app.txt
CMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/srv\"]
";

/// The build context as a tar stream.
pub(super) fn context_tar() -> anyhow::Result<Vec<u8>> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("Dockerfile"), DOCKERFILE)?;
    std::fs::write(dir.path().join("app.txt"), "served\n")?;
    let mut writer = hutch_proto::archive::ArchiveWriter::open(dir.path())?;
    let mut out = Vec::new();
    while let Some(chunk) = writer.next_chunk(1 << 16)? {
        out.extend(chunk);
    }
    Ok(out)
}

/// Start a build and wait for it to end; its duration in ms (from the POST).
pub(super) async fn build(srv: &BenchServer, tar: &[u8], no_cache: bool) -> anyhow::Result<f64> {
    let (url, key, http) = srv.endpoint();
    let t0 = Instant::now();
    let r = http
        .post(format!(
            "{url}/v1/templates?name={NAME}&no_cache={no_cache}"
        ))
        .bearer_auth(key)
        .header("content-type", "application/x-tar")
        .body(tar.to_vec())
        .send()
        .await?;
    if !r.status().is_success() {
        bail!(
            "POST /v1/templates: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        );
    }
    let started: Value = r.json().await?;
    wait_build(srv, &started, t0).await
}

/// Wait for the build `started` (the answer to its POST) to succeed; ms since `t0`.
pub(super) async fn wait_build(
    srv: &BenchServer,
    started: &Value,
    t0: Instant,
) -> anyhow::Result<f64> {
    let (url, key, http) = srv.endpoint();
    let id = started["id"].as_str().context("no build id")?;
    let name = started["template"].as_str().context("no template")?;
    loop {
        let v: Value = http
            .get(format!("{url}/v1/templates/{name}/builds/{id}"))
            .bearer_auth(key)
            .send()
            .await?
            .json()
            .await?;
        match v["status"].as_str() {
            Some("succeeded") => return Ok(t0.elapsed().as_secs_f64() * 1000.0),
            Some("failed") | Some("cancelled") => bail!("build {id}: {}", v["error"]),
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
        if t0.elapsed() > Duration::from_secs(300) {
            bail!("build {id} did not end in 300 s");
        }
    }
}

/// Create a sandbox of `template` on `isolation` and run `true` in it (a start-command
/// template's create returns once its ready check passed); ms.
pub(super) async fn create_to_exec(
    srv: &BenchServer,
    template: &str,
    isolation: &str,
) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let v = srv
        .post(
            "/v1/sandboxes",
            serde_json::json!({"template": template, "isolation": isolation, "ttl_seconds": 600}),
        )
        .await?;
    let id = v["id"].as_str().context("no id")?.to_string();
    srv.exec_true(&id).await?;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    srv.kill(&id).await?;
    Ok(ms)
}

/// The series of this section that `name` is compared with (a cached build with the cold
/// one, a start-command create with the plain one; the image series of `images.rs` too).
pub fn baseline<'a>(name: &str, series: &'a [Summary]) -> Option<&'a Summary> {
    let base = match name {
        "template_build_cached" => "template_build_cold",
        "ns_create_to_first_exec_start_command" | "ns_first_create_new_template" => {
            "ns_create_to_first_exec_plain"
        }
        "vm_create_to_ready_start_command_warm_pool" | "vm_first_create_new_template" => {
            "vm_create_to_first_exec_plain_warm_pool"
        }
        "image_build_unpack_only" | "image_build_cached" => "image_build_cold",
        _ => return None,
    };
    series.iter().find(|s| s.name == base)
}

/// Run the series `n` times each.
pub async fn run(srv: &BenchServer, n: usize) -> (Vec<Summary>, Vec<Skipped>) {
    match measure(srv, n).await {
        Ok(series) => (series, Vec::new()),
        Err(e) => (
            Vec::new(),
            vec![Skipped {
                name: "template_build_cold".into(),
                reason: format!("{e:#}"),
            }],
        ),
    }
}

async fn measure(srv: &BenchServer, n: usize) -> anyhow::Result<Vec<Summary>> {
    let tar = context_tar()?;
    let mut cold = Vec::new();
    let mut first_create = Vec::new();
    for _ in 0..n {
        cold.push(build(srv, &tar, true).await?);
        // Each cold build makes a new revision: its first create.
        first_create.push(create_to_exec(srv, NAME, "ns").await?);
    }
    let mut cached = Vec::new();
    for _ in 0..n {
        cached.push(build(srv, &tar, false).await?);
    }
    let mut plain = Vec::new();
    let mut ready = Vec::new();
    for _ in 0..n {
        plain.push(create_to_exec(srv, srv.template(), "ns").await?);
        ready.push(create_to_exec(srv, NAME, "ns").await?);
    }
    let _ = srv.delete(&format!("/v1/templates/{NAME}")).await;
    Ok(vec![
        summarize("template_build_cold", "ms", &cold),
        summarize("template_build_cached", "ms", &cached),
        summarize("ns_first_create_new_template", "ms", &first_create),
        summarize("ns_create_to_first_exec_plain", "ms", &plain),
        summarize("ns_create_to_first_exec_start_command", "ms", &ready),
    ])
}
