//! An incremental tar reader: bytes in, entries and their data out, in any chunking.
//!
//! It never blocks and holds at most one 512-byte block plus one long name or pax header, so
//! a caller can feed it from a network stream and apply the events elsewhere (a blocking
//! thread for the filesystem work).

use tar::{EntryType, Header};

use super::{ArchiveError, ArchiveResult, MAX_HEADER_DATA};

const BLOCK: usize = 512;

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory.
    Dir,
    /// A regular file; its bytes follow as [`TarEvent::Data`].
    File,
    /// A symlink with this target.
    Symlink(Vec<u8>),
    /// A hard link to this path of the archive.
    HardLink(Vec<u8>),
    /// Anything else (device, FIFO, sparse file, ...): the tar type byte.
    Other(u8),
}

/// One entry's header, with GNU and pax extensions applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryHeader {
    /// The path as the archive names it.
    pub path: Vec<u8>,
    /// What it is.
    pub kind: EntryKind,
    /// Permission bits (`0o7777` at most).
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: u64,
    /// Bytes of data that follow.
    pub size: u64,
    /// Numeric owner (0 when the header's is unreadable).
    pub uid: u32,
    /// Numeric group (0 when the header's is unreadable).
    pub gid: u32,
}

/// What the parser found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TarEvent {
    /// An entry starts.
    Entry(EntryHeader),
    /// Data of the current entry (files only).
    Data(Vec<u8>),
    /// The current entry is complete.
    EntryEnd,
    /// The end-of-archive marker.
    End,
}

/// Where an entry's data goes.
#[derive(Debug)]
enum Sink {
    /// Out as [`TarEvent::Data`], then [`TarEvent::EntryEnd`].
    Emit,
    /// Kept: the data of a GNU long name (`L`), long link (`K`) or pax header (`x`).
    Collect(u8, Vec<u8>),
    /// Dropped (a pax global header, data of a directory).
    Skip,
}

#[derive(Debug)]
enum State {
    /// Reading a header block (`buf` holds its first bytes).
    Header,
    /// Reading an entry's data, then its padding.
    Data {
        remaining: u64,
        padding: u64,
        sink: Sink,
    },
    /// After the end-of-archive marker: the rest is ignored.
    Ended,
}

/// Extensions read from `L`, `K` and `x` entries, for the next real entry.
#[derive(Debug, Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
}

/// The incremental parser.
#[derive(Debug)]
pub struct TarParser {
    state: State,
    buf: Vec<u8>,
    pending: Pending,
}

impl Default for TarParser {
    fn default() -> Self {
        Self {
            state: State::Header,
            buf: Vec::with_capacity(BLOCK),
            pending: Pending::default(),
        }
    }
}

fn malformed(why: impl Into<String>) -> ArchiveError {
    ArchiveError::Malformed(why.into())
}

/// The checksum a header block must carry (its checksum field counted as spaces).
fn checksum_of(block: &[u8]) -> u32 {
    block
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(*b)
            }
        })
        .sum()
}

fn trim_nuls(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

/// Records `"<len> <key>=<value>\n"` of a pax header.
fn pax_records(data: &[u8], pending: &mut Pending) -> ArchiveResult<()> {
    let mut rest = data;
    while !rest.is_empty() {
        let space = rest
            .iter()
            .position(|b| *b == b' ')
            .ok_or_else(|| malformed("a pax record without a length"))?;
        let len: usize = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|len| *len > space + 1 && *len <= rest.len())
            .ok_or_else(|| malformed("a pax record with a bad length"))?;
        let record = &rest[space + 1..len];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(eq) = record.iter().position(|b| *b == b'=') {
            let (key, value) = (&record[..eq], &record[eq + 1..]);
            match key {
                b"path" => pending.path = Some(value.to_vec()),
                b"linkpath" => pending.link = Some(value.to_vec()),
                b"size" => {
                    let size = std::str::from_utf8(value)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| malformed("a pax size that is not a number"))?;
                    pending.size = Some(size);
                }
                _ => {}
            }
        }
        rest = &rest[len..];
    }
    Ok(())
}

impl TarParser {
    /// A parser at the start of an archive.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed the next bytes of the stream; returns the events they complete.
    pub fn push(&mut self, mut input: &[u8]) -> ArchiveResult<Vec<TarEvent>> {
        let mut events = Vec::new();
        loop {
            match &mut self.state {
                State::Ended => return Ok(events),
                State::Header => {
                    let take = (BLOCK - self.buf.len()).min(input.len());
                    self.buf.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if self.buf.len() < BLOCK {
                        return Ok(events);
                    }
                    let block = std::mem::replace(&mut self.buf, Vec::with_capacity(BLOCK));
                    self.header(&block, &mut events)?;
                }
                State::Data {
                    remaining,
                    padding,
                    sink,
                } => {
                    if *remaining > 0 || *padding > 0 {
                        if input.is_empty() {
                            return Ok(events);
                        }
                        if *remaining > 0 {
                            let n = (*remaining).min(input.len() as u64) as usize;
                            match sink {
                                Sink::Emit => events.push(TarEvent::Data(input[..n].to_vec())),
                                Sink::Collect(_, data) => data.extend_from_slice(&input[..n]),
                                Sink::Skip => {}
                            }
                            *remaining -= n as u64;
                            input = &input[n..];
                        } else {
                            let n = (*padding).min(input.len() as u64) as usize;
                            *padding -= n as u64;
                            input = &input[n..];
                        }
                        continue;
                    }
                    let State::Data { sink, .. } =
                        std::mem::replace(&mut self.state, State::Header)
                    else {
                        unreachable!("matched State::Data above");
                    };
                    match sink {
                        Sink::Emit => events.push(TarEvent::EntryEnd),
                        Sink::Collect(b'L', data) => self.pending.path = Some(trim_nuls(data)),
                        Sink::Collect(b'K', data) => self.pending.link = Some(trim_nuls(data)),
                        Sink::Collect(_, data) => pax_records(&data, &mut self.pending)?,
                        Sink::Skip => {}
                    }
                }
            }
        }
    }

    /// The stream ended: fine at an entry boundary, an error inside an entry.
    pub fn finish(&self) -> ArchiveResult<()> {
        match &self.state {
            State::Ended => Ok(()),
            State::Header if self.buf.is_empty() => Ok(()),
            _ => Err(malformed("the stream ended inside an entry")),
        }
    }

    fn header(&mut self, block: &[u8], events: &mut Vec<TarEvent>) -> ArchiveResult<()> {
        if block.iter().all(|b| *b == 0) {
            self.state = State::Ended;
            events.push(TarEvent::End);
            return Ok(());
        }
        let header = Header::from_byte_slice(block);
        let stored = header
            .cksum()
            .map_err(|_| malformed("a header without a checksum"))?;
        if stored != checksum_of(block) {
            return Err(malformed("a header with a wrong checksum"));
        }
        let size = header
            .entry_size()
            .map_err(|_| malformed("a header with a bad size"))?;
        let entry_type = header.entry_type();
        let type_byte = entry_type.as_byte();
        if matches!(type_byte, b'L' | b'K' | b'x') {
            if size > MAX_HEADER_DATA {
                return Err(malformed(format!(
                    "a long name or pax header of {size} bytes (at most {MAX_HEADER_DATA})"
                )));
            }
            self.data(size, Sink::Collect(type_byte, Vec::new()));
            return Ok(());
        }
        if type_byte == b'g' {
            self.data(size, Sink::Skip);
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let path = pending
            .path
            .unwrap_or_else(|| header.path_bytes().into_owned());
        let link = || {
            pending
                .link
                .clone()
                .or_else(|| header.link_name_bytes().map(|l| l.into_owned()))
                .unwrap_or_default()
        };
        let size = pending.size.unwrap_or(size);
        let kind = match entry_type {
            EntryType::Regular | EntryType::Continuous => EntryKind::File,
            EntryType::Directory => EntryKind::Dir,
            EntryType::Symlink => EntryKind::Symlink(link()),
            EntryType::Link => EntryKind::HardLink(link()),
            other => EntryKind::Other(other.as_byte()),
        };
        let mode = header
            .mode()
            .map_err(|_| malformed("a header with a bad mode"))?
            & 0o7777;
        let mtime = header.mtime().unwrap_or(0);
        let owner =
            |id: std::io::Result<u64>| id.ok().and_then(|id| u32::try_from(id).ok()).unwrap_or(0);
        let (uid, gid) = (owner(header.uid()), owner(header.gid()));
        let sink = if kind == EntryKind::File {
            Sink::Emit
        } else {
            Sink::Skip
        };
        let emits = matches!(sink, Sink::Emit);
        events.push(TarEvent::Entry(EntryHeader {
            path,
            kind,
            mode,
            mtime,
            size,
            uid,
            gid,
        }));
        if !emits {
            events.push(TarEvent::EntryEnd);
        }
        self.data(size, sink);
        Ok(())
    }

    fn data(&mut self, size: u64, sink: Sink) {
        let padding = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
        self.state = State::Data {
            remaining: size,
            padding,
            sink,
        };
    }
}
