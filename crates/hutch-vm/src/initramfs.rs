//! The guest initramfs: a `newc` cpio archive built in Rust, byte-for-byte reproducible
//! (fixed inode numbers, mtime 0, root-owned).
//!
//! It holds the static `hutch-agent`, a static busybox, the virtio modules in load order
//! and a small `/init` script: mount `/proc`, `/sys`, `/dev`, load the modules, find the
//! virtio-serial port named [`AGENT_PORT`] through `/sys/class/virtio-ports/*/name`, and
//! `exec` the agent on it, so the agent becomes PID 1.

use std::path::{Path, PathBuf};

use crate::modules::Module;

/// Name of the virtio-serial port the agent serves on.
pub const AGENT_PORT: &str = "hutch.agent";

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFCHR: u32 = 0o020_000;

/// Why the initramfs could not be built.
#[derive(Debug, thiserror::Error)]
pub enum InitramfsError {
    /// Reading an input or writing the archive failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A name or file too large for the newc format.
    #[error("{0}: too large for a newc archive")]
    TooLarge(String),
}

/// A writer of `newc` ("070701") cpio archives.
#[derive(Debug, Default)]
pub struct CpioWriter {
    out: Vec<u8>,
    next_ino: u32,
}

impl CpioWriter {
    /// An empty archive.
    pub fn new() -> Self {
        Self {
            out: Vec::new(),
            next_ino: 1,
        }
    }

    fn pad(&mut self) {
        while self.out.len() & 3 != 0 {
            self.out.push(0);
        }
    }

    fn entry(
        &mut self,
        name: &str,
        mode: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> Result<(), InitramfsError> {
        let size = u32::try_from(data.len()).map_err(|_| InitramfsError::TooLarge(name.into()))?;
        let namesize =
            u32::try_from(name.len() + 1).map_err(|_| InitramfsError::TooLarge(name.into()))?;
        let ino = self.next_ino;
        self.next_ino += 1;
        let nlink = if mode & S_IFDIR != 0 { 2 } else { 1 };
        let fields = [
            ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, namesize, 0,
        ];
        self.out.extend_from_slice(b"070701");
        for field in fields {
            self.out
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
        Ok(())
    }

    /// Add a directory (`name` without a leading slash).
    pub fn dir(&mut self, name: &str) -> Result<(), InitramfsError> {
        self.entry(name, S_IFDIR | 0o755, (0, 0), &[])
    }

    /// Add a regular file.
    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> Result<(), InitramfsError> {
        self.entry(name, S_IFREG | (perm & 0o7777), (0, 0), data)
    }

    /// Add a character device node.
    pub fn char_dev(&mut self, name: &str, major: u32, minor: u32) -> Result<(), InitramfsError> {
        self.entry(name, S_IFCHR | 0o600, (major, minor), &[])
    }

    /// Append the trailer and return the archive.
    pub fn finish(mut self) -> Result<Vec<u8>, InitramfsError> {
        self.entry("TRAILER!!!", 0, (0, 0), &[])?;
        Ok(self.out)
    }
}

/// Inputs of the initramfs.
#[derive(Debug, Clone)]
pub struct InitramfsSpec {
    /// The static `hutch-agent` binary.
    pub agent: PathBuf,
    /// A static busybox (runs `/init` and `insmod`).
    pub busybox: PathBuf,
    /// Modules in load order (see [`crate::modules::resolve`]).
    pub modules: Vec<Module>,
}

/// The `/init` script for `modules` (already in load order).
///
/// The loopback interface comes up first, networked or not: services of the sandbox (a
/// template's start command, its ready check, the port proxy) live on it.
/// With a root disk (`/dev/vda`, the sandbox's qcow2 overlay) it mounts it read-write,
/// moves `/dev`, `/proc` and `/sys` into it and moves it over `/`; the agent then
/// `chroot`s into it (`--root .`, as `switch_root` would) and serves from there. The agent
/// binary is run from the initramfs, so templates need not contain it. Without a disk the
/// agent serves from the initramfs itself.
pub fn init_script(modules: &[Module]) -> String {
    let names: Vec<&str> = modules.iter().map(|m| m.name.as_str()).collect();
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /tmp
ip link set lo up || echo "init: cannot bring up the loopback interface"
for m in {modules}; do insmod /lib/modules/$m.ko || echo "init: insmod $m failed"; done
port=
while [ -z "$port" ]; do
  for d in /sys/class/virtio-ports/*; do
    [ "$(cat "$d/name" 2>/dev/null)" = {port} ] && port=/dev/${{d##*/}}
  done
  [ -n "$port" ] || usleep 5000
done
root=
if [ -e /sys/bus/virtio/drivers/virtio_blk ]; then
  for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    [ -b /dev/vda ] && break
    usleep 10000
  done
  mkdir -p /newroot
  if [ -b /dev/vda ] && mount -t ext4 -o rw,noatime /dev/vda /newroot; then
    for d in dev proc sys; do mkdir -p /newroot/$d; mount --move /$d /newroot/$d; done
    mkdir -p /newroot/dev/pts /newroot/dev/shm /newroot/tmp
    mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /newroot/dev/pts
    mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
    cd /newroot && mount --move . / && root=.
  else
    echo "init: cannot mount the root disk /dev/vda; serving from the initramfs"
  fi
fi
[ -n "$root" ] && exec /bin/hutch-agent serve --serial "$port" --root .
exec /bin/hutch-agent serve --serial "$port"
"#,
        modules = names.join(" "),
        port = AGENT_PORT,
    )
}

/// Build the archive in memory.
pub fn build(spec: &InitramfsSpec) -> Result<Vec<u8>, InitramfsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| InitramfsError::Io {
            path: path.display().to_string(),
            source,
        })
    };
    let mut cpio = CpioWriter::new();
    for dir in ["bin", "dev", "proc", "sys", "lib", "lib/modules"] {
        cpio.dir(dir)?;
    }
    cpio.char_dev("dev/console", 5, 1)?;
    cpio.file("bin/busybox", 0o755, &read(&spec.busybox)?)?;
    cpio.file("bin/hutch-agent", 0o755, &read(&spec.agent)?)?;
    for module in &spec.modules {
        cpio.file(
            &format!("lib/modules/{}.ko", module.name),
            0o644,
            &read(&module.path)?,
        )?;
    }
    cpio.file("init", 0o755, init_script(&spec.modules).as_bytes())?;
    cpio.finish()
}

/// Build the archive and write it to `out` (atomically).
pub fn build_file(spec: &InitramfsSpec, out: &Path) -> Result<(), InitramfsError> {
    let archive = build(spec)?;
    let tmp = out.with_extension("tmp");
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| InitramfsError::Io { path, source }
    };
    std::fs::write(&tmp, archive).map_err(io(&tmp))?;
    std::fs::rename(&tmp, out).map_err(io(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (name, mode, rdevmajor, rdevminor, data) of each entry, parsed back.
    fn parse(mut buf: &[u8]) -> Vec<(String, u32, u32, u32, Vec<u8>)> {
        let mut entries = Vec::new();
        let align = |n: usize| n.div_ceil(4) * 4;
        loop {
            assert_eq!(&buf[..6], b"070701");
            let field = |i: usize| {
                let s = std::str::from_utf8(&buf[6 + i * 8..14 + i * 8]).expect("hex");
                u32::from_str_radix(s, 16).expect("hex")
            };
            let (mode, size, namesize) = (field(1), field(6) as usize, field(11) as usize);
            let (rmaj, rmin) = (field(9), field(10));
            let name = String::from_utf8(buf[110..110 + namesize - 1].to_vec()).expect("utf8");
            let data_at = align(110 + namesize);
            let data = buf[data_at..data_at + size].to_vec();
            buf = &buf[align(data_at + size)..];
            if name == "TRAILER!!!" {
                assert!(buf.is_empty());
                return entries;
            }
            entries.push((name, mode, rmaj, rmin, data));
        }
    }

    #[test]
    fn round_trip() {
        let mut cpio = CpioWriter::new();
        cpio.dir("bin").expect("dir");
        cpio.file("bin/a", 0o755, b"hello").expect("file");
        cpio.file("empty", 0o644, b"").expect("file");
        cpio.char_dev("dev/console", 5, 1).expect("dev");
        let archive = cpio.finish().expect("finish");
        assert_eq!(archive.len() % 4, 0);
        let entries = parse(&archive);
        let names: Vec<_> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(names, ["bin", "bin/a", "empty", "dev/console"]);
        assert_eq!(entries[1].1, S_IFREG | 0o755);
        assert_eq!(entries[1].4, b"hello");
        assert_eq!(
            (entries[3].1, entries[3].2, entries[3].3),
            (S_IFCHR | 0o600, 5, 1)
        );
    }

    #[test]
    fn build_is_reproducible_and_lists_modules_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = |n: &str| {
            let path = dir.path().join(n);
            std::fs::write(&path, n.as_bytes()).expect("write");
            path
        };
        let spec = InitramfsSpec {
            agent: p("agent"),
            busybox: p("busybox"),
            modules: vec![
                Module {
                    name: "virtio".into(),
                    path: p("v.ko"),
                },
                Module {
                    name: "virtio_console".into(),
                    path: p("vc.ko"),
                },
            ],
        };
        let a = build(&spec).expect("build");
        assert_eq!(a, build(&spec).expect("build"));
        let entries = parse(&a);
        let init = entries.iter().find(|e| e.0 == "init").expect("init");
        let script = String::from_utf8(init.4.clone()).expect("utf8");
        assert!(script.contains("for m in virtio virtio_console; do"));
        assert!(script.contains("= hutch.agent ]"));
        assert!(entries
            .iter()
            .any(|e| e.0 == "lib/modules/virtio_console.ko" && e.4 == b"vc.ko"));
    }
}
