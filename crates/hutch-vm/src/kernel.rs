//! Guest kernel: extract the ELF `vmlinux` from a Debian bzImage so QEMU can boot it PVH.
//!
//! A bzImage is a real-mode setup area followed by the protected-mode code, which carries
//! the compressed kernel. The boot protocol header says where that payload is
//! (`payload_offset` at 0x248 and `payload_length` at 0x24c, relative to the start of the
//! protected-mode code, which begins after `setup_sects + 1` sectors). Debian's cloud kernel
//! compresses it with LZ4 in the *legacy* frame format (`lz4 -l`): a magic number, then
//! blocks each prefixed by their compressed length, and the kernel build appends the total
//! uncompressed length as the last four bytes.

use std::path::Path;

/// Offset of `setup_sects` in the boot header.
const SETUP_SECTS: usize = 0x1f1;
/// Offset of the `HdrS` magic.
const HEADER_MAGIC: usize = 0x202;
/// Offset of the boot protocol version.
const VERSION: usize = 0x206;
/// Offset of `payload_offset`.
const PAYLOAD_OFFSET: usize = 0x248;
/// Offset of `payload_length`.
const PAYLOAD_LENGTH: usize = 0x24c;
/// Legacy LZ4 frame magic, little-endian.
const LZ4_LEGACY_MAGIC: u32 = 0x184c_2102;
/// Legacy LZ4 frames decompress to at most 8 MiB per block.
const LZ4_LEGACY_BLOCK: usize = 8 << 20;
/// Refuse kernels that claim to decompress to more than this.
const MAX_VMLINUX: usize = 512 << 20;

/// Why a kernel image could not be turned into a `vmlinux`.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Not a bzImage this code understands.
    #[error("not a bzImage: {0}")]
    BadHeader(&'static str),
    /// The payload uses a compression other than legacy LZ4.
    #[error("payload is not legacy LZ4 (starts with {0:02x?}); only LZ4 kernels are supported")]
    UnsupportedCompression([u8; 4]),
    /// The LZ4 stream is damaged.
    #[error("LZ4 payload damaged: {0}")]
    Lz4(String),
    /// The result is not an ELF file.
    #[error("decompressed payload is not an ELF vmlinux")]
    NotElf,
}

/// Where the compressed payload sits in a bzImage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Payload {
    /// Absolute offset of the payload in the file.
    pub offset: usize,
    /// Its length in bytes.
    pub length: usize,
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    let bytes = buf.get(at..at + 4)?;
    Some(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// Parse the boot header and locate the compressed payload.
pub fn payload(image: &[u8]) -> Result<Payload, KernelError> {
    if image.get(HEADER_MAGIC..HEADER_MAGIC + 4) != Some(b"HdrS") {
        return Err(KernelError::BadHeader("no HdrS magic at 0x202"));
    }
    let version = image
        .get(VERSION..VERSION + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or(KernelError::BadHeader("truncated header"))?;
    if version < 0x0208 {
        return Err(KernelError::BadHeader(
            "boot protocol older than 2.08 has no payload fields",
        ));
    }
    let setup_sects = match image.get(SETUP_SECTS).copied() {
        Some(0) => 4,
        Some(n) => usize::from(n),
        None => return Err(KernelError::BadHeader("truncated header")),
    };
    let offset = u32_at(image, PAYLOAD_OFFSET).ok_or(KernelError::BadHeader("truncated header"))?;
    let length = u32_at(image, PAYLOAD_LENGTH).ok_or(KernelError::BadHeader("truncated header"))?;
    let payload = Payload {
        offset: (setup_sects + 1) * 512 + offset as usize,
        length: length as usize,
    };
    if payload
        .offset
        .checked_add(payload.length)
        .is_none_or(|end| end > image.len())
    {
        return Err(KernelError::BadHeader(
            "payload extends past the end of the file",
        ));
    }
    Ok(payload)
}

/// Decompress a legacy-format LZ4 stream whose last four bytes hold the uncompressed size.
pub fn decompress_lz4_legacy(data: &[u8]) -> Result<Vec<u8>, KernelError> {
    let magic: [u8; 4] = data
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or(KernelError::Lz4("truncated".into()))?;
    if u32::from_le_bytes(magic) != LZ4_LEGACY_MAGIC {
        return Err(KernelError::UnsupportedCompression(magic));
    }
    let total = u32_at(data, data.len() - 4).ok_or(KernelError::Lz4("truncated".into()))? as usize;
    if total > MAX_VMLINUX {
        return Err(KernelError::Lz4(format!(
            "claims {total} bytes uncompressed"
        )));
    }
    let body = &data[4..data.len() - 4];
    let mut out = vec![0u8; total + LZ4_LEGACY_BLOCK];
    let mut written = 0;
    let mut pos = 0;
    while pos + 4 <= body.len() {
        let size = u32_at(body, pos).ok_or(KernelError::Lz4("truncated".into()))?;
        pos += 4;
        if size == LZ4_LEGACY_MAGIC {
            continue; // concatenated frame
        }
        let size = size as usize;
        let block = body
            .get(pos..pos + size)
            .ok_or_else(|| KernelError::Lz4(format!("block at {pos} runs past the end")))?;
        pos += size;
        let end = (written + LZ4_LEGACY_BLOCK).min(out.len());
        let n = lz4_flex::block::decompress_into(block, &mut out[written..end])
            .map_err(|e| KernelError::Lz4(e.to_string()))?;
        written += n;
    }
    if written != total {
        return Err(KernelError::Lz4(format!(
            "got {written} bytes, trailer says {total}"
        )));
    }
    out.truncate(written);
    Ok(out)
}

/// Extract the ELF `vmlinux` from a bzImage held in memory.
pub fn extract_vmlinux(image: &[u8]) -> Result<Vec<u8>, KernelError> {
    let p = payload(image)?;
    let vmlinux = decompress_lz4_legacy(&image[p.offset..p.offset + p.length])?;
    if !vmlinux.starts_with(b"\x7fELF") {
        return Err(KernelError::NotElf);
    }
    Ok(vmlinux)
}

/// Extract `vmlinux` from the bzImage at `bzimage` into `out` (written atomically).
pub fn extract_vmlinux_file(bzimage: &Path, out: &Path) -> Result<(), KernelError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| KernelError::Io { path, source }
    };
    let image = std::fs::read(bzimage).map_err(io(bzimage))?;
    let vmlinux = extract_vmlinux(&image)?;
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, vmlinux).map_err(io(&tmp))?;
    std::fs::rename(&tmp, out).map_err(io(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic bzImage: 2 setup sectors + boot sector, payload at offset 16 of the
    /// protected-mode code, holding a legacy LZ4 stream of `content`.
    fn synthetic(content: &[u8], setup_sects: u8) -> Vec<u8> {
        let mut lz = LZ4_LEGACY_MAGIC.to_le_bytes().to_vec();
        for chunk in content.chunks(1000) {
            let block = lz4_flex::block::compress(chunk);
            lz.extend((block.len() as u32).to_le_bytes());
            lz.extend(block);
        }
        lz.extend((content.len() as u32).to_le_bytes());
        let sects = if setup_sects == 0 {
            4
        } else {
            usize::from(setup_sects)
        };
        let pm_start = (sects + 1) * 512;
        let mut image = vec![0u8; pm_start + 16];
        image[SETUP_SECTS] = setup_sects;
        image[HEADER_MAGIC..HEADER_MAGIC + 4].copy_from_slice(b"HdrS");
        image[VERSION..VERSION + 2].copy_from_slice(&0x020fu16.to_le_bytes());
        image[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4].copy_from_slice(&16u32.to_le_bytes());
        image[PAYLOAD_LENGTH..PAYLOAD_LENGTH + 4].copy_from_slice(&(lz.len() as u32).to_le_bytes());
        image.extend(lz);
        image.extend([0u8; 32]); // trailing bytes after the payload, as in real images
        image
    }

    fn elf_content() -> Vec<u8> {
        let mut v = b"\x7fELF".to_vec();
        v.extend((0..5000u32).flat_map(|i| (i % 251).to_le_bytes()));
        v
    }

    #[test]
    fn locates_payload() {
        let image = synthetic(&elf_content(), 2);
        let p = payload(&image).expect("payload");
        assert_eq!(p.offset, 3 * 512 + 16);
        assert_eq!(
            &image[p.offset..p.offset + 4],
            &LZ4_LEGACY_MAGIC.to_le_bytes()
        );
    }

    #[test]
    fn zero_setup_sects_means_four() {
        let image = synthetic(&elf_content(), 0);
        assert_eq!(payload(&image).expect("payload").offset, 5 * 512 + 16);
    }

    #[test]
    fn extracts_multi_block_payload() {
        let content = elf_content();
        let image = synthetic(&content, 2);
        assert_eq!(extract_vmlinux(&image).expect("extract"), content);
    }

    #[test]
    fn rejects_non_bzimage_and_other_compression() {
        assert!(matches!(
            payload(&[0u8; 1024]),
            Err(KernelError::BadHeader(_))
        ));
        let mut image = synthetic(&elf_content(), 2);
        let p = payload(&image).expect("payload");
        image[p.offset..p.offset + 4].copy_from_slice(&[0x1f, 0x8b, 8, 0]);
        assert!(matches!(
            extract_vmlinux(&image),
            Err(KernelError::UnsupportedCompression(_))
        ));
    }

    #[test]
    fn rejects_payload_past_end() {
        let mut image = synthetic(&elf_content(), 2);
        image[PAYLOAD_LENGTH..PAYLOAD_LENGTH + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(payload(&image), Err(KernelError::BadHeader(_))));
    }
}
