//! An async QMP client over QEMU's unix socket.
//!
//! One command at a time: send `{"execute": ...}`, skip asynchronous events, return the
//! `return` value or a typed error. [`Qmp::getfd`] passes a file descriptor with
//! `SCM_RIGHTS`, which is how migration streams reach a QEMU that runs with
//! `-sandbox ...,spawn=deny` (no `exec:` URIs).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;

/// Why a QMP exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// The socket could not be reached in time.
    #[error("connect to QMP socket {path}: {source}")]
    Connect {
        /// The socket.
        path: String,
        /// The last cause.
        source: std::io::Error,
    },
    /// Reading or writing the socket failed.
    #[error("QMP socket: {0}")]
    Io(#[from] std::io::Error),
    /// QEMU closed the connection.
    #[error("QMP connection closed by QEMU")]
    Closed,
    /// A line that is not valid JSON.
    #[error("QMP sent invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// QEMU answered with an error.
    #[error("QMP {command} failed: {class}: {desc}")]
    Command {
        /// The command.
        command: String,
        /// QEMU's error class.
        class: String,
        /// QEMU's description.
        desc: String,
    },
    /// A migration ended in a state other than `completed`.
    #[error("migration {status}: {detail}")]
    Migration {
        /// The final status.
        status: String,
        /// QEMU's error description, if any.
        detail: String,
    },
    /// Waiting for a state took too long.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
}

/// How long [`Qmp::wait_port_closed`] waits for the agent to reopen its port once it saw
/// it closed (the agent reopens it 5 ms after a session ends).
const REOPEN_GRACE: Duration = Duration::from_millis(300);
/// Migration bandwidth for saves to a file (bytes per second): unlimited in practice.
const SAVE_BANDWIDTH: u64 = 1 << 40;
/// Downtime a save may take (ms): the guest is stopped anyway, so all of it.
const SAVE_DOWNTIME_MS: u64 = 600_000;

/// A connected QMP session in command mode.
#[derive(Debug)]
pub struct Qmp {
    stream: UnixStream,
    buf: Vec<u8>,
    /// Events read while waiting for replies, oldest first.
    events: std::collections::VecDeque<Value>,
}

impl Qmp {
    /// Connect to `path`, retrying until `timeout` (QEMU creates the socket shortly after
    /// it starts), read the greeting and enter command mode.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(path).await {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(QmpError::Connect {
                        path: path.display().to_string(),
                        source: e,
                    })
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        };
        let mut qmp = Self {
            stream,
            buf: Vec::new(),
            events: std::collections::VecDeque::new(),
        };
        let greeting = qmp.read_message().await?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Command {
                command: "greeting".into(),
                class: "Protocol".into(),
                desc: greeting.to_string(),
            });
        }
        qmp.execute("qmp_capabilities", None).await?;
        Ok(qmp)
    }

    async fn read_message(&mut self) -> Result<Value, QmpError> {
        loop {
            if let Some(n) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=n).collect();
                return Ok(serde_json::from_slice(&line)?);
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(QmpError::Closed);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn read_reply(&mut self, command: &str) -> Result<Value, QmpError> {
        loop {
            let msg = self.read_message().await?;
            if let Some(ret) = msg.get("return") {
                return Ok(ret.clone());
            }
            if let Some(err) = msg.get("error") {
                let field = |k: &str| err.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                return Err(QmpError::Command {
                    command: command.into(),
                    class: field("class"),
                    desc: field("desc"),
                });
            }
            tracing::debug!(event = %msg, "QMP event");
            if msg.get("event").is_some() {
                self.events.push_back(msg);
            }
        }
    }

    /// Forget the events seen so far (after reading whatever QEMU has sent up to now).
    pub async fn clear_events(&mut self) -> Result<(), QmpError> {
        self.execute("query-status", None).await?;
        self.events.clear();
        Ok(())
    }

    /// Wait until the guest has closed the virtio-serial port with device id `port` and
    /// opened it again since [`Qmp::clear_events`] (or the connection): the agent has ended
    /// its session with the host that hung up and waits for a new one. QEMU throttles
    /// `VSERPORT_CHANGE` to one per second per port, keeping the last, so a close and a
    /// quick reopen arrive as one `open: true` (up to a second late); any `open: true`
    /// after the hang-up means the port was closed and reopened. `false` when `timeout`
    /// passes first.
    pub async fn wait_port_reopened(
        &mut self,
        port: &str,
        timeout: Duration,
    ) -> Result<bool, QmpError> {
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(event) = self.events.pop_front() {
                if port_change(&event, port) == Some(true) {
                    return Ok(true);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.queue_next_event(left).await? {
                return Ok(false);
            }
        }
    }

    /// Read QEMU's next message within `within`, queueing it if it is an event; `false`
    /// when nothing came in time.
    async fn queue_next_event(&mut self, within: Duration) -> Result<bool, QmpError> {
        match tokio::time::timeout(within, self.read_message()).await {
            Ok(msg) => {
                let msg = msg?;
                if msg.get("event").is_some() {
                    self.events.push_back(msg);
                }
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    /// Wait until the guest has closed (or closed and reopened) the virtio-serial port with
    /// device id `port`, whose host side is chardev `chardev`, at or after `since`: the
    /// agent has ended its session with the host that hung up at `since`.
    ///
    /// Two signs, whichever comes first: `query-chardev` showing the port's frontend closed
    /// (QEMU sets it from the guest's open state at once; polled every millisecond or so,
    /// it can miss a close and quick reopen), and a `VSERPORT_CHANGE` event for the port.
    /// QEMU throttles that event to one per second per port, keeping the last, so it may
    /// come up to a second late and a close and reopen arrive as one `open: true`; events
    /// are told apart by QEMU's timestamp (taken when the port changed, also for a held-back
    /// event), so one of an earlier hang-up does not count. A close seen by polling is
    /// followed by a short wait for the reopen ([`REOPEN_GRACE`]); should the agent still
    /// have its port closed, a guest saved then reopens it when it runs again, and a host
    /// that connected meanwhile is served then (QEMU holds the host's bytes while the
    /// guest's port is closed). `false` when `timeout` passes first.
    pub async fn wait_port_closed(
        &mut self,
        port: &str,
        chardev: &str,
        since: std::time::SystemTime,
        timeout: Duration,
    ) -> Result<bool, QmpError> {
        let since_us = since
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(event) = self.events.pop_front() {
                if port_change(&event, port).is_some() && event_micros(&event) >= since_us {
                    return Ok(true);
                }
            }
            let open = self.chardev_open(chardev).await?;
            if open == Some(false) {
                // Closed: give the agent a moment to reopen it, so a copy of the guest does
                // not start with its port closed (its reopen would then show as an event
                // that a restore takes for a restarted session).
                let reopen_by = Instant::now() + REOPEN_GRACE;
                while Instant::now() < reopen_by {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    if self.chardev_open(chardev).await? == Some(true) {
                        break;
                    }
                }
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            // Events that arrive meanwhile are queued for the next turn.
            self.queue_next_event(left.min(Duration::from_millis(1)))
                .await?;
        }
    }

    /// Whether the frontend of chardev `label` (the guest's side of a virtio-serial port) is
    /// open, from `query-chardev`; `None` when there is no such chardev.
    async fn chardev_open(&mut self, label: &str) -> Result<Option<bool>, QmpError> {
        let chardevs = self.execute("query-chardev", None).await?;
        Ok(chardevs.as_array().and_then(|all| {
            all.iter()
                .find(|c| c.get("label").and_then(Value::as_str) == Some(label))
                .and_then(|c| c.get("frontend-open"))
                .and_then(Value::as_bool)
        }))
    }

    fn encode(command: &str, arguments: Option<Value>) -> Vec<u8> {
        let mut line = match arguments {
            Some(a) => json!({"execute": command, "arguments": a}),
            None => json!({"execute": command}),
        }
        .to_string()
        .into_bytes();
        line.push(b'\n');
        line
    }

    /// Run `command` and return its `return` value.
    pub async fn execute(
        &mut self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, QmpError> {
        self.stream
            .write_all(&Self::encode(command, arguments))
            .await?;
        self.read_reply(command).await
    }

    /// `getfd`: hand `fd` to QEMU under `name` (for `fd:NAME` migration URIs).
    pub async fn getfd(&mut self, name: &str, fd: BorrowedFd<'_>) -> Result<(), QmpError> {
        self.execute_with_fd("getfd", json!({"fdname": name}), fd)
            .await
            .map(drop)
    }

    /// `add-fd`: put `fd` into a new file descriptor set, which QEMU then opens by the path
    /// `/dev/fdset/<set>` (for commands that take a file name, not a descriptor). The
    /// descriptor's access mode must be the one QEMU opens the path with. Returns the set.
    pub async fn add_fd(&mut self, fd: BorrowedFd<'_>) -> Result<u64, QmpError> {
        let r = self.execute_with_fd("add-fd", json!({}), fd).await?;
        r.get("fdset-id")
            .and_then(Value::as_u64)
            .ok_or_else(|| QmpError::Command {
                command: "add-fd".into(),
                class: "reply".into(),
                desc: format!("no fdset-id in {r}"),
            })
    }

    /// `remove-fd`: close QEMU's descriptors in set `set`.
    pub async fn remove_fdset(&mut self, set: u64) -> Result<(), QmpError> {
        self.execute("remove-fd", Some(json!({"fdset-id": set})))
            .await
            .map(drop)
    }

    /// `xen-save-devices-state` (despite its name not tied to Xen): write the state of
    /// every device and vCPU, without RAM, to `path` as QEMU opens it. `live: false` keeps
    /// the disks active, so the guest can go on after it.
    pub async fn save_device_state(&mut self, path: &str) -> Result<(), QmpError> {
        self.execute(
            "xen-save-devices-state",
            Some(json!({"filename": path, "live": false})),
        )
        .await
        .map(drop)
    }

    /// Run `command` with `fd` passed along (`SCM_RIGHTS`).
    async fn execute_with_fd(
        &mut self,
        command: &str,
        arguments: Value,
        fd: BorrowedFd<'_>,
    ) -> Result<Value, QmpError> {
        let line = Self::encode(command, Some(arguments));
        let mut sent = 0;
        while sent == 0 {
            self.stream.writable().await?;
            match self
                .stream
                .try_io(Interest::WRITABLE, || send_with_fd(&self.stream, &line, fd))
            {
                Ok(n) => sent = n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.into()),
            }
        }
        // The descriptor went with the first bytes; the rest is plain data.
        self.stream.write_all(&line[sent..]).await?;
        self.read_reply(command).await
    }

    /// `stop`: pause the vCPUs.
    pub async fn stop(&mut self) -> Result<(), QmpError> {
        self.execute("stop", None).await.map(drop)
    }

    /// `cont`: resume the vCPUs.
    pub async fn cont(&mut self) -> Result<(), QmpError> {
        self.execute("cont", None).await.map(drop)
    }

    /// `block_resize`: grow the disk of block device `device` (a `-drive id=`) to `bytes`
    /// (a multiple of 512). A running guest is told through a virtio config change.
    pub async fn block_resize(&mut self, device: &str, bytes: u64) -> Result<(), QmpError> {
        self.execute(
            "block_resize",
            Some(json!({"device": device, "size": bytes})),
        )
        .await
        .map(drop)
    }

    /// The run state (`running`, `paused`, `inmigrate`, ...).
    pub async fn status(&mut self) -> Result<String, QmpError> {
        let r = self.execute("query-status", None).await?;
        Ok(r.get("status")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string())
    }

    /// Enable `x-ignore-shared`: RAM in a shared memory backend is not migrated.
    pub async fn set_ignore_shared(&mut self) -> Result<(), QmpError> {
        self.ignore_shared(true).await
    }

    /// Turn `x-ignore-shared` on or off. A stream saved with it on can only be loaded with
    /// it on, which refuses RAM pages for a shared memory backend; so streams meant to be
    /// loaded into a shared memory file (`share.rs`) are saved with it off.
    pub async fn ignore_shared(&mut self, on: bool) -> Result<(), QmpError> {
        let caps = json!({"capabilities": [{"capability": "x-ignore-shared", "state": on}]});
        self.execute("migrate-set-capabilities", Some(caps))
            .await
            .map(drop)
    }

    /// Start an outgoing migration to `uri` (e.g. `fd:NAME`). Every save here is of a
    /// stopped guest into a file, so QEMU's live-migration throttle (128 MiB/s by default,
    /// iterating until the rest fits in a 300 ms downtime) only slows it down: it is lifted
    /// first.
    pub async fn migrate(&mut self, uri: &str) -> Result<(), QmpError> {
        let unthrottled =
            json!({"max-bandwidth": SAVE_BANDWIDTH, "downtime-limit": SAVE_DOWNTIME_MS});
        self.execute("migrate-set-parameters", Some(unthrottled))
            .await?;
        self.execute("migrate", Some(json!({"uri": uri})))
            .await
            .map(drop)
    }

    /// Start an incoming migration from `uri` (QEMU must run with `-incoming defer`).
    pub async fn migrate_incoming(&mut self, uri: &str) -> Result<(), QmpError> {
        self.execute("migrate-incoming", Some(json!({"uri": uri})))
            .await
            .map(drop)
    }

    /// Poll `query-migrate` until the outgoing migration completes, then `query-status` until
    /// QEMU has finished it (left `finish-migrate`), so a `cont` may follow.
    pub async fn wait_migration(&mut self, timeout: Duration) -> Result<(), QmpError> {
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.execute("query-migrate", None).await?;
            let status = r.get("status").and_then(Value::as_str).unwrap_or("none");
            match status {
                // QEMU reports the migration completed a moment before it leaves the
                // `finish-migrate` run state; a `cont` in between fails ("Migration is not
                // finalized yet").
                "completed" => loop {
                    if self.status().await? != "finish-migrate" {
                        return Ok(());
                    }
                    if Instant::now() >= deadline {
                        return Err(QmpError::Timeout("migration cleanup"));
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                },
                "failed" | "cancelled" => {
                    let detail = r.get("error-desc").and_then(Value::as_str).unwrap_or("");
                    return Err(QmpError::Migration {
                        status: status.into(),
                        detail: detail.into(),
                    });
                }
                _ if Instant::now() >= deadline => return Err(QmpError::Timeout("migration")),
                _ => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    }

    /// Cancel an outgoing migration if one runs (`migrate_cancel`), and wait until QEMU is
    /// done with it (neither migrating nor in `finish-migrate`), so a `cont` may follow. A
    /// migration that already completed stays so (its guest is left in `postmigrate`).
    pub async fn cancel_migration(&mut self, timeout: Duration) -> Result<(), QmpError> {
        let deadline = Instant::now() + timeout;
        self.execute("migrate_cancel", None).await?;
        loop {
            let r = self.execute("query-migrate", None).await?;
            let migrating = matches!(
                r.get("status").and_then(Value::as_str),
                Some("setup" | "active" | "cancelling" | "pre-switchover" | "device")
            );
            if !migrating && self.status().await? != "finish-migrate" {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(QmpError::Timeout("migration cancel"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Poll `query-status` until the VM has left `inmigrate`; returns the new state.
    pub async fn wait_incoming(&mut self, timeout: Duration) -> Result<String, QmpError> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status().await?;
            match status.as_str() {
                "inmigrate" | "prelaunch" => {}
                "paused" | "running" | "postmigrate" => return Ok(status),
                _ => {
                    return Err(QmpError::Migration {
                        status,
                        detail: "incoming".into(),
                    });
                }
            }
            if Instant::now() >= deadline {
                return Err(QmpError::Timeout("incoming migration"));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// `quit`: QEMU exits (the connection then closes).
    pub async fn quit(&mut self) -> Result<(), QmpError> {
        match self.execute("quit", None).await {
            Ok(_) | Err(QmpError::Closed) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// When QEMU made `event` (its `timestamp`), in microseconds since the epoch; 0 without one.
/// `Some(open)` when `event` is a `VSERPORT_CHANGE` of the virtio-serial port `port`.
fn port_change(event: &Value, port: &str) -> Option<bool> {
    if event.get("event").and_then(Value::as_str) != Some("VSERPORT_CHANGE") {
        return None;
    }
    let data = event.get("data")?;
    if data.get("id").and_then(Value::as_str) != Some(port) {
        return None;
    }
    Some(data.get("open").and_then(Value::as_bool).unwrap_or(false))
}

fn event_micros(event: &Value) -> u128 {
    let field = |name: &str| {
        event
            .get("timestamp")
            .and_then(|t| t.get(name))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    u128::from(field("seconds")) * 1_000_000 + u128::from(field("microseconds"))
}

/// One `sendmsg` of `data` carrying `fd` as `SCM_RIGHTS`; returns the bytes sent.
fn send_with_fd(stream: &UnixStream, data: &[u8], fd: BorrowedFd<'_>) -> std::io::Result<usize> {
    let raw = fd.as_raw_fd();
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    // u64 words keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` bytes, enough for one cmsghdr with an int, so
    // CMSG_FIRSTHDR is non-null and CMSG_DATA points inside the buffer; the int write is
    // unaligned-safe via write_unaligned. `iov` and `control` outlive the sendmsg call,
    // which only reads `data` (never writes through iov_base).
    let n = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), raw);
        libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake QEMU on the other end of a socket pair: greeting, an event, replies.
    #[tokio::test]
    async fn commands_events_errors_and_fd_passing() {
        let (ours, theirs) = UnixStream::pair().expect("pair");
        let theirs = theirs.into_std().expect("std");
        let server = std::thread::spawn(move || {
            theirs.set_nonblocking(false).expect("blocking");
            let mut w = theirs.try_clone().expect("clone");
            let mut r = std::io::BufReader::new(theirs.try_clone().expect("clone"));
            use std::io::{BufRead, Write};
            let mut line = String::new();
            w.write_all(b"{\"QMP\": {\"version\": {}}}\n")
                .expect("greet");
            let mut seen = Vec::new();
            for reply in [
                "{\"return\": {}}\n",
                "{\"event\": \"STOP\"}\n{\"return\": {}}\n",
                "{\"error\": {\"class\": \"GenericError\", \"desc\": \"nope\"}}\n",
            ] {
                line.clear();
                r.read_line(&mut line).expect("read");
                seen.push(line.trim().to_string());
                w.write_all(reply.as_bytes()).expect("reply");
            }
            seen
        });
        let mut qmp = Qmp {
            stream: ours,
            buf: Vec::new(),
            events: Default::default(),
        };
        let greeting = qmp.read_message().await.expect("greeting");
        assert!(greeting.get("QMP").is_some());
        qmp.execute("qmp_capabilities", None).await.expect("caps");
        qmp.stop()
            .await
            .expect("stop with an event before the reply");
        let err = qmp.cont().await.expect_err("error reply");
        assert!(
            matches!(err, QmpError::Command { ref desc, .. } if desc == "nope"),
            "{err}"
        );
        let seen = server.join().expect("server");
        assert_eq!(seen[1], r#"{"execute":"stop"}"#);
        assert_eq!(qmp.events.len(), 1, "the STOP event is kept");
    }

    #[tokio::test]
    async fn waits_for_the_port_to_close_then_open() {
        let (ours, mut theirs) = UnixStream::pair().expect("pair");
        let mut qmp = Qmp {
            stream: ours,
            buf: Vec::new(),
            events: Default::default(),
        };
        let change = |id: &str, open: bool| {
            format!("{{\"event\": \"VSERPORT_CHANGE\", \"data\": {{\"id\": \"{id}\", \"open\": {open}}}}}\n")
        };
        // Another port, our port closing (not enough), an unrelated event, our port open.
        let script = [
            change("other", true),
            change("agent-port", false),
            "{\"event\": \"RESUME\"}\n".to_string(),
            change("agent-port", true),
        ]
        .concat();
        theirs.write_all(script.as_bytes()).await.expect("write");
        let seen = qmp
            .wait_port_reopened("agent-port", Duration::from_secs(5))
            .await
            .expect("read");
        assert!(seen);
        // Nothing more comes: a timeout is `false`, not an error.
        let again = qmp
            .wait_port_reopened("agent-port", Duration::from_millis(50))
            .await
            .expect("read");
        assert!(!again);
    }

    #[tokio::test]
    async fn a_port_close_shows_in_query_chardev_and_old_events_do_not_count() {
        let (ours, theirs) = UnixStream::pair().expect("pair");
        let theirs = theirs.into_std().expect("std");
        let since = std::time::SystemTime::now();
        let secs = since
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let server = std::thread::spawn(move || {
            theirs.set_nonblocking(false).expect("blocking");
            let mut w = theirs.try_clone().expect("clone");
            let mut r = std::io::BufReader::new(theirs);
            use std::io::{BufRead, Write};
            // An event of an earlier hang-up that QEMU held back: before `since`.
            let stale = format!(
                "{{\"event\": \"VSERPORT_CHANGE\", \"timestamp\": {{\"seconds\": {}, \"microseconds\": 0}}, \"data\": {{\"id\": \"agent-port\", \"open\": true}}}}\n",
                secs - 1
            );
            w.write_all(stale.as_bytes()).expect("event");
            let chardev = |open: bool| {
                format!("{{\"return\": [{{\"label\": \"other\", \"frontend-open\": false}}, {{\"label\": \"agent\", \"frontend-open\": {open}}}]}}\n")
            };
            // Open (the agent has not noticed yet), closed, open again.
            let mut asked = 0;
            let mut line = String::new();
            for open in [true, false, true] {
                line.clear();
                r.read_line(&mut line).expect("read");
                assert!(line.contains("query-chardev"), "{line}");
                asked += 1;
                w.write_all(chardev(open).as_bytes()).expect("reply");
            }
            asked
        });
        let mut qmp = Qmp {
            stream: ours,
            buf: Vec::new(),
            events: Default::default(),
        };
        let closed = qmp
            .wait_port_closed("agent-port", "agent", since, Duration::from_secs(5))
            .await
            .expect("wait");
        assert!(closed);
        assert_eq!(server.join().expect("server"), 3, "polled until reopened");
    }

    #[tokio::test]
    async fn getfd_passes_a_descriptor() {
        use std::os::fd::{AsFd, FromRawFd, OwnedFd};
        let (ours, theirs) = UnixStream::pair().expect("pair");
        let file = tempfile::tempfile().expect("tempfile");
        let sent = send_with_fd(&ours, b"x", file.as_fd()).expect("send");
        assert_eq!(sent, 1);
        theirs.readable().await.expect("readable");
        let mut byte = [0u8; 1];
        let mut space = vec![0u64; 8];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        // SAFETY: test-only recvmsg into local buffers that outlive the call.
        let received = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = space.as_mut_ptr().cast();
            msg.msg_controllen = 64;
            assert_eq!(libc::recvmsg(theirs.as_raw_fd(), &mut msg, 0), 1);
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            assert!(!cmsg.is_null());
            assert_eq!((*cmsg).cmsg_type, libc::SCM_RIGHTS);
            OwnedFd::from_raw_fd(std::ptr::read_unaligned(
                libc::CMSG_DATA(cmsg).cast::<i32>(),
            ))
        };
        assert_ne!(received.as_raw_fd(), file.as_raw_fd());
    }
}
