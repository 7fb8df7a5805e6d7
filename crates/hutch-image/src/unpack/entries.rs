//! Reading a layer's tar stream as whole entries, with bounded memory.
//!
//! The `tar` crate reads GNU long names and PAX headers into memory whatever size their
//! header claims, so a layer could make the server allocate gigabytes from a few kilobytes of
//! compressed input. The archive is therefore read in raw mode and the extension records
//! are read here, each capped ([`MAX_NAME`], [`MAX_PAX`]), and merged into the entry they
//! describe. GNU sparse entries and PAX sparse or size overrides are refused (no image tool
//! writes them: Docker, BuildKit, containerd and umoci use Go's `archive/tar`, which
//! cannot), after their declared size has been checked against the size limit.

use std::io::Read;

use tar::EntryType;

/// Longest path or link name accepted (Linux's `PATH_MAX`).
pub(crate) const MAX_NAME: u64 = 4096;

/// Largest PAX extended header accepted.
pub(crate) const MAX_PAX: u64 = 64 * 1024;

/// One entry of a layer with every extension applied.
#[derive(Debug)]
pub(crate) struct EntryHead {
    /// Entry type.
    pub kind: EntryType,
    /// Path as the archive spells it.
    pub path: Vec<u8>,
    /// Link target (symlinks) or linked path (hard links).
    pub link: Option<Vec<u8>>,
    /// Declared size of the data.
    pub size: u64,
    /// Permission bits (`0o7777` at most).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: u64,
    /// Whether PAX records carried extended attributes, which are not applied.
    pub had_xattrs: bool,
}

/// Extension records seen before the entry they describe.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// GNU long name.
    long_name: Option<Vec<u8>>,
    /// GNU long link name.
    long_link: Option<Vec<u8>>,
    /// PAX local header bytes.
    pax: Option<Vec<u8>>,
}

/// What one raw archive member turned out to be.
pub(crate) enum Member {
    /// An extension record, kept in [`Pending`].
    Extension,
    /// A real entry.
    Entry(EntryHead),
}

impl Pending {
    /// Reads `entry`: an extension record is stored (bounded) and [`Member::Extension`]
    /// returned; a real entry is merged with the stored extensions, which are cleared.
    pub(crate) fn take<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
    ) -> Result<Member, String> {
        let header = entry.header();
        let kind = header.entry_type();
        match kind {
            EntryType::GNULongName => {
                self.long_name = Some(trim_nul(read_capped(entry, MAX_NAME, "GNU long name")?));
                return Ok(Member::Extension);
            }
            EntryType::GNULongLink => {
                self.long_link = Some(trim_nul(read_capped(
                    entry,
                    MAX_NAME,
                    "GNU long link name",
                )?));
                return Ok(Member::Extension);
            }
            EntryType::XHeader => {
                self.pax = Some(read_capped(entry, MAX_PAX, "PAX header")?);
                return Ok(Member::Extension);
            }
            EntryType::XGlobalHeader => {
                read_capped(entry, MAX_PAX, "PAX global header")?;
                return Ok(Member::Extension);
            }
            _ => {}
        }
        let size = header
            .entry_size()
            .map_err(|e| format!("bad size field: {e}"))?;
        let mut head = EntryHead {
            kind,
            path: self
                .long_name
                .take()
                .unwrap_or_else(|| header.path_bytes().into_owned()),
            link: self
                .long_link
                .take()
                .or_else(|| header.link_name_bytes().map(|l| l.into_owned())),
            size,
            mode: header.mode().map_err(|e| format!("bad mode field: {e}"))? & 0o7777,
            uid: id_field(header.uid().map_err(|e| format!("bad uid field: {e}"))?),
            gid: id_field(header.gid().map_err(|e| format!("bad gid field: {e}"))?),
            mtime: header.mtime().unwrap_or(0),
            had_xattrs: false,
        };
        if let Some(pax) = self.pax.take() {
            apply_pax(&mut head, &pax)?;
        }
        if kind.is_gnu_sparse() {
            let real = header
                .as_gnu()
                .and_then(|g| g.real_size().ok())
                .unwrap_or(size);
            head.size = real.max(size);
        }
        Ok(Member::Entry(head))
    }
}

/// Applies PAX records to `head`.
fn apply_pax(head: &mut EntryHead, pax: &[u8]) -> Result<(), String> {
    for ext in tar::PaxExtensions::new(pax) {
        let ext = ext.map_err(|e| format!("malformed PAX header: {e}"))?;
        let key = ext.key_bytes();
        let value = ext.value_bytes();
        let number = || -> Result<u64, String> {
            std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.split('.').next())
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| {
                    format!(
                        "PAX record {} is not a number",
                        String::from_utf8_lossy(key)
                    )
                })
        };
        match key {
            b"path" => head.path = value.to_vec(),
            b"linkpath" => head.link = Some(value.to_vec()),
            b"uid" => head.uid = id_field(number()?),
            b"gid" => head.gid = id_field(number()?),
            b"mtime" => head.mtime = number().unwrap_or(0),
            b"size" if number()? != head.size => {
                return Err(String::from(
                    "PAX size override (files over 8 GiB) is not supported",
                ));
            }
            k if k.starts_with(b"GNU.sparse.") => {
                return Err(String::from("PAX sparse files are not supported"));
            }
            k if k.starts_with(b"SCHILY.xattr.") || k.starts_with(b"LIBARCHIVE.xattr.") => {
                head.had_xattrs = true;
            }
            _ => {}
        }
    }
    Ok(())
}

/// An id from the archive; ids past `u32` become `u32::MAX`, which ownership maps to root.
fn id_field(id: u64) -> u32 {
    u32::try_from(id).unwrap_or(u32::MAX)
}

/// Reads the data of an extension record, refusing one larger than `cap`.
fn read_capped<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    cap: u64,
    what: &str,
) -> Result<Vec<u8>, String> {
    let size = entry
        .header()
        .entry_size()
        .map_err(|e| format!("bad size field: {e}"))?;
    if size > cap {
        return Err(format!(
            "{what} of {size} bytes is over the {cap}-byte limit"
        ));
    }
    let mut data = Vec::with_capacity(size as usize);
    entry
        .take(cap)
        .read_to_end(&mut data)
        .map_err(|e| format!("reading {what}: {e}"))?;
    Ok(data)
}

/// Drops trailing NUL bytes (GNU long names end with one).
fn trim_nul(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes
}
