//! `hutch port-forward ID PORT [LOCAL_PORT]`: a local TCP port leading to a port inside a
//! sandbox. Each accepted local connection opens one tunnel
//! (`GET /v1/sandboxes/{id}/tunnel/{port}`, a WebSocket of raw bytes).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use anyhow::{bail, Context};
use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::client::Api;

/// Largest chunk sent in one WebSocket message.
const CHUNK: usize = 64 << 10;

/// `hutch port-forward`.
#[derive(Debug, clap::Args)]
pub struct PortForwardArgs {
    /// Sandbox id.
    id: String,
    /// Port inside the sandbox (the service listens on its loopback or any address).
    port: u16,
    /// Local port (default: the same port, or a free one if that is taken; 0: a free one).
    local_port: Option<u16>,
    /// Local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    address: IpAddr,
}

/// Listen and forward until interrupted.
pub async fn port_forward(
    args: PortForwardArgs,
    state_dir: &Path,
    json: bool,
) -> anyhow::Result<()> {
    if args.port == 0 {
        bail!("the sandbox port must be from 1 to 65535");
    }
    let api = Api::from_env(state_dir)?;
    // Fail early on a wrong key or an unknown sandbox.
    api.call(Method::GET, &format!("/v1/sandboxes/{}", args.id), None)
        .await?;
    let listener = listen(args.address, args.local_port, args.port).await?;
    let local = listener.local_addr()?;
    if json {
        println!(
            "{}",
            json!({
                "sandbox": args.id,
                "port": args.port,
                "local_address": local.ip().to_string(),
                "local_port": local.port(),
                "url": format!("http://{local}/"),
            })
        );
    } else {
        println!(
            "Forwarding {local} -> {}:{} (Ctrl-C to stop)",
            args.id, args.port
        );
    }
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let api = api.clone();
                    let id = args.id.clone();
                    let port = args.port;
                    tokio::spawn(async move {
                        if let Err(e) = forward(&api, &id, port, stream).await {
                            eprintln!("hutch: port-forward {peer} -> {id}:{port}: {e:#}");
                        }
                    });
                }
                Err(e) => eprintln!("hutch: port-forward: accept failed: {e}"),
            },
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

async fn listen(
    address: IpAddr,
    local_port: Option<u16>,
    port: u16,
) -> anyhow::Result<TcpListener> {
    let wanted = SocketAddr::new(address, local_port.unwrap_or(port));
    match TcpListener::bind(wanted).await {
        Ok(l) => Ok(l),
        // Only the default may move: an explicit port that is taken is an error.
        Err(e) if local_port.is_none() && e.kind() == std::io::ErrorKind::AddrInUse => {
            TcpListener::bind(SocketAddr::new(address, 0))
                .await
                .with_context(|| format!("listening on {address}"))
        }
        Err(e) => Err(e).with_context(|| format!("listening on {wanted}")),
    }
}

/// Carry one local connection over one tunnel, both ways, with half-close.
async fn forward(api: &Api, id: &str, port: u16, stream: TcpStream) -> anyhow::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut req = api
        .ws_url(&format!("/v1/sandboxes/{id}/tunnel/{port}"))
        .into_client_request()?;
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", api.key()).parse().context("API key")?,
    );
    if let Some(t) = api.tenant() {
        req.headers_mut()
            .insert("x-hutch-tenant", t.parse().context("HUTCH_TENANT")?);
    }
    let ws = match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => ws,
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let body: serde_json::Value = resp
                .body()
                .as_deref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or_default();
            let message = body["error"]["message"]
                .as_str()
                .unwrap_or("the server refused the tunnel");
            bail!("{} ({})", message, resp.status().as_u16());
        }
        Err(e) => return Err(e).context("opening the tunnel"),
    };
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (mut local_rx, mut local_tx) = stream.into_split();
    let outbound = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = local_rx.read(&mut buf).await?;
            if n == 0 {
                // Half-close: the service reads end of file, its answer still comes back.
                let eof = json!({"type": "eof"}).to_string();
                ws_tx.send(Message::Text(eof.into())).await?;
                return anyhow::Ok(ws_tx);
            }
            ws_tx
                .send(Message::Binary(buf[..n].to_vec().into()))
                .await?;
        }
    };
    let inbound = async move {
        while let Some(msg) = ws_rx.next().await {
            match msg? {
                Message::Binary(data) => local_tx.write_all(&data).await?,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = local_tx.shutdown().await;
        anyhow::Ok(())
    };
    tokio::pin!(outbound, inbound);
    tokio::select! {
        done = &mut inbound => done,
        sent = &mut outbound => match sent {
            // Keep the sink alive (dropping it would close the tunnel) until the answer ends.
            Ok(_sink) => inbound.await,
            Err(e) => Err(e),
        },
    }
}
