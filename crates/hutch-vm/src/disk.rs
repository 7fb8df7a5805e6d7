//! Disks: the ext4 image of a template and the qcow2 overlays stacked on it.
//!
//! A template's root directory becomes an ext4 image with `mkfs.ext4 -d` (no loop mount, no
//! privileges beyond reading the tree). The image is never written: the bake of a snapshot
//! boots on a qcow2 overlay of it, and every sandbox restored from that snapshot gets its
//! own qcow2 overlay of the bake's overlay (`qemu-img create -b`), deleted with the sandbox.
//!
//! The host knows every disk's chain from having made it ([`RootDisk`]) and never reads a
//! backing file name from an image: a guest's QEMU can write its overlay's header.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Why a disk could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// A tool is not installed.
    #[error("{tool} not found; install Debian's {package} package")]
    MissingTool {
        /// The program.
        tool: &'static str,
        /// The package that has it.
        package: &'static str,
    },
    /// A tool failed.
    #[error("{tool} failed ({status}): {stderr}")]
    Failed {
        /// The program.
        tool: &'static str,
        /// Its exit status.
        status: String,
        /// What it said.
        stderr: String,
    },
    /// A recorded disk chain that cannot be used.
    #[error("the disk chain recorded in {record}: {problem}", record = record.display())]
    Chain {
        /// The record.
        record: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A tool did not finish within its deadline and was killed.
    #[error("{0}")]
    HostCommand(#[from] hutch_host_command::HostCommandError),
    /// Filesystem work around the images.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// Slowest rate an image build may write at before its deadline kills it: 4 MiB/s, a
/// tenth of what a busy disk of these machines manages for `mkfs.ext4 -d`.
const IMAGE_BUILD_FLOOR_MIB_PER_S: u64 = 4;

/// The deadline of building an image of `size_mib` MiB: the host-command deadline plus the
/// time to write it at [`IMAGE_BUILD_FLOOR_MIB_PER_S`] (its time grows with the template).
pub fn image_build_deadline(size_mib: u64) -> Duration {
    hutch_host_command::timeout() + Duration::from_secs(size_mib / IMAGE_BUILD_FLOOR_MIB_PER_S)
}

/// Run `tool` within `limit` (killed and reaped past it).
fn run(
    tool: &'static str,
    package: &'static str,
    cmd: &mut Command,
    limit: Duration,
) -> Result<(), DiskError> {
    let out = hutch_host_command::run_within(cmd, None, limit).map_err(|e| match e {
        hutch_host_command::HostCommandError::Spawn { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            DiskError::MissingTool { tool, package }
        }
        hutch_host_command::HostCommandError::Spawn { source, .. } => DiskError::Io {
            what: format!("run {tool}"),
            source,
        },
        other => DiskError::HostCommand(other),
    })?;
    if !out.success() {
        return Err(DiskError::Failed {
            tool,
            status: out.how(),
            stderr: out.stderr_text(),
        });
    }
    Ok(())
}

/// Make an ext4 image of `size_mib` MiB at `out` holding the tree under `root` (ownership
/// and modes kept). Written to a temporary name and renamed, so `out` is always complete.
/// No journal: the image is read-only and every writer is a disposable overlay.
pub fn make_ext4(root: &Path, out: &Path, size_mib: u64) -> Result<(), DiskError> {
    let tmp = out.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let made = run(
        "mkfs.ext4",
        "e2fsprogs",
        Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-t",
                "ext4",
                "-O",
                "^has_journal",
                "-L",
                "hutch-root",
            ])
            .args(["-E", "root_owner=0:0,lazy_itable_init=0", "-m", "0", "-d"])
            .arg(root)
            .arg(&tmp)
            .arg(format!("{size_mib}M")),
        image_build_deadline(size_mib),
    );
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out).map_err(|source| DiskError::Io {
        what: format!("rename {} to {}", tmp.display(), out.display()),
        source,
    })
}

/// The format of one image of a root disk's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// A template's ext4 image.
    Raw,
    /// An overlay (a bake's disk, a sandbox's disk).
    Qcow2,
}

impl ImageFormat {
    /// QEMU's name of the format.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Raw => "raw",
            ImageFormat::Qcow2 => "qcow2",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "raw" => Some(ImageFormat::Raw),
            "qcow2" => Some(ImageFormat::Qcow2),
            _ => None,
        }
    }
}

/// One image below a root disk's top image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackingFile {
    /// Its absolute path on the host.
    pub path: PathBuf,
    /// Its format.
    pub format: ImageFormat,
}

/// A guest's root disk: the image QEMU writes (`top`) and the chain of read-only images
/// below it, nearest first, **as the host made it**. The chain is never read back from an
/// image's header: a guest's QEMU can rewrite its overlay's header (a plain write to the
/// file), so the host names every backing file itself — on QEMU's command line
/// ([`RootDisk::drive_options`], which overrides the header), in QEMU's jail (only these
/// files are bound) and in its own records ([`RootDisk::save_chain`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootDisk {
    /// The image the guest writes (a qcow2 overlay; a bare raw image for tests).
    pub top: PathBuf,
    /// Its format.
    pub format: ImageFormat,
    /// The images below it, nearest first; the last one is raw.
    pub backing: Vec<BackingFile>,
}

/// First line of a recorded chain ([`RootDisk::save_chain`]), with its format version.
const CHAIN_HEADER: &str = "hutch-disk-chain 1";

impl RootDisk {
    /// A raw image alone (a template's image, before any overlay).
    pub fn raw(image: &Path) -> Self {
        Self {
            top: image.to_path_buf(),
            format: ImageFormat::Raw,
            backing: Vec::new(),
        }
    }

    /// A qcow2 `top` over the recorded chain `backing`.
    pub fn qcow2(top: &Path, backing: Vec<BackingFile>) -> Self {
        Self {
            top: top.to_path_buf(),
            format: ImageFormat::Qcow2,
            backing,
        }
    }

    /// The disk with `top` as its image over the same chain (a copy of this disk's top).
    pub fn with_top(&self, top: &Path) -> Self {
        Self {
            top: top.to_path_buf(),
            ..self.clone()
        }
    }

    /// The chain a new overlay of this disk has: this disk's top, then its chain.
    pub fn chain_below_overlay(&self) -> Vec<BackingFile> {
        let mut chain = vec![BackingFile {
            path: self.top.clone(),
            format: self.format,
        }];
        chain.extend(self.backing.iter().cloned());
        chain
    }

    /// Create a qcow2 overlay at `out` of this disk (only changed clusters are stored in
    /// it) and return it. `qemu-img` is told the backing format and size and does not open
    /// the backing file (`-u`), so no image header decides what the host opens.
    pub fn overlay_at(&self, out: &Path) -> Result<RootDisk, DiskError> {
        let size = match self.format {
            ImageFormat::Raw => {
                std::fs::metadata(&self.top)
                    .map(|m| m.len())
                    .map_err(|source| DiskError::Io {
                        what: format!("stat {}", self.top.display()),
                        source,
                    })?
            }
            ImageFormat::Qcow2 => qcow2_virtual_size(&self.top).ok_or_else(|| DiskError::Io {
                what: format!("read the size of {}", self.top.display()),
                source: std::io::ErrorKind::InvalidData.into(),
            })?,
        };
        run(
            "qemu-img",
            "qemu-utils",
            Command::new("qemu-img")
                .args([
                    "create",
                    "-q",
                    "-f",
                    "qcow2",
                    "-u",
                    "-F",
                    self.format.as_str(),
                    "-b",
                ])
                .arg(&self.top)
                .arg(out)
                .arg(size.to_string()),
            hutch_host_command::timeout(),
        )?;
        Ok(RootDisk::qcow2(out, self.chain_below_overlay()))
    }

    /// The block options of QEMU's `-drive` for this disk (without `if`/`id`): the top
    /// image, then every backing image named explicitly (`backing.driver`,
    /// `backing.file.filename`, …), so QEMU never takes a name from an image's header.
    /// Commas in paths are doubled.
    pub fn drive_options(&self) -> String {
        let mut options = format!("file={},format={}", escape(&self.top), self.format.as_str());
        let mut prefix = String::new();
        for layer in &self.backing {
            prefix.push_str("backing.");
            options.push_str(&format!(
                ",{prefix}driver={},{prefix}file.filename={}",
                layer.format.as_str(),
                escape(&layer.path)
            ));
        }
        // A chain ending in a qcow2 image (never one of ours: they end in a template's raw
        // image) stops there instead of following that image's header (`backing=""`, which
        // QEMU 7.2 takes but calls deprecated).
        let last = self.backing.last().map_or(self.format, |b| b.format);
        if last == ImageFormat::Qcow2 {
            options.push_str(&format!(",{prefix}backing="));
        }
        options
    }

    /// Every image of the disk: the top, then its chain.
    pub fn images(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.top.as_path()).chain(self.backing.iter().map(|b| b.path.as_path()))
    }

    /// Record this disk's chain (not its top) in `record`, a file of the host's own that no
    /// QEMU can write. Format: the line `hutch-disk-chain 1`, then one line per backing
    /// image, nearest first: its format (`raw` or `qcow2`), a tab, its absolute path.
    /// Written to a temporary name and renamed.
    pub fn save_chain(&self, record: &Path) -> Result<(), DiskError> {
        let mut text = format!("{CHAIN_HEADER}\n");
        for layer in &self.backing {
            let path = layer
                .path
                .to_str()
                .filter(|p| layer.path.is_absolute() && !p.contains(['\n', '\t']));
            let Some(path) = path else {
                return Err(DiskError::Chain {
                    record: record.to_path_buf(),
                    problem: format!("cannot record the path {}", layer.path.display()),
                });
            };
            text.push_str(&format!("{}\t{path}\n", layer.format.as_str()));
        }
        let tmp = record.with_extension("tmp");
        create_fresh(&tmp)
            .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
            .and_then(|()| std::fs::rename(&tmp, record))
            .map_err(|source| DiskError::Io {
                what: format!("write {}", record.display()),
                source,
            })
    }

    /// The disk whose top is `top` over the chain recorded in `record`
    /// ([`RootDisk::save_chain`]).
    pub fn load_chain(top: &Path, record: &Path) -> Result<RootDisk, DiskError> {
        let bad = |problem: &str| DiskError::Chain {
            record: record.to_path_buf(),
            problem: problem.to_string(),
        };
        let text = std::fs::read_to_string(record).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => bad("no chain was recorded"),
            _ => bad(&e.to_string()),
        })?;
        let mut lines = text.lines();
        if lines.next() != Some(CHAIN_HEADER) {
            return Err(bad("not a disk chain record"));
        }
        let mut backing = Vec::new();
        for line in lines {
            let (format, path) = line
                .split_once('\t')
                .ok_or_else(|| bad("a line without a tab"))?;
            let format = ImageFormat::parse(format).ok_or_else(|| bad("an unknown format"))?;
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(bad("a relative path"));
            }
            backing.push(BackingFile { path, format });
        }
        Ok(RootDisk::qcow2(top, backing))
    }
}

/// Escape a path for a QEMU option value (commas are doubled).
fn escape(path: &Path) -> String {
    path.to_string_lossy().replace(',', ",,")
}

/// The virtual size (what the guest sees) in the header of the qcow2 image at `path`.
pub fn qcow2_virtual_size(path: &Path) -> Option<u64> {
    use std::io::Read;
    let mut header = [0u8; 32];
    std::fs::File::open(path)
        .ok()?
        .read_exact(&mut header)
        .ok()?;
    if &header[..4] != b"QFI\xfb" {
        return None;
    }
    Some(u64::from_be_bytes(header[24..32].try_into().ok()?))
}

/// Bytes used by the files under `root` (apparent sizes, hard links counted once), to
/// size an image. Does not follow symlinks or cross into other filesystems' mounts.
pub fn tree_bytes(root: &Path) -> Result<u64, DiskError> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    let dev = std::fs::symlink_metadata(root)
        .map_err(|source| DiskError::Io {
            what: format!("stat {}", root.display()),
            source,
        })?
        .dev();
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| DiskError::Io {
            what: format!("read {}", dir.display()),
            source,
        })?;
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != dev {
                continue;
            }
            if meta.is_dir() {
                total += 4096;
                stack.push(entry.path());
            } else if meta.nlink() <= 1 || seen.insert(meta.ino()) {
                total += meta.len().div_ceil(4096) * 4096;
            }
        }
    }
    Ok(total)
}

/// Create `path` anew for the host to write (as root) in a directory a QEMU may write too:
/// whatever is there is unlinked first (a planted symlink is removed, not followed) and
/// the file is created exclusively (`O_EXCL` never follows a link; should one reappear
/// meanwhile, this fails).
pub fn create_fresh(path: &Path) -> std::io::Result<std::fs::File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_build_gets_more_time_the_bigger_the_image() {
        let base = hutch_host_command::timeout();
        assert_eq!(image_build_deadline(0), base);
        // 8 GiB at the floor rate: 2048 s on top of the host-command deadline.
        assert_eq!(image_build_deadline(8192), base + Duration::from_secs(2048));
        assert!(image_build_deadline(1024) < image_build_deadline(2048));
    }

    #[test]
    fn a_fresh_file_never_follows_a_planted_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("precious");
        std::fs::write(&target, b"keep").expect("write");
        let log = dir.path().join("qemu.log");
        std::os::unix::fs::symlink(&target, &log).expect("symlink");
        use std::io::Write;
        create_fresh(&log)
            .expect("create")
            .write_all(b"log")
            .expect("write");
        assert_eq!(std::fs::read(&target).expect("read"), b"keep");
        assert_eq!(std::fs::read(&log).expect("read"), b"log");
        assert!(!std::fs::symlink_metadata(&log)
            .expect("stat")
            .file_type()
            .is_symlink());
    }

    #[test]
    fn image_and_overlay_of_a_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("etc")).expect("mkdir");
        std::fs::write(root.join("etc/hostname"), b"hutch\n").expect("write");
        assert!(tree_bytes(&root).expect("size") >= 4096);
        let image = dir.path().join("root.ext4");
        match make_ext4(&root, &image, 16) {
            Err(DiskError::MissingTool { .. }) => return, // not a machine for this test
            other => other.expect("mkfs.ext4"),
        }
        assert_eq!(
            std::fs::metadata(&image).expect("image").len(),
            16 << 20,
            "sized as asked"
        );
        let overlay = dir.path().join("disk.qcow2");
        let bake = match RootDisk::raw(&image).overlay_at(&overlay) {
            Err(DiskError::MissingTool { .. }) => return,
            other => other.expect("qemu-img"),
        };
        let head = std::fs::read(&overlay).expect("overlay");
        assert_eq!(&head[..4], b"QFI\xfb", "a qcow2 file");
        assert_eq!(qcow2_virtual_size(&overlay), Some(16 << 20));
        assert_eq!(qcow2_virtual_size(&image), None);
        // What qemu-img wrote in the header is what the host recorded.
        let info = Command::new("qemu-img")
            .args(["info", "-U", "--output=json"])
            .arg(&overlay)
            .output()
            .expect("qemu-img info");
        let info: serde_json::Value = serde_json::from_slice(&info.stdout).expect("json");
        assert_eq!(info["backing-filename"], image.display().to_string());
        assert_eq!(info["backing-filename-format"], "raw");
        assert_eq!(
            bake.backing,
            [BackingFile {
                path: image.clone(),
                format: ImageFormat::Raw
            }]
        );
        // An overlay of the overlay: its chain is the overlay, then the image.
        let sandbox = bake
            .overlay_at(&dir.path().join("sandbox.qcow2"))
            .expect("second overlay");
        assert_eq!(
            sandbox.images().collect::<Vec<_>>(),
            [
                dir.path().join("sandbox.qcow2").as_path(),
                overlay.as_path(),
                image.as_path()
            ]
        );
        assert_eq!(
            sandbox.drive_options(),
            format!(
                "file={},format=qcow2,backing.driver=qcow2,backing.file.filename={},backing.backing.driver=raw,backing.backing.file.filename={}",
                dir.path().join("sandbox.qcow2").display(),
                overlay.display(),
                image.display()
            )
        );
        let record = dir.path().join("disk-chain");
        sandbox.save_chain(&record).expect("record");
        let loaded = RootDisk::load_chain(&dir.path().join("copy.qcow2"), &record).expect("load");
        assert_eq!(loaded, sandbox.with_top(&dir.path().join("copy.qcow2")));
    }

    #[test]
    fn a_chain_record_is_read_strictly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let record = dir.path().join("disk-chain");
        let top = dir.path().join("disk.qcow2");
        let err = RootDisk::load_chain(&top, &record).expect_err("missing");
        assert!(err.to_string().contains("no chain was recorded"), "{err}");
        for (text, problem) in [
            ("qcow2\t/a\n", "not a disk chain record"),
            ("hutch-disk-chain 1\nvmdk\t/a\n", "an unknown format"),
            ("hutch-disk-chain 1\nraw\trelative\n", "a relative path"),
            ("hutch-disk-chain 1\nraw /a\n", "a line without a tab"),
        ] {
            std::fs::write(&record, text).expect("write");
            let err = RootDisk::load_chain(&top, &record).expect_err(text);
            assert!(err.to_string().contains(problem), "{text:?}: {err}");
        }
        let odd = RootDisk::qcow2(
            &top,
            vec![BackingFile {
                path: "/a\nraw\t/etc/shadow".into(),
                format: ImageFormat::Raw,
            }],
        );
        assert!(
            odd.save_chain(&record).is_err(),
            "a path with a newline is refused"
        );
        assert_eq!(
            RootDisk::qcow2(Path::new("/s,1/d"), vec![]).drive_options(),
            "file=/s,,1/d,format=qcow2,backing="
        );
    }

    #[test]
    fn a_missing_tree_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = make_ext4(&dir.path().join("nope"), &dir.path().join("x.ext4"), 16);
        assert!(err.is_err());
        assert!(!dir.path().join("x.tmp").exists());
    }
}
