//! `hutch cp`: copy one file into or out of a sandbox.

use std::path::Path;

use anyhow::{bail, Context};
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::client::{encode, Api};

/// `hutch cp SRC DST`.
#[derive(Debug, clap::Args)]
pub struct CpArgs {
    /// `LOCAL` or `ID:/path`.
    src: String,
    /// `LOCAL` or `ID:/path`.
    dst: String,
}

/// `sbx_…:/path` → (id, path).
fn remote(s: &str) -> Option<(&str, &str)> {
    let (id, path) = s.split_once(':')?;
    (id.starts_with("sbx_") && path.starts_with('/')).then_some((id, path))
}

/// `hutch cp`.
pub async fn cp(args: CpArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let bytes = match (remote(&args.src), remote(&args.dst)) {
        (None, Some((id, path))) => {
            let meta =
                std::fs::metadata(&args.src).with_context(|| format!("reading {}", args.src))?;
            if !meta.is_file() {
                bail!(
                    "{} is not a regular file (directories are not supported yet)",
                    args.src
                );
            }
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o7777;
            let file = tokio::fs::File::open(&args.src).await?;
            let body = reqwest::Body::wrap_stream(tokio_util_stream(file));
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
            meta.len()
        }
        (Some((id, path)), None) => {
            let resp = api
                .raw(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/files?path={}", encode(path)),
                    None,
                    None,
                )
                .await?;
            let mut out = tokio::fs::File::create(&args.dst)
                .await
                .with_context(|| format!("creating {}", args.dst))?;
            let mut n = 0u64;
            let mut stream = resp.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                n += chunk.len() as u64;
                out.write_all(&chunk).await?;
            }
            out.flush().await?;
            n
        }
        _ => bail!("exactly one of SRC and DST must be ID:/absolute/path"),
    };
    if json_out {
        println!("{}", json!({"copied_bytes": bytes}));
    } else {
        eprintln!("copied {bytes} bytes");
    }
    Ok(())
}

/// A file as a stream of chunks.
fn tokio_util_stream(
    file: tokio::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> {
    futures_util::stream::unfold(file, |mut f| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 256 * 1024];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    })
}
