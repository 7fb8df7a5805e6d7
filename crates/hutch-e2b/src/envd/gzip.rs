//! gzip as streams, for `/files`: uploads with `Content-Encoding: gzip` are inflated as they
//! arrive, downloads asked with `Accept-Encoding: gzip` are deflated as they leave. Neither
//! holds more than a chunk: flate2's `write` coders fill a `Vec` that is handed on whenever
//! it reaches [`OUT_CHUNK`], and an input chunk is fed in small slices, so however well a
//! chunk compresses (a gzip bomb inflates ~1000×) the output held per step stays bounded.

use std::io::Write;

use bytes::Bytes;
use flate2::write::{GzDecoder, GzEncoder};
use flate2::Compression;
use futures_util::{Stream, StreamExt};

/// Output handed on once a coder has this much (64 KiB).
const OUT_CHUNK: usize = 64 << 10;
/// Input fed to a coder per write (4 KiB: at most ~4 MiB of output even at deflate's
/// largest ratio, and in practice flate2's 32 KiB buffer per write).
const IN_SLICE: usize = 4 << 10;

/// The coder of a stream: flate2's `write` decoder or encoder, into a `Vec`.
trait Coder: Write + Send + Unpin + 'static {
    fn out(&mut self) -> &mut Vec<u8>;
    fn finish_stream(&mut self) -> std::io::Result<()>;
}

impl Coder for GzDecoder<Vec<u8>> {
    fn out(&mut self) -> &mut Vec<u8> {
        self.get_mut()
    }
    fn finish_stream(&mut self) -> std::io::Result<()> {
        self.try_finish()
    }
}

impl Coder for GzEncoder<Vec<u8>> {
    fn out(&mut self) -> &mut Vec<u8> {
        self.get_mut()
    }
    fn finish_stream(&mut self) -> std::io::Result<()> {
        self.try_finish()
    }
}

/// The gzip stream `input` inflated. A corrupt or truncated stream ends with an error (so
/// the agent's write is aborted, not a short file kept as complete).
pub fn inflate<S, E>(input: S) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display,
{
    code(input, GzDecoder::new(Vec::new()))
}

/// `input` deflated as one gzip member (level 1: the server's CPU is shared by every
/// sandbox, and a download is usually network-bound).
pub fn deflate<S, E>(input: S) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display,
{
    code(input, GzEncoder::new(Vec::new(), Compression::fast()))
}

struct State<S, C> {
    input: S,
    coder: C,
    pending: Bytes,
    done: bool,
}

fn code<S, E, C>(input: S, coder: C) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display,
    C: Coder,
{
    let state = State {
        input,
        coder,
        pending: Bytes::new(),
        done: false,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        match step(&mut st).await {
            Ok(Some(chunk)) => Some((Ok(chunk), st)),
            Ok(None) => None,
            Err(e) => {
                st.done = true;
                Some((Err(e), st))
            }
        }
    })
}

/// The next output chunk of `st` (`None` at the end).
async fn step<S, E, C>(st: &mut State<S, C>) -> std::io::Result<Option<Bytes>>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
    C: Coder,
{
    loop {
        if st.coder.out().len() >= OUT_CHUNK {
            return Ok(Some(Bytes::from(std::mem::take(st.coder.out()))));
        }
        if !st.pending.is_empty() {
            let n = st.pending.len().min(IN_SLICE);
            let used = st.coder.write(&st.pending[..n])?;
            if used == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "data after the end of the gzip stream",
                ));
            }
            let _ = st.pending.split_to(used);
            continue;
        }
        match st.input.next().await {
            Some(Ok(chunk)) => st.pending = chunk,
            Some(Err(e)) => return Err(std::io::Error::other(e.to_string())),
            None => {
                st.coder.finish_stream()?;
                st.done = true;
                let rest = std::mem::take(st.coder.out());
                return Ok((!rest.is_empty()).then(|| Bytes::from(rest)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(s: impl Stream<Item = std::io::Result<Bytes>>) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut s = std::pin::pin!(s);
        while let Some(chunk) = s.next().await {
            let chunk = chunk?;
            assert!(chunk.len() <= 2 * OUT_CHUNK, "a chunk of {}", chunk.len());
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    fn chunks(data: &[u8], size: usize) -> impl Stream<Item = Result<Bytes, String>> + Unpin {
        let parts: Vec<_> = data
            .chunks(size)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures_util::stream::iter(parts)
    }

    #[tokio::test]
    async fn round_trips_in_bounded_chunks_and_refuses_truncation() {
        // 8 MiB of zeros compress ~1000×: one input chunk holds all of it.
        let data = vec![0u8; 8 << 20];
        let packed = collect(deflate(chunks(&data, 1 << 20)))
            .await
            .expect("deflate");
        assert!(packed.len() < data.len() / 100, "{}", packed.len());
        let unpacked = collect(inflate(chunks(&packed, 1 << 20)))
            .await
            .expect("inflate");
        assert!(unpacked == data);
        let cut = &packed[..packed.len() / 2];
        assert!(collect(inflate(chunks(cut, 7))).await.is_err());
        assert!(collect(inflate(chunks(b"not gzip at all", 4)))
            .await
            .is_err());
    }
}
