//! The Hutch core: the sandbox manager and everything it owns.
//!
//! - [`manager`]: lifecycle (create, pause, hibernate, snapshots, fork, explore), TTL and
//!   idle reaper, re-adoption after a restart.
//! - [`store`]: the state store seam ([`store::Store`]) and its SQLite implementation.
//! - [`tenant`]: who owns a record and whose records a request may see; tenants' settings,
//!   API keys and quotas.
//! - [`audit`]: the audit log of mutating calls and execs.
//! - [`backend`]: isolation backends (`ns`, `vm`) behind one async trait, and a fake one for
//!   tests (feature `testing`).
//! - [`host`]: what this host offers the backends (`hutch doctor`, the bench).
//! - [`model`], [`exec`], [`snapshot`], [`fork`]: typed commands and records.
//! - [`process`]: process handles (processes that outlive the call that started them).
//! - [`ids`]: ids and secrets; [`ids::SandboxId`], parsed once where an id comes in and
//!   taken by the manager's and the store's methods.
//! - [`sandbox_network`]: a sandbox's egress policy and address, typed from the create on.
//! - [`error`]: [`CoreError`], with the typed cause of every failure.
//! - [`state_disk`]: the state disk's reserve and the `ns` disk pool's size: a full disk is
//!   an error (507), never data loss.
//! - [`output`]: collected exec output and the server-wide budget bounding it.
//! - [`interp`]: the code interpreter (stateful kernels inside a sandbox, driven by the
//!   kernel driver).
//! - [`events`], [`metrics`], [`logs`]: observability.
//! - [`handoff`]: hibernated sandboxes that wake on another host (cluster mode).
//! - [`sandbox_token`]: signed, short-lived credentials scoped to one sandbox.

pub mod audit;
pub mod backend;
pub mod config;
pub mod crash_points;
pub mod error;
pub mod events;
pub mod exec;
pub mod fork;
pub mod handoff;
pub mod host;
pub mod ids;
pub mod interp;
pub mod logs;
pub mod manager;
pub mod metrics;
pub mod model;
pub mod output;
mod pidwatch;
pub mod process;
pub mod sandbox_network;
pub mod sandbox_token;
pub mod snapshot;
pub mod state_disk;
pub mod store;
pub mod tenant;
pub mod time;
pub mod uid_slots;
pub mod usage;
pub mod volume;

pub use config::Config;
pub use error::{CoreError, CoreResult};
/// Sandbox networking (re-exported for the server and the binary).
pub use hutch_net as net;

/// Why a create asking for a network is refused by a server started with `--network off`
/// (clients such as `hutch mcp` fall back to `egress: none` on it).
pub const NO_NETWORK_MESSAGE: &str = "this server gives sandboxes no network (it runs with --network off): only {\"egress\": \"none\"} is accepted";
pub use manager::{ActiveGuard, LogFollow, Manager, PortConnection};
