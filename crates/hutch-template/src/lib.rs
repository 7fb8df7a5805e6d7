//! Template root filesystems: building, caching and describing them (DESIGN.md §6).
//!
//! A template is a directory `<templates_dir>/<name>/` holding `rootfs/`, the read-only
//! root filesystem that `ns` sandboxes overlay, and `template.json`, its metadata. It is
//! *ready* only once `template.json` says `"ready": true`, which a build writes last before
//! atomically renaming its private build directory into place.
//!
//! ```no_run
//! use hutch_template::{BuildOptions, Progress, TemplateStore};
//!
//! # fn main() -> Result<(), hutch_template::TemplateError> {
//! let store = TemplateStore::open("/var/lib/hutch/templates")?;
//! let info = store.build("minimal", &BuildOptions::default(), &mut |p: Progress| {
//!     if let Progress::Step(step) = p {
//!         eprintln!("{step}");
//!     }
//! })?;
//! assert!(info.ready);
//! let lower = store.rootfs("minimal");
//! # let _ = lower;
//! # Ok(())
//! # }
//! ```
//!
//! Built-in recipes ([`builtin_names`]): `minimal` (Debian's static busybox, under a
//! second) and `base` (Debian 12 through `debootstrap`, a minute or more, needs the Debian
//! mirror). Any other name can be built from an OCI image ([`TemplateStore::build_image`],
//! through `hutch-image`). See `docs/templates.md`.

mod blob_gc;
mod build;
mod error;
mod image;
mod info;
pub mod interp;
mod lock;
mod mounts;
mod names;
mod recipes;
mod revisions;
mod store;
mod sys;
mod tags;
mod tree;

pub use blob_gc::BlobSweep;
pub use build::{BuildOptions, Progress, DEFAULT_TOOL_SILENCE_LIMIT};
pub use error::TemplateError;
pub use hutch_image::{Credentials, ImageConfig, Limits, PullOptions, Transfer, TransferAction};
pub use image::{is_local_reference, local_path as local_image_path, ImageSource, LocalImage};
pub use info::{ResourceDefaults, SandboxResources, TemplateInfo};
pub use names::builtin_names;
pub use revisions::parse_ref;
pub use store::{validate_name, LayeredSource, TemplateStore};
pub use tags::{validate_tag, TemplateRef};
