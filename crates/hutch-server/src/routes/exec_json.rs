//! The JSON answer of a collected exec, written piece by piece from its one copy of the
//! output: `stdout`/`stderr` as (lossy) UTF-8 text and, when a stream is not valid UTF-8,
//! `stdout_b64`/`stderr_b64` with its exact bytes. No view of the output is ever held whole:
//! each piece is rendered when the response body asks for it, and the outcome (with its
//! share of the output budget) is dropped when the body is done or the client goes away.

use base64::Engine;
use bytes::Bytes;
use hutch_core::exec::ExecOutcome;
use hutch_core::output::OutputChunks;

/// Output bytes rendered per piece (a multiple of 3, so base64 pieces join unpadded).
const PIECE: usize = 48 * 1024;

/// Where a renderer is in a stream's chunks.
#[derive(Debug, Default, Clone, Copy)]
struct Cursor {
    chunk: usize,
    offset: usize,
}

impl Cursor {
    /// The next at most `max` bytes (within one chunk), or `None` at the end.
    fn take<'a>(&mut self, out: &'a OutputChunks, max: usize) -> Option<&'a [u8]> {
        loop {
            let chunk = out.chunks().get(self.chunk)?;
            if self.offset < chunk.len() {
                let end = chunk.len().min(self.offset + max);
                let slice = &chunk[self.offset..end];
                self.offset = end;
                return Some(slice);
            }
            self.chunk += 1;
            self.offset = 0;
        }
    }

    fn at_end(&self, out: &OutputChunks) -> bool {
        out.chunks()
            .iter()
            .enumerate()
            .skip(self.chunk)
            .all(|(i, c)| {
                if i == self.chunk {
                    self.offset >= c.len()
                } else {
                    c.is_empty()
                }
            })
    }
}

/// Index where `buf` may be cut so no UTF-8 decoding unit spans the cut: the last byte that
/// is not a continuation byte among the last four (a unit starts at every such byte, and
/// is at most four bytes long); the whole buffer if the last four are all continuations.
fn utf8_cut(buf: &[u8]) -> usize {
    let from = buf.len().saturating_sub(4);
    (from..buf.len())
        .rev()
        .find(|&i| buf[i] & 0xC0 != 0x80)
        .unwrap_or(buf.len())
}

/// The lossy UTF-8 text of `buf`, JSON-escaped (no quotes); whether anything was replaced.
fn escaped_text(buf: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::with_capacity(buf.len() + 16);
    let mut lossy = false;
    for piece in buf.utf8_chunks() {
        if !piece.valid().is_empty() {
            let quoted = serde_json::to_vec(piece.valid()).unwrap_or_default();
            out.extend_from_slice(&quoted[1..quoted.len() - 1]);
        }
        if !piece.invalid().is_empty() {
            out.extend_from_slice(
                char::REPLACEMENT_CHARACTER
                    .encode_utf8(&mut [0; 4])
                    .as_bytes(),
            );
            lossy = true;
        }
    }
    (out, lossy)
}

/// How a view renders a stream's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// Lossy UTF-8 text, JSON-escaped.
    Text,
    /// Standard base64 (pieces of whole 3-byte groups join unpadded).
    Base64,
}

impl Encoding {
    /// Where `buf` may be cut so the rest can wait for the next piece.
    fn cut(self, buf: &[u8]) -> usize {
        match self {
            Encoding::Text => utf8_cut(buf),
            Encoding::Base64 => buf.len() - buf.len() % 3,
        }
    }

    /// `buf` rendered; whether anything was replaced (lossy text).
    fn render(self, buf: &[u8]) -> (Vec<u8>, bool) {
        match self {
            Encoding::Text => escaped_text(buf),
            Encoding::Base64 => (
                base64::engine::general_purpose::STANDARD
                    .encode(buf)
                    .into_bytes(),
                false,
            ),
        }
    }
}

/// Renders one stream in one encoding, piece by piece.
#[derive(Debug)]
struct View {
    encoding: Encoding,
    cursor: Cursor,
    carry: Vec<u8>,
    lossy: bool,
}

impl View {
    fn new(encoding: Encoding) -> Self {
        Self {
            encoding,
            cursor: Cursor::default(),
            carry: Vec::new(),
            lossy: false,
        }
    }

    fn next(&mut self, out: &OutputChunks) -> Option<Bytes> {
        loop {
            let slice = self.cursor.take(out, PIECE);
            if slice.is_none() && self.carry.is_empty() {
                return None;
            }
            let mut buf = std::mem::take(&mut self.carry);
            buf.extend_from_slice(slice.unwrap_or_default());
            if !self.cursor.at_end(out) {
                let cut = self.encoding.cut(&buf);
                self.carry = buf.split_off(cut);
            }
            if buf.is_empty() {
                continue;
            }
            let (rendered, lossy) = self.encoding.render(&buf);
            self.lossy |= lossy;
            return Some(Bytes::from(rendered));
        }
    }
}

/// What comes next in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Head,
    StdoutText,
    StdoutBase64,
    StderrText,
    StderrBase64,
    Done,
}

/// The answer's pieces, produced on demand (an iterator of body chunks).
pub struct ExecJson {
    outcome: ExecOutcome,
    stage: Stage,
    text: View,
    base64: View,
}

impl ExecJson {
    /// The answer for `outcome` (which it keeps, lease and all, until dropped).
    pub fn new(outcome: ExecOutcome) -> Self {
        Self {
            outcome,
            stage: Stage::Head,
            text: View::new(Encoding::Text),
            base64: View::new(Encoding::Base64),
        }
    }

    /// The literal between the end of a text view and what follows it.
    fn after_text(&mut self, name: &str, next_stage: Stage) -> Bytes {
        let lossy = self.text.lossy;
        self.text = View::new(Encoding::Text);
        if lossy {
            self.stage = next_stage;
            Bytes::from(format!("\",\"{name}_b64\":\""))
        } else {
            self.stage = if name == "stdout" {
                Stage::StderrText
            } else {
                Stage::Done
            };
            Bytes::from(if name == "stdout" {
                "\",\"stderr\":\"".to_string()
            } else {
                "\"}".to_string()
            })
        }
    }
}

impl Iterator for ExecJson {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let stage = self.stage;
        match stage {
            Stage::Head => {
                // The small fields; the streams go inside the same object after them.
                let mut head = serde_json::to_vec(&self.outcome).unwrap_or_else(|_| b"{}".to_vec());
                head.pop();
                if head.len() > 1 {
                    head.push(b',');
                }
                head.extend_from_slice(b"\"stdout\":\"");
                self.stage = Stage::StdoutText;
                Some(Bytes::from(head))
            }
            Stage::StdoutText | Stage::StderrText => {
                let out = match stage {
                    Stage::StdoutText => &self.outcome.stdout,
                    _ => &self.outcome.stderr,
                };
                self.text.next(out).or_else(|| {
                    Some(if stage == Stage::StdoutText {
                        self.after_text("stdout", Stage::StdoutBase64)
                    } else {
                        self.after_text("stderr", Stage::StderrBase64)
                    })
                })
            }
            Stage::StdoutBase64 | Stage::StderrBase64 => {
                let out = match stage {
                    Stage::StdoutBase64 => &self.outcome.stdout,
                    _ => &self.outcome.stderr,
                };
                if let Some(piece) = self.base64.next(out) {
                    return Some(piece);
                }
                self.base64 = View::new(Encoding::Base64);
                if stage == Stage::StdoutBase64 {
                    self.stage = Stage::StderrText;
                    Some(Bytes::from_static(b"\",\"stderr\":\""))
                } else {
                    self.stage = Stage::Done;
                    Some(Bytes::from_static(b"\"}"))
                }
            }
            Stage::Done => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(parts: &[&[u8]]) -> OutputChunks {
        OutputChunks::from_chunks(parts.iter().map(|p| Bytes::copy_from_slice(p)).collect())
    }

    fn render_text(out: &OutputChunks) -> (String, bool) {
        let mut view = View::new(Encoding::Text);
        let mut s = Vec::new();
        while let Some(p) = view.next(out) {
            s.extend_from_slice(&p);
        }
        (String::from_utf8(s).expect("utf-8"), view.lossy)
    }

    fn pseudo_random(n: usize, seed: u32) -> Vec<u8> {
        let mut x = seed.max(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                // Bias towards UTF-8 lead and continuation bytes to exercise sequences.
                match x % 4 {
                    0 => 0x80 | (x >> 8) as u8 & 0x3F,
                    1 => 0xC0 | (x >> 8) as u8 & 0x3F,
                    2 => b'a' + (x >> 8) as u8 % 26,
                    _ => (x >> 8) as u8,
                }
            })
            .collect()
    }

    #[test]
    fn text_in_pieces_equals_lossy_text_of_the_whole() {
        for seed in 1..40u32 {
            let data = pseudo_random(300_000 + seed as usize * 7, seed);
            // Cut into chunks of awkward sizes.
            let mut parts: Vec<&[u8]> = Vec::new();
            let mut rest = &data[..];
            let mut k = seed as usize;
            while !rest.is_empty() {
                let n = (k * 7919 % 70_001 + 1).min(rest.len());
                parts.push(&rest[..n]);
                rest = &rest[n..];
                k += 1;
            }
            let out = chunks(&parts);
            let (text, lossy) = render_text(&out);
            let expected = String::from_utf8_lossy(&data);
            let escaped = serde_json::to_string(&expected).expect("json");
            assert_eq!(text, escaped[1..escaped.len() - 1], "seed {seed}");
            assert_eq!(lossy, std::str::from_utf8(&data).is_err());
        }
    }

    #[test]
    fn a_character_split_across_chunks_survives() {
        let out = chunks(&[b"a\xE2\x82", b"\xACb"]);
        assert_eq!(render_text(&out), ("a€b".to_string(), false));
    }

    #[test]
    fn base64_in_pieces_equals_base64_of_the_whole() {
        let data = pseudo_random(200_003, 9);
        let parts: Vec<&[u8]> = data.chunks(65_537).collect();
        let out = chunks(&parts);
        let mut view = View::new(Encoding::Base64);
        let mut s = String::new();
        while let Some(p) = view.next(&out) {
            s.push_str(std::str::from_utf8(&p).expect("ascii"));
        }
        assert_eq!(s, base64::engine::general_purpose::STANDARD.encode(&data));
    }

    fn answer(stdout: &[u8], stderr: &[u8]) -> serde_json::Value {
        let outcome = ExecOutcome {
            stdout: OutputChunks::from(stdout),
            stderr: OutputChunks::from(stderr),
            lease: None,
            exit_code: 3,
            timed_out: false,
            duration_ms: 5,
            stdout_truncated: false,
            stderr_truncated: true,
            oom_killed: false,
        };
        let body: Vec<u8> = ExecJson::new(outcome).flatten().collect();
        serde_json::from_slice(&body).expect("valid JSON")
    }

    #[test]
    fn the_answer_has_text_and_base64_only_where_needed() {
        let v = answer(b"hi \"there\"\n\0", b"\xFFbad");
        assert_eq!(v["stdout"], "hi \"there\"\n\0");
        assert!(v.get("stdout_b64").is_none());
        assert_eq!(v["stderr"], "\u{FFFD}bad");
        assert_eq!(v["stderr_b64"], "/2JhZA==");
        assert_eq!(v["exit_code"], 3);
        assert_eq!(v["stderr_truncated"], true);
        let empty = answer(b"", b"");
        assert_eq!(empty["stdout"], "");
        assert_eq!(empty["stderr"], "");
    }
}
