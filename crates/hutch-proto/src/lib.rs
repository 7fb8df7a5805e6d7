//! The agent protocol: how the host talks to `hutch-agent`, PID 1 inside every sandbox.
//!
//! # Transport
//! One byte stream per sandbox (a unix socket on the host for `ns`, a virtio-serial port for
//! `vm`) carries **HTTP/2 with prior knowledge** (h2c). HTTP/2 multiplexes any number of
//! concurrent calls (execs, PTYs, file transfers) over that single stream, and the same agent
//! code serves every backend. The full contract is documented in `docs/agent-protocol.md`;
//! this crate is its machine-checked definition.
//!
//! # Versioning
//! [`PROTOCOL_VERSION`] is reported by `GET /v1/info`. A host refuses an agent whose version
//! differs from its own. New optional fields, error codes and routes may be added without a
//! bump; renaming, removing or retyping a field, changing a meaning, or adding a frame kind
//! bumps it.
//!
//! # Routes served by the agent
//! | method | path | request | response |
//! |---|---|---|---|
//! | GET | `/v1/info` | – | [`AgentInfo`] JSON |
//! | POST | `/v1/exec` | frames: one [`FrameKind::ExecRequest`], then input frames | frames: output events |
//! | POST | `/v1/signal` | [`SignalRequest`] JSON | 204 |
//! | GET | `/v1/files/read?path=` | – | raw bytes (streamed) |
//! | PUT | `/v1/files/write?path=&mode=&metadata=` | raw bytes (streamed) | 204 |
//! | DELETE | `/v1/files/remove?path=&recursive=` | – | 204 |
//! | GET | `/v1/files/list?path=&depth=` | – | [`ListResponse`] JSON |
//! | GET | `/v1/files/stat?path=` | – | [`FileEntry`] JSON |
//! | POST | `/v1/files/mkdir` | [`MkdirRequest`] JSON | 204 |
//! | POST | `/v1/files/move` | [`MoveRequest`] JSON | 204 |
//! | GET | `/v1/files/archive?path=` | – | a tar stream of the directory (or file) at `path` |
//! | PUT | `/v1/files/archive?path=` | a tar stream, unpacked into the directory `path` | 204 |
//! | POST | `/v1/identity` | [`IdentityRequest`] JSON | 204 |
//! | POST | `/v1/sync` | — | 204 (every filesystem flushed to its disk) |
//! | POST | `/v1/tcp?port=` | raw bytes to the port (streamed) | raw bytes from it (streamed) |
//! | GET | `/v1/files/watch?path=&recursive=&include_entry=` | – | NDJSON [`WatchMessage`]s (streamed, [`watch`]) |
//! | GET | `/v1/processes` | – | [`ProcessList`] JSON |
//! | GET | `/v1/processes/info?pid=\|tag=` | – | [`ProcessInfo`] JSON |
//! | POST | `/v1/processes/attach?pid=\|tag=&replay=` | – | frames: kept output, live output, exit |
//! | POST | `/v1/processes/input?pid=\|tag=` | raw bytes for stdin (streamed) | 204 |
//! | POST | `/v1/processes/close-stdin?pid=\|tag=` | – | 204 |
//! | POST | `/v1/processes/signal?pid=\|tag=` | [`SignalFrame`] JSON | 204 |
//! | POST | `/v1/processes/resize?pid=\|tag=` | [`PtySize`] JSON | 204 |
//!
//! Errors are a non-2xx status with an [`AgentError`] JSON body.

#[cfg(feature = "archive")]
pub mod archive;
#[cfg(feature = "client")]
pub mod client;
pub mod file_metadata;
pub mod frame;
pub mod process;
pub mod query;
mod service;
pub mod time;
mod types;
pub mod watch;

pub use frame::{
    encode_data_frames, encode_frame, encode_json_frame, Frame, FrameDecoder, FrameError,
    FrameKind, MAX_FRAME_PAYLOAD,
};
pub use process::{
    check_tag, HandleSpec, MissedOutput, ProcessInfo, ProcessList, ProcessSelector, ProcessState,
};
pub use service::*;
pub use types::*;
pub use watch::{
    FileEvent, FileEventKind, WatchEnd, WatchMessage, WatchReady, WatchWarning, WatchWarningCode,
};

/// The protocol version this crate speaks. See the crate docs for the compatibility rule.
pub const PROTOCOL_VERSION: u32 = 2;

/// Where the agent binary is mounted inside every sandbox (read-only).
pub const AGENT_PATH_IN_SANDBOX: &str = "/.hutch/hutch-agent";

/// The file descriptor on which the jail hands the agent its listening unix socket (`ns`).
pub const AGENT_LISTEN_FD: i32 = 3;
