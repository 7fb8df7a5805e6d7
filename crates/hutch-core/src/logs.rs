//! Sandbox logs: the files a backend keeps about a sandbox, read back as lines.
//!
//! A backend names its logs ([`crate::backend::Backend::log_files`]): `ns` keeps its agent's
//! log (`<state>/sandboxes/<id>/agent.log`, one line per event, each starting with the
//! agent's RFC 3339 time); `vm` keeps the guest's serial console in a bounded ring
//! (`<state>/vm-records/<id>/console.log{.old,}`, raw bytes the guest wrote, no times).
//!
//! Everything here reads files the host wrote and sandbox code influenced, so nothing trusts
//! their content: a read never takes more than [`MAX_READ_BYTES`] of a file's end, a line
//! is cut at [`MAX_LINE_BYTES`], and bytes that are not UTF-8 are replaced.
//!
//! [`Follower`] keeps reading as the files grow: it holds each file open, so a ring whose
//! newest half is renamed to `.old` is read to its end before the new half is opened, and
//! nothing written in between is lost.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// Most bytes of one log file's end a read looks at.
pub const MAX_READ_BYTES: u64 = 8 << 20;
/// Longest line returned; longer ones are cut into pieces of this size.
pub const MAX_LINE_BYTES: usize = 16 << 10;

/// Which log a line comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogSource {
    /// The sandbox's agent (its init): startup, failed spawns, internal errors.
    Agent,
    /// A `vm` guest's serial console (the kernel's messages, the guest agent's log).
    Console,
    /// The template's start command: every line it printed (stdout and stderr), which its
    /// agent writes to its log as `<time> start: <line>`.
    Start,
}

impl LogSource {
    /// The name used in the API (`?source=`).
    pub fn as_str(self) -> &'static str {
        match self {
            LogSource::Agent => "agent",
            LogSource::Console => "console",
            LogSource::Start => "start",
        }
    }

    /// Parse an API name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "agent" => Some(LogSource::Agent),
            "console" => Some(LogSource::Console),
            "start" => Some(LogSource::Start),
            _ => None,
        }
    }
}

/// One log of a sandbox as its backend keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFile {
    /// What it is.
    pub source: LogSource,
    /// Its files, oldest first (a ring's older half, then its newest).
    pub paths: Vec<PathBuf>,
    /// Whether each line starts with an RFC 3339 time (so `since` can pick lines).
    pub timestamped: bool,
    /// Which of the file's lines belong to this log.
    pub lines: LineFilter,
}

/// Which lines of a file make a log: the start command's lines share the agent's log (on
/// `vm`, the console), told apart by their prefix ([`hutch_proto::SERVICE_LOG_PREFIX`]
/// after the time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LineFilter {
    /// Every line.
    #[default]
    All,
    /// Only the start command's lines, without their prefix.
    Service,
    /// Every line but the start command's.
    NotService,
}

impl LineFilter {
    /// `line` as this log has it, or `None` when it is not one of its lines.
    fn apply(self, mut line: LogLine) -> Option<LogLine> {
        let prefix = hutch_proto::SERVICE_LOG_PREFIX;
        let is_service = line.text.starts_with(prefix);
        match self {
            LineFilter::All => Some(line),
            LineFilter::NotService => (!is_service).then_some(line),
            LineFilter::Service if is_service => {
                line.text.drain(..prefix.len());
                Some(line)
            }
            LineFilter::Service => None,
        }
    }
}

/// One line of a log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LogLine {
    /// Which log.
    pub source: LogSource,
    /// When it was written (ms since the epoch): the line's own time in a timestamped log
    /// (an unstamped line takes the time of the line before it), the time it was read for a
    /// followed log without times, `None` when unknown.
    #[serde(skip)]
    pub time_ms: Option<i64>,
    /// The line without its time and newline.
    pub text: String,
}

/// Which lines to return.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogQuery {
    /// Only these logs (`None`: every log the sandbox has).
    pub sources: Option<Vec<LogSource>>,
    /// Only the last `tail` lines.
    pub tail: Option<usize>,
    /// Only lines written at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
}

/// The time `text` names for `since`, given the time now: an RFC 3339 timestamp, Unix
/// seconds (`1764626400`, `1764626400.5`), or a duration before now (`90s`, `10m`, `2h`,
/// `1d`), as `docker logs --since` takes them.
pub fn parse_since(text: &str, now_ms: i64) -> Option<i64> {
    let text = text.trim();
    if let Some(ms) = hutch_proto::time::parse_rfc3339_millis(text) {
        return Some(ms);
    }
    if let Ok(seconds) = text.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then_some((seconds * 1000.0) as i64);
    }
    let unit_at = text.find(|c: char| !c.is_ascii_digit())?;
    let (count, unit) = text.split_at(unit_at);
    let count: i64 = count.parse().ok()?;
    let unit_ms: i64 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    Some(now_ms - count.checked_mul(unit_ms)?)
}

/// Split a stamped line into its time and the rest (`None` when it has no time).
fn split_time(line: &str) -> Option<(i64, &str)> {
    let (stamp, rest) = line.split_once(' ')?;
    Some((hutch_proto::time::parse_rfc3339_millis(stamp)?, rest))
}

/// Cut `text` into lines of at most [`MAX_LINE_BYTES`]: the complete lines and what is left
/// after the last newline.
fn cut_lines(bytes: &[u8]) -> (Vec<String>, &[u8]) {
    let mut lines = Vec::new();
    let mut rest = bytes;
    while let Some(end) = rest.iter().position(|&b| b == b'\n') {
        push_line(&mut lines, &rest[..end]);
        rest = &rest[end + 1..];
    }
    while rest.len() > MAX_LINE_BYTES {
        push_line(&mut lines, &rest[..MAX_LINE_BYTES]);
        rest = &rest[MAX_LINE_BYTES..];
    }
    (lines, rest)
}

fn push_line(lines: &mut Vec<String>, line: &[u8]) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    for piece in line.chunks(MAX_LINE_BYTES.max(1)) {
        lines.push(String::from_utf8_lossy(piece).into_owned());
    }
    if line.is_empty() {
        lines.push(String::new());
    }
}

/// Turn raw lines of `log` into [`LogLine`]s: times split off a timestamped log's lines
/// (`last` is the time an unstamped line inherits), `read_at` for lines of a log without.
fn to_lines(
    log: &LogFile,
    raw: Vec<String>,
    last: &mut Option<i64>,
    read_at: Option<i64>,
) -> Vec<LogLine> {
    raw.into_iter()
        .filter_map(|text| {
            let line = stamped_line(log, text, last, read_at);
            log.lines.apply(line)
        })
        .collect()
}

/// One raw line of `log` as a [`LogLine`] (see [`to_lines`]).
fn stamped_line(
    log: &LogFile,
    text: String,
    last: &mut Option<i64>,
    read_at: Option<i64>,
) -> LogLine {
    if !log.timestamped {
        return LogLine {
            source: log.source,
            time_ms: read_at,
            text,
        };
    }
    match split_time(&text) {
        Some((time, rest)) => {
            *last = Some(time);
            LogLine {
                source: log.source,
                time_ms: Some(time),
                text: rest.to_string(),
            }
        }
        None => LogLine {
            source: log.source,
            time_ms: *last,
            text,
        },
    }
}

/// The end of a file, at most [`MAX_READ_BYTES`]; a missing file is empty. When the read
/// starts inside the file, the first (partial) line is dropped.
fn read_end(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    match open_log(path, true)? {
        Some(open) => read_before(&open.file),
        None => Ok(Vec::new()),
    }
}

/// The logs `query` asks for, out of the sandbox's `logs`; an unknown source is named.
pub fn select<'a>(logs: &'a [LogFile], query: &LogQuery) -> Result<Vec<&'a LogFile>, LogSource> {
    match &query.sources {
        None => Ok(logs.iter().collect()),
        Some(wanted) => wanted
            .iter()
            .map(|s| logs.iter().find(|l| l.source == *s).ok_or(*s))
            .collect(),
    }
}

/// Read the lines `query` asks for from `logs` (already [`select`]ed). Lines of one log keep
/// their order; lines of several timestamped logs are merged by time.
pub fn read(logs: &[&LogFile], query: &LogQuery) -> std::io::Result<Vec<LogLine>> {
    let mut contents = Vec::new();
    for log in logs {
        let mut bytes = Vec::new();
        for path in &log.paths {
            bytes.extend(read_end(path)?);
        }
        contents.push(((*log).clone(), bytes));
    }
    Ok(backlog(contents, query))
}

/// The lines of each log's `bytes` that `query` asks for (see [`read`]).
fn backlog(contents: Vec<(LogFile, Vec<u8>)>, query: &LogQuery) -> Vec<LogLine> {
    let merge = contents.len() > 1 && contents.iter().all(|(l, _)| l.timestamped);
    let mut lines = Vec::new();
    for (log, bytes) in contents {
        let (mut raw, rest) = cut_lines(&bytes);
        if !rest.is_empty() {
            raw.push(String::from_utf8_lossy(rest).into_owned());
        }
        let mut last = None;
        lines.extend(to_lines(&log, raw, &mut last, None));
    }
    if merge {
        lines.sort_by_key(|l| l.time_ms.unwrap_or(i64::MIN));
    }
    if let Some(since) = query.since_ms {
        lines.retain(|l| l.time_ms.is_some_and(|t| t >= since));
    }
    if let Some(tail) = query.tail {
        let skip = lines.len().saturating_sub(tail);
        lines.drain(..skip);
    }
    lines
}

/// One followed file: the open file, its inode, how far it was read and the partial line.
struct Open {
    file: File,
    inode: (u64, u64),
    partial: Vec<u8>,
}

/// Follows logs as they grow (see the module documentation), from their end at the time it
/// was made.
pub struct Follower {
    logs: Vec<(LogFile, Option<Open>, Option<i64>)>,
}

/// The newest file of a log (the one that grows).
fn newest(log: &LogFile) -> Option<&PathBuf> {
    log.paths.last()
}

/// Open `path` to follow it, positioned at its end (`at_end`) or its start; `None` when it
/// does not exist (yet).
fn open_log(path: &std::path::Path, at_end: bool) -> std::io::Result<Option<Open>> {
    match File::open(path) {
        Ok(mut file) => {
            let meta = file.metadata()?;
            if at_end {
                file.seek(SeekFrom::End(0))?;
            }
            Ok(Some(Open {
                file,
                inode: (meta.dev(), meta.ino()),
                partial: Vec::new(),
            }))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The end of an open file before its position (at most [`MAX_READ_BYTES`]), without moving
/// it; a partial first line is dropped as in [`read_end`].
fn read_before(file: &File) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut position = file;
    let end = position.stream_position()?;
    let start = end.saturating_sub(MAX_READ_BYTES);
    let mut bytes = vec![0u8; (end - start) as usize];
    file.read_exact_at(&mut bytes, start)?;
    if start > 0 {
        let cut = bytes.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
        bytes.drain(..cut);
    }
    Ok(bytes)
}

/// Read what was appended to `open` since the last call (at most [`MAX_READ_BYTES`]).
fn read_new(open: &mut Open, out: &mut Vec<String>) -> std::io::Result<()> {
    let mut bytes = std::mem::take(&mut open.partial);
    (&open.file).take(MAX_READ_BYTES).read_to_end(&mut bytes)?;
    let (lines, rest) = cut_lines(&bytes);
    out.extend(lines);
    open.partial = rest.to_vec();
    Ok(())
}

impl Follower {
    /// Start following `logs` from their current end, and return with it the lines of what
    /// they held until then that `query` asks for: read through the same open file, so no
    /// line is both in the backlog and followed, and none is in neither.
    pub fn start(logs: Vec<LogFile>, query: &LogQuery) -> std::io::Result<(Self, Vec<LogLine>)> {
        let mut followed = Vec::new();
        let mut contents = Vec::new();
        for log in logs {
            let mut bytes = Vec::new();
            let (older, newest) = log.paths.split_at(log.paths.len().saturating_sub(1));
            for path in older {
                bytes.extend(read_end(path)?);
            }
            let open = match newest.first() {
                Some(path) => open_log(path, true)?,
                None => None,
            };
            if let Some(open) = &open {
                bytes.extend(read_before(&open.file)?);
            }
            contents.push((log.clone(), bytes));
            followed.push((log, open, None));
        }
        Ok((Self { logs: followed }, backlog(contents, query)))
    }

    /// The complete lines written since the last call (`now_ms`: the time given to lines of
    /// a log without times).
    pub fn poll(&mut self, now_ms: i64) -> std::io::Result<Vec<LogLine>> {
        let mut lines = Vec::new();
        for (log, open, last) in &mut self.logs {
            let Some(path) = newest(log).cloned() else {
                continue;
            };
            let mut raw = Vec::new();
            if let Some(current) = open.as_mut() {
                read_new(current, &mut raw)?;
            }
            // The path now names another file (a ring rotated, the log was re-created):
            // the old one was read to its end above; go on from the new one's start.
            let now_inode = std::fs::metadata(&path).ok().map(|m| (m.dev(), m.ino()));
            if now_inode.is_some() && now_inode != open.as_ref().map(|o| o.inode) {
                let partial = open.take().map(|o| o.partial).unwrap_or_default();
                if !partial.is_empty() {
                    raw.push(String::from_utf8_lossy(&partial).into_owned());
                }
                *open = open_log(&path, false)?;
                if let Some(current) = open.as_mut() {
                    read_new(current, &mut raw)?;
                }
            }
            lines.extend(to_lines(log, raw, last, Some(now_ms)));
        }
        Ok(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn append(path: &std::path::Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open");
        f.write_all(text.as_bytes()).expect("write");
    }

    fn agent_log(dir: &std::path::Path) -> LogFile {
        LogFile {
            source: LogSource::Agent,
            paths: vec![dir.join("agent.log")],
            timestamped: true,
            lines: LineFilter::All,
        }
    }

    #[test]
    fn stamped_lines_are_split_filtered_by_time_and_tailed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = agent_log(dir.path());
        append(
            &log.paths[0],
            "hutch-jail: a note before any time\n\
             1970-01-01T00:00:01.000Z hutch-agent: one\n\
             hutch-jail: a note after one\n\
             1970-01-01T00:00:02.000Z hutch-agent: two\n\
             1970-01-01T00:00:03.000Z hutch-agent: three",
        );
        let all = read(&[&log], &LogQuery::default()).expect("read");
        let texts: Vec<_> = all.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "hutch-jail: a note before any time",
                "hutch-agent: one",
                "hutch-jail: a note after one",
                "hutch-agent: two",
                "hutch-agent: three"
            ]
        );
        assert_eq!(all[0].time_ms, None);
        assert_eq!(
            all[2].time_ms,
            Some(1000),
            "an unstamped line takes the time before it"
        );
        let since = read(
            &[&log],
            &LogQuery {
                since_ms: Some(2000),
                ..Default::default()
            },
        )
        .expect("read");
        let texts: Vec<_> = since.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(texts, ["hutch-agent: two", "hutch-agent: three"]);
        let tail = read(
            &[&log],
            &LogQuery {
                tail: Some(2),
                since_ms: Some(1000),
                ..Default::default()
            },
        )
        .expect("read");
        assert_eq!(tail.len(), 2);
        assert_eq!(tail[0].text, "hutch-agent: two");
    }

    #[test]
    fn since_takes_times_epoch_seconds_and_durations() {
        let now = 10_000_000;
        assert_eq!(parse_since("1970-01-01T00:00:01Z", now), Some(1000));
        assert_eq!(parse_since("2.5", now), Some(2500));
        assert_eq!(parse_since("90s", now), Some(now - 90_000));
        assert_eq!(parse_since("2m", now), Some(now - 120_000));
        assert_eq!(parse_since("1h", now), Some(now - 3_600_000));
        for bad in ["", "soon", "5y", "-3", "m5", "1.5h", "NaN"] {
            assert_eq!(parse_since(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn long_lines_are_cut_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = LogFile {
            source: LogSource::Console,
            paths: vec![
                dir.path().join("console.log.old"),
                dir.path().join("console.log"),
            ],
            timestamped: false,
            lines: LineFilter::All,
        };
        append(&log.paths[1], &"x".repeat(MAX_LINE_BYTES * 2 + 5));
        let lines = read(&[&log], &LogQuery::default()).expect("read");
        let lens: Vec<_> = lines.iter().map(|l| l.text.len()).collect();
        assert_eq!(lens, [MAX_LINE_BYTES, MAX_LINE_BYTES, 5]);
    }

    #[test]
    fn a_follower_reads_appends_and_survives_a_ring_rotation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let newest = dir.path().join("console.log");
        let old = dir.path().join("console.log.old");
        let log = LogFile {
            source: LogSource::Console,
            paths: vec![old.clone(), newest.clone()],
            timestamped: false,
            lines: LineFilter::All,
        };
        append(&newest, "before following\n");
        let (mut follower, backlog) =
            Follower::start(vec![log], &LogQuery::default()).expect("follow");
        let backlog: Vec<_> = backlog.into_iter().map(|l| l.text).collect();
        assert_eq!(backlog, ["before following"]);
        assert!(
            follower.poll(1).expect("poll").is_empty(),
            "starts at the end"
        );
        append(&newest, "first\nsecond, not yet ended");
        let got: Vec<_> = follower
            .poll(2)
            .expect("poll")
            .into_iter()
            .map(|l| l.text)
            .collect();
        assert_eq!(got, ["first"]);
        // The ring rotates: the newest half becomes `.old` after one more write, and a new
        // newest half begins.
        append(&newest, " - now ended\nlast of the old half\n");
        std::fs::rename(&newest, &old).expect("rotate");
        append(&newest, "first of the new half\n");
        let got: Vec<_> = follower
            .poll(3)
            .expect("poll")
            .into_iter()
            .map(|l| l.text)
            .collect();
        assert_eq!(
            got,
            [
                "second, not yet ended - now ended",
                "last of the old half",
                "first of the new half"
            ]
        );
        assert!(follower.poll(4).expect("poll").is_empty());
    }
}
