//! `hutch cp`: copy a file or a directory into or out of a sandbox, like `docker cp`.
//!
//! Files go through `GET`/`PUT /v1/sandboxes/{id}/files`; directories as tar streams through
//! `…/files/archive`, made and unpacked by the agent inside the sandbox. `-` is this
//! process's stdin or stdout as a tar stream. A directory copied out is unpacked here by
//! `hutch_proto::archive`, which treats the stream as hostile (it comes from the sandbox):
//! nothing lands outside the destination or is written through a symlink, links pointing out
//! of it are refused, and setuid, setgid and sticky bits are dropped.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context};
use futures_util::StreamExt;
use hutch_proto::archive::{ArchiveWriter, ExtractOptions, Extractor, TarParser};
use reqwest::Method;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::client::{encode, Api};

/// Bytes of archive made per step of an upload.
const UPLOAD_CHUNK: usize = 256 << 10;

/// `hutch cp SRC DST`.
#[derive(Debug, clap::Args)]
pub struct CpArgs {
    /// `LOCAL`, `ID:/path`, or `-` (a tar stream on stdin).
    src: String,
    /// `LOCAL`, `ID:/path`, or `-` (a tar stream on stdout).
    dst: String,
}

/// One side of a copy.
#[derive(Debug, PartialEq, Eq)]
enum Place<'a> {
    /// A path on this machine.
    Local(&'a str),
    /// `-`: stdin or stdout, as a tar stream.
    Stdio,
    /// `sbx_…:/path`.
    Remote { id: &'a str, path: &'a str },
}

fn place(s: &str) -> Place<'_> {
    if s == "-" {
        return Place::Stdio;
    }
    match s.split_once(':') {
        Some((id, path)) if id.starts_with("sbx_") && path.starts_with('/') => {
            Place::Remote { id, path }
        }
        _ => Place::Local(s),
    }
}

/// What was copied.
struct Copied {
    bytes: u64,
    entries: Option<u64>,
}

/// `hutch cp`.
pub async fn cp(args: CpArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let copied = match (place(&args.src), place(&args.dst)) {
        (Place::Local(src), Place::Remote { id, path }) => {
            let meta = std::fs::metadata(src).with_context(|| format!("reading {src}"))?;
            if meta.is_dir() {
                upload_dir(&api, id, path, src).await?
            } else if meta.is_file() {
                upload_file(&api, id, path, src, &meta).await?
            } else {
                bail!("{src} is neither a regular file nor a directory");
            }
        }
        (Place::Stdio, Place::Remote { id, path }) => upload_stdin(&api, id, path).await?,
        (Place::Remote { id, path }, Place::Local(dst)) => {
            let stat = api
                .call(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/files/stat?path={}", encode(path)),
                    None,
                )
                .await?;
            if stat["type"] == "dir" {
                download_dir(&api, id, path, dst).await?
            } else {
                download_file(&api, id, path, dst).await?
            }
        }
        (Place::Remote { id, path }, Place::Stdio) => download_to_stdout(&api, id, path).await?,
        _ => bail!(
            "exactly one of SRC and DST must be ID:/absolute/path (the other a local path, or - for a tar stream on stdin/stdout)"
        ),
    };
    if json_out {
        let mut v = json!({ "copied_bytes": copied.bytes });
        if let Some(n) = copied.entries {
            v["entries"] = json!(n);
        }
        println!("{v}");
    } else if let Some(n) = copied.entries {
        eprintln!("copied {n} entries ({} bytes of files)", copied.bytes);
    } else {
        eprintln!("copied {} bytes", copied.bytes);
    }
    Ok(())
}

async fn upload_file(
    api: &Api,
    id: &str,
    path: &str,
    src: &str,
    meta: &std::fs::Metadata,
) -> anyhow::Result<Copied> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o7777;
    let file = tokio::fs::File::open(src).await?;
    let body = reqwest::Body::wrap_stream(file_stream(file));
    api.raw(
        Method::PUT,
        &format!(
            "/v1/sandboxes/{id}/files?path={}&mode={mode:o}",
            encode(path)
        ),
        Some(body),
        None,
    )
    .await?;
    Ok(Copied {
        bytes: meta.len(),
        entries: None,
    })
}

/// `PUT …/files/archive` with a tar stream of the local directory `src`, made on a thread of
/// its own as the upload reads it.
async fn upload_dir(api: &Api, id: &str, path: &str, src: &str) -> anyhow::Result<Copied> {
    let writer = ArchiveWriter::open(Path::new(src)).with_context(|| format!("reading {src}"))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
    let maker = std::thread::spawn(move || {
        let mut writer = writer;
        loop {
            let chunk = match writer.next_chunk(UPLOAD_CHUNK) {
                Ok(Some(chunk)) => chunk,
                Ok(None) => return Ok((writer.entries(), writer.file_bytes())),
                Err(e) => {
                    let message = e.to_string();
                    let _ = tx.blocking_send(Err(std::io::Error::other(message.clone())));
                    return Err(message);
                }
            };
            if tx.blocking_send(Ok(bytes::Bytes::from(chunk))).is_err() {
                // The upload ended; its error says why.
                return Ok((writer.entries(), writer.file_bytes()));
            }
        }
    });
    let body = reqwest::Body::wrap_stream(futures_util::stream::unfold(rx, |mut rx| async {
        rx.recv().await.map(|item| (item, rx))
    }));
    let sent = api
        .raw(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files/archive?path={}", encode(path)),
            Some(body),
            None,
        )
        .await;
    let made = maker
        .join()
        .map_err(|_| anyhow::anyhow!("the archive of {src} could not be made"))?;
    let (entries, bytes) = made.map_err(|e| anyhow::anyhow!("archiving {src}: {e}"))?;
    sent?;
    Ok(Copied {
        bytes,
        entries: Some(entries),
    })
}

/// `-` → `PUT …/files/archive`: stdin is sent as it is; the agent checks every entry.
async fn upload_stdin(api: &Api, id: &str, path: &str) -> anyhow::Result<Copied> {
    let stdin = tokio::io::stdin();
    let counted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = counted.clone();
    let stream = tokio_util::io::ReaderStream::new(stdin).map(move |chunk| {
        if let Ok(c) = &chunk {
            count.fetch_add(c.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        chunk
    });
    api.raw(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/files/archive?path={}", encode(path)),
        Some(reqwest::Body::wrap_stream(stream)),
        None,
    )
    .await?;
    Ok(Copied {
        bytes: counted.load(std::sync::atomic::Ordering::Relaxed),
        entries: None,
    })
}

async fn download_file(api: &Api, id: &str, path: &str, dst: &str) -> anyhow::Result<Copied> {
    let resp = api
        .raw(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path={}", encode(path)),
            None,
            None,
        )
        .await?;
    let mut out = tokio::fs::File::create(dst)
        .await
        .with_context(|| format!("creating {dst}"))?;
    let mut n = 0u64;
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        n += chunk.len() as u64;
        out.write_all(&chunk).await?;
    }
    out.flush().await?;
    Ok(Copied {
        bytes: n,
        entries: None,
    })
}

/// `GET …/files/archive`, unpacked below `dst` on a thread of its own as it arrives.
async fn download_dir(api: &Api, id: &str, path: &str, dst: &str) -> anyhow::Result<Copied> {
    let resp = api
        .raw(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/archive?path={}", encode(path)),
            None,
            None,
        )
        .await?;
    let extractor = Extractor::open(Path::new(dst), ExtractOptions::default())
        .with_context(|| format!("unpacking into {dst}"))?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<bytes::Bytes>(8);
    let unpacker = std::thread::spawn(move || -> anyhow::Result<(u64, u64)> {
        let mut extractor = extractor;
        let mut parser = TarParser::new();
        for chunk in rx {
            for event in parser.push(&chunk)? {
                extractor.apply(event)?;
            }
        }
        parser.finish()?;
        Ok(extractor.finish()?)
    });
    let mut stream = resp.bytes_stream();
    let mut received: anyhow::Result<()> = Ok(());
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => {
                if tx.send(chunk).is_err() {
                    break; // the unpacker stopped; its error says why
                }
            }
            Err(e) => {
                received = Err(anyhow::anyhow!("the download of {path} failed: {e}"));
                break;
            }
        }
    }
    drop(tx);
    let unpacked = unpacker
        .join()
        .map_err(|_| anyhow::anyhow!("unpacking into {dst} failed"))?
        .with_context(|| format!("unpacking {id}:{path} into {dst}"));
    received?;
    let (entries, bytes) = unpacked?;
    Ok(Copied {
        bytes,
        entries: Some(entries),
    })
}

/// `GET …/files/archive` → stdout, as it is.
async fn download_to_stdout(api: &Api, id: &str, path: &str) -> anyhow::Result<Copied> {
    let resp = api
        .raw(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/archive?path={}", encode(path)),
            None,
            None,
        )
        .await?;
    let mut n = 0u64;
    let mut stream = resp.bytes_stream();
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.with_context(|| format!("the download of {path} failed"))?;
        n += chunk.len() as u64;
        out.write_all(&chunk).context("writing to stdout")?;
    }
    out.flush().context("writing to stdout")?;
    Ok(Copied {
        bytes: n,
        entries: None,
    })
}

/// A file as a stream of chunks.
fn file_stream(
    file: tokio::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> {
    tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_parse() {
        assert_eq!(place("-"), Place::Stdio);
        assert_eq!(
            place("sbx_abc:/root/x"),
            Place::Remote {
                id: "sbx_abc",
                path: "/root/x"
            }
        );
        assert_eq!(place("./sbx_abc:/x"), Place::Local("./sbx_abc:/x"));
        assert_eq!(place("sbx_abc:relative"), Place::Local("sbx_abc:relative"));
    }
}
