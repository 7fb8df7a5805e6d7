//! Pseudo-terminals for PTY execs.
//!
//! The master stays in the agent (non-blocking, close-on-exec); the slave becomes the
//! child's fds 0, 1, 2 and, after `setsid`, its controlling terminal. The slave is opened
//! through `TIOCGPTPEER` where the kernel has it (no path lookup, so it works in any mount
//! namespace), else through `ptsname`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use hutch_proto::PtySize;

use crate::sys::{ioctl_int, ioctl_out, ioctl_ptr, open};

/// A new terminal pair.
#[derive(Debug)]
pub struct Pty {
    /// The agent's side: reads give the terminal's output, writes are typed input.
    pub master: OwnedFd,
    /// The process's side.
    pub slave: OwnedFd,
}

/// Open a PTY pair of the given size.
pub fn open_pty(size: PtySize) -> io::Result<Pty> {
    let master = open(c"/dev/ptmx", libc::O_RDWR | libc::O_NOCTTY)?;
    // unlockpt: allow opening the slave.
    let unlock: libc::c_int = 0;
    ioctl_ptr(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock)?;
    let slave = match ioctl_int(
        master.as_raw_fd(),
        libc::TIOCGPTPEER,
        libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
    ) {
        // SAFETY: the ioctl returned a new fd that nobody else owns.
        Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
        Err(_) => open(
            &slave_path(master.as_raw_fd())?,
            libc::O_RDWR | libc::O_NOCTTY,
        )?,
    };
    resize(master.as_raw_fd(), size)?;
    Ok(Pty { master, slave })
}

fn slave_path(master: RawFd) -> io::Result<CString> {
    let mut number: libc::c_uint = 0;
    ioctl_out(master, libc::TIOCGPTN, &mut number)?;
    CString::new(format!("/dev/pts/{number}"))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Set the terminal size (the kernel sends `SIGWINCH` to the foreground process group).
pub fn resize(master: RawFd, size: PtySize) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    ioctl_ptr(master, libc::TIOCSWINSZ, &ws)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_a_pair_with_the_requested_size() {
        let pty = open_pty(PtySize {
            cols: 101,
            rows: 33,
        })
        .expect("pty");
        let mut ws = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        ioctl_out(pty.slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws).expect("TIOCGWINSZ");
        assert_eq!((ws.ws_col, ws.ws_row), (101, 33));
    }
}
