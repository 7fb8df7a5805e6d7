//! A vm guest's serial console cannot fill the host's disk: whatever the guest writes to
//! `/dev/ttyS0`, the host keeps at most `--vm-console-bytes` of it (the newest), also after
//! a server restart re-adopted the guest, and the guest is never held up by a host that is
//! not reading (`docs/vm.md`, "Console").
//!
//! Needs QEMU, qemu-img and mkfs.ext4 (`scripts/deps.sh`).

use std::path::PathBuf;
use std::time::Duration;

use hutch_testkit::{wait_until, TestServer};
use serde_json::json;

/// The cap the test's server runs with: small, so a guest under TCG exceeds it many times
/// over in seconds.
const CAP: u64 = 64 << 10;

/// Every file of the host that holds sandbox `id`'s console: its records and QEMU's
/// directory, whatever their names.
fn console_files(s: &TestServer, id: &str) -> Vec<PathBuf> {
    let dirs = [
        s.state_dir.join("vm-records").join(id),
        s.state_dir.join("sandboxes").join(id),
    ];
    let mut files = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("console") && e.file_type().is_ok_and(|t| t.is_file()) {
                files.push(e.path());
            }
        }
    }
    files
}

fn console_bytes(s: &TestServer, id: &str) -> u64 {
    console_files(s, id)
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

/// What the host kept of the console, oldest first (older halves, `*.old`, first).
fn kept(s: &TestServer, id: &str) -> String {
    let mut files = console_files(s, id);
    files.sort_by_key(|p| !p.to_string_lossy().ends_with(".old"));
    let mut bytes = Vec::new();
    for file in files {
        bytes.extend(std::fs::read(file).unwrap_or_default());
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A guest shell loop writing `count` numbered lines of ~70 bytes to its serial port.
fn writer(tag: &str, count: u32) -> String {
    format!(
        "i=0; while [ $i -lt {count} ]; do echo \"{tag} $i ................................................\"; i=$((i+1)); done > /dev/ttyS0"
    )
}

/// The numbers of the complete `tag` lines kept, in order; checks that they are
/// consecutive and end at `last`.
fn check_newest(text: &str, tag: &str, last: u32) -> Vec<u32> {
    let numbers: Vec<u32> = text
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{tag} ")))
        .filter(|l| l.ends_with("................................................"))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(numbers.last(), Some(&last), "the newest line is kept");
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "the kept lines are the newest, in order"
    );
    numbers
}

#[tokio::test]
async fn a_guest_writing_its_console_flat_out_leaves_a_capped_log() {
    // Through the environment (`--vm-console-bytes` is the same setting).
    let cap = CAP.to_string();
    let mut s = TestServer::start_with_env(&[], &[("HUTCH_VM_CONSOLE_BYTES", &cap)]).await;
    let id = s.create_id(json!({"isolation": "vm"})).await;
    let (out, code) = s.sh(&id, "test -c /dev/ttyS0 && echo serial").await;
    assert_eq!(
        (out.as_str(), code),
        ("serial\n", 0),
        "the guest's console device"
    );

    // ~420 KB: more than six times the cap.
    let t0 = std::time::Instant::now();
    let (out, code) = s.sh(&id, &writer("console line", 6000)).await;
    assert_eq!(code, 0, "{out}");
    eprintln!("the guest wrote 6000 console lines in {:?}", t0.elapsed());
    let drained = wait_until(Duration::from_secs(60), async || {
        kept(&s, &id).contains("console line 5999 ").then_some(())
    })
    .await;
    assert!(drained.is_some(), "the newest output reached the host");
    assert!(
        console_bytes(&s, &id) <= CAP,
        "{:?}",
        console_files(&s, &id)
    );
    let numbers = check_newest(&kept(&s, &id), "console line", 5999);
    assert!(
        numbers[0] > 4000,
        "old output was dropped: first kept {}",
        numbers[0]
    );
    assert!(
        numbers.len() > 400,
        "about the cap is kept: {} lines",
        numbers.len()
    );

    // With no server at all the guest still writes on (QEMU drops the output, it never
    // waits): a writer started just before the server stops finishes its console output
    // and then writes its disk, which the host sees grow while no server runs.
    let overlay = s.state_dir.join("sandboxes").join(&id).join("disk.qcow2");
    let before = std::fs::metadata(&overlay).expect("overlay").len();
    let away = format!(
        "setsid sh -c 'sleep 5; {}; head -c 4194304 /dev/urandom > /root/away; sync' > /dev/null 2>&1 < /dev/null &",
        writer("while away", 20000)
    );
    let (out, code) = s.sh(&id, &away).await;
    assert_eq!(code, 0, "{out}");
    let stopping = std::time::Instant::now();
    s.stop_server();
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "the server was down before the guest began writing"
    );
    let grew = wait_until(Duration::from_secs(180), async || {
        let now = std::fs::metadata(&overlay).ok()?.len();
        (now >= before + (4 << 20)).then_some(())
    })
    .await;
    assert!(
        grew.is_some(),
        "the guest got past its console output with nobody reading it"
    );
    assert!(console_bytes(&s, &id) <= CAP);

    // The restarted server drains the re-adopted guest's console again, into the same ring.
    s.spawn_server().await;
    let (out, code) = s.sh(&id, &writer("after restart", 3000)).await;
    assert_eq!(code, 0, "{out}");
    let drained = wait_until(Duration::from_secs(60), async || {
        kept(&s, &id).contains("after restart 2999 ").then_some(())
    })
    .await;
    assert!(
        drained.is_some(),
        "the re-adopted guest's console is drained"
    );
    assert!(
        console_bytes(&s, &id) <= CAP,
        "{:?}",
        console_files(&s, &id)
    );
    check_newest(&kept(&s, &id), "after restart", 2999);
}
