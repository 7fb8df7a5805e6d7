//! `hutch shell` in a real terminal: tmux runs it, send-keys types, capture-pane reads the
//! screen, and resizing the tmux window must reach the program inside the sandbox.

use std::process::Command;
use std::time::Duration;

use hutch_testkit::{hutch_bin, wait_until, TestServer};
use serde_json::json;

/// A tmux server of its own (socket name unique to this test run), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run tmux (apt-get install tmux)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "t"])
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}

#[tokio::test]
async fn hutch_shell_is_an_interactive_terminal_that_follows_resizes() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let tmux = Tmux {
        socket: format!("hutch-test-{}", std::process::id()),
    };
    let cmd = format!(
        "HUTCH_URL={} HUTCH_STATE_DIR={} {} shell {id}",
        s.url,
        s.state_dir.display(),
        hutch_bin().display()
    );
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "t",
        "-x",
        "100",
        "-y",
        "30",
        &cmd,
    ]);

    tmux.run(&[
        "send-keys",
        "-t",
        "t",
        "echo hi-$((40+2)); stty size",
        "Enter",
    ]);
    let seen = wait_until(Duration::from_secs(10), async || {
        let screen = tmux.screen();
        (screen.contains("hi-42") && screen.contains("30 100")).then_some(screen)
    })
    .await;
    assert!(seen.is_some(), "no echo or wrong size:\n{}", tmux.screen());

    tmux.run(&["resize-window", "-t", "t", "-x", "120", "-y", "40"]);
    tmux.run(&["send-keys", "-t", "t", "clear; stty size", "Enter"]);
    let resized = wait_until(Duration::from_secs(10), async || {
        let screen = tmux.screen();
        screen.contains("40 120").then_some(())
    })
    .await;
    assert!(
        resized.is_some(),
        "resize not seen inside:\n{}",
        tmux.screen()
    );

    // `exit` ends the remote shell and `hutch shell` itself.
    tmux.run(&["send-keys", "-t", "t", "exit 0", "Enter"]);
    let ended = wait_until(Duration::from_secs(10), async || {
        let panes = tmux.run(&["list-panes", "-a"]);
        panes.trim().is_empty().then_some(())
    })
    .await;
    assert!(
        ended.is_some(),
        "hutch shell did not exit:\n{}",
        tmux.screen()
    );
}
