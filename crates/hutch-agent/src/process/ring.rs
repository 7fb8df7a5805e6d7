//! The output of a process handle: a bounded ring per stream, read by any number of
//! attached readers, each at its own position.
//!
//! - **Bounded.** Each stream (stdout, stderr) keeps its newest [`RING_BYTES`] (at most
//!   [`MAX_SEGMENTS`] pieces); older bytes are dropped from the front. Byte positions are
//!   absolute offsets into the stream, so a reader knows exactly how much it missed.
//! - **In order.** Every piece carries a sequence number across both streams; a reader is
//!   handed the piece with the lowest number it has not read, so stdout and stderr arrive
//!   interleaved as they were written. Small writes to the same stream in a row are merged.
//! - **Back-pressure.** Appending waits while it would drop bytes that an attached reader
//!   holding the process back has not taken yet, so such a reader loses nothing, however
//!   much is written. Every attached reader holds the process back, except one let go: when
//!   several readers are attached, one that took nothing for [`STALLED_READER_GRACE`] while
//!   the process waited on it is let go (it no longer holds the process back, skips what the
//!   ring drops, and is told how much in a `Missed` frame; it holds again once it caught up).
//!   A sole reader is never let go: it stops the process like an exec's reader does.
//! - **Late readers.** A reader attached with replay starts at offset 0 and is first told how
//!   much the ring no longer holds; without replay it starts at the current end.
//!
//! Waiters (appenders and readers) sleep on one `watch` channel that is bumped whenever
//! something changes: output appended, a reader progressed or left, the process ended.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use hutch_proto::{ExecExit, MissedOutput};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::log::log;

/// Bytes kept per stream.
pub const RING_BYTES: usize = 1 << 20;
/// Pieces kept per stream (bounds the memory of many tiny writes).
pub const MAX_SEGMENTS: usize = 4096;
/// Pieces written in a row to one stream are merged up to this size.
const SEGMENT_MAX: usize = 64 << 10;
/// Most bytes handed to a reader at once (one output frame).
const TAKE_MAX: usize = 64 << 10;
/// How long a reader may take nothing while the process waits on it, when other readers
/// are attached, before it is let go.
pub const STALLED_READER_GRACE: Duration = Duration::from_secs(5);

/// One of the two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutStream {
    /// Standard output (or the terminal).
    Stdout = 0,
    /// Standard error.
    Stderr = 1,
}

const STREAMS: [OutStream; 2] = [OutStream::Stdout, OutStream::Stderr];

/// A run of bytes of one stream.
#[derive(Debug)]
struct Segment {
    /// Order across both streams.
    seq: u64,
    /// Stream offset of `data[0]`.
    offset: u64,
    data: Vec<u8>,
}

impl Segment {
    fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

#[derive(Debug, Default)]
struct Ring {
    segments: VecDeque<Segment>,
    /// Bytes held.
    kept: usize,
    /// Stream offset of the first byte held (= `end` when empty).
    start: u64,
    /// Bytes ever written.
    end: u64,
}

#[derive(Debug)]
struct ReaderState {
    /// Per stream: the offset of the next byte to hand out.
    read: [u64; 2],
    /// Since when the process has been waiting on this reader (reset when it takes).
    blocking_since: Option<Instant>,
    /// Let go for stalling: it does not hold the process back.
    released: bool,
}

#[derive(Debug)]
struct Log {
    rings: [Ring; 2],
    capacity: usize,
    next_seq: u64,
    readers: HashMap<u64, ReaderState>,
    next_reader: u64,
    /// Set once the process ended and all its output is in.
    exit: Option<ExecExit>,
}

/// What a reader gets next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// The ring dropped this much before what follows.
    Missed(MissedOutput),
    /// Output of a stream.
    Data(OutStream, Bytes),
    /// Nothing yet: wait for a change.
    Idle,
    /// Everything was read and the process ended so.
    End(ExecExit),
}

/// A process handle's output (see the module docs).
#[derive(Debug)]
pub struct ProcessOutput {
    log: Mutex<Log>,
    changed: watch::Sender<u64>,
}

impl ProcessOutput {
    /// An empty output keeping `capacity` bytes per stream (at least one piece's worth).
    pub fn new(capacity: usize) -> Self {
        Self {
            log: Mutex::new(Log {
                rings: Default::default(),
                capacity: capacity.max(SEGMENT_MAX),
                next_seq: 0,
                readers: HashMap::new(),
                next_reader: 0,
                exit: None,
            }),
            changed: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        // Every update leaves the log consistent before it can panic.
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Attach a reader: from offset 0 with `replay` (it is first told what the ring
    /// dropped), else from what is written next. It holds the process back until dropped.
    pub fn reader(self: &Arc<Self>, replay: bool) -> Reader {
        let id = {
            let mut log = self.lock();
            let id = log.next_reader;
            log.next_reader += 1;
            let read = if replay {
                [0, 0]
            } else {
                [log.rings[0].end, log.rings[1].end]
            };
            log.readers.insert(
                id,
                ReaderState {
                    read,
                    blocking_since: None,
                    released: false,
                },
            );
            id
        };
        Reader {
            output: Arc::clone(self),
            id,
            changes: self.changed.subscribe(),
        }
    }

    /// Append output, waiting while that would drop bytes a holding reader has not taken.
    pub async fn append(&self, stream: OutStream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let mut changes = self.changed.subscribe();
        loop {
            changes.borrow_and_update();
            let wait = {
                let mut log = self.lock();
                match log.room(stream, data.len(), Instant::now()) {
                    Room::Yes => {
                        log.push(stream, data);
                        None
                    }
                    Room::WaitFor(deadline) => Some(deadline),
                }
            };
            let Some(deadline) = wait else {
                self.bump();
                return;
            };
            match deadline {
                Some(at) => tokio::select! {
                    _ = changes.changed() => {}
                    () = tokio::time::sleep_until(at) => {}
                },
                None => {
                    let _ = changes.changed().await;
                }
            }
        }
    }

    /// The process ended so, and every byte it wrote is in.
    pub fn finish(&self, exit: ExecExit) {
        self.lock().exit = Some(exit);
        self.bump();
    }

    /// How the process ended, once [`ProcessOutput::finish`] was called.
    pub fn exit(&self) -> Option<ExecExit> {
        self.lock().exit.clone()
    }

    /// Bytes held by both rings.
    pub fn kept_bytes(&self) -> usize {
        let log = self.lock();
        log.rings[0].kept + log.rings[1].kept
    }
}

enum Room {
    Yes,
    /// Wait for a change, or until this instant (a stalled reader may be let go then).
    WaitFor(Option<Instant>),
}

impl Log {
    /// Whether `n` bytes of `stream` can be appended now without dropping what a holding
    /// reader has not taken; lets stalled readers go where that is allowed.
    fn room(&mut self, stream: OutStream, n: usize, now: Instant) -> Room {
        let k = stream as usize;
        let dropped_below = self.dropped_below(stream, n);
        let several = self.readers.len() > 1;
        let mut deadline: Option<Instant> = None;
        let mut blocked = false;
        for (id, reader) in &mut self.readers {
            if reader.released || reader.read[k] >= dropped_below {
                continue;
            }
            let let_go_at = *reader.blocking_since.get_or_insert(now) + STALLED_READER_GRACE;
            if several && now >= let_go_at {
                reader.released = true;
                log!("process output: reader {id} took nothing for {STALLED_READER_GRACE:?}; letting it go");
                continue;
            }
            blocked = true;
            if several {
                deadline = Some(deadline.map_or(let_go_at, |d| d.min(let_go_at)));
            }
        }
        if blocked {
            Room::WaitFor(deadline)
        } else {
            Room::Yes
        }
    }

    /// Whether an append to `stream` now extends its last piece instead of adding one.
    fn merges(&self, stream: OutStream, n: usize) -> bool {
        let last_seq = self.next_seq.checked_sub(1);
        self.rings[stream as usize]
            .segments
            .back()
            .is_some_and(|s| Some(s.seq) == last_seq && s.data.len() + n <= SEGMENT_MAX)
    }

    /// The stream offset below which bytes would be dropped if `n` were appended now.
    fn dropped_below(&self, stream: OutStream, n: usize) -> u64 {
        let ring = &self.rings[stream as usize];
        let mut kept = ring.kept + n;
        let mut segments = ring.segments.len() + usize::from(!self.merges(stream, n));
        let mut below = ring.start;
        for segment in &ring.segments {
            if kept <= self.capacity && segments <= MAX_SEGMENTS {
                break;
            }
            let over = kept.saturating_sub(self.capacity);
            if segments > MAX_SEGMENTS || over >= segment.data.len() {
                kept -= segment.data.len();
                segments -= 1;
                below = segment.end();
            } else {
                below = segment.offset + over as u64;
                break;
            }
        }
        below
    }

    fn push(&mut self, stream: OutStream, data: &[u8]) {
        let merges = self.merges(stream, data.len());
        let seq = self.next_seq;
        let ring = &mut self.rings[stream as usize];
        match ring.segments.back_mut() {
            Some(last) if merges => last.data.extend_from_slice(data),
            _ => {
                ring.segments.push_back(Segment {
                    seq,
                    offset: ring.end,
                    data: data.to_vec(),
                });
                self.next_seq += 1;
            }
        }
        ring.end += data.len() as u64;
        ring.kept += data.len();
        while ring.kept > self.capacity || ring.segments.len() > MAX_SEGMENTS {
            let too_many = ring.segments.len() > MAX_SEGMENTS;
            let Some(front) = ring.segments.front_mut() else {
                break;
            };
            let over = ring.kept.saturating_sub(self.capacity);
            if too_many || over >= front.data.len() {
                ring.kept -= front.data.len();
                ring.segments.pop_front();
            } else {
                front.data.drain(..over);
                front.offset += over as u64;
                ring.kept -= over;
            }
        }
        ring.start = ring.segments.front().map_or(ring.end, |s| s.offset);
    }

    fn take(&mut self, id: u64) -> Taken {
        let Some(reader) = self.readers.get_mut(&id) else {
            return Taken::Idle;
        };
        let mut missed = MissedOutput::default();
        for stream in STREAMS {
            let (k, start) = (stream as usize, self.rings[stream as usize].start);
            if reader.read[k] < start {
                let n = start - reader.read[k];
                match stream {
                    OutStream::Stdout => missed.stdout = n,
                    OutStream::Stderr => missed.stderr = n,
                }
                reader.read[k] = start;
            }
        }
        if missed != MissedOutput::default() {
            return Taken::Missed(missed);
        }
        let next = STREAMS
            .iter()
            .filter_map(|&stream| {
                let ring = &self.rings[stream as usize];
                let at = reader.read[stream as usize];
                let index = ring.segments.partition_point(|s| s.end() <= at);
                ring.segments
                    .get(index)
                    .map(|segment| (segment.seq, stream, index))
            })
            .min_by_key(|(seq, _, _)| *seq);
        let Some((_, stream, index)) = next else {
            // Caught up: a reader let go holds the process back again.
            reader.released = false;
            return match &self.exit {
                Some(exit) => Taken::End(exit.clone()),
                None => Taken::Idle,
            };
        };
        let segment = &self.rings[stream as usize].segments[index];
        let k = stream as usize;
        let from = (reader.read[k].max(segment.offset) - segment.offset) as usize;
        let to = segment.data.len().min(from + TAKE_MAX);
        reader.read[k] = segment.offset + to as u64;
        reader.blocking_since = None;
        Taken::Data(stream, Bytes::copy_from_slice(&segment.data[from..to]))
    }
}

/// One attached reader of a [`ProcessOutput`]; detaches when dropped.
#[derive(Debug)]
pub struct Reader {
    output: Arc<ProcessOutput>,
    id: u64,
    changes: watch::Receiver<u64>,
}

impl Reader {
    /// The next thing to hand on ([`Taken::Idle`]: call [`Reader::changed`] and ask again).
    pub fn take(&mut self) -> Taken {
        self.changes.borrow_and_update();
        let taken = self.output.lock().take(self.id);
        if matches!(taken, Taken::Data(..) | Taken::Missed(_)) {
            // The process may be waiting for this reader.
            self.output.bump();
        }
        taken
    }

    /// Wait until something changed since the last [`Reader::take`].
    pub async fn changed(&mut self) {
        // The sender lives as long as the output, which this reader holds.
        let _ = self.changes.changed().await;
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.output.lock().readers.remove(&self.id);
        self.output.bump();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: i32) -> ExecExit {
        ExecExit {
            exit_code: code,
            signal: None,
            timed_out: false,
            duration_ms: 1,
            oom_kills: None,
        }
    }

    /// Everything a reader gets until it would wait, as (stream, bytes) pieces.
    fn drain(reader: &mut Reader) -> (Vec<Taken>, Vec<u8>) {
        let mut events = Vec::new();
        let mut bytes = Vec::new();
        loop {
            match reader.take() {
                Taken::Idle => return (events, bytes),
                Taken::Data(s, b) => {
                    bytes.extend_from_slice(&b);
                    events.push(Taken::Data(s, b));
                }
                end @ Taken::End(_) => {
                    events.push(end);
                    return (events, bytes);
                }
                missed => events.push(missed),
            }
        }
    }

    #[tokio::test]
    async fn readers_get_both_streams_in_the_order_written() {
        let output = Arc::new(ProcessOutput::new(RING_BYTES));
        let mut reader = output.reader(true);
        output.append(OutStream::Stdout, b"a1").await;
        output.append(OutStream::Stdout, b"a2").await;
        output.append(OutStream::Stderr, b"b").await;
        output.append(OutStream::Stdout, b"c").await;
        output.finish(exit(3));
        let (events, _) = drain(&mut reader);
        assert_eq!(
            events,
            vec![
                Taken::Data(OutStream::Stdout, Bytes::from_static(b"a1a2")),
                Taken::Data(OutStream::Stderr, Bytes::from_static(b"b")),
                Taken::Data(OutStream::Stdout, Bytes::from_static(b"c")),
                Taken::End(exit(3)),
            ]
        );
        // A reader that comes after the end gets the same, then the exit at once.
        let mut late = output.reader(true);
        assert_eq!(drain(&mut late).0, events);
    }

    #[tokio::test]
    async fn a_late_reader_is_told_what_the_ring_dropped_and_gets_the_newest() {
        let capacity = 128 << 10;
        let output = Arc::new(ProcessOutput::new(capacity));
        let written: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        for chunk in written.chunks(10_000) {
            output.append(OutStream::Stdout, chunk).await;
        }
        output.append(OutStream::Stderr, b"tail").await;
        let mut reader = output.reader(true);
        let (events, bytes) = drain(&mut reader);
        let dropped = (written.len() - capacity) as u64;
        assert_eq!(
            events[0],
            Taken::Missed(MissedOutput {
                stdout: dropped,
                stderr: 0
            })
        );
        assert_eq!(&bytes[..capacity], &written[written.len() - capacity..]);
        assert_eq!(&bytes[capacity..], b"tail");
        // Without replay, a reader starts at the end.
        let mut fresh = output.reader(false);
        assert_eq!(fresh.take(), Taken::Idle);
        output.append(OutStream::Stdout, b"new").await;
        assert_eq!(
            fresh.take(),
            Taken::Data(OutStream::Stdout, Bytes::from_static(b"new"))
        );
    }

    #[tokio::test]
    async fn a_reading_reader_loses_nothing_however_much_is_written() {
        let output = Arc::new(ProcessOutput::new(64 << 10));
        let mut reader = output.reader(true);
        let total = 2 << 20;
        let writer = {
            let output = Arc::clone(&output);
            tokio::spawn(async move {
                let chunk: Vec<u8> = (0..4096u32).map(|i| (i % 256) as u8).collect();
                for _ in 0..total / chunk.len() {
                    output.append(OutStream::Stdout, &chunk).await;
                }
                output.finish(exit(0));
            })
        };
        let mut received = 0usize;
        loop {
            match reader.take() {
                Taken::Data(_, b) => {
                    assert_eq!(b[0], (received % 4096 % 256) as u8, "at {received}");
                    received += b.len();
                }
                Taken::Missed(m) => panic!("a holding reader missed {m:?}"),
                Taken::End(_) => break,
                Taken::Idle => reader.changed().await,
            }
        }
        assert_eq!(received, total);
        writer.await.expect("writer");
    }

    #[tokio::test(start_paused = true)]
    async fn of_several_readers_a_stalled_one_is_let_go_and_told_what_it_missed() {
        let output = Arc::new(ProcessOutput::new(64 << 10));
        let mut stalled = output.reader(true);
        let mut reading = output.reader(true);
        let writer = {
            let output = Arc::clone(&output);
            tokio::spawn(async move {
                for i in 0..64u8 {
                    output.append(OutStream::Stdout, &[i; 4096]).await;
                }
                output.finish(exit(0));
            })
        };
        let mut received = 0;
        loop {
            match reading.take() {
                Taken::Data(_, b) => received += b.len(),
                Taken::End(_) => break,
                Taken::Missed(m) => panic!("the reading reader missed {m:?}"),
                Taken::Idle => reading.changed().await,
            }
        }
        assert_eq!(received, 64 * 4096);
        writer.await.expect("writer");
        let (events, bytes) = drain(&mut stalled);
        assert!(
            matches!(events[0], Taken::Missed(MissedOutput { stdout, stderr: 0 }) if stdout > 0),
            "{:?}",
            &events[..1]
        );
        assert_eq!(bytes.len(), 64 << 10, "it gets what the ring still holds");
        assert_eq!(*bytes.last().expect("bytes"), 63);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sole_reader_that_stops_holds_the_process_back() {
        let output = Arc::new(ProcessOutput::new(64 << 10));
        let _stopped = output.reader(true);
        output.append(OutStream::Stdout, &[1; 60 << 10]).await;
        let blocked = tokio::time::timeout(
            STALLED_READER_GRACE * 3,
            output.append(OutStream::Stdout, &[2; 8 << 10]),
        )
        .await;
        assert!(blocked.is_err(), "the append went through a stopped reader");
        // Once it is gone, the ring just drops the oldest.
        drop(_stopped);
        output.append(OutStream::Stdout, &[2; 8 << 10]).await;
        assert_eq!(output.kept_bytes(), 64 << 10);
    }

    #[tokio::test]
    async fn many_tiny_writes_are_bounded_in_pieces() {
        let output = Arc::new(ProcessOutput::new(RING_BYTES));
        // Alternating streams: nothing merges, each stream gets MAX_SEGMENTS + 1 pieces.
        for i in 0..(MAX_SEGMENTS * 2 + 2) {
            let stream = if i % 2 == 0 {
                OutStream::Stdout
            } else {
                OutStream::Stderr
            };
            output.append(stream, b"x").await;
        }
        let log = output.lock();
        assert!(log.rings.iter().all(|r| r.segments.len() == MAX_SEGMENTS));
        // The oldest piece of each went.
        assert_eq!((log.rings[0].start, log.rings[1].start), (1, 1));
    }
}
