//! Applying image layers to a root filesystem, safely.
//!
//! [`Unpacker::apply`] reads one layer blob (uncompressed, gzip or zstd tar) and applies
//! it to a [`RootDir`] in archive order, with the OCI image-spec's whiteouts: `.wh.NAME`
//! deletes `NAME` from the layers below, `.wh..wh..opq` hides everything the layers below
//! put in its directory. Entries are untrusted; what each kind becomes:
//!
//! | entry | result |
//! |---|---|
//! | absolute path, `..` component | layer refused |
//! | path through a symlink, or through a file, already in the root | layer refused (symlinks are never followed) |
//! | regular file, directory, symlink | written; owner from the archive; set-uid/set-gid bits stripped |
//! | hard link | only to a regular file, symlink or fifo this same layer created before it; else refused |
//! | fifo | made |
//! | character or block device | skipped, with a note (the jail provides `/dev`) |
//! | GNU sparse file, PAX size override | refused (after the size check) |
//! | extended attributes (`SCHILY.xattr.*`) | not applied (so no file capabilities), with a note |
//! | anything else (volume labels, unknown types) | refused |
//!
//! Limits ([`Limits`]) hold for the whole image, across its layers: the bytes of file data
//! written and the number of entries. An entry whose declared size would cross the size
//! limit stops the unpack before any of it is written; data is counted again while it is
//! copied, and the decompressed stream itself is capped, so a decompression bomb stops at the
//! limit with [`ImageError::LimitExceeded`]. When the image config gives the layer's
//! `diff_id`, the decompressed stream's sha256 must match it.

mod apply;
mod entries;

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use crate::error::{ImageError, IoContext, Result};
use crate::rootdir::RootDir;

/// How much an image may unpack to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of file data written, all layers together. Default 8 GiB.
    pub max_bytes: u64,
    /// Entries (files, directories, links, …) applied, all layers together. Default
    /// 1,000,000.
    pub max_files: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: 8 << 30,
            max_files: 1_000_000,
        }
    }
}

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar stream.
    None,
    /// gzip.
    Gzip,
    /// zstd.
    Zstd,
}

impl Compression {
    /// The compression of an OCI or Docker layer media type; `None` for types that are not
    /// filesystem layers.
    pub fn from_media_type(media_type: &str) -> Option<Self> {
        let base = media_type
            .strip_prefix("application/vnd.oci.image.layer.nondistributable.v1.")
            .or_else(|| media_type.strip_prefix("application/vnd.oci.image.layer.v1."));
        match base {
            Some("tar") => Some(Self::None),
            Some("tar+gzip") => Some(Self::Gzip),
            Some("tar+zstd") => Some(Self::Zstd),
            _ => match media_type {
                "application/vnd.docker.image.rootfs.diff.tar" => Some(Self::None),
                "application/vnd.docker.image.rootfs.diff.tar.gzip"
                | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Some(Self::Gzip),
                "application/vnd.docker.image.rootfs.diff.tar.zstd" => Some(Self::Zstd),
                _ => None,
            },
        }
    }
}

/// One layer blob to apply.
#[derive(Debug, Clone, Copy)]
pub struct Layer<'a> {
    /// The blob file (already verified against `digest`).
    pub blob: &'a Path,
    /// Its digest, for messages.
    pub digest: &'a str,
    /// Its compression.
    pub compression: Compression,
    /// The sha256 of the uncompressed tar (`rootfs.diff_ids` of the image config), checked
    /// when given.
    pub diff_id: Option<&'a str>,
}

/// What applying layers did, beyond writing files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Bytes of file data written.
    pub bytes: u64,
    /// Entries applied.
    pub files: u64,
    /// Files and directories whose set-uid or set-gid bit was removed.
    pub setid_stripped: u64,
    /// Device nodes skipped.
    pub devices_skipped: u64,
    /// Entries whose extended attributes were not applied.
    pub xattrs_ignored: u64,
    /// Paths deleted by whiteouts.
    pub whiteouts: u64,
}

/// Applies the layers of one image to one root, keeping the image-wide limits.
#[derive(Debug)]
pub struct Unpacker<'a> {
    /// Where layers go.
    root: &'a RootDir,
    /// The limits.
    limits: Limits,
    /// Counts so far.
    summary: Summary,
    /// Set: stop reading the layer ([`ImageError::Cancelled`]).
    cancel: Option<Arc<AtomicBool>>,
}

impl<'a> Unpacker<'a> {
    /// An unpacker into `root` with `limits`.
    pub fn new(root: &'a RootDir, limits: Limits) -> Self {
        Self {
            root,
            limits,
            summary: Summary::default(),
            cancel: None,
        }
    }

    /// The same, stopping in the middle of a layer once `cancel` is set (what was
    /// written stays in the root, which the caller throws away).
    pub fn with_cancel(mut self, cancel: Option<Arc<AtomicBool>>) -> Self {
        self.cancel = cancel;
        self
    }

    fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// What the layers applied so far did.
    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// Applies one layer on top of what is in the root.
    pub fn apply(&mut self, layer: &Layer<'_>) -> Result<()> {
        self.apply_reporting(layer, &mut |_| {})
    }

    /// [`Unpacker::apply`], calling `read` with the count of each read of the blob (its
    /// compressed bytes: how far the extraction is).
    pub fn apply_reporting(&mut self, layer: &Layer<'_>, read: &mut dyn FnMut(u64)) -> Result<()> {
        let file = File::open(layer.blob).at("opening layer blob", layer.blob)?;
        let counted = CountingReader {
            inner: file,
            read,
            cancel: self.cancel.clone(),
        };
        let buffered = BufReader::with_capacity(1 << 16, counted);
        let decoded: Box<dyn Read + '_> = match layer.compression {
            Compression::None => Box::new(buffered),
            Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(buffered)),
            Compression::Zstd => Box::new(
                ruzstd::decoding::StreamingDecoder::new(buffered).map_err(|e| corrupt(layer, e))?,
            ),
        };
        // File data, plus at most two 512-byte blocks of headers and padding per entry.
        let cap = self
            .limits
            .max_bytes
            .saturating_add(self.limits.max_files.saturating_mul(1024))
            .saturating_add(1 << 20);
        let over_cap = Rc::new(Cell::new(false));
        let stream = CappedHasher {
            inner: decoded,
            hasher: Sha256::new(),
            read: 0,
            cap,
            over_cap: Rc::clone(&over_cap),
        };
        let mut archive = tar::Archive::new(stream);
        let result = apply::LayerApply::new(self.root, layer, self.limits, &mut self.summary)
            .run(&mut archive);
        if self.cancelled() {
            return Err(ImageError::Cancelled);
        }
        if over_cap.get() {
            return Err(ImageError::LimitExceeded {
                layer: layer.digest.to_owned(),
                limit: "size",
                max: self.limits.max_bytes,
                detail: format!("the decompressed stream passed {cap} bytes"),
            });
        }
        result?;
        let mut stream = archive.into_inner();
        // The hash covers the whole stream, also the padding after the end-of-archive blocks.
        io::copy(&mut stream, &mut io::sink()).map_err(|e| {
            if over_cap.get() {
                ImageError::LimitExceeded {
                    layer: layer.digest.to_owned(),
                    limit: "size",
                    max: self.limits.max_bytes,
                    detail: format!("the decompressed stream passed {cap} bytes"),
                }
            } else {
                corrupt(layer, e)
            }
        })?;
        if let Some(expected) = layer.diff_id {
            let actual = format!("sha256:{:x}", stream.hasher.finalize());
            if actual != expected {
                return Err(ImageError::DigestMismatch {
                    what: "uncompressed layer (diff_id)",
                    expected: expected.to_owned(),
                    actual,
                });
            }
        }
        Ok(())
    }
}

/// A [`ImageError::CorruptLayer`] for `layer`.
fn corrupt(layer: &Layer<'_>, e: impl std::fmt::Display) -> ImageError {
    ImageError::CorruptLayer {
        layer: layer.digest.to_owned(),
        message: e.to_string(),
    }
}

/// The blob as read from disk, each read's size told to `read`.
struct CountingReader<'r, R> {
    inner: R,
    read: &'r mut dyn FnMut(u64),
    /// Set: every read fails (the layer's walk stops).
    cancel: Option<Arc<AtomicBool>>,
}

impl<R: Read> Read for CountingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
        {
            return Err(io::Error::other("cancelled"));
        }
        let n = self.inner.read(buf)?;
        (self.read)(n as u64);
        Ok(n)
    }
}

/// The decompressed stream: hashed for the diff_id, and cut off past `cap` bytes.
struct CappedHasher<'r> {
    /// The decompressor.
    inner: Box<dyn Read + 'r>,
    /// sha256 of everything read.
    hasher: Sha256,
    /// Bytes read so far.
    read: u64,
    /// Most bytes allowed.
    cap: u64,
    /// Set when the cap was hit (the error itself travels through the tar reader).
    over_cap: Rc<Cell<bool>>,
}

impl Read for CappedHasher<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.cap {
            self.over_cap.set(true);
            return Err(io::Error::other("decompressed layer over the size limit"));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}
