//! `serve --serial PATH`: the protocol over a character device, as on the `vm` backend's
//! virtio-serial port. A raw-mode PTY stands in for the port: the agent opens the slave by
//! path, the test speaks through the master.

mod common;

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::{argv, request};
use hutch_proto::client::AgentClient;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The host's end of the stand-in port.
struct Port {
    master: OwnedFd,
    // Kept open so the terminal (and its raw mode) outlives the agent's reopening.
    _slave: OwnedFd,
    slave_path: String,
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn open_port() -> Port {
    // SAFETY: plain syscalls on fds we own; buffers are sized as the calls require.
    unsafe {
        let master = check(libc::posix_openpt(
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ))
        .expect("posix_openpt");
        let master = OwnedFd::from_raw_fd(master);
        check(libc::grantpt(master.as_raw_fd())).expect("grantpt");
        check(libc::unlockpt(master.as_raw_fd())).expect("unlockpt");
        let mut name = [0 as libc::c_char; 64];
        assert_eq!(
            libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()),
            0
        );
        let slave_path = CStr::from_ptr(name.as_ptr())
            .to_str()
            .expect("utf-8")
            .to_string();
        let slave = check(libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ))
        .expect("open the slave");
        let slave = OwnedFd::from_raw_fd(slave);
        // A serial port carries bytes, not lines: no echo, no translation, no signals.
        let mut tio: libc::termios = std::mem::zeroed();
        check(libc::tcgetattr(slave.as_raw_fd(), &mut tio)).expect("tcgetattr");
        libc::cfmakeraw(&mut tio);
        check(libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &tio)).expect("tcsetattr");
        Port {
            master,
            _slave: slave,
            slave_path,
        }
    }
}

impl Port {
    /// A non-blocking duplicate of the master for one connection.
    fn connection(&self) -> MasterIo {
        let dup = self.master.try_clone().expect("dup");
        // SAFETY: F_GETFL/F_SETFL on an fd we own.
        unsafe {
            let flags = check(libc::fcntl(dup.as_raw_fd(), libc::F_GETFL)).expect("getfl");
            check(libc::fcntl(
                dup.as_raw_fd(),
                libc::F_SETFL,
                flags | libc::O_NONBLOCK,
            ))
            .expect("setfl");
        }
        // SAFETY: the OwnedFd moves into the AsyncFd, so the descriptor stays open and the
        // same for the AsyncFd's whole life.
        MasterIo(unsafe { AsyncFd::register(dup) }.expect("register"))
    }

    /// Throw away whatever the agent wrote to an earlier connection.
    fn drain(&self) {
        let io = self.connection();
        let mut buf = [0u8; 4096];
        // SAFETY: reading into a stack buffer of the stated length.
        while unsafe { libc::read(io.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
    }
}

struct MasterIo(AsyncFd<OwnedFd>);

impl AsyncRead for MasterIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let result = guard.try_io(|fd| {
                // SAFETY: reading into the unfilled part of the caller's buffer.
                let n = unsafe {
                    libc::read(fd.as_raw_fd(), unfilled.as_mut_ptr().cast(), unfilled.len())
                };
                usize::try_from(n).map_err(|_| io::Error::last_os_error())
            });
            match result {
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

impl AsyncWrite for MasterIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            let result = guard.try_io(|fd| {
                // SAFETY: the kernel only reads `buf` within its length.
                let n = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
                usize::try_from(n).map_err(|_| io::Error::last_os_error())
            });
            match result {
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

#[tokio::test]
async fn the_protocol_runs_over_a_character_device() {
    let port = open_port();
    let agent = common::TestAgent::start_with_args(&["serve", "--serial", &port.slave_path]).await;
    let client = AgentClient::handshake(port.connection())
        .await
        .expect("handshake over the port");
    let info = client.info().await.expect("info");
    assert_eq!(info.pid, agent.pid());
    let out = client
        .exec_collect(request(argv(&["echo", "over serial"])), None, 1024)
        .await
        .expect("exec");
    assert_eq!(&out.stdout[..], b"over serial\n");
    // Binary data of every byte value passes untouched.
    let data: Bytes = (0..=255u8)
        .cycle()
        .take(1 << 20)
        .collect::<Vec<u8>>()
        .into();
    let path = agent.path("serial.bin");
    client
        .write_file_bytes(&path, None, data.clone())
        .await
        .expect("write");
    let back = client
        .read_file(&path)
        .await
        .expect("read")
        .collect_bytes(2 << 20)
        .await
        .expect("bytes");
    assert!(back == data, "the file came back different");

    // The host goes away and comes back (a server restart): the agent starts over.
    drop(client);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let client = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no new connection; agent log:\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        port.drain();
        let Ok(client) = AgentClient::handshake(port.connection()).await else {
            continue;
        };
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), client.info()).await {
            break client;
        }
    };
    let out = client
        .exec_collect(request(argv(&["echo", "again"])), None, 1024)
        .await
        .expect("exec after reconnecting");
    assert_eq!(&out.stdout[..], b"again\n");
}
