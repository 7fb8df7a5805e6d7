//! OCI images for Hutch templates: pulling them from registries and applying their layers.
//!
//! - [`pull`] fetches an image (an index's `linux/amd64` manifest, OCI or Docker v2) from an
//!   OCI distribution registry into a [`BlobStore`], verifying every blob's sha256 while it
//!   streams to disk.
//! - [`load`] reads an image from local files instead: an OCI image layout (directory or
//!   tarball) or a `docker save` archive, into the same store, with the same checks.
//! - [`Unpacker`] applies the layers to a [`RootDir`] without ever following a symlink or
//!   writing outside it, within [`Limits`].
//! - [`ImageConfig`] is what a template records of the image's configuration.
//!
//! See `docs/templates.md` ("From an OCI image") for the formats read, the limits and what is
//! refused.

mod auth;
mod blobs;
mod config;
mod egress;
mod error;
mod local;
mod manifest;
mod progress;
mod registry;
mod rootdir;
mod unpack;

pub use auth::Credentials;
pub use blobs::{BlobStore, Digest};
pub use config::ImageConfig;
pub use error::ImageError;
pub use local::load;
pub use progress::{PullEvent, Throttle, Transfer, TransferAction, REPORT_EVERY};
pub use registry::{
    error_chain, is_local as is_host_local_address, pull, PullOptions, PulledImage, PulledLayer,
};
pub use rootdir::{split_relative, RootDir};
pub use unpack::{Compression, Layer, Limits, Summary, Unpacker};
