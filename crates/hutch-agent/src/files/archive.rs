//! `GET /v1/files/archive?path=` (a tar stream of a directory or file) and
//! `PUT /v1/files/archive?path=` (a tar stream unpacked into the directory `path`).
//!
//! The archive is made and unpacked here, inside the sandbox, by `hutch_proto::archive`
//! (its rules: nothing is followed through a symlink, entries that would land outside `path`
//! are refused); the host only relays the bytes. Like reads and writes, each step is one
//! short job on the blocking pool: a chunk of the archive made, or the entries of one
//! received chunk unpacked, so a stalled host holds no thread.

use http_body_util::BodyExt;
use hutch_proto::archive::{ArchiveError, ArchiveWriter, ExtractOptions, Extractor, TarParser};
use hyper::body::Incoming;
use hyper::Response;
use tokio::sync::mpsc;

use super::blocking;
use crate::error::{Failure, Result};
use crate::http::{self, AgentBody, Query};

/// About this many bytes of archive are made per step.
const CHUNK: usize = 64 << 10;
/// Chunks queued between the walk and the HTTP stream.
const QUEUE: usize = 8;

fn failure(e: ArchiveError) -> Failure {
    match e {
        ArchiveError::Io { op, path, source } => Failure::io(op, path, source),
        other => Failure::BadRequest(other.to_string()),
    }
}

/// `GET /v1/files/archive?path=`.
pub async fn read_archive(query: &Query) -> Result<Response<AgentBody>> {
    let path = query.path()?;
    let writer =
        blocking(move || ArchiveWriter::open(std::path::Path::new(&path)).map_err(failure)).await?;
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(async move {
        let mut writer = Some(writer);
        while let Some(mut w) = writer.take() {
            let step = tokio::task::spawn_blocking(move || {
                let chunk = w.next_chunk(CHUNK);
                (w, chunk)
            })
            .await;
            let Ok((w, chunk)) = step else {
                let _ = tx
                    .send(Err(std::io::Error::other("archive did not finish")))
                    .await;
                return;
            };
            let chunk = match chunk {
                Ok(None) => return,
                Ok(Some(bytes)) => Ok(bytes::Bytes::from(bytes)),
                // The error resets the stream: the host sees a failed download, not a short one.
                Err(e) => Err(std::io::Error::other(e.to_string())),
            };
            let failed = chunk.is_err();
            if tx.send(chunk).await.is_err() || failed {
                return;
            }
            writer = Some(w);
        }
    });
    Ok(http::stream(hutch_proto::archive::CONTENT_TYPE, rx))
}

/// `PUT /v1/files/archive?path=[&owners=keep]`: unpack the body below `path` (created if
/// missing); with `owners=keep` entries get the archive's numeric owners.
pub async fn write_archive(query: &Query, mut body: Incoming) -> Result<()> {
    let path = query.path()?;
    let dest = path.clone();
    let options = ExtractOptions {
        keep_special_bits: true,
        keep_owners: query.get("owners") == Some("keep"),
    };
    let mut extractor =
        blocking(move || Extractor::open(std::path::Path::new(&dest), options).map_err(failure))
            .await?;
    let mut parser = TarParser::new();
    loop {
        let data = match body.frame().await {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if data.is_empty() => continue,
                Ok(data) => data,
                Err(_) => continue, // trailers
            },
            Some(Err(_)) => {
                return Err(Failure::BadRequest(format!(
                    "upload of an archive into {path} aborted by the host"
                )));
            }
        };
        let events = parser.push(&data).map_err(failure)?;
        if events.is_empty() {
            continue;
        }
        extractor = blocking(move || {
            for event in events {
                extractor.apply(event).map_err(failure)?;
            }
            Ok(extractor)
        })
        .await?;
    }
    parser.finish().map_err(failure)?;
    blocking(move || extractor.finish().map(drop).map_err(failure)).await
}
