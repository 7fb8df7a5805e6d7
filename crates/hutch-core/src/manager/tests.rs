//! The manager's state machine over the fake backend (no root): every `SandboxState::can_*`
//! check, allowed and refused, with the 409 messages a client reads; failures the backend
//! reports; and the isolation seam (a backend this server lacks, capabilities).

use std::sync::Arc;

use super::Manager;
use crate::backend::fake::{start_manager, start_manager_with, Operation};
use crate::error::CoreError;
use crate::fork::{ForkCommand, ForkMode};
use crate::ids::SandboxId;
use crate::model::{CreateSandbox, IsolationRequest, SandboxState};

/// The operations whose state check is under test.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Use,
    Pause,
    Resume,
    Hibernate,
    Wake,
    Snapshot,
    Fork,
    Kill,
}

const OPS: [Op; 8] = [
    Op::Use,
    Op::Pause,
    Op::Resume,
    Op::Hibernate,
    Op::Wake,
    Op::Snapshot,
    Op::Fork,
    Op::Kill,
];

/// The states a sandbox can be found in by a request.
const STATES: [SandboxState; 6] = [
    SandboxState::Starting,
    SandboxState::Running,
    SandboxState::Paused,
    SandboxState::Hibernated,
    SandboxState::Stopped,
    SandboxState::Failed,
];

fn allowed(op: Op, s: SandboxState) -> bool {
    match op {
        Op::Use => s.can_use() || s.can_wake(),
        Op::Pause => s.can_pause(),
        Op::Resume => s.can_resume(),
        Op::Hibernate => s.can_hibernate(),
        Op::Wake => s.can_wake(),
        Op::Snapshot | Op::Fork => s.can_snapshot(),
        Op::Kill => true,
    }
}

/// The 409 of `op` refused on sandbox `id` in state `s`, word for word.
fn refusal(op: Op, id: &str, s: SandboxState) -> String {
    let hint = match s {
        SandboxState::Paused => format!(": only resume, kill, get and list are allowed on a paused sandbox (POST /v1/sandboxes/{id}/resume)"),
        SandboxState::Hibernated => format!(": wake it first (POST /v1/sandboxes/{id}/wake; exec and file calls wake it by themselves)"),
        SandboxState::Starting => ": wait until it is running".into(),
        SandboxState::Failed | SandboxState::Stopped => ": it cannot run again: create a new sandbox".into(),
        SandboxState::Lost => format!(": its node was declared dead and it cannot run again: delete it (DELETE /v1/sandboxes/{id}) and create a new sandbox"),
        SandboxState::Running | SandboxState::Pooled => String::new(),
    };
    // A failed sandbox says why.
    let reason = if s == SandboxState::Failed {
        " (it broke)"
    } else {
        ""
    };
    let verb = match op {
        Op::Use => return format!("sandbox {id} is {}{reason}{hint}", s.as_str()),
        Op::Pause => "pause",
        Op::Resume => "resume",
        Op::Hibernate => "hibernate",
        Op::Wake => "wake",
        Op::Snapshot => "snapshot",
        Op::Fork => "fork",
        Op::Kill => unreachable!("kill is always allowed"),
    };
    format!(
        "cannot {verb} sandbox {id}: it is {}{reason}{hint}",
        s.as_str()
    )
}

async fn create(mgr: &Arc<Manager>) -> SandboxId {
    mgr.create(CreateSandbox::default())
        .await
        .expect("create on the fake backend")
        .id
}

/// A sandbox in state `s`: reached through the manager where an operation leads there,
/// written into its record otherwise (starting, stopped, failed).
async fn sandbox_in(mgr: &Arc<Manager>, s: SandboxState) -> SandboxId {
    let id = create(mgr).await;
    match s {
        SandboxState::Running => {}
        SandboxState::Paused => {
            mgr.pause(&id).await.expect("pause");
        }
        SandboxState::Hibernated => {
            mgr.hibernate(&id).await.expect("hibernate");
        }
        other => {
            mgr.store
                .modify(&id, |r| {
                    r.state = other;
                    r.error = (other == SandboxState::Failed).then(|| "it broke".to_string());
                    Ok(())
                })
                .await
                .expect("set the state");
        }
    }
    id
}

/// Run `op` on `id`; the state it leaves the sandbox in (`None`: gone).
async fn run(
    mgr: &Arc<Manager>,
    op: Op,
    id: &SandboxId,
) -> Result<Option<SandboxState>, CoreError> {
    match op {
        Op::Use => mgr.agent(id).await.map(drop),
        Op::Pause => mgr.pause(id).await.map(drop),
        Op::Resume => mgr.resume(id).await.map(drop),
        Op::Hibernate => mgr.hibernate(id).await.map(drop),
        Op::Wake => mgr.wake(id).await.map(drop),
        Op::Snapshot => mgr.snapshot(id, Some("s")).await.map(drop),
        Op::Fork => {
            let children = mgr
                .fork(id, ForkCommand::new(1, ForkMode::Disk).expect("one child"))
                .await?;
            assert_eq!(children.len(), 1);
            assert_eq!(children[0].state, SandboxState::Running);
            Ok(())
        }
        Op::Kill => mgr.kill(id).await,
    }?;
    Ok(mgr
        .store
        .get_sandbox(id)
        .await
        .expect("store")
        .map(|r| r.state))
}

/// Where an allowed `op` from `from` leaves the sandbox.
fn after(op: Op, from: SandboxState) -> Option<SandboxState> {
    match op {
        Op::Use | Op::Wake | Op::Resume => Some(SandboxState::Running),
        Op::Pause => Some(SandboxState::Paused),
        Op::Hibernate => Some(SandboxState::Hibernated),
        Op::Snapshot | Op::Fork => Some(from),
        Op::Kill => None,
    }
}

#[tokio::test]
async fn every_state_check_allows_and_refuses_as_the_state_machine_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mgr, fake) = start_manager(dir.path()).await.expect("manager");
    let mut checked = 0;
    for state in STATES {
        for op in OPS {
            let id = sandbox_in(&mgr, state).await;
            let before = fake.operations_on(&id).len();
            let result = run(&mgr, op, &id).await;
            if allowed(op, state) {
                let left = result.unwrap_or_else(|e| panic!("{op:?} from {state:?}: {e}"));
                assert_eq!(left, after(op, state), "{op:?} from {state:?}");
                assert!(
                    fake.operations_on(&id).len() > before || op == Op::Use,
                    "{op:?} from {state:?} reached the backend"
                );
            } else {
                match result {
                    Err(e @ (CoreError::Conflict(_) | CoreError::WrongState { .. })) => {
                        assert_eq!(
                            e.to_string(),
                            refusal(op, &id, state),
                            "{op:?} from {state:?}"
                        )
                    }
                    other => panic!("{op:?} from {state:?}: expected 409, got {other:?}"),
                }
                // Refused before the backend was asked anything.
                assert_eq!(
                    fake.operations_on(&id).len(),
                    before,
                    "{op:?} from {state:?}"
                );
                let kept = mgr
                    .store
                    .get_sandbox(&id)
                    .await
                    .expect("store")
                    .map(|r| r.state);
                assert_eq!(kept, Some(state), "{op:?} from {state:?} left the state");
            }
            let _ = mgr.kill(&id).await;
            checked += 1;
        }
    }
    assert_eq!(checked, STATES.len() * OPS.len());
}

#[tokio::test]
async fn a_round_trip_reaches_the_backend_in_order_and_execs_through_its_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mgr, fake) = start_manager(dir.path()).await.expect("manager");
    let id = create(&mgr).await;
    let exec = |cmd: &str| crate::exec::ExecCommand {
        cmd: hutch_proto::Command::Shell(cmd.into()),
        env: Default::default(),
        cwd: None,
        user: None,
        stdin: None,
        timeout: None,
        background: false,
    };
    let out = mgr.exec(&id, exec("echo hello")).await.expect("exec");
    assert_eq!(out.exit_code, 0);
    assert_eq!(out.stdout.to_vec(), b"hello\n");
    mgr.hibernate(&id).await.expect("hibernate");
    assert!(
        fake.running().is_empty(),
        "a hibernated sandbox runs nothing"
    );
    // An exec wakes it.
    let out = mgr.exec(&id, exec("exit 3")).await.expect("exec");
    assert_eq!(out.exit_code, 3);
    mgr.kill(&id).await.expect("kill");
    assert_eq!(
        fake.operations_on(&id),
        [
            Operation::Create,
            Operation::Hibernate,
            Operation::Wake,
            Operation::Destroy
        ]
    );
    assert!(matches!(mgr.get(&id).await, Err(CoreError::NotFound(_))));
}

#[tokio::test]
async fn a_backend_failure_is_reported_and_changes_no_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mgr, fake) = start_manager(dir.path()).await.expect("manager");
    let id = create(&mgr).await;
    fake.fail(Operation::Pause);
    assert!(matches!(
        mgr.pause(&id).await,
        Err(CoreError::SandboxFailed(_))
    ));
    assert_eq!(
        mgr.get(&id).await.expect("get").state,
        SandboxState::Running
    );
    fake.succeed(Operation::Pause);
    mgr.pause(&id).await.expect("pause once allowed");

    // A failed create leaves no record behind.
    fake.fail(Operation::Create);
    assert!(matches!(
        mgr.create(CreateSandbox::default()).await,
        Err(CoreError::SandboxFailed(_))
    ));
    let ids: Vec<SandboxId> = mgr
        .list(
            &Default::default(),
            &crate::tenant::TenantScope::All,
            &crate::store::PageRequest::default(),
        )
        .await
        .expect("list")
        .items
        .into_iter()
        .map(|v| v.id)
        .collect::<Vec<_>>();
    assert_eq!(ids, [id]);
}

#[tokio::test]
async fn a_backend_this_server_lacks_and_a_capability_it_lacks_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mgr, _fake) = start_manager(dir.path()).await.expect("manager");
    let vm = mgr
        .create(CreateSandbox {
            isolation: IsolationRequest::Vm,
            ..CreateSandbox::default()
        })
        .await;
    match vm {
        Err(e @ CoreError::NotSupported { .. }) => {
            assert_eq!(
                e.to_string(),
                "running sandboxes is not supported on isolation \"vm\""
            )
        }
        other => panic!("expected 422 not supported, got {other:?}"),
    }
    let id = create(&mgr).await;
    let live = mgr
        .fork(&id, ForkCommand::new(2, ForkMode::Live).expect("two"))
        .await;
    match live {
        Err(CoreError::InvalidArgument(m)) => assert!(
            m.starts_with("live fork needs the vm backend; sandbox "),
            "{m}"
        ),
        other => panic!("expected 422, got {other:?}"),
    }
}

/// What the backend declares is what the manager does: with live fork and memory snapshots
/// a live fork is taken, and its snapshot is a memory snapshot.
#[tokio::test]
async fn capabilities_come_from_the_backend() {
    let dir = tempfile::tempdir().expect("tempdir");
    let caps = crate::backend::Capabilities {
        live_fork: true,
        memory_snapshots: true,
        volume_slots: 1,
        volume_access: crate::backend::VolumeAccess::BlockDevice,
        warm_pool: false,
        portable_hibernation: false,
    };
    let (mgr, fake) = start_manager_with(dir.path(), Some(caps))
        .await
        .expect("manager");
    let id = create(&mgr).await;
    let children = mgr
        .fork(&id, ForkCommand::new(2, ForkMode::Live).expect("two"))
        .await
        .expect("a live fork on a backend that has it");
    assert_eq!(children.len(), 2);
    assert_eq!(
        fake.operations_on(&id),
        [Operation::Create, Operation::Snapshot]
    );
    let snapshot = mgr.snapshot(&id, Some("m")).await.expect("snapshot");
    assert_eq!(snapshot.kind, crate::snapshot::SnapshotKind::Memory);
    // Two volumes where the backend has one slot.
    let too_many = mgr
        .create(CreateSandbox {
            volumes: vec![
                crate::volume::VolumeMount {
                    volume: "a".into(),
                    path: "/a".into(),
                    read_only: false,
                },
                crate::volume::VolumeMount {
                    volume: "b".into(),
                    path: "/b".into(),
                    read_only: false,
                },
            ],
            ..CreateSandbox::default()
        })
        .await;
    match too_many {
        Err(CoreError::InvalidArgument(m)) => assert_eq!(m, "at most 1 volumes per ns sandbox"),
        other => panic!("expected 422, got {other:?}"),
    }
}

#[tokio::test]
async fn a_call_refreshes_the_ttl_in_memory_and_the_flush_writes_it_in_one_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mgr, _fake) = start_manager(dir.path()).await.expect("manager");
    let id = create(&mgr).await;
    // Its TTL runs out in 1.5 s as far as the store knows.
    let soon = crate::time::now_ms() + 1500;
    mgr.store
        .modify(&id, |r| {
            r.expires_at_ms = soon;
            Ok(())
        })
        .await
        .expect("set the expiry");
    mgr.get(&id).await.expect("get");
    let stored = |mgr: Arc<Manager>, id: SandboxId| async move {
        mgr.store
            .get_sandbox(&id)
            .await
            .expect("read the store")
            .expect("the record")
            .expires_at_ms
    };
    // What the manager answers has the refreshed TTL; the store does not yet.
    let refreshed = mgr.load(&id).await.expect("load").expires_at_ms;
    assert!(refreshed > soon + 60_000, "{refreshed}");
    assert_eq!(stored(mgr.clone(), id.clone()).await, soon);
    // Past the stored expiry the reaper keeps it: what counts is the refresh.
    tokio::time::sleep(std::time::Duration::from_millis(1600)).await;
    mgr.reap_expired().await;
    assert_eq!(
        mgr.load(&id).await.expect("still there").state,
        SandboxState::Running
    );
    mgr.flush_refreshes().await;
    assert_eq!(stored(mgr.clone(), id.clone()).await, refreshed);
}

#[tokio::test]
async fn a_create_the_server_never_answered_is_removed_at_start_not_kept_as_failed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mgr, _fake) = start_manager(dir.path()).await.expect("manager");
    let id = create(&mgr).await;
    // As a server killed between inserting the record and answering leaves it.
    mgr.store
        .modify(&id, |r| {
            r.state = SandboxState::Starting;
            Ok(())
        })
        .await
        .expect("back to starting");
    drop(mgr);
    let (mgr, fake) = start_manager(dir.path()).await.expect("restarted");
    assert!(mgr.store.get_sandbox(&id).await.expect("store").is_none());
    assert!(
        fake.operations_on(&id).contains(&Operation::Destroy),
        "{:?}",
        fake.calls()
    );
}
