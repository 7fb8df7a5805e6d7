//! Layer export on real directories (root needed: ownership, `trusted.*` xattrs, mknod).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use super::*;

const BASE: u32 = 3_000_000;

fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
}

pub(super) fn xattr_get(p: &Path, name: &str) -> Option<Vec<u8>> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated and `buf` is writable for its length.
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| {
        buf.truncate(r as usize);
        buf
    })
}

pub(super) fn xattr_set(p: &Path, name: &str, v: &[u8]) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: both strings are NUL-terminated and `v` is readable for its length.
    let r = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    assert_eq!(r, 0, "setxattr {name} on {}", p.display());
}

pub(super) fn mknod(p: &Path, mode: u32) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is NUL-terminated.
    assert_eq!(unsafe { libc::mknod(c.as_ptr(), mode, 0) }, 0);
}

fn meta(p: &Path) -> std::fs::Metadata {
    p.symlink_metadata()
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn write(p: &Path, data: &str, uid: u32, mode: u32) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
    chown(p, uid, uid);
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn export(upper: &Path, base: Option<&Path>, dst: &Path) -> LayerStats {
    export_layer(&LayerExport {
        upper: upper.to_path_buf(),
        base: base.map(Path::to_path_buf),
        dst: dst.to_path_buf(),
        uid_base: BASE,
        uid_count: 65_536,
    })
    .unwrap()
}

#[test]
fn exports_an_upper_dir_with_ids_made_zero_based() {
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    std::fs::create_dir(&upper).unwrap();
    chown(&upper, BASE, BASE);
    xattr_set(&upper, "trusted.overlay.uuid", b"0123456789abcdef");
    write(&upper.join("etc/passwd"), "root:x:0:0\n", BASE, 0o644);
    write(&upper.join("home/user/f"), "mine", BASE + 1000, 0o600);
    write(&upper.join("usr/bin/su"), "#!", BASE, 0o4755);
    write(&upper.join("odd"), "x", 12, 0o644);
    chown(&upper.join("etc"), BASE, BASE);
    xattr_set(&upper.join("etc"), "trusted.overlay.origin", b"fh");
    xattr_set(&upper.join("etc/passwd"), "user.note", b"kept");
    mknod(&upper.join("etc/group"), libc::S_IFCHR);
    std::fs::create_dir(upper.join("opt")).unwrap();
    xattr_set(&upper.join("opt"), "trusted.overlay.opaque", b"y");
    std::os::unix::fs::symlink("/etc/passwd", upper.join("lnk")).unwrap();
    chown(&upper.join("lnk"), BASE + 5, BASE + 5);
    mknod(&upper.join("fifo"), libc::S_IFIFO | 0o640);
    std::fs::hard_link(upper.join("etc/passwd"), upper.join("etc/passwd-link")).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(upper.join("sock")).unwrap();
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    std::fs::File::options()
        .write(true)
        .open(upper.join("home/user/f"))
        .unwrap()
        .set_modified(old)
        .unwrap();

    let dst = tmp.path().join("layer");
    let stats = export(&upper, None, &dst);
    assert_eq!(stats.whiteouts, 1);
    assert_eq!(stats.symlinks, 1);
    assert_eq!(stats.skipped, 1, "the socket is left out");
    assert_eq!(stats.files, 4, "hard links count once: {stats:?}");

    assert_eq!(meta(&dst).uid(), 0);
    assert_eq!(meta(&dst).permissions().mode() & 0o7777, 0o755);
    assert_eq!(xattr_get(&dst, "trusted.overlay.uuid"), None);
    let f = meta(&dst.join("home/user/f"));
    assert_eq!((f.uid(), f.gid(), f.mode() & 0o7777), (1000, 1000, 0o600));
    assert_eq!(f.mtime(), 1_000_000_000);
    assert_eq!(std::fs::read(dst.join("home/user/f")).unwrap(), b"mine");
    let su = meta(&dst.join("usr/bin/su"));
    assert_eq!((su.uid(), su.mode() & 0o7777), (0, 0o4755));
    assert_eq!(meta(&dst.join("odd")).uid(), NOBODY);
    assert_eq!(xattr_get(&dst.join("etc"), "trusted.overlay.origin"), None);
    assert_eq!(
        xattr_get(&dst.join("etc/passwd"), "user.note"),
        Some(b"kept".to_vec())
    );
    let wh = meta(&dst.join("etc/group"));
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
    assert_eq!(
        xattr_get(&dst.join("opt"), "trusted.overlay.opaque"),
        Some(b"y".to_vec())
    );
    let l = meta(&dst.join("lnk"));
    assert!(l.file_type().is_symlink());
    assert_eq!(l.uid(), 5);
    assert_eq!(
        std::fs::read_link(dst.join("lnk")).unwrap(),
        Path::new("/etc/passwd")
    );
    let fifo = meta(&dst.join("fifo"));
    assert!(fifo.file_type().is_fifo());
    assert_eq!(fifo.mode() & 0o777, 0o640);
    assert_eq!(
        meta(&dst.join("etc/passwd")).ino(),
        meta(&dst.join("etc/passwd-link")).ino()
    );
    assert!(!dst.join("sock").exists());

    // The destination must be new.
    let err = export_layer(&LayerExport {
        upper: upper.clone(),
        base: None,
        dst: dst.clone(),
        uid_base: BASE,
        uid_count: 65_536,
    })
    .unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    remove_layer(&dst).unwrap();
    assert!(!dst.exists());
}

#[test]
fn merges_an_upper_dir_onto_its_base_layer_like_overlayfs() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    write(&base.join("a/x"), "x", 0, 0o644);
    write(&base.join("a/y"), "y", 0, 0o644);
    write(&base.join("b"), "file b", 0, 0o644);
    write(&base.join("c/z"), "z", 0, 0o644);
    write(&base.join("d/kept"), "k", 0, 0o644);
    xattr_set(&base.join("d"), "trusted.overlay.opaque", b"y");
    mknod(&base.join("gone"), libc::S_IFCHR);

    let upper = tmp.path().join("upper");
    std::fs::create_dir(&upper).unwrap();
    chown(&upper, BASE, BASE);
    std::fs::create_dir(upper.join("a")).unwrap();
    mknod(&upper.join("a/x"), libc::S_IFCHR);
    write(&upper.join("a/new"), "new", BASE + 7, 0o640);
    write(&upper.join("b/inner"), "inner", BASE, 0o644);
    write(&upper.join("c/w"), "w", BASE, 0o644);
    xattr_set(&upper.join("c"), "trusted.overlay.opaque", b"y");
    write(&upper.join("d/e"), "e", BASE, 0o644);
    write(&upper.join("gone/back"), "back", BASE, 0o644);
    std::fs::set_permissions(upper.join("a"), std::fs::Permissions::from_mode(0o700)).unwrap();
    chown(&upper.join("a"), BASE + 3, BASE + 3);

    let dst = tmp.path().join("layer");
    export(&upper, Some(&base), &dst);
    let names = |d: &str| {
        let mut v: Vec<String> = std::fs::read_dir(dst.join(d))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let opaque = |d: &str| xattr_get(&dst.join(d), "trusted.overlay.opaque") == Some(b"y".to_vec());
    // A whiteout replaces the base's file; new files merge into the base's directory, whose
    // metadata comes from the upper directory.
    assert_eq!(names("a"), ["new", "x", "y"]);
    assert!(meta(&dst.join("a/x")).file_type().is_char_device());
    assert_eq!(meta(&dst.join("a/new")).uid(), 7);
    let a = meta(&dst.join("a"));
    assert_eq!((a.uid(), a.mode() & 0o777), (3, 0o700));
    assert!(!opaque("a"));
    // A directory over the base's file hides the template's `b` too.
    assert_eq!(names("b"), ["inner"]);
    assert!(opaque("b"));
    // An opaque directory replaces the base's.
    assert_eq!(names("c"), ["w"]);
    assert!(opaque("c"));
    // A plain directory merged into an opaque one keeps it opaque.
    assert_eq!(names("d"), ["e", "kept"]);
    assert!(opaque("d"));
    // A directory over the base's whiteout is opaque.
    assert_eq!(names("gone"), ["back"]);
    assert!(opaque("gone"));
    // The base is untouched.
    assert_eq!(std::fs::read(base.join("a/x")).unwrap(), b"x");
    assert_eq!(std::fs::read(base.join("b")).unwrap(), b"file b");
}

#[test]
fn copies_trees_deeper_than_path_max() {
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    std::fs::create_dir(&upper).unwrap();
    // 600 levels of 10-byte names: about 6600 bytes of path, beyond PATH_MAX (4096). Built
    // with relative steps so no call sees the long path.
    let root = std::fs::File::open(&upper).unwrap();
    let mut cur = root;
    for _ in 0..600 {
        let name = c"dddddddddd";
        // SAFETY: NUL-terminated name, valid directory fd.
        let made = unsafe { libc::mkdirat(cur.as_raw_fd(), name.as_ptr(), 0o755) };
        assert_eq!(made, 0);
        // SAFETY: as above.
        let fd = unsafe {
            libc::openat(
                cur.as_raw_fd(),
                name.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            )
        };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        cur = unsafe { std::fs::File::from_raw_fd(fd) };
    }
    // SAFETY: NUL-terminated name, valid directory fd, fresh file.
    let f = unsafe {
        libc::openat(
            cur.as_raw_fd(),
            c"leaf".as_ptr(),
            libc::O_WRONLY | libc::O_CREAT,
            0o644,
        )
    };
    assert!(f >= 0);
    // SAFETY: a fresh descriptor we own.
    drop(unsafe { std::fs::File::from_raw_fd(f) });
    let dst = tmp.path().join("layer");
    let stats = export(&upper, None, &dst);
    assert_eq!(stats.files, 1);
    assert_eq!(stats.dirs, 601);
    remove_layer(&dst).unwrap();
    remove_layer(&upper).unwrap();
}

#[test]
fn flattening_applies_whiteouts_and_opaque_directories_and_keeps_owners() {
    let t = tempfile::tempdir().unwrap();
    let (base, layer, dst) = (
        t.path().join("base"),
        t.path().join("layer"),
        t.path().join("dst"),
    );
    write(&base.join("etc/kept"), "kept", 0, 0o644);
    write(&base.join("etc/gone"), "gone", 0, 0o644);
    write(&base.join("opaque/old"), "old", 0, 0o644);
    write(&base.join("home/user/file"), "base version", 1000, 0o600);
    write(&layer.join("home/user/file"), "layer version", 1000, 0o640);
    write(&layer.join("usr/bin/tool"), "#!/bin/sh", 0, 0o4755);
    write(&layer.join("opaque/new"), "new", 0, 0o644);
    xattr_set(&layer.join("opaque"), "trusted.overlay.opaque", b"y");
    std::fs::create_dir_all(layer.join("etc")).unwrap();
    mknod(&layer.join("etc/gone"), libc::S_IFCHR);
    std::os::unix::fs::symlink("/etc/kept", layer.join("link")).unwrap();
    let stats = flatten_layer(&LayerFlatten {
        base: base.clone(),
        layer: layer.clone(),
        dst: dst.clone(),
    })
    .expect("flatten");
    assert_eq!(
        std::fs::read_to_string(dst.join("etc/kept")).unwrap(),
        "kept"
    );
    assert!(
        dst.join("etc/gone").symlink_metadata().is_err(),
        "the whiteout deleted it and is not copied"
    );
    assert!(
        !dst.join("opaque/old").exists(),
        "the opaque directory hides the base's"
    );
    assert!(dst.join("opaque/new").exists());
    assert_eq!(
        xattr_get(&dst.join("opaque"), "trusted.overlay.opaque"),
        None
    );
    let file = dst.join("home/user/file");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "layer version");
    assert_eq!(
        (meta(&file).uid(), meta(&file).mode() & 0o7777),
        (1000, 0o640)
    );
    assert_eq!(meta(&dst.join("usr/bin/tool")).mode() & 0o7777, 0o4755);
    assert_eq!(
        std::fs::read_link(dst.join("link")).unwrap(),
        Path::new("/etc/kept")
    );
    assert_eq!(stats.whiteouts, 0);
    let again = flatten_layer(&LayerFlatten {
        base,
        layer,
        dst: dst.clone(),
    });
    assert!(again.is_err(), "an existing destination is refused");
    assert!(dst.join("etc/kept").exists(), "and left as it was");
}
