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
