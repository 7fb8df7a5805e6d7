//! The test harness itself: a server a test killed and never started again does not leave
//! its sandboxes behind (their processes and mounts outlived it in earlier sessions, when a
//! test failed between the kill and the restart).

use hutch_testkit::TestServer;
use serde_json::json;

#[tokio::test]
async fn a_killed_servers_sandboxes_go_with_its_test() {
    let mut s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let init = s.init_pid(&id).expect("its init runs");
    let state_dir = s.state_dir.clone();
    s.kill_server();
    assert!(
        std::path::Path::new(&format!("/proc/{init}")).exists(),
        "a killed server's sandbox keeps running"
    );
    drop(s);
    let gone = hutch_testkit::wait_until(std::time::Duration::from_secs(10), async || {
        (!std::path::Path::new(&format!("/proc/{init}")).exists()).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the sandbox's init {init} still runs");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(state_dir.to_str().expect("utf-8")),
        "mounts left under {}",
        state_dir.display()
    );
    assert!(!state_dir.exists(), "the state directory is removed");
}

#[test]
fn a_failed_tests_sandboxes_end_even_when_its_server_cannot_delete_them() {
    let seen = std::sync::Mutex::new(None);
    let seen_id = std::sync::Mutex::new(None::<String>);
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let mut s = TestServer::start().await;
            let id = s.create_id(json!({})).await;
            let init = s.init_pid(&id).expect("its init runs");
            *seen.lock().expect("seen") = Some((init, s.state_dir.clone()));
            *seen_id.lock().expect("id") = Some(id.clone());
            // The server now refuses the harness's cleanup (as one whose database is down
            // would), and the test fails.
            s.key = "hk_not-a-key".into();
            panic!("the test fails with its sandbox running");
        })
    }));
    assert!(failed.is_err());
    let (init, state_dir) = seen.lock().expect("seen").clone().expect("the test ran");
    // Killed; gone once its parent has reaped it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{init}")).exists()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        !std::path::Path::new(&format!("/proc/{init}")).exists(),
        "the sandbox's init {init} still runs"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(state_dir.to_str().expect("utf-8")),
        "mounts left under {}",
        state_dir.display()
    );
    assert!(!state_dir.exists(), "the state directory is removed");
    let id = seen_id.lock().expect("id").clone().expect("the test ran");
    assert!(
        !std::path::Path::new(&format!("/sys/fs/cgroup/pids/hutch/{id}")).exists(),
        "its cgroup is removed"
    );
}
