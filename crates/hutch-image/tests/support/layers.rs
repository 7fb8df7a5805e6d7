//! Layer tarballs written byte by byte, so tests can make entries no honest tool would:
//! `../` paths, absolute hard links, sparse bombs, oversized PAX headers.

use std::io::Write;

use sha2::{Digest as _, Sha256};

/// One archive member.
pub enum E<'a> {
    /// A directory with a mode.
    Dir(&'a str, u32),
    /// A regular file with its data and mode.
    File(&'a str, &'a [u8], u32),
    /// A symlink and its target.
    Symlink(&'a str, &'a str),
    /// A hard link and the path it links to.
    HardLink(&'a str, &'a str),
    /// A character device.
    Char(&'a str),
    /// A fifo.
    Fifo(&'a str),
    /// A GNU sparse file with this apparent size and no data.
    Sparse(&'a str, u64),
    /// A regular file whose header declares this size; the archive ends after the header.
    Declared(&'a str, u64),
    /// A PAX header that declares this size; the archive ends after it.
    HugePax(u64),
    /// A GNU long-name record followed by a file with this long name.
    LongName(&'a str, &'a [u8]),
}

/// A GNU header with `name`, `kind`, `size` and `mode`, owned by 0:0.
fn header(name: &[u8], kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    let bytes = h.as_mut_bytes();
    let n = name.len().min(100);
    bytes[..n].copy_from_slice(&name[..n]);
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    h
}

/// Sets the link name field (bytes 157..257) without any checks.
fn set_link(h: &mut tar::Header, link: &str) {
    let bytes = h.as_mut_bytes();
    let n = link.len().min(100);
    bytes[157..157 + n].copy_from_slice(&link.as_bytes()[..n]);
}

/// Appends a header and its data (padded to 512 bytes).
fn push(out: &mut Vec<u8>, mut h: tar::Header, data: &[u8]) {
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    let pad = (512 - data.len() % 512) % 512;
    out.extend(std::iter::repeat_n(0u8, pad));
}

/// The uncompressed tar of `entries`.
pub fn tar(entries: &[E<'_>]) -> Vec<u8> {
    use tar::EntryType as T;
    let mut out = Vec::new();
    for e in entries {
        match e {
            E::Dir(p, mode) => push(&mut out, header(p.as_bytes(), T::Directory, 0, *mode), b""),
            E::File(p, data, mode) => push(
                &mut out,
                header(p.as_bytes(), T::Regular, data.len() as u64, *mode),
                data,
            ),
            E::Symlink(p, target) => {
                let mut h = header(p.as_bytes(), T::Symlink, 0, 0o777);
                set_link(&mut h, target);
                push(&mut out, h, b"");
            }
            E::HardLink(p, target) => {
                let mut h = header(p.as_bytes(), T::Link, 0, 0o644);
                set_link(&mut h, target);
                push(&mut out, h, b"");
            }
            E::Char(p) => push(&mut out, header(p.as_bytes(), T::Char, 0, 0o666), b""),
            E::Fifo(p) => push(&mut out, header(p.as_bytes(), T::Fifo, 0, 0o644), b""),
            E::Sparse(p, real) => {
                let mut h = header(p.as_bytes(), T::GNUSparse, 0, 0o644);
                h.as_gnu_mut().expect("gnu header").set_real_size(*real);
                push(&mut out, h, b"");
            }
            E::Declared(p, size) => {
                let mut h = header(p.as_bytes(), T::Regular, *size, 0o644);
                h.set_cksum();
                out.extend_from_slice(h.as_bytes());
                out.extend(std::iter::repeat_n(0u8, 4096));
                return out;
            }
            E::HugePax(size) => {
                let mut h = header(b"PaxHeaders/x", T::XHeader, *size, 0o644);
                h.set_cksum();
                out.extend_from_slice(h.as_bytes());
                out.extend(std::iter::repeat_n(b'a', 4096));
                return out;
            }
            E::LongName(p, data) => {
                let mut name = p.as_bytes().to_vec();
                name.push(0);
                push(
                    &mut out,
                    header(b"././@LongLink", T::GNULongName, name.len() as u64, 0o644),
                    &name,
                );
                push(
                    &mut out,
                    header(b"truncated", T::Regular, data.len() as u64, 0o644),
                    data,
                );
            }
        }
    }
    out.extend(std::iter::repeat_n(0u8, 1024));
    out
}

/// gzip of `data`.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).expect("compress");
    enc.finish().expect("compress")
}

/// zstd of `data`.
pub fn zstd(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

/// `sha256:<hex>` of `data`.
pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}
