//! The file tree a jailed QEMU sees, decided before the fork: every host path it needs,
//! bound at the same path (so its command line, which names every backing file, stays
//! valid) onto an empty tmpfs root, and nothing else.
//!
//! What QEMU 7.2 opens here (found with `strace -f` on a restore and a bake): its binary, the
//! shared libraries the dynamic loader maps (listed by the loader itself with
//! `LD_TRACE_LOADED_OBJECTS=1`), the TCG accelerator module under `lib/<triple>/qemu`, the
//! microvm firmware under `share/qemu`, the kernel and initramfs, the memory file (read-write
//! even when mapped privately), the root disk and its backing chain (as the host recorded it,
//! never read from the images), `/dev/null`, `/dev/urandom` and, with KVM, `/dev/kvm`; its
//! sockets (the console's too) and a bake's console log go to its own directory. It also looks at `/proc/self/exe` (falls back to `argv[0]`, given absolute),
//! `/proc/filesystems`, `/sys/devices/system/{cpu,node}`, `/etc/ld.so.cache` and
//! `/etc/localtime`, and runs fine without them.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::disk::RootDisk;
use crate::qemu::config::{Accel, Console, VmConfig, VolumeDrive};
use crate::qemu::error::QemuError;

/// How a bound path may be used (the flags of its read-only or read-write remount).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Access {
    /// The QEMU binary, its libraries and modules: read-only, executable.
    Program,
    /// Kernel, initramfs, firmware, backing images: read-only, not executable.
    Data,
    /// QEMU's own directory and a memory file outside it: read-write, not executable.
    Writable,
    /// A device node QEMU reads and writes (`/dev/null`, `/dev/kvm`).
    Device,
    /// A device node QEMU only reads (`/dev/urandom`).
    DeviceReadOnly,
}

impl Access {
    /// Flags of the `MS_REMOUNT | MS_BIND` that follows the bind.
    pub(crate) fn flags(self) -> libc::c_ulong {
        let fixed = libc::MS_NOSUID;
        fixed
            | match self {
                Access::Program => libc::MS_RDONLY | libc::MS_NODEV,
                Access::Data => libc::MS_RDONLY | libc::MS_NODEV | libc::MS_NOEXEC,
                Access::Writable => libc::MS_NODEV | libc::MS_NOEXEC,
                Access::Device => libc::MS_NOEXEC,
                Access::DeviceReadOnly => libc::MS_RDONLY | libc::MS_NOEXEC,
            }
    }
}

/// One bind mount into the new root (at the same path as on the host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bind {
    /// The absolute path, on the host and in the jail.
    pub path: PathBuf,
    /// A directory (else a file or device node).
    pub dir: bool,
    /// How QEMU may use it.
    pub access: Access,
}

/// QEMU's new root: its own directory (read-write; the tmpfs root is mounted on it in the
/// child's mount namespace, so it is bound from a descriptor) and every other bind, sorted so
/// that parents come first, none inside another directory bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RootPlan {
    /// The directory with QEMU's sockets and logs (the directory of its QMP socket).
    pub own_dir: PathBuf,
    /// Everything bound, `own_dir` included.
    pub binds: Vec<Bind>,
}

/// The files of one QEMU installation that a jailed QEMU needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProgramFiles {
    /// The binary, canonical (exec'd by this path, also as `argv[0]`, so QEMU finds its
    /// modules and firmware relative to it without `/proc`).
    pub binary: PathBuf,
    /// Shared libraries, including the dynamic loader, at the paths the loader uses.
    pub libraries: Vec<PathBuf>,
    /// Module directories (`<prefix>/lib/<triple>/qemu`: the TCG accelerator is a module).
    pub modules: Vec<PathBuf>,
    /// Data directories (`<prefix>/share/qemu`: firmware).
    pub data: Vec<PathBuf>,
}

fn jail_error(what: impl Into<String>) -> QemuError {
    QemuError::Jail(what.into())
}

/// `path` made absolute against `cwd` and normalized lexically (`.` and `..` removed).
pub(crate) fn absolute(path: &Path, cwd: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

impl RootPlan {
    /// The root for `config`, whose QEMU installation is `program`; relative paths are
    /// taken from `cwd` (they must be made absolute on QEMU's command line too, see
    /// [`with_absolute_paths`]).
    pub(crate) fn new(
        config: &VmConfig,
        program: &ProgramFiles,
        cwd: &Path,
    ) -> Result<Self, QemuError> {
        let abs = |p: &Path| absolute(p, cwd);
        let own_dir = config
            .qmp_socket
            .parent()
            .map(abs)
            .ok_or_else(|| jail_error("the QMP socket has no directory"))?;
        if own_dir == Path::new("/") {
            return Err(jail_error("QEMU's directory cannot be /"));
        }
        let inside = |p: &Path| {
            let p = abs(p);
            p != own_dir && p.starts_with(&own_dir)
        };
        // What QEMU creates must be created in its own directory.
        let created = [
            Some(("agent socket", &config.agent_socket)),
            match &config.console {
                Console::File(path) => Some(("console log", path)),
                Console::Ring { socket, .. } => Some(("console socket", socket)),
                Console::Discard => None,
            },
        ];
        for (what, path) in created.into_iter().flatten() {
            if !inside(path) {
                return Err(jail_error(format!(
                    "the {what} {} is not in QEMU's directory {}",
                    path.display(),
                    own_dir.display()
                )));
            }
        }
        // The host writes the console ring as root: never where QEMU could plant a link.
        if let Console::Ring { ring, .. } = &config.console {
            if abs(&ring.path).starts_with(&own_dir) {
                return Err(jail_error(format!(
                    "the console ring {} is in QEMU's directory {}",
                    ring.path.display(),
                    own_dir.display()
                )));
            }
        }
        let mut binds: BTreeMap<PathBuf, Bind> = BTreeMap::new();
        let mut add = |path: &Path, dir: bool, access: Access| {
            let path = abs(path);
            if path != own_dir && path.starts_with(&own_dir) {
                return; // visible through the bind of the directory
            }
            binds
                .entry(path.clone())
                .or_insert(Bind { path, dir, access });
        };
        add(&own_dir, true, Access::Writable);
        add(&program.binary, false, Access::Program);
        for lib in &program.libraries {
            add(lib, false, Access::Program);
        }
        for dir in &program.modules {
            add(dir, true, Access::Program);
        }
        for dir in &program.data {
            add(dir, true, Access::Data);
        }
        add(&config.kernel, false, Access::Data);
        add(&config.initrd, false, Access::Data);
        // QEMU 7.2 opens a memory-backend-file read-write even with share=off.
        if config.memory_file.exists() {
            add(&config.memory_file, false, Access::Writable);
        } else if !inside(&config.memory_file) {
            return Err(jail_error(format!(
                "the memory file {} does not exist and is not in QEMU's directory",
                config.memory_file.display()
            )));
        }
        // The root disk's chain as the host recorded it (never read from the images: a
        // guest's QEMU can rewrite its overlay's header).
        if let Some(disk) = &config.root_disk {
            add(&disk.top, false, Access::Writable);
            for layer in &disk.backing {
                add(&layer.path, false, Access::Data);
            }
        }
        // Attached volumes only (an empty slot opens no file); a read-only one is bound
        // read-only, so QEMU could not write it even if it tried.
        for volume in config.volumes.iter().flatten() {
            let access = if volume.read_only {
                Access::Data
            } else {
                Access::Writable
            };
            add(&volume.image, false, access);
        }
        add(Path::new("/dev/null"), false, Access::Device);
        add(Path::new("/dev/urandom"), false, Access::DeviceReadOnly);
        if config.accel == Accel::Kvm {
            add(Path::new("/dev/kvm"), false, Access::Device);
        }
        // Sorted by path (parents first); drop what a directory bind already shows.
        let mut kept: Vec<Bind> = Vec::new();
        for bind in binds.into_values() {
            let covered = kept
                .iter()
                .any(|k| k.dir && bind.path != k.path && bind.path.starts_with(&k.path));
            if !covered {
                kept.push(bind);
            }
        }
        Ok(Self {
            own_dir,
            binds: kept,
        })
    }

    /// Directories to create in the empty root (relative to it), parents first: every
    /// bind's ancestors and the directory binds themselves.
    pub(crate) fn directories(&self) -> Vec<PathBuf> {
        let mut dirs = std::collections::BTreeSet::new();
        for (path, dir) in self.binds.iter().map(|b| (b.path.as_path(), b.dir)) {
            let relative = path.strip_prefix("/").unwrap_or(path);
            let mut ancestors: Vec<&Path> = relative
                .ancestors()
                .filter(|a| !a.as_os_str().is_empty())
                .collect();
            if !dir {
                ancestors.remove(0);
            }
            dirs.extend(ancestors.into_iter().map(Path::to_path_buf));
        }
        // Nothing below a directory bind (it would be created in the bound directory).
        dirs.into_iter()
            .filter(|d| {
                !self.binds.iter().any(|b| {
                    let bound = b.path.strip_prefix("/").unwrap_or(&b.path);
                    b.dir && d != bound && d.starts_with(bound)
                })
            })
            .collect()
    }
}

/// `config` with every path QEMU opens made absolute against `cwd` (QEMU starts in the root
/// of its jail, where the server's working directory does not exist).
pub(crate) fn with_absolute_paths(config: &VmConfig, cwd: &Path) -> VmConfig {
    let abs = |p: &Path| absolute(p, cwd);
    VmConfig {
        kernel: abs(&config.kernel),
        initrd: abs(&config.initrd),
        memory_file: abs(&config.memory_file),
        qmp_socket: abs(&config.qmp_socket),
        agent_socket: abs(&config.agent_socket),
        console: match &config.console {
            Console::Discard => Console::Discard,
            Console::File(path) => Console::File(abs(path)),
            Console::Ring { socket, ring } => Console::Ring {
                socket: abs(socket),
                ring: ring.clone(),
            },
        },
        root_disk: config.root_disk.as_ref().map(|disk| RootDisk {
            top: abs(&disk.top),
            ..disk.clone()
        }),
        volumes: config.volumes.clone().map(|slot| {
            slot.map(|v| VolumeDrive {
                image: abs(&v.image),
                ..v
            })
        }),
        ..config.clone()
    }
}

/// Parse the dynamic loader's `LD_TRACE_LOADED_OBJECTS` output into library paths.
pub(crate) fn parse_loaded_objects(text: &str) -> Result<Vec<PathBuf>, String> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("not found") {
            return Err(line.to_string());
        }
        // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)", "/lib64/ld-linux….so.2 (0x…)",
        // "linux-vdso.so.1 (0x…)" (in the kernel, nothing to bind).
        if let Some(path) = line.split_whitespace().find(|w| w.starts_with('/')) {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// The binary `qemu` names: as given when it has a `/`, else found on `PATH`.
fn resolve_binary(qemu: &Path) -> Result<PathBuf, QemuError> {
    use std::os::unix::ffi::OsStrExt;
    let found = if qemu.as_os_str().as_bytes().contains(&b'/') {
        Some(qemu.to_path_buf())
    } else {
        let path =
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        std::env::split_paths(&path)
            .map(|dir| dir.join(qemu))
            .find(|candidate| candidate.is_file())
    };
    found
        .and_then(|p| std::fs::canonicalize(p).ok())
        .ok_or_else(|| QemuError::Missing(qemu.display().to_string()))
}

/// What identifies one installed binary (a package upgrade replaces the file).
type BinaryKey = (PathBuf, u64, i64, i64);

fn cache() -> &'static Mutex<BTreeMap<BinaryKey, Arc<ProgramFiles>>> {
    static CACHE: OnceLock<Mutex<BTreeMap<BinaryKey, Arc<ProgramFiles>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The files the QEMU binary `qemu` needs, found once per installed binary (the loader is
/// asked for its libraries: one run of the binary that maps them and exits).
pub(crate) fn program_files(qemu: &Path) -> Result<Arc<ProgramFiles>, QemuError> {
    use std::os::unix::fs::MetadataExt;
    let binary = resolve_binary(qemu)?;
    let meta = std::fs::metadata(&binary).map_err(|source| QemuError::Io {
        what: format!("stat {}", binary.display()),
        source,
    })?;
    let key = (binary.clone(), meta.ino(), meta.mtime(), meta.mtime_nsec());
    let mut cached = cache()
        .lock()
        .map_err(|_| jail_error("the QEMU file cache is poisoned"))?;
    if let Some(files) = cached.get(&key) {
        return Ok(files.clone());
    }
    let out = std::process::Command::new(&binary)
        .env_clear()
        .env("LD_TRACE_LOADED_OBJECTS", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| QemuError::Io {
            what: format!("list the libraries of {}", binary.display()),
            source,
        })?;
    let libraries =
        parse_loaded_objects(&String::from_utf8_lossy(&out.stdout)).map_err(|line| {
            jail_error(format!(
                "a library of {} is missing: {line}",
                binary.display()
            ))
        })?;
    if libraries.is_empty() {
        return Err(jail_error(format!(
            "the dynamic loader listed no libraries for {} ({})",
            binary.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    // QEMU looks for modules and firmware relative to its binary: <prefix>/bin/qemu-….
    let prefix = binary
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/usr"));
    let existing = |candidates: &[&str]| -> Vec<PathBuf> {
        candidates
            .iter()
            .map(|c| prefix.join(c))
            .filter(|p| p.is_dir())
            .collect()
    };
    let files = Arc::new(ProgramFiles {
        modules: existing(&["lib/x86_64-linux-gnu/qemu", "lib64/qemu", "lib/qemu"]),
        data: existing(&["share/qemu"]),
        binary,
        libraries,
    });
    cached.insert(key, files.clone());
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program() -> ProgramFiles {
        ProgramFiles {
            binary: "/usr/bin/qemu-system-x86_64".into(),
            libraries: vec![
                "/lib/x86_64-linux-gnu/libz.so.1".into(),
                "/lib64/ld-linux-x86-64.so.2".into(),
            ],
            modules: vec!["/usr/lib/x86_64-linux-gnu/qemu".into()],
            data: vec!["/usr/share/qemu".into()],
        }
    }

    #[test]
    fn loader_output() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_loaded_objects(text),
            Ok(vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ])
        );
        assert!(parse_loaded_objects("\tlibfoo.so.1 => not found\n").is_err());
    }

    #[test]
    fn relative_paths_on_the_command_line_become_absolute() {
        let config = VmConfig::new("boot/vmlinux".into(), "/b/initrd".into(), Path::new("s/a"));
        let fixed = with_absolute_paths(&config, Path::new("/srv"));
        assert_eq!(fixed.kernel, Path::new("/srv/boot/vmlinux"));
        assert_eq!(fixed.initrd, Path::new("/b/initrd"));
        assert_eq!(fixed.qmp_socket, Path::new("/srv/s/a/qmp.sock"));
        assert_eq!(fixed.memory_file, Path::new("/srv/s/a/memory"));
    }

    #[test]
    fn absolute_paths_are_normalized() {
        let cwd = Path::new("/srv/hutch");
        assert_eq!(
            absolute(Path::new("state/x"), cwd),
            Path::new("/srv/hutch/state/x")
        );
        assert_eq!(absolute(Path::new("/a/./b/../c"), cwd), Path::new("/a/c"));
        assert_eq!(absolute(Path::new("../../.."), cwd), Path::new("/"));
    }

    #[test]
    fn restore_binds_only_what_qemu_needs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let own = dir.path().join("sandboxes/a");
        std::fs::create_dir_all(&own).expect("mkdir");
        let memory = dir.path().join("bakes/k/memory");
        std::fs::create_dir_all(memory.parent().expect("parent")).expect("mkdir");
        std::fs::write(&memory, b"").expect("memory");
        let mut config = VmConfig::new("/vm/boot/vmlinux".into(), "/vm/boot/initrd".into(), &own);
        config.memory_file = memory.clone();
        config.console = Console::Ring {
            socket: own.join("console.sock"),
            ring: crate::console::ConsoleRing::new(
                dir.path().join("records/a/console.log"),
                1 << 20,
            ),
        };
        let image = dir.path().join("images/t.ext4");
        let bake_disk = dir.path().join("bakes/k/disk.qcow2");
        config.root_disk = Some(RootDisk::qcow2(
            &own.join("disk.qcow2"),
            vec![
                crate::disk::BackingFile {
                    path: bake_disk.clone(),
                    format: crate::disk::ImageFormat::Qcow2,
                },
                crate::disk::BackingFile {
                    path: image.clone(),
                    format: crate::disk::ImageFormat::Raw,
                },
            ],
        ));
        // Whatever the overlay's header says (a compromised QEMU may have written it), only
        // the recorded chain is bound.
        std::fs::write(own.join("disk.qcow2"), b"QFI\xfb").expect("overlay");
        let plan = RootPlan::new(&config, &program(), Path::new("/")).expect("plan");
        let binds: Vec<(&Path, Access)> = plan
            .binds
            .iter()
            .map(|b| (b.path.as_path(), b.access))
            .collect();
        let mut expected = vec![
            (Path::new("/dev/null"), Access::Device),
            (Path::new("/dev/urandom"), Access::DeviceReadOnly),
            (
                Path::new("/lib/x86_64-linux-gnu/libz.so.1"),
                Access::Program,
            ),
            (Path::new("/lib64/ld-linux-x86-64.so.2"), Access::Program),
            (Path::new("/usr/bin/qemu-system-x86_64"), Access::Program),
            (Path::new("/usr/lib/x86_64-linux-gnu/qemu"), Access::Program),
            (Path::new("/usr/share/qemu"), Access::Data),
            (Path::new("/vm/boot/initrd"), Access::Data),
            (Path::new("/vm/boot/vmlinux"), Access::Data),
            (memory.as_path(), Access::Writable),
            (own.as_path(), Access::Writable),
            (bake_disk.as_path(), Access::Data),
            (image.as_path(), Access::Data),
        ];
        expected.sort();
        let mut sorted = binds.clone();
        sorted.sort();
        assert_eq!(
            sorted, expected,
            "the overlay is in the own directory (no bind), its chain is bound read-only, the console ring is not bound"
        );
        assert_eq!(plan.own_dir, own);
        let dirs = plan.directories();
        assert!(dirs.contains(&PathBuf::from("usr/share/qemu")), "{dirs:?}");
        assert!(dirs.contains(&PathBuf::from("lib64")), "{dirs:?}");
        assert!(!dirs.iter().any(|d| d.ends_with("libz.so.1")), "{dirs:?}");
        // Parents before children.
        let pos = |p: &str| dirs.iter().position(|d| d == Path::new(p)).expect(p);
        assert!(pos("usr") < pos("usr/share") && pos("usr/share") < pos("usr/share/qemu"));
    }

    #[test]
    fn kvm_adds_its_device_and_sockets_must_be_in_the_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = VmConfig::new("/k".into(), "/i".into(), dir.path());
        config.accel = Accel::Kvm;
        let plan = RootPlan::new(&config, &program(), Path::new("/")).expect("plan");
        assert!(plan.binds.iter().any(|b| b.path == Path::new("/dev/kvm")));
        config.console = Console::File("/var/log/console.log".into());
        let err = RootPlan::new(&config, &program(), Path::new("/")).expect_err("outside");
        assert!(err.to_string().contains("console log"), "{err}");
        config.console = Console::Ring {
            socket: dir.path().join("console.sock"),
            ring: crate::console::ConsoleRing::new(dir.path().join("console.log"), 1 << 20),
        };
        let err = RootPlan::new(&config, &program(), Path::new("/")).expect_err("inside");
        assert!(err.to_string().contains("console ring"), "{err}");
        let mut config = VmConfig::new("/k".into(), "/i".into(), dir.path());
        config.memory_file = "/nonexistent/memory".into();
        assert!(RootPlan::new(&config, &program(), Path::new("/")).is_err());
    }
}
