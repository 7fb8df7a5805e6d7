//! Percentiles and summaries of timing samples.

use serde::Serialize;

/// Summary of one measured series (values in `unit`).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// What was measured.
    pub name: String,
    /// Unit of every value (`ms`, `MiB`).
    pub unit: &'static str,
    /// Number of samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarise samples given in `unit`.
pub fn summarize(name: &str, unit: &'static str, samples: &[f64]) -> Summary {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Summary {
        name: name.to_string(),
        unit,
        n,
        p50: percentile(&s, 50.0),
        p90: percentile(&s, 90.0),
        p95: percentile(&s, 95.0),
        p99: percentile(&s, 99.0),
        mean: if n == 0 {
            f64::NAN
        } else {
            s.iter().sum::<f64>() / n as f64
        },
        min: s.first().copied().unwrap_or(f64::NAN),
        max: s.last().copied().unwrap_or(f64::NAN),
    }
}

/// One report line per series: name, samples, p50, p90, p99.
pub fn series_lines(series: &[Summary]) -> Vec<String> {
    series
        .iter()
        .map(|s| {
            format!(
                "{:<38} {:>5} {:>9.3} {:>9.3} (p90) {:>9.3} (p99)",
                s.name, s.n, s.p50, s.p90, s.p99
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = summarize("x", "ms", &samples);
        assert_eq!((s.p50, s.p95, s.p99), (50.0, 95.0, 99.0));
        assert_eq!((s.min, s.max, s.mean), (1.0, 100.0, 50.5));
        assert!(summarize("empty", "ms", &[]).p50.is_nan());
    }
}
