//! Reads and writes as a user (`?user=`): the user's permissions apply, and what a write
//! creates is the user's; the agent's own calls stay root's afterwards.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use bytes::Bytes;
use common::TestAgent;
use hutch_proto::client::ClientError;
use hutch_proto::AgentErrorCode;

/// `nobody` from the host's `/etc/passwd` (the test agent runs on the host's root).
const USER: &str = "nobody";
const NOBODY_UID: u32 = 65534;

fn code(result: Result<impl std::fmt::Debug, ClientError>) -> AgentErrorCode {
    match result {
        Err(ClientError::Agent(e)) => e.code,
        other => panic!("expected an agent error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_user_reads_and_writes_with_its_own_permissions() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let open_dir = agent.path("open");
    std::fs::create_dir(&open_dir).expect("mkdir");
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    std::fs::set_permissions(agent.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod scratch dir");

    // What the user creates, parents included, is the user's.
    let made = format!("{open_dir}/sub/made.txt");
    let data = Bytes::from_static(b"as nobody");
    let body = futures_util::stream::iter([Ok::<_, std::io::Error>(data.clone())]);
    client
        .write_file_as(&made, None, Some(USER), &Default::default(), body)
        .await
        .expect("write as nobody");
    assert_eq!(std::fs::metadata(&made).expect("stat").uid(), NOBODY_UID);
    let entry = client.stat(&made).await.expect("stat");
    assert_eq!((entry.uid, entry.gid), (NOBODY_UID, NOBODY_UID));
    assert_eq!(
        entry.owner.as_deref(),
        Some(USER),
        "the owner's name from /etc/passwd"
    );
    let listed = client
        .list(&format!("{open_dir}/sub"), None)
        .await
        .expect("list");
    assert_eq!(listed.entries[0].owner.as_deref(), Some(USER));
    assert_eq!(
        std::fs::metadata(format!("{open_dir}/sub"))
            .expect("stat")
            .uid(),
        NOBODY_UID,
        "the parent made for the write is the user's too"
    );
    let read = client
        .read_file_as(&made, Some(USER))
        .await
        .expect("read as nobody")
        .collect_bytes(1 << 20)
        .await
        .expect("bytes");
    assert_eq!(read, data);

    // Root's private file: refused to the user, readable by the agent itself.
    let secret = agent.path("secret");
    std::fs::write(&secret, b"root only").expect("write");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    assert_eq!(
        code(client.read_file_as(&secret, Some(USER)).await),
        AgentErrorCode::PermissionDenied
    );
    let body = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"x"))]);
    assert_eq!(
        code(
            client
                .write_file_as(&secret, None, Some(USER), &Default::default(), body)
                .await
        ),
        AgentErrorCode::PermissionDenied
    );
    // Many root calls after the user's: none of the pool's threads kept the user's ids.
    for i in 0..20 {
        let bytes = client
            .read_file(&secret)
            .await
            .expect("root reads")
            .collect_bytes(1 << 20)
            .await
            .expect("bytes");
        assert_eq!(&bytes[..], b"root only", "call {i}");
        let own = agent.path(&format!("root-{i}"));
        client
            .write_file_bytes(&own, None, Bytes::from_static(b"r"))
            .await
            .expect("root writes");
        assert_eq!(std::fs::metadata(&own).expect("stat").uid(), 0, "call {i}");
    }
    assert_eq!(
        code(client.read_file_as(&made, Some("no-such-user-here")).await),
        AgentErrorCode::BadRequest
    );
}
