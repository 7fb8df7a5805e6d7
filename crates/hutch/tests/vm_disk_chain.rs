//! A vm guest's QEMU can write its own overlay's qcow2 header (a plain write to a file it
//! owns), naming any host file as the overlay's backing file. The host must never follow
//! that name: wake, memory snapshots, sandboxes created from them, live forks and the
//! cache's garbage collection all use the chain the host recorded when it made the disk
//! (`<state>/vm-records/<id>/disk-chain`, `docs/vm.md`).
//!
//! Needs QEMU, qemu-img and mkfs.ext4 (`scripts/deps.sh`).

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hutch_testkit::{wait_until, TestServer};
use reqwest::Method;
use serde_json::json;

/// Point the backing-file name in the qcow2 header of `image` at `target`, as a
/// compromised QEMU writing its overlay could (header fields `backing_file_offset` at byte
/// 8, `backing_file_size` at 16; the name lives in the header cluster).
fn rewrite_backing_name(image: &Path, target: &Path) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .expect("open the overlay");
    let mut header = [0u8; 20];
    f.read_exact(&mut header).expect("header");
    assert_eq!(&header[..4], b"QFI\xfb", "a qcow2 image");
    let offset = u64::from_be_bytes(header[8..16].try_into().expect("8 bytes"));
    assert!(offset > 0, "the overlay names a backing file");
    let name = target.as_os_str().as_encoded_bytes();
    assert!(
        offset as usize + name.len() < 65536,
        "within the header cluster"
    );
    f.seek(SeekFrom::Start(offset)).expect("seek");
    f.write_all(name).expect("write the name");
    f.seek(SeekFrom::Start(16)).expect("seek");
    f.write_all(&(name.len() as u32).to_be_bytes())
        .expect("write the size");
    f.sync_all().expect("sync");
}

/// What `qemu-img` reads as the backing file of `image` (what the header says).
fn header_backing(image: &Path) -> String {
    let out = std::process::Command::new("qemu-img")
        .args(["info", "-U", "--output=json"])
        .arg(image)
        .output()
        .expect("qemu-img info");
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    info["backing-filename"].as_str().unwrap_or("").to_string()
}

/// The pid of the QEMU whose command line names `qmp`.
fn qemu_pid_with(qmp: &Path) -> Option<i32> {
    let needle = qmp.to_string_lossy().into_owned();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline)
            .contains(&needle)
            .then_some(pid)
    })
}

fn qemu_of(s: &TestServer, id: &str) -> i32 {
    qemu_pid_with(&s.state_dir.join("sandboxes").join(id).join("qmp.sock")).expect("its QEMU")
}

/// Whether `path` exists in the file tree QEMU `pid` sees (its jail's root).
fn visible_to(pid: i32, path: &Path) -> bool {
    let inside =
        PathBuf::from(format!("/proc/{pid}/root")).join(path.strip_prefix("/").expect("absolute"));
    std::fs::symlink_metadata(inside).is_ok()
}

/// The bake directory in the chain recorded for sandbox `id`.
fn recorded_bake(s: &TestServer, id: &str) -> PathBuf {
    let record =
        std::fs::read_to_string(s.state_dir.join("vm-records").join(id).join("disk-chain"))
            .expect("the disk chain is recorded");
    let first = record.lines().nth(1).expect("a backing line");
    let (format, path) = first.split_once('\t').expect("format and path");
    assert_eq!(format, "qcow2", "{record}");
    Path::new(path).parent().expect("bake dir").to_path_buf()
}

fn set_mtime(path: &Path, to: SystemTime) {
    std::fs::File::open(path)
        .and_then(|f| f.set_modified(to))
        .expect("set mtime");
}

#[tokio::test]
async fn a_rewritten_backing_file_name_is_never_followed_by_the_host() {
    let mut s = TestServer::start().await;
    let id = s.create_id(json!({"isolation": "vm"})).await;
    let (out, code) = s.sh(&id, "echo kept > /root/kept; sync").await;
    assert_eq!(code, 0, "{out}");

    // The canary: a host file the guest's QEMU names as its backing file.
    let canary_dir = tempfile::Builder::new()
        .prefix("hutch-canary-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let canary = canary_dir.path().join("canary");
    std::fs::write(&canary, b"host file, not a disk\n").expect("canary");
    std::fs::set_permissions(&canary, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod");
    let long_ago = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    set_mtime(&canary, long_ago);

    let overlay = s.state_dir.join("sandboxes").join(&id).join("disk.qcow2");
    rewrite_backing_name(&overlay, &canary);
    assert_eq!(
        header_backing(&overlay),
        canary.display().to_string(),
        "the header now lies"
    );

    // Hibernate and wake: the new QEMU gets the recorded chain, not the header's.
    let (st, v) = s
        .request(Method::POST, &format!("/v1/sandboxes/{id}/hibernate"), None)
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = s
        .request(Method::POST, &format!("/v1/sandboxes/{id}/wake"), None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(s.sh(&id, "cat /root/kept").await.0, "kept\n");
    assert!(
        !visible_to(qemu_of(&s, &id), &canary),
        "the woken QEMU's jail holds no file the header named"
    );

    // A memory snapshot (its disk copied with the lying header) and a sandbox from it.
    let (st, snap) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/snapshots"),
            Some(json!({"name": "lying-header"})),
        )
        .await;
    assert_eq!(st, 201, "{snap}");
    let snap_id = snap["id"].as_str().expect("id").to_string();
    let copy = s
        .state_dir
        .join("snapshots")
        .join(&snap_id)
        .join("disk.qcow2");
    assert_eq!(header_backing(&copy), canary.display().to_string());
    let child = s.create_id(json!({"snapshot": snap_id})).await;
    assert_eq!(s.sh(&child, "cat /root/kept").await.0, "kept\n");
    assert!(!visible_to(qemu_of(&s, &child), &canary));

    // A live fork.
    let forked = s.fork(&id, 1, "live").await;
    assert_eq!(s.sh(&forked[0], "cat /root/kept").await.0, "kept\n");
    assert!(!visible_to(qemu_of(&s, &forked[0]), &canary));

    // Garbage collection at the next start keeps (touches) the recorded bake and never
    // touches the canary.
    let bake = recorded_bake(&s, &id);
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    set_mtime(&bake, an_hour_ago);
    s.stop_server();
    s.spawn_server().await;
    let touched = wait_until(Duration::from_secs(30), async || {
        let m = std::fs::metadata(&bake).ok()?.modified().ok()?;
        (m > an_hour_ago + Duration::from_secs(60)).then_some(())
    })
    .await;
    assert!(
        touched.is_some(),
        "garbage collection ran and kept the recorded bake"
    );
    let meta = std::fs::metadata(&canary).expect("the canary is still there");
    assert_eq!(
        meta.modified().expect("mtime"),
        long_ago,
        "the host never touched the file the header named"
    );
    assert_eq!(meta.uid(), 0);
    assert_eq!(
        std::fs::read(&canary).expect("canary"),
        b"host file, not a disk\n"
    );
    // The re-adopted sandbox still works.
    assert_eq!(s.sh(&id, "cat /root/kept").await.0, "kept\n");
}
