//! File operations through the real agent: streaming 100 MiB both ways, modes, listing,
//! stat, mkdir, move, remove, and the error codes a caller relies on.

mod common;

use std::os::unix::fs::PermissionsExt;

use bytes::Bytes;
use common::TestAgent;
use futures_util::StreamExt;
use hutch_proto::client::ClientError;
use hutch_proto::{AgentErrorCode, FileType};

const MIB: usize = 1 << 20;

/// Deterministic pseudo-random chunk `i` (1 MiB) of the test file.
fn chunk(i: u64) -> Bytes {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (i + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let mut out = Vec::with_capacity(MIB);
    while out.len() < MIB {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    Bytes::from(out)
}

/// FNV-1a over a byte stream, fed piecewise.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn agent_code(result: Result<impl std::fmt::Debug, ClientError>) -> AgentErrorCode {
    match result {
        Err(ClientError::Agent(e)) => e.code,
        other => panic!("expected an agent error, got {other:?}"),
    }
}

#[tokio::test]
async fn hundred_mebibytes_round_trip_intact() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let path = agent.path("big/nested/blob.bin");
    const CHUNKS: u64 = 100;

    let mut sent = Fnv::new();
    for i in 0..CHUNKS {
        sent.update(&chunk(i));
    }
    let upload = futures_util::stream::iter(0..CHUNKS).map(|i| Ok::<_, std::io::Error>(chunk(i)));
    client
        .write_file(&path, None, upload)
        .await
        .expect("upload");

    let stat = client.stat(&path).await.expect("stat");
    assert_eq!(stat.size, CHUNKS * MIB as u64);
    assert_eq!(stat.mode, 0o644);

    let mut download = client.read_file(&path).await.expect("download");
    let mut received = Fnv::new();
    let mut total = 0usize;
    let mut largest_chunk = 0usize;
    while let Some(piece) = download.next_chunk().await {
        let piece = piece.expect("chunk");
        largest_chunk = largest_chunk.max(piece.len());
        total += piece.len();
        received.update(&piece);
    }
    assert_eq!(total, CHUNKS as usize * MIB);
    assert_eq!(received, sent);
    // Streamed, not delivered as one buffer, and never held whole by the agent.
    assert!(largest_chunk <= 4 * MIB, "largest chunk {largest_chunk}");
    let peak = common::status_kib(agent.pid(), "VmHWM").expect("agent peak RSS");
    assert!(peak < 64 * 1024, "agent peak RSS {peak} KiB");
}

#[tokio::test]
async fn a_full_disk_is_no_space() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    // /dev/full fails every write with ENOSPC. No mode is sent, so nothing is chmod'ed.
    let err = client
        .write_file_bytes("/dev/full", None, Bytes::from(vec![1u8; 100_000]))
        .await
        .expect_err("the disk is full");
    match err {
        ClientError::Agent(e) => {
            assert_eq!(e.code, AgentErrorCode::NoSpace, "{e}");
            assert_eq!(e.message, "write /dev/full: No space left on device");
        }
        other => panic!("expected no_space, got {other:?}"),
    }
}

#[tokio::test]
async fn modes_are_honoured() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let secret = agent.path("secret");
    client
        .write_file_bytes(&secret, Some(0o600), Bytes::from_static(b"s3cret"))
        .await
        .expect("write");
    let on_disk = std::fs::metadata(&secret).expect("exists");
    assert_eq!(on_disk.permissions().mode() & 0o7777, 0o600);
    assert_eq!(client.stat(&secret).await.expect("stat").mode, 0o600);
    let script = agent.path("run.sh");
    client
        .write_file_bytes(
            &script,
            Some(0o755),
            Bytes::from_static(b"#!/bin/sh\necho ran\n"),
        )
        .await
        .expect("write");
    let out = client
        .exec_collect(common::request(common::argv(&[&script])), None, 1024)
        .await
        .expect("exec");
    assert_eq!(&out.stdout[..], b"ran\n");
    // Overwriting truncates.
    client
        .write_file_bytes(&secret, Some(0o600), Bytes::from_static(b"x"))
        .await
        .expect("overwrite");
    let back = client
        .read_file(&secret)
        .await
        .expect("read")
        .collect_bytes(1024)
        .await
        .expect("bytes");
    assert_eq!(&back[..], b"x");
    // Without a mode an existing file keeps its own; a new one gets 0644.
    client
        .write_file_bytes(&secret, None, Bytes::from_static(b"y"))
        .await
        .expect("overwrite without a mode");
    assert_eq!(client.stat(&secret).await.expect("stat").mode, 0o600);
    let fresh = agent.path("fresh");
    client
        .write_file_bytes(&fresh, None, Bytes::from_static(b"z"))
        .await
        .expect("write");
    assert_eq!(client.stat(&fresh).await.expect("stat").mode, 0o644);
}

#[tokio::test]
async fn list_respects_depth_and_sorts_by_path() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let root = agent.path("tree");
    std::fs::create_dir_all(format!("{root}/a/b/c")).expect("mkdir");
    std::fs::write(format!("{root}/a/b/c/deep.txt"), "deep").expect("write");
    std::fs::write(format!("{root}/z.txt"), "zz").expect("write");
    std::os::unix::fs::symlink(format!("{root}/a"), format!("{root}/link")).expect("symlink");

    let paths = |depth| {
        let client = client.clone();
        let root = root.clone();
        async move {
            let list = client.list(&root, Some(depth)).await.expect("list");
            list.entries
                .into_iter()
                .map(|e| e.path.strip_prefix(&root).expect("under root").to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(paths(1).await, vec!["/a", "/link", "/z.txt"]);
    assert_eq!(paths(2).await, vec!["/a", "/a/b", "/link", "/z.txt"]);
    assert_eq!(
        paths(4).await,
        vec!["/a", "/a/b", "/a/b/c", "/a/b/c/deep.txt", "/link", "/z.txt"]
    );

    let list = client.list(&root, None).await.expect("list");
    let link = list
        .entries
        .iter()
        .find(|e| e.name == "link")
        .expect("link listed");
    assert_eq!(link.file_type, FileType::Symlink);
    assert_eq!(
        link.symlink_target.as_deref(),
        Some(format!("{root}/a").as_str())
    );
    let z = list
        .entries
        .iter()
        .find(|e| e.name == "z.txt")
        .expect("file listed");
    assert_eq!((z.file_type, z.size), (FileType::File, 2));
    assert!(
        z.modified_at.ends_with('Z') && z.modified_at.len() == 20,
        "{}",
        z.modified_at
    );

    assert_eq!(
        agent_code(client.list(&format!("{root}/z.txt"), None).await),
        AgentErrorCode::NotADirectory
    );
    assert_eq!(
        agent_code(client.list(&format!("{root}/missing"), None).await),
        AgentErrorCode::NotFound
    );
}

#[tokio::test]
async fn stat_mkdir_and_move() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let dir = agent.path("made/with/parents");
    client.mkdir(&dir).await.expect("mkdir");
    client.mkdir(&dir).await.expect("mkdir again is fine");
    let stat = client.stat(&dir).await.expect("stat");
    assert_eq!(
        (stat.file_type, stat.name.as_str()),
        (FileType::Dir, "parents")
    );

    let file = agent.path("made/file.txt");
    client
        .write_file_bytes(&file, None, Bytes::from_static(b"content"))
        .await
        .expect("write");
    assert_eq!(
        agent_code(client.mkdir(&file).await),
        AgentErrorCode::AlreadyExists
    );

    let moved = agent.path("elsewhere/deeper/renamed.txt");
    client.rename(&file, &moved).await.expect("move");
    assert!(!std::path::Path::new(&file).exists());
    assert_eq!(std::fs::read(&moved).expect("moved"), b"content");
    assert_eq!(
        agent_code(client.rename(&file, &moved).await),
        AgentErrorCode::NotFound
    );
}

#[tokio::test]
async fn remove_needs_recursive_for_non_empty_dirs_and_never_follows_links() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let dir = agent.path("full");
    std::fs::create_dir_all(format!("{dir}/sub")).expect("mkdir");
    std::fs::write(format!("{dir}/sub/f"), "x").expect("write");
    assert_eq!(
        agent_code(client.remove(&dir, false).await),
        AgentErrorCode::NotEmpty
    );
    assert!(std::path::Path::new(&dir).exists());

    // A link to the directory: removing it removes the link only, even "recursively".
    let link = agent.path("link-to-full");
    std::os::unix::fs::symlink(&dir, &link).expect("symlink");
    client.remove(&link, true).await.expect("remove link");
    assert!(std::fs::symlink_metadata(&link).is_err());
    assert!(std::path::Path::new(&format!("{dir}/sub/f")).exists());

    client.remove(&dir, true).await.expect("remove tree");
    assert!(!std::path::Path::new(&dir).exists());
    assert_eq!(
        agent_code(client.remove(&dir, true).await),
        AgentErrorCode::NotFound
    );

    let empty = agent.path("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    client
        .remove(&empty, false)
        .await
        .expect("remove empty dir");
}

#[tokio::test]
async fn bad_paths_get_precise_errors() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    assert_eq!(
        agent_code(client.stat("relative/path").await),
        AgentErrorCode::BadRequest
    );
    assert_eq!(
        agent_code(client.read_file("relative").await.map(drop)),
        AgentErrorCode::BadRequest
    );
    assert_eq!(
        agent_code(client.write_file_bytes("x", None, Bytes::new()).await),
        AgentErrorCode::BadRequest
    );
    assert_eq!(
        agent_code(client.mkdir("rel").await),
        AgentErrorCode::BadRequest
    );
    assert_eq!(
        agent_code(client.rename("/tmp", "rel").await),
        AgentErrorCode::BadRequest
    );

    let missing = agent.path("missing.txt");
    assert_eq!(
        agent_code(client.read_file(&missing).await.map(drop)),
        AgentErrorCode::NotFound
    );
    assert_eq!(
        agent_code(client.stat(&missing).await),
        AgentErrorCode::NotFound
    );
    let dir = agent.path("");
    assert_eq!(
        agent_code(client.read_file(&dir).await.map(drop)),
        AgentErrorCode::IsADirectory
    );
    assert_eq!(
        agent_code(
            client
                .write_file_bytes(&dir, None, Bytes::from_static(b"x"))
                .await
        ),
        AgentErrorCode::IsADirectory
    );
    let file = agent.path("plain");
    std::fs::write(&file, "x").expect("write");
    assert_eq!(
        agent_code(
            client
                .write_file_bytes(&format!("{file}/child"), None, Bytes::new())
                .await
        ),
        AgentErrorCode::NotADirectory
    );
    assert_eq!(
        agent_code(client.remove("/", true).await),
        AgentErrorCode::BadRequest
    );

    // A FIFO is neither read nor written (either could block forever).
    let fifo = agent.path("fifo");
    let c_fifo = std::ffi::CString::new(fifo.clone()).expect("no NUL");
    // SAFETY: mkfifo reads the NUL-terminated path we pass.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
    assert_eq!(
        agent_code(client.read_file(&fifo).await.map(drop)),
        AgentErrorCode::BadRequest
    );
    assert_eq!(
        agent_code(
            client
                .write_file_bytes(&fifo, None, Bytes::from_static(b"x"))
                .await
        ),
        AgentErrorCode::BadRequest
    );

    // Awkward characters survive the query string.
    let odd = agent.path("a b&c=d%e#f?.txt");
    client
        .write_file_bytes(&odd, None, Bytes::from_static(b"odd"))
        .await
        .expect("write odd name");
    assert_eq!(std::fs::read(&odd).expect("on disk"), b"odd");
}
