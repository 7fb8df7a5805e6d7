//! Process handles from the host's side ([`crate::process`]): start one (its first
//! attacher is the starting call), list them, attach by pid or tag, and reach their stdin,
//! signals and terminal from any call.

use bytes::Bytes;
use futures_util::{Stream, TryStreamExt};
use http::Method;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::StreamBody;
use hyper::body::Frame;

use super::exec::{ExecEvent, ExecEvents, ExecSession};
use super::{empty_body, full_body, json_body, AgentClient, BoxError, ClientError, ClientResult};
use crate::{query, ExecRequest, ProcessInfo, ProcessList, ProcessSelector, PtySize, SignalFrame};

impl AgentClient {
    /// Start `request` as a process handle (its `handle` must be set) and wait for its
    /// `Started` frame. The session streams the process's output from its first byte; dropping
    /// it detaches without killing the process. A program that cannot be found or executed is
    /// [`ClientError::Agent`] (`command_not_found`, `permission_denied`), a duplicate tag
    /// `already_exists`.
    pub async fn start_process(&self, request: ExecRequest) -> ClientResult<(u32, ExecSession)> {
        if request.handle.is_none() {
            return Err(ClientError::Protocol(
                "start_process needs a request with `handle` set".into(),
            ));
        }
        let mut session = self.exec(request).await?;
        match session.events.next().await {
            Some(Ok(ExecEvent::Started { pid })) if session.events.started_as_handle => {
                Ok((pid, session))
            }
            Some(Ok(ExecEvent::Started { .. })) => Err(ClientError::Protocol(
                "the sandbox's agent predates process handles (its Started frame does not say \
                 \"handle\"); the process was not kept"
                    .into(),
            )),
            Some(Ok(ExecEvent::Error(e))) => Err(ClientError::Agent(e)),
            Some(Ok(other)) => Err(ClientError::Protocol(format!(
                "a process start answered {other:?} before Started"
            ))),
            Some(Err(e)) => Err(e),
            None => Err(ClientError::Protocol(
                "a process start ended without Started".into(),
            )),
        }
    }

    /// `GET /v1/processes`: live handles and the exited ones the agent still keeps.
    pub async fn list_processes(&self) -> ClientResult<ProcessList> {
        self.json_call(Method::GET, "/v1/processes", None).await
    }

    /// `GET /v1/processes/info`: one handle (`not_found` when the agent has none such).
    pub async fn process_info(&self, process: &ProcessSelector) -> ClientResult<ProcessInfo> {
        let uri = process_uri("info", process, &[]);
        self.json_call(Method::GET, &uri, None).await
    }

    /// `POST /v1/processes/attach`: the process's pid and its events from here on: with
    /// `replay`, what its ring still holds (preceded by [`ExecEvent::Missed`] when the ring
    /// dropped some), then live output, then its [`ExecEvent::Exit`] (at once for a process
    /// that has exited). Dropping the events detaches; the process keeps running.
    pub async fn attach_process(
        &self,
        process: &ProcessSelector,
        replay: bool,
    ) -> ClientResult<(u32, ExecEvents)> {
        let replay = if replay { "true" } else { "false" };
        let uri = process_uri("attach", process, &[("replay", replay)]);
        let response = self.call(Method::POST, &uri, empty_body()).await?;
        let mut events = ExecEvents::of_response(response.into_body());
        match events.next().await {
            Some(Ok(ExecEvent::Started { pid })) => Ok((pid, events)),
            Some(Ok(other)) => Err(ClientError::Protocol(format!(
                "an attach answered {other:?} before Started"
            ))),
            Some(Err(e)) => Err(e),
            None => Err(ClientError::Protocol("an attach ended at once".into())),
        }
    }

    /// `POST /v1/processes/input`: write `data` to the process's stdin (or type it into its
    /// terminal). Returns once the process has taken it all.
    pub async fn process_input(&self, process: &ProcessSelector, data: Bytes) -> ClientResult<()> {
        let uri = process_uri("input", process, &[]);
        self.call(Method::POST, &uri, full_body(data))
            .await
            .map(drop)
    }

    /// [`AgentClient::process_input`] from a stream of chunks, written as they arrive (no
    /// faster than the process reads). A chunk that is an error aborts the call; what was
    /// written stays written.
    pub async fn process_input_stream<S>(
        &self,
        process: &ProcessSelector,
        body: S,
    ) -> ClientResult<()>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        let body = StreamBody::new(
            body.map_ok(Frame::data)
                .map_err(|e| Box::new(e) as BoxError),
        );
        let uri = process_uri("input", process, &[]);
        self.call(Method::POST, &uri, UnsyncBoxBody::new(body))
            .await
            .map(drop)
    }

    /// `POST /v1/processes/close-stdin`: end of file on its stdin (`^D` on a terminal).
    pub async fn close_process_stdin(&self, process: &ProcessSelector) -> ClientResult<()> {
        let uri = process_uri("close-stdin", process, &[]);
        self.call(Method::POST, &uri, empty_body()).await.map(drop)
    }

    /// `POST /v1/processes/signal`: signal its process group (0 only checks it runs).
    pub async fn signal_process(&self, process: &ProcessSelector, signal: i32) -> ClientResult<()> {
        let uri = process_uri("signal", process, &[]);
        let body = json_body(&SignalFrame { signal });
        self.call(Method::POST, &uri, full_body(body))
            .await
            .map(drop)
    }

    /// `POST /v1/processes/resize`: set its terminal's size (`bad_request` without one).
    pub async fn resize_process(
        &self,
        process: &ProcessSelector,
        size: PtySize,
    ) -> ClientResult<()> {
        let uri = process_uri("resize", process, &[]);
        self.call(Method::POST, &uri, full_body(json_body(&size)))
            .await
            .map(drop)
    }
}

/// `/v1/processes/<route>?pid=N|tag=NAME[&extra…]`.
fn process_uri(route: &str, process: &ProcessSelector, extra: &[(&str, &str)]) -> String {
    let (key, value) = process.query_pair();
    let mut pairs = vec![(key, value.as_str())];
    pairs.extend_from_slice(extra);
    format!("/v1/processes/{route}?{}", query::build(&pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_carry_the_selector_encoded() {
        assert_eq!(
            process_uri("attach", &ProcessSelector::Pid(4), &[("replay", "false")]),
            "/v1/processes/attach?pid=4&replay=false"
        );
        assert_eq!(
            process_uri("info", &ProcessSelector::Tag("a b&c".into()), &[]),
            "/v1/processes/info?tag=a%20b%26c"
        );
    }
}
