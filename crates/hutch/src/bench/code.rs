//! Code interpreter series (`docs/code-interpreter.md`), on `code-interpreter` sandboxes of
//! `ns` and (with `hutch bench code`) `vm`: the first `run_code` after a create (the kernel
//! is up once the create returns: the template's start command starts it), warm
//! round trips of `1+1` (Python) and `echo 2` (Bash), a cell displaying a 1 MiB PNG, and an
//! exec of `python3 -c 1` in the same sandbox for comparison. Skipped when the template is
//! not built.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::baselines::Skipped;
use super::server::BenchServer;
use super::stats::{summarize, Summary};

/// The template the series need.
const TEMPLATE: &str = "code-interpreter";

/// A cell that makes `png`: an incompressible 600×600 RGB image, a 1 MiB PNG.
const MAKE_PNG: &str = "import io, numpy as np\nfrom PIL import Image as _I\n\
from IPython.display import Image, display\nbuf = io.BytesIO()\n\
_I.fromarray(np.random.default_rng(1).integers(0, 255, (600, 600, 3), dtype=np.uint8))\
.save(buf, format='PNG')\npng = buf.getvalue()\nlen(png)";

async fn create(srv: &BenchServer, isolation: &str) -> anyhow::Result<String> {
    let mut body = json!({"template": TEMPLATE, "isolation": isolation, "ttl_seconds": 600});
    if isolation == "vm" {
        // ipykernel and pandas want more than a vm's default 256 MiB.
        body["memory_mib"] = json!(1024);
    }
    let v = srv.post("/v1/sandboxes", body).await?;
    v["id"].as_str().map(String::from).context("no id")
}

/// Run a cell; fails on an error of the code.
async fn run(srv: &BenchServer, id: &str, body: Value) -> anyhow::Result<Value> {
    let v = srv.post(&format!("/v1/sandboxes/{id}/code"), body).await?;
    if !v["error"].is_null() {
        bail!("the cell failed: {}", v["error"]);
    }
    Ok(v)
}

/// Time `n` runs of `body` in `id`.
async fn timed(srv: &BenchServer, id: &str, n: usize, body: Value) -> anyhow::Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        run(srv, id, body.clone()).await?;
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(samples)
}

/// Every series on `isolation` (`ns` or `vm`, the series' name prefix): `first` fresh
/// sandboxes for the first call, `warm` round trips each.
pub async fn run_series(
    srv: &BenchServer,
    templates_dir: &Path,
    isolation: &str,
    first: usize,
    warm: usize,
) -> anyhow::Result<(Vec<Summary>, Vec<Skipped>)> {
    if warm == 0 && first == 0 {
        return Ok((vec![], vec![]));
    }
    if !templates_dir.join(TEMPLATE).join("template.json").exists() {
        let reason =
            format!("the {TEMPLATE} template is not built (hutch template build {TEMPLATE})");
        return Ok((
            vec![],
            vec![Skipped {
                name: format!("{isolation}_run_code_*"),
                reason,
            }],
        ));
    }
    let mut firsts = Vec::new();
    let mut to_first = Vec::new();
    for _ in 0..first {
        let t0 = Instant::now();
        let id = create(srv, isolation).await?;
        let t1 = Instant::now();
        run(srv, &id, json!({"code": "1+1"})).await?;
        firsts.push(t1.elapsed().as_secs_f64() * 1000.0);
        to_first.push(t0.elapsed().as_secs_f64() * 1000.0);
        srv.kill(&id).await?;
    }
    let id = create(srv, isolation).await?;
    run(srv, &id, json!({"code": "1+1"})).await?;
    run(srv, &id, json!({"code": "echo 2", "language": "bash"})).await?;
    let python = timed(srv, &id, warm, json!({"code": "1+1"})).await?;
    let bash = timed(
        srv,
        &id,
        warm,
        json!({"code": "echo 2", "language": "bash"}),
    )
    .await?;
    let made = run(srv, &id, json!({"code": MAKE_PNG})).await?;
    let png_bytes = made["results"][0]["data"]["text/plain"]
        .as_str()
        .unwrap_or("?")
        .to_string();
    let png = timed(
        srv,
        &id,
        (warm / 10).max(3),
        json!({"code": "display(Image(data=png))"}),
    )
    .await?;
    let mut exec = Vec::new();
    for _ in 0..(warm / 4).max(3) {
        let t = Instant::now();
        let v = srv
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                json!({"cmd": ["python3", "-c", "1"]}),
            )
            .await?;
        if v["exit_code"] != 0 {
            bail!("python3 -c 1 failed: {v}");
        }
        exec.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    srv.kill(&id).await?;
    eprintln!("code interpreter: the PNG cell displays {png_bytes} bytes");
    let mut series = Vec::new();
    let name = |series: &str| format!("{isolation}_{series}");
    if first > 0 {
        series.push(summarize(
            &name("run_code_first_after_create"),
            "ms",
            &firsts,
        ));
        series.push(summarize(
            &name("create_to_first_run_code"),
            "ms",
            &to_first,
        ));
    }
    series.extend([
        summarize(&name("run_code_warm_python"), "ms", &python),
        summarize(&name("run_code_warm_bash"), "ms", &bash),
        summarize(&name("run_code_png_1mib"), "ms", &png),
        summarize(&name("exec_python3_c_1"), "ms", &exec),
    ]);
    Ok((series, vec![]))
}

/// The first `run_code` after a `vm` create claimed from the warm pool (`warm`: a server
/// with `--vm-warm 1`): `n` creates, each once the pool holds a guest again; the guest
/// was restored from the template's bake with its kernel up, warmed and paused.
pub async fn warm_pool_series(
    warm: &BenchServer,
    templates_dir: &Path,
    n: usize,
) -> anyhow::Result<(Vec<Summary>, Vec<Skipped>)> {
    if n == 0 {
        return Ok((vec![], vec![]));
    }
    if !templates_dir.join(TEMPLATE).join("template.json").exists() {
        return Ok((
            vec![],
            vec![Skipped {
                name: "vm_run_code_first_after_create_warm_pool".into(),
                reason: format!("the {TEMPLATE} template is not built"),
            }],
        ));
    }
    // The first create asks for this template and shape; the pool fills after it.
    let primer = create(warm, "vm").await?;
    warm.kill(&primer).await?;
    let (mut firsts, mut to_first) = (Vec::new(), Vec::new());
    for _ in 0..n {
        warm.wait_warm_guest(std::time::Duration::from_secs(300), TEMPLATE)
            .await?;
        let t0 = Instant::now();
        let id = create(warm, "vm").await?;
        let t1 = Instant::now();
        run(warm, &id, json!({"code": "1+1"})).await?;
        firsts.push(t1.elapsed().as_secs_f64() * 1000.0);
        to_first.push(t0.elapsed().as_secs_f64() * 1000.0);
        warm.kill(&id).await?;
    }
    Ok((
        vec![
            summarize("vm_run_code_first_after_create_warm_pool", "ms", &firsts),
            summarize("vm_create_to_first_run_code_warm_pool", "ms", &to_first),
        ],
        vec![],
    ))
}
