//! Wall-clock helpers for the manager (formatting lives in `hutch_proto::time`).

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Format milliseconds since the epoch as RFC 3339 UTC with millisecond precision.
pub fn rfc3339(ms: i64) -> String {
    hutch_proto::time::rfc3339_utc_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_796_014_800_000), "2026-11-30T05:00:00.000Z");
    }
}
