//! Isolation, proven from inside sandboxes through the real API.

use std::time::Duration;

use hutch_testkit::{static_c_binary, TestServer};
use reqwest::Method;
use serde_json::json;

async fn with_probe(s: &TestServer, id: &str) {
    s.put_file(id, "/usr/local/bin/probe", "0755", static_c_binary("probe"))
        .await;
}

#[tokio::test]
async fn cannot_see_host_processes_or_files() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let (pids, _) = s.sh(&id, "ls /proc | grep -c '^[0-9]'").await;
    let n: u32 = pids.trim().parse().expect("count");
    assert!(n < 10, "sees {n} pids: host processes leak in");
    let (init, _) = s.sh(&id, "cat /proc/1/cmdline | tr '\\0' ' '").await;
    assert!(
        init.contains("hutch-agent"),
        "pid 1 is not the agent: {init}"
    );
    // The server's own pid means nothing inside.
    let me = std::process::id();
    let (out, _) = s
        .sh(
            &id,
            &format!("test -e /proc/{me}/cmdline && cat /proc/{me}/cmdline || echo absent"),
        )
        .await;
    assert!(
        !out.contains("hutch-test") && !out.contains("cargo"),
        "{out}"
    );
    // The project's checkout is not visible.
    let checkout = hutch_testkit::repo_root().canonicalize().expect("checkout");
    let (out, _) = s
        .sh(
            &id,
            &format!("ls {} 2>&1 || echo absent", checkout.display()),
        )
        .await;
    assert!(out.contains("absent"), "host checkout visible: {out}");
    let (out, _) = s.sh(&id, "cat /proc/self/uid_map").await;
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"0"));
    assert_ne!(
        fields.get(1),
        Some(&"0"),
        "root inside must not be root outside: {out}"
    );
}

#[tokio::test]
async fn writes_to_etc_stay_in_the_sandbox_and_the_template_is_unchanged() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let template_passwd = hutch_testkit::templates_dir().join("minimal/rootfs/etc/passwd");
    let before = std::fs::read(&template_passwd).expect("template passwd");
    let (_, code) = s
        .sh(
            &id,
            "echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd && echo hi > /etc/new-file",
        )
        .await;
    assert_eq!(code, 0);
    let (out, _) = s.sh(&id, "tail -1 /etc/passwd").await;
    assert!(out.contains("evil"));
    assert_eq!(
        std::fs::read(&template_passwd).expect("read"),
        before,
        "template modified"
    );
    assert!(!hutch_testkit::templates_dir()
        .join("minimal/rootfs/etc/new-file")
        .exists());
    // A second sandbox sees the pristine template.
    let other = s.create_id(json!({})).await;
    let (out, _) = s
        .sh(&other, "grep -c evil /etc/passwd; ls /etc/new-file 2>&1")
        .await;
    assert!(out.starts_with('0'), "{out}");
    // The change is in the first sandbox's upper layer on the host (its subvolume of the
    // disk pool, or its sandbox directory where there is no pool).
    let upper = [
        s.state_dir.join("layers").join(&id),
        s.state_dir.join("sandboxes").join(&id),
    ]
    .map(|d| d.join("upper/etc/new-file"));
    assert!(
        upper.iter().any(|u| u.exists()),
        "expected copy-up at {upper:?}"
    );
}

#[tokio::test]
async fn privileged_syscalls_fail() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    with_probe(&s, &id).await;
    let v = s.exec(&id, json!({"cmd": ["probe", "syscalls"]})).await;
    let out = v["stdout"].as_str().expect("stdout");
    let result = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or("missing")
            .to_string()
    };
    for name in [
        "mount",
        "umount2",
        "unshare_user",
        "unshare_ns",
        "setns",
        "ptrace",
        "keyctl",
        "add_key",
        "bpf",
        "perf_event_open",
        "io_uring_setup",
        "open_by_handle_at",
        "init_module",
        "kexec_load",
        "socket_packet",
        "socket_raw",
        "sethostname",
        "clone_newuser",
        "settimeofday",
    ] {
        assert_eq!(
            result(name),
            "EPERM",
            "{name} must fail with EPERM; probe said:\n{out}"
        );
    }
    assert_eq!(result("clone3"), "ENOSYS", "{out}");
    let (status, _) = s
        .sh(&id, "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status")
        .await;
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");
    let (kcore, _) = s
        .sh(&id, "head -c 16 /proc/kcore 2>/dev/null | wc -c")
        .await;
    assert_eq!(kcore.trim(), "0", "/proc/kcore is readable");
    let (_, code) = s.sh(&id, "echo 1 > /proc/sys/kernel/printk").await;
    assert_ne!(code, 0, "/proc/sys is writable");
    let (nets, _) = s.sh(&id, "ls /sys/class/net").await;
    assert_eq!(
        nets.split_whitespace().collect::<Vec<_>>(),
        ["lo"],
        "{nets}"
    );
}

#[tokio::test]
async fn pid_1_cannot_be_killed_from_inside() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let _ = s
        .exec(&id, json!({"cmd": "kill -9 1; kill -SEGV 1; echo tried"}))
        .await;
    let (out, code) = s.sh(&id, "echo alive").await;
    assert_eq!((out.as_str(), code), ("alive\n", 0));
}

/// Root in the sandbox cannot open the agent's memory, environment or descriptors through
/// procfs (the path seccomp's ptrace block does not cover), nor reach its descriptors (the
/// agent's listening socket among them): the agent is non-dumpable. Its
/// own children are ordinary processes again after `execve`.
#[tokio::test]
async fn the_agents_memory_cannot_be_read_or_written_from_inside() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let script = "for f in mem environ; do \
                    (exec 3</proc/1/$f) 2>/dev/null && echo \"read $f: opened\" || echo \"read $f: denied\"; \
                  done; \
                  (exec 3<>/proc/1/mem) 2>/dev/null && echo 'write mem: opened' || echo 'write mem: denied'; \
                  readlink /proc/1/fd/0 >/dev/null 2>&1 && echo 'fd: resolved' || echo 'fd: denied'; \
                  (exec 4</proc/1/fd/0) 2>/dev/null && echo 'fd open: opened' || echo 'fd open: denied'; \
                  sleep 30 & (exec 3</proc/$!/environ) 2>/dev/null && echo 'child environ: opened'; kill $!";
    let (out, code) = s.sh(&id, script).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "read mem: denied",
            "read environ: denied",
            "write mem: denied",
            "fd: denied",
            "fd open: denied",
            "child environ: opened"
        ],
        "{out}"
    );
    // And the agent still serves.
    let (out, code) = s.sh(&id, "echo alive").await;
    assert_eq!((out.as_str(), code), ("alive\n", 0));
}

#[tokio::test]
async fn memory_limit_kills_the_hog_and_reports_oom_only_there() {
    let s = TestServer::start().await;
    let hog = s.create_id(json!({"memory_mib": 64})).await;
    let bystander = s.create_id(json!({"memory_mib": 64})).await;
    with_probe(&s, &hog).await;
    let v = s.exec(&hog, json!({"cmd": ["probe", "hog", "256"]})).await;
    assert_ne!(
        v["stdout"], "survived\n",
        "allocated 256 MiB under a 64 MiB limit"
    );
    assert_eq!(v["exit_code"], 137, "{v}");
    assert_eq!(v["oom_killed"], true, "{v}");
    // The sandbox itself and its neighbour carry on.
    assert_eq!(s.sh(&hog, "echo ok").await.0, "ok\n");
    assert_eq!(s.sh(&bystander, "echo ok").await.0, "ok\n");
    let (_, usage) = s
        .request(Method::GET, &format!("/v1/sandboxes/{hog}/usage"), None)
        .await;
    assert!(
        usage["usage"]["oom_kills"].as_u64().unwrap_or(0) >= 1,
        "{usage}"
    );
    let (_, usage) = s
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{bystander}/usage"),
            None,
        )
        .await;
    assert_eq!(usage["usage"]["oom_kills"], 0, "{usage}");
}

#[tokio::test]
async fn a_fork_bomb_hits_the_pids_limit_and_the_server_stays_up() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({"pids_max": 64})).await;
    let v = s
        .exec(
            &id,
            json!({"cmd": "bomb() { bomb | bomb & }; bomb; sleep 2", "timeout_seconds": 4}),
        )
        .await;
    assert!(v["exit_code"].is_i64(), "{v}");
    let (_, usage) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}/usage"), None)
        .await;
    assert!(
        usage["usage"]["pids"].as_u64().unwrap_or(999) <= 64,
        "{usage}"
    );
    // The server answers and other sandboxes work.
    let other = s.create_id(json!({})).await;
    assert_eq!(s.sh(&other, "echo fine").await.0, "fine\n");
}

#[tokio::test]
async fn cpu_limit_throttles_a_busy_loop() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({"cpus": 0.25})).await;
    with_probe(&s, &id).await;
    let (_, before) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}/usage"), None)
        .await;
    let t0 = std::time::Instant::now();
    // Two spinners for 1.5 s of wall time each: unthrottled ~3 s of CPU on 2 cores.
    let v = s
        .exec(&id, json!({"cmd": "probe spin 1.5 & probe spin 1.5; wait"}))
        .await;
    let wall = t0.elapsed();
    assert_eq!(v["exit_code"], 0, "{v}");
    let (_, after) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}/usage"), None)
        .await;
    let used = after["usage"]["cpu_usage_ns"].as_u64().expect("cpu")
        - before["usage"]["cpu_usage_ns"].as_u64().expect("cpu");
    let ratio = used as f64 / wall.as_nanos() as f64;
    assert!(ratio < 0.6, "used {ratio:.2} CPUs under a 0.25 CPU limit");
}

#[tokio::test]
async fn two_sandboxes_cannot_see_each_other() {
    let s = TestServer::start().await;
    let a = s.create_id(json!({})).await;
    let b = s.create_id(json!({})).await;
    let resp = s
        .http
        .post(format!("{}/v1/sandboxes/{a}/exec/stream", s.url))
        .bearer_auth(&s.key)
        .json(&json!({"cmd": ["sleep", "4321"], "background": true}))
        .send()
        .await
        .expect("stream");
    drop(resp);
    s.sh(&a, "echo secret > /root/secret-a").await;
    let (ps, _) = s.sh(&b, "ps -o args").await;
    assert!(!ps.contains("4321"), "b sees a's process: {ps}");
    let (ls, _) = s
        .sh(
            &b,
            "ls /root; find / -name 'secret-a' 2>/dev/null | head -1",
        )
        .await;
    assert!(!ls.contains("secret-a"), "b sees a's file: {ls}");
    let seen = hutch_testkit::wait_until(Duration::from_secs(5), async || {
        let (ps, _) = s.sh(&a, "ps -o args").await;
        ps.contains("sleep 4321").then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "a's own background process should be visible to a"
    );
}

#[tokio::test]
async fn disk_quota_fails_the_write_that_does_not_fit_and_nothing_else() {
    let s = TestServer::start().await;
    let full = s
        .create_id(json!({"isolation": "ns", "disk_mib": 32}))
        .await;
    let bystander = s.create_id(json!({"isolation": "ns"})).await;
    let (out, code) = s
        .sh(
            &full,
            "dd if=/dev/zero of=/big bs=1M count=64 conv=fsync 2>&1; echo rc=$?; ls -l /big",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("Disk quota exceeded") || out.contains("No space left"),
        "64 MiB written under a 32 MiB disk_mib: {out}"
    );
    assert!(!out.contains("rc=0"), "{out}");
    // Freeing space makes the sandbox writable again; it carries on.
    let (out, code) = s
        .sh(
            &full,
            "rm /big && echo small > /small && cat /small && dd if=/dev/zero of=/mid bs=1M count=8 conv=fsync 2>/dev/null && echo wrote",
        )
        .await;
    assert_eq!((out.as_str(), code), ("small\nwrote\n", 0));
    // Another sandbox is not limited by it, and the server answers.
    let (out, code) = s
        .sh(
            &bystander,
            "dd if=/dev/zero of=/big bs=1M count=64 conv=fsync 2>/dev/null && echo wrote",
        )
        .await;
    assert_eq!((out.as_str(), code), ("wrote\n", 0));
    let (status, _) = s.request(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, 200);
    // Destroying the sandbox deletes its subvolume.
    let subvol = s.state_dir.join("layers").join(&full);
    assert!(subvol.exists(), "no subvolume at {}", subvol.display());
    s.kill(&full).await;
    assert!(!subvol.exists(), "{} left after destroy", subvol.display());
}

#[tokio::test]
async fn disk_mib_larger_than_the_pool_is_refused_and_overcommit_is_allowed() {
    let s = TestServer::start_with(&["--ns-disk-pool-gib", "1"]).await;
    // The pool is made on the first ns create.
    let first = s
        .create_id(json!({"isolation": "ns", "disk_mib": 700}))
        .await;
    let metrics = s.metrics_text().await;
    assert!(
        metrics.contains("hutch_ns_disk_quota_enforced 1"),
        "{metrics}"
    );
    let pool: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("hutch_ns_disk_pool_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .expect("pool size in the metrics");
    assert!(pool > 512 << 20 && pool <= 1 << 30, "{pool}");
    // More than the whole pool: a sandbox could never use it.
    let (st, v) = s
        .request(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"isolation": "ns", "disk_mib": 2048})),
        )
        .await;
    assert_eq!(st, 422, "{v}");
    assert!(v.to_string().contains("ns disk pool"), "{v}");
    // Together more than the pool (700 + 700 > 1024): allowed, like thin provisioning.
    let second = s
        .create_id(json!({"isolation": "ns", "disk_mib": 700}))
        .await;
    let (out, code) = s.sh(&second, "echo ok > /f && cat /f").await;
    assert_eq!((out.as_str(), code), ("ok\n", 0));
    s.kill(&first).await;
    s.kill(&second).await;
}

/// A directory of links to every program on `PATH` but `mkfs.btrfs`.
fn path_without_mkfs_btrfs() -> tempfile::TempDir {
    hutch_testkit::path_without(&["mkfs.btrfs"])
}

#[tokio::test]
async fn without_mkfs_btrfs_ns_sandboxes_run_without_a_disk_limit_and_say_so() {
    let bin = path_without_mkfs_btrfs();
    let path = bin.path().to_str().expect("utf-8").to_string();
    let s = TestServer::start_with_env(&[], &[("PATH", &path)]).await;
    let id = s
        .create_id(json!({"isolation": "ns", "disk_mib": 16}))
        .await;
    // No limit: 32 MiB fit under a 16 MiB disk_mib.
    let (out, code) = s
        .sh(
            &id,
            "dd if=/dev/zero of=/big bs=1M count=32 conv=fsync 2>/dev/null && echo wrote",
        )
        .await;
    assert_eq!((out.as_str(), code), ("wrote\n", 0));
    assert!(!s.state_dir.join("layers.btrfs").exists());
    let metrics = s.metrics_text().await;
    assert!(
        metrics.contains("hutch_ns_disk_quota_enforced 0"),
        "{metrics}"
    );
    // `hutch doctor` with the same PATH says why.
    let o = std::process::Command::new(hutch_testkit::hutch_bin())
        .args(["--json", "doctor"])
        .env("PATH", &path)
        .env("HUTCH_AGENT", hutch_testkit::agent_bin())
        .env("HUTCH_STATE_DIR", &s.state_dir)
        .output()
        .expect("doctor");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["ns_disk_quota"]["enforced"], false, "{v}");
    assert!(
        v["ns_disk_quota"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("mkfs.btrfs")),
        "{v}"
    );
    s.kill(&id).await;
}

/// Run `argv` on the host as `nobody` (uid and gid 65534, no supplementary groups).
fn as_nobody(argv: &[&str]) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(argv)
        .output()
        .expect("run setpriv (util-linux)")
}

/// A host user other than root cannot read what a sandbox wrote (through its mounted root,
/// its upper layer, a volume's image or the state database), and a setuid file the sandbox
/// planted runs as the caller on the host, never as the sandbox's uid.
#[tokio::test]
async fn host_users_cannot_read_sandbox_files_and_planted_setuid_files_are_inert() {
    let s = TestServer::start().await;
    let vol = s.volume("private", 16).await;
    let id = s
        .create_id(json!({"volumes": [{"volume": vol, "path": "/data"}]}))
        .await;
    let (out, code) = s
        .sh(
            &id,
            "echo secret > /root/secret.txt && echo secret > /data/secret.txt && \
             cp /bin/busybox /root/busybox && chmod 4755 /root/busybox && sync && echo ok",
        )
        .await;
    assert_eq!((out.as_str(), code), ("ok\n", 0));

    let state = &s.state_dir;
    let mut secrets = vec![
        state.join(format!("sandboxes/{id}/merged/root/secret.txt")),
        state.join(format!("volumes/{vol}/disk.ext4")),
        state.join("state.db"),
    ];
    let upper = state.join(format!("layers/{id}/upper/root/secret.txt"));
    if upper.exists() {
        secrets.push(upper);
        secrets.push(state.join("layers.btrfs"));
    }
    for path in &secrets {
        assert!(path.exists(), "{} is missing", path.display());
        let p = path.to_str().expect("utf-8 path");
        let got = as_nobody(&["cat", p]);
        assert!(
            !got.status.success() && got.stdout.is_empty(),
            "nobody read {} bytes of {p}",
            got.stdout.len()
        );
        assert!(
            String::from_utf8_lossy(&got.stderr).contains("Permission denied"),
            "{p}: {}",
            String::from_utf8_lossy(&got.stderr)
        );
    }

    // Even root running the planted file keeps its own uid: the sandbox's mounts are nosuid
    // (without it, the process would run as the sandbox's host uid).
    let suid = state.join(format!("sandboxes/{id}/merged/root/busybox"));
    let meta = std::fs::metadata(&suid).expect("planted file");
    assert_ne!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o4000,
        0,
        "setuid bit kept"
    );
    let out = std::process::Command::new(&suid)
        .args(["id", "-u"])
        .output()
        .expect("run the planted file");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0", "{out:?}");
    // Every mount Hutch made under the state directory is nosuid and nodev.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let prefix = state.to_string_lossy().to_string();
    let mut seen = 0;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(4).is_some_and(|m| m.starts_with(&prefix)) {
            seen += 1;
            let opts = fields[5];
            assert!(
                opts.split(',').any(|o| o == "nosuid") && opts.split(',').any(|o| o == "nodev"),
                "{line}"
            );
        }
    }
    assert!(seen >= 3, "expected the sandbox's mounts under {prefix}");
}

/// The uid slot (host uid / 65,536) of a sandbox's init, read on the host.
fn host_uid_slot(s: &TestServer, id: &str) -> u32 {
    let pid = s.init_pid(id).expect("the sandbox's init");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .expect("Uid line");
    uid / 65_536
}

/// A host-wide uid claims directory of the test's own, and its path.
fn uid_claims_dir() -> (tempfile::TempDir, String) {
    let claims = tempfile::Builder::new()
        .prefix("hutch-test-uid-slots-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let dir = claims.path().to_str().expect("utf-8").to_string();
    (claims, dir)
}

#[tokio::test]
async fn two_servers_on_one_host_never_share_a_uid_range() {
    // Both servers on one host-wide claims directory (the test's own), with only 8 uid
    // slots, so that each server's random picks collide with the other's all the time.
    let (claims, dir) = uid_claims_dir();
    let env = [
        ("HUTCH_UID_SLOTS_DIR", dir.as_str()),
        ("HUTCH_UID_SLOTS", "8"),
    ];
    let mut servers = [
        TestServer::start_with_env(&[], &env).await,
        TestServer::start_with_env(&[], &env).await,
    ];
    // (server, sandbox id), alternating.
    let mut sandboxes = Vec::new();
    for i in 0..8 {
        let id = servers[i % 2].create_id(json!({})).await;
        sandboxes.push((i % 2, id));
    }
    let slots_of = |servers: &[TestServer], sandboxes: &[(usize, String)]| -> Vec<u32> {
        let mut slots: Vec<u32> = sandboxes
            .iter()
            .map(|(s, id)| host_uid_slot(&servers[*s], id))
            .collect();
        slots.sort_unstable();
        slots
    };
    let all: Vec<u32> = (16..24).collect();
    assert_eq!(
        slots_of(&servers, &sandboxes),
        all,
        "uid ranges shared or outside 16..24"
    );
    // The host's 8 slots are all in use: neither server can make a ninth.
    for s in &servers {
        let (status, v) = s
            .request(Method::POST, "/v1/sandboxes", Some(json!({})))
            .await;
        assert_eq!(status, 429, "{v}");
        assert_eq!(
            v["error"]["message"],
            "no free uid range for a new sandbox (this host's 8 uid slots are in use)"
        );
    }
    let claim_files = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(claims.path())
            .expect("claims")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "lock")
            .collect();
        names.sort();
        names
    };
    assert_eq!(claim_files().len(), 8);
    // A reboot empties /run: a server started again re-claims its surviving sandboxes'
    // slots, so the other still finds none free.
    for f in claim_files() {
        std::fs::remove_file(claims.path().join(f)).expect("remove claim");
    }
    servers[0].stop_server();
    servers[0].spawn_server().await;
    assert_eq!(
        claim_files().len(),
        4,
        "server 0's four sandboxes re-claimed"
    );
    servers[1].stop_server();
    servers[1].spawn_server().await;
    assert_eq!(claim_files().len(), 8);
    let (status, v) = servers[0]
        .request(Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_eq!(status, 429, "{v}");
    // A slot is the host's again once its sandbox is killed, whichever server takes it.
    let (s, id) = sandboxes.remove(1);
    let freed = host_uid_slot(&servers[s], &id);
    assert_eq!(servers[s].kill(&id).await, 204);
    let id = servers[0].create_id(json!({})).await;
    assert_eq!(host_uid_slot(&servers[0], &id), freed);
    sandboxes.push((0, id));
    assert_eq!(slots_of(&servers, &sandboxes), all);
    for (s, id) in &sandboxes {
        assert_eq!(servers[*s].kill(id).await, 204);
    }
    assert!(
        claim_files().is_empty(),
        "every claim goes with its sandbox"
    );
}

#[tokio::test]
async fn a_hibernated_sandbox_whose_range_another_server_took_after_a_reboot_does_not_wake() {
    let (claims, dir) = uid_claims_dir();
    let env = [
        ("HUTCH_UID_SLOTS_DIR", dir.as_str()),
        ("HUTCH_UID_SLOTS", "1"),
    ];
    let mut a = TestServer::start_with_env(&[], &env).await;
    let id = a.create_id(json!({})).await;
    let (status, v) = a
        .request(Method::POST, &format!("/v1/sandboxes/{id}/hibernate"), None)
        .await;
    assert_eq!(status, 200, "{v}");
    // A reboot: the server stops, /run is emptied; another server starts first and takes
    // the only slot.
    a.stop_server();
    std::fs::remove_file(claims.path().join("16")).expect("the claim of slot 16");
    let b = TestServer::start_with_env(&[], &env).await;
    let other = b.create_id(json!({})).await;
    assert_eq!(host_uid_slot(&b, &other), 16);
    a.spawn_server().await;
    let (status, v) = a
        .request(Method::POST, &format!("/v1/sandboxes/{id}/wake"), None)
        .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(
        v["error"]["message"],
        format!("sandbox {id} cannot wake: its uid range (slot 16) is in use by another hutch server on this host")
    );
    // Once the other server's sandbox is gone, the range is free and the wake goes ahead.
    assert_eq!(b.kill(&other).await, 204);
    let (status, v) = a
        .request(Method::POST, &format!("/v1/sandboxes/{id}/wake"), None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(host_uid_slot(&a, &id), 16);
    assert_eq!(a.kill(&id).await, 204);
}
