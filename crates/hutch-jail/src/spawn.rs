//! Building a sandbox (the parent side of DESIGN.md §3), with an undo journal so a failure at
//! any step leaves no directory, mount, cgroup or process behind.
//!
//! Order: validate; directories (upper and work owned by the sandbox's root uid; an existing
//! upper, e.g. of a hibernated sandbox, is used as it is); a user namespace fd carrying the uid
//! mapping; the idmapped read-only binds of the template at `lower` and of each extra layer
//! (a snapshot's files) at `layer-N`; the overlay at `merged`; the agent's listening socket;
//! the cgroups with their limits; then the child is **born** inside them: this process joins
//! the v1 cgroups (through `tasks`, which avoids the kernel's global migration lock) and
//! clones with `CLONE_INTO_CGROUP` into the v2 one; new user, pid, mount, net, ipc and uts
//! namespaces (the child unshares its cgroup namespace once released, so it is rooted at the
//! sandbox's cgroups); uid/gid maps and `oom_score_adj = -999` written from outside; release;
//! wait for `execve` (end of file on the error pipe) or an error report. This process then
//! moves back out of the v1 cgroups.

use std::io::ErrorKind;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cgroup::{self, Created, Layout};
use crate::child::{self, ChildPlan, AGENT_PATH, HIGH_FD};
use crate::spec::{self, SandboxPaths};
use crate::sys::{self, cstr};
use crate::{mountinfo, mounts, procstat, seccomp, teardown, JailError, JailSpec, SpawnedJail};

/// How long the child may take from release to `execve`.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Namespaces of every sandbox.
/// (The cgroup namespace is unshared by the child once it sits in its cgroups.)
const NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;
/// `oom_score_adj` of the agent: the last process of its sandbox the OOM killer picks.
const AGENT_OOM_SCORE_ADJ: &str = "-999";

/// What has been created so far, undone in reverse on failure.
#[derive(Default)]
struct Undo {
    /// The cloned child, not yet known to have exec'd.
    child: Option<libc::pid_t>,
    /// This process sits in the sandbox's v1 cgroups.
    joined: bool,
    /// This process sits in the sandbox's v2 cgroup too (fallback without `clone3`).
    joined_v2: bool,
    /// The sandbox's cgroups.
    cgroups: Vec<Created>,
    /// The agent socket's path.
    socket: Option<PathBuf>,
    /// Mount points, in mount order.
    mounts: Vec<PathBuf>,
    /// Files created.
    files: Vec<PathBuf>,
    /// Directories created, outermost first.
    dirs: Vec<PathBuf>,
}

impl Undo {
    /// Undo everything; returns what could not be undone.
    fn rollback(self) -> Vec<String> {
        let mut left = Vec::new();
        if let Some(pid) = self.child {
            let _ = sys::kill(pid, libc::SIGKILL);
            let _ = sys::waitpid(pid, 0);
        }
        if self.joined {
            // SAFETY: getpid cannot fail.
            cgroup::leave(&self.cgroups, unsafe { libc::getpid() }, self.joined_v2);
        }
        let dirs: Vec<PathBuf> = self.cgroups.iter().map(|c| c.dir.clone()).collect();
        if let Err(e) = cgroup::remove_dirs(&dirs) {
            left.push(e.to_string());
        }
        for m in self.mounts.iter().rev() {
            if let Err(e) = mounts::detach(m) {
                left.push(e.to_string());
            }
        }
        for f in self.socket.iter().chain(self.files.iter()) {
            let _ = std::fs::remove_file(f);
        }
        for d in self.dirs.iter().rev() {
            if let Err(e) = teardown::remove_tree_safely(d) {
                left.push(e.to_string());
            }
        }
        left
    }
}

/// Build a sandbox from `spec` and exec its agent as PID 1.
///
/// This forks, so it refuses to run in a process with more than one thread: call it from a
/// single-threaded helper (see [`crate::helper_main`] and [`crate::spawn_with_helper`]). On
/// error, everything created so far has been removed again.
pub fn spawn(spec: &JailSpec) -> Result<SpawnedJail, JailError> {
    let t0 = Instant::now();
    spec::validate(spec)?;
    ensure_single_threaded()?;
    let filters = seccomp::filters()?;
    let mut undo = Undo::default();
    match build(spec, filters, &mut undo, t0) {
        Ok(spawned) => Ok(spawned),
        Err(e) => {
            let left = std::mem::take(&mut undo).rollback();
            if left.is_empty() {
                Err(e)
            } else {
                Err(JailError::Setup(format!(
                    "{e}; cleanup incomplete: {}",
                    left.join("; ")
                )))
            }
        }
    }
}

fn ensure_single_threaded() -> Result<(), JailError> {
    let threads = std::fs::read_dir("/proc/self/task")
        .map(Iterator::count)
        .unwrap_or(1);
    if threads == 1 {
        Ok(())
    } else {
        Err(JailError::Unsupported(format!(
            "spawning from a process with {threads} threads (spawn forks; run it through the \
             single-threaded `hutch {}` helper)",
            crate::HELPER_ARG
        )))
    }
}

fn io_err(op: String) -> impl FnOnce(std::io::Error) -> JailError {
    move |source| JailError::Sys { op, source }
}

/// Create `dir` (and missing parents) with mode 0755, journaling the outermost new directory.
fn create_dir_journaled(dir: &Path, undo: &mut Undo) -> Result<bool, JailError> {
    if dir.symlink_metadata().is_ok() {
        return Ok(false);
    }
    let outermost = dir
        .ancestors()
        .take_while(|a| a.symlink_metadata().is_err())
        .last()
        .map(Path::to_path_buf);
    std::fs::create_dir_all(dir).map_err(io_err(format!("mkdir {}", dir.display())))?;
    if let Some(o) = outermost {
        undo.dirs.push(o);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(io_err(format!("chmod {}", dir.display())))?;
    Ok(true)
}

/// Bind the agent's listening socket (mode 0600; a stale socket is replaced).
fn bind_listener(path: &Path, undo: &mut Undo) -> Result<OwnedFd, JailError> {
    match path.symlink_metadata() {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            std::fs::remove_file(path)
                .map_err(io_err(format!("remove stale {}", path.display())))?;
        }
        Ok(_) => {
            return Err(JailError::InvalidSpec(format!(
                "agent_socket {} exists and is not a socket",
                path.display()
            )))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(format!("stat {}", path.display()))(e)),
    }
    // SAFETY: umask only swaps the process's file mode mask (single-threaded here).
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let listener = bound.map_err(io_err(format!("bind {}", path.display())))?;
    undo.socket = Some(path.to_path_buf());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err(format!("chmod {}", path.display())))?;
    Ok(sys::dup_at_least(
        OwnedFd::from(listener).as_raw_fd(),
        HIGH_FD,
    )?)
}

fn agent_argv(spec: &JailSpec) -> Result<Vec<std::ffi::CString>, JailError> {
    let mut argv = vec![cstr(AGENT_PATH)?];
    for a in &spec.agent_args {
        argv.push(cstr(a)?);
    }
    Ok(argv)
}

fn agent_envp(spec: &JailSpec) -> Result<Vec<std::ffi::CString>, JailError> {
    spec.env
        .iter()
        .map(|(k, v)| cstr(&format!("{k}={v}")).map_err(JailError::from))
        .collect()
}

fn build(
    spec: &JailSpec,
    filters: seccomp::Filters,
    undo: &mut Undo,
    t0: Instant,
) -> Result<SpawnedJail, JailError> {
    let mut paths = SandboxPaths::with_layers(&spec.sandbox_dir, spec.layers.len());
    if let Some(dir) = &spec.upper_dir {
        paths.upper = dir.join("upper");
        paths.work = dir.join("work");
    }
    paths.volumes = (0..spec.volumes.len())
        .map(|i| spec.sandbox_dir.join(format!("vol-{i}")))
        .collect();
    let sources = std::iter::once(("template_rootfs", &spec.template_rootfs))
        .chain(spec.layers.iter().map(|l| ("layer", l)));
    for (what, dir) in sources {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(JailError::InvalidSpec(format!(
                    "{what} {} is not a directory",
                    dir.display()
                )))
            }
            Err(e) => {
                return Err(JailError::InvalidSpec(format!(
                    "{what} {}: {e}",
                    dir.display()
                )))
            }
        }
    }
    spec::check_agent_binary(&spec.agent_binary)?;

    // Directories.
    create_dir_journaled(&paths.root, undo)?;
    if let Some(parent) = paths.root.parent() {
        spec::check_searchable("sandbox_dir", parent)?;
    }
    // The sandbox's directory holds its mounted root (`merged`): only the sandbox's own host
    // uid (its root, which walks it to `pivot_root`) and the host's root may enter it, so no
    // other host user reads the sandbox's files or runs what it planted there.
    sys::chown(&paths.root, spec.uid_base, spec.uid_base)?;
    std::fs::set_permissions(&paths.root, std::fs::Permissions::from_mode(0o700))
        .map_err(io_err(format!("chmod {}", paths.root.display())))?;
    let root = paths
        .root
        .canonicalize()
        .map_err(io_err(format!("resolve {}", paths.root.display())))?;
    if let Some(m) = mountinfo::mounts_at_or_under(&mountinfo::read()?, &root).first() {
        return Err(JailError::InvalidSpec(format!(
            "sandbox_dir {} is in use: {} is mounted",
            paths.root.display(),
            m.display()
        )));
    }
    for (dir, owned_by_sandbox) in [
        (&paths.upper, true),
        (&paths.work, true),
        (&paths.lower, false),
        (&paths.merged, false),
    ]
    .into_iter()
    .chain(paths.layers.iter().map(|l| (l, false)))
    {
        if create_dir_journaled(dir, undo)? && owned_by_sandbox {
            sys::chown(dir, spec.uid_base, spec.uid_base)?;
        }
    }
    let log_existed = paths.log.symlink_metadata().is_ok();
    let log_file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&paths.log)
        .map_err(io_err(format!("open {}", paths.log.display())))?;
    if !log_existed {
        undo.files.push(paths.log.clone());
    }
    let log = sys::dup_at_least(log_file.as_raw_fd(), HIGH_FD)?;
    drop(log_file);

    // The copy-on-write root.
    {
        // SAFETY: `spawn` verified this process is single-threaded.
        let userns = unsafe { mounts::userns_fd(spec.uid_base, spec.uid_count)? };
        mounts::idmapped_bind(&spec.template_rootfs, &paths.lower, &userns)?;
        undo.mounts.push(paths.lower.clone());
        for (layer, at) in spec.layers.iter().zip(&paths.layers) {
            mounts::idmapped_bind(layer, at, &userns)?;
            undo.mounts.push(at.clone());
        }
        for (v, at) in spec.volumes.iter().zip(&paths.volumes) {
            // A volume's source must be its mounted filesystem, never the bare directory
            // under it (which would silently hand the sandbox an empty, unlimited tree).
            if !crate::volume::is_mounted(&v.source)? {
                return Err(JailError::InvalidSpec(format!(
                    "volume source {} is not mounted",
                    v.source.display()
                )));
            }
            create_dir_journaled(at, undo)?;
            mounts::idmapped_bind_volume(&v.source, at, &userns, v.read_only)?;
            undo.mounts.push(at.clone());
        }
    }
    mounts::overlay(&paths)?;
    undo.mounts.push(paths.merged.clone());

    let listen = bind_listener(&spec.agent_socket, undo)?;

    // cgroups, joined by this process so the child is born inside them.
    let layout = Layout::detect()?;
    cgroup::create(
        &layout,
        &spec.cgroup_parent,
        &spec.id,
        &spec.limits,
        &mut undo.cgroups,
    )?;
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    undo.joined = true;
    cgroup::join_v1(&undo.cgroups)?;
    let v2_dir = match cgroup::v2_dir(&undo.cgroups) {
        Some(d) => Some(open_cgroup_dir(d)?),
        None => None,
    };

    // The child.
    let (sync_rd, sync_wr) = sys::pipe()?;
    let (err_rd, err_wr_low) = sys::pipe()?;
    let err_wr = sys::dup_at_least(err_wr_low.as_raw_fd(), HIGH_FD)?;
    drop(err_wr_low);
    let mut namespaces = NAMESPACES;
    if let Some(ns) = &spec.netns {
        join_netns(ns)?;
        namespaces &= !libc::CLONE_NEWNET;
    }
    let plan = ChildPlan {
        own_netns: spec.netns.is_none(),
        volumes: spec
            .volumes
            .iter()
            .zip(&paths.volumes)
            .map(|(v, at)| (at.clone(), v.target.clone(), v.read_only))
            .collect(),
        resolv_conf: spec.resolv_conf.clone(),
        merged: paths.merged.clone(),
        agent_binary: spec.agent_binary.clone(),
        tmp_bytes: spec.limits.tmp_bytes,
        hostname: spec.hostname.clone(),
        argv: agent_argv(spec)?,
        envp: agent_envp(spec)?,
        filters,
        sync_rd: sync_rd.as_raw_fd(),
        err_wr: err_wr.as_raw_fd(),
        log: log.as_raw_fd(),
        listen: listen.as_raw_fd(),
        parent_ends: [sync_wr.as_raw_fd(), err_rd.as_raw_fd()],
    };
    let pid = clone_child(namespaces, v2_dir.as_ref(), undo, me)?;
    if pid == 0 {
        child::run(&plan);
    }
    undo.child = Some(pid);
    drop((sync_rd, err_wr, listen));

    mounts::write_id_maps(pid, spec.uid_base, spec.uid_count)?;
    protect_from_oom(pid, &log);
    // A child that already died makes this fail with EPIPE; its report is read below.
    let _ = sys::write_all(&sync_wr, b"r");
    drop((sync_wr, log));

    let report = read_report(&err_rd)?;
    if !report.is_empty() {
        let _ = sys::waitpid(pid, 0);
        undo.child = None;
        return Err(JailError::Setup(child::decode_error(&report)));
    }
    let stat = procstat::read(pid)
        .ok_or_else(|| JailError::Setup("the agent exited immediately after exec".into()))?;
    undo.child = None;
    cgroup::leave(&undo.cgroups, me, undo.joined_v2);
    undo.joined = false;
    let cgroups = undo.cgroups.iter().map(|c| c.dir.clone()).collect();
    *undo = Undo::default();
    Ok(SpawnedJail {
        init_pid: pid,
        init_start_time: stat.start_time,
        cgroups,
        setup_ms: t0.elapsed().as_secs_f64() * 1000.0,
    })
}

/// Move this (single-threaded helper) process into the network namespace at `path`, so the
/// child is born in it.
fn join_netns(path: &Path) -> Result<(), JailError> {
    let ns = std::fs::File::open(path).map_err(io_err(format!("open netns {}", path.display())))?;
    // SAFETY: setns takes an open descriptor (alive for the call) and a flag.
    let ret = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if ret != 0 {
        return Err(io_err(format!("setns {}", path.display()))(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn open_cgroup_dir(dir: &Path) -> Result<OwnedFd, JailError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .map(OwnedFd::from)
        .map_err(io_err(format!("open {}", dir.display())))
}

/// Clone the sandbox's first process into new namespaces and, when there is a v2 cgroup,
/// straight into it (`clone3(CLONE_INTO_CGROUP)`: no migration). Kernels without it get the
/// slow path: this process joins the v2 cgroup and a plain `clone` inherits it.
fn clone_child(
    namespaces: libc::c_int,
    v2_dir: Option<&OwnedFd>,
    undo: &mut Undo,
    me: libc::pid_t,
) -> Result<libc::pid_t, JailError> {
    if let Some(dir) = v2_dir {
        // SAFETY: `spawn` verified this process is single-threaded.
        match unsafe { sys::clone_into_cgroup(namespaces, dir) } {
            Ok(pid) => return Ok(pid),
            Err(e) if matches!(e.errno, libc::ENOSYS | libc::E2BIG | libc::EINVAL) => {
                undo.joined_v2 = true;
                cgroup::join_v2(&undo.cgroups, me)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    // SAFETY: `spawn` verified this process is single-threaded.
    Ok(unsafe { sys::clone_process(namespaces)? })
}

/// Make the agent the OOM killer's last choice in its sandbox. Lowering `oom_score_adj` needs
/// `CAP_SYS_RESOURCE`; where the host withholds it, the sandbox runs without this protection
/// and its log says so.
fn protect_from_oom(pid: libc::pid_t, log: &OwnedFd) {
    let path = format!("/proc/{pid}/oom_score_adj");
    if let Err(e) = std::fs::write(&path, AGENT_OOM_SCORE_ADJ) {
        let line = format!("hutch-jail: agent oom_score_adj left at default ({path}: {e})\n");
        let _ = sys::write_all(log, line.as_bytes());
    }
}

/// Read the child's error pipe until end of file (exec succeeded: empty) or a report.
fn read_report(err_rd: &OwnedFd) -> Result<Vec<u8>, JailError> {
    let deadline = Instant::now() + SETUP_TIMEOUT;
    let mut report = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        if !sys::poll_readable(err_rd, ms)? {
            return Err(JailError::Timeout("the sandbox's setup to finish".into()));
        }
        match sys::read(err_rd, &mut buf)? {
            0 => return Ok(report),
            n => report.extend_from_slice(&buf[..n]),
        }
    }
}
