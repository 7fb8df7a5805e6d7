//! What a create is waiting for: while `hutch create` or `hutch run` waits for a sandbox, the
//! server's `sandbox.preparing` events (a vm create building the guest kernel, a template's
//! disk image or its baked snapshot on first use) are printed to stderr.

use futures_util::StreamExt;
use reqwest::Method;

use crate::client::Api;

/// Subscribe to the server's events (before the create is sent, so nothing is missed) and
/// print `sandbox.preparing` ones until the returned task is aborted. `None` when the
/// subscription fails: progress is a courtesy, never a reason to fail a create.
pub async fn watch(api: &Api) -> Option<tokio::task::JoinHandle<()>> {
    let resp = api.raw(Method::GET, "/v1/events", None, None).await.ok()?;
    Some(tokio::spawn(async move {
        let mut stream = resp.bytes_stream();
        let mut pending = String::new();
        while let Some(Ok(chunk)) = stream.next().await {
            pending.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = pending.find('\n') {
                let line: String = pending.drain(..=end).collect();
                if let Some(detail) = preparing_detail(line.trim_end()) {
                    eprintln!("hutch: {detail}");
                }
            }
        }
    }))
}

/// The detail of a `sandbox.preparing` event from one SSE `data:` line.
fn preparing_detail(line: &str) -> Option<String> {
    let data = line.strip_prefix("data:")?.trim_start();
    let event: serde_json::Value = serde_json::from_str(data).ok()?;
    (event["type"] == "sandbox.preparing")
        .then(|| event["detail"].as_str().map(String::from))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::preparing_detail;

    #[test]
    fn only_preparing_events_are_shown() {
        let line = r#"data: {"type":"sandbox.preparing","sandbox_id":"sbx_a","at":"x","detail":"baking…"}"#;
        assert_eq!(preparing_detail(line).as_deref(), Some("baking…"));
        let other = r#"data: {"type":"sandbox.created","sandbox_id":"sbx_a","at":"x"}"#;
        assert_eq!(preparing_detail(other), None);
        assert_eq!(preparing_detail("event: sandbox.preparing"), None);
        assert_eq!(preparing_detail(": keep-alive"), None);
    }
}
