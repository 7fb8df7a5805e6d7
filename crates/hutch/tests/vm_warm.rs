//! The warm pool of `vm` guests (`--vm-warm N`): after a vm create, N guests of that shape are
//! restored, warmed up and paused in the background; the next create of the same shape
//! claims one. A warm guest is invisible to the API until claimed, takes the request's
//! identity (hostname, environment, clock, entropy) and CPU limit when claimed, is replaced
//! when its QEMU dies, and is destroyed when the server stops.

use std::collections::BTreeSet;
use std::time::Duration;

use hutch_testkit::{wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// Directories of guests (sandboxes and warm guests) under the server's state.
fn guest_dirs(s: &TestServer) -> BTreeSet<String> {
    std::fs::read_dir(s.state_dir.join("sandboxes"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

async fn listed(s: &TestServer) -> BTreeSet<String> {
    let (status, v) = s.request(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, 200, "{v}");
    let items = v.as_array().or_else(|| v["sandboxes"].as_array());
    items
        .expect("a list")
        .iter()
        .filter_map(|x| x["id"].as_str().map(String::from))
        .collect()
}

async fn warm_count(s: &TestServer) -> u64 {
    let text = s.metrics_text().await;
    text.lines()
        .find_map(|l| l.strip_prefix("hutch_vm_warm_guests "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no warm guest gauge in {text}"))
}

/// Wait until `n` warm guests are ready; returns their ids (guest directories the API does
/// not list).
async fn warm_guests(s: &TestServer, n: u64) -> BTreeSet<String> {
    wait_until(Duration::from_secs(60), async || {
        if warm_count(s).await != n {
            return None;
        }
        let listed = listed(s).await;
        let hidden: BTreeSet<String> = guest_dirs(s).difference(&listed).cloned().collect();
        (hidden.len() as u64 == n).then_some(hidden)
    })
    .await
    .unwrap_or_else(|| panic!("{n} warm guest(s) never became ready"))
}

/// Host pids of the QEMUs of this server (their command lines name its state directory).
fn qemu_pids(s: &TestServer) -> Vec<(i32, String)> {
    let needle = s.state_dir.join("sandboxes").to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let pid: i32 = e.file_name().to_str()?.parse().ok()?;
                    let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
                    let cmdline = String::from_utf8_lossy(&cmdline).into_owned();
                    let at = cmdline.find(&needle)?;
                    let id = cmdline[at + needle.len() + 1..]
                        .split('/')
                        .next()?
                        .to_string();
                    Some((pid, id))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The CFS quota of the cpu cgroup process `pid` is in (cgroup v1 or v2).
fn cpu_quota_us(pid: i32) -> Option<i64> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "cpu") {
            for mount in ["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"] {
                if let Ok(q) = std::fs::read_to_string(format!("{mount}{path}/cpu.cfs_quota_us")) {
                    return q.trim().parse().ok();
                }
            }
        }
        if controllers.is_empty() {
            if let Ok(max) = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/cpu.max")) {
                return max.split_whitespace().next()?.parse().ok();
            }
        }
    }
    None
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

#[tokio::test]
async fn creates_claim_warm_guests_that_take_the_requests_identity() {
    let mut s = TestServer::start_with(&["--vm-warm", "1"]).await;
    // The first create of a shape restores on demand; a warm guest follows in the background.
    let first = s.create_id(json!({"isolation": "vm"})).await;
    let warm = warm_guests(&s, 1).await;
    let warm_id = warm.iter().next().expect("one").clone();
    assert_ne!(warm_id, first);
    let (status, _) = s
        .request(Method::GET, &format!("/v1/sandboxes/{warm_id}"), None)
        .await;
    assert_eq!(status, 404, "a warm guest is not a sandbox until claimed");
    assert_eq!(listed(&s).await, BTreeSet::from([first.clone()]));

    // Paused long enough that a guest clock left alone would lag visibly.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let claimed = s
        .create(json!({
            "isolation": "vm",
            "cpus": 0.5,
            "env": {"GREETING": "hello"},
            "metadata": {"owner": "warm-test"}
        }))
        .await;
    let id = claimed["id"].as_str().expect("id").to_string();
    assert_eq!(id, warm_id, "the create claimed the warm guest");
    assert_eq!(claimed["state"], "running");
    assert_eq!(claimed["metadata"]["owner"], "warm-test");
    let (out, code) = s
        .sh(
            &id,
            "hostname; echo $GREETING; echo $HUTCH_SANDBOX_ID; date +%s; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    assert_eq!(lines[0], id.replace('_', "-"));
    assert_eq!(lines[1], "hello");
    assert_eq!(lines[2], id);
    let guest_now: i64 = lines[3].parse().expect("date");
    assert!(
        (guest_now - unix_now()).abs() <= 2,
        "the claim sets the guest's clock: guest {guest_now}, host {}",
        unix_now()
    );
    let (first_random, _) = s
        .sh(
            &first,
            "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'",
        )
        .await;
    assert_ne!(lines[4], first_random.trim());

    // The requested CPU limit replaced the warm guest's.
    let pids = qemu_pids(&s);
    let qemu = pids
        .iter()
        .find(|(_, g)| *g == id)
        .map(|(p, _)| *p)
        .expect("the claimed guest's QEMU");
    assert_eq!(cpu_quota_us(qemu), Some(50_000), "cpus 0.5");

    // The pool refills; a second claim gets a guest of its own with its own random state.
    let next = warm_guests(&s, 1).await;
    let next_id = next.iter().next().expect("one").clone();
    assert!(next_id != id && next_id != first);
    let second = s.create_id(json!({"isolation": "vm"})).await;
    assert_eq!(second, next_id);
    let (second_random, _) = s
        .sh(
            &second,
            "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'",
        )
        .await;
    assert_ne!(
        second_random.trim(),
        lines[4],
        "warm guests of one bake are reseeded when claimed"
    );

    // Another shape is not served by this pool: a different memory size restores on demand.
    let other = s
        .create_id(json!({"isolation": "vm", "memory_mib": 192}))
        .await;
    assert!(!next.contains(&other));

    // A warm guest whose QEMU dies is replaced by a new one.
    let before = warm_guests(&s, 2).await;
    let victim = before.iter().next().expect("a warm guest").clone();
    let (pid, _) = qemu_pids(&s)
        .into_iter()
        .find(|(_, g)| *g == victim)
        .expect("its QEMU");
    // SAFETY: killing a QEMU this test's server started, by its pid.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let after = wait_until(Duration::from_secs(60), async || {
        let now = warm_guests(&s, 2).await;
        (!now.contains(&victim)).then_some(now)
    })
    .await
    .expect("the dead warm guest was replaced");
    assert!(!guest_dirs(&s).contains(&victim), "its files are gone");
    assert_eq!(after.len(), 2);

    // Stopping the server destroys the warm guests; the sandboxes keep running.
    let sandboxes = listed(&s).await;
    s.stop_server();
    let left: BTreeSet<String> = qemu_pids(&s).into_iter().map(|(_, g)| g).collect();
    assert_eq!(
        left, sandboxes,
        "only the sandboxes' QEMUs outlive the server"
    );
    s.spawn_server().await;
    assert_eq!(listed(&s).await, sandboxes);
    let (status, v): (u16, Value) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!((status, v["state"].as_str()), (200, Some("running")));
}
