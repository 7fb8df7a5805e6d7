//! `hutch bench`: start a private server, measure Hutch, measure baselines in the same run,
//! and report every figure next to its baseline as a ratio (these machines are noisy).

mod api_scale;
mod baselines;
mod cluster;
mod cluster_handoff;
mod code;
mod containers;
mod density;
mod e2b;
mod exec_memory;
mod images;
mod lifecycle;
mod network;
mod server;
mod stats;
mod templates;
mod templates_vm;
mod tenants;
mod vm;
mod vm_lifecycle;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use serde_json::{json, Value};

use self::stats::{summarize, Summary};

/// A section of `hutch bench` that runs alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchSection {
    /// Request cost with 1 sandbox record versus `--api-scale-records` (`bench/api_scale.rs`).
    #[value(name = "api_scale")]
    ApiScale,
    /// The code interpreter's series (`bench/code.rs`).
    #[value(name = "code")]
    Code,
    /// Dockerfile builds cold and cached, create-to-ready with a start command
    /// (`bench/templates.rs`).
    #[value(name = "templates")]
    Templates,
    /// E2B's published Python SDK against the E2B-compatible API versus Hutch's own
    /// (`bench/e2b.rs`; needs `--python`).
    #[value(name = "e2b")]
    E2b,
    /// Per-request cost of tenant keys (5,000 of them) and quota accounting versus the admin
    /// key (`bench/tenants.rs`).
    #[value(name = "tenants")]
    Tenants,
    /// What cluster mode adds to an exec and a create: single node versus the owning node
    /// versus through another node (`bench/cluster.rs`; needs `--cluster-db`).
    #[value(name = "cluster")]
    Cluster,
}

/// Options of `hutch bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Run only this section (default: every series).
    #[arg(value_enum)]
    pub section: Option<BenchSection>,
    /// Sandbox records of the api_scale series (0 skips it in a full run).
    #[arg(long, default_value_t = 5000)]
    pub api_scale_records: usize,
    /// Warm execs per key of the tenants section.
    #[arg(long, default_value_t = 500)]
    pub tenants_samples: usize,
    /// A PostgreSQL server for the cluster section (`postgres://user@host/db`): a scratch
    /// database is made on it and dropped after.
    #[arg(long, env = "HUTCH_BENCH_CLUSTER_DB")]
    pub cluster_db: Option<String>,
    /// Create + delete rounds per path of the cluster section.
    #[arg(long, default_value_t = 20)]
    pub cluster_creates: usize,
    /// Rounds of `--concurrent` creates per caller in the tenants section.
    #[arg(long, default_value_t = 3)]
    pub tenants_rounds: usize,
    /// Requests per api_scale series.
    #[arg(long, default_value_t = 300)]
    pub api_scale_samples: usize,
    /// Sandboxes for the create-to-first-exec series.
    #[arg(long, default_value_t = 100)]
    pub n: usize,
    /// Sandboxes created at once in the concurrency series.
    #[arg(long, default_value_t = 50)]
    pub concurrent: usize,
    /// Idle sandboxes for the density series.
    #[arg(long, default_value_t = 100)]
    pub idle: usize,
    /// Repetitions of each lifecycle series (pause/resume, hibernate/wake, snapshot, fork, explore).
    #[arg(long, default_value_t = 20)]
    pub lifecycle: usize,
    /// Warm exec round trips.
    #[arg(long, default_value_t = 1000)]
    pub execs: usize,
    /// Warm run_code round trips of the code interpreter series (0 skips them; they need
    /// the `code-interpreter` template).
    #[arg(long, default_value_t = 200)]
    pub code: usize,
    /// Fresh `code-interpreter` sandboxes for the first-run_code series.
    #[arg(long, default_value_t = 5)]
    pub code_first: usize,
    /// Concurrent execs of 16 MiB output each for the server-memory series (0 skips it).
    #[arg(long, default_value_t = 50)]
    pub memory_execs: usize,
    /// Template to benchmark.
    #[arg(long, default_value = "minimal")]
    pub template: String,
    /// Templates directory (default `<state-dir>/templates`).
    #[arg(long)]
    pub templates_dir: Option<PathBuf>,
    /// vm sandboxes for the vm create-to-first-exec series (0 skips every vm series).
    #[arg(long, default_value_t = 50)]
    pub vm: usize,
    /// Idle vm sandboxes for the vm density series.
    #[arg(long, default_value_t = 20)]
    pub vm_idle: usize,
    /// Warm exec round trips on a vm sandbox.
    #[arg(long, default_value_t = 100)]
    pub vm_execs: usize,
    /// Repetitions of each vm lifecycle series (pause, resume, hibernate, wake, live fork of
    /// 1 and 8; 0 skips them).
    #[arg(long, default_value_t = 5)]
    pub vm_lifecycle: usize,
    /// Only the vm series.
    #[arg(long)]
    pub vm_only: bool,
    /// Cache of the vm backend (guest kernel, images, snapshots); default
    /// `<state-dir>/vm`, so repeated runs reuse the kernel and the template's snapshot.
    #[arg(long)]
    pub vm_dir: Option<PathBuf>,
    /// A Python with `e2b`, `e2b-code-interpreter` and `hutch-sdk` installed, for `hutch
    /// bench e2b`.
    #[arg(long, env = "HUTCH_BENCH_PYTHON", default_value = "python3")]
    pub python: PathBuf,
    /// Creates of each SDK in `hutch bench e2b`.
    #[arg(long, default_value_t = 20)]
    pub e2b_creates: usize,
    /// Write the results as JSON here.
    #[arg(long = "json-out", value_name = "PATH")]
    pub json_out: Option<PathBuf>,
}

/// The baselines a user would pick instead of Hutch, each reported as the ratio of its p50
/// to Hutch's `ns_create_to_first_exec` p50 from the same run.
const ALTERNATIVES: [&str; 5] = [
    "bwrap_unshare_all_true",
    "crun_run_true",
    "runc_run_true",
    "podman_run_true",
    "runsc_do_true",
];

fn machine_info() -> Value {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": cpu,
        "kernel": read("/proc/sys/kernel/osrelease"),
        "memory_mib": hutch_core::config::host_memory_mib(),
        "kvm": if std::path::Path::new("/sys/module/kvm_pvm").exists() { "PVM (software; vm uses TCG)" }
               else if std::path::Path::new("/dev/kvm").exists() { "present" } else { "absent" },
        "hutch_version": env!("CARGO_PKG_VERSION"),
        "date": hutch_core::time::rfc3339(hutch_core::time::now_ms()),
    })
}

fn row(s: &Summary, baseline: Option<&Summary>) -> String {
    let ratio = baseline
        .map(|b| format!("{:>7.2}x {}", s.p50 / b.p50, b.name))
        .unwrap_or_default();
    format!(
        "{:<38} {:>5} {:>9.2} {:>9.2} {:>9.2}   {}",
        s.name, s.n, s.p50, s.p95, s.p99, ratio
    )
}

/// Run the benchmark.
pub async fn bench(args: BenchArgs, state_dir_hint: PathBuf) -> anyhow::Result<()> {
    let templates_dir = args
        .templates_dir
        .clone()
        .unwrap_or_else(|| state_dir_hint.join("templates"));
    eprintln!(
        "starting a private server (templates in {})…",
        templates_dir.display()
    );
    let vm_dir = args
        .vm_dir
        .clone()
        .unwrap_or_else(|| state_dir_hint.join("vm"));
    std::fs::create_dir_all(&vm_dir)?;
    if args.section == Some(BenchSection::ApiScale) {
        return bench_api_scale(&args, &templates_dir, &vm_dir).await;
    }
    if args.section == Some(BenchSection::Templates) {
        return bench_templates(&args, &templates_dir, &vm_dir).await;
    }
    if args.section == Some(BenchSection::Code) {
        return bench_code(&args, &templates_dir, &vm_dir).await;
    }
    if args.section == Some(BenchSection::E2b) {
        return bench_e2b(&args, &templates_dir, &vm_dir).await;
    }
    if args.section == Some(BenchSection::Tenants) {
        return bench_tenants(&args, &templates_dir, &vm_dir).await;
    }
    if args.section == Some(BenchSection::Cluster) {
        return bench_cluster(&args, &templates_dir, &vm_dir).await;
    }
    let net = if args.vm_only {
        network::NetSeries {
            series: vec![],
            skipped: vec![],
        }
    } else {
        let (dir, tpl, vm, n) = (
            templates_dir.clone(),
            args.template.clone(),
            vm_dir.clone(),
            args.n.clamp(20, 100),
        );
        tokio::task::spawn_blocking(move || network::run(&dir, &tpl, &vm, n)).await?
    };
    let srv = server::BenchServer::start(&templates_dir, &args.template, &vm_dir, false, 0).await?;
    let server_before = srv.process_stats();
    let result = async {
        let mut doc = if args.vm_only {
            json!({"machine": machine_info()})
        } else {
            measure(&args, &srv, net, &templates_dir, &vm_dir).await?
        };
        if args.api_scale_records > 0 && !args.vm_only {
            let r = run_api_scale(&args, &srv, &templates_dir, &vm_dir).await?;
            doc["api_scale"] = serde_json::to_value(&r)?;
        }
        if args.vm > 0 {
            // A second server keeps one warm guest ready (`--vm-warm 1`).
            let warm =
                server::BenchServer::start(&templates_dir, &args.template, &vm_dir, false, 1)
                    .await?;
            let r = vm::run(&srv, &warm, &vm_dir, args.vm, args.vm_idle, args.vm_execs).await;
            warm.destroy_all().await;
            warm.stop();
            let r = r?;
            print_vm(&r);
            doc["vm"] = json!({"series": r.series, "figures": r.figures});
            if args.vm_lifecycle > 0 {
                eprintln!("vm: lifecycle ×{}…", args.vm_lifecycle);
                let l = vm_lifecycle::run(&srv, args.vm_lifecycle).await?;
                print_vm_lifecycle(&l);
                doc["vm_lifecycle"] = json!({"series": l.series, "siblings": l.siblings});
            }
        }
        // What the run left in the server: its memory, descriptors and threads before and
        // after (every sandbox deleted by then).
        let server_after = srv.process_stats();
        println!("server process before: {server_before}; after: {server_after}");
        doc["server_process"] = json!({"before": server_before, "after": server_after});
        write_json_out(&args, &doc)?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    if result.is_err() {
        srv.destroy_all().await;
    }
    srv.stop();
    result
}

async fn run_api_scale(
    args: &BenchArgs,
    srv: &server::BenchServer,
    templates_dir: &std::path::Path,
    vm_dir: &std::path::Path,
) -> anyhow::Result<api_scale::ApiScale> {
    eprintln!(
        "api_scale: 1 record versus {}, {} requests each…",
        args.api_scale_records, args.api_scale_samples
    );
    // The side holding many records is a server of its own, next to `srv`.
    let big = server::BenchServer::start(templates_dir, &args.template, vm_dir, false, 0).await?;
    let r = api_scale::run(srv, &big, args.api_scale_records, args.api_scale_samples).await;
    if r.is_err() {
        big.destroy_all().await;
    }
    big.stop();
    let r = r?;
    for line in r.lines() {
        println!("{line}");
    }
    Ok(r)
}

/// `hutch bench tenants`: only that section, on its own server.
async fn bench_tenants(
    args: &BenchArgs,
    templates_dir: &std::path::Path,
    vm_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let srv = server::BenchServer::start(templates_dir, &args.template, vm_dir, false, 0).await?;
    eprintln!(
        "tenants: 100 tenants × 50 keys; {} execs per key, {} rounds of {} concurrent creates…",
        args.tenants_samples, args.tenants_rounds, args.concurrent
    );
    let r = tenants::run(
        &srv,
        args.tenants_samples,
        args.concurrent,
        args.tenants_rounds,
    )
    .await;
    if r.is_err() {
        srv.destroy_all().await;
    }
    srv.stop();
    let r = r?;
    println!("{}", machine_info());
    for line in r.lines() {
        println!("{line}");
    }
    let doc = json!({"machine": machine_info(), "tenants": r});
    write_json_out(args, &doc)?;
    Ok(())
}

/// `hutch bench cluster`: single node, owner node and a forwarding node, in one run.
async fn bench_cluster(
    args: &BenchArgs,
    templates_dir: &std::path::Path,
    vm_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let Some(db) = &args.cluster_db else {
        anyhow::bail!(
            "hutch bench cluster needs a PostgreSQL server: --cluster-db postgres://user@host/db (or HUTCH_BENCH_CLUSTER_DB)"
        );
    };
    eprintln!(
        "cluster: {} execs and {} creates per path (single node, owner node, forwarded)…",
        args.execs, args.cluster_creates
    );
    let r = cluster::run(
        templates_dir,
        &args.template,
        vm_dir,
        db,
        args.execs,
        args.cluster_creates,
    )
    .await?;
    eprintln!(
        "cluster: {} rounds of a hibernated ns sandbox woken where it hibernated and on another node…",
        args.cluster_creates
    );
    let handoff = cluster_handoff::run(
        templates_dir,
        &args.template,
        vm_dir,
        db,
        args.cluster_creates,
    )
    .await?;
    println!("{}", machine_info());
    for line in r.lines().into_iter().chain(handoff.lines()) {
        println!("{line}");
    }
    let doc = json!({"machine": machine_info(), "cluster": r, "cluster_handoff": handoff});
    write_json_out(args, &doc)?;
    Ok(())
}

/// `hutch bench api_scale`: only that section, on its own server.
async fn bench_api_scale(
    args: &BenchArgs,
    templates_dir: &std::path::Path,
    vm_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let srv = server::BenchServer::start(templates_dir, &args.template, vm_dir, false, 0).await?;
    let r = run_api_scale(args, &srv, templates_dir, vm_dir).await;
    if r.is_err() {
        srv.destroy_all().await;
    }
    srv.stop();
    let doc = json!({"machine": machine_info(), "api_scale": r?});
    write_json_out(args, &doc)?;
    Ok(())
}

/// `hutch bench code`: only the code interpreter's series, on its own server.
async fn bench_code(
    args: &BenchArgs,
    templates_dir: &std::path::Path,
    vm_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let srv = server::BenchServer::start(templates_dir, &args.template, vm_dir, false, 0).await?;
    let mut r = code::run_series(&srv, templates_dir, "ns", args.code_first, args.code).await;
    if args.vm > 0 {
        if let Ok((series, skipped)) = &mut r {
            // Fewer on vm under TCG: each cell takes tenths of a second there.
            eprintln!("code interpreter on vm…");
            let (first, warm) = (args.code_first.min(3), args.code.min(30));
            match code::run_series(&srv, templates_dir, "vm", first, warm).await {
                Ok((vm_series, vm_skipped)) => {
                    series.extend(vm_series);
                    skipped.extend(vm_skipped);
                }
                Err(e) => skipped.push(baselines::Skipped {
                    name: "vm_run_code_*".into(),
                    reason: format!("{e:#}"),
                }),
            }
            // From the warm pool: a second server that keeps one guest ready.
            eprintln!("code interpreter on vm, from the warm pool…");
            let pool =
                server::BenchServer::start(templates_dir, &args.template, vm_dir, false, 1).await?;
            let pooled = code::warm_pool_series(&pool, templates_dir, first).await;
            pool.destroy_all().await;
            pool.stop();
            match pooled {
                Ok((pool_series, pool_skipped)) => {
                    series.extend(pool_series);
                    skipped.extend(pool_skipped);
                }
                Err(e) => skipped.push(baselines::Skipped {
                    name: "vm_run_code_first_after_create_warm_pool".into(),
                    reason: format!("{e:#}"),
                }),
            }
        }
    }
    if r.is_err() {
        srv.destroy_all().await;
    }
    srv.stop();
    let (series, skipped) = r?;
    println!("{}", machine_info());
    println!(
        "{:<38} {:>5} {:>9} {:>9} {:>9}",
        "series", "n", "p50 ms", "p95 ms", "p99 ms"
    );
    for s in &series {
        println!("{}", row(s, None));
    }
    for s in &skipped {
        println!("skipped {}: {}", s.name, s.reason);
    }
    let doc = json!({"machine": machine_info(), "series": series, "skipped": skipped});
    write_json_out(args, &doc)?;
    Ok(())
}

/// `hutch bench e2b`: only that section, on its own server.
async fn bench_e2b(
    args: &BenchArgs,
    templates_dir: &std::path::Path,
    vm_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let srv = server::BenchServer::start(templates_dir, &args.template, vm_dir, false, 0).await?;
    let r = e2b::run(
        &srv,
        &args.python,
        templates_dir,
        args.e2b_creates.max(1),
        args.code.min(1000),
    );
    srv.destroy_all().await;
    srv.stop();
    let series = r?;
    println!(
        "{:<38} {:>5} {:>9} {:>9} {:>9}",
        "series", "n", "p50 ms", "p95 ms", "p99 ms"
    );
    for s in &series {
        println!("{}", row(s, e2b::baseline(&s.name, &series)));
    }
    let doc = json!({"machine": machine_info(), "series": series});
    write_json_out(args, &doc)?;
    Ok(())
}

/// The template series on `vm` (with `--vm`), added to `series` and `skipped`.
async fn templates_vm_series(
    args: &BenchArgs,
    templates_dir: &std::path::Path,
    vm_dir: &std::path::Path,
    series: &mut Vec<Summary>,
    skipped: &mut Vec<baselines::Skipped>,
) {
    if args.vm == 0 {
        return;
    }
    let n = args.lifecycle.clamp(1, 5);
    eprintln!("templates on vm (bake, warm pool) ×{n}…");
    let (vm_series, vm_skipped) = templates_vm::run(templates_dir, &args.template, vm_dir, n).await;
    series.extend(vm_series);
    skipped.extend(vm_skipped);
}

/// `hutch bench templates`: only that section, on its own server.
async fn bench_templates(
    args: &BenchArgs,
    templates_dir: &std::path::Path,
    vm_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let srv = server::BenchServer::start(templates_dir, &args.template, vm_dir, false, 0).await?;
    let (mut series, mut skipped) = templates::run(&srv, args.lifecycle.clamp(1, 10)).await;
    srv.destroy_all().await;
    srv.stop();
    let (image_series, image_skipped) = images::run(
        templates_dir,
        &args.template,
        vm_dir,
        args.lifecycle.clamp(1, 10),
    )
    .await;
    series.extend(image_series);
    skipped.extend(image_skipped);
    templates_vm_series(args, templates_dir, vm_dir, &mut series, &mut skipped).await;
    for s in &series {
        println!("{}", row(s, templates::baseline(&s.name, &series)));
    }
    for s in &skipped {
        println!("skipped {}: {}", s.name, s.reason);
    }
    let doc = json!({"machine": machine_info(), "series": series, "skipped": skipped});
    write_json_out(args, &doc)?;
    Ok(())
}

/// Write `doc` to `--json-out`, if given.
fn write_json_out(args: &BenchArgs, doc: &Value) -> anyhow::Result<()> {
    if let Some(path) = &args.json_out {
        std::fs::write(path, serde_json::to_string_pretty(doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn print_vm_lifecycle(l: &vm_lifecycle::VmLifecycle) {
    println!(
        "{:<38} {:>5} {:>9} {:>9} {:>9}",
        "vm lifecycle series", "n", "p50 ms", "p95 ms", "p99 ms"
    );
    for s in &l.series {
        println!("{}", row(s, None));
    }
    let f = &l.siblings;
    println!(
        "{} live-fork siblings of a {} MiB guest: per child PSS {:.1} MiB, shared {:.1} MiB, private {:.1} MiB (medians)",
        f["children"],
        f["guest_memory_mib"],
        f["pss_mib_p50"].as_f64().unwrap_or(0.0),
        f["shared_mib_p50"].as_f64().unwrap_or(0.0),
        f["private_mib_p50"].as_f64().unwrap_or(0.0)
    );
}

fn print_vm(r: &vm::VmResults) {
    println!(
        "{:<38} {:>5} {:>9} {:>9} {:>9}",
        "vm series", "n", "p50 ms", "p95 ms", "p99 ms"
    );
    for s in &r.series {
        println!("{}", row(s, None));
    }
    let f = &r.figures;
    println!(
        "vm ({} MiB guests): first create {:.0} ms (bakes the snapshot when not cached); cold boot to agent {:.0} ms",
        f["guest_memory_mib"], f["first_create_ms"].as_f64().unwrap_or(0.0), f["cold_boot_ms"].as_f64().unwrap_or(0.0)
    );
    println!(
        "{} idle vm sandboxes: PSS per sandbox p50 {:.1} MiB, max {:.1} MiB; host memory growth {:.1} MiB",
        f["idle_sandboxes"],
        f["pss_mib_p50"].as_f64().unwrap_or(0.0),
        f["pss_mib_max"].as_f64().unwrap_or(0.0),
        f["host_growth_mib"].as_f64().unwrap_or(0.0)
    );
}

async fn measure(
    args: &BenchArgs,
    srv: &server::BenchServer,
    net: network::NetSeries,
    templates_dir: &std::path::Path,
    vm_dir: &std::path::Path,
) -> anyhow::Result<Value> {
    // Baselines first, while nothing else runs.
    eprintln!("baselines…");
    let n_base = args.n;
    let (mut base, mut skipped) =
        tokio::task::spawn_blocking(move || baselines::run(n_base)).await?;
    eprintln!("container baselines…");
    let rootfs = templates_dir.join(&args.template).join("rootfs");
    let (containers, containers_skipped) =
        tokio::task::spawn_blocking(move || containers::run(&rootfs, n_base)).await?;
    base.extend(containers);
    skipped.extend(containers_skipped);
    let find = |name: &str| base.iter().find(|b| b.name == name);

    eprintln!("create-to-first-exec ×{}…", args.n);
    let mut c2e = Vec::new();
    let mut create_only = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..args.n {
        let t0 = Instant::now();
        let id = srv.create().await?;
        let t1 = t0.elapsed();
        srv.exec_true(&id).await?;
        c2e.push(t0.elapsed().as_secs_f64() * 1000.0);
        create_only.push(t1.as_secs_f64() * 1000.0);
        ids.push(id);
    }
    let mut kill_ms = Vec::new();
    for id in ids.drain(..) {
        let t0 = Instant::now();
        srv.kill(&id).await?;
        kill_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
    }

    eprintln!("{} concurrent creates…", args.concurrent);
    let t0 = Instant::now();
    let futs = (0..args.concurrent).map(|_| async {
        let t = Instant::now();
        let id = srv.create().await?;
        srv.exec_true(&id).await?;
        Ok::<_, anyhow::Error>((id, t.elapsed().as_secs_f64() * 1000.0))
    });
    let results = futures_util::future::join_all(futs).await;
    let total_concurrent_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let mut conc = Vec::new();
    for r in results {
        let (id, ms) = r?;
        conc.push(ms);
        ids.push(id);
    }
    for id in ids.drain(..) {
        srv.kill(&id).await?;
    }

    eprintln!("warm exec round trips ×{}…", args.execs);
    let id = srv.create().await?;
    let mut rt = Vec::new();
    let t_seq = Instant::now();
    for _ in 0..args.execs {
        let t = Instant::now();
        srv.exec_true(&id).await?;
        rt.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let seq_total_s = t_seq.elapsed().as_secs_f64();
    // Small requests one after another on kept-alive connections: a 40 ms mode (Nagle's
    // algorithm against delayed ACKs) would show in their p99; `/healthz` (no auth, no
    // store) is the baseline.
    eprintln!("keep-alive GETs ×{}…", args.execs);
    srv.post(
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"cmd": "head -c 1024 /dev/zero > /tmp/k"}),
    )
    .await?;
    let (mut health, mut get_sandbox, mut read_file) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.execs {
        for (path, into) in [
            ("/healthz".to_string(), &mut health),
            (format!("/v1/sandboxes/{id}"), &mut get_sandbox),
            (
                format!("/v1/sandboxes/{id}/files?path=/tmp/k"),
                &mut read_file,
            ),
        ] {
            let t = Instant::now();
            srv.get_ok(&path).await?;
            into.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let stream_mb_s = srv.stream_throughput(&id, 64).await?;
    let (write_mb_s, read_mb_s) = srv.file_throughput(&id, 100).await?;
    srv.kill(&id).await?;

    let exec_memory = if args.memory_execs > 0 {
        eprintln!(
            "server memory: {} concurrent execs of 16 MiB…",
            args.memory_execs
        );
        Some(exec_memory::run(srv, args.memory_execs).await?)
    } else {
        None
    };

    eprintln!("density: {} idle sandboxes…", args.idle);
    let avail_before = density::mem_available_kib();
    for _ in 0..args.idle {
        let id = srv.create().await?;
        srv.exec_true(&id).await?;
        ids.push(id);
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let pss: Vec<f64> = ids
        .iter()
        .map(|id| density::sandbox_pss_kib(id) as f64 / 1024.0)
        .collect();
    let growth_mib = avail_before.saturating_sub(density::mem_available_kib()) as f64 / 1024.0;
    for id in ids.drain(..) {
        srv.kill(&id).await?;
    }
    let pss_summary = summarize("ns_idle_pss", "MiB", &pss);

    eprintln!("lifecycle ×{}…", args.lifecycle);
    let (life, life_skipped) = lifecycle::run(srv, args.lifecycle).await?;
    eprintln!("templates ×{}…", args.lifecycle.clamp(1, 10));
    let (mut tmpl, mut tmpl_skipped) = templates::run(srv, args.lifecycle.clamp(1, 10)).await;
    eprintln!("image templates ×{}…", args.lifecycle.clamp(1, 10));
    let (image_series, image_skipped) = images::run(
        templates_dir,
        &args.template,
        vm_dir,
        args.lifecycle.clamp(1, 10),
    )
    .await;
    tmpl.extend(image_series);
    tmpl_skipped.extend(image_skipped);
    templates_vm_series(args, templates_dir, vm_dir, &mut tmpl, &mut tmpl_skipped).await;

    eprintln!("code interpreter ×{}…", args.code);
    let (code_series, code_skipped) =
        code::run_series(srv, templates_dir, "ns", args.code_first, args.code).await?;

    let mut series = vec![
        summarize("ns_create_to_first_exec", "ms", &c2e),
        summarize("ns_create", "ms", &create_only),
        summarize("ns_kill", "ms", &kill_ms),
        summarize("ns_concurrent_create_to_first_exec", "ms", &conc),
        summarize("ns_exec_round_trip_warm", "ms", &rt),
        summarize("api_healthz_keepalive", "ms", &health),
        summarize("api_get_sandbox_keepalive", "ms", &get_sandbox),
        summarize("api_file_read_1k_keepalive", "ms", &read_file),
    ];
    series.extend(life);
    series.extend(tmpl);
    series.extend(code_series);
    series.extend(net.series);
    skipped.extend(life_skipped);
    skipped.extend(tmpl_skipped);
    skipped.extend(code_skipped);
    skipped.extend(net.skipped);
    let net_off = series
        .iter()
        .find(|s| s.name == "ns_create_to_first_exec_net_off")
        .cloned();
    let exec_python = series
        .iter()
        .find(|s| s.name == "ns_exec_python3_c_1")
        .cloned();
    let healthz = series
        .iter()
        .find(|s| s.name == "api_healthz_keepalive")
        .cloned();
    let bwrap = find("bwrap_unshare_all_true");
    let forkexec = find("fork_exec_true");
    println!("{}", machine_info());
    println!(
        "{:<38} {:>5} {:>9} {:>9} {:>9}   ratio (p50) vs baseline",
        "series", "n", "p50 ms", "p95 ms", "p99 ms"
    );
    for b in &base {
        println!("{}", row(b, None));
    }
    for s in &series {
        let baseline = match s.name.as_str() {
            "ns_exec_round_trip_warm" => forkexec,
            "ns_run_code_warm_python" | "ns_run_code_warm_bash" => exec_python.as_ref(),
            "ns_create_to_first_exec"
            | "ns_create"
            | "ns_kill"
            | "ns_concurrent_create_to_first_exec" => bwrap.or(forkexec),
            "ns_create_to_first_exec_net_on" => net_off.as_ref(),
            "api_get_sandbox_keepalive" | "api_file_read_1k_keepalive" => healthz.as_ref(),
            // Template series compare with one of their own; lifecycle operations have no
            // counterpart among the baselines.
            other => templates::baseline(other, &series),
        };
        println!("{}", row(s, baseline));
    }
    println!(
        "{} concurrent creates: all ready (first exec done) in {:.1} ms",
        args.concurrent, total_concurrent_ms
    );
    println!(
        "{} sequential execs: {:.0} execs/s; stdout stream {:.1} MB/s; file write {:.1} MB/s, read {:.1} MB/s",
        args.execs,
        args.execs as f64 / seq_total_s,
        stream_mb_s,
        write_mb_s,
        read_mb_s
    );
    println!(
        "{} idle sandboxes: PSS per sandbox p50 {:.2} MiB, max {:.2} MiB; host memory growth {:.1} MiB ({:.2} MiB per sandbox)",
        args.idle,
        pss_summary.p50,
        pss_summary.max,
        growth_mib,
        growth_mib / args.idle.max(1) as f64
    );
    if let Some(m) = &exec_memory {
        println!("{}", m.line());
    }
    let c2e_p50 = series
        .iter()
        .find(|s| s.name == "ns_create_to_first_exec")
        .map_or(f64::NAN, |s| s.p50);
    let ratios: serde_json::Map<String, Value> = base
        .iter()
        .filter(|b| ALTERNATIVES.contains(&b.name.as_str()))
        .map(|b| (b.name.clone(), json!(b.p50 / c2e_p50)))
        .collect();
    if !ratios.is_empty() {
        let listed: Vec<String> = ratios
            .iter()
            .map(|(name, r)| format!("{name} {:.2}x", r.as_f64().unwrap_or(f64::NAN)))
            .collect();
        println!(
            "the alternatives against ns_create_to_first_exec ({c2e_p50:.2} ms p50): {}",
            listed.join(", ")
        );
    }
    for s in &skipped {
        println!("skipped {}: {}", s.name, s.reason);
    }
    {
        let doc = json!({
            "machine": machine_info(),
            "baselines": base,
            "skipped": skipped,
            "alternatives_vs_ns_create_to_first_exec": ratios,
            "series": series,
            "concurrent": {"count": args.concurrent, "all_ready_ms": total_concurrent_ms},
            "density": {
                "idle_sandboxes": args.idle,
                "pss_mib_p50": pss_summary.p50,
                "pss_mib_max": pss_summary.max,
                "host_growth_mib": growth_mib,
            },
            "exec_memory": exec_memory,
            "throughput": {
                "sequential_execs_per_s": args.execs as f64 / seq_total_s,
                "stream_stdout_mb_s": stream_mb_s,
                "file_write_mb_s": write_mb_s,
                "file_read_mb_s": read_mb_s,
            },
        });
        Ok(doc)
    }
}
