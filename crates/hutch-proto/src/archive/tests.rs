//! Round trips and the refusals, from the attacker's side: archives crafted byte by byte.

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use super::*;

/// One raw GNU entry with any name, even one `tar::Builder` would refuse to write.
fn raw_entry(name: &[u8], kind: u8, link: &[u8], data: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().expect("gnu").name[..name.len()].copy_from_slice(name);
    h.as_gnu_mut().expect("gnu").linkname[..link.len()].copy_from_slice(link);
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn end() -> Vec<u8> {
    vec![0; 1024]
}

/// Parse `bytes` in chunks of `chunk` and unpack them into `dest`.
fn unpack(bytes: &[u8], dest: &Path, chunk: usize) -> ArchiveResult<(u64, u64)> {
    let mut parser = TarParser::new();
    let mut ex = Extractor::open(dest, ExtractOptions::default())?;
    for piece in bytes.chunks(chunk.max(1)) {
        for ev in parser.push(piece)? {
            ex.apply(ev)?;
        }
    }
    parser.finish()?;
    ex.finish()
}

fn archive_of(path: &Path, step: usize) -> Vec<u8> {
    let mut w = ArchiveWriter::open(path).expect("open");
    let mut out = Vec::new();
    while let Some(chunk) = w.next_chunk(step).expect("chunk") {
        out.extend(chunk);
    }
    out
}

#[test]
fn a_directory_round_trips_with_modes_links_and_long_names() {
    let src = tempfile::tempdir().expect("tmp");
    let s = src.path();
    std::fs::create_dir_all(s.join("sub/deeper")).expect("mkdir");
    std::fs::write(s.join("a.txt"), "alpha\n").expect("write");
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(s.join("sub/big.bin"), &big).expect("write");
    std::fs::set_permissions(s.join("a.txt"), std::fs::Permissions::from_mode(0o750))
        .expect("chmod");
    let long = "n".repeat(150);
    std::fs::write(s.join("sub/deeper").join(&long), "long\n").expect("write");
    symlink("../a.txt", s.join("sub/link")).expect("symlink");
    symlink("/etc/passwd", s.join("abs-link")).expect("symlink");
    std::fs::write(s.join("empty"), "").expect("write");

    let bytes = archive_of(s, 4096);
    // Parsed a byte at a time and in large pieces: the same result.
    for chunk in [1, 700, 1 << 20] {
        let dst = tempfile::tempdir().expect("tmp");
        let d = dst.path().join("out");
        let result = unpack(&bytes, &d, chunk);
        // The absolute symlink is refused, and with it the rest of the stream.
        let e = result.expect_err("an absolute symlink is refused");
        assert!(e.to_string().contains("absolute path"), "{e}");
    }
    std::fs::remove_file(s.join("abs-link")).expect("rm");
    let bytes = archive_of(s, 4096);
    for chunk in [1, 700, 1 << 20] {
        let dst = tempfile::tempdir().expect("tmp");
        let d = dst.path().join("out");
        let (entries, written) = unpack(&bytes, &d, chunk).expect("unpack");
        assert_eq!(
            entries, 7,
            "a.txt sub/ sub/big.bin sub/deeper/ long sub/link empty"
        );
        assert_eq!(written, 6 + 200_000 + 5);
        assert_eq!(std::fs::read(d.join("sub/big.bin")).expect("read"), big);
        assert_eq!(
            std::fs::read_to_string(d.join("sub/deeper").join(&long)).expect("read"),
            "long\n"
        );
        assert_eq!(
            std::fs::read_link(d.join("sub/link")).expect("link"),
            Path::new("../a.txt")
        );
        let meta = std::fs::metadata(d.join("a.txt")).expect("stat");
        assert_eq!(meta.mode() & 0o7777, 0o750);
        assert_eq!(
            meta.mtime(),
            std::fs::metadata(s.join("a.txt")).expect("stat").mtime()
        );
        assert_eq!(std::fs::read(d.join("empty")).expect("read"), b"");
    }
}

#[test]
fn a_single_file_is_one_entry_under_its_name() {
    let src = tempfile::tempdir().expect("tmp");
    std::fs::write(src.path().join("one.txt"), "1\n").expect("write");
    let bytes = archive_of(&src.path().join("one.txt"), 512);
    let dst = tempfile::tempdir().expect("tmp");
    unpack(&bytes, dst.path(), 100).expect("unpack");
    assert_eq!(
        std::fs::read_to_string(dst.path().join("one.txt")).expect("read"),
        "1\n"
    );
}

/// Every way out of the destination a hostile archive can try is refused, and nothing lands
/// outside it.
#[test]
fn entries_that_would_leave_the_destination_are_refused() {
    let outer = tempfile::tempdir().expect("tmp");
    let dest = outer.path().join("dest");
    std::fs::create_dir(&dest).expect("mkdir");
    // A symlink already in the destination, pointing out of it.
    symlink(outer.path(), dest.join("planted")).expect("symlink");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (raw_entry(b"../escape", b'0', b"", b"x"), "`..` component"),
        (
            raw_entry(b"a/../../escape", b'0', b"", b"x"),
            "`..` component",
        ),
        (raw_entry(b"/tmp/escape", b'0', b"", b"x"), "absolute paths"),
        (raw_entry(b"up", b'2', b"../escape", b""), "climbs out"),
        (
            raw_entry(b"a/b/up", b'2', b"../../../escape", b""),
            "climbs out",
        ),
        (
            raw_entry(b"abs", b'2', b"/etc/passwd", b""),
            "absolute path",
        ),
        (
            raw_entry(b"hard", b'1', b"../escape", b""),
            "hard link to a path outside",
        ),
        (
            raw_entry(b"hard", b'1', b"/etc/passwd", b""),
            "hard link to a path outside",
        ),
        (
            raw_entry(b"planted/escape", b'0', b"", b"x"),
            "planted is a symlink",
        ),
        (raw_entry(b"dev", b'3', b"", b""), "not unpacked"),
        (raw_entry(b"fifo", b'6', b"", b""), "not unpacked"),
    ];
    for (entry, why) in cases {
        let mut bytes = entry;
        bytes.extend(end());
        let e = unpack(&bytes, &dest, 512).expect_err(why).to_string();
        assert!(
            e.contains("refused archive entry") && e.contains(why),
            "{why}: {e}"
        );
    }
    // A symlink the archive makes first, then a file through it.
    let mut bytes = raw_entry(b"inner", b'2', b".", b"");
    bytes.extend(raw_entry(b"jump", b'2', b"inner/..", b""));
    bytes.extend(raw_entry(b"jump/x", b'0', b"", b"x"));
    bytes.extend(end());
    let e = unpack(&bytes, &dest, 512)
        .expect_err("through a link")
        .to_string();
    assert!(e.contains("jump is a symlink"), "{e}");
    // A link the archive made may not be written through either, even pointing inside.
    let names: Vec<String> = std::fs::read_dir(outer.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["dest"],
        "nothing was written outside the destination"
    );
}

#[test]
fn special_bits_are_dropped_unless_kept_and_a_file_replaces_a_symlink_without_following_it() {
    let outer = tempfile::tempdir().expect("tmp");
    let victim = outer.path().join("victim");
    std::fs::write(&victim, "keep\n").expect("write");
    let dest = outer.path().join("dest");
    std::fs::create_dir(&dest).expect("mkdir");
    symlink(&victim, dest.join("f")).expect("symlink");
    let mut h = raw_entry(b"f", b'0', b"", b"new\n");
    // mode 4755 (setuid): rewrite the mode field and the checksum.
    let mut header = tar::Header::from_byte_slice(&h[..512]).clone();
    header.set_mode(0o4755);
    header.set_cksum();
    h[..512].copy_from_slice(header.as_bytes());
    h.extend(end());
    unpack(&h, &dest, 512).expect("unpack");
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "keep\n");
    assert_eq!(
        std::fs::read_to_string(dest.join("f")).expect("read"),
        "new\n"
    );
    assert_eq!(
        std::fs::symlink_metadata(dest.join("f"))
            .expect("stat")
            .mode()
            & 0o7777,
        0o755
    );
    let mut parser = TarParser::new();
    let mut ex = Extractor::open(
        &dest,
        ExtractOptions {
            keep_special_bits: true,
            ..ExtractOptions::default()
        },
    )
    .expect("open");
    for ev in parser.push(&h).expect("parse") {
        ex.apply(ev).expect("apply");
    }
    ex.finish().expect("finish");
    assert_eq!(
        std::fs::metadata(dest.join("f")).expect("stat").mode() & 0o7777,
        0o4755
    );
}

#[test]
fn malformed_streams_are_errors() {
    let mut bad = raw_entry(b"x", b'0', b"", b"data");
    bad[0] ^= 1; // the checksum no longer matches
    let mut p = TarParser::new();
    assert!(p
        .push(&bad)
        .expect_err("checksum")
        .to_string()
        .contains("checksum"));
    let cut = raw_entry(b"x", b'0', b"", &[7u8; 600]);
    let mut p = TarParser::new();
    p.push(&cut[..700]).expect("a prefix parses");
    assert!(p.finish().is_err(), "the stream ended inside an entry");
    // A pax path longer than the limit.
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::XHeader);
    h.set_size(MAX_HEADER_DATA + 1);
    h.set_cksum();
    let mut p = TarParser::new();
    assert!(p.push(h.as_bytes()).is_err());
}

#[test]
fn pax_paths_are_read() {
    let record = b"31 path=some/pax/long/name.txt\n";
    let mut bytes = raw_entry(b"pax", b'x', b"", record);
    bytes.extend(raw_entry(b"short", b'0', b"", b"p\n"));
    bytes.extend(end());
    let dst = tempfile::tempdir().expect("tmp");
    unpack(&bytes, dst.path(), 3).expect("unpack");
    assert_eq!(
        std::fs::read_to_string(dst.path().join("some/pax/long/name.txt")).expect("read"),
        "p\n"
    );
}

#[test]
fn owners_are_kept_only_when_asked() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d")).expect("mkdir");
    std::fs::write(src.join("d/f"), b"x").expect("write");
    symlink("f", src.join("d/l")).expect("symlink");
    for p in ["d", "d/f", "d/l"] {
        std::os::unix::fs::lchown(src.join(p), Some(1234), Some(4321)).expect("chown");
    }
    let bytes = archive_of(&src, 1 << 16);
    for keep in [false, true] {
        let dest = t.path().join(format!("dest-{keep}"));
        std::fs::create_dir(&dest).expect("mkdir");
        let mut ex = Extractor::open(
            &dest,
            ExtractOptions {
                keep_owners: keep,
                ..ExtractOptions::default()
            },
        )
        .expect("open");
        for ev in TarParser::new().push(&bytes).expect("parse") {
            ex.apply(ev).expect("apply");
        }
        ex.finish().expect("finish");
        for p in ["d", "d/f", "d/l"] {
            let m = std::fs::symlink_metadata(dest.join(p)).expect("stat");
            let want = if keep { (1234, 4321) } else { (0, 0) };
            assert_eq!((m.uid(), m.gid()), want, "{p} keep={keep}");
        }
    }
}

#[test]
fn a_filter_leaves_out_entries_and_can_enter_a_left_out_directory() {
    let src = tempfile::tempdir().expect("tmp");
    let s = src.path();
    std::fs::create_dir_all(s.join("skipped/inner")).expect("mkdir");
    std::fs::create_dir_all(s.join("entered/keep")).expect("mkdir");
    std::fs::write(s.join("skipped/inner/x"), "x").expect("write");
    std::fs::write(s.join("entered/drop.txt"), "d").expect("write");
    std::fs::write(s.join("entered/keep/k.txt"), "k").expect("write");
    std::fs::write(s.join("top.txt"), "t").expect("write");
    std::fs::write(s.join("secret.env"), "s").expect("write");
    let (tx, rx) = std::sync::mpsc::channel();
    let mut w = ArchiveWriter::open(s)
        .expect("open")
        .with_filter(move |path, is_dir| {
            let path = String::from_utf8_lossy(path).into_owned();
            let _ = tx.send((path.clone(), is_dir));
            match path.as_str() {
                "skipped" | "secret.env" | "entered/drop.txt" => WalkChoice::Skip,
                "entered" => WalkChoice::EnterOnly,
                _ => WalkChoice::Include,
            }
        });
    let mut bytes = Vec::new();
    while let Some(chunk) = w.next_chunk(4096).expect("chunk") {
        bytes.extend(chunk);
    }
    let seen: Vec<(String, bool)> = rx.try_iter().collect();
    // A skipped directory is never walked.
    assert!(
        !seen.iter().any(|(p, _)| p.starts_with("skipped/")),
        "{seen:?}"
    );
    assert!(seen.contains(&("entered".to_string(), true)), "{seen:?}");
    let dst = tempfile::tempdir().expect("tmp");
    let d = dst.path().join("out");
    unpack(&bytes, &d, 512).expect("unpack");
    assert!(d.join("top.txt").is_file());
    assert!(d.join("entered/keep/k.txt").is_file());
    assert!(!d.join("entered/drop.txt").exists());
    assert!(!d.join("skipped").exists());
    assert!(!d.join("secret.env").exists());
}
