//! Hibernate and wake: nothing of a hibernated sandbox runs on the host; the next exec or
//! file call wakes it with its files (and, where hibernation keeps memory, its processes and
//! tmpfs files); an explicit wake reports how long it took.

use hutch_testkit::TestServer;
use reqwest::Method;
use serde_json::{json, Value};

use crate::{mounts_of, process_alive, Backend};

pub async fn hibernate_stops_the_sandbox_on_the_host_and_the_next_call_wakes_it(isolation: &str) {
    let b = Backend::of(isolation);
    let s = TestServer::start().await;
    let id = s.create_id(b.create(json!({}))).await;
    s.put_file(
        &id,
        "/root/kept.txt",
        "0600",
        b"kept across hibernation".to_vec(),
    )
    .await;
    if b.hibernation_keeps_memory {
        // State only in RAM: a tmpfs file.
        s.sh_ok(&id, "echo in-ram > /dev/shm/x").await;
    }
    s.start_background(&id, json!("sleep 9999")).await;
    let pid = b.host_pid(&s, &id).expect("the sandbox's host process");

    let v = s.act(&id, "hibernate").await;
    assert_eq!(v["state"], "hibernated", "{v}");
    // Nothing of it runs or is mounted on the host.
    assert!(!process_alive(pid), "{pid} survived hibernation");
    assert!(mounts_of(&s, &id).is_empty(), "{:?}", mounts_of(&s, &id));
    assert!(
        b.host_pid(&s, &id).is_none(),
        "the sandbox still has a process on the host"
    );
    assert!(!std::path::Path::new(&format!("/sys/fs/cgroup/pids/hutch/{id}")).exists());
    let saved = s
        .state_dir
        .join("sandboxes")
        .join(&id)
        .join("hibernated.state");
    assert_eq!(
        saved.is_file(),
        b.hibernation_keeps_memory,
        "memory saved to disk exactly when hibernation keeps memory"
    );
    let (_, usage) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}/usage"), None)
        .await;
    assert!(usage["usage"].is_null(), "{usage}");
    let (status, v) = s
        .post(&format!("/v1/sandboxes/{id}/hibernate"), Value::Null)
        .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(s.state(&id).await, "hibernated", "get must not wake it");

    // Any exec wakes it: the files are there; the processes are only where hibernation
    // keeps memory (documented on ns: they are not).
    let (out, code) = s
        .sh(
            &id,
            "cat /root/kept.txt; echo; ps -o args; echo ---; cat /dev/shm/x 2>/dev/null || echo none; \
             date +%s; hostname",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("kept across hibernation\n"), "{out}");
    let (processes, rest) = out.split_once("---\n").expect("the marker");
    assert_eq!(
        processes.contains("sleep 9999"),
        b.hibernation_keeps_memory,
        "a process survived exactly when hibernation keeps memory: {out}"
    );
    let lines: Vec<&str> = rest.lines().collect();
    assert_eq!(
        lines[0] == "in-ram",
        b.hibernation_keeps_memory,
        "tmpfs kept exactly when hibernation keeps memory: {out}"
    );
    let guest_now: i64 = lines[1].parse().expect("date");
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    assert!(
        (guest_now - host_now).abs() <= 5,
        "clock set on wake: {out}"
    );
    assert_eq!(lines[2], id.replace('_', "-"));
    assert_eq!(s.state(&id).await, "running");
    assert!(!saved.exists(), "the saved state is dropped once awake");
    let new_pid = b.host_pid(&s, &id).expect("host process after wake");
    assert_ne!(new_pid, pid);

    // File calls wake it too; an explicit wake reports how long it took.
    s.act(&id, "hibernate").await;
    let r = s
        .http
        .get(format!(
            "{}/v1/sandboxes/{id}/files?path=/root/kept.txt",
            s.url
        ))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("read");
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.expect("text"), "kept across hibernation");
    s.act(&id, "hibernate").await;
    let v = s.act(&id, "wake").await;
    assert_eq!(v["state"], "running");
    assert!(v["woke_in_ms"].as_u64().is_some(), "{v}");
    if b.hibernation_keeps_memory {
        assert_eq!(s.sh(&id, "cat /dev/shm/x").await.0, "in-ram\n");
    }
    let (status, v) = s
        .post(&format!("/v1/sandboxes/{id}/wake"), Value::Null)
        .await;
    assert_eq!(status, 409, "wake of a running sandbox: {v}");

    // Killing a hibernated sandbox removes its kept files too.
    s.act(&id, "hibernate").await;
    assert_eq!(s.kill(&id).await, 204);
    assert!(!s.state_dir.join("sandboxes").join(&id).exists());
}
