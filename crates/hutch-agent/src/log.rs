//! Plain log lines on stderr (the jail points the agent's stderr at the sandbox log file).
//!
//! One line per event, `hutch-agent: <message>`; no levels, no timestamps (the reader of the
//! log file adds them). The agent logs what an operator needs to debug a sandbox: startup,
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
    let message = format!("hutch-agent: {args}\n");
    let _ = std::io::stderr().lock().write_all(message.as_bytes());
}
