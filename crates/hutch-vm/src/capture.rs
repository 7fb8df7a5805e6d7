//! A memory snapshot of a stopped guest taken without a migration stream.
//!
//! Migrating a guest's RAM means QEMU walking every page of it, a pipe, and a second QEMU
//! loading the stream into a memory file ([`crate::share`]): about 0.3–0.5 s for a 256 MiB
//! guest here, most of a live fork. Yet everything a child needs is already on this host:
//! the guest's RAM is a copy-on-write mapping of a memory file (the bake's, or an earlier
//! fork's), and the pages the guest wrote since are the private pages of that mapping.
//! So, with the vCPUs stopped:
//!
//! * [`save_devices`] writes the device and vCPU state alone (`xen-save-devices-state`,
//!   about 35 KiB), framed like a stream saved with `x-ignore-shared`, so children restore
//!   from it exactly as from a bake;
//! * [`copy_guest_ram`] copies the guest's RAM into a new memory file: its private pages
//!   (found in `/proc/<pid>/pagemap`) read from the process with `process_vm_readv`, every
//!   other page from the mapped file (or a [`mirror_memory_file`] copy of it), pages of
//!   zeros left as holes.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::qmp::Qmp;
use crate::VmError;

const PAGE: u64 = 4096;
/// Copy buffer.
const CHUNK: usize = 2 << 20;

fn io(what: String) -> impl FnOnce(std::io::Error) -> VmError {
    move |source| VmError::Io { what, source }
}

fn invalid(what: String) -> VmError {
    VmError::Io {
        what,
        source: std::io::Error::from(std::io::ErrorKind::InvalidData),
    }
}

/// The QEMU savevm stream's magic and version (`QEVM`, 3).
const STREAM_HEADER: [u8; 8] = *b"QEVM\0\0\0\x03";

/// Write the device and vCPU state of the stopped guest behind `qmp` to `out`, loadable
/// like its bake's state by a QEMU with the same command line that has `x-ignore-shared`
/// on and its RAM in a memory file ([`crate::snapshot::restore`] of a snapshot whose RAM is
/// in its memory file). The guest stays stopped.
///
/// `bake_state` is the state of the bake the guest comes from (saved with
/// `x-ignore-shared`): its configuration and RAM sections are kept. Those carry the small
/// RAM blocks besides guest memory (the firmware's region, ACPI tables), which a loading
/// QEMU does not fill itself and `xen-save-devices-state` leaves out; the guest wrote them
/// while it booted, before its bake, and not since.
pub async fn save_devices(qmp: &mut Qmp, bake_state: &Path, out: &Path) -> Result<(), VmError> {
    let bake = std::fs::read(bake_state).map_err(io(format!("read {}", bake_state.display())))?;
    let prefix = ram_sections_end(&bake)
        .map_err(|why| invalid(format!("the bake state {}: {why}", bake_state.display())))?;
    let raw_path = out.with_extension("raw");
    let raw = File::create(&raw_path).map_err(io(format!("create {}", raw_path.display())))?;
    let saved = async {
        // QEMU opens the path write-only; the set hands it a duplicate of this descriptor,
        // so the file can be where the jailed QEMU sees nothing.
        let set = qmp.add_fd(raw.as_fd()).await?;
        let saved = qmp.save_device_state(&format!("/dev/fdset/{set}")).await;
        let removed = qmp.remove_fdset(set).await;
        saved.and(removed)
    }
    .await;
    drop(raw);
    let composed = saved.map_err(VmError::from).and_then(|()| {
        let mut devices = Vec::new();
        File::open(&raw_path)
            .and_then(|mut f| f.read_to_end(&mut devices))
            .map_err(io(format!("read {}", raw_path.display())))?;
        compose(&bake[..prefix], &devices)
    });
    let _ = std::fs::remove_file(&raw_path);
    let composed = composed?;
    File::create(out)
        .and_then(|mut f| f.write_all(&composed))
        .map_err(io(format!("write {}", out.display())))
}

/// Savevm stream markers (QEMU's `migration/savevm.c`, `migration/ram.c`).
mod stream {
    pub const EOF: u8 = 0x00;
    pub const SECTION_START: u8 = 0x01;
    pub const SECTION_PART: u8 = 0x02;
    pub const SECTION_END: u8 = 0x03;
    pub const SECTION_FULL: u8 = 0x04;
    pub const SUBSECTION: u8 = 0x05;
    pub const VM_DESCRIPTION: u8 = 0x06;
    pub const CONFIGURATION: u8 = 0x07;
    pub const SECTION_FOOTER: u8 = 0x7e;
    pub const RAM_ZERO: u64 = 0x02;
    pub const RAM_MEM_SIZE: u64 = 0x04;
    pub const RAM_PAGE: u64 = 0x08;
    pub const RAM_EOS: u64 = 0x10;
    pub const RAM_CONTINUE: u64 = 0x20;
    pub const RAM_FLAGS: u64 = 0xfff;
}

/// The bake's header, configuration and RAM sections, then the device sections of
/// `devices` (a `xen-save-devices-state` file), then an empty VM description (a loading
/// QEMU expects one).
fn compose(bake_prefix: &[u8], devices: &[u8]) -> Result<Vec<u8>, VmError> {
    if devices.len() < STREAM_HEADER.len() + 1
        || devices[..STREAM_HEADER.len()] != STREAM_HEADER
        || devices.last() != Some(&stream::EOF)
    {
        return Err(invalid(
            "QEMU's device state file is not a savevm stream".into(),
        ));
    }
    let description = b"{}";
    let mut out = Vec::with_capacity(bake_prefix.len() + devices.len() + 8);
    out.extend_from_slice(bake_prefix);
    out.extend_from_slice(&devices[STREAM_HEADER.len()..]);
    out.push(stream::VM_DESCRIPTION);
    out.extend_from_slice(&(description.len() as u32).to_be_bytes());
    out.extend_from_slice(description);
    Ok(out)
}

/// Where the first device section of a savevm stream saved with `x-ignore-shared` begins:
/// the end of its header, configuration and RAM sections. Anything unexpected is an error.
fn ram_sections_end(s: &[u8]) -> Result<usize, String> {
    let mut r = Reader { s, at: 0 };
    if r.take(STREAM_HEADER.len())? != STREAM_HEADER {
        return Err("not a savevm stream".into());
    }
    if r.u8()? != stream::CONFIGURATION {
        return Err("no configuration section".into());
    }
    let name_len = r.u32()? as usize;
    r.take(name_len)?;
    while r.peek()? == stream::SUBSECTION {
        r.u8()?;
        let len = r.u8()? as usize;
        if r.take(len)? != b"configuration/capabilities" {
            return Err("an unknown configuration subsection".into());
        }
        r.u32()?; // its version
        for _ in 0..r.u32()? {
            let len = r.u8()? as usize;
            r.take(len)?;
        }
    }
    loop {
        let kind = r.peek()?;
        match kind {
            stream::SECTION_FULL => return Ok(r.at),
            stream::SECTION_START | stream::SECTION_PART | stream::SECTION_END => {}
            other => return Err(format!("unexpected section type {other:#x}")),
        }
        r.u8()?;
        let id = r.u32()?;
        if kind == stream::SECTION_START {
            let len = r.u8()? as usize;
            if r.take(len)? != b"ram" {
                return Err("an iterative section other than RAM".into());
            }
            r.take(8)?; // instance and version
        }
        ram_section(&mut r)?;
        if r.u8()? != stream::SECTION_FOOTER || r.u32()? != id {
            return Err("a section without its footer".into());
        }
    }
}

/// Skip the content of one RAM section, up to and including its end-of-section flag.
fn ram_section(r: &mut Reader<'_>) -> Result<(), String> {
    loop {
        let word = r.u64()?;
        let (flags, value) = (word & stream::RAM_FLAGS, word & !stream::RAM_FLAGS);
        if flags & stream::RAM_MEM_SIZE != 0 {
            // The blocks: name, used length and (with `x-ignore-shared`) address.
            let mut listed = 0;
            while listed < value {
                let len = r.u8()? as usize;
                r.take(len)?;
                listed += r.u64()?;
                r.u64()?;
            }
        } else if flags & stream::RAM_EOS != 0 {
            return Ok(());
        } else if flags & (stream::RAM_ZERO | stream::RAM_PAGE) != 0 {
            if flags & stream::RAM_CONTINUE == 0 {
                let len = r.u8()? as usize;
                r.take(len)?;
            }
            r.take(if flags & stream::RAM_ZERO != 0 {
                1
            } else {
                PAGE as usize
            })?;
        } else {
            return Err(format!("unexpected RAM flags {flags:#x}"));
        }
    }
}

/// A cursor over a byte stream; reading past its end is an error.
struct Reader<'a> {
    s: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.s.len());
        let end = end.ok_or_else(|| "truncated".to_string())?;
        let bytes = &self.s[self.at..end];
        self.at = end;
        Ok(bytes)
    }
    fn peek(&self) -> Result<u8, String> {
        self.s
            .get(self.at)
            .copied()
            .ok_or_else(|| "truncated".into())
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(b))
    }
}

/// What [`copy_guest_ram`] copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamCopy {
    /// Bytes of pages read from the file the guest's RAM maps (data extents the guest has
    /// not written).
    pub file_bytes: u64,
    /// Bytes of pages the guest had written (the mapping's private pages).
    pub private_bytes: u64,
    /// Bytes actually written to the new file: the pages read that are not all zeros (the
    /// rest stay holes, which read as zeros).
    pub written_bytes: u64,
}

/// Where a page of guest RAM is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A hole of the mapped file the guest never wrote: zeros, nothing to copy.
    Hole,
    /// The mapped file (the guest has not written the page).
    File,
    /// The QEMU process (a private page: the guest wrote it).
    Process,
}

/// Copy the RAM of the stopped guest in QEMU process `pid` (`ram_bytes` of it, mapped from a
/// memory file) into a new memory file `out` (created, or truncated). Pages of zeros are
/// left as holes: most of a guest's free memory is zeros (its kernel clears pages it
/// allocates), and every page written here is memory the host must provide.
///
/// `mirror` is `(original, copy)`: when QEMU maps `original`, its pages are read from
/// `copy`, a file with the same content ([`mirror_memory_file`]) on faster memory.
pub fn copy_guest_ram(
    pid: u32,
    ram_bytes: u64,
    out: &Path,
    mirror: Option<(&Path, &Path)>,
) -> Result<RamCopy, VmError> {
    let started = std::time::Instant::now();
    let (start, range) = ram_mapping(pid, ram_bytes)?;
    // The very file QEMU mapped, whatever it is called in QEMU's mount namespace.
    let mut map_file = format!("/proc/{pid}/map_files/{range}");
    let mut source = File::open(&map_file).map_err(io(format!("open {map_file}")))?;
    if let Some((original, copy)) = mirror {
        use std::os::unix::fs::MetadataExt;
        let id = |m: std::fs::Metadata| (m.dev(), m.ino());
        let mapped = source
            .metadata()
            .map(id)
            .map_err(io(format!("stat {map_file}")))?;
        if std::fs::metadata(original).map(id).ok() == Some(mapped) {
            map_file = copy.display().to_string();
            source = File::open(copy).map_err(io(format!("open {map_file}")))?;
        }
    }
    let target = File::create(out).map_err(io(format!("create {}", out.display())))?;
    target
        .set_len(ram_bytes)
        .map_err(io(format!("size {}", out.display())))?;
    let pages = ram_bytes / PAGE;
    let mut sources = vec![Source::Hole; pages as usize];
    for (first, end) in data_extents(&source, ram_bytes).map_err(io(format!("seek {map_file}")))? {
        sources[(first / PAGE) as usize..end.div_ceil(PAGE) as usize].fill(Source::File);
    }
    for page in private_pages(pid, start, ram_bytes)? {
        sources[page as usize] = Source::Process;
    }
    let classified = started.elapsed();
    let mut copy = RamCopy {
        file_bytes: 0,
        private_bytes: 0,
        written_bytes: 0,
    };
    let mut buf = vec![0u8; CHUNK];
    let mut page = 0;
    while page < pages {
        let kind = sources[page as usize];
        let run = sources[page as usize..]
            .iter()
            .take(CHUNK / PAGE as usize)
            .take_while(|&&s| s == kind)
            .count() as u64;
        let (offset, len) = (page * PAGE, (run * PAGE) as usize);
        match kind {
            Source::Hole => {}
            Source::File => {
                source
                    .read_exact_at(&mut buf[..len], offset)
                    .map_err(io(format!("read {map_file}")))?;
                copy.file_bytes += len as u64;
            }
            Source::Process => {
                read_process(pid, start + offset, &mut buf[..len])
                    .map_err(io(format!("read guest RAM of QEMU {pid}")))?;
                copy.private_bytes += len as u64;
            }
        }
        if kind != Source::Hole {
            copy.written_bytes += write_nonzero(&target, &buf[..len], offset)
                .map_err(io(format!("write {}", out.display())))?;
        }
        page += run;
    }
    tracing::debug!(
        pid,
        classify_ms = classified.as_millis() as u64,
        total_ms = started.elapsed().as_millis() as u64,
        file_mib = copy.file_bytes >> 20,
        private_mib = copy.private_bytes >> 20,
        written_mib = copy.written_bytes >> 20,
        "guest RAM copied"
    );
    Ok(copy)
}

/// Read `buf.len()` bytes at `address` of process `pid` (`process_vm_readv`).
fn read_process(pid: u32, address: u64, buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let local = libc::iovec {
            iov_base: buf[done..].as_mut_ptr().cast(),
            iov_len: buf.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (address + done as u64) as *mut libc::c_void,
            iov_len: buf.len() - done,
        };
        // SAFETY: `local` is our own writable buffer of that length; the kernel checks the
        // remote range.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
            _ => return Err(std::io::Error::last_os_error()),
        }
    }
    Ok(())
}

/// Write the pages of `buf` that are not all zeros at `offset` (+ their place) of
/// `target`, a run of neighbours at a time. Returns the bytes written.
fn write_nonzero(target: &File, buf: &[u8], offset: u64) -> std::io::Result<u64> {
    let zero = |page: &[u8]| page.iter().all(|&b| b == 0);
    let pages: Vec<bool> = buf.chunks(PAGE as usize).map(|p| !zero(p)).collect();
    let mut written = 0;
    let mut i = 0;
    while i < pages.len() {
        if !pages[i] {
            i += 1;
            continue;
        }
        let end = i + pages[i..].iter().take_while(|&&nonzero| nonzero).count();
        let (from, to) = (i * PAGE as usize, (end * PAGE as usize).min(buf.len()));
        target.write_all_at(&buf[from..to], offset + from as u64)?;
        written += (to - from) as u64;
        i = end;
    }
    Ok(written)
}

/// Copy the memory file `original` to `copy` (created, or truncated), leaving its pages of
/// zeros as holes. Returns the bytes written.
pub fn mirror_memory_file(original: &Path, copy: &Path) -> Result<u64, VmError> {
    let what = || format!("copy {} to {}", original.display(), copy.display());
    let source = File::open(original).map_err(io(what()))?;
    let len = source.metadata().map_err(io(what()))?.len();
    let target = File::create(copy).map_err(io(what()))?;
    target.set_len(len).map_err(io(what()))?;
    let mut buf = vec![0u8; CHUNK];
    let mut written = 0;
    for (first, end) in data_extents(&source, len).map_err(io(what()))? {
        let mut at = first;
        while at < end {
            let n = ((end - at) as usize).min(CHUNK);
            source
                .read_exact_at(&mut buf[..n], at)
                .map_err(io(what()))?;
            written += write_nonzero(&target, &buf[..n], at).map_err(io(what()))?;
            at += n as u64;
        }
    }
    Ok(written)
}

/// The guest RAM mapping of QEMU `pid`: the one file mapping of exactly `ram_bytes` from
/// offset 0. Returns its start address and its `start-end` text.
fn ram_mapping(pid: u32, ram_bytes: u64) -> Result<(u64, String), VmError> {
    let maps_path = format!("/proc/{pid}/maps");
    let maps = std::fs::read_to_string(&maps_path).map_err(io(format!("read {maps_path}")))?;
    let mut found = None;
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [range, _perms, offset, _dev, inode, ..] = fields[..] else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        if hi - lo != ram_bytes || inode == "0" || u64::from_str_radix(offset, 16) != Ok(0) {
            continue;
        }
        if found.is_some() {
            return Err(invalid(format!(
                "QEMU {pid} maps two files of its RAM's size; cannot tell which is RAM"
            )));
        }
        found = Some((lo, range.to_string()));
    }
    found.ok_or_else(|| {
        invalid(format!(
            "QEMU {pid} maps no memory file of {ram_bytes} bytes"
        ))
    })
}

/// The data extents (`(start, end)` byte offsets) of `file` below `len`.
fn data_extents(file: &File, len: u64) -> std::io::Result<Vec<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    let seek = |offset: u64, whence: i32| -> std::io::Result<Option<u64>> {
        // SAFETY: lseek on a descriptor we own; it only moves the file offset.
        let at = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, whence) };
        if at >= 0 {
            return Ok(Some(at as u64));
        }
        match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
            e => Err(e),
        }
    };
    let mut extents = Vec::new();
    let mut offset = 0;
    while offset < len {
        let Some(data) = seek(offset, libc::SEEK_DATA)?.filter(|&d| d < len) else {
            break;
        };
        let hole = seek(data, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        extents.push((data, hole));
        offset = hole;
    }
    Ok(extents)
}

/// The private pages (page numbers) in the `len` bytes mapped at `start` in process `pid`:
/// present and not file pages, or swapped out.
fn private_pages(pid: u32, start: u64, len: u64) -> Result<Vec<u64>, VmError> {
    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    const FILE_OR_SHARED: u64 = 1 << 61;
    let path = format!("/proc/{pid}/pagemap");
    let pagemap = File::open(&path).map_err(io(format!("open {path}")))?;
    let mut entries = vec![0u8; (len / PAGE * 8) as usize];
    pagemap
        .read_exact_at(&mut entries, start / PAGE * 8)
        .map_err(io(format!("read {path}")))?;
    Ok(entries
        .chunks_exact(8)
        .enumerate()
        .filter(|(_, entry)| {
            let e = u64::from_le_bytes((*entry).try_into().unwrap_or_default());
            e & SWAPPED != 0 || (e & PRESENT != 0 && e & FILE_OR_SHARED == 0)
        })
        .map(|(page, _)| page as u64)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bake state like QEMU's: configuration, RAM sections listing two blocks with one
    /// page of the small one, one device section.
    fn bake_state() -> (Vec<u8>, usize) {
        let mut s = STREAM_HEADER.to_vec();
        s.extend_from_slice(b"\x07\0\0\0\x07microvm");
        s.extend_from_slice(b"\x05\x1aconfiguration/capabilities\0\0\0\x01\0\0\0\x01");
        s.extend_from_slice(b"\x0fx-ignore-shared");
        // START "ram": the block list (mem 0x2000, pc.bios 0x1000), end of section.
        s.extend_from_slice(b"\x01\0\0\0\x02\x03ram\0\0\0\0\0\0\0\x04");
        s.extend_from_slice(&(0x3000u64 | stream::RAM_MEM_SIZE).to_be_bytes());
        s.extend_from_slice(b"\x03mem");
        s.extend_from_slice(&0x2000u64.to_be_bytes());
        s.extend_from_slice(&0u64.to_be_bytes());
        s.extend_from_slice(b"\x07pc.bios");
        s.extend_from_slice(&0x1000u64.to_be_bytes());
        s.extend_from_slice(&0xffff_0000u64.to_be_bytes());
        s.extend_from_slice(&stream::RAM_EOS.to_be_bytes());
        s.extend_from_slice(b"\x7e\0\0\0\x02");
        // PART: a page of pc.bios and a zero page after it.
        s.extend_from_slice(b"\x02\0\0\0\x02");
        s.extend_from_slice(&stream::RAM_PAGE.to_be_bytes());
        s.extend_from_slice(b"\x07pc.bios");
        s.extend_from_slice(&[0xab; PAGE as usize]);
        s.extend_from_slice(&(0x1000 | stream::RAM_ZERO | stream::RAM_CONTINUE).to_be_bytes());
        s.push(0);
        s.extend_from_slice(&stream::RAM_EOS.to_be_bytes());
        s.extend_from_slice(b"\x7e\0\0\0\x02");
        // END.
        s.extend_from_slice(b"\x03\0\0\0\x02");
        s.extend_from_slice(&stream::RAM_EOS.to_be_bytes());
        s.extend_from_slice(b"\x7e\0\0\0\x02");
        let devices_at = s.len();
        s.extend_from_slice(b"\x04\0\0\0\x03\x05timer\0\0\0\0\0\0\0\x02\x11\x7e\0\0\0\x03\0");
        (s, devices_at)
    }

    #[test]
    fn keeps_the_bakes_ram_sections_and_takes_the_guests_devices() {
        let (bake, devices_at) = bake_state();
        assert_eq!(ram_sections_end(&bake), Ok(devices_at));
        let devices = [
            &STREAM_HEADER[..],
            b"\x04\0\0\0\x03\x05timer\0\0\0\0\0\0\0\x02\x22\x7e\0\0\0\x03\0",
        ]
        .concat();
        let composed = compose(&bake[..devices_at], &devices).expect("compose");
        let expected = [
            &bake[..devices_at],
            &devices[STREAM_HEADER.len()..],
            b"\x06\0\0\0\x02{}",
        ]
        .concat();
        assert_eq!(composed, expected);
        // Not streams, or cut short: errors, not a wrong file.
        assert!(compose(&bake[..devices_at], b"QEVM").is_err());
        assert!(ram_sections_end(&bake[..devices_at - 3]).is_err());
        assert!(ram_sections_end(&bake[..100]).is_err());
        let mut odd = bake.clone();
        odd[8] = stream::SECTION_FULL;
        assert!(ram_sections_end(&odd).is_err());
    }

    #[test]
    fn copies_a_process_mapping_with_its_private_pages() {
        // This process maps a file privately and writes some pages; the copy must have the
        // file's data where the mapping has not been written and the writes where it has.
        let dir = tempfile::tempdir().expect("tempdir");
        let len: u64 = 67 * PAGE; // a size no other mapping of this process has
        let source_path = dir.path().join("source");
        let source = File::create(&source_path).expect("create");
        source.set_len(len).expect("size");
        source.write_all_at(&[1u8; 4096], 0).expect("write");
        source.write_all_at(&[2u8; 4096], 10 * PAGE).expect("write");
        source.write_all_at(&[3u8; 4096], 30 * PAGE).expect("write");
        drop(source);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&source_path)
            .expect("open");
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh private mapping of `len` bytes of a file we own, unmapped below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        // SAFETY: inside the mapping just made.
        unsafe {
            std::ptr::write_bytes(base.cast::<u8>().add(10 * PAGE as usize), 7, 100);
            std::ptr::write_bytes(base.cast::<u8>().add(20 * PAGE as usize), 9, 2 * 4096);
            // A page cleared by the guest is zeros in the copy, not the file's data.
            std::ptr::write_bytes(base.cast::<u8>().add(30 * PAGE as usize), 0, 4096);
        }
        let out = dir.path().join("out");
        let copied = copy_guest_ram(std::process::id(), len, &out, None);
        // The same through a mirror of the mapped file.
        let mirror = dir.path().join("mirror");
        let mirrored = mirror_memory_file(&source_path, &mirror);
        // Marked, to see that the copy reads it: the file's first page, unwritten by this
        // process, comes from the mirror.
        File::options()
            .write(true)
            .open(&mirror)
            .and_then(|f| f.write_all_at(&[5u8; 4096], 0))
            .expect("mark the mirror");
        let through_mirror = dir.path().join("through-mirror");
        let copied_through_mirror = copy_guest_ram(
            std::process::id(),
            len,
            &through_mirror,
            Some((&source_path, &mirror)),
        );
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(base, len as usize) };
        let copied = copied.expect("copy");
        // Pages 0, 10 and 30 have data; page 30 in a mirror is not zeros.
        assert_eq!(mirrored.expect("mirror"), 3 * PAGE);
        assert_eq!(copied_through_mirror.expect("copy"), copied);
        let (direct, mirrored) = (
            std::fs::read(&out).expect("read"),
            std::fs::read(&through_mirror).expect("read"),
        );
        assert!(mirrored[..4096].iter().all(|&b| b == 5));
        assert_eq!(mirrored[4096..], direct[4096..]);
        assert_eq!(copied.private_bytes, 4 * PAGE);
        assert_eq!(copied.file_bytes, PAGE);
        // Pages 0, 10, 20 and 21; page 30 is zeros.
        assert_eq!(copied.written_bytes, 4 * PAGE);
        let bytes = std::fs::read(&out).expect("read");
        assert_eq!(bytes.len() as u64, len);
        assert!(bytes[..4096].iter().all(|&b| b == 1));
        assert!(bytes[10 * 4096..10 * 4096 + 100].iter().all(|&b| b == 7));
        assert!(bytes[10 * 4096 + 100..11 * 4096].iter().all(|&b| b == 2));
        assert!(bytes[20 * 4096..22 * 4096].iter().all(|&b| b == 9));
        assert!(bytes[4096..10 * 4096].iter().all(|&b| b == 0));
        assert!(bytes[30 * 4096..31 * 4096].iter().all(|&b| b == 0));
    }
}
