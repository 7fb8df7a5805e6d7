//! Root integration tests of the namespace jail (`hutch-jail`).
//!
//! Every test builds a tiny template (static busybox plus a static C probe compiled here), runs
//! the real helper (`hutch __jail-spawn`, JailSpec JSON on stdin) and proves an isolation
//! property from inside the sandbox: the script writes its findings to `/result`, which lands
//! in the sandbox's upper layer where the test reads it. A guard destroys every sandbox (even
//! when an assertion fails) and the temporary directories go with it.
//!
//! The "agent" is the probe itself: started as `/.hutch/hutch-agent` it execs its first
//! argument (busybox cannot be the agent directly: it would look for an applet named
//! `hutch-agent`). The probe refuses to run its syscall checks outside a jail.
//!
//! Needs root; skipped otherwise. `cargo test -p hutch --test jail -- --ignored --nocapture`
//! runs the benchmark (spawn + `true` + destroy vs `bwrap --unshare-all true`).

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use hutch_jail::{
    cgroup_stats, destroy, freeze, init_alive, spawn_with_helper, thaw, JailError, JailSpec,
    Limits, SpawnedJail, Teardown,
};
use hutch_testkit::wait_until_blocking;

/// Parent cgroup of every test sandbox.
const CGROUP_PARENT: &str = "hutch-jail-test";
/// Busybox applets linked into the template.
const APPLETS: &[&str] = &[
    "sh", "cat", "cut", "echo", "grep", "head", "hostname", "id", "ls", "mkdir", "mknod", "mv",
    "sleep", "stat", "tr", "true", "wc",
];

/// The probe (see the module docs).
const PROBE_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <netinet/in.h>

/* Refuse to run outside a Hutch jail: the probes below are harmless only inside one. */
static int jailed(void) {
    char buf[256] = {0};
    FILE *f = fopen("/proc/self/uid_map", "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    unsigned inside = 1, outside = 0;
    if (sscanf(buf, "%u %u", &inside, &outside) != 2) return 0;
    return inside == 0 && outside != 0 && access("/.hutch/hutch-agent", F_OK) == 0;
}

static void rep(const char *name, long ret) {
    printf("%s %s\n", name, ret < 0 ? strerrorname_np(errno) : "OK");
}
#define SC(name, ...) do { errno = 0; rep(name, syscall(__VA_ARGS__)); } while (0)

static void in_child(const char *name, int x32) {
    pid_t p = fork();
    if (p == 0) {
        if (x32) {
            syscall(0x40000000 | SYS_getpid);
        } else {
            long r;
            __asm__ volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory");
        }
        _exit(0);
    }
    int st = 0;
    waitpid(p, &st, 0);
    if (WIFSIGNALED(st)) printf("%s SIG%s\n", name, sigabbrev_np(WTERMSIG(st)));
    else printf("%s exit%d\n", name, WEXITSTATUS(st));
}

static int syscalls(void) {
    SC("mount", SYS_mount, "none", "/tmp", "tmpfs", 0, NULL);
    SC("umount2", SYS_umount2, "/proc", MNT_DETACH);
    int nsfd = open("/proc/self/ns/uts", O_RDONLY);
    SC("setns", SYS_setns, nsfd, 0);
    SC("ptrace", SYS_ptrace, 0 /*TRACEME*/, 0, 0, 0);
    SC("keyctl", SYS_keyctl, 0 /*GET_KEYRING_ID*/, -3, 0);
    SC("add_key", SYS_add_key, 0, 0, 0, 0, 0);
    SC("bpf", SYS_bpf, 0, NULL, 0);
    SC("perf_event_open", SYS_perf_event_open, NULL, 0, -1, -1, 0);
    SC("userfaultfd", SYS_userfaultfd, 0);
    SC("io_uring_setup", SYS_io_uring_setup, 1, NULL);
    SC("open_by_handle_at", SYS_open_by_handle_at, AT_FDCWD, NULL, 0);
    SC("init_module", SYS_init_module, NULL, 0, "");
    SC("kexec_load", SYS_kexec_load, 0, 0, NULL, 0);
    SC("chroot", SYS_chroot, "/");
    SC("pivot_root", SYS_pivot_root, "/", "/");
    SC("open_tree", SYS_open_tree, AT_FDCWD, "/", 1);
    SC("fsopen", SYS_fsopen, "tmpfs", 0);
    SC("process_vm_readv", SYS_process_vm_readv, getpid(), NULL, 0, NULL, 0, 0);
    SC("settimeofday", SYS_settimeofday, NULL, NULL);
    SC("iopl", SYS_iopl, 3);
    SC("syslog", SYS_syslog, 10, NULL, 0);
    SC("sethostname", SYS_sethostname, "evil", 4);
    SC("personality_query", SYS_personality, 0xffffffffUL);
    SC("personality_rie", SYS_personality, 0x0400000UL);
    SC("clone3", SYS_clone3, NULL, 0);
    errno = 0;
    long c = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
    if (c == 0) _exit(0);
    if (c > 0) waitpid(c, NULL, 0);
    rep("clone_newuser", c);
    errno = 0; rep("socket_packet", socket(AF_PACKET, SOCK_RAW, 0));
    errno = 0; rep("socket_inet_raw", socket(AF_INET, SOCK_RAW, IPPROTO_ICMP));
    errno = 0; rep("socket_vsock", socket(40, SOCK_STREAM, 0));
    errno = 0; rep("socket_alg", socket(38, SOCK_SEQPACKET, 0));
    errno = 0; rep("socket_inet_tcp", socket(AF_INET, SOCK_STREAM, 0));
    errno = 0; rep("socket_unix", socket(AF_UNIX, SOCK_STREAM, 0));
    errno = 0; rep("ioctl_tiocsti", ioctl(0, TIOCSTI, "x"));
    errno = 0; rep("mknod_blk", mknod("/tmp/sda", S_IFBLK | 0600, makedev(8, 0)));
    errno = 0; rep("landlock_reopen_log", open("/proc/self/fd/2", O_WRONLY | O_APPEND));
    /* Last: these would change the probe's own namespaces. */
    SC("unshare_mnt", SYS_unshare, CLONE_NEWNS);
    SC("unshare_user", SYS_unshare, CLONE_NEWUSER);
    in_child("abi_int80", 0);
    in_child("abi_x32", 1);
    return 0;
}

static int alloc(long mb) {
    for (long i = 0; i < mb; i++) {
        char *p = malloc(1 << 20);
        if (!p) { printf("malloc failed at %ld\n", i); return 1; }
        memset(p, 1, 1 << 20);
    }
    printf("allocated %ld\n", mb);
    return 0;
}

static int forks(int max) {
    static pid_t kids[4096];
    int n = 0, err = 0;
    while (n < max && n < 4096) {
        pid_t p = fork();
        if (p == 0) { pause(); _exit(0); }
        if (p < 0) { err = errno; break; }
        kids[n++] = p;
    }
    printf("forked %d then %s\n", n, err ? strerrorname_np(err) : "none");
    for (int i = 0; i < n; i++) kill(kids[i], SIGKILL);
    for (int i = 0; i < n; i++) waitpid(kids[i], NULL, 0);
    return 0;
}

int main(int argc, char **argv) {
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    if (strcmp(base, "hutch-agent") == 0) {
        /* Agent shim: exec the real program given as the first argument. */
        if (argc < 2) return 127;
        execv(argv[1], argv + 1);
        perror("exec");
        return 127;
    }
    if (!jailed()) {
        fprintf(stderr, "probe: refusing to run outside a Hutch jail\n");
        return 3;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc >= 2 && strcmp(argv[1], "syscalls") == 0) return syscalls();
    if (argc >= 3 && strcmp(argv[1], "alloc") == 0) return alloc(atol(argv[2]));
    if (argc >= 3 && strcmp(argv[1], "forks") == 0) return forks(atoi(argv[2]));
    fprintf(stderr, "usage: probe syscalls | alloc MB | forks N\n");
    return 2;
}
"#;

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipping: the jail tests need root");
    }
    root
}

/// Inits are re-parented to this process when the helper exits; reap them here.
fn become_subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: PR_SET_CHILD_SUBREAPER takes integer arguments only.
        let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        assert_eq!(r, 0, "PR_SET_CHILD_SUBREAPER");
    });
}

/// A uid range no other test of this run uses.
fn unique_uid_base() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let slot = (nanos / 1000 + std::process::id() * 7 + n * 131) % 25_000;
    2_000_000 + slot * 65_536
}

/// A template (busybox + probe) in a fresh temporary directory, plus the host-side probe that
/// serves as the agent.
struct Template {
    /// `None` once dropped.
    dir: Option<tempfile::TempDir>,
    rootfs: PathBuf,
    agent: PathBuf,
}

impl Drop for Template {
    /// Never let a recursive delete run through a mount a failed teardown left behind.
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            let mounted = mounts_under(dir.path());
            if !mounted.is_empty() {
                eprintln!(
                    "keeping {} (still mounted: {mounted:?})",
                    dir.keep().display()
                );
            }
        }
    }
}

impl Template {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("hutch-jail-")
            .tempdir()
            .unwrap();
        // The sandbox's setup walks these paths as its own unprivileged uid.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let rootfs = dir.path().join("rootfs");
        for d in ["bin", "etc", "proc", "dev", "sys", "tmp", "root"] {
            std::fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        for a in APPLETS {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(a)).unwrap();
        }
        std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
        std::fs::write(rootfs.join("etc/group"), "root:x:0:\n").unwrap();
        let src = dir.path().join("probe.c");
        std::fs::write(&src, PROBE_C).unwrap();
        let agent = dir.path().join("probe");
        let out = Command::new("cc")
            .args(["-static", "-O1", "-o"])
            .arg(&agent)
            .arg(&src)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::copy(&agent, rootfs.join("bin/probe")).unwrap();
        Self {
            dir: Some(dir),
            rootfs,
            agent,
        }
    }

    fn base(&self) -> &Path {
        self.dir.as_ref().expect("template alive").path()
    }

    /// A spec running `script` under `/bin/sh -c` in this template.
    fn spec(&self, name: &str, script: &str) -> JailSpec {
        JailSpec {
            id: format!("jt-{name}-{}", std::process::id()),
            template_rootfs: self.rootfs.clone(),
            sandbox_dir: self.base().join(format!("sbx-{name}")),
            uid_base: unique_uid_base(),
            uid_count: 65_536,
            agent_binary: self.agent.clone(),
            agent_args: vec!["/bin/sh".into(), "-c".into(), script.into()],
            agent_socket: self.base().join(format!("{name}.sock")),
            layers: vec![],
            hostname: format!("sbx-{name}"),
            env: vec![("PATH".into(), "/bin".into())],
            limits: Limits {
                memory_bytes: 256 << 20,
                cpu_millis: 1000,
                pids_max: 128,
                tmp_bytes: 64 << 20,
            },
            cgroup_parent: CGROUP_PARENT.into(),
            netns: None,
            resolv_conf: None,
            volumes: vec![],
            upper_dir: None,
        }
    }

    /// A digest of the template: every path, its type, mode, owner and content.
    fn digest(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![self.rootfs.clone()];
        while let Some(p) = stack.pop() {
            let m = p.symlink_metadata().unwrap();
            let content = if m.is_file() {
                format!(
                    "{:?}",
                    std::fs::read(&p)
                        .unwrap()
                        .iter()
                        .map(|b| u64::from(*b))
                        .sum::<u64>()
                )
            } else if m.file_type().is_symlink() {
                std::fs::read_link(&p).unwrap().display().to_string()
            } else {
                String::new()
            };
            out.push(format!(
                "{} {:o} {}:{} {}",
                p.display(),
                m.mode(),
                m.uid(),
                m.gid(),
                content
            ));
            if m.is_dir() {
                for e in std::fs::read_dir(&p).unwrap() {
                    stack.push(e.unwrap().path());
                }
            }
        }
        out.sort();
        out
    }
}

/// One sandbox; destroyed on drop whatever happened.
struct Jail {
    spec: JailSpec,
    spawned: Option<SpawnedJail>,
}

impl Jail {
    /// Spawn through the real helper; the guard exists (and cleans up) either way.
    fn start(spec: JailSpec) -> (Jail, Result<(), JailError>) {
        become_subreaper();
        let helper = PathBuf::from(env!("CARGO_BIN_EXE_hutch"));
        match spawn_with_helper(&helper, &spec) {
            Ok(s) => (
                Jail {
                    spec,
                    spawned: Some(s),
                },
                Ok(()),
            ),
            Err(e) => (
                Jail {
                    spec,
                    spawned: None,
                },
                Err(e),
            ),
        }
    }

    fn must_start(spec: JailSpec) -> Jail {
        let (jail, r) = Jail::start(spec);
        if let Err(e) = r {
            panic!("spawn failed: {e}");
        }
        jail
    }

    fn spawned(&self) -> &SpawnedJail {
        self.spawned.as_ref().unwrap()
    }

    fn upper(&self) -> PathBuf {
        self.spec.sandbox_dir.join("upper")
    }

    fn teardown(&self) -> Teardown {
        match &self.spawned {
            Some(s) => Teardown::new(&self.spec, s),
            None => Teardown {
                id: self.spec.id.clone(),
                sandbox_dir: self.spec.sandbox_dir.clone(),
                init_pid: None,
                init_start_time: None,
                cgroups: vec![],
                cgroup_parent: self.spec.cgroup_parent.clone(),
            },
        }
    }

    /// Reap the init if it exited; true once it has.
    fn exited(&self) -> bool {
        let s = self.spawned();
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; WNOHANG never blocks.
        unsafe { libc::waitpid(s.init_pid, &mut status, libc::WNOHANG) };
        !init_alive(s.init_pid, s.init_start_time)
    }

    /// Wait until the script moved its findings to `/result`; parse `key=value` lines and the
    /// probe's `name RESULT` lines.
    fn result(&self) -> Findings {
        let path = self.upper().join("result");
        let log = self.spec.sandbox_dir.join("agent.log");
        assert!(
            wait_until_blocking(Duration::from_secs(20), || path.exists().then_some(())).is_some(),
            "no /result; agent.log: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Findings::parse(&std::fs::read_to_string(&path).unwrap())
    }
}

impl Drop for Jail {
    fn drop(&mut self) {
        if let Err(e) = destroy(&self.teardown()) {
            eprintln!("destroy {}: {e}", self.spec.id);
        }
        for m in cgroup_mounts() {
            let _ = std::fs::remove_dir(m.join(CGROUP_PARENT));
        }
    }
}

/// What a script reported.
#[derive(Debug)]
struct Findings {
    text: String,
    values: HashMap<String, String>,
}

impl Findings {
    fn parse(text: &str) -> Self {
        let mut values = HashMap::new();
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                values.insert(k.to_string(), v.to_string());
            } else if let Some((k, v)) = line.split_once(' ') {
                values.insert(k.to_string(), v.to_string());
            }
        }
        Self {
            text: text.to_string(),
            values,
        }
    }

    fn get(&self, key: &str) -> &str {
        self.values
            .get(key)
            .unwrap_or_else(|| panic!("no {key:?} in findings:\n{}", self.text))
    }
}

/// Mount points of every cgroup hierarchy.
fn cgroup_mounts() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            (fstype == "cgroup" || fstype == "cgroup2")
                .then(|| PathBuf::from(left.split(' ').nth(4).unwrap()))
        })
        .collect()
}

/// Everything the host still holds for a sandbox: mounts beneath `dir`, cgroups named `id`.
fn leftovers(dir: &Path, id: &str) -> Vec<String> {
    let mut left = mounts_under(dir);
    for m in cgroup_mounts() {
        let d = m.join(CGROUP_PARENT).join(id);
        if d.exists() {
            left.push(format!("cgroup: {}", d.display()));
        }
    }
    left
}

/// mountinfo lines of mounts at or beneath `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|m| Path::new(m).starts_with(dir))
        })
        .map(|l| format!("mount: {l}"))
        .collect()
}

const ISOLATION_SCRIPT: &str = r#"
exec >/result.tmp
echo "uid=$(id -u)"
echo "uid_map=$(tr -s ' ' < /proc/self/uid_map)"
echo "pids=$(ls /proc | grep -c '^[0-9]')"
echo "work_visible=$( [ -e /work ] && echo yes || echo no )"
echo "base_visible=$( [ -e "$HOST_BASE" ] && echo yes || echo no )"
echo "hostname=$(hostname)"
echo "cgroup_nonroot=$(cut -d: -f3 /proc/self/cgroup | grep -vc '^/$')"
echo "net=$(ls /sys/class/net | tr '\n' ' ')"
echo "lo_flags=$(cat /sys/class/net/lo/flags)"
grep -E '^(NoNewPrivs|CapEff|CapBnd|CapPrm|CapAmb|Seccomp):' /proc/self/status | tr -d ' \t' | tr ':' '='
for f in kcore kallsyms keys timer_list sched_debug; do
  if [ -e /proc/$f ]; then echo "proc_$f=$(cat /proc/$f | wc -c)"; else echo "proc_$f=absent"; fi
done
echo "proc_sys=$( (echo x > /proc/sys/kernel/hostname) 2>&1 )"
if [ -e /proc/sysrq-trigger ]; then echo "sysrq=$( (echo h > /proc/sysrq-trigger) 2>&1 )"; else echo sysrq=absent; fi
echo "agent_write=$( (echo x > /.hutch/hutch-agent) 2>&1 )"
echo "tmp_fs=$(grep ' /tmp ' /proc/mounts | cut -d' ' -f3)"
echo hello > /etc/hutch-written
echo "intruder:x:1:1::/:/bin/sh" >> /etc/passwd
echo "passwd_owner=$(stat -c %u:%g /etc/passwd)"
/bin/probe syscalls
echo END
mv /result.tmp /result
"#;

#[test]
fn isolation_holds_from_inside() {
    if !is_root() {
        return;
    }
    let t = Template::new();
    let before = t.digest();
    let mut spec = t.spec("iso", ISOLATION_SCRIPT);
    spec.env
        .push(("HOST_BASE".into(), t.base().display().to_string()));
    // A log any uid could reopen: only Landlock can refuse `/proc/self/fd/2` (a host file).
    std::fs::create_dir_all(&spec.sandbox_dir).unwrap();
    let log = spec.sandbox_dir.join("agent.log");
    std::fs::write(&log, "").unwrap();
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o666)).unwrap();
    let uid_base = spec.uid_base;
    let jail = Jail::must_start(spec);
    assert!(jail.spawned().setup_ms > 0.0);
    let f = jail.result();

    // Users: root inside, an unprivileged range outside.
    assert_eq!(f.get("uid"), "0");
    assert_eq!(f.get("uid_map").trim(), format!("0 {uid_base} 65536"));
    assert_eq!(
        f.get("passwd_owner"),
        "0:0",
        "template files must look root-owned inside"
    );
    // Processes and files of the host are invisible.
    let pids: u32 = f.get("pids").parse().unwrap();
    assert!(pids < 10, "sees {pids} pids");
    assert_eq!(f.get("work_visible"), "no");
    assert_eq!(f.get("base_visible"), "no");
    // Own hostname, loopback only and up.
    assert_eq!(f.get("hostname"), "sbx-iso");
    // The cgroup namespace is rooted at the sandbox's own cgroups.
    assert_eq!(f.get("cgroup_nonroot"), "0", "host cgroup paths leak in");
    assert_eq!(f.get("net").trim(), "lo");
    let flags = u32::from_str_radix(f.get("lo_flags").trim_start_matches("0x"), 16).unwrap();
    assert_eq!(flags & 1, 1, "lo is up");
    // Privileges.
    assert_eq!(f.get("NoNewPrivs"), "1");
    assert_eq!(f.get("Seccomp"), "2");
    for set in ["CapEff", "CapBnd", "CapPrm"] {
        let caps = u64::from_str_radix(f.get(set), 16).unwrap();
        assert_eq!(caps & (1 << 21), 0, "{set} has CAP_SYS_ADMIN");
        assert_eq!(caps & (1 << 13), 0, "{set} has CAP_NET_RAW");
        assert_eq!(caps & (1 << 19), 0, "{set} has CAP_SYS_PTRACE");
    }
    assert_eq!(f.get("CapAmb"), "0000000000000000");
    // procfs: kernel-wide files masked, knobs read-only; the agent binary read-only.
    for file in ["kcore", "kallsyms", "keys", "timer_list", "sched_debug"] {
        let v = f.get(&format!("proc_{file}"));
        assert!(v == "0" || v == "absent", "/proc/{file} leaks {v} bytes");
    }
    assert!(
        f.get("proc_sys").contains("Read-only"),
        "{}",
        f.get("proc_sys")
    );
    let sysrq = f.get("sysrq");
    assert!(sysrq.contains("Read-only") || sysrq == "absent", "{sysrq}");
    assert!(
        f.get("agent_write").contains("Read-only"),
        "{}",
        f.get("agent_write")
    );
    assert_eq!(f.get("tmp_fs"), "tmpfs");
    // seccomp, capabilities and Landlock, call by call.
    for call in [
        "mount",
        "umount2",
        "setns",
        "ptrace",
        "keyctl",
        "add_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "open_by_handle_at",
        "init_module",
        "kexec_load",
        "chroot",
        "pivot_root",
        "open_tree",
        "fsopen",
        "process_vm_readv",
        "settimeofday",
        "iopl",
        "syslog",
        "sethostname",
        "personality_rie",
        "clone_newuser",
        "socket_packet",
        "socket_inet_raw",
        "socket_vsock",
        "socket_alg",
        "ioctl_tiocsti",
        "mknod_blk",
        "unshare_mnt",
        "unshare_user",
    ] {
        assert_eq!(f.get(call), "EPERM", "{call}");
    }
    assert_eq!(f.get("clone3"), "ENOSYS", "clone3 must look unimplemented");
    for call in ["personality_query", "socket_inet_tcp", "socket_unix"] {
        assert_eq!(f.get(call), "OK", "{call} must stay allowed");
    }
    assert_eq!(
        f.get("landlock_reopen_log"),
        "EACCES",
        "Landlock must refuse host files"
    );
    assert_eq!(
        f.get("abi_int80"),
        "SIGSYS",
        "the 32-bit ABI must be killed"
    );
    assert_eq!(f.get("abi_x32"), "SIGSYS", "the x32 ABI must be killed");

    // Writes landed in the upper layer, owned by the sandbox's uid; the template is unchanged.
    let written = jail.upper().join("etc/hutch-written");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "hello\n");
    assert_eq!(written.metadata().unwrap().uid(), uid_base);
    assert!(std::fs::read_to_string(jail.upper().join("etc/passwd"))
        .unwrap()
        .contains("intruder"));
    assert!(!std::fs::read_to_string(t.rootfs.join("etc/passwd"))
        .unwrap()
        .contains("intruder"));
    assert!(!t.rootfs.join("etc/hutch-written").exists());
    assert!(wait_until_blocking(Duration::from_secs(10), || jail.exited().then_some(())).is_some());
    drop(jail);
    assert_eq!(t.digest(), before, "the template changed");
}

#[test]
fn destroy_leaves_nothing_and_keeps_the_template() {
    if !is_root() {
        return;
    }
    let t = Template::new();
    let before = t.digest();
    let script = "mkdir -p /root/a/b/c && echo data > /root/a/b/c/f && echo ready > /result && exec sleep 3600";
    let jail = Jail::must_start(t.spec("destroy", script));
    jail.result();
    let s = jail.spawned().clone();
    assert!(init_alive(s.init_pid, s.init_start_time));
    assert!(!leftovers(t.base(), &jail.spec.id).is_empty());
    assert!(jail.spec.agent_socket.exists());

    let td = jail.teardown();
    destroy(&td).unwrap();
    assert!(!init_alive(s.init_pid, s.init_start_time));
    assert_eq!(leftovers(t.base(), &jail.spec.id), Vec::<String>::new());
    assert!(!jail.spec.sandbox_dir.exists());
    for c in &s.cgroups {
        assert!(!c.exists(), "{} left", c.display());
    }
    assert_eq!(t.digest(), before, "the template changed");
    // Idempotent.
    destroy(&td).unwrap();
}

#[test]
fn failed_spawns_leave_nothing() {
    if !is_root() {
        return;
    }
    let t = Template::new();

    // Parent side: no template.
    let mut spec = t.spec("notemplate", "true");
    spec.template_rootfs = t.base().join("does-not-exist");
    let (guard, r) = Jail::start(spec);
    let e = r.expect_err("must fail");
    let msg = e.to_string();
    assert!(
        msg.contains("template_rootfs") && msg.contains("does-not-exist"),
        "{msg}"
    );
    assert!(matches!(e, JailError::InvalidSpec(_)), "{e:?}");
    assert!(!guard.spec.sandbox_dir.exists());
    assert_eq!(leftovers(t.base(), &guard.spec.id), Vec::<String>::new());

    // Child side, inside the new namespaces: a template whose /dev is not a directory.
    let broken = t.base().join("broken");
    std::fs::create_dir(&broken).unwrap();
    for d in ["bin", "etc", "proc", "sys", "tmp"] {
        std::fs::create_dir(broken.join(d)).unwrap();
    }
    std::fs::write(broken.join("dev"), "not a directory").unwrap();
    let mut spec = t.spec("baddev", "true");
    spec.template_rootfs = broken;
    let (guard, r) = Jail::start(spec);
    let e = r.expect_err("must fail");
    let msg = e.to_string();
    assert!(
        msg.contains("dev is not a directory") && msg.contains("ENOTDIR"),
        "{msg}"
    );
    assert!(matches!(e, JailError::Setup(_)), "{e:?}");
    assert!(!guard.spec.sandbox_dir.exists());
    assert_eq!(leftovers(t.base(), &guard.spec.id), Vec::<String>::new());

    // The very last step: execve of something that is not a program.
    let not_elf = t.base().join("not-elf");
    std::fs::write(&not_elf, "plain text\n").unwrap();
    std::fs::set_permissions(&not_elf, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut spec = t.spec("noexec", "true");
    spec.agent_binary = not_elf;
    let (guard, r) = Jail::start(spec);
    let e = r.expect_err("must fail");
    let msg = e.to_string();
    assert!(
        msg.contains("execve /.hutch/hutch-agent") && msg.contains("ENOEXEC"),
        "{msg}"
    );
    assert!(matches!(e, JailError::Setup(_)), "{e:?}");
    eprintln!("child-side error as reported: {msg}");
    assert!(!guard.spec.sandbox_dir.exists());
    assert!(!guard.spec.agent_socket.exists());
    assert_eq!(leftovers(t.base(), &guard.spec.id), Vec::<String>::new());
}

#[test]
fn memory_limit_kills_and_is_reported() {
    if !is_root() {
        return;
    }
    let t = Template::new();
    let script = "/bin/probe alloc 512 > /dev/null; echo \"alloc_rc=$?\" > /result.tmp; mv /result.tmp /result; exec sleep 3600";
    let mut spec = t.spec("memory", script);
    spec.limits.memory_bytes = 64 << 20;
    let jail = Jail::must_start(spec);
    let f = jail.result();
    assert_eq!(
        f.get("alloc_rc"),
        "137",
        "the allocation must be SIGKILLed by the OOM killer"
    );
    let stats = cgroup_stats(&jail.spawned().cgroups);
    assert!(stats.oom_kills >= 1, "{stats:?}");
    assert_eq!(stats.memory_limit_bytes, 64 << 20);
    assert!(stats.memory_bytes <= 64 << 20);
    assert!(stats.pids_current >= 1);
    let s = jail.spawned();
    assert!(
        init_alive(s.init_pid, s.init_start_time),
        "the init survives"
    );
}

#[test]
fn pids_limit_stops_a_fork_bomb() {
    if !is_root() {
        return;
    }
    let t = Template::new();
    let script = "/bin/probe forks 1000 > /result.tmp; mv /result.tmp /result";
    let mut spec = t.spec("pids", script);
    spec.limits.pids_max = 16;
    let jail = Jail::must_start(spec);
    let f = jail.result();
    let line = f.get("forked");
    let (n, err) = line.split_once(" then ").unwrap();
    assert_eq!(err, "EAGAIN", "{line}");
    assert!(n.parse::<u32>().unwrap() < 16, "{line}");
    // The host is fine.
    assert!(Command::new("/bin/true").status().unwrap().success());
}

#[test]
fn two_jails_cannot_see_each_other() {
    if !is_root() {
        return;
    }
    let t = Template::new();
    let a = Jail::must_start(t.spec(
        "a",
        "echo A > /a-marker; echo ready > /result; exec sleep 3601",
    ));
    a.result();
    let script = r#"
exec >/result.tmp
[ -e /a-marker ] && echo saw_a_file=yes || echo saw_a_file=no
echo "saw_a_proc=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' ' | grep -c 'sleep 360[1]')"
echo "pids=$(ls /proc | grep -c '^[0-9]')"
mv /result.tmp /result
"#;
    let b = Jail::must_start(t.spec("b", script));
    let f = b.result();
    assert_eq!(f.get("saw_a_file"), "no");
    assert_eq!(f.get("saw_a_proc"), "0");
    assert!(f.get("pids").parse::<u32>().unwrap() < 10);
    assert!(a.upper().join("a-marker").exists());
    assert!(!b.upper().join("a-marker").exists());
    // Different uid ranges and pid namespaces from the host's point of view too.
    assert_ne!(a.spec.uid_base, b.spec.uid_base);
    let ns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap();
    let pa = a.spawned().init_pid;
    assert_ne!(ns(pa), std::fs::read_link("/proc/self/ns/pid").unwrap());
    assert!(wait_until_blocking(Duration::from_secs(10), || b.exited().then_some(())).is_some());
}

#[test]
fn freeze_thaw_and_cpu_limit() {
    if !is_root() {
        return;
    }
    let t = Template::new();
    let script = "i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; done";
    let mut spec = t.spec("freeze", script);
    spec.limits.cpu_millis = 200;
    let jail = Jail::must_start(spec);
    let s = jail.spawned().clone();
    let counter_path = format!("/proc/{}/root/tmp/counter", s.init_pid);
    let counter = || -> u64 {
        wait_until_blocking(Duration::from_secs(10), || {
            std::fs::read_to_string(&counter_path)
                .ok()
                .and_then(|t| t.trim().parse().ok())
        })
        .expect("counter")
    };
    counter();

    // CPU bandwidth: a busy loop gets about 0.2 CPU.
    let c0 = cgroup_stats(&s.cgroups).cpu_usage_ns;
    let w0 = Instant::now();
    std::thread::sleep(Duration::from_millis(1000));
    let used = cgroup_stats(&s.cgroups).cpu_usage_ns - c0;
    let share = used as f64 / w0.elapsed().as_nanos() as f64;
    assert!(share > 0.02 && share < 0.35, "cpu share {share}");

    let before = counter();
    freeze(&s.cgroups).unwrap();
    // Frozen between truncate and write, the file may stay empty: compare raw contents.
    let raw = || std::fs::read_to_string(&counter_path).unwrap_or_default();
    let frozen = raw();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(raw(), frozen, "frozen sandbox kept running");
    thaw(&s.cgroups).unwrap();
    assert!(
        wait_until_blocking(Duration::from_secs(5), || (counter() > before)
            .then_some(()))
        .is_some(),
        "thawed sandbox did not resume"
    );
    let stats = cgroup_stats(&s.cgroups);
    assert_eq!(stats.memory_limit_bytes, 256 << 20);
    assert!(stats.pids_current >= 1);
    // Destroy also works on a frozen sandbox.
    freeze(&s.cgroups).unwrap();
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn bench_spawn_true_destroy_vs_bwrap() {
    if !is_root() {
        return;
    }
    const N: u32 = 50;
    let t = Template::new();
    let mut setup_ms = 0.0;
    let (mut spawn_t, mut run_t, mut destroy_t) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    // HUTCH_BENCH_GAP_MS: idle time between sandboxes (cold kernel paths, like a quiet server).
    let gap = std::env::var("HUTCH_BENCH_GAP_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis);
    for i in 0..N {
        std::thread::sleep(gap);
        let mut spec = t.spec(&format!("bench{i}"), "");
        spec.agent_args = vec!["/bin/true".into()];
        let w = Instant::now();
        let jail = Jail::must_start(spec);
        let w1 = Instant::now();
        // The init is this process's child once the helper has exited (subreaper).
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(jail.spawned().init_pid, &mut status, 0) };
        assert_eq!(r, jail.spawned().init_pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        let w2 = Instant::now();
        destroy(&jail.teardown()).unwrap();
        let w3 = Instant::now();
        spawn_t += w1 - w;
        run_t += w2 - w1;
        destroy_t += w3 - w2;
        setup_ms += jail.spawned().setup_ms;
    }
    let total = spawn_t + run_t + destroy_t;
    let mut bwrap = Duration::ZERO;
    for _ in 0..N {
        let w = Instant::now();
        let st = Command::new("bwrap")
            .args(["--unshare-all", "--ro-bind", "/", "/", "true"])
            .status()
            .unwrap();
        assert!(st.success());
        bwrap += w.elapsed();
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0 / f64::from(N);
    println!(
        "hutch jail: spawn + true + destroy {:.2} ms (helper round trip {:.2}, of which setup_ms {:.2}; \
         run {:.2}; destroy {:.2}); bwrap --unshare-all true {:.2} ms (mean of {N})",
        ms(total),
        ms(spawn_t),
        setup_ms / f64::from(N),
        ms(run_t),
        ms(destroy_t),
        ms(bwrap)
    );
}
