//! Durable volumes through the lifecycle: what one sandbox wrote (killed while paused, or
//! while hibernated) is read by the next and outlives a server restart; a read-only
//! attachment refuses writes; read-write is exclusive, read-only is shared; an attached
//! volume cannot be deleted (409); a full volume fails only the write that does not fit;
//! hibernate and wake keep the mount; fork children keep only the read-only volumes.
//!
//! Where the image is mounted differs by backend ([`Backend::volumes_mounted_on_host`]): an
//! `ns` sandbox's volume is a loop mount on the host while the sandbox runs; a `vm` guest's is
//! its own virtio disk, which the host never mounts.

use std::path::{Path, PathBuf};

use hutch_testkit::TestServer;
use reqwest::Method;
use serde_json::{json, Value};

use crate::{message, Backend};

/// Create a sandbox on `b` with `volumes`; returns status and body.
async fn create(s: &TestServer, b: &Backend, volumes: Value) -> (u16, Value) {
    s.request(
        Method::POST,
        "/v1/sandboxes",
        Some(b.create(json!({"volumes": volumes}))),
    )
    .await
}

/// Create a sandbox on `b` with `volumes` (201 expected); returns its id.
async fn sandbox(s: &TestServer, b: &Backend, volumes: Value) -> String {
    let (st, v) = create(s, b, volumes).await;
    assert_eq!(st, 201, "{v}");
    v["id"].as_str().expect("id").to_string()
}

/// Where the host mounts volume `vol` while an `ns` sandbox uses it.
fn host_mount_point(s: &TestServer, vol: &str) -> PathBuf {
    s.state_dir.join("volumes").join(vol).join("mnt")
}

fn host_mounted(path: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(path.to_str().unwrap_or("?")))
}

/// Lines of the sandbox's `/proc/mounts` for mount point `path`.
async fn mounts_at(s: &TestServer, id: &str, path: &str) -> String {
    let (out, _) = s
        .sh(id, &format!("grep ' {path} ' /proc/mounts || true"))
        .await;
    out
}

pub async fn a_volume_keeps_what_a_sandbox_wrote_for_the_next_and_over_a_server_restart(
    isolation: &str,
) {
    let b = Backend::of(isolation);
    let mut s = TestServer::start().await;
    let vol = s.volume("data", 16).await;
    let a = sandbox(&s, &b, json!([{"volume": "data", "path": "/data"}])).await; // by name
    let (out, code) = s
        .sh(
            &a,
            "echo kept > /data/f && mkdir -p /data/d && chown 1000:1000 /data/d \
             && stat -c '%u %a' /data /data/d && cat /data/f && grep ' /data ' /proc/mounts \
             && df -m /data | tail -1",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("0 755\n1000 755\nkept\n"), "{out}");
    assert!(out.contains(" /data ext4 rw,nosuid,nodev"), "{out}");
    let size_mib: u64 = out
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        (12..=16).contains(&size_mib),
        "the sandbox sees the volume's size: {out}"
    );
    let mnt = host_mount_point(&s, &vol);
    assert_eq!(
        host_mounted(&mnt),
        b.volumes_mounted_on_host,
        "the host mounts the volume in use exactly where the backend does"
    );
    if b.volumes_mounted_on_host {
        // On disk the owners are 0-based (idmapped), not the sandbox's host uid range.
        let meta = std::fs::metadata(mnt.join("d")).expect("stat on host");
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 1000);
    }
    let (_, v) = s
        .request(Method::GET, &format!("/v1/volumes/{vol}"), None)
        .await;
    assert_eq!(v["attached"][0]["sandbox"], a.as_str(), "{v}");
    assert_eq!(
        v["used_bytes"].as_u64().is_some(),
        b.volumes_mounted_on_host,
        "used_bytes is reported while the host mounts the volume (docs/api.md): {v}"
    );
    // Killed while paused, without a sync by anyone: what it wrote is on the image (a vm
    // guest is flushed first).
    let v = s.act(&a, "pause").await;
    assert_eq!(v["state"], "paused", "{v}");
    assert_eq!(s.kill(&a).await, 204);
    assert!(!host_mounted(&mnt), "unmounted once unused");

    // Read-only: the data and its owners are there, writes are refused.
    let r = sandbox(
        &s,
        &b,
        json!([{"volume": vol, "path": "/mnt/in/ro", "read_only": true}]),
    )
    .await;
    let (out, _) = s
        .sh(
            &r,
            "cat /mnt/in/ro/f && stat -c %u /mnt/in/ro/d; (echo x > /mnt/in/ro/g) 2>&1; echo rc=$?",
        )
        .await;
    assert!(out.starts_with("kept\n1000\n"), "{out}");
    assert!(
        out.contains("Read-only file system") && out.contains("rc=1"),
        "{out}"
    );
    assert!(
        mounts_at(&s, &r, "/mnt/in/ro").await.contains(" ext4 ro,"),
        "{}",
        mounts_at(&s, &r, "/mnt/in/ro").await
    );
    assert_eq!(s.kill(&r).await, 204);

    // The volume outlives the server too.
    s.stop_server();
    s.spawn_server().await;
    let c = sandbox(&s, &b, json!([{"volume": vol, "path": "/data"}])).await;
    assert_eq!(s.sh(&c, "cat /data/f").await.0, "kept\n");
    assert_eq!(s.kill(&c).await, 204);
    let (st, _) = s
        .request(Method::DELETE, &format!("/v1/volumes/{vol}"), None)
        .await;
    assert_eq!(st, 204);
    let dir = s.state_dir.join("volumes").join(&vol);
    assert!(
        !dir.exists(),
        "volume files removed: {:?}",
        std::fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
    );
}

pub async fn a_volume_is_read_write_to_one_sandbox_or_read_only_to_many_and_deleted_only_unattached(
    isolation: &str,
) {
    let b = Backend::of(isolation);
    let s = TestServer::start().await;
    let vol = s.volume("shared", 8).await;
    let a = sandbox(&s, &b, json!([{"volume": vol, "path": "/data"}])).await;
    for ro in [false, true] {
        let (st, v) = create(
            &s,
            &b,
            json!([{"volume": vol, "path": "/data", "read_only": ro}]),
        )
        .await;
        assert_eq!(
            st, 409,
            "second attach (read_only={ro}) while attached read-write: {v}"
        );
    }
    let (st, v) = s
        .request(Method::DELETE, &format!("/v1/volumes/{vol}"), None)
        .await;
    assert_eq!(st, 409, "{v}");
    assert!(
        message(&v).contains(&a),
        "the refusal names the holder: {v}"
    );
    assert_eq!(s.kill(&a).await, 204);

    // Read-only to many.
    let mut readers = Vec::new();
    for _ in 0..2 {
        readers.push(
            sandbox(
                &s,
                &b,
                json!([{"volume": vol, "path": "/data", "read_only": true}]),
            )
            .await,
        );
    }
    let (st, v) = create(&s, &b, json!([{"volume": vol, "path": "/data"}])).await;
    assert_eq!(
        st, 409,
        "read-write while attached read-only elsewhere: {v}"
    );
    let (_, list) = s.request(Method::GET, "/v1/volumes", None).await;
    assert_eq!(
        list["volumes"][0]["attached"].as_array().map(Vec::len),
        Some(2),
        "{list}"
    );
    let (st, v) = s
        .request(Method::DELETE, &format!("/v1/volumes/{vol}"), None)
        .await;
    assert_eq!(st, 409, "deleting a volume attached read-only: {v}");
    for r in &readers {
        assert_eq!(s.kill(r).await, 204);
    }
    let (st, _) = s
        .request(Method::DELETE, &format!("/v1/volumes/{vol}"), None)
        .await;
    assert_eq!(st, 204);
    let (st, _) = s
        .request(Method::GET, &format!("/v1/volumes/{vol}"), None)
        .await;
    assert_eq!(st, 404);
}

pub async fn a_full_volume_fails_only_the_write_that_does_not_fit(isolation: &str) {
    let b = Backend::of(isolation);
    let s = TestServer::start().await;
    let vol = s.volume("small", 8).await;
    let a = sandbox(&s, &b, json!([{"volume": vol, "path": "/data"}])).await;
    let other = s.create_id(b.create(json!({}))).await;
    let (out, code) = s
        .sh(
            &a,
            "dd if=/dev/zero of=/data/big bs=1M count=32 2>&1; echo rc=$?",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("No space left on device") && !out.contains("rc=0"),
        "{out}"
    );
    // Everything else still works: the sandbox's own disk, the volume after freeing space,
    // the other sandbox, the server.
    let (out, code) = s
        .sh(
            &a,
            "echo fine > /root/r && cat /root/r && rm /data/big && echo again > /data/g && cat /data/g",
        )
        .await;
    assert_eq!((out.as_str(), code), ("fine\nagain\n", 0));
    assert_eq!(s.sh(&other, "echo ok").await.0, "ok\n");
    assert_eq!(s.kill(&a).await, 204);
    assert_eq!(s.kill(&other).await, 204);
}

pub async fn hibernation_keeps_a_volume_and_fork_children_keep_only_read_only_ones(
    isolation: &str,
) {
    let b = Backend::of(isolation);
    let s = TestServer::start().await;
    let rw = s.volume("rw", 8).await;
    let ro = s.volume("ro", 8).await;
    let rw_mnt = host_mount_point(&s, &rw);
    // Something to read in the read-only one.
    let w = sandbox(&s, &b, json!([{"volume": ro, "path": "/w"}])).await;
    let (_, code) = s.sh(&w, "echo reference > /w/r").await;
    assert_eq!(code, 0);
    assert_eq!(s.kill(&w).await, 204);

    // Killed while hibernated: what it wrote is on the image (a vm guest's was flushed
    // before its memory was saved).
    let h = sandbox(&s, &b, json!([{"volume": rw, "path": "/data"}])).await;
    let (_, code) = s.sh(&h, "echo from-before-hibernation > /data/h").await;
    assert_eq!(code, 0);
    let v = s.act(&h, "hibernate").await;
    assert_eq!(v["state"], "hibernated", "{v}");
    assert!(
        !host_mounted(&rw_mnt),
        "a hibernated sandbox holds no mount"
    );
    assert_eq!(s.kill(&h).await, 204);

    let p = sandbox(
        &s,
        &b,
        json!([
            {"volume": rw, "path": "/data"},
            {"volume": ro, "path": "/ref", "read_only": true}
        ]),
    )
    .await;
    let (_, code) = s.sh(&p, "echo before > /data/x").await;
    assert_eq!(code, 0);
    let v = s.act(&p, "hibernate").await;
    assert_eq!(v["state"], "hibernated", "{v}");
    assert!(!host_mounted(&rw_mnt), "hibernation lets go of the mount");
    // The next exec wakes it with its volumes.
    let (out, code) = s
        .sh(&p, "cat /data/h /data/x /ref/r && echo after >> /data/x")
        .await;
    assert_eq!(
        (out.as_str(), code),
        ("from-before-hibernation\nbefore\nreference\n", 0)
    );
    assert_eq!(host_mounted(&rw_mnt), b.volumes_mounted_on_host);

    // Children keep the read-only volume; the read-write one stays the parent's.
    let mode = if b.live_fork { "live" } else { "disk" };
    let children = s.fork(&p, 1, mode).await;
    let child = &children[0];
    assert!(
        mounts_at(&s, child, "/ref").await.contains(" ro,"),
        "the child keeps the read-only volume: {}",
        mounts_at(&s, child, "/ref").await
    );
    let (out, code) = s.sh(child, "cat /ref/r").await;
    assert_eq!((out.as_str(), code), ("reference\n", 0));
    assert_eq!(
        mounts_at(&s, child, "/data").await,
        "",
        "the read-write volume stays the parent's"
    );
    let (out, code) = s.sh(child, "echo child > /data/x").await;
    assert_eq!(code, 0, "/data is the child's own directory now: {out}");
    let (out, _) = s.sh(&p, "cat /data/x").await;
    assert_eq!(
        out, "before\nafter\n",
        "the child did not touch the parent's volume"
    );
    for id in [child.as_str(), p.as_str()] {
        assert_eq!(s.kill(id).await, 204);
    }
    // Everything it wrote is on the image for the next sandbox.
    let n = sandbox(&s, &b, json!([{"volume": rw, "path": "/data"}])).await;
    assert_eq!(s.sh(&n, "cat /data/x").await.0, "before\nafter\n");
    assert_eq!(s.kill(&n).await, 204);
}
