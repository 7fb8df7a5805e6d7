//! Non-blocking I/O on raw file descriptors (pipes, PTY masters, serial ports) through the
//! tokio reactor.
//!
//! `tokio::net::unix::pipe` only accepts FIFOs; a PTY master and a virtio-serial port are
//! character devices, so the agent uses this one small wrapper for all of them.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::sys::set_nonblocking;

/// An fd registered with the reactor, read and written without blocking the runtime.
#[derive(Debug)]
pub struct FdIo {
    fd: AsyncFd<OwnedFd>,
}

impl FdIo {
    /// Make `fd` non-blocking and register it.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        set_nonblocking(fd.as_raw_fd(), true)?;
        // SAFETY: the OwnedFd is moved into the AsyncFd, so the descriptor stays open and
        // refers to the same file for the AsyncFd's whole life; OwnedFd::as_raw_fd always
        // returns that one descriptor.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)?;
        Ok(Self { fd })
    }

    /// Read some bytes; `Ok(0)` at end of file.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| raw_read(fd.as_raw_fd(), buf)) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Read what is there right now without waiting (`WouldBlock` when nothing is).
    pub fn read_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        raw_read(self.fd.get_ref().as_raw_fd(), buf)
    }

    /// Write all of `buf`.
    pub async fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| raw_write(fd.as_raw_fd(), buf)) {
                Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(Ok(n)) => buf = &buf[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }
}

impl AsRawFd for FdIo {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.get_ref().as_raw_fd()
    }
}

fn raw_read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the pointer and length describe `buf`, which the kernel fills.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    byte_count(n)
}

fn raw_write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: the pointer and length describe `buf`, which the kernel only reads.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    byte_count(n)
}

fn byte_count(n: isize) -> io::Result<usize> {
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

impl AsyncRead for FdIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| raw_read(fd.as_raw_fd(), unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for FdIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|fd| raw_write(fd.as_raw_fd(), buf)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pipe_round_trip_and_eof() {
        let (r, w) = crate::sys::pipe().expect("pipe");
        let (r, w) = (
            FdIo::new(r).expect("register"),
            FdIo::new(w).expect("register"),
        );
        let writer = tokio::spawn(async move {
            w.write_all(&vec![7u8; 300_000]).await.expect("write");
        });
        let mut total = 0;
        let mut buf = vec![0u8; 65536];
        loop {
            let n = r.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            assert!(buf[..n].iter().all(|&b| b == 7));
            total += n;
        }
        writer.await.expect("writer");
        assert_eq!(total, 300_000);
    }
}
