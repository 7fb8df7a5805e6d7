//! Template series on `vm`: the first create of a newly built template (its bake: the
//! guest boots, its start command runs until the ready check passes, its memory is saved),
//! and create-to-ready of that start-command template from the warm pool next to
//! create-to-first-exec of the plain template from the warm pool (issue 17's target:
//! ≤ 1.2×, because the service is already running in the snapshot). Each pool is a server
//! of its own with `--vm-warm 1`, so the pool holds guests of one template only.

use std::path::Path;
use std::time::Duration;

use super::baselines::Skipped;
use super::server::BenchServer;
use super::stats::{summarize, Summary};
use super::templates::{build, context_tar, create_to_exec, NAME};

/// `n` creates of `template` from `srv`'s warm pool (after one that asks for its shape),
/// each once the pool holds a guest again.
async fn from_pool(srv: &BenchServer, template: &str, n: usize) -> anyhow::Result<Vec<f64>> {
    create_to_exec(srv, template, "vm").await?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        srv.wait_warm_guest(Duration::from_secs(300), template)
            .await?;
        out.push(create_to_exec(srv, template, "vm").await?);
    }
    Ok(out)
}

/// The series, `n` times each (skipped with the reason when a step fails).
pub async fn run(
    templates_dir: &Path,
    template: &str,
    vm_dir: &Path,
    n: usize,
) -> (Vec<Summary>, Vec<Skipped>) {
    match measure(templates_dir, template, vm_dir, n).await {
        Ok(series) => (series, Vec::new()),
        Err(e) => (
            Vec::new(),
            vec![Skipped {
                name: "vm_create_to_ready_start_command_warm_pool".into(),
                reason: format!("{e:#}"),
            }],
        ),
    }
}

async fn measure(
    templates_dir: &Path,
    template: &str,
    vm_dir: &Path,
    n: usize,
) -> anyhow::Result<Vec<Summary>> {
    let plain_srv = BenchServer::start(templates_dir, template, vm_dir, false, 1).await?;
    let plain = from_pool(&plain_srv, template, n).await;
    plain_srv.destroy_all().await;
    plain_srv.stop();
    let plain = plain?;

    let srv = BenchServer::start(templates_dir, template, vm_dir, false, 1).await?;
    let measured = async {
        // A new revision, so its first vm create makes its bake.
        build(&srv, &context_tar()?, true).await?;
        let first = create_to_exec(&srv, NAME, "vm").await?;
        let ready = from_pool(&srv, NAME, n).await?;
        anyhow::Ok((first, ready))
    }
    .await;
    srv.destroy_all().await;
    let _ = srv.delete(&format!("/v1/templates/{NAME}")).await;
    srv.stop();
    let (first, ready) = measured?;
    Ok(vec![
        summarize("vm_create_to_first_exec_plain_warm_pool", "ms", &plain),
        summarize("vm_create_to_ready_start_command_warm_pool", "ms", &ready),
        summarize("vm_first_create_new_template", "ms", &[first]),
    ])
}
