//! Port forwarding: byte streams to TCP ports inside a sandbox, carried by its agent.
//!
//! The host never dials a sandbox's IP address: every connection is an HTTP/2 stream on the
//! agent connection (`POST /v1/tcp`), and the agent dials only the sandbox's own loopback.
//! Forwarding therefore works for loopback-only sandboxes, under any egress policy, and for
//! `vm` guests alike. See `docs/ports.md`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hutch_proto::client::{ClientError, TcpTunnel};
use hutch_proto::AgentErrorCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{ActiveGuard, Manager};
use crate::error::{CoreError, CoreResult};
use crate::ids::SandboxId;

/// Parse a port from a request: a number from 1 to 65535.
pub fn parse_port(raw: &str) -> CoreResult<u16> {
    match raw.parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(CoreError::InvalidArgument(format!(
            "port must be a number from 1 to 65535, got {raw:?}"
        ))),
    }
}

/// An open connection to a port inside a sandbox: `AsyncRead + AsyncWrite`. While it is
/// open the sandbox counts as in use (it is not hibernated for idleness). Dropping it
/// closes the connection inside the sandbox.
#[derive(Debug)]
pub struct PortConnection {
    tunnel: TcpTunnel,
    _active: ActiveGuard,
}

impl Manager {
    /// Connect to `port` on the loopback of sandbox `id`. Like exec, this refreshes the TTL,
    /// counts as use, wakes a hibernated sandbox and refuses a paused one (`Conflict`).
    /// Nothing listening is [`CoreError::Agent`] with code `connection_refused`.
    pub async fn open_port(
        self: &Arc<Self>,
        id: &SandboxId,
        port: u16,
    ) -> CoreResult<PortConnection> {
        if port == 0 {
            return Err(CoreError::InvalidArgument(
                "port must be a number from 1 to 65535, got \"0\"".into(),
            ));
        }
        let client = self.agent(id).await?;
        let active = self.session_guard(id);
        let tunnel = match client.connect_tcp(port).await {
            Ok(t) => t,
            Err(e) => match predates_tunnels(id, &e) {
                Some(old) => return Err(old),
                None => return Err(self.agent_error(id, e).await),
            },
        };
        tracing::debug!(sandbox = id.as_str(), port, "port connection opened");
        Ok(PortConnection {
            tunnel,
            _active: active,
        })
    }
}

/// An agent from before `POST /v1/tcp` (a sandbox started by an older Hutch and re-adopted)
/// answers "no route": say so, rather than a 404 that reads like a missing sandbox.
fn predates_tunnels(id: &str, e: &ClientError) -> Option<CoreError> {
    match e {
        ClientError::Agent(a)
            if a.code == AgentErrorCode::NotFound && a.message.starts_with("no route") =>
        {
            Some(CoreError::Conflict(format!(
                "the agent of sandbox {id} predates port forwarding (it was started by an \
                 older Hutch): recreate the sandbox to reach its ports"
            )))
        }
        _ => None,
    }
}

impl AsyncRead for PortConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tunnel).poll_read(cx, buf)
    }
}

impl AsyncWrite for PortConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tunnel).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tunnel).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tunnel).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use hutch_proto::AgentError;

    use super::*;

    #[test]
    fn an_agent_without_tunnels_is_a_conflict_not_a_missing_sandbox() {
        let old = ClientError::Agent(AgentError::new(
            AgentErrorCode::NotFound,
            "no route POST /v1/tcp",
        ));
        let e = predates_tunnels("sbx_1", &old).expect("recognised");
        assert!(matches!(e, CoreError::Conflict(_)), "{e:?}");
        assert!(e.to_string().contains("recreate the sandbox"), "{e}");
        let refused = ClientError::Agent(AgentError::new(
            AgentErrorCode::ConnectionRefused,
            "nothing is listening on port 80",
        ));
        assert!(predates_tunnels("sbx_1", &refused).is_none());
    }

    #[test]
    fn ports_parse_from_1_to_65535() {
        assert_eq!(parse_port("1").ok(), Some(1));
        assert_eq!(parse_port("8080").ok(), Some(8080));
        assert_eq!(parse_port("65535").ok(), Some(65535));
        for bad in ["0", "65536", "-1", "80a", "", "99999999999"] {
            let e = parse_port(bad).expect_err(bad);
            assert_eq!(
                e.to_string(),
                format!("port must be a number from 1 to 65535, got {bad:?}")
            );
        }
    }
}
