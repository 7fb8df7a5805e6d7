//! Nothing lost under faults (issue 23): a full state disk, a server killed (`SIGKILL`) in
//! the middle of an operation, files that went missing while the server was down. After
//! each fault, every sandbox the server lists is usable or `failed` with a reason, and no
//! write a sandbox completed is lost.
//!
//! The full-disk cases run the server on a small loop-mounted filesystem of their own
//! ([`SmallDisk`]); the crash cases kill the server at the point the operation leaves the
//! sandbox in (a frozen cgroup or a stopped guest, a hibernation whose memory was not saved)
//! and start a new one on the same state directory.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use hutch_testkit::{both_backends, on, skip_without_vm, wait_until, SmallDisk, TestServer};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// How long a call on a healthy sandbox may take here (a frozen one never answers).
const PROMPT: Duration = Duration::from_secs(60);

fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or("")
}

/// The mount options of the mount at `dir` (from `/proc/self/mountinfo`).
fn mount_options(dir: &std::path::Path) -> Option<String> {
    let dir = dir.to_str()?;
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()?
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some(dir))
        .and_then(|l| l.split_whitespace().nth(5).map(String::from))
}

/// Run `script` in sandbox `id` within [`PROMPT`]; returns (status, stdout or the error's
/// message, exit code).
async fn sh_within(s: &TestServer, id: &str, script: &str) -> (u16, String, i64) {
    let path = format!("/v1/sandboxes/{id}/exec");
    let call = s.request(Method::POST, &path, Some(json!({ "cmd": script })));
    let (status, v) = tokio::time::timeout(PROMPT, call)
        .await
        .unwrap_or_else(|_| panic!("exec in {id} did not answer within {PROMPT:?}"));
    // An error's message stands in for the output, so a failed assertion shows it.
    let out = match status {
        200 => v["stdout"].as_str().unwrap_or_default().to_string(),
        _ => message(&v).to_string(),
    };
    (status, out, v["exit_code"].as_i64().unwrap_or(-1))
}

#[tokio::test]
async fn a_full_state_disk_refuses_new_work_with_507_and_loses_no_completed_write() {
    let disk = SmallDisk::new(1600);
    let mut s =
        TestServer::start_in_state_dir(disk.state_dir(), &["--ns-disk-pool-gib", "1"]).await;
    let running = s
        .create_id(json!({"isolation": "ns", "persistent": true}))
        .await;
    let before = s
        .sh_ok(
            &running,
            "dd if=/dev/urandom of=/root/before bs=1M count=8 2>/dev/null && sync && sha256sum /root/before",
        )
        .await;
    let asleep = s
        .create_id(json!({"isolation": "ns", "persistent": true}))
        .await;
    s.sh_ok(&asleep, "echo asleep > /root/note && sync").await;
    s.act(&asleep, "hibernate").await;

    // The pool holds every block it will ever need on the host: allocated, not sparse.
    let image = s.state_dir.join("layers.btrfs");
    let meta = std::fs::metadata(&image).expect("the pool's image");
    assert!(
        meta.blocks() * 512 >= meta.len(),
        "the pool's image is sparse: {} of {} bytes allocated",
        meta.blocks() * 512,
        meta.len()
    );

    disk.fill();
    // A sandbox's writes need only the pool's own blocks: they complete, and the pool stays
    // writable.
    let during = s
        .sh_ok(
            &running,
            "dd if=/dev/urandom of=/root/during bs=1M count=8 2>/dev/null && sync && sha256sum /root/during",
        )
        .await;
    let layers = s.state_dir.join("layers");
    let options = mount_options(&layers).expect("the pool is mounted");
    assert!(options.starts_with("rw"), "the pool went {options}");
    let metrics = s.metrics_text().await;
    let gauge = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    assert!(
        gauge("hutch_state_disk_free_bytes") < gauge("hutch_state_disk_reserve_bytes"),
        "{metrics}"
    );

    // Reads and read-only calls work on the full disk.
    let (status, v) = s
        .request(Method::GET, &format!("/v1/sandboxes/{running}"), None)
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = s.request(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, 200, "{v}");
    let (status, out, code) = sh_within(&s, &running, "sha256sum /root/before").await;
    assert_eq!((status, code), (200, 0), "{out}");
    assert_eq!(out, before);
    let resp = s
        .http
        .get(format!(
            "{}/v1/sandboxes/{running}/files?path=/root/during",
            s.url
        ))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("read a file");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.bytes().await.expect("body").len(), 8 << 20);

    // New work that needs the state disk is refused with 507 and a JSON message, before it
    // starts; none of it is left behind.
    for (path, body) in [
        ("/v1/sandboxes".to_string(), json!({"isolation": "ns"})),
        (
            "/v1/volumes".to_string(),
            json!({"name": "full", "size_mib": 8}),
        ),
        (format!("/v1/sandboxes/{running}/snapshots"), json!({})),
    ] {
        let (status, v) = s.request(Method::POST, &path, Some(body)).await;
        assert_eq!(status, 507, "{path}: {v}");
        assert_eq!(v["error"]["code"], "no_space", "{path}: {v}");
        assert!(
            message(&v).contains("state disk"),
            "{path}: the message says what is full: {v}"
        );
    }
    assert_eq!(s.sandbox_ids().await.len(), 2);

    // A crash and a restart on the full disk: nothing completed is lost.
    s.kill_server();
    s.spawn_server().await;
    let (status, out, _) = sh_within(&s, &running, "sha256sum /root/before /root/during").await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out, format!("{before}{during}"));
    // A wake needs a little of the host disk (the sandbox's directory): refused with 507, or
    // done with the sandbox's files; never woken without them.
    let (status, out, _) = sh_within(&s, &asleep, "cat /root/note").await;
    match status {
        200 => assert_eq!(out, "asleep\n"),
        507 => assert_eq!(s.state(&asleep).await, "hibernated"),
        other => panic!("a wake on the full disk answered {other}: {out}"),
    }

    disk.unfill();
    let (status, out, _) = sh_within(&s, &asleep, "cat /root/note").await;
    assert_eq!((status, out.as_str()), (200, "asleep\n"));
    let again = s.create_id(json!({"isolation": "ns"})).await;
    s.sh_ok(&again, "echo ok > /root/f").await;
    drop(s);
    drop(disk);
}

#[tokio::test]
async fn a_hibernated_sandbox_whose_files_are_gone_is_failed_with_the_reason_never_woken_empty() {
    let mut s = TestServer::start().await;
    let id = s
        .create_id(json!({"isolation": "ns", "persistent": true}))
        .await;
    s.sh_ok(&id, "echo mine > /root/f").await;
    s.act(&id, "hibernate").await;
    s.stop_server();
    // Its writable layer (a subvolume of the disk pool) disappears while no server runs.
    let layers = s.state_dir.join("layers");
    assert!(layers.join(&id).exists(), "no subvolume for {id}");
    hutch_jail::btrfs::delete_subvolume(&layers, &id).expect("delete the subvolume");
    s.spawn_server().await;

    let (status, v) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state"], "failed", "{v}");
    let reason = v["error"].as_str().unwrap_or_default();
    assert!(reason.contains("files"), "the reason names the files: {v}");
    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": "cat /root/f"})),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert!(message(&v).contains(reason), "{v}");
    assert_eq!(s.kill(&id).await, 204);
}

/// The cgroup directories of `ns` sandbox `id` that have a freezer (the unified hierarchy's
/// on a hybrid host, else v1's), as the jail made them.
fn freezer_cgroups(id: &str) -> Vec<PathBuf> {
    let v2: Vec<PathBuf> = ["/sys/fs/cgroup/unified/hutch", "/sys/fs/cgroup/hutch"]
        .iter()
        .map(|root| PathBuf::from(root).join(id))
        .filter(|d| d.join("cgroup.freeze").exists())
        .collect();
    if !v2.is_empty() {
        return v2;
    }
    let v1 = PathBuf::from("/sys/fs/cgroup/freezer/hutch").join(id);
    assert!(
        v1.join("freezer.state").exists(),
        "no freezer cgroup for {id}"
    );
    vec![v1]
}

type QmpLines = tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>;

/// The next reply (or greeting) on a QMP connection, skipping events.
async fn qmp_reply(lines: &mut QmpLines) -> Value {
    loop {
        let line = lines
            .next_line()
            .await
            .expect("read QMP")
            .expect("QMP line");
        let v: Value = serde_json::from_str(&line).expect("QMP JSON");
        if v.get("return").is_some() || v.get("error").is_some() || v.get("QMP").is_some() {
            return v;
        }
    }
}

/// Send QMP `command` to the QEMU of vm sandbox `id` (its `qmp.sock`), as the server does;
/// returns the reply.
async fn qmp(s: &TestServer, id: &str, command: &str) -> Value {
    let socket = s.state_dir.join("sandboxes").join(id).join("qmp.sock");
    let stream = tokio::net::UnixStream::connect(&socket)
        .await
        .expect("connect to QMP");
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    qmp_reply(&mut lines).await;
    let mut reply = Value::Null;
    for cmd in ["qmp_capabilities", command] {
        write
            .write_all(format!("{{\"execute\": \"{cmd}\"}}\n").as_bytes())
            .await
            .expect("write QMP");
        reply = qmp_reply(&mut lines).await;
        assert!(reply.get("error").is_none(), "{cmd}: {reply}");
    }
    reply
}

/// Leave sandbox `id` as a snapshot leaves it while it reads its files or memory: `ns`
/// freezes its cgroup, `vm` stops its guest.
async fn stop_as_a_snapshot_does(s: &TestServer, isolation: &str, id: &str) {
    match isolation {
        "vm" => {
            qmp(s, id, "stop").await;
            let status = qmp(s, id, "query-status").await;
            assert_eq!(status["return"]["status"], "paused", "{status}");
        }
        _ => hutch_jail::freeze(&freezer_cgroups(id)).expect("freeze"),
    }
}

async fn a_server_killed_in_the_middle_of_a_snapshot_leaves_no_sandbox_frozen(isolation: &str) {
    let mut s = TestServer::start().await;
    let id = s
        .create_id(on(isolation, json!({"persistent": true})))
        .await;
    s.sh_ok(&id, "echo before > /root/f").await;
    stop_as_a_snapshot_does(&s, isolation, &id).await;
    s.kill_server();
    s.spawn_server().await;
    assert_eq!(s.state(&id).await, "running");
    let (status, out, code) = sh_within(&s, &id, "cat /root/f").await;
    assert_eq!((status, out.as_str(), code), (200, "before\n", 0));
    assert_eq!(s.kill(&id).await, 204);
}

both_backends!(a_server_killed_in_the_middle_of_a_snapshot_leaves_no_sandbox_frozen);

#[tokio::test]
async fn a_server_killed_in_the_middle_of_a_vm_hibernation_leaves_a_sandbox_that_runs_or_wakes() {
    if skip_without_vm(module_path!()) {
        return;
    }
    let mut s = TestServer::start().await;
    let id = s
        .create_id(json!({"isolation": "vm", "persistent": true}))
        .await;
    s.sh_ok(&id, "echo in-memory > /dev/shm/m").await;
    // Hibernate, and kill the server as soon as the record says so: the guest's memory is
    // then still being saved (under TCG that takes about a second).
    let (url, key) = (s.url.clone(), s.key.clone());
    let path = format!("{url}/v1/sandboxes/{id}/hibernate");
    let hibernating = tokio::spawn(async move {
        let _ = reqwest::Client::new()
            .post(path)
            .bearer_auth(key)
            .send()
            .await;
    });
    let recorded = wait_until(Duration::from_secs(20), async || {
        (s.state(&id).await == "hibernated").then_some(())
    })
    .await;
    assert!(recorded.is_some(), "the hibernation never started");
    s.kill_server();
    hibernating.abort();
    let saved = s
        .state_dir
        .join("sandboxes")
        .join(&id)
        .join("hibernated.state")
        .is_file();
    eprintln!("memory saved before the kill: {saved}");
    s.spawn_server().await;
    // Running again (nothing was saved), or hibernated with its memory: never a hibernated
    // sandbox that cannot wake. Either way its memory is there.
    let state = s.state(&id).await;
    assert!(
        state == "running" || (state == "hibernated" && saved),
        "{state}, memory saved: {saved}"
    );
    let (status, out, code) = sh_within(&s, &id, "cat /dev/shm/m").await;
    assert_eq!((status, out.as_str(), code), (200, "in-memory\n", 0));
    assert_eq!(s.kill(&id).await, 204);
}
