//! Layers applied to a root: whiteouts, compression, and every malicious entry the issue
//! names refused with nothing written outside the root.

mod support;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hutch_image::{Compression, ImageError, Layer, Limits, RootDir, Unpacker};
use support::layers::{gzip, sha256, tar, zstd, E};

/// A root and, beside it, a directory standing for the host.
struct Scratch {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    blobs: PathBuf,
}

impl Scratch {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("rootfs");
        let outside = dir.path().join("outside");
        let blobs = dir.path().join("blobs");
        for d in [&root, &outside, &blobs] {
            fs::create_dir(d).expect("mkdir");
        }
        fs::write(outside.join("host-file"), b"host").expect("write");
        Self {
            _dir: dir,
            root,
            outside,
            blobs,
        }
    }

    /// Applies the layers (each an uncompressed tar with its compression) in order.
    fn apply(&self, layers: &[(Vec<u8>, Compression)], limits: Limits) -> Result<(), ImageError> {
        let root = RootDir::open(&self.root).expect("open root");
        let mut unpacker = Unpacker::new(&root, limits);
        for (i, (tar, compression)) in layers.iter().enumerate() {
            let blob = match compression {
                Compression::None => tar.clone(),
                Compression::Gzip => gzip(tar),
                Compression::Zstd => zstd(tar),
            };
            let path = self.blobs.join(format!("layer{i}"));
            fs::write(&path, &blob).expect("write blob");
            let digest = sha256(&blob);
            let diff_id = sha256(tar);
            unpacker.apply(&Layer {
                blob: &path,
                digest: &digest,
                compression: *compression,
                diff_id: Some(&diff_id),
            })?;
        }
        Ok(())
    }

    /// Asserts the host stand-in holds exactly its one file, unchanged.
    fn assert_outside_untouched(&self) {
        let names: Vec<String> = fs::read_dir(&self.outside)
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            vec!["host-file"],
            "nothing was written beside the root"
        );
        assert_eq!(
            fs::read(self.outside.join("host-file")).expect("read"),
            b"host"
        );
        let parent = self.root.parent().expect("parent");
        let mut siblings: Vec<String> = fs::read_dir(parent)
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        siblings.sort();
        assert_eq!(siblings, vec!["blobs", "outside", "rootfs"]);
    }

    fn exists(&self, rel: &str) -> bool {
        fs::symlink_metadata(self.root.join(rel)).is_ok()
    }
}

fn one(entries: &[E<'_>]) -> Vec<(Vec<u8>, Compression)> {
    vec![(tar(entries), Compression::Gzip)]
}

fn refused(err: ImageError, needle: &str) {
    assert!(matches!(err, ImageError::UnsafeEntry { .. }), "{err}");
    assert!(err.to_string().contains(needle), "{err}");
}

#[test]
fn applies_layers_in_order_with_whiteouts_and_opaque_directories() {
    let s = Scratch::new();
    let lower = tar(&[
        E::Dir("a/", 0o755),
        E::File("a/keep", b"keep", 0o644),
        E::File("a/gone", b"gone", 0o644),
        E::Dir("a/gonedir/", 0o755),
        E::File("a/gonedir/inner", b"x", 0o644),
        E::Dir("b/", 0o755),
        E::File("b/x", b"x", 0o644),
        E::File("b/y", b"y", 0o644),
        E::File("c", b"file, later a directory", 0o644),
    ]);
    let upper = tar(&[
        E::File("a/.wh.gone", b"", 0o644),
        E::File("a/.wh.gonedir", b"", 0o644),
        E::Dir("b/", 0o755),
        E::File("b/.wh..wh..opq", b"", 0o644),
        E::File("b/new", b"new", 0o644),
        E::Dir("c/", 0o750),
        E::File("c/file", b"same layer", 0o644),
        E::File("c/.wh.file", b"", 0o644),
        E::File("a/.wh.never-existed", b"", 0o644),
    ]);
    s.apply(
        &[(lower, Compression::None), (upper, Compression::Zstd)],
        Limits::default(),
    )
    .expect("applies");
    assert_eq!(fs::read(s.root.join("a/keep")).expect("keep"), b"keep");
    assert!(!s.exists("a/gone") && !s.exists("a/gonedir"), "whited out");
    assert!(
        !s.exists("b/x") && !s.exists("b/y"),
        "hidden by the opaque marker"
    );
    assert_eq!(fs::read(s.root.join("b/new")).expect("new"), b"new");
    assert!(
        !s.exists("b/.wh..wh..opq") && !s.exists("a/.wh.gone"),
        "markers are not files"
    );
    assert_eq!(
        fs::read(s.root.join("c/file")).expect("a whiteout does not hide its own layer"),
        b"same layer"
    );
    let c = fs::symlink_metadata(s.root.join("c")).expect("c");
    assert!(c.is_dir() && c.permissions().mode() & 0o777 == 0o750);
}

#[test]
fn reads_gzip_zstd_and_plain_layers_and_checks_diff_ids() {
    for compression in [Compression::None, Compression::Gzip, Compression::Zstd] {
        let s = Scratch::new();
        let long = "d/".repeat(60) + "deep-file";
        s.apply(
            &[(
                tar(&[E::File("hello", b"hi", 0o644), E::LongName(&long, b"long")]),
                compression,
            )],
            Limits::default(),
        )
        .unwrap_or_else(|e| panic!("{compression:?}: {e}"));
        assert_eq!(fs::read(s.root.join("hello")).expect("read"), b"hi");
        assert_eq!(fs::read(s.root.join(&long)).expect("long name"), b"long");
    }

    let s = Scratch::new();
    let root = RootDir::open(&s.root).expect("root");
    let blob = s.blobs.join("l");
    fs::write(&blob, tar(&[E::File("x", b"x", 0o644)])).expect("write");
    let wrong = sha256(b"something else");
    let err = Unpacker::new(&root, Limits::default())
        .apply(&Layer {
            blob: &blob,
            digest: "sha256:layer",
            compression: Compression::None,
            diff_id: Some(&wrong),
        })
        .expect_err("diff_id mismatch");
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
}

#[test]
fn strips_setid_bits_skips_devices_and_keeps_fifos_and_links() {
    let s = Scratch::new();
    let root = RootDir::open(&s.root).expect("root");
    let mut unpacker = Unpacker::new(&root, Limits::default());
    let tar = tar(&[
        E::File("bin/su", b"elf", 0o4755),
        E::Dir("shared/", 0o2775),
        E::Char("dev/null"),
        E::Fifo("run/pipe"),
        E::Symlink("etc-link", "/etc"),
        E::HardLink("bin/su2", "bin/su"),
    ]);
    let blob = s.blobs.join("l");
    fs::write(&blob, &tar).expect("write");
    unpacker
        .apply(&Layer {
            blob: &blob,
            digest: "sha256:l",
            compression: Compression::None,
            diff_id: None,
        })
        .expect("applies");
    let bin = fs::metadata(s.root.join("bin")).expect("bin, made for bin/su");
    assert_eq!(
        bin.permissions().mode() & 0o7777,
        0o755,
        "implicit parents are 0755"
    );
    let su = fs::metadata(s.root.join("bin/su")).expect("su");
    assert_eq!(su.permissions().mode() & 0o7777, 0o755, "set-uid stripped");
    assert_eq!(su.nlink(), 2, "hard link within the layer");
    let shared = fs::metadata(s.root.join("shared")).expect("shared");
    assert_eq!(
        shared.permissions().mode() & 0o7777,
        0o775,
        "set-gid stripped"
    );
    assert!(!s.exists("dev/null"), "device skipped");
    assert!(fs::symlink_metadata(s.root.join("run/pipe"))
        .expect("fifo")
        .file_type()
        .is_fifo());
    assert_eq!(
        fs::read_link(s.root.join("etc-link")).expect("link"),
        Path::new("/etc")
    );
    let summary = unpacker.summary();
    assert_eq!((summary.setid_stripped, summary.devices_skipped), (2, 1));
}

#[test]
fn refuses_dotdot_and_absolute_paths() {
    for (name, needle) in [
        ("../outside/escaped", "`..` component"),
        ("a/../../outside/escaped", "`..` component"),
        ("/tmp/hutch-test-absolute-entry", "absolute path"),
    ] {
        let s = Scratch::new();
        let err = s
            .apply(&one(&[E::File(name, b"pwned", 0o644)]), Limits::default())
            .expect_err(name);
        refused(err, needle);
        s.assert_outside_untouched();
        assert!(!Path::new("/tmp/hutch-test-absolute-entry").exists());
    }
}

#[test]
fn refuses_writing_through_a_symlinked_parent() {
    let s = Scratch::new();
    let outside = s.outside.display().to_string();
    // In one layer, and across two layers.
    let err = s
        .apply(
            &one(&[
                E::Symlink("evil", &outside),
                E::File("evil/pwned", b"x", 0o644),
            ]),
            Limits::default(),
        )
        .expect_err("through a symlink");
    refused(err, "`evil` is a symlink");
    s.assert_outside_untouched();

    let s = Scratch::new();
    let outside = s.outside.display().to_string();
    let err = s
        .apply(
            &[
                (tar(&[E::Symlink("usr", &outside)]), Compression::Gzip),
                (
                    tar(&[E::Dir("usr/lib/", 0o755), E::File("usr/lib/x", b"x", 0o644)]),
                    Compression::Gzip,
                ),
            ],
            Limits::default(),
        )
        .expect_err("through a lower layer's symlink");
    refused(err, "`usr` is a symlink");
    s.assert_outside_untouched();

    // A relative symlink climbing out, then a whiteout and a hard link through it.
    let s = Scratch::new();
    let err = s
        .apply(
            &one(&[
                E::Symlink("up", "../outside"),
                E::File("up/.wh.host-file", b"", 0o644),
            ]),
            Limits::default(),
        )
        .expect_err("whiteout through a symlink");
    refused(err, "`up` is a symlink");
    s.assert_outside_untouched();
}

#[test]
fn refuses_hard_links_outside_the_layer() {
    let shadow = fs::metadata("/etc/shadow")
        .ok()
        .map(|m| (m.nlink(), m.ino()));
    for (target, needle) in [
        ("/etc/shadow", "absolute path"),
        ("../../../../../../etc/shadow", "`..` component"),
        ("etc/shadow", "not a file this layer created"),
        ("etc", "not a file this layer created"),
    ] {
        let s = Scratch::new();
        let lower = tar(&[
            E::Dir("etc/", 0o755),
            E::File("etc/shadow", b"root:*:", 0o600),
        ]);
        let upper = tar(&[E::HardLink("stolen", target)]);
        let err = s
            .apply(
                &[(lower, Compression::Gzip), (upper, Compression::Gzip)],
                Limits::default(),
            )
            .expect_err(target);
        refused(err, needle);
        assert!(!s.exists("stolen"));
        s.assert_outside_untouched();
    }
    assert_eq!(
        fs::metadata("/etc/shadow")
            .ok()
            .map(|m| (m.nlink(), m.ino())),
        shadow,
        "the host's /etc/shadow gained no link"
    );
}

#[test]
fn stops_bombs_at_the_limits() {
    // A 10 GiB sparse file against the default 8 GiB limit: refused before any write.
    let s = Scratch::new();
    let err = s
        .apply(
            &one(&[E::File("small", b"x", 0o644), E::Sparse("bomb", 10 << 30)]),
            Limits::default(),
        )
        .expect_err("sparse bomb");
    assert!(
        matches!(err, ImageError::LimitExceeded { limit: "size", .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("`bomb` declares 10737418240 bytes"),
        "{err}"
    );
    assert!(!s.exists("bomb"));

    // A declared size over the limit, and data crossing it while extracting.
    let s = Scratch::new();
    let limits = Limits {
        max_bytes: 1 << 20,
        max_files: 1000,
    };
    let err = s
        .apply(&one(&[E::Declared("huge", 2 << 20)]), limits)
        .expect_err("declared");
    assert!(
        matches!(err, ImageError::LimitExceeded { limit: "size", .. }),
        "{err}"
    );
    assert!(!s.exists("huge"));
    let chunk = vec![0u8; 100 * 1024];
    let names: Vec<String> = (0..20).map(|i| format!("f{i:02}")).collect();
    let files: Vec<E<'_>> = names.iter().map(|n| E::File(n, &chunk, 0o644)).collect();
    let err = s.apply(&one(&files), limits).expect_err("many files");
    assert!(
        matches!(err, ImageError::LimitExceeded { limit: "size", .. }),
        "{err}"
    );
    assert!(s.exists("f09") && !s.exists("f11"), "stopped at the limit");

    // The file count.
    let s = Scratch::new();
    let names: Vec<String> = (0..50).map(|i| format!("e{i}")).collect();
    let files: Vec<E<'_>> = names.iter().map(|n| E::File(n, b"", 0o644)).collect();
    let err = s
        .apply(
            &one(&files),
            Limits {
                max_bytes: 1 << 30,
                max_files: 10,
            },
        )
        .expect_err("file count");
    assert!(
        matches!(
            err,
            ImageError::LimitExceeded {
                limit: "file count",
                ..
            }
        ),
        "{err}"
    );

    // A PAX header claiming a gigabyte is refused without reading it into memory.
    let s = Scratch::new();
    let err = s
        .apply(&one(&[E::HugePax(1 << 30)]), Limits::default())
        .expect_err("pax");
    refused(
        err,
        "PAX header of 1073741824 bytes is over the 65536-byte limit",
    );
    s.assert_outside_untouched();
}

#[test]
fn a_cancel_stops_an_extraction_in_the_middle_of_a_layer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let blob = dir.path().join("layer.tar");
    let files: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("f{i}"), vec![7u8; 64 << 10]))
        .collect();
    let entries: Vec<E<'_>> = files.iter().map(|(n, d)| E::File(n, d, 0o644)).collect();
    fs::write(&blob, tar(&entries)).expect("write the layer");
    let rootfs = dir.path().join("rootfs");
    fs::create_dir(&rootfs).expect("mkdir");
    let root = RootDir::open(&rootfs).expect("root");
    let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut unpacker = Unpacker::new(&root, Limits::default()).with_cancel(Some(cancel.clone()));
    let mut read = 0u64;
    let result = unpacker.apply_reporting(
        &Layer {
            blob: &blob,
            digest: "sha256:0000000000000000000000000000000000000000000000000000000000000000",
            compression: Compression::None,
            diff_id: None,
        },
        &mut |n| {
            read += n;
            if read > 1 << 20 {
                cancel.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        },
    );
    let err = result.expect_err("the extraction was cancelled");
    assert!(matches!(err, ImageError::Cancelled), "{err}");
    let written = fs::read_dir(&rootfs).expect("ls").count();
    assert!(
        written > 0 && written < 200,
        "stopped part of the way: {written} files"
    );
}
