//! `hutch shell ID`: an interactive terminal over the PTY WebSocket.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::client::{encode, Api};

/// `hutch shell`.
#[derive(Debug, clap::Args)]
pub struct ShellArgs {
    /// Sandbox id.
    id: String,
    /// Program to run instead of the login shell.
    #[arg(long)]
    cmd: Option<String>,
    /// User inside the sandbox.
    #[arg(long, short)]
    user: Option<String>,
}

/// Puts the terminal in raw mode and restores it when dropped.
struct RawMode {
    saved: Option<libc::termios>,
}

impl RawMode {
    fn enable() -> Self {
        // SAFETY: isatty takes an fd and has no other preconditions.
        if unsafe { libc::isatty(0) } != 1 {
            return Self { saved: None };
        }
        // SAFETY: termios is plain data; tcgetattr fills it for a valid fd.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd 0 is a tty (checked) and `t` is a valid out pointer.
        if unsafe { libc::tcgetattr(0, &mut t) } != 0 {
            return Self { saved: None };
        }
        let saved = t;
        // SAFETY: cfmakeraw only edits the struct we own.
        unsafe { libc::cfmakeraw(&mut t) };
        // SAFETY: valid fd and a fully initialised termios.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &t) };
        Self { saved: Some(saved) }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(t) = self.saved {
            // SAFETY: restores the attributes read from the same fd.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, &t) };
        }
    }
}

fn terminal_size() -> (u16, u16) {
    // SAFETY: winsize is plain data; TIOCGWINSZ fills it for a tty.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, request and out pointer.
    if unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0 {
        (ws.ws_col, ws.ws_row)
    } else {
        (80, 24)
    }
}

/// Run the shell; returns the remote exit code.
pub async fn shell(args: ShellArgs, state_dir: &Path) -> anyhow::Result<i32> {
    let api = Api::from_env(state_dir)?;
    let (cols, rows) = terminal_size();
    let mut path = format!("/v1/sandboxes/{}/pty?cols={cols}&rows={rows}", args.id);
    if let Some(c) = &args.cmd {
        path.push_str(&format!("&cmd={}", encode(c)));
    }
    if let Some(u) = &args.user {
        path.push_str(&format!("&user={}", encode(u)));
    }
    let mut req = api.ws_url(&path).into_client_request()?;
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", api.key()).parse().context("API key")?,
    );
    if let Some(t) = api.tenant() {
        req.headers_mut()
            .insert("x-hutch-tenant", t.parse().context("HUTCH_TENANT")?);
    }
    let (ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .with_context(|| format!("opening a terminal in {}", args.id))?;
    let (mut sink, mut stream) = ws.split();
    let _raw = RawMode::enable();
    let (in_tx, mut in_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        let mut stdin = std::io::stdin();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 || in_tx.blocking_send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let mut code = 0;
    let mut stdin_open = true;
    loop {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&b)?;
                    out.flush()?;
                }
                Some(Ok(Message::Text(t))) => {
                    let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap_or_default();
                    if v["type"] == "exit" {
                        code = v["exit_code"].as_i64().unwrap_or(0) as i32;
                    } else if v["type"] == "error" {
                        eprintln!("\r\nhutch: {}\r", v["message"].as_str().unwrap_or("terminal error"));
                        code = 1;
                    }
                }
                Some(Ok(Message::Close(_))) | None => break,
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(_)) => {}
            },
            input = in_rx.recv(), if stdin_open => match input {
                Some(bytes) => sink.send(Message::Binary(bytes.into())).await?,
                None => stdin_open = false,
            },
            _ = winch.recv() => {
                let (cols, rows) = terminal_size();
                let msg = serde_json::json!({"type": "resize", "cols": cols, "rows": rows});
                sink.send(Message::Text(msg.to_string().into())).await?;
            }
        }
    }
    Ok(code)
}
