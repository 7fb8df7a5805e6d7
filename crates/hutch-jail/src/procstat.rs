//! Recognising a sandbox's init across server restarts: `/proc/PID/stat` state and start time.
//!
//! A pid alone can be reused by an unrelated process; the pair (pid, start time) cannot.

/// State and start time from one `/proc/PID/stat` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `X` (dead), …
    pub state: char,
    /// Field 22: start time after boot, in clock ticks.
    pub start_time: u64,
}

/// Parse a stat line. The command name (field 2) may contain spaces and parentheses, so
/// fields are counted after the **last** `)`.
pub(crate) fn parse(line: &str) -> Option<Stat> {
    let rest = &line[line.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // `rest` starts at field 3; field 22 is 19 further.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(Stat { state, start_time })
}

/// Read and parse `/proc/PID/stat`; `None` when the pid does not exist.
pub(crate) fn read(pid: libc::pid_t) -> Option<Stat> {
    if pid <= 0 {
        return None;
    }
    parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Whether `pid` is still the same process (same start time) and has not exited.
pub fn init_alive(pid: i32, start_time: u64) -> bool {
    matches!(read(pid), Some(s) if s.start_time == start_time && s.state != 'Z' && s.state != 'X')
}

/// The start time of `pid` (to recognise it later with [`init_alive`]).
pub fn start_time(pid: i32) -> Option<u64> {
    read(pid).map(|s| s.start_time)
}

/// Whether `pid` is the same process and is a zombie waiting to be reaped.
pub(crate) fn is_our_zombie(pid: i32, start_time: u64) -> bool {
    matches!(read(pid), Some(s) if s.start_time == start_time && s.state == 'Z')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tricky_command_names() {
        let line = "1234 (we ir) d) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200 18446744073709551615";
        assert_eq!(
            parse(line),
            Some(Stat {
                state: 'S',
                start_time: 987_654
            })
        );
        assert_eq!(parse("1 (x) Z 0"), None);
        assert_eq!(parse("garbage"), None);
    }

    #[test]
    fn reads_own_process() {
        // SAFETY: getpid cannot fail.
        let me = unsafe { libc::getpid() };
        let s = read(me).unwrap();
        assert!(init_alive(me, s.start_time));
        assert!(!init_alive(me, s.start_time + 1));
        assert!(!init_alive(-1, 0));
        assert!(!is_our_zombie(me, s.start_time));
    }
}
