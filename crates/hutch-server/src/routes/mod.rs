//! Route handlers, one module per resource.

pub mod audit;
pub mod build_cache;
pub mod build_logs;
pub mod code;
pub mod exec;
mod exec_events;
mod exec_json;
pub mod files;
pub mod files_url;
pub mod files_watch;
pub mod keys;
pub mod lifecycle;
pub mod logs;
pub mod misc;
mod negotiate;
pub mod network;
mod page;
pub mod ports;
pub mod processes;
pub mod pty;
pub mod sandboxes;
pub mod template_edit;
pub mod templates;
pub mod tenants;
pub mod usage;
pub mod volumes;
