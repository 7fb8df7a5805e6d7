//! File watches through the real agent (`GET /v1/files/watch`): the events of each kind in
//! order, renames paired, recursive and not, entries, the end of a watch, and no inotify
//! instance left once the caller goes away.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::TestAgent;
use hutch_proto::client::{ClientError, FileWatchStream, WatchOptions};
use hutch_proto::{AgentErrorCode, FileEvent, FileEventKind, FileType, WatchMessage};
use hutch_testkit::wait_until;

/// Wait for the next event (skipping nothing: a warning or an end fails the test).
async fn next_event(watch: &mut FileWatchStream) -> FileEvent {
    let next = tokio::time::timeout(Duration::from_secs(10), watch.next_message())
        .await
        .expect("an event within 10 s");
    match next {
        Some(Ok(WatchMessage::Event(event))) => event,
        other => panic!("expected an event, got {other:?}"),
    }
}

/// The events until none arrives for `quiet`.
async fn events_until_quiet(watch: &mut FileWatchStream, quiet: Duration) -> Vec<FileEvent> {
    let mut out = Vec::new();
    while let Ok(next) = tokio::time::timeout(quiet, watch.next_message()).await {
        match next {
            Some(Ok(WatchMessage::Event(event))) => out.push(event),
            other => panic!("expected an event, got {other:?}"),
        }
    }
    out
}

fn kinds(events: &[FileEvent]) -> Vec<(FileEventKind, String)> {
    events.iter().map(|e| (e.event, e.name.clone())).collect()
}

/// inotify instances the process `pid` has open.
fn inotify_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .map(|target| target.to_string_lossy().contains("inotify"))
                .unwrap_or(false)
        })
        .count()
}

#[tokio::test]
async fn each_kind_of_change_is_reported_in_order() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let dir = agent.path("w");
    std::fs::create_dir(&dir).expect("mkdir");
    let mut watch = client
        .watch(&dir, WatchOptions::default())
        .await
        .expect("watch");
    assert_eq!(watch.ready().path, dir);
    assert_eq!(watch.ready().watched_dirs, 1);

    let a = format!("{dir}/a.txt");
    std::fs::write(&a, b"hello").expect("write");
    let create = next_event(&mut watch).await;
    assert_eq!(
        (create.event, create.name.as_str()),
        (FileEventKind::Create, "a.txt")
    );
    assert_eq!(create.path, a);
    assert_eq!(create.file_type, FileType::File);
    assert_eq!(create.entry, None, "entries only when asked for");
    let write = next_event(&mut watch).await;
    assert_eq!(
        (write.event, write.name.as_str()),
        (FileEventKind::Write, "a.txt")
    );

    std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let chmod = next_event(&mut watch).await;
    assert_eq!(
        (chmod.event, chmod.name.as_str()),
        (FileEventKind::Chmod, "a.txt")
    );

    let b = format!("{dir}/b.txt");
    std::fs::rename(&a, &b).expect("rename");
    let rename = next_event(&mut watch).await;
    assert_eq!(rename.event, FileEventKind::Rename);
    assert_eq!(rename.name, "b.txt");
    assert_eq!(rename.old_name.as_deref(), Some("a.txt"));
    assert_eq!(rename.old_path.as_deref(), Some(a.as_str()));

    std::fs::remove_file(&b).expect("rm");
    let remove = next_event(&mut watch).await;
    assert_eq!(
        (remove.event, remove.name.as_str()),
        (FileEventKind::Remove, "b.txt")
    );

    std::fs::create_dir(format!("{dir}/sub")).expect("mkdir sub");
    let mkdir = next_event(&mut watch).await;
    assert_eq!(
        (mkdir.event, mkdir.file_type),
        (FileEventKind::Create, FileType::Dir)
    );
    std::os::unix::fs::symlink("/nowhere", format!("{dir}/link")).expect("symlink");
    let link = next_event(&mut watch).await;
    assert_eq!(
        (link.event, link.file_type),
        (FileEventKind::Create, FileType::Symlink)
    );
}

#[tokio::test]
async fn many_writes_to_one_file_are_one_event() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let dir = agent.path("w");
    std::fs::create_dir(&dir).expect("mkdir");
    let path = format!("{dir}/log");
    std::fs::write(&path, b"").expect("create");
    let mut watch = client
        .watch(&dir, WatchOptions::default())
        .await
        .expect("watch");
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        for i in 0..1000 {
            writeln!(f, "line {i}").expect("append");
        }
    }
    let events = events_until_quiet(&mut watch, Duration::from_millis(600)).await;
    assert_eq!(
        kinds(&events),
        vec![(FileEventKind::Write, "log".to_string())],
        "1000 writes and a close are one write event"
    );
}

#[tokio::test]
async fn recursive_watches_see_new_subdirectories_and_plain_ones_do_not() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let dir = agent.path("w");
    std::fs::create_dir_all(format!("{dir}/old/deep")).expect("mkdir");
    let mut plain = client
        .watch(&dir, WatchOptions::default())
        .await
        .expect("watch");
    let mut deep = client
        .watch(
            &dir,
            WatchOptions {
                recursive: true,
                include_entry: true,
            },
        )
        .await
        .expect("recursive watch");
    assert_eq!(deep.ready().watched_dirs, 3, "w, w/old and w/old/deep");

    // A directory and a file in it made at once: the file may come before the new
    // directory's watch; it is reported either way.
    std::fs::create_dir_all(format!("{dir}/new/inner")).expect("mkdir -p");
    std::fs::write(format!("{dir}/new/inner/f.txt"), b"12345").expect("write");
    std::fs::write(format!("{dir}/old/deep/g.txt"), b"1").expect("write");
    let events = events_until_quiet(&mut deep, Duration::from_millis(600)).await;
    let names = kinds(&events);
    for wanted in [
        (FileEventKind::Create, "new"),
        (FileEventKind::Create, "new/inner"),
        (FileEventKind::Create, "new/inner/f.txt"),
        (FileEventKind::Create, "old/deep/g.txt"),
    ] {
        let count = names
            .iter()
            .filter(|(k, n)| *k == wanted.0 && n == wanted.1)
            .count();
        assert_eq!(count, 1, "{wanted:?} once in {names:?}");
    }
    let f_events: Vec<_> = events
        .iter()
        .filter(|e| e.name == "new/inner/f.txt" && e.entry.is_some())
        .collect();
    assert!(!f_events.is_empty(), "{events:?}");
    let sized = events
        .iter()
        .filter(|e| e.name == "new/inner/f.txt")
        .filter_map(|e| e.entry.as_ref())
        .any(|entry| entry.size == 5);
    assert!(sized, "an entry of f.txt carries its size: {events:?}");

    let shallow = events_until_quiet(&mut plain, Duration::from_millis(300)).await;
    assert_eq!(
        kinds(&shallow),
        vec![(FileEventKind::Create, "new".to_string())],
        "a plain watch sees its own directory only"
    );
}

#[tokio::test]
async fn moves_across_the_tree_edge_are_creates_and_removes() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let dir = agent.path("w");
    let outside = agent.path("outside");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::write(format!("{outside}/in.txt"), b"x").expect("write");
    std::fs::write(format!("{dir}/out.txt"), b"x").expect("write");
    let mut watch = client
        .watch(
            &dir,
            WatchOptions {
                recursive: true,
                include_entry: false,
            },
        )
        .await
        .expect("watch");
    std::fs::rename(format!("{outside}/in.txt"), format!("{dir}/in.txt")).expect("move in");
    let moved_in = next_event(&mut watch).await;
    assert_eq!(
        (moved_in.event, moved_in.name.as_str()),
        (FileEventKind::Create, "in.txt")
    );
    std::fs::rename(format!("{dir}/out.txt"), format!("{outside}/out.txt")).expect("move out");
    let moved_out = next_event(&mut watch).await;
    assert_eq!(
        (moved_out.event, moved_out.name.as_str()),
        (FileEventKind::Remove, "out.txt")
    );

    // A renamed directory keeps being watched under its new name.
    std::fs::create_dir(format!("{dir}/d1")).expect("mkdir");
    assert_eq!(next_event(&mut watch).await.name, "d1");
    std::fs::rename(format!("{dir}/d1"), format!("{dir}/d2")).expect("rename dir");
    let renamed = next_event(&mut watch).await;
    assert_eq!(
        (renamed.event, renamed.name.as_str()),
        (FileEventKind::Rename, "d2")
    );
    std::fs::write(format!("{dir}/d2/f"), b"").expect("write");
    let inside = next_event(&mut watch).await;
    assert_eq!(
        (inside.event, inside.name.as_str()),
        (FileEventKind::Create, "d2/f")
    );
}

#[tokio::test]
async fn a_removed_directory_ends_its_watch() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let dir = agent.path("w");
    std::fs::create_dir(&dir).expect("mkdir");
    let mut watch = client
        .watch(&dir, WatchOptions::default())
        .await
        .expect("watch");
    std::fs::remove_dir(&dir).expect("rmdir");
    let last = tokio::time::timeout(Duration::from_secs(10), watch.next_message())
        .await
        .expect("an answer");
    match last {
        Some(Ok(WatchMessage::End(end))) => assert!(end.reason.contains("removed"), "{end:?}"),
        other => panic!("expected the end, got {other:?}"),
    }
    assert!(
        watch.next_message().await.is_none(),
        "nothing after the end"
    );
}

#[tokio::test]
async fn missing_paths_and_files_are_refused() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let missing = client
        .watch(&agent.path("nope"), WatchOptions::default())
        .await;
    assert!(
        matches!(&missing, Err(ClientError::Agent(e)) if e.code == AgentErrorCode::NotFound),
        "{missing:?}"
    );
    let file = agent.path("f");
    std::fs::write(&file, b"").expect("write");
    let not_dir = client.watch(&file, WatchOptions::default()).await;
    assert!(
        matches!(&not_dir, Err(ClientError::Agent(e)) if e.code == AgentErrorCode::NotADirectory),
        "{not_dir:?}"
    );
    assert_eq!(
        inotify_fds(agent.pid()),
        0,
        "a refused watch keeps no instance"
    );
}

#[tokio::test]
async fn dropping_a_watch_closes_its_inotify_instance() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let dir = agent.path("w");
    std::fs::create_dir_all(format!("{dir}/a/b")).expect("mkdir");
    let mut watches = Vec::new();
    for _ in 0..3 {
        let options = WatchOptions {
            recursive: true,
            include_entry: false,
        };
        watches.push(client.watch(&dir, options).await.expect("watch"));
    }
    assert_eq!(inotify_fds(agent.pid()), 3);
    drop(watches);
    let closed = wait_until(Duration::from_secs(10), async || {
        (inotify_fds(agent.pid()) == 0).then_some(())
    })
    .await;
    assert!(
        closed.is_some(),
        "the agent still holds {} inotify fds",
        inotify_fds(agent.pid())
    );
    // The connection still serves calls.
    client.stat(&dir).await.expect("stat after the watches");
}
