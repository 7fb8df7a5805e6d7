//! Plain log lines on stderr (the jail points the agent's stderr at the sandbox log file).
//!
//! One line per event, `<RFC 3339 UTC time> hutch-agent: <message>`, no levels: the time
//! lets `GET /v1/sandboxes/{id}/logs?since=` pick lines (`docs/logs.md`). The agent logs what an operator needs to debug a sandbox: startup,
//! listener problems, failed spawns and internal errors, never per-request noise.

/// Write one log line to stderr. Never fails: a closed stderr loses the line.
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::log::line(format_args!($($arg)*))
    };
}
pub(crate) use log;

/// Write a formatted line (used by [`log!`]).
pub fn line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let time = hutch_proto::time::rfc3339_utc_millis(now);
    let message = format!("{time} hutch-agent: {args}\n");
    let _ = std::io::stderr().lock().write_all(message.as_bytes());
}

/// Write one line of the sandbox's start command (`<time> start: <line>`; see
/// `crate::service`).
pub fn service_line(text: &str) {
    use std::io::Write;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let time = hutch_proto::time::rfc3339_utc_millis(now);
    let message = format!("{time} {}{text}\n", hutch_proto::SERVICE_LOG_PREFIX);
    let _ = std::io::stderr().lock().write_all(message.as_bytes());
}
