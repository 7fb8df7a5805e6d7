//! Reading `text/event-stream` responses (exec streams).

use futures_util::StreamExt;

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// `event:` field.
    pub event: String,
    /// `data:` lines joined with newlines.
    pub data: String,
}

/// Incremental SSE parser.
#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
    event: String,
    data: Vec<String>,
}

impl SseParser {
    /// Feed bytes; returns the events completed by them.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() || !self.event.is_empty() {
                    out.push(SseEvent {
                        event: std::mem::take(&mut self.event),
                        data: std::mem::take(&mut self.data).join("\n"),
                    });
                }
            } else if let Some(v) = line.strip_prefix("event:") {
                self.event = v.trim_start().to_string();
            } else if let Some(v) = line.strip_prefix("data:") {
                self.data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
            }
        }
        out
    }
}

/// Drive an SSE response, calling `on_event` for each event; stops when it returns false.
pub async fn for_each_event(
    resp: reqwest::Response,
    mut on_event: impl FnMut(SseEvent) -> bool,
) -> anyhow::Result<()> {
    let mut parser = SseParser::default();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        for ev in parser.push(&chunk?) {
            if !on_event(ev) {
                return Ok(());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_split_anywhere() {
        let wire =
            b"event: stdout\ndata: {\"data\":\"hi\"}\n\n:keepalive\n\nevent: exit\ndata: {}\n\n";
        for split in 0..wire.len() {
            let mut p = SseParser::default();
            let mut evs = p.push(&wire[..split]);
            evs.extend(p.push(&wire[split..]));
            assert_eq!(evs.len(), 2, "split {split}");
            assert_eq!(evs[0].event, "stdout");
            assert_eq!(evs[0].data, "{\"data\":\"hi\"}");
            assert_eq!(evs[1].event, "exit");
        }
    }
}
