//! Packing a layer and unpacking it elsewhere (root needed: owners, `trusted.*`, mknod),
//! and archives that try to reach out of the layer.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::*;
use crate::layer::tests::{mknod, xattr_get as xattr, xattr_set as set_xattr};

fn file(p: &Path, data: &str, uid: u32, mode: u32) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
    std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every entry below `root`: type, owner, mode, time, contents or target, the attributes a
/// layer keeps, and which earlier path shares its inode.
fn describe(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, PathBuf> = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let m = p.symlink_metadata().unwrap();
        let ft = m.file_type();
        let what = if ft.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
            "dir".to_string()
        } else if ft.is_file() {
            match inodes.get(&m.ino()) {
                Some(first) => format!("link to {}", first.display()),
                None => {
                    inodes.insert(m.ino(), rel.clone());
                    format!("file {:?}", std::fs::read_to_string(&p).unwrap())
                }
            }
        } else if ft.is_symlink() {
            format!("symlink {}", std::fs::read_link(&p).unwrap().display())
        } else if ft.is_fifo() {
            "fifo".to_string()
        } else if ft.is_char_device() {
            format!("char {}", m.rdev())
        } else {
            "other".to_string()
        };
        let time = if ft.is_symlink() { 0 } else { m.mtime() };
        out.insert(
            rel,
            format!(
                "{what} {}:{} {:o} t={time} note={:?} opaque={:?}",
                m.uid(),
                m.gid(),
                m.mode() & 0o7777,
                xattr(&p, "user.note"),
                xattr(&p, "trusted.overlay.opaque"),
            ),
        );
    }
    out
}

#[test]
fn a_layer_comes_back_the_same_from_its_archive() {
    let tmp = tempfile::tempdir().unwrap();
    let layer = tmp.path().join("layer");
    std::fs::create_dir(&layer).unwrap();
    std::fs::set_permissions(&layer, std::fs::Permissions::from_mode(0o755)).unwrap();
    file(&layer.join("home/user/notes.txt"), "precious", 1000, 0o640);
    file(&layer.join("usr/bin/tool"), "#!/bin/sh\n", 0, 0o4755);
    set_xattr(&layer.join("home/user/notes.txt"), "user.note", b"kept");
    std::fs::hard_link(
        layer.join("home/user/notes.txt"),
        layer.join("home/notes-link"),
    )
    .unwrap();
    std::os::unix::fs::symlink("/etc/passwd", layer.join("home/user/pw")).unwrap();
    std::os::unix::fs::lchown(layer.join("home/user/pw"), Some(1000), Some(1000)).unwrap();
    mknod(&layer.join("deleted"), libc::S_IFCHR);
    mknod(&layer.join("home/fifo"), libc::S_IFIFO | 0o600);
    std::fs::create_dir(layer.join("opt")).unwrap();
    set_xattr(&layer.join("opt"), "trusted.overlay.opaque", b"y");
    let deep: PathBuf = (0..40).map(|i| format!("directory-{i:02}")).collect();
    file(&layer.join(&deep).join("leaf"), "deep", 7, 0o600);
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    std::fs::File::options()
        .write(true)
        .open(layer.join("usr/bin/tool"))
        .unwrap()
        .set_modified(old)
        .unwrap();

    let archive = tmp.path().join("layer.tar");
    let bytes = pack_layer(&layer, &archive).unwrap();
    assert_eq!(bytes, std::fs::metadata(&archive).unwrap().len());
    let copy = tmp.path().join("copy");
    let stats = unpack_layer(&archive, &copy).unwrap();
    assert_eq!((stats.whiteouts, stats.symlinks), (1, 1), "{stats:?}");
    let (before, after) = (describe(&layer), describe(&copy));
    assert_eq!(before, after);
    let links = [
        Path::new("home/notes-link"),
        Path::new("home/user/notes.txt"),
    ]
    .iter()
    .filter(|p| after[**p].starts_with("link to "))
    .count();
    assert_eq!(links, 1, "{after:?}");
    assert!(after[Path::new("usr/bin/tool")].contains(" 4755 t=1000000000"));
    assert!(after[Path::new("opt")].contains("opaque=Some([121])"));
}

/// An entry of a crafted archive: path, type, link target, PAX records.
type Crafted<'a> = (
    &'a str,
    EntryType,
    Option<&'a str>,
    &'a [(&'a str, &'a [u8])],
);

/// An archive of `entries` with empty bodies, their names written raw.
fn craft(path: &Path, entries: &[Crafted<'_>]) {
    let mut b = Builder::new(File::create(path).unwrap());
    for (name, kind, link, pax) in entries {
        if !pax.is_empty() {
            b.append_pax_extensions(pax.iter().copied()).unwrap();
        }
        let mut h = Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_mode(0o755);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(0);
        if *kind == EntryType::Block {
            h.set_device_major(8).unwrap();
        }
        match link {
            // `set_link_name` checks for `..`; write the raw bytes to test the unpacker.
            Some(target) => {
                let gnu = h.as_gnu_mut().unwrap();
                gnu.linkname[..target.len()].copy_from_slice(target.as_bytes());
                // Write the raw name too: `append_data` refuses `..` itself.
                gnu.name[..name.len()].copy_from_slice(name.as_bytes());
                h.set_cksum();
                b.append(&h, std::io::empty()).unwrap();
            }
            None => {
                let gnu = h.as_gnu_mut().unwrap();
                gnu.name[..name.len()].copy_from_slice(name.as_bytes());
                h.set_cksum();
                b.append(&h, std::io::empty()).unwrap();
            }
        }
    }
    b.finish().unwrap();
}

#[test]
fn an_archive_cannot_reach_out_of_the_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), "host file").unwrap();
    let out = outside.display().to_string();
    let secret = format!("{out}/secret");
    type Case<'a> = (
        &'a str,
        Vec<(
            &'a str,
            EntryType,
            Option<&'a str>,
            &'a [(&'a str, &'a [u8])],
        )>,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "dot-dot",
            vec![("../escaped", EntryType::Regular, None, &[])],
            "leads out",
        ),
        (
            "through a symlink",
            vec![
                ("a", EntryType::Symlink, Some(out.as_str()), &[]),
                ("a/planted", EntryType::Regular, None, &[]),
            ],
            "not a directory of the layer",
        ),
        (
            "hard link out",
            vec![("stolen", EntryType::Link, Some(secret.as_str()), &[])],
            "leads out",
        ),
        (
            "hard link through a symlink",
            vec![
                ("a", EntryType::Symlink, Some(out.as_str()), &[]),
                ("stolen", EntryType::Link, Some("a/secret"), &[]),
            ],
            "not a directory of the layer",
        ),
        (
            "a device",
            vec![("disk", EntryType::Block, None, &[])],
            "never holds",
        ),
        (
            "overlay bookkeeping",
            vec![(
                "d",
                EntryType::Directory,
                None,
                &[("SCHILY.xattr.trusted.overlay.redirect", b"/x")],
            )],
            "not one a layer carries",
        ),
        (
            "twice",
            vec![
                ("f", EntryType::Regular, None, &[]),
                ("f", EntryType::Regular, None, &[]),
            ],
            "appears twice",
        ),
    ];
    for (what, entries, expected) in cases {
        let archive = tmp.path().join("bad.tar");
        craft(&archive, &entries);
        let dst = tmp.path().join("dst");
        let err = unpack_layer(&archive, &dst).expect_err(what).to_string();
        assert!(err.contains(expected), "{what}: {err}");
        assert!(!dst.exists(), "{what}: the partial layer is removed");
        let mut left: Vec<_> = std::fs::read_dir(&outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, vec![std::ffi::OsString::from("secret")], "{what}");
        assert_eq!(
            std::fs::metadata(outside.join("secret")).unwrap().nlink(),
            1
        );
    }
}
