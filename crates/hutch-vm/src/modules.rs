//! Kernel modules for the guest: find them in an unpacked kernel package and order them.
//!
//! Debian's kernel package ships no `modules.dep` (depmod runs at install time), so the
//! dependencies are read from each module's ELF `.modinfo` section (`depends=a,b`), and
//! modules are loaded dependencies first.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// Why the module set could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// Reading a module or walking the tree failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A wanted module (or a dependency) is not in the tree.
    #[error("module {0} not found (is it compressed, or built into the kernel?)")]
    NotFound(String),
    /// A `.ko` that is not a readable ELF64 file.
    #[error("{0}: not an ELF64 module with a .modinfo section")]
    BadElf(String),
    /// Modules depend on each other in a cycle.
    #[error("dependency cycle through module {0}")]
    Cycle(String),
}

/// One module to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// Its name with `-` normalized to `_`.
    pub name: String,
    /// The `.ko` file.
    pub path: PathBuf,
}

/// Module names treat `-` and `_` alike.
fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

fn le(buf: &[u8], at: usize, n: usize) -> Option<u64> {
    let bytes = buf.get(at..at + n)?;
    Some(
        bytes
            .iter()
            .rev()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)),
    )
}

/// The raw contents of the ELF64 section called `wanted`.
pub fn elf_section<'a>(elf: &'a [u8], wanted: &str) -> Option<&'a [u8]> {
    if !elf.starts_with(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return None; // not ELF64 little-endian
    }
    let shoff = le(elf, 0x28, 8)? as usize;
    let shentsize = le(elf, 0x3a, 2)? as usize;
    let shnum = le(elf, 0x3c, 2)? as usize;
    let shstrndx = le(elf, 0x3e, 2)? as usize;
    let section = |i: usize| -> Option<(u64, &'a [u8])> {
        let h = shoff + i * shentsize;
        let name = le(elf, h, 4)?;
        let offset = le(elf, h + 0x18, 8)? as usize;
        let size = le(elf, h + 0x20, 8)? as usize;
        Some((name, elf.get(offset..offset.checked_add(size)?)?))
    };
    let (_, names) = section(shstrndx)?;
    (0..shnum).find_map(|i| {
        let (name, data) = section(i)?;
        let rest = names.get(name as usize..)?;
        let end = rest.iter().position(|b| *b == 0)?;
        (&rest[..end] == wanted.as_bytes()).then_some(data)
    })
}

/// The `depends=` list of a module's `.modinfo` section.
pub fn depends(elf: &[u8]) -> Option<Vec<String>> {
    let modinfo = elf_section(elf, ".modinfo")?;
    let deps = modinfo
        .split(|b| *b == 0)
        .find_map(|field| field.strip_prefix(b"depends="))
        .unwrap_or_default();
    Some(
        String::from_utf8_lossy(deps)
            .split(',')
            .filter(|d| !d.is_empty())
            .map(normalize)
            .collect(),
    )
}

/// Index every `*.ko` under `dir` by normalized name.
pub fn index(dir: &Path) -> Result<BTreeMap<String, PathBuf>, ModuleError> {
    let mut found = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let io = |source| ModuleError::Io {
            path: d.display().to_string(),
            source,
        };
        for entry in std::fs::read_dir(&d).map_err(io)? {
            let path = entry.map_err(io)?.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Some(stem) = path
                .file_name()
                .and_then(|n| n.to_str()?.strip_suffix(".ko"))
            {
                found.insert(normalize(stem), path);
            }
        }
    }
    Ok(found)
}

/// Resolve `wanted` and everything it depends on, in load order (dependencies first).
pub fn resolve(dir: &Path, wanted: &[&str]) -> Result<Vec<Module>, ModuleError> {
    let index = index(dir)?;
    let mut order = Vec::new();
    let mut done = HashSet::new();
    let mut visiting = HashSet::new();
    for name in wanted {
        visit(
            &index,
            &normalize(name),
            &mut visiting,
            &mut done,
            &mut order,
        )?;
    }
    Ok(order)
}

fn visit(
    index: &BTreeMap<String, PathBuf>,
    name: &str,
    visiting: &mut HashSet<String>,
    done: &mut HashSet<String>,
    order: &mut Vec<Module>,
) -> Result<(), ModuleError> {
    if done.contains(name) {
        return Ok(());
    }
    if !visiting.insert(name.to_string()) {
        return Err(ModuleError::Cycle(name.to_string()));
    }
    let path = index
        .get(name)
        .ok_or_else(|| ModuleError::NotFound(name.to_string()))?;
    let elf = std::fs::read(path).map_err(|source| ModuleError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let deps = depends(&elf).ok_or_else(|| ModuleError::BadElf(path.display().to_string()))?;
    for dep in deps {
        visit(index, &dep, visiting, done, order)?;
    }
    visiting.remove(name);
    done.insert(name.to_string());
    order.push(Module {
        name: name.to_string(),
        path: path.clone(),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 with a section-name table and one `.modinfo` section.
    pub(crate) fn fake_module(modinfo: &[u8]) -> Vec<u8> {
        let shstrtab = b"\0.shstrtab\0.modinfo\0";
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        let strtab_off = elf.len();
        elf.extend(shstrtab);
        let modinfo_off = elf.len();
        elf.extend(modinfo);
        let shoff = elf.len();
        let mut header = |name: u32, off: usize, size: usize| {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            elf.extend(h);
        };
        header(0, 0, 0);
        header(1, strtab_off, shstrtab.len());
        header(11, modinfo_off, modinfo.len());
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        elf
    }

    #[test]
    fn reads_depends() {
        let elf = fake_module(b"license=GPL\0depends=virtio,virtio-ring\0name=x\0");
        assert_eq!(
            depends(&elf),
            Some(vec!["virtio".into(), "virtio_ring".into()])
        );
        assert_eq!(depends(&fake_module(b"depends=\0")), Some(vec![]));
        assert_eq!(depends(b"not elf"), None);
    }

    #[test]
    fn orders_dependencies_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sub = dir.path().join("kernel/drivers");
        std::fs::create_dir_all(&sub).expect("mkdir");
        let write = |name: &str, deps: &str| {
            let info = format!("depends={deps}\0");
            std::fs::write(sub.join(format!("{name}.ko")), fake_module(info.as_bytes()))
                .expect("write");
        };
        write("virtio_ring", "");
        write("virtio", "");
        write("virtio_mmio", "virtio,virtio_ring");
        write("virtio_console", "virtio,virtio_ring");
        let order = resolve(dir.path(), &["virtio_mmio", "virtio-console"]).expect("resolve");
        let names: Vec<_> = order.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            ["virtio", "virtio_ring", "virtio_mmio", "virtio_console"]
        );
        assert!(matches!(
            resolve(dir.path(), &["nope"]),
            Err(ModuleError::NotFound(_))
        ));
    }
}
