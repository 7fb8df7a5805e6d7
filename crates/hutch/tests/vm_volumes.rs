//! Durable volumes on `vm`: the same ext4 image as on `ns`, attached as a virtio disk. Data a
//! guest wrote is on the image once its sandbox is killed (read by an `ns` sandbox and by
//! another guest); read-only attachments refuse writes even from a guest's root writing
//! the raw disk; a full volume fails only that write; hibernation keeps the mount; a fork
//! child keeps the parent's read-only volume and loses its read-write one.

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
async fn what_a_guest_writes_to_a_volume_is_read_by_the_next_sandbox_and_read_only_holds() {
    let s = TestServer::start().await;
    let vol = s.volume("shared", 16).await;
    let a = sandbox(&s, "vm", json!([{"volume": vol, "path": "/data"}])).await;
    let (out, code) = s
        .sh(
            &a,
            "echo from-the-guest > /data/f && mkdir /data/d && chown 1000:1000 /data/d \
             && grep ' /data ' /proc/mounts && df -m /data | tail -1",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(" /data ext4 rw,nosuid,nodev"), "{out}");
    let size_mib: u64 = out
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        (12..=16).contains(&size_mib),
        "the guest sees the volume's size: {out}"
    );
    // Killed while paused, without a sync by anyone: the server flushes the guest first.
    let (st, v) = s
        .request(Method::POST, &format!("/v1/sandboxes/{a}/pause"), None)
        .await;
    assert_eq!((st, v["state"].as_str()), (200, Some("paused")), "{v}");
    assert_eq!(s.kill(&a).await, 204);

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

    // Read-write is exclusive on vm too, and deleting an attached volume is refused.
    let d = sandbox(&s, "vm", json!([{"volume": vol, "path": "/data"}])).await;
    let (st, v) = create(
        &s,
        "vm",
        json!([{"volume": vol, "path": "/x", "read_only": true}]),
    )
    .await;
    assert_eq!(st, 409, "{v}");
    let (st, v) = s
        .request(Method::DELETE, &format!("/v1/volumes/{vol}"), None)
        .await;
    assert_eq!(st, 409, "{v}");
    // A full volume fails only the write that does not fit.
    let (out, code) = s
        .sh(&d, "dd if=/dev/zero of=/data/big bs=1M count=32 2>&1")
        .await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("No space left on device"), "{out}");
    let (out, code) = s
        .sh(&d, "rm /data/big && echo ok > /data/g && cat /data/g /data/f && echo root > /root/r && cat /root/r")
        .await;
    assert_eq!((out.as_str(), code), ("ok\nfrom-the-guest\nroot\n", 0));
    assert_eq!(s.kill(&d).await, 204);
}

#[tokio::test]
async fn hibernation_keeps_a_guest_volume_and_fork_children_keep_only_read_only_ones() {
    let s = TestServer::start().await;
    let rw = s.volume("rw", 8).await;
    let ro = s.volume("ro", 8).await;
    // Something to read in the read-only one.
    let w = sandbox(&s, "vm", json!([{"volume": ro, "path": "/w"}])).await;
    let (_, code) = s.sh(&w, "echo reference > /w/r").await;
    assert_eq!(code, 0);
    assert_eq!(s.kill(&w).await, 204);

    // Killed while hibernated: what it wrote was flushed to the image before its memory
    // was saved.
    let h = sandbox(&s, "vm", json!([{"volume": rw, "path": "/data"}])).await;
    let (_, code) = s.sh(&h, "echo from-before-hibernation > /data/h").await;
    assert_eq!(code, 0);
    let (st, v) = s
        .request(Method::POST, &format!("/v1/sandboxes/{h}/hibernate"), None)
        .await;
    assert_eq!((st, v["state"].as_str()), (200, Some("hibernated")), "{v}");
    assert_eq!(s.kill(&h).await, 204);

    let p = sandbox(
        &s,
        "vm",
        json!([
            {"volume": rw, "path": "/data"},
            {"volume": ro, "path": "/ref", "read_only": true}
        ]),
    )
    .await;
    let (_, code) = s.sh(&p, "echo before > /data/x").await;
    assert_eq!(code, 0);
    let (st, v) = s
        .request(Method::POST, &format!("/v1/sandboxes/{p}/hibernate"), None)
        .await;
    assert_eq!((st, v["state"].as_str()), (200, Some("hibernated")), "{v}");
    let (out, code) = s
        .sh(&p, "cat /data/h /data/x /ref/r && echo after >> /data/x")
        .await;
    assert_eq!(
        (out.as_str(), code),
        ("from-before-hibernation\nbefore\nreference\n", 0)
    );

    let children = s.fork(&p, 1, "live").await;
    let child = &children[0];
    assert!(
        mounts_at(&s, child, "/ref").await.contains("ro,"),
        "the child keeps the read-only volume"
    );
    let (out, code) = s.sh(child, "cat /ref/r").await;
    assert_eq!((out.as_str(), code), ("reference\n", 0));
    assert_eq!(
        mounts_at(&s, child, "/data").await,
        "",
        "the read-write volume stays the parent's"
    );
    let (_, code) = s.sh(child, "echo child > /data/x").await;
    assert_eq!(code, 0, "/data is the child's own directory now");
    let (out, _) = s.sh(&p, "cat /data/x").await;
    assert_eq!(
        out, "before\nafter\n",
        "the child did not touch the parent's volume"
    );

    // More volumes than a guest has slots is a clear 422.
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
    for id in [child.as_str(), p.as_str()] {
        assert_eq!(s.kill(id).await, 204);
    }
    // Everything it wrote is on the image: an ns sandbox reads it.
    let n = sandbox(&s, "ns", json!([{"volume": rw, "path": "/data"}])).await;
    let (out, _) = s.sh(&n, "cat /data/x").await;
    assert_eq!(out, "before\nafter\n");
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
