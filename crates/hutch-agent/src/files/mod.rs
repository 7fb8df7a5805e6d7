//! The file routes (`/v1/files/*`): parse the query or body, run the operation on a
//! blocking thread, answer. Directory trees as tar streams are in [`archive`].
//!
//! Watches of a directory (inotify, as NDJSON) are in [`watch`].
//!
//! Reads and writes stream in chunks: each chunk is one short job on the blocking pool, and
//! between chunks the transfer waits on the network without holding a thread. A 100 MiB
//! transfer therefore never sits in memory, a slow side slows the other down (bounded
//! queue one way, HTTP/2 flow control the other), and a host that stops reading pins
//! nothing but its own stream.
//!
//! Files on generated filesystems (procfs, sysfs, debugfs, …) are the exception: their
//! size says nothing and some never end, so one is read whole, at most 1 MiB
//! ([`ops::MAX_GENERATED_FILE_BYTES`]), before the answer starts; a longer one is refused
//! with `bad_request` naming the limit.

mod archive;
mod as_user;
mod ops;
mod watch;
mod xattr;

pub use archive::{read_archive, write_archive};
pub use watch::watch;

use std::fs::File;
use std::io::{Read, Write};

use bytes::Bytes;
use http_body_util::BodyExt;
use hutch_proto::{FileEntry, ListResponse, MkdirRequest, MoveRequest};
use hyper::body::Incoming;
use hyper::Response;
use tokio::sync::mpsc;

use crate::error::{Failure, Result};
use crate::http::{self, absolute_path, AgentBody, Query};

/// Size of each chunk read from a file.
const READ_CHUNK: usize = 64 << 10;
/// Chunks queued between the file and the HTTP stream of a download.
const QUEUE: usize = 8;

pub(crate) async fn blocking<T: Send + 'static>(
    op: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(op)
        .await
        .map_err(|e| Failure::Internal(format!("file operation did not finish: {e}")))?
}

/// `GET /v1/files/read?path=[&user=]`: the file's bytes (opened as `user`, if given).
pub async fn read(query: &Query) -> Result<Response<AgentBody>> {
    let path = query.path()?;
    let open_path = path.clone();
    let user = query.get("user").map(str::to_string);
    let opened = blocking(move || {
        let account = user.as_deref().map(as_user::account).transpose()?;
        as_user::run_as(account.as_ref(), || ops::open_read(&open_path))
    })
    .await?;
    let file = match opened.generated {
        None => opened.file,
        Some(filesystem) => {
            let data =
                blocking(move || ops::read_generated(opened.file, &path, filesystem)).await?;
            return Ok(http::bytes("application/octet-stream", Bytes::from(data)));
        }
    };
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(async move {
        let mut file = Some(file);
        while let Some(open) = file.take() {
            let Ok((open, chunk)) = tokio::task::spawn_blocking(move || read_chunk(open)).await
            else {
                let _ = tx
                    .send(Err(std::io::Error::other("file read did not finish")))
                    .await;
                return;
            };
            let chunk = match chunk {
                Ok(chunk) if chunk.is_empty() => return, // end of file
                Ok(chunk) => Ok(chunk),
                // The error resets the stream: the host sees a failed read, not a short file.
                Err(e) => Err(e),
            };
            let failed = chunk.is_err();
            if tx.send(chunk).await.is_err() || failed {
                return; // the host went away, or the read failed
            }
            file = Some(open);
        }
    });
    Ok(http::stream("application/octet-stream", rx))
}

/// Read up to one chunk (empty at end of file), retrying interrupted reads.
fn read_chunk(mut file: File) -> (File, std::io::Result<Bytes>) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match file.read(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return (file, Ok(Bytes::from(buf)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return (file, Err(e)),
        }
    }
}

/// `PUT /v1/files/write?path=&mode=[&user=][&metadata=]`: stream the body into the file
/// (opened, and created with its parents, as `user` if given). `metadata`, a JSON object of
/// pairs, becomes the file's `user.*` extended attributes before the first byte is written.
pub async fn write(query: &Query, mut body: Incoming) -> Result<()> {
    let path = query.path()?;
    let mode = query.get("mode").map(ops::parse_mode).transpose()?;
    let metadata: hutch_proto::file_metadata::FileMetadata = match query.get("metadata") {
        None => Default::default(),
        Some(text) => serde_json::from_str(text).map_err(|e| {
            Failure::BadRequest(format!("metadata must be a JSON object of strings: {e}"))
        })?,
    };
    let open_path = path.clone();
    let user = query.get("user").map(str::to_string);
    let mut file = blocking(move || {
        let account = user.as_deref().map(as_user::account).transpose()?;
        as_user::run_as(account.as_ref(), || {
            let file = ops::open_write(&open_path, mode)?;
            xattr::set_all(&file, &open_path, &metadata)?;
            Ok(file)
        })
    })
    .await?;
    loop {
        let data = match body.frame().await {
            None => return Ok(()),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if data.is_empty() => continue,
                Ok(data) => data,
                Err(_) => continue, // trailers
            },
            Some(Err(_)) => {
                // Whatever arrived stays on disk; the host knows its upload failed.
                return Err(Failure::BadRequest(format!(
                    "upload of {path} aborted by the host"
                )));
            }
        };
        let write_path = path.clone();
        file = blocking(move || {
            file.write_all(&data)
                .map_err(|e| Failure::io("write", write_path, e))?;
            Ok(file)
        })
        .await?;
    }
}

/// `DELETE /v1/files/remove?path=&recursive=`.
pub async fn remove(query: &Query) -> Result<()> {
    let path = query.path()?;
    let recursive = query.flag("recursive", false)?;
    blocking(move || ops::remove(&path, recursive)).await
}

/// `GET /v1/files/list?path=&depth=`.
pub async fn list(query: &Query) -> Result<ListResponse> {
    let path = query.path()?;
    let depth = match query.get("depth") {
        None => 1,
        Some(d) => d.parse::<u32>().map_err(|_| {
            Failure::BadRequest(format!("depth must be a positive integer, got {d:?}"))
        })?,
    };
    let entries = blocking(move || ops::list(&path, depth)).await?;
    Ok(ListResponse { entries })
}

/// `GET /v1/files/stat?path=`.
pub async fn stat(query: &Query) -> Result<FileEntry> {
    let path = query.path()?;
    blocking(move || ops::stat(&path)).await
}

/// `POST /v1/files/mkdir`.
pub async fn mkdir(body: Incoming) -> Result<()> {
    let request: MkdirRequest = http::read_json(body).await?;
    let path = absolute_path(&request.path)?;
    blocking(move || ops::mkdir(&path)).await
}

/// `POST /v1/files/move`.
pub async fn rename(body: Incoming) -> Result<()> {
    let request: MoveRequest = http::read_json(body).await?;
    let from = absolute_path(&request.from)?;
    let to = absolute_path(&request.to)?;
    blocking(move || ops::rename(&from, &to)).await
}
