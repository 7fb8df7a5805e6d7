//! Durable volumes on `vm` only: the same ext4 image as on `ns`, attached as a virtio disk, so
//! what a guest wrote is read by an `ns` sandbox; read-only attachments refuse writes even
//! from a guest's root writing the raw disk; at most 4 volumes per guest; an image a guest
//! crafted is checked before the host mounts it.
//!
//! The volume lifecycle both backends share (data kept for the next sandbox, read-only
//! attachments, exclusivity and deletion, a full volume, hibernate and wake, fork children)
//! is written once in `lifecycle_table/volumes.rs`.

use hutch_testkit::TestServer;
use reqwest::Method;
use serde_json::{json, Value};

async fn create(s: &TestServer, isolation: &str, volumes: Value) -> (u16, Value) {
    s.request(
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"isolation": isolation, "volumes": volumes})),
    )
    .await
}

async fn sandbox(s: &TestServer, isolation: &str, volumes: Value) -> String {
    let (st, v) = create(s, isolation, volumes).await;
    assert_eq!(st, 201, "{v}");
    v["id"].as_str().expect("id").to_string()
}

/// Lines of the guest's `/proc/mounts` for mount point `path`.
async fn mounts_at(s: &TestServer, id: &str, path: &str) -> String {
    let (out, _) = s
        .sh(id, &format!("grep ' {path} ' /proc/mounts || true"))
        .await;
    out
}

fn sha256(path: &std::path::Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[tokio::test]
async fn what_a_guest_wrote_is_read_by_ns_and_a_read_only_guest_cannot_write_the_raw_disk() {
    let s = TestServer::start().await;
    let vol = s.volume("shared", 16).await;
    let a = sandbox(&s, "vm", json!([{"volume": vol, "path": "/data"}])).await;
    let (out, code) = s
        .sh(
            &a,
            "echo from-the-guest > /data/f && mkdir /data/d && chown 1000:1000 /data/d",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(s.kill(&a).await, 204);

    // The same image is an ns sandbox's volume.
    let b = sandbox(
        &s,
        "ns",
        json!([{"volume": vol, "path": "/data", "read_only": true}]),
    )
    .await;
    let (out, code) = s.sh(&b, "cat /data/f && stat -c %u /data/d").await;
    assert_eq!((out.as_str(), code), ("from-the-guest\n1000\n", 0));

    // A guest attaches it read-only at the same time as that ns sandbox.
    let image = s.state_dir.join("volumes").join(&vol).join("disk.ext4");
    let before = sha256(&image);
    let c = sandbox(
        &s,
        "vm",
        json!([{"volume": vol, "path": "/ro", "read_only": true}]),
    )
    .await;
    let (out, code) = s.sh(&c, "cat /ro/f; echo x 2>&1 > /ro/new").await;
    assert_ne!(code, 0, "{out} {}", mounts_at(&s, &c, "/ro").await);
    assert!(out.starts_with("from-the-guest\n"), "{out}");
    assert!(out.contains("Read-only file system"), "{out}");
    // The guest's root turns the disk writable in its own kernel and writes the raw device:
    // QEMU holds it read-only, so the write fails and the image does not change.
    let (out, code) = s
        .sh(
            &c,
            "dev=/dev/$(for d in /sys/block/vd*; do [ \"$(cat $d/serial)\" = hutch-vol0 ] && basename $d; done); \
             blockdev --setrw $dev; dd if=/dev/zero of=$dev bs=4096 count=16 oflag=direct conv=fsync 2>&1",
        )
        .await;
    assert_ne!(
        code, 0,
        "a raw write to a read-only volume must fail: {out}"
    );
    assert_eq!(s.kill(&c).await, 204);
    assert_eq!(s.kill(&b).await, 204);
    assert_eq!(
        sha256(&image),
        before,
        "the read-only volume's image is unchanged"
    );
}

#[tokio::test]
async fn more_volumes_than_a_guest_has_slots_is_a_clear_422() {
    let s = TestServer::start().await;
    let mut many = Vec::new();
    for i in 0..5 {
        let id = s.volume(&format!("m{i}"), 4).await;
        many.push(json!({"volume": id, "path": format!("/m{i}")}));
    }
    let (st, v) = create(&s, "vm", Value::Array(many)).await;
    assert_eq!(st, 422, "{v}");
    assert!(
        v.to_string().contains("at most 4 volumes per vm sandbox"),
        "{v}"
    );
}

/// Run a host command of the attacker's toolkit (building the image a guest will write).
fn host(cmd: &str) -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", cmd])
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A guest with a read-write volume writes any bytes it likes to the raw disk: here an ext4
/// whose superblock says `errors=panic` (behaviour and stored mount options) with a corrupt
/// directory block. The host never mounts that image unchecked: attaching it to an `ns`
/// sandbox is refused (409, naming the repair) with nothing mounted; a repair makes it
/// mountable, with the superblock's error behaviour reset and `errors=remount-ro` forced on
/// the host's mount.
#[tokio::test]
async fn a_volume_image_a_guest_crafted_is_checked_before_the_host_mounts_it() {
    let s = TestServer::start().await;
    let vol = s.volume("crafted", 16).await;

    // The crafted image, the volume's size, built with e2fsprogs as an attacker would.
    let work = tempfile::tempdir().expect("tempdir");
    let img = work.path().join("crafted.img");
    let img_s = img.to_str().expect("utf-8");
    host(&format!(
        "truncate -s 16M {img_s} && mkfs.ext4 -q -F -b 4096 {img_s} && \
         echo hello > {dir}/hello && debugfs -w -R 'write {dir}/hello hello' {img_s} && \
         debugfs -w -R 'mkdir d' {img_s} && debugfs -w -R 'write {dir}/hello d/f' {img_s}",
        dir = work.path().display()
    ));
    let block = host(&format!("debugfs -R 'blocks d' {img_s} 2>/dev/null"));
    let block: u64 = block.trim().parse().expect("the directory's block");
    host(&format!(
        "dd if=/dev/urandom of={img_s} bs=4096 seek={block} count=1 conv=notrunc status=none && \
         tune2fs -e panic -E mount_opts=errors=panic {img_s} >/dev/null"
    ));

    // The guest writes it over its volume's raw disk.
    let a = sandbox(&s, "vm", json!([{"volume": vol, "path": "/data"}])).await;
    s.put_file(
        &a,
        "/root/crafted.img",
        "0600",
        std::fs::read(&img).expect("image"),
    )
    .await;
    let (out, code) = s
        .sh(
            &a,
            "dev=/dev/$(for d in /sys/block/vd*; do [ \"$(cat $d/serial)\" = hutch-vol0 ] && basename $d; done); \
             umount /data && dd if=/root/crafted.img of=$dev bs=1M conv=fsync 2>&1 && echo written",
        )
        .await;
    assert!(code == 0 && out.ends_with("written\n"), "{out}");
    assert_eq!(s.kill(&a).await, 204);

    // Attaching it to an ns sandbox: checked, refused, nothing mounted on the host.
    let mnt = s.state_dir.join("volumes").join(&vol).join("mnt");
    let (st, v) = create(&s, "ns", json!([{"volume": vol, "path": "/data"}])).await;
    assert_eq!(st, 409, "{v}");
    let msg = v.to_string();
    assert!(msg.contains("damaged") && msg.contains("--repair"), "{msg}");
    assert!(
        !s.mounts_under_state()
            .iter()
            .any(|m| m.starts_with(&*mnt.to_string_lossy())),
        "the host mounted the crafted image"
    );
    // The safe check alone still refuses; a repair fixes it.
    let path = format!("/v1/volumes/{vol}/check");
    let (st, v) = s.request(Method::POST, &path, Some(json!({}))).await;
    assert_eq!(st, 409, "{v}");
    let (st, v) = s
        .request(Method::POST, &path, Some(json!({"repair": true})))
        .await;
    assert_eq!((st, v["repaired"].as_bool()), (200, Some(true)), "{v}");
    let image = s.state_dir.join("volumes").join(&vol).join("disk.ext4");
    let sb = host(&format!("dumpe2fs -h {} 2>/dev/null", image.display()));
    assert!(
        sb.contains("Errors behavior:          Remount read-only"),
        "{sb}"
    );
    assert!(!sb.contains("errors=panic"), "{sb}");

    // Now it mounts, with errors=remount-ro forced, and reads without an error.
    let n = sandbox(&s, "ns", json!([{"volume": vol, "path": "/data"}])).await;
    let (out, code) = s
        .sh(&n, "cat /data/hello && ls /data/ >/dev/null && echo ok")
        .await;
    assert_eq!((out.as_str(), code), ("hello\nok\n", 0));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let line = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some(&*mnt.to_string_lossy()))
        .expect("the volume's host mount");
    let dev = line
        .split(" - ")
        .nth(1)
        .and_then(|t| t.split_whitespace().nth(1))
        .and_then(|d| d.strip_prefix("/dev/"))
        .expect("loop device");
    let opts = std::fs::read_to_string(format!("/proc/fs/ext4/{dev}/options")).expect("options");
    assert!(opts.lines().any(|l| l == "errors=remount-ro"), "{opts}");
    let errors = std::fs::read_to_string(format!("/sys/fs/ext4/{dev}/errors_count"))
        .unwrap_or_else(|_| "0".into());
    assert_eq!(
        errors.trim(),
        "0",
        "the host's ext4 met an error in the volume"
    );
    assert_eq!(s.kill(&n).await, 204);
}
