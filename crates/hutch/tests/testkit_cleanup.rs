//! The test harness itself: a server a test killed and never started again does not leave
//! its sandboxes behind (their processes and mounts outlived it in earlier sessions, when a
//! test failed between the kill and the restart).

use std::path::Path;
use std::time::{Duration, Instant};

use hutch_testkit::TestServer;
use serde_json::json;

/// Nothing of sandbox `id` (init `init`) of the server of `state_dir` is left: its init
/// (once its parent reaped it), its mounts, the state directory, its cgroup.
fn assert_nothing_left(id: &str, init: i32, state_dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{init}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !Path::new(&format!("/proc/{init}")).exists(),
        "the sandbox's init {init} still runs"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(state_dir.to_str().expect("utf-8")),
        "mounts left under {}",
        state_dir.display()
    );
    assert!(!state_dir.exists(), "the state directory is removed");
    assert!(
        !Path::new(&format!("/sys/fs/cgroup/pids/hutch/{id}")).exists(),
        "its cgroup is removed"
    );
}

#[tokio::test]
async fn a_killed_servers_sandboxes_go_with_its_test() {
    let mut s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let init = s.init_pid(&id).expect("its init runs");
    let state_dir = s.state_dir.clone();
    s.kill_server();
    assert!(
        Path::new(&format!("/proc/{init}")).exists(),
        "a killed server's sandbox keeps running"
    );
    drop(s);
    assert_nothing_left(&id, init, &state_dir);
}

#[test]
fn a_failed_tests_sandboxes_end_even_when_its_server_cannot_delete_them() {
    let seen = std::sync::Mutex::new(None);
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let mut s = TestServer::start().await;
            let id = s.create_id(json!({})).await;
            let init = s.init_pid(&id).expect("its init runs");
            *seen.lock().expect("seen") = Some((id, init, s.state_dir.clone()));
            // The server now refuses the harness's cleanup (as one whose database is down
            // would), and the test fails.
            s.key = "hk_not-a-key".into();
            panic!("the test fails with its sandbox running");
        })
    }));
    assert!(failed.is_err());
    let (id, init, state_dir) = seen.lock().expect("seen").clone().expect("the test ran");
    assert_nothing_left(&id, init, &state_dir);
}
