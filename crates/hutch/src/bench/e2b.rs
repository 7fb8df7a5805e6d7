//! `hutch bench e2b`: create + first command and a warm `run_code` round trip through
//! E2B's published Python SDK (against `hutch serve --e2b-listen`) next to the same work
//! through Hutch's own Python SDK, in the same run (target: ≤ 1.3×). The SDKs run in a
//! Python given by `--python` (or `HUTCH_BENCH_PYTHON`) that has `e2b`,
//! `e2b-code-interpreter` and `hutch-sdk` (`pip install ./sdk/python`) installed; the
//! script is `bench/e2b_sdk.py`.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};
use serde_json::Value;

use super::server::BenchServer;
use super::stats::{summarize, Summary};

const SCRIPT: &str = include_str!("e2b_sdk.py");

/// The pairs reported: each E2B series and the Hutch series it is compared with.
pub const PAIRS: [(&str, &str); 2] = [
    (
        "e2b_sdk_create_first_command",
        "hutch_sdk_create_first_exec",
    ),
    ("e2b_sdk_run_code_1plus1", "hutch_sdk_run_code_1plus1"),
];

/// Run the script against `srv` and summarize its series.
pub fn run(
    srv: &BenchServer,
    python: &Path,
    templates_dir: &Path,
    creates: usize,
    code: usize,
) -> anyhow::Result<Vec<Summary>> {
    let e2b_url = srv
        .e2b_url()
        .context("the benchmark server has no E2B listener")?;
    let (url, key, _) = srv.endpoint();
    let code_template = if templates_dir.join("code-interpreter").is_dir() {
        "code-interpreter"
    } else {
        ""
    };
    let out = Command::new(python)
        .args(["-c", SCRIPT])
        .env("E2B_API_URL", e2b_url)
        .env("E2B_SANDBOX_URL", e2b_url)
        .env("E2B_API_KEY", key)
        .env("HUTCH_URL", url)
        .env("HUTCH_API_KEY", key)
        .env("BENCH_N", creates.to_string())
        .env("BENCH_CODE", code.to_string())
        .env("BENCH_CODE_TEMPLATE", code_template)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "the SDK script failed (does {} have e2b, e2b-code-interpreter and hutch-sdk?):\n{}",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let doc: Value = serde_json::from_slice(&out.stdout).context("the script's JSON")?;
    let mut series = Vec::new();
    for (a, b) in PAIRS {
        for name in [a, b] {
            let samples: Vec<f64> = doc["series"][name]
                .as_array()
                .map(|v| v.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default();
            if !samples.is_empty() {
                series.push(summarize(name, "ms", &samples));
            }
        }
    }
    Ok(series)
}

/// The Hutch series an E2B series is compared with.
pub fn baseline<'a>(name: &str, series: &'a [Summary]) -> Option<&'a Summary> {
    let (_, hutch) = PAIRS.iter().find(|(e2b, _)| *e2b == name)?;
    series.iter().find(|s| s.name == *hutch)
}
