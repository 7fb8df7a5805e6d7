//! `hutch bench` with its smallest settings: every baseline — the containers a user would
//! pick instead of Hutch included — is in the JSON report, measured or skipped with a
//! reason, next to Hutch's series from the same run; and the container baselines leave
//! nothing behind (their temporary directory, cgroups, the runtimes' default state
//! directories, podman's default storage).

use std::path::{Path, PathBuf};
use std::process::Command;

use hutch_testkit::{hutch_bin, templates_dir};

/// Every baseline the bench knows, and those reported as a ratio to Hutch's
/// create-to-first-exec.
const BASELINES: [&str; 7] = [
    "fork_exec_true",
    "unshare_all_true",
    "bwrap_unshare_all_true",
    "runsc_do_true",
    "crun_run_true",
    "runc_run_true",
    "podman_run_true",
];
const ALTERNATIVES: [&str; 5] = [
    "bwrap_unshare_all_true",
    "crun_run_true",
    "runc_run_true",
    "podman_run_true",
    "runsc_do_true",
];
/// Where podman and the OCI runtimes put things by default.
const HOST_DIRS: [&str; 5] = [
    "/var/lib/containers",
    "/run/containers",
    "/run/libpod",
    "/run/runc",
    "/run/crun",
];

/// What the container baselines could leave: their directories in /tmp and their cgroups.
fn leftovers() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut scan = |dir: &Path| {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with("hutch-bench-containers-")
            {
                found.push(e.path());
            }
        }
    };
    scan(Path::new("/tmp"));
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        scan(&hierarchy.path());
    }
    scan(Path::new("/sys/fs/cgroup"));
    found
}

#[test]
fn every_baseline_is_measured_or_skipped_with_a_reason_and_containers_leave_nothing() {
    let before = leftovers();
    let host_dirs_before: Vec<bool> = HOST_DIRS.iter().map(|d| Path::new(d).exists()).collect();
    let state = tempfile::Builder::new()
        .prefix("hutch-test-bench-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let json_out = state.path().join("bench.json");
    let out = Command::new(hutch_bin())
        .arg("bench")
        .arg("--state-dir")
        .arg(state.path().join("state"))
        .arg("--templates-dir")
        .arg(templates_dir())
        .args([
            "--n",
            "3",
            "--concurrent",
            "1",
            "--idle",
            "1",
            "--lifecycle",
            "1",
        ])
        .args(["--api-scale-records", "20", "--api-scale-samples", "3"])
        .args([
            "--execs",
            "3",
            "--vm",
            "0",
            "--code",
            "3",
            "--code-first",
            "1",
        ])
        .arg("--json-out")
        .arg(&json_out)
        .output()
        .expect("run hutch bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "hutch bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_out).expect("bench.json")).expect("json");

    // The server's own memory, descriptors and threads before and after the run.
    for when in ["before", "after"] {
        let p = &doc["server_process"][when];
        for field in ["rss_kib", "fds", "threads"] {
            assert!(
                p[field].as_u64().unwrap_or(0) > 0,
                "server_process.{when}.{field}: {p}"
            );
        }
    }
    let measured = doc["baselines"].as_array().expect("baselines");
    let skipped = doc["skipped"].as_array().expect("skipped");
    let ratios = &doc["alternatives_vs_ns_create_to_first_exec"];
    for name in BASELINES {
        let m = measured.iter().find(|b| b["name"] == name);
        let s = skipped.iter().find(|b| b["name"] == name);
        match (m, s) {
            (Some(b), None) => {
                assert_eq!(b["unit"], "ms", "{b}");
                assert_eq!(b["n"], 3, "{b}");
                let p50 = b["p50"].as_f64().expect("p50");
                assert!(p50 > 0.0, "{b}");
                if ALTERNATIVES.contains(&name) {
                    let r = ratios[name]
                        .as_f64()
                        .expect("a ratio for every alternative");
                    assert!(r > 0.0 && r.is_finite(), "{ratios}");
                }
            }
            (None, Some(s)) => {
                let reason = s["reason"].as_str().unwrap_or_default();
                assert!(reason.len() > 10, "{name} skipped without a reason: {s}");
                assert!(
                    stdout.contains(&format!("skipped {name}: {reason}")),
                    "{stdout}"
                );
                assert!(ratios.get(name).is_none(), "{ratios}");
            }
            _ => panic!("{name} is neither measured nor skipped once: {doc}"),
        }
    }
    let series = doc["series"].as_array().expect("series");
    assert!(series
        .iter()
        .any(|s| s["name"] == "ns_create_to_first_exec"));
    // Small GETs on kept-alive connections, next to /healthz, as many as the execs.
    let execs = series
        .iter()
        .find(|s| s["name"] == "ns_exec_round_trip_warm")
        .map(|s| s["n"].clone())
        .expect("warm execs");
    for name in [
        "api_healthz_keepalive",
        "api_get_sandbox_keepalive",
        "api_file_read_1k_keepalive",
    ] {
        let s = series.iter().find(|s| s["name"] == name);
        let s = s.unwrap_or_else(|| panic!("{name} missing: {doc}"));
        assert_eq!(s["n"], execs, "{s}");
        assert!(s["p99"].as_f64().is_some_and(|v| v > 0.0), "{s}");
    }
    // The code interpreter's series, measured when its template is built, else skipped.
    let code = series
        .iter()
        .find(|s| s["name"] == "ns_run_code_warm_python");
    match code {
        Some(s) => {
            assert_eq!(s["n"], 3, "{s}");
            for name in [
                "ns_run_code_first_after_create",
                "ns_run_code_png_1mib",
                "ns_exec_python3_c_1",
            ] {
                assert!(series.iter().any(|s| s["name"] == name), "{name}: {doc}");
            }
        }
        None => assert!(
            skipped.iter().any(|s| s["name"] == "ns_run_code_*"),
            "neither measured nor skipped: {doc}"
        ),
    }
    // Image templates from a registry on loopback: cold, unpack only, cached (the
    // registry and skopeo are installed with the tests, so they are measured, not skipped).
    for name in [
        "image_build_cold",
        "image_build_unpack_only",
        "image_build_cached",
    ] {
        let s = series.iter().find(|s| s["name"] == name);
        let s = s.unwrap_or_else(|| panic!("{name} missing: {stdout}"));
        assert_eq!(s["n"], 1, "{s}");
        assert!(s["p50"].as_f64().is_some_and(|v| v > 0.0), "{s}");
    }
    assert!(
        stdout.contains("x image_build_cold"),
        "the cached builds' ratio: {stdout}"
    );
    // api_scale: both record counts measured in the same run, with their ratio.
    let scale = &doc["api_scale"];
    assert_eq!(scale["records"], 20, "{scale}");
    for what in ["exec_round_trip", "get_sandbox"] {
        let r = scale["ratio_p50"][what].as_f64().expect("a ratio");
        assert!(r > 0.0 && r.is_finite(), "{scale}");
    }
    let names: Vec<&str> = scale["series"]
        .as_array()
        .expect("api_scale series")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert!(names.contains(&"api_scale_list_limit_100_20"), "{names:?}");

    assert_eq!(leftovers(), before, "the container baselines left these");
    for (dir, existed) in HOST_DIRS.iter().zip(host_dirs_before) {
        assert_eq!(Path::new(dir).exists(), existed, "{dir}");
    }
}

/// `hutch bench tenants` measures a tenant key (of 5,000 in the store) against the admin
/// key, and concurrent creates under quotas against none, and says the ratios.
#[test]
fn the_tenants_section_measures_tenant_keys_against_the_admin_key() {
    let state = tempfile::Builder::new()
        .prefix("hutch-test-bench-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let json_out = state.path().join("tenants.json");
    let out = Command::new(hutch_bin())
        .args(["bench", "tenants", "--state-dir"])
        .arg(state.path().join("state"))
        .arg("--templates-dir")
        .arg(templates_dir())
        .args([
            "--tenants-samples",
            "3",
            "--concurrent",
            "2",
            "--tenants-rounds",
            "1",
        ])
        .arg("--json-out")
        .arg(&json_out)
        .output()
        .expect("run hutch bench tenants");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "hutch bench tenants failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("tenants: exec with a tenant key (of 5000) / admin key"),
        "{stdout}"
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_out).expect("json written")).expect("json");
    let t = &doc["tenants"];
    assert_eq!(t["keys"], 5000, "{t}");
    let names: Vec<&str> = t["series"]
        .as_array()
        .expect("series")
        .iter()
        .filter(|s| s["n"].as_u64().unwrap_or(0) > 0)
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "tenants_exec_round_trip_tenant_key",
            "tenants_exec_round_trip_admin_key",
            "tenants_concurrent_2_creates_quota",
            "tenants_concurrent_2_creates_no_quota"
        ],
        "{t}"
    );
    for ratio in ["exec_ratio_p50", "concurrent_create_ratio_p50"] {
        let r = t[ratio].as_f64().unwrap_or(f64::NAN);
        assert!(r.is_finite() && r > 0.0, "{ratio}: {t}");
    }
}

/// `hutch bench cluster` runs a single-node server and two cluster nodes on a PostgreSQL of
/// the test's own, reports every path with its ratio, and drops its scratch database.
#[test]
fn the_cluster_section_measures_the_owner_and_the_hop_against_a_single_node() {
    let pg = hutch_testkit::PrivatePostgres::start();
    let state = tempfile::Builder::new()
        .prefix("hutch-test-bench-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let json_out = state.path().join("cluster.json");
    let out = Command::new(hutch_bin())
        .args(["bench", "cluster", "--state-dir"])
        .arg(state.path().join("state"))
        .arg("--templates-dir")
        .arg(templates_dir())
        .args(["--execs", "5", "--cluster-creates", "2", "--cluster-db"])
        .arg(pg.url("postgres"))
        .arg("--json-out")
        .arg(&json_out)
        .output()
        .expect("run hutch bench cluster");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "hutch bench cluster failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("cluster: exec on the owner node / single node"),
        "{stdout}"
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_out).expect("json written")).expect("json");
    let c = &doc["cluster"];
    let names: Vec<(&str, u64)> = c["series"]
        .as_array()
        .expect("series")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or(""),
                s["n"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("cluster_exec_single_node", 5),
            ("cluster_exec_owner_node", 5),
            ("cluster_exec_forwarded", 5),
            ("cluster_create_delete_single_node", 2),
            ("cluster_create_delete_placed_here", 2),
            ("cluster_create_delete_forwarded", 2)
        ],
        "{c}"
    );
    for ratio in [
        "exec_owner_vs_single_p50",
        "exec_forwarded_vs_owner_p50",
        "create_local_vs_single_p50",
        "create_forwarded_vs_local_p50",
    ] {
        let r = c[ratio].as_f64().unwrap_or(f64::NAN);
        assert!(r.is_finite() && r > 0.0, "{ratio}: {c}");
    }
    let left = pg.psql(
        "postgres",
        "SELECT count(*) FROM pg_database WHERE datname LIKE 'hutch_bench_%'",
    );
    assert_eq!(left, "0", "the scratch database was dropped");
}
