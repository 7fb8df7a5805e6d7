//! The guest kernel package: Debian's `linux-image-cloud-amd64`, fetched with
//! `apt-get download` and unpacked with `dpkg-deb -x` into Hutch's state directory. Nothing
//! is installed on the host.
//!
//! `linux-image-cloud-amd64` is a metapackage; its `Depends` names the versioned image
//! package (`linux-image-6.1.0-57-cloud-amd64`), which is the one unpacked. Layout:
//!
//! ```text
//! <dir>/<deb file stem>/root/     the unpacked package (boot/vmlinuz-*, lib/modules/*)
//! <dir>/<deb file stem>/complete  written last: the unpack is whole
//! <dir>/.lock                     flock held while fetching
//! ```
//!
//! Once one version is unpacked it is used without asking the registry again (the newest
//! complete one wins); delete the directory to fetch the current one.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::lock::FileLock;

/// The metapackage that always depends on the current cloud kernel.
pub const META_PACKAGE: &str = "linux-image-cloud-amd64";
/// Marker written once a package is fully unpacked.
const COMPLETE: &str = "complete";

/// Why the kernel package could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// A tool failed or is missing.
    #[error("{0}")]
    Tool(String),
    /// The metapackage names no image package.
    #[error("{META_PACKAGE} depends on no linux-image package ({0:?})")]
    NoImage(String),
    /// The unpacked package has no kernel image.
    #[error("no boot/vmlinuz-* in {0}")]
    NoKernel(String),
    /// Filesystem work.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PackageError {
    let what = what.into();
    move |source| PackageError::Io { what, source }
}

fn run(cmd: &mut Command, what: &str) -> Result<String, PackageError> {
    let out = cmd
        .output()
        .map_err(|e| PackageError::Tool(format!("{what}: {e} (is apt installed?)")))?;
    if !out.status.success() {
        return Err(PackageError::Tool(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// An unpacked kernel package.
#[derive(Debug, Clone)]
pub struct KernelPackage {
    /// Its name and version (the `.deb` file stem).
    pub name: String,
    /// The unpacked tree.
    pub root: PathBuf,
}

impl KernelPackage {
    /// Use an already unpacked tree (for operators who bring their own).
    pub fn at(root: &Path) -> Self {
        Self {
            name: root.display().to_string(),
            root: root.to_path_buf(),
        }
    }

    /// The compressed kernel image (`boot/vmlinuz-*`).
    pub fn vmlinuz(&self) -> Result<PathBuf, PackageError> {
        let boot = self.root.join("boot");
        std::fs::read_dir(&boot)
            .map_err(io(format!("read {}", boot.display())))?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
            .ok_or_else(|| PackageError::NoKernel(self.root.display().to_string()))
    }

    /// The module tree (`lib/modules/<release>`).
    pub fn module_dir(&self) -> Result<PathBuf, PackageError> {
        let dir = self.root.join("lib/modules");
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(io(format!("read {}", dir.display())))?
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        entries
            .pop()
            .ok_or_else(|| PackageError::NoKernel(self.root.display().to_string()))
    }
}

/// The newest complete package under `dir`, fetching one from Debian's registry if there
/// is none.
pub fn ensure(dir: &Path) -> Result<KernelPackage, PackageError> {
    if let Some(found) = newest(dir) {
        return Ok(found);
    }
    std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    let _lock = FileLock::exclusive(&dir.join(".lock")).map_err(io("lock the kernel cache"))?;
    if let Some(found) = newest(dir) {
        return Ok(found);
    }
    fetch(dir)
}

fn newest(dir: &Path) -> Option<KernelPackage> {
    let mut found: Vec<KernelPackage> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.path().join(COMPLETE).is_file())
        .map(|e| KernelPackage {
            name: e.file_name().to_string_lossy().into_owned(),
            root: e.path().join("root"),
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found.pop()
}

/// The versioned image package a metapackage's `Depends` field names.
pub fn image_dependency(depends: &str) -> Option<String> {
    depends
        .split(',')
        .flat_map(|alt| alt.split('|'))
        .map(|d| d.split_whitespace().next().unwrap_or_default())
        .find(|name| name.starts_with("linux-image-") && *name != META_PACKAGE)
        .map(String::from)
}

fn fetch(dir: &Path) -> Result<KernelPackage, PackageError> {
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(io(format!("create {}", work.display())))?;
    let result = fetch_into(dir, &work);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn fetch_into(dir: &Path, work: &Path) -> Result<KernelPackage, PackageError> {
    let download = |name: &str| -> Result<PathBuf, PackageError> {
        run(
            Command::new("apt-get")
                .args(["download", "-q", name])
                .current_dir(work),
            &format!("apt-get download {name}"),
        )?;
        std::fs::read_dir(work)
            .map_err(io(format!("read {}", work.display())))?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    n.starts_with(&format!("{name}_")) && n.ends_with(".deb")
                })
            })
            .ok_or_else(|| PackageError::Tool(format!("apt-get download {name} left no .deb")))
    };
    let meta = download(META_PACKAGE)?;
    let depends = run(
        Command::new("dpkg-deb").arg("-f").arg(&meta).arg("Depends"),
        "dpkg-deb -f",
    )?;
    let image_name = image_dependency(&depends).ok_or(PackageError::NoImage(depends))?;
    let deb = download(&image_name)?;
    let stem = deb
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or(image_name);
    let unpacked = work.join("root");
    run(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked),
        "dpkg-deb -x",
    )?;
    let target = dir.join(&stem);
    let _ = std::fs::remove_dir_all(&target);
    std::fs::create_dir_all(&target).map_err(io(format!("create {}", target.display())))?;
    std::fs::rename(&unpacked, target.join("root")).map_err(io(format!(
        "move the unpacked kernel to {}",
        target.display()
    )))?;
    let package = KernelPackage {
        name: stem,
        root: target.join("root"),
    };
    package.vmlinuz()?;
    std::fs::write(target.join(COMPLETE), b"").map_err(io("mark the kernel complete"))?;
    tracing::info!(package = %package.name, "guest kernel fetched from Debian's registry");
    Ok(package)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_image_dependency() {
        assert_eq!(
            image_dependency("linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)").as_deref(),
            Some("linux-image-6.1.0-57-cloud-amd64")
        );
        assert_eq!(
            image_dependency("foo, linux-image-6.12.9-cloud-amd64-unsigned | bar").as_deref(),
            Some("linux-image-6.12.9-cloud-amd64-unsigned")
        );
        assert_eq!(image_dependency("foo (>= 1)"), None);
    }

    #[test]
    fn only_complete_unpacks_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("a_1/root")).expect("mkdir");
        assert!(newest(dir.path()).is_none());
        std::fs::write(dir.path().join("a_1/complete"), b"").expect("mark");
        std::fs::create_dir_all(dir.path().join("a_2/root")).expect("mkdir");
        let found = newest(dir.path()).expect("one");
        assert_eq!(found.name, "a_1");
        assert_eq!(found.root, dir.path().join("a_1/root"));
    }
}
