//! The `vm` backend end to end: a guest kernel of its own, a fresh identity and random state
//! per restored sandbox, failures (QEMU killed, guest panic, guest OOM) contained and
//! reported, re-adoption after a server restart, live forks (a full-stream fallback, a
//! counting process in three children), QEMU's jail. The cases shared with `ns` run on both
//! backends through `both_backends!`: exec/stream/PTY/files in exec.rs, files.rs and pty.rs;
//! pause/resume, hibernate/wake, memory snapshots, live forks and explore in
//! lifecycle_table/.
//!
//! Needs QEMU, qemu-img and mkfs.ext4 (`scripts/deps.sh`); the guest kernel is fetched from
//! Debian's registry into the shared cache on first use.

use std::time::Duration;

use hutch_testkit::{wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

fn host_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("osrelease")
        .trim()
        .to_string()
}

async fn state_of(s: &TestServer, id: &str) -> Value {
    s.request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await
        .1
}

/// Wait until sandbox `id` is failed; returns its record.
async fn failed(s: &TestServer, id: &str) -> Value {
    wait_until(Duration::from_secs(15), async || {
        let v = state_of(s, id).await;
        (v["state"] == "failed").then_some(v)
    })
    .await
    .unwrap_or_else(|| panic!("sandbox {id} was not marked failed"))
}

#[tokio::test]
async fn guests_have_their_own_kernel_hostname_and_randomness() {
    let s = TestServer::start().await;
    let t = std::time::Instant::now();
    let a = s.create(json!({"isolation": "vm"})).await;
    let first = t.elapsed();
    let t = std::time::Instant::now();
    let b = s.create(json!({"isolation": "vm"})).await;
    eprintln!(
        "vm create: first (may bake) {first:?}, second {:?}",
        t.elapsed()
    );
    assert_eq!(a["isolation"], "vm");
    assert_eq!(a["state"], "running");
    let host = host_release();
    let mut seen = Vec::new();
    for v in [&a, &b] {
        let id = v["id"].as_str().expect("id");
        let (out, code) = s
            .sh(
                id,
                "uname -r; hostname; echo $HUTCH_SANDBOX_ID; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'",
            )
            .await;
        assert_eq!(code, 0, "{out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert_ne!(lines[0], host, "a vm sandbox runs its own kernel");
        assert!(lines[0].contains("cloud-amd64"), "{out}");
        assert_eq!(
            lines[1],
            id.replace('_', "-"),
            "hostname from the sandbox id"
        );
        assert_eq!(lines[2], id);
        seen.push(lines[3].to_string());
    }
    assert_ne!(
        seen[0], seen[1],
        "restored siblings must not share random state"
    );
    // The root disk is per sandbox: a write in one is not seen in the other.
    let (ida, idb) = (a["id"].as_str().expect("id"), b["id"].as_str().expect("id"));
    s.put_file(ida, "/root/only-a", "0644", b"a".to_vec()).await;
    let (out, _) = s.sh(idb, "cat /root/only-a 2>&1 || echo missing").await;
    assert!(
        out.contains("missing") || out.contains("No such file"),
        "{out}"
    );
}

#[tokio::test]
async fn auto_means_ns_without_kvm() {
    let s = TestServer::start().await;
    // Without hardware virtualization `auto` means ns.
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if !cpuinfo.contains(" vmx") && !cpuinfo.contains(" svm") {
        let v = s.create(json!({"isolation": "auto"})).await;
        assert_eq!(v["isolation"], "ns", "{v}");
    }
}

#[tokio::test]
async fn a_killed_qemu_or_a_guest_panic_fails_the_sandbox_and_the_server_carries_on() {
    let s = TestServer::start().await;
    let killed = s.create_id(json!({"isolation": "vm"})).await;
    let panicked = s.create_id(json!({"isolation": "vm"})).await;
    let pid = s.qemu_pid(&killed).expect("QEMU of the sandbox");
    // SAFETY: signalling the QEMU this test's server started, found by its pid.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let v = failed(&s, &killed).await;
    let error = v["error"].as_str().unwrap_or("");
    assert!(error.contains("QEMU") && error.contains("signal 9"), "{v}");

    // A guest kernel panic: the guest reboots, QEMU (-no-reboot) exits.
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        s.request(
            Method::POST,
            &format!("/v1/sandboxes/{panicked}/exec"),
            Some(json!({"cmd": "echo c > /proc/sysrq-trigger"})),
        ),
    )
    .await;
    let v = failed(&s, &panicked).await;
    assert!(
        v["error"].as_str().unwrap_or("").contains("Kernel panic"),
        "{v}"
    );
    assert!(s.qemu_pid(&panicked).is_none());
    // Calls on a failed sandbox are refused; the server keeps serving others.
    let (st, _) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{killed}/exec"),
            Some(json!({"cmd": "true"})),
        )
        .await;
    assert_eq!(st, 409);
    let id = s.create_id(json!({"isolation": "vm"})).await;
    assert_eq!(s.sh(&id, "echo ok").await.0, "ok\n");
}

#[tokio::test]
async fn a_restarted_server_readopts_running_vms() {
    let mut s = TestServer::start().await;
    let id = s.create_id(json!({"isolation": "vm"})).await;
    s.sh(&id, "echo kept > /root/state").await;
    let pid = s.qemu_pid(&id).expect("QEMU");
    s.stop_server();
    assert_eq!(s.qemu_pid(&id), Some(pid), "QEMU outlives the server");
    s.spawn_server().await;
    let v = state_of(&s, &id).await;
    assert_eq!(v["state"], "running", "{v}");
    let (out, code) = s.sh(&id, "cat /root/state; hostname").await;
    assert_eq!(code, 0);
    assert_eq!(out, format!("kept\n{}\n", id.replace('_', "-")));
    assert_eq!(s.kill(&id).await, 204);
    assert!(s.qemu_pid(&id).is_none(), "QEMU is gone after delete");
    assert!(!s.state_dir.join("sandboxes").join(&id).exists());
}

#[tokio::test]
async fn a_guest_using_more_than_its_ram_is_oom_killed_inside_the_guest() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({"isolation": "vm"})).await;
    // A concurrent exec killed by SIGKILL after the OOM kill, but not by the OOM killer: the
    // agent counts OOM kills per exec (a cgroup each), so it is not flagged.
    let bystander = s.exec(
        &id,
        json!({"cmd": "until dmesg | grep -q -i 'killed process'; do sleep 0.2; done; kill -9 $$", "timeout_seconds": 120}),
    );
    // Doubles a string until the guest kernel's OOM killer stops it (256 MiB guest).
    let hog = s.exec(
        &id,
        json!({"cmd": ["awk", "BEGIN { s = \"xxxxxxxxxxxxxxxx\"; while (1) s = s s }"], "timeout_seconds": 120}),
    );
    let (bystander, v) = tokio::join!(bystander, hog);
    assert_eq!(v["exit_code"], 137, "killed by SIGKILL: {v}");
    assert_eq!(v["timed_out"], false, "{v}");
    assert_eq!(
        v["oom_killed"], true,
        "the guest's OOM kill is reported: {v}"
    );
    assert_eq!(bystander["exit_code"], 137, "{bystander}");
    assert_eq!(
        bystander["oom_killed"], false,
        "another exec's OOM kill is not its own: {bystander}"
    );
    // The guest's init survived, and the sandbox keeps working.
    let v = s.exec(&id, json!({"cmd": "echo fine"})).await;
    assert_eq!(
        (v["stdout"].as_str(), v["oom_killed"].as_bool()),
        (Some("fine\n"), Some(false)),
        "{v}"
    );
    let (log, _) = s
        .sh(&id, "dmesg | grep -c -i 'out of memory' || true")
        .await;
    assert_ne!(log.trim(), "0", "the guest kernel logged its OOM kill");
    // Every exec ran in a cgroup of its own; they are reused, so there are only as many as
    // execs ran at once (two above; a third if one was still being emptied).
    let (cgroups, _) = s
        .sh(&id, "ls /sys/fs/cgroup | grep -c hutch-exec- || true")
        .await;
    let cgroups: u32 = cgroups.trim().parse().expect("count");
    assert!((1..=3).contains(&cgroups), "{cgroups} exec cgroups");
    assert_eq!(state_of(&s, &id).await["state"], "running");
}

#[tokio::test]
async fn qemu_runs_jailed_with_its_own_uid_namespaces_and_cgroup() {
    let s = TestServer::start().await;
    let id = s
        .create_id(json!({"isolation": "vm", "memory_mib": 256}))
        .await;
    let pid = s.qemu_pid(&id).expect("QEMU");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let uids = field("Uid:");
    assert!(
        uids.iter().all(|u| *u != "0"),
        "QEMU runs as root: {uids:?}"
    );
    assert_eq!(field("CapEff:"), ["0000000000000000"], "{status}");
    assert_eq!(field("NoNewPrivs:"), ["1"]);
    assert_eq!(field("Seccomp:"), ["2"], "QEMU's -sandbox filter is on");
    for ns in ["net", "ipc", "uts"] {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).expect("ns");
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).expect("ns");
        assert_ne!(theirs, ours, "QEMU shares the host's {ns} namespace");
    }
    // cgroup v1 (or hybrid): the memory hierarchy; pure v2: the unified one.
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    let v1 = cgroups
        .lines()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "memory"))
        })
        .and_then(|l| l.split(':').nth(2));
    let (cgroup_dir, limit_file) = match v1 {
        Some(path) => (
            format!("/sys/fs/cgroup/memory{path}"),
            "memory.limit_in_bytes",
        ),
        None => {
            let path = cgroups
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .expect("a cgroup");
            (format!("/sys/fs/cgroup{path}"), "memory.max")
        }
    };
    assert!(cgroup_dir.ends_with(&format!("/{id}")), "{cgroups}");
    let limit = std::fs::read_to_string(format!("{cgroup_dir}/{limit_file}")).expect("limit");
    assert_eq!(limit.trim(), ((256u64 + 256) << 20).to_string());
    // Its files: the overlay belongs to QEMU's uid and nobody else.
    let dir = s.state_dir.join("sandboxes").join(&id);
    let meta = std::fs::metadata(dir.join("disk.qcow2")).expect("overlay");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(meta.uid().to_string(), uids[0]);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let usage = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await
        .1;
    assert_eq!(usage["state"], "running");
    assert_eq!(s.kill(&id).await, 204);
    assert!(
        !std::path::Path::new(&cgroup_dir).exists(),
        "the cgroup is removed with the sandbox"
    );
}

/// QEMU's mount and pid namespaces, seen from the host: a root with only its own files (not
/// the host's, not another sandbox's), read-only but for its directory; pid 1 of its own pid
/// namespace, the host pid being the one the server watches.
#[tokio::test]
async fn qemu_sees_only_its_own_files_as_pid_1_of_its_namespace() {
    let s = TestServer::start().await;
    let a = s.create_id(json!({"isolation": "vm"})).await;
    let b = s.create_id(json!({"isolation": "vm"})).await;
    let pid = s.qemu_pid(&a).expect("QEMU");
    let ns = |pid: &str, kind: &str| {
        std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).expect("ns link")
    };
    for kind in ["mnt", "pid"] {
        assert_ne!(
            ns(&pid.to_string(), kind),
            ns("self", kind),
            "QEMU shares the server's {kind} namespace"
        );
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let nspid: Vec<&str> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .expect("NSpid")
        .split_whitespace()
        .collect();
    assert_eq!(nspid, [pid.to_string().as_str(), "1"], "{status}");

    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    let inside = |p: &std::path::Path| root.join(p.strip_prefix("/").expect("absolute"));
    let sandboxes = s.state_dir.join("sandboxes");
    assert!(
        inside(&sandboxes.join(&a).join("disk.qcow2")).is_file(),
        "QEMU does not see its own overlay"
    );
    assert!(
        inside(&sandboxes.join(&a).join("qmp.sock")).exists(),
        "QEMU does not see its own QMP socket"
    );
    for hidden in [
        sandboxes.join(&b),
        s.state_dir.join("state.db"),
        s.state_dir.join("templates"),
        "/etc/shadow".into(),
        "/etc".into(),
        "/home".into(),
        "/root".into(),
        "/proc/self".into(),
        "/sys/fs".into(),
        "/usr/bin/sh".into(),
    ] {
        let path = inside(&hidden);
        assert!(
            std::fs::symlink_metadata(&path).is_err(),
            "QEMU sees {}",
            hidden.display()
        );
    }
    assert!(
        inside(std::path::Path::new("/usr/bin/qemu-system-x86_64")).is_file()
            || std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|exe| inside(&exe).is_file()),
        "QEMU's binary is in its root"
    );
    // Few mounts, the root read-only, only its own directory writable.
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    let mounts: Vec<Vec<&str>> = mountinfo
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(mounts.len() < 100, "{mountinfo}");
    let root_mount = mounts.iter().find(|m| m[4] == "/").expect("a root mount");
    assert!(
        root_mount[5].split(',').any(|o| o == "ro"),
        "the root is writable: {mountinfo}"
    );
    let own = sandboxes.join(&a);
    let own = own.to_string_lossy();
    for m in &mounts {
        let writable = m[5].split(',').any(|o| o == "rw");
        if writable {
            let allowed = m[4] == own
                || m[4] == "/dev/null"
                || m[4] == "/dev/kvm"
                || m[4].ends_with("/memory");
            assert!(allowed, "{} is writable for QEMU: {mountinfo}", m[4]);
        }
    }
    // The sandbox works, and goes when killed (SIGKILL from the host reaches a pid 1).
    assert_eq!(s.sh(&a, "echo jailed").await, ("jailed\n".to_string(), 0));
    assert_eq!(s.kill(&a).await, 204);
    let gone = wait_until(Duration::from_secs(10), async || {
        (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    })
    .await;
    assert!(gone.is_some(), "QEMU of a killed sandbox is gone");
    assert_eq!(s.kill(&b).await, 204);
}

#[tokio::test]
async fn a_template_can_default_to_vm() {
    // A templates directory of this test's own, kept between runs like the shared one (so
    // its image and snapshot in the vm cache are reused, not made again on every run).
    let templates = hutch_testkit::templates_dir().with_file_name("templates-default-vm");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(hutch_testkit::hutch_bin())
            .args(args)
            .arg("--templates-dir")
            .arg(&templates)
            .output()
            .expect("run hutch");
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["template", "build", "minimal"]);
    let said = run(&["template", "set-isolation", "minimal", "vm"]);
    assert!(said.contains("default isolation vm"), "{said}");
    let s = TestServer::start_in(templates.clone(), &[]).await;
    let v = s.create(json!({})).await;
    assert_eq!(v["isolation"], "vm", "{v}");
    let v = s.create(json!({"isolation": "ns"})).await;
    assert_eq!(v["isolation"], "ns", "an explicit choice wins: {v}");
    let out = std::process::Command::new(hutch_testkit::hutch_bin())
        .args([
            "template",
            "set-isolation",
            "minimal",
            "kvm",
            "--templates-dir",
        ])
        .arg(&templates)
        .output()
        .expect("run hutch");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("use auto, ns or vm"));
}

#[tokio::test]
async fn a_missing_qemu_is_a_clear_422_and_ns_still_works() {
    let s = TestServer::start_with(&["--qemu", "/nonexistent/qemu-system-x86_64"]).await;
    let (st, v) = s
        .request(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"isolation": "vm"})),
        )
        .await;
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["error"]["code"], "not_supported", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("/nonexistent/qemu-system-x86_64 not found")
            && message.contains("qemu-system-x86"),
        "{message}"
    );
    let v = s.create(json!({"isolation": "auto"})).await;
    assert_eq!(v["isolation"], "ns");
    let v = s.create(json!({})).await;
    assert_eq!(v["isolation"], "ns");
}

async fn sh_ok(s: &TestServer, id: &str, script: &str) -> String {
    let (out, code) = s.sh(id, script).await;
    assert_eq!(code, 0, "{script}: {out}");
    out
}

/// `df -m /` of a sandbox: (total, available) MiB of its root filesystem.
async fn root_df_mib(s: &TestServer, id: &str) -> (u64, u64) {
    let out = sh_ok(s, id, "df -m / | tail -n 1").await;
    let fields: Vec<u64> = out
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    match fields[..] {
        [total, _used, avail, ..] => (total, avail),
        _ => panic!("df: {out}"),
    }
}

#[tokio::test]
async fn a_vm_root_disk_has_the_size_asked_for_and_never_less_than_its_image() {
    let s = TestServer::start().await;
    // Bigger than the template image (its files + 1 GiB): grown after the restore.
    let v = s.create(json!({"isolation": "vm", "disk_mib": 2048})).await;
    assert_eq!(v["disk_mib"], 2048, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    let (total, avail) = root_df_mib(&s, &id).await;
    assert!(
        (1900..=2048).contains(&total),
        "the root filesystem has about 2048 MiB: {total}"
    );
    // Nearly all of it can be used, then a write past it fails, only that write.
    sh_ok(
        &s,
        &id,
        &format!("fallocate -l {}M /root/fill", avail.saturating_sub(8)),
    )
    .await;
    let (out, code) = s
        .sh(&id, "dd if=/dev/zero of=/root/more bs=1M count=64 2>&1")
        .await;
    assert!(out.contains("No space left"), "{out}");
    assert_ne!(code, 0, "{out}");
    assert_eq!(sh_ok(&s, &id, "echo still fine").await, "still fine\n");
    sh_ok(&s, &id, "rm /root/fill /root/more; echo ok > /root/after").await;
    assert_eq!(sh_ok(&s, &id, "cat /root/after").await, "ok\n");

    // Less than the image: the disk keeps the image's size, and the sandbox says so.
    let v = s.create(json!({"isolation": "vm", "disk_mib": 64})).await;
    let got = v["disk_mib"].as_u64().expect("disk_mib");
    assert!(got > 1024, "a vm disk is never smaller than its image: {v}");
    let small = v["id"].as_str().expect("id").to_string();
    let (total, _) = root_df_mib(&s, &small).await;
    assert!(
        total <= got && total + 100 >= got,
        "df {total} MiB vs {got}"
    );
    let (st, v) = s
        .request(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"isolation": "vm", "disk_mib": 2_000_000})),
        )
        .await;
    assert_eq!(st, 422, "{v}");
}

/// The count of the counting process started by [`start_counter`] in sandbox `id`.
async fn count(s: &TestServer, id: &str) -> u64 {
    // The writer truncates then writes: an empty read is retried.
    let out = sh_ok(
        s,
        id,
        "while :; do c=$(cat /dev/shm/count); [ -n \"$c\" ] && break; done; echo $c",
    )
    .await;
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("count in {id}: {out:?}"))
}

/// Wait until the count in `id` passes `above`; returns it.
async fn count_passes(s: &TestServer, id: &str, above: u64) -> u64 {
    wait_until(Duration::from_secs(30), async || {
        let n = count(s, id).await;
        (n > above).then_some(n)
    })
    .await
    .unwrap_or_else(|| panic!("the count in {id} stopped at {above} or below"))
}

/// The fallback of captured snapshots, forced: a full migration stream loaded into a shared
/// memory file gives children the same memory, processes and firmware region.
#[tokio::test]
async fn a_live_fork_taken_as_a_full_stream_carries_memory_too() {
    let s = TestServer::start_with(&["--vm-snapshot", "stream"]).await;
    let parent = s.create_id(json!({"isolation": "vm"})).await;
    sh_ok(
        &s,
        &parent,
        "echo streamed > /dev/shm/m; setsid sleep 1000 > /dev/null 2>&1 < /dev/null &",
    )
    .await;
    let firmware = "dd if=/dev/mem bs=65536 skip=15 count=1 2>/dev/null | md5sum";
    let parent_firmware = sh_ok(&s, &parent, firmware).await;
    let kids = s.fork(&parent, 2, "live").await;
    for k in &kids {
        let out = sh_ok(&s, k, "cat /dev/shm/m; ps | grep -c '[s]leep 1000'").await;
        assert_eq!(out, "streamed\n1\n", "{k}");
        assert_eq!(sh_ok(&s, k, firmware).await, parent_firmware);
    }
    let metrics = s.metrics_text().await;
    assert!(
        metrics.contains("hutch_vm_memory_snapshots_total{method=\"captured\"} 0")
            && metrics.contains("hutch_vm_memory_snapshots_total{method=\"stream\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_live_fork_of_three_continues_a_counting_process_in_each_child_independently() {
    let s = TestServer::start().await;
    let parent = s.create_id(json!({"isolation": "vm"})).await;
    // A background process counting in memory (a shell variable); it publishes each value
    // to /dev/shm/count with shell builtins only (light on TCG guests). SIGUSR1 makes it
    // jump by a million: a way to change one copy of it.
    sh_ok(
        &s,
        &parent,
        "setsid sh -c 'echo $$ > /dev/shm/pid; n=0; trap \"n=\\$((n + 1000000))\" USR1; \
         while :; do n=$((n + 1)); echo $n > /dev/shm/count; sleep 0.2; done' \
         > /dev/null 2>&1 < /dev/null &",
    )
    .await;
    wait_until(Duration::from_secs(30), async || {
        let (out, _) = s.sh(&parent, "cat /dev/shm/count 2>/dev/null").await;
        (out.trim().parse::<u64>().unwrap_or(0) >= 3).then_some(())
    })
    .await
    .expect("the parent's process counts");
    let before_fork = count(&s, &parent).await;
    let kids = s.fork(&parent, 3, "live").await;
    assert_eq!(kids.len(), 3);
    // Each child's process goes on from the parent's count, not from zero.
    for k in &kids {
        let first = count(&s, k).await;
        assert!(
            first >= before_fork && first < 1_000_000,
            "child {k} starts at {first}, the parent was at {before_fork}"
        );
        count_passes(&s, k, first).await;
    }
    // Independently: the first child's copy jumps; the others and the parent's do not.
    sh_ok(&s, &kids[0], "kill -USR1 $(cat /dev/shm/pid)").await;
    count_passes(&s, &kids[0], 1_000_000).await;
    for other in [&kids[1], &kids[2], &parent] {
        let n = count(&s, other).await;
        assert!(n < 1_000_000, "{other} counts on its own: {n}");
        count_passes(&s, other, n).await;
    }
    // A file written in one child is invisible to its siblings and the parent.
    sh_ok(&s, &kids[0], "echo mine > /root/only-in-first").await;
    assert_eq!(
        sh_ok(&s, &kids[0], "cat /root/only-in-first").await,
        "mine\n"
    );
    for other in [&kids[1], &kids[2], &parent] {
        let out = sh_ok(
            &s,
            other,
            "cat /root/only-in-first 2>/dev/null || echo absent",
        )
        .await;
        assert_eq!(out, "absent\n", "in {other}");
    }
}

/// The first vm create of a template builds its disk image and bakes its snapshot: `hutch
/// create` shows that on stderr (from the server's `sandbox.preparing` events) while it
/// waits. A vm cache of this test's own (the guest kernel borrowed, unpacked, from the shared
/// one) makes every run build them afresh.
#[tokio::test]
async fn a_first_vm_create_shows_what_it_builds() {
    // Make sure the shared cache has an unpacked kernel, then borrow it.
    {
        let shared = TestServer::start().await;
        let id = shared.create_id(json!({"isolation": "vm"})).await;
        assert_eq!(shared.kill(&id).await, 204);
    }
    let kernel_root = std::fs::read_dir(hutch_testkit::vm_cache_dir().join("kernel"))
        .expect("kernel cache")
        .flatten()
        .map(|e| e.path().join("root"))
        .find(|p| p.is_dir())
        .expect("an unpacked guest kernel");
    let vm_dir = tempfile::Builder::new()
        .prefix("hutch-test-vm-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let s = TestServer::start_with(&[
        "--vm-dir",
        vm_dir.path().to_str().expect("utf-8"),
        "--vm-kernel-root",
        kernel_root.to_str().expect("utf-8"),
    ])
    .await;
    let create = || {
        std::process::Command::new(hutch_testkit::hutch_bin())
            .args(["create", "--isolation", "vm"])
            .env("HUTCH_URL", &s.url)
            .env("HUTCH_STATE_DIR", &s.state_dir)
            .env_remove("HUTCH_API_KEY")
            .output()
            .expect("run hutch")
    };
    let out = create();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("hutch: baking the snapshot of template minimal")
            && stderr.contains("done in"),
        "no progress shown: {stderr}"
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (_, code) = s.sh(&id, "true").await;
    assert_eq!(code, 0);
    // Cached now: a second create says nothing.
    let out = create();
    assert!(out.status.success());
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("baking"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(s);
}
