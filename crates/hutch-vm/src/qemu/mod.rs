//! QEMU `microvm`: its command line ([`VmConfig`]), its jail (`jail`: QEMU cloned into its own
//! namespaces with a minimal root, built on `hutch_jail::exec_plan`) and the running process
//! ([`QemuProcess`]).
//!
//! The modules depend one way: `process` starts QEMU through `jail`, both read `config`.

mod config;
mod error;
mod jail;
mod process;

pub use config::{
    volume_serial, Accel, Console, QemuJail, VmConfig, VolumeDrive, AGENT_PORT_ID, GUEST_MAC,
    MIN_VERSION, QEMU_BINARY, TAP_FD, VOLUME_SLOTS,
};
pub use error::QemuError;
pub use process::{check_version, parse_version, QemuProcess};

pub use crate::console::ConsoleRing;
pub use crate::disk::{create_fresh, RootDisk};
