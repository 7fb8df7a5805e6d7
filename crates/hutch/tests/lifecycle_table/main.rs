//! One table of lifecycle cases, each run on both backends (`both_backends!`): pause/resume,
//! hibernate/wake (explicit, idle, over a server restart), named snapshots and sandboxes made
//! from them, snapshots of hibernated sandboxes, forks and explore, and volumes through all of
//! these.
//!
//! A case is written once. Where the backends legitimately differ the case says so through
//! [`Backend`], the one place that lists what each backend does differently, never by leaving
//! an assertion out: a vm keeps memory and processes over hibernation and in its snapshots,
//! and forks live; an `ns` sandbox keeps its files and starts its processes afresh; an `ns`
//! sandbox's volume is mounted on the host, a vm guest's never is.
//!
//! The `vm` halves need QEMU (`scripts/deps.sh`) and skip, saying why, where `hutch doctor`
//! says vm cannot run.

mod forks;
mod hibernation;
mod snapshots;
mod volumes;

use std::time::Duration;

use hutch_testkit::{both_backends, on, wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

use forks::{
    a_disk_fork_carries_files_and_processes_only_where_forks_carry_memory,
    explore_keeps_the_one_passing_command_and_destroys_the_rest,
};
use hibernation::hibernate_stops_the_sandbox_on_the_host_and_the_next_call_wakes_it;
use snapshots::{
    a_snapshot_of_a_sandbox_made_from_a_snapshot_carries_both,
    a_snapshot_restored_twice_gives_two_independent_sandboxes,
};
use volumes::{
    a_full_volume_fails_only_the_write_that_does_not_fit,
    a_volume_is_read_write_to_one_sandbox_or_read_only_to_many_and_deleted_only_unattached,
    a_volume_keeps_what_a_sandbox_wrote_for_the_next_and_over_a_server_restart,
    hibernation_keeps_a_volume_and_fork_children_keep_only_read_only_ones,
};

// The table: every case below runs as `<case>::ns` and `<case>::vm`.
both_backends!(
    a_paused_sandbox_uses_no_cpu_and_refuses_calls_until_resumed,
    hibernate_stops_the_sandbox_on_the_host_and_the_next_call_wakes_it,
    idle_sandboxes_hibernate_by_themselves,
    a_snapshot_restored_twice_gives_two_independent_sandboxes,
    a_snapshot_of_a_sandbox_made_from_a_snapshot_carries_both,
    a_disk_fork_carries_files_and_processes_only_where_forks_carry_memory,
    explore_keeps_the_one_passing_command_and_destroys_the_rest,
    a_volume_keeps_what_a_sandbox_wrote_for_the_next_and_over_a_server_restart,
    a_volume_is_read_write_to_one_sandbox_or_read_only_to_many_and_deleted_only_unattached,
    a_full_volume_fails_only_the_write_that_does_not_fit,
    hibernation_keeps_a_volume_and_fork_children_keep_only_read_only_ones,
    hibernated_and_paused_sandboxes_keep_their_state_over_a_server_restart,
);

/// What a backend does differently, said once. Cases branch on these fields, never on the
/// backend's name.
pub struct Backend {
    /// `"ns"` or `"vm"`: the `isolation` of create requests.
    pub isolation: &'static str,
    /// Hibernation saves memory, so processes and tmpfs files live on (vm: the guest's RAM
    /// is saved to disk); otherwise only the disk is kept and the next call boots afresh.
    pub hibernation_keeps_memory: bool,
    /// Snapshots hold memory and processes too (`kind: memory`; vm); otherwise they are
    /// `filesystem` snapshots.
    pub memory_snapshots: bool,
    /// `fork` with `mode: live` copies a running sandbox's memory (vm); otherwise it is
    /// refused with 422.
    pub live_fork: bool,
    /// Every fork carries memory and processes, a `disk` one too (vm: a guest restored with
    /// another disk than its page cache describes would corrupt it; `docs/lifecycle.md`);
    /// otherwise a disk fork carries files only.
    pub forks_carry_memory: bool,
    /// A volume in use is mounted on the host (ns: a loop mount at `<state>/volumes/<id>/mnt`
    /// the jail binds in idmapped, while the sandbox has processes); otherwise the host never
    /// mounts it (vm: the image is the guest's virtio disk, `docs/lifecycle.md`). A volume's
    /// `used_bytes` is reported while the host has it mounted.
    pub volumes_mounted_on_host: bool,
}

impl Backend {
    pub fn of(isolation: &str) -> Self {
        match isolation {
            "ns" => Self {
                isolation: "ns",
                hibernation_keeps_memory: false,
                memory_snapshots: false,
                live_fork: false,
                forks_carry_memory: false,
                volumes_mounted_on_host: true,
            },
            "vm" => Self {
                isolation: "vm",
                hibernation_keeps_memory: true,
                memory_snapshots: true,
                live_fork: true,
                forks_carry_memory: true,
                volumes_mounted_on_host: false,
            },
            other => panic!("no backend {other}"),
        }
    }

    /// The snapshot `kind` a snapshot of a sandbox of this backend has.
    pub fn snapshot_kind(&self) -> &'static str {
        if self.memory_snapshots {
            "memory"
        } else {
            "filesystem"
        }
    }

    /// The host process that is the sandbox (ns: its init; vm: its QEMU), if it runs.
    pub fn host_pid(&self, s: &TestServer, id: &str) -> Option<i32> {
        match self.isolation {
            "vm" => s.qemu_pid(id),
            _ => s.init_pid(id),
        }
    }

    /// A create request on this backend.
    pub fn create(&self, body: Value) -> Value {
        on(self.isolation, body)
    }
}

pub fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or("")
}

pub async fn cpu_ns(s: &TestServer, id: &str) -> u64 {
    let (status, v) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}/usage"), None)
        .await;
    assert_eq!(status, 200, "{v}");
    v["usage"]["cpu_usage_ns"].as_u64().expect("cpu_usage_ns")
}

pub fn mounts_of(s: &TestServer, id: &str) -> Vec<String> {
    s.mounts_under_state()
        .into_iter()
        .filter(|m| m.contains(id))
        .collect()
}

pub fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

/// 16 random bytes read inside sandbox `id`, in hex.
pub async fn randomness(s: &TestServer, id: &str) -> String {
    s.sh_ok(id, "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
        .await
}

async fn a_paused_sandbox_uses_no_cpu_and_refuses_calls_until_resumed(isolation: &str) {
    let b = Backend::of(isolation);
    let s = TestServer::start().await;
    let id = s.create_id(b.create(json!({}))).await;
    s.start_background(&id, json!("while :; do :; done")).await;
    let c0 = cpu_ns(&s, &id).await;
    let busy = wait_until(Duration::from_secs(10), async || {
        (cpu_ns(&s, &id).await > c0 + 100_000_000).then_some(())
    })
    .await;
    assert!(busy.is_some(), "the busy loop never ran");

    let v = s.act(&id, "pause").await;
    assert_eq!(v["state"], "paused", "{v}");
    let before = cpu_ns(&s, &id).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = cpu_ns(&s, &id).await;
    assert!(
        after - before < 5_000_000,
        "a paused sandbox used {} ms of CPU in 1 s",
        (after - before) / 1_000_000
    );

    // Everything but resume, kill, get and list is refused with a clear 409.
    let (status, v) = s
        .post(
            &format!("/v1/sandboxes/{id}/exec"),
            json!({"cmd": ["true"]}),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "conflict");
    assert!(
        message(&v).contains("paused") && message(&v).contains("resume"),
        "{v}"
    );
    let (status, _) = s
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=/etc/passwd"),
            None,
        )
        .await;
    assert_eq!(status, 409);
    for (path, body) in [
        ("hibernate", Value::Null),
        ("pause", Value::Null),
        ("wake", Value::Null),
        ("snapshots", json!({"name": "x"})),
        ("fork", json!({"count": 1})),
    ] {
        let (status, v) = s.post(&format!("/v1/sandboxes/{id}/{path}"), body).await;
        assert_eq!(status, 409, "{path}: {v}");
        assert!(message(&v).contains("paused"), "{path}: {v}");
    }
    assert_eq!(s.state(&id).await, "paused");
    let (_, listed) = s
        .request(Method::GET, "/v1/sandboxes?state=paused", None)
        .await;
    assert_eq!(listed["sandboxes"][0]["id"], id.as_str());

    let v = s.act(&id, "resume").await;
    assert_eq!(v["state"], "running");
    let resumed = cpu_ns(&s, &id).await;
    let grew = wait_until(Duration::from_secs(5), async || {
        (cpu_ns(&s, &id).await > resumed + 100_000_000).then_some(())
    })
    .await;
    assert!(
        grew.is_some(),
        "the busy loop did not run again after resume"
    );
    assert_eq!(s.sh(&id, "echo back").await.0, "back\n");
    assert_eq!(s.state(&id).await, "running");
    let (status, v) = s
        .post(&format!("/v1/sandboxes/{id}/resume"), Value::Null)
        .await;
    assert_eq!(status, 409, "resume of a running sandbox: {v}");

    // A paused sandbox can be killed, and nothing of it is left.
    s.act(&id, "pause").await;
    assert_eq!(s.kill(&id).await, 204);
    assert!(mounts_of(&s, &id).is_empty());
    assert!(!s.state_dir.join("sandboxes").join(&id).exists());
}

/// On vm, a paused guest's agent still holds the session of the server that stopped: the
/// resume ends it (`VmBackend::resume`), or the next exec would hang unanswered.
async fn hibernated_and_paused_sandboxes_keep_their_state_over_a_server_restart(isolation: &str) {
    let b = Backend::of(isolation);
    let mut s = TestServer::start().await;
    let id = s.create_id(b.create(json!({"persistent": true}))).await;
    s.sh(&id, "echo before-restart > /root/note").await;
    s.act(&id, "hibernate").await;
    let paused = s.create_id(b.create(json!({"persistent": true}))).await;
    s.act(&paused, "pause").await;
    s.stop_server();
    s.spawn_server().await;
    assert_eq!(s.state(&paused).await, "paused");
    s.act(&paused, "resume").await;
    assert_eq!(s.sh(&paused, "echo alive").await.0, "alive\n");
    let (status, v) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(v["state"], "hibernated", "{v}");
    assert!(v.get("error").is_none(), "{v}");
    assert_eq!(s.sh(&id, "cat /root/note").await.0, "before-restart\n");
    assert_eq!(s.state(&id).await, "running");
}

async fn idle_sandboxes_hibernate_by_themselves(isolation: &str) {
    let b = Backend::of(isolation);
    let s = TestServer::start_with(&["--reaper-interval-ms", "100"]).await;
    let id = s
        .create_id(b.create(json!({"persistent": true, "idle_hibernate_seconds": 1})))
        .await;
    s.sh(&id, "echo idle > /root/f").await;
    if b.hibernation_keeps_memory {
        s.sh_ok(&id, "echo kept > /dev/shm/k").await;
    }
    // The state says hibernated as soon as it starts; the sandbox's host process (a vm's
    // QEMU once the memory is saved) is gone after.
    let hibernated = wait_until(Duration::from_secs(20), async || {
        (s.state(&id).await == "hibernated" && b.host_pid(&s, &id).is_none()).then_some(())
    })
    .await;
    assert!(hibernated.is_some(), "an idle sandbox was not hibernated");
    assert_eq!(s.sh(&id, "cat /root/f").await.0, "idle\n");
    if b.hibernation_keeps_memory {
        assert_eq!(s.sh(&id, "cat /dev/shm/k").await.0, "kept\n");
    }
    assert_eq!(s.state(&id).await, "running");
    // A connected client keeps it up, even when its command uses no CPU.
    let resp = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec/stream", s.url))
        .bearer_auth(&s.key)
        .json(&json!({"cmd": "sleep 3; echo done"}))
        .send()
        .await
        .expect("stream");
    let body = tokio::spawn(resp.text());
    for _ in 0..25 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(s.state(&id).await, "running", "hibernated under a client");
    }
    let body = body.await.expect("join").expect("body");
    assert!(
        body.contains("done") && body.contains("event: exit"),
        "{body}"
    );
    // Turned off with PATCH: it stays running.
    let (status, v) = s
        .request(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}"),
            Some(json!({"idle_hibernate_seconds": 0})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(v.get("idle_hibernate_seconds").is_none(), "{v}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(s.state(&id).await, "running");
}
