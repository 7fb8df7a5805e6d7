//! Percentiles and summaries of timing samples.

use serde::Serialize;

/// Summary of one measured series, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// What was measured.
    pub name: String,
    /// Number of samples.
    pub n: usize,
    /// Median.
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Mean.
    pub mean_ms: f64,
    /// Smallest.
    pub min_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarise samples given in milliseconds.
pub fn summarize(name: &str, samples_ms: &[f64]) -> Summary {
    let mut s = samples_ms.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Summary {
        name: name.to_string(),
        n,
        p50_ms: percentile(&s, 50.0),
        p95_ms: percentile(&s, 95.0),
        p99_ms: percentile(&s, 99.0),
        mean_ms: if n == 0 {
            f64::NAN
        } else {
            s.iter().sum::<f64>() / n as f64
        },
        min_ms: s.first().copied().unwrap_or(f64::NAN),
        max_ms: s.last().copied().unwrap_or(f64::NAN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = summarize("x", &samples);
        assert_eq!((s.p50_ms, s.p95_ms, s.p99_ms), (50.0, 95.0, 99.0));
        assert_eq!((s.min_ms, s.max_ms, s.mean_ms), (1.0, 100.0, 50.5));
        assert!(summarize("empty", &[]).p50_ms.is_nan());
    }
}
