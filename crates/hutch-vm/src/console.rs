//! A guest's serial console, kept by the host in a bounded ring.
//!
//! Whatever the guest writes to its console (`/dev/ttyS0`, the kernel's messages) crosses
//! into the host, so the host decides how much of it is kept: QEMU's serial port is a
//! chardev **socket** in QEMU's own directory (`console.sock`), and the host connects to it
//! and drains it ([`spawn_drain`]) into a [`ConsoleRing`] of at most a fixed number of
//! bytes, in a directory of the host's own that QEMU cannot see. Readers take only the
//! ring's tail ([`ConsoleRing::tail`]).
//!
//! QEMU never waits for the host: with no host connected (before the drain connects, while
//! the server restarts) its socket chardev drops what the guest writes, and a connected
//! host reads as fast as the guest can write (the ring's writes go to the page cache).
//! A restarted server connects again ([`spawn_drain`] on re-adoption).
//!
//! On disk the ring is two files: `<name>` (the newest bytes, at most half the cap) and
//! `<name>.old` (the half before). When `<name>` would grow past half the cap it replaces
//! `<name>.old` and a new `<name>` begins, so both together never exceed the cap and always
//! hold at least the last half of it.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// The smallest cap a ring accepts (two halves of 2 KiB).
pub const MIN_CAP_BYTES: u64 = 4096;
/// The cap when none is configured.
pub const DEFAULT_CAP_BYTES: u64 = 1 << 20;
/// How long the drain retries connecting to a socket QEMU has not created yet.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How much the drain reads at once.
const READ_CHUNK: usize = 64 << 10;

/// A guest console's bounded log on the host: the file `path` and its older half
/// `path.old`, together at most `cap_bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleRing {
    /// The newest half.
    pub path: PathBuf,
    /// Most bytes kept, both halves together (at least [`MIN_CAP_BYTES`]).
    pub cap_bytes: u64,
}

impl ConsoleRing {
    /// A ring at `path` keeping at most `cap_bytes` (raised to [`MIN_CAP_BYTES`]).
    pub fn new(path: PathBuf, cap_bytes: u64) -> Self {
        Self {
            path,
            cap_bytes: cap_bytes.max(MIN_CAP_BYTES),
        }
    }

    /// The older half.
    pub fn old_path(&self) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(".old");
        PathBuf::from(name)
    }

    fn half(&self) -> u64 {
        self.cap_bytes / 2
    }

    /// Bytes both halves hold now.
    pub fn len(&self) -> u64 {
        let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        size(&self.path) + size(&self.old_path())
    }

    /// Whether nothing was kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Append `bytes`, rotating halves so the ring never holds more than its cap. Of a
    /// write larger than the cap only its last cap bytes are written (the rest could not
    /// survive anyway).
    pub fn append(&self, bytes: &[u8]) -> std::io::Result<()> {
        let half = self.half();
        let cap = usize::try_from(self.cap_bytes).unwrap_or(usize::MAX);
        let mut bytes = &bytes[bytes.len().saturating_sub(cap)..];
        while !bytes.is_empty() {
            let current = std::fs::metadata(&self.path).map_or(0, |m| m.len());
            let room = half.saturating_sub(current);
            if room == 0 {
                std::fs::rename(&self.path, self.old_path())?;
                continue;
            }
            let take = bytes.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?
                .write_all(&bytes[..take])?;
            bytes = &bytes[take..];
        }
        Ok(())
    }

    /// The last `max_bytes` the guest wrote (fewer if the ring holds fewer), as text; only
    /// those bytes are read.
    pub fn tail(&self, max_bytes: u64) -> String {
        let mut out = Vec::new();
        let current = tail_of(&self.path, max_bytes);
        let wanted_old = max_bytes.saturating_sub(current.len() as u64);
        if wanted_old > 0 {
            out.extend(tail_of(&self.old_path(), wanted_old));
        }
        out.extend(current);
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// The last `max_bytes` of the file at `path` (nothing if it cannot be read).
pub(crate) fn tail_of(path: &Path, max_bytes: u64) -> Vec<u8> {
    let Ok(mut file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let start = len.saturating_sub(max_bytes);
    let mut out = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_ok() {
        let _ = file.take(max_bytes).read_to_end(&mut out);
    }
    out
}

/// Drain the console socket `socket` of a running QEMU into `ring` until QEMU closes it
/// (it exited), on a task of its own. Connecting is retried while the socket does not exist
/// yet; a failure to keep the log is logged and ends the drain (QEMU then drops the
/// console's output, it never waits for the host).
pub fn spawn_drain(socket: PathBuf, ring: ConsoleRing) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        match drain(&socket, &ring).await {
            Ok(()) => {}
            // The sandbox was removed with its ring while the last bytes were read.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!(socket = %socket.display(), error = %e, "the guest console's ring is gone")
            }
            Err(e) => {
                tracing::warn!(socket = %socket.display(), error = %e, "the guest console's drain stopped")
            }
        }
    })
}

async fn drain(socket: &Path, ring: &ConsoleRing) -> std::io::Result<()> {
    let started = std::time::Instant::now();
    let mut stream = loop {
        match tokio::net::UnixStream::connect(socket).await {
            Ok(stream) => break stream,
            Err(e) if started.elapsed() > CONNECT_TIMEOUT => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        ring.append(&buf[..n])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_at_most_its_cap_and_the_newest_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ring = ConsoleRing::new(dir.path().join("console.log"), 8192);
        assert!(ring.is_empty());
        let mut written = Vec::new();
        for i in 0..5000 {
            let line = format!("line {i:05}\n");
            ring.append(line.as_bytes()).expect("append");
            written.extend_from_slice(line.as_bytes());
            assert!(ring.len() <= 8192, "{} after line {i}", ring.len());
        }
        assert!(ring.len() >= 4096, "at least half the cap is kept");
        let tail = ring.tail(1000);
        assert_eq!(tail.len(), 1000);
        assert!(String::from_utf8_lossy(&written).ends_with(&tail));
        assert!(tail.ends_with("line 04999\n"), "{tail}");
        // The whole ring, across both halves, is the end of what was written.
        let all = ring.tail(u64::MAX);
        assert_eq!(all.len() as u64, ring.len());
        assert!(String::from_utf8_lossy(&written).ends_with(&all));
    }

    #[test]
    fn a_write_bigger_than_the_ring_keeps_its_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ring = ConsoleRing::new(dir.path().join("console.log"), 1);
        assert_eq!(ring.cap_bytes, MIN_CAP_BYTES, "raised to the minimum");
        ring.append(b"start\n").expect("append");
        let big: Vec<u8> = (0..20_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        ring.append(&big).expect("append");
        assert!(ring.len() <= MIN_CAP_BYTES, "{}", ring.len());
        let all = ring.tail(u64::MAX);
        assert!(String::from_utf8_lossy(&big).ends_with(&all), "{all}");
        assert!(!all.contains("start"));
    }

    #[tokio::test]
    async fn the_drain_reads_a_socket_until_it_closes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("console.sock");
        let ring = ConsoleRing::new(dir.path().join("console.log"), 4096);
        // Started before the socket exists, like a drain racing QEMU's start.
        let drained = spawn_drain(socket.clone(), ring.clone());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
        let (mut peer, _) = listener.accept().await.expect("accept");
        use tokio::io::AsyncWriteExt;
        for i in 0..2000 {
            peer.write_all(format!("console line {i}\n").as_bytes())
                .await
                .expect("write");
        }
        drop(peer);
        drained.await.expect("drain task");
        assert!(ring.len() <= 4096);
        assert!(ring.tail(200).ends_with("console line 1999\n"));
    }
}
