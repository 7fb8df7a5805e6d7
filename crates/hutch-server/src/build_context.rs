//! Receiving a build context (`POST /v1/templates` with a tar body): the request body is
//! unpacked as it arrives into a directory of its own, with `hutch_proto::archive` (the
//! same hostile-input rules as the agent's: nothing lands outside the directory, no
//! devices, no absolute or climbing links; see that module).
//!
//! The body is a tar stream, gzip-compressed or not (`Content-Encoding: gzip`, a gzip
//! content type, or simply gzip's magic bytes). Limits, checked while unpacking: the bytes
//! received and the bytes of the uncompressed tar stream each at most
//! [`ContextLimits::max_bytes`] (so a decompression bomb stops at the same size), and at
//! most [`ContextLimits::max_entries`] entries. Over a limit → 413; not a tar (or gzip)
//! stream, or a refused entry → 400.

use std::io::Write;
use std::path::PathBuf;

use axum::body::Body;
use bytes::Bytes;
use futures_util::StreamExt;
use hutch_proto::archive::{ArchiveError, ExtractOptions, Extractor, TarEvent, TarParser};

/// Default [`ContextLimits::max_bytes`]: 2 GiB.
pub const DEFAULT_MAX_CONTEXT_BYTES: u64 = 2 << 30;
/// Default [`ContextLimits::max_entries`] (as many as a build reads from a context).
pub const DEFAULT_MAX_CONTEXT_ENTRIES: u64 = hutch_dockerfile::MAX_ENTRIES as u64;
/// Compressed bytes given to the gzip decoder at once: at deflate's best ratio (~1032:1)
/// one step holds at most ~4 MiB of output in memory.
const GZIP_STEP: usize = 4 << 10;
/// After a limit is hit, up to this much more of the body is read (and dropped) so that
/// the client reads the 413 instead of a reset connection.
const DRAIN_AFTER_REFUSAL: u64 = 16 << 20;

/// How big a build context may be.
#[derive(Debug, Clone, Copy)]
pub struct ContextLimits {
    /// Most bytes received, and most bytes of the uncompressed tar stream.
    pub max_bytes: u64,
    /// Most entries.
    pub max_entries: u64,
}

impl Default for ContextLimits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_CONTEXT_BYTES,
            max_entries: DEFAULT_MAX_CONTEXT_ENTRIES,
        }
    }
}

/// What was unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Entries unpacked.
    pub entries: u64,
    /// Bytes of file data written.
    pub file_bytes: u64,
}

/// Why a build context was not received.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    /// Over [`ContextLimits::max_bytes`] (413).
    #[error(
        "the build context is larger than the server's limit of {limit} bytes \
         (hutch serve --max-build-context): leave files out with .dockerignore"
    )]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// Over [`ContextLimits::max_entries`] (413).
    #[error("the build context has more than {limit} entries: leave files out with .dockerignore")]
    TooManyEntries {
        /// The limit.
        limit: u64,
    },
    /// Not a tar (or gzip) stream (400).
    #[error("the build context is not a valid tar stream: {0}")]
    Malformed(String),
    /// An entry that is never unpacked (400).
    #[error("the build context has an entry that is not unpacked: {0}")]
    Refused(String),
    /// The request body could not be read (400).
    #[error("reading the build context: {0}")]
    Body(String),
    /// Writing the context on this host failed (500).
    #[error("unpacking the build context: {0}")]
    Io(String),
}

impl From<ArchiveError> for ContextError {
    fn from(e: ArchiveError) -> Self {
        match e {
            ArchiveError::Malformed(m) => Self::Malformed(m),
            e @ ArchiveError::Refused { .. } => Self::Refused(e.to_string()),
            e @ ArchiveError::Io { .. } => Self::Io(e.to_string()),
        }
    }
}

/// Whether the request's headers say the body is gzip-compressed.
pub fn gzip_declared(headers: &axum::http::HeaderMap) -> bool {
    let has = |name: axum::http::HeaderName, values: &[&str]| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                let v = v.split(';').next().unwrap_or("").trim();
                values.iter().any(|x| v.eq_ignore_ascii_case(x))
            })
    };
    has(axum::http::header::CONTENT_ENCODING, &["gzip", "x-gzip"])
        || has(
            axum::http::header::CONTENT_TYPE,
            &["application/gzip", "application/x-gzip"],
        )
}

/// Unpack `body` (a tar stream; gzip when `gzip` or when it starts like gzip) into `dir`.
pub async fn receive(
    body: Body,
    dir: PathBuf,
    gzip: bool,
    limits: ContextLimits,
) -> Result<Received, ContextError> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    let unpacker = tokio::task::spawn_blocking(move || unpack(rx, &dir, gzip, limits));
    let mut stream = body.into_data_stream();
    let mut received = 0u64;
    let mut refusal = None;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                refusal = Some(ContextError::Body(e.to_string()));
                break;
            }
        };
        received += chunk.len() as u64;
        if received > limits.max_bytes {
            refusal = Some(ContextError::TooLarge {
                limit: limits.max_bytes,
            });
            break;
        }
        if tx.send(chunk).await.is_err() {
            break; // the unpacker stopped: its error says why
        }
    }
    drop(tx);
    let unpacked = unpacker
        .await
        .map_err(|e| ContextError::Io(format!("the unpacking task failed: {e}")))?;
    let result = match refusal {
        Some(e) => Err(e),
        None => unpacked,
    };
    if matches!(
        result,
        Err(ContextError::TooLarge { .. } | ContextError::TooManyEntries { .. })
    ) {
        drain(&mut stream).await;
    }
    result
}

/// Read and drop up to [`DRAIN_AFTER_REFUSAL`] more bytes of a refused body.
async fn drain(stream: &mut axum::body::BodyDataStream) {
    let mut dropped = 0u64;
    while let Some(Ok(chunk)) = stream.next().await {
        dropped += chunk.len() as u64;
        if dropped > DRAIN_AFTER_REFUSAL {
            break;
        }
    }
}

/// The tar side: parse, count, unpack.
struct Unpacker {
    parser: TarParser,
    extractor: Extractor,
    tar_bytes: u64,
    entries: u64,
    limits: ContextLimits,
}

impl Unpacker {
    fn feed(&mut self, data: &[u8]) -> Result<(), ContextError> {
        self.tar_bytes += data.len() as u64;
        if self.tar_bytes > self.limits.max_bytes {
            return Err(ContextError::TooLarge {
                limit: self.limits.max_bytes,
            });
        }
        for event in self.parser.push(data)? {
            if matches!(event, TarEvent::Entry(_)) {
                self.entries += 1;
                if self.entries > self.limits.max_entries {
                    return Err(ContextError::TooManyEntries {
                        limit: self.limits.max_entries,
                    });
                }
            }
            self.extractor.apply(event)?;
        }
        Ok(())
    }
}

/// The blocking side of [`receive`].
fn unpack(
    mut rx: tokio::sync::mpsc::Receiver<Bytes>,
    dir: &std::path::Path,
    gzip: bool,
    limits: ContextLimits,
) -> Result<Received, ContextError> {
    let mut tar = Unpacker {
        parser: TarParser::new(),
        extractor: Extractor::open(dir, ExtractOptions::default())?,
        tar_bytes: 0,
        entries: 0,
        limits,
    };
    let mut decoder: Option<flate2::write::GzDecoder<Vec<u8>>> = None;
    let mut first = true;
    let gzip_error = |e: std::io::Error| ContextError::Malformed(format!("gzip: {e}"));
    while let Some(chunk) = rx.blocking_recv() {
        if first && !chunk.is_empty() {
            first = false;
            if gzip || chunk.starts_with(&[0x1f, 0x8b]) {
                decoder = Some(flate2::write::GzDecoder::new(Vec::new()));
            }
        }
        match &mut decoder {
            None => tar.feed(&chunk)?,
            Some(d) => {
                for piece in chunk.chunks(GZIP_STEP) {
                    d.write_all(piece).map_err(gzip_error)?;
                    let out = std::mem::take(d.get_mut());
                    tar.feed(&out)?;
                }
            }
        }
    }
    if let Some(d) = decoder {
        let rest = d.finish().map_err(gzip_error)?;
        tar.feed(&rest)?;
    }
    tar.parser.finish()?;
    let (entries, file_bytes) = tar.extractor.finish()?;
    Ok(Received {
        entries,
        file_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).expect("append");
        }
        b.into_inner().expect("finish")
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("gzip");
        e.finish().expect("gzip")
    }

    async fn receive_bytes(
        data: Vec<u8>,
        gzip: bool,
        limits: ContextLimits,
    ) -> (tempfile::TempDir, Result<Received, ContextError>) {
        let dir = tempfile::tempdir().expect("tmp");
        // In pieces, as a network body comes.
        let pieces: Vec<Result<Bytes, std::io::Error>> = data
            .chunks(1000)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let body = Body::from_stream(futures_util::stream::iter(pieces));
        let r = receive(body, dir.path().join("context"), gzip, limits).await;
        (dir, r)
    }

    #[tokio::test]
    async fn plain_and_gzip_contexts_unpack() {
        let tar = tar_of(&[("Dockerfile", b"FROM minimal\n"), ("src/a.txt", b"alpha")]);
        for (data, declared) in [
            (tar.clone(), false),
            (gzip(&tar), true),
            (gzip(&tar), false),
        ] {
            let (dir, r) = receive_bytes(data, declared, ContextLimits::default()).await;
            let got = r.expect("received");
            assert_eq!(got.file_bytes, 13 + 5);
            let ctx = dir.path().join("context");
            assert_eq!(
                std::fs::read_to_string(ctx.join("src/a.txt")).expect("a.txt"),
                "alpha"
            );
        }
    }

    #[tokio::test]
    async fn limits_and_bad_streams_are_refused() {
        let big = vec![7u8; 64 << 10];
        let tar = tar_of(&[("big", &big)]);
        let small = ContextLimits {
            max_bytes: 16 << 10,
            max_entries: 10,
        };
        let (_d, r) = receive_bytes(tar.clone(), false, small).await;
        assert!(
            matches!(r, Err(ContextError::TooLarge { limit }) if limit == 16 << 10),
            "{r:?}"
        );
        // Compressed it is tiny; uncompressed it is over the limit all the same.
        let packed = gzip(&tar);
        assert!(packed.len() < 16 << 10);
        let (_d, r) = receive_bytes(packed, true, small).await;
        assert!(matches!(r, Err(ContextError::TooLarge { .. })), "{r:?}");
        let files: Vec<(String, Vec<u8>)> = (0..11).map(|i| (format!("f{i}"), vec![])).collect();
        let refs: Vec<(&str, &[u8])> = files
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        let (_d, r) = receive_bytes(tar_of(&refs), false, small).await;
        assert!(
            matches!(r, Err(ContextError::TooManyEntries { limit: 10 })),
            "{r:?}"
        );
        let (_d, r) = receive_bytes(b"not a tar at all".to_vec(), false, small).await;
        assert!(matches!(r, Err(ContextError::Malformed(_))), "{r:?}");
        let (_d, r) = receive_bytes(tar[..700].to_vec(), false, small).await;
        assert!(matches!(r, Err(ContextError::Malformed(_))), "{r:?}");
        let (_d, r) = receive_bytes(b"\x1f\x8bnot gzip".to_vec(), false, small).await;
        assert!(matches!(r, Err(ContextError::Malformed(m)) if m.starts_with("gzip")));
    }

    #[tokio::test]
    async fn entries_leaving_the_directory_are_refused() {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        let mut b = tar::Builder::new(Vec::new());
        b.append_link(&mut h, "escape", "/etc")
            .expect("append symlink");
        let data = b.into_inner().expect("finish");
        let (dir, r) = receive_bytes(data, false, ContextLimits::default()).await;
        assert!(matches!(r, Err(ContextError::Refused(_))), "{r:?}");
        assert!(std::fs::symlink_metadata(dir.path().join("context/escape")).is_err());
    }
}
