//! `hutch serve`: build missing templates, start the manager, serve the API.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use hutch_core::{Config, Manager};
use hutch_template::{BuildOptions, Progress, TemplateStore};

/// Options of `hutch serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Read settings from this TOML file: each key is a flag's long name (`listen`,
    /// `object-store`, …) and its value what the flag takes (a string or number, `true` for a
    /// switch, an array for a flag given several times). A flag on the command line, or its
    /// environment variable, wins over the file (`docs/configuration.md`).
    #[arg(long, env = "HUTCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// Where to serve sandboxes' web services to browsers, each on its own origin
    /// `{port}-{sandbox id}.{preview-domain}`, apart from the API's: an address, `auto` (the
    /// `--listen` address with the next port, or a free port when that one is 0) or `off`
    /// (browser links then open on the API origin).
    #[arg(long, env = "HUTCH_PREVIEW_LISTEN", default_value = "auto")]
    pub preview_listen: PreviewListen,
    /// Domain of the preview origin's host names (`localhost` works in browsers on this
    /// machine: they resolve `*.localhost` to loopback; elsewhere use a domain with a
    /// wildcard DNS record pointing here).
    #[arg(long, env = "HUTCH_PREVIEW_DOMAIN", default_value = "localhost")]
    pub preview_domain: String,
    /// Serve the E2B-compatible API (`docs/e2b.md`) on this address: set both
    /// `E2B_API_URL` and `E2B_SANDBOX_URL` to `http://` it (port 0 picks a free port; the
    /// chosen address is printed). Off unless given.
    #[arg(long, env = "HUTCH_E2B_LISTEN")]
    pub e2b_listen: Option<SocketAddr>,
    /// Domain of the E2B API's sandbox host names, `{port}-{sandbox id}.{e2b-domain}`, as
    /// `get_host(port)` names them (resolve them here: `*.localhost` is loopback for most
    /// clients; elsewhere a wildcard DNS record or `/etc/hosts` entries).
    #[arg(long, env = "HUTCH_E2B_DOMAIN", default_value = "e2b.localhost")]
    pub e2b_domain: String,
    /// Serve TLS on every listener (the API, the preview origin, the E2B API) with this PEM
    /// certificate chain, leaf first (needs `--tls-key`). The E2B API then offers HTTP/2 by
    /// ALPN; the others HTTP/1.1. See docs/tls.md.
    #[arg(long, env = "HUTCH_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert` (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "HUTCH_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Templates directory (default `<state-dir>/templates`).
    #[arg(long)]
    pub templates_dir: Option<PathBuf>,
    /// The static hutch-agent binary (default: found next to this executable).
    #[arg(long)]
    pub agent: Option<PathBuf>,
    /// Do not build the `base` template on start when it is missing.
    #[arg(long)]
    pub no_build_base: bool,
    /// Template used when a create names none.
    #[arg(long, default_value = "base")]
    pub default_template: String,
    /// Default TTL of ephemeral sandboxes, in seconds.
    #[arg(long, default_value_t = 300)]
    pub default_ttl: u64,
    /// Timeout of an exec request that sets no `timeout_seconds`, in seconds (`hutch exec`
    /// and `hutch run` send none: they wait like `docker exec`).
    #[arg(long, default_value_t = 60.0)]
    pub default_exec_timeout: f64,
    /// How often to look for expired sandboxes, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub reaper_interval_ms: u64,
    /// How often to compare the host with the records while serving, in seconds: processes,
    /// cgroups, mounts and directories of sandboxes no record names are removed (and
    /// counted in `hutch_reconciled_total`). Also done at start and at shutdown.
    #[arg(long, default_value_t = 60)]
    pub reconcile_interval_seconds: u64,
    /// Cache of the vm backend: guest kernel, initramfs, template images, snapshots
    /// (default `<state-dir>/vm`; several servers may share one).
    #[arg(long)]
    pub vm_dir: Option<PathBuf>,
    /// QEMU binary of the vm backend.
    #[arg(long, default_value = "qemu-system-x86_64")]
    pub qemu: PathBuf,
    /// An unpacked Debian linux-image-*-cloud-amd64 package to boot vm guests with, instead
    /// of fetching one with apt-get download.
    #[arg(long)]
    pub vm_kernel_root: Option<PathBuf>,
    /// Warm vm guests kept ready (restored, warmed up, paused) for each template and guest
    /// size that vm sandboxes were created with; a create claims one instead of restoring
    /// (0: restore on every create). Each costs ~40 MiB of host memory and no CPU.
    #[arg(long, default_value_t = 2)]
    pub vm_warm: usize,
    /// How memory snapshots of running vm guests (named snapshots, live forks) are taken:
    /// `capture` (device state saved alone, RAM copied out of QEMU; a full stream if that
    /// fails) or `stream` (always a full migration stream, loaded by a paused QEMU: slower).
    #[arg(long, env = "HUTCH_VM_SNAPSHOT", value_enum, default_value_t = VmSnapshotArg::Capture)]
    pub vm_snapshot: VmSnapshotArg,
    /// Most bytes of each vm guest's serial console the server keeps on disk (in two files
    /// of half that size; older output is dropped; at least 4096).
    #[arg(long, env = "HUTCH_VM_CONSOLE_BYTES", default_value_t = hutch_core::config::DEFAULT_VM_CONSOLE_BYTES)]
    pub vm_console_bytes: u64,
    /// Deadline in seconds of every host command the server waits on (the ns jail helper,
    /// nft, mkfs, qemu-img, ...): past it the command is killed, what its step made is
    /// removed, and the API answers 504 `host_timeout` naming the step (at least 1).
    #[arg(long, env = "HUTCH_HOST_COMMAND_TIMEOUT_SECONDS", default_value_t = hutch_host_command::DEFAULT_TIMEOUT.as_secs())]
    pub host_command_timeout_seconds: u64,
    /// Size in GiB of the btrfs image (`<state-dir>/layers.btrfs`) holding ns sandboxes'
    /// writable layers, each a subvolume limited to the sandbox's `disk_mib`; allocated on
    /// the state disk when made, so a full host never takes its blocks (default: half the
    /// state disk's free space, at most 64 GiB; it must leave the state disk's reserve free;
    /// 0: no image, `disk_mib` is not enforced on ns). Without btrfs or mkfs.btrfs ns
    /// sandboxes have no disk limit.
    #[arg(long, env = "HUTCH_NS_DISK_POOL_GIB")]
    pub ns_disk_pool_gib: Option<u64>,
    /// The directory of host-wide uid slot claims, shared by every hutch server on this
    /// host so that no two give sandboxes the same uid range (per boot, under /run).
    #[arg(long, env = "HUTCH_UID_SLOTS_DIR", default_value = hutch_core::config::DEFAULT_UID_SLOTS_DIR)]
    pub uid_slots_dir: PathBuf,
    /// How many uid ranges (of 65,536 ids) sandboxes may use: slots 16 to 16 + N - 1; at
    /// most 59984 (the default). A create finding every slot of the host taken is 429.
    #[arg(long, env = "HUTCH_UID_SLOTS", default_value_t = hutch_core::config::MAX_UID_SLOTS)]
    pub uid_slots: u32,
    /// Give sandboxes a network (`on`: a namespace, a veth, NAT and the egress policy,
    /// enforced in this server's network namespace with nftables; `off`: loopback only).
    #[arg(long, value_enum, default_value_t = NetworkMode::On)]
    pub network: NetworkMode,
    /// Private IPv4 pool sandbox addresses come from (one /30 each).
    #[arg(long, default_value = "10.213.0.0/16")]
    pub net_pool: String,
    /// Upstream DNS server for sandboxes' allowed queries (default: the first nameserver of
    /// /etc/resolv.conf).
    #[arg(long)]
    pub net_upstream_dns: Option<String>,
    /// Client connections open at most; past it the oldest idle connection of a client that
    /// has not authenticated is closed first (default: half the descriptor limit, at most
    /// 4096). See docs/limits.md.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Seconds a new connection has to send its first complete request head.
    #[arg(long, default_value_t = 10)]
    pub header_timeout_secs: u64,
    /// Seconds a keep-alive connection may stay idle between requests.
    #[arg(long, default_value_t = 120)]
    pub idle_timeout_secs: u64,
    /// Largest JSON request body (bytes, or with a KiB/MiB suffix); larger ones are answered
    /// 413. File uploads and streamed exec stdin are not limited by it.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub max_json_body: usize,
    /// Memory collected exec output may hold, server-wide, in MiB. Past it, reading exec
    /// output waits (back-pressure on the agent stream); one exec at a time may overdraw by
    /// its cap (both streams: 32 MiB by default), so held output stays under this + 4 MiB +
    /// twice --exec-output-cap. See docs/limits.md.
    #[arg(long, default_value_t = 256)]
    pub exec_output_budget_mib: usize,
    /// Output a collected exec (`POST …/exec`) keeps of each of stdout and stderr (bytes,
    /// or with a KiB/MiB suffix); the rest is read, dropped and flagged as truncated.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    pub exec_output_cap: usize,
    /// Execs (collected, streamed, PTY) one sandbox may run at once; more are answered 429.
    #[arg(long, default_value_t = 32)]
    pub max_execs_per_sandbox: usize,
    /// Network of template builds' `RUN` steps (`allow`: everything the server's deny list
    /// and blocked ports do not stop; `deny`: nothing; `none`: loopback only). Always
    /// `none` with `--network off`.
    #[arg(long, value_enum, default_value_t = BuildEgress::Allow)]
    pub build_egress: BuildEgress,
    /// Also trust this CA certificate (PEM) for registries that template builds pull from
    /// (a private registry's own CA); repeatable.
    #[arg(long, value_name = "FILE")]
    pub registry_ca: Vec<PathBuf>,
    /// Speak plain HTTP to this registry (`host` or `host:port`) in every template build;
    /// repeatable (a request may name more for itself).
    #[arg(long, value_name = "HOST")]
    pub insecure_registry: Vec<String>,
    /// The only registries (`host` or `host:port`; `docker.io` for Docker Hub) template
    /// builds may pull from; repeatable. Without it any, except that a tenant's build never
    /// pulls from the host's own addresses (loopback, link-local, cloud metadata).
    #[arg(long, value_name = "HOST")]
    pub allowed_registry: Vec<String>,
    /// Most template builds queued or running at once; more are answered 429.
    #[arg(long, default_value_t = 32)]
    pub max_builds: usize,
    /// Most template builds one tenant may have queued or running; more are answered 429.
    #[arg(long, default_value_t = 8)]
    pub max_builds_per_tenant: usize,
    /// Most bytes of file data an image may unpack to, all layers together, in MiB (a
    /// pull, an upload or a Dockerfile's `FROM`; checked while extracting, so a
    /// decompression bomb stops at it).
    #[arg(long, default_value_t = 8 * 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub image_max_mib: u64,
    /// Most entries (files, directories, links) an image may unpack to, all layers together.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub image_max_files: u64,
    /// Size of each new `RUN --mount=type=cache` volume (MiB; sparse: only what a build
    /// writes there uses disk). A tenant's caches are volumes named `build-cache-…`.
    #[arg(long, default_value_t = 10 * 1024, value_parser = clap::value_parser!(u64).range(4..=1 << 20))]
    pub build_cache_mib: u64,
    /// The server prunes the Dockerfile step cache (build snapshots) to at most this many
    /// MiB, least recently used first, every 10 minutes while no build runs (0: no limit).
    #[arg(long, default_value_t = 20 * 1024)]
    pub build_cache_max_mib: u64,
    /// ... and removes step cache entries no build has used for this many hours (0: kept
    /// however old).
    #[arg(long, default_value_t = 7 * 24)]
    pub build_cache_max_age_hours: u64,
    /// Largest build context a client may upload with `POST /v1/templates` (bytes, or with
    /// a KiB/MiB/GiB suffix), compressed or not; larger ones are answered 413.
    #[arg(long, default_value = "2GiB", value_parser = parse_size)]
    pub max_build_context: usize,
    /// TCP ports sandboxes may never connect to (comma-separated; default: Stratum mining
    /// ports; empty to allow all).
    #[arg(long, value_delimiter = ',')]
    pub net_blocked_ports: Option<Vec<u16>>,
    /// How often live sandboxes' CPU, memory and egress are metered, in seconds (may be a
    /// fraction; docs/usage.md).
    #[arg(long, env = "HUTCH_USAGE_INTERVAL_SECONDS", default_value_t = 5.0)]
    pub usage_interval_seconds: f64,
    /// How often the disk of snapshots, volumes and hibernated sandboxes is metered, in
    /// seconds.
    #[arg(
        long,
        env = "HUTCH_DISK_USAGE_INTERVAL_SECONDS",
        default_value_t = 60.0
    )]
    pub disk_usage_interval_seconds: f64,
    /// The append-only usage log, one JSON line per interval of each sandbox (default
    /// `<state-dir>/usage.jsonl`).
    #[arg(long, env = "HUTCH_USAGE_LOG")]
    pub usage_log: Option<PathBuf>,
    /// A rate card (JSON: `cpu_second_micros`, `memory_gib_second_micros`,
    /// `disk_gib_hour_micros`, `egress_gib_micros`) that turns usage into `cost_micros`;
    /// budgets then count cost micros (without one: CPU-seconds).
    #[arg(long, env = "HUTCH_RATE_CARD")]
    pub rate_card: Option<PathBuf>,
    /// What a reached spending cap does to the running sandboxes it covers.
    #[arg(long, value_enum, default_value_t = BudgetActionArg::Hibernate)]
    pub budget_action: BudgetActionArg,
    /// Cluster mode.
    #[command(flatten)]
    pub cluster: crate::serve_cluster::ClusterArgs,
}

/// `--budget-action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BudgetActionArg {
    /// Hibernate them (state kept on disk; no CPU or memory held).
    Hibernate,
    /// Pause them (frozen in memory).
    Pause,
}

/// `--preview-listen`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviewListen {
    /// Next to the API: its address, port + 1 (or a free port when the API's is 0).
    Auto,
    /// No preview origin.
    Off,
    /// This address.
    At(SocketAddr),
}

impl std::str::FromStr for PreviewListen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "off" => Ok(Self::Off),
            addr => addr.parse().map(Self::At).map_err(|e| {
                format!("expected `auto`, `off` or an address such as 127.0.0.1:7701: {e}")
            }),
        }
    }
}

impl PreviewListen {
    /// The address to bind, given the API's.
    fn address(self, api: SocketAddr) -> Option<SocketAddr> {
        match self {
            Self::Off => None,
            Self::At(a) => Some(a),
            Self::Auto => {
                let port = match api.port() {
                    0 => 0,
                    p => p.checked_add(1)?,
                };
                Some(SocketAddr::new(api.ip(), port))
            }
        }
    }
}

/// The preview domain must be a plain host name (it is matched against `Host`).
fn check_preview_domain(domain: &str) -> anyhow::Result<()> {
    let ok = !domain.is_empty()
        && domain.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !ok {
        bail!("--preview-domain {domain:?} is not a host name such as `localhost` or `preview.example.com`");
    }
    Ok(())
}

/// Whether sandboxes get a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetworkMode {
    /// Networking with egress policy.
    On,
    /// Loopback only.
    Off,
}

/// `--build-egress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BuildEgress {
    /// Everything not denied by the server.
    Allow,
    /// Nothing.
    Deny,
    /// No network interface besides loopback.
    None,
}

/// What build sandboxes get from `hutch serve`'s flags.
fn build_settings(args: &ServeArgs) -> hutch_build::BuildSettings {
    use hutch_core::net::policy::Egress;
    let mut settings = hutch_build::BuildSettings {
        registry_ca: args.registry_ca.clone(),
        insecure_registries: args.insecure_registry.clone(),
        allowed_registries: (!args.allowed_registry.is_empty())
            .then(|| args.allowed_registry.clone()),
        image_limits: hutch_build::Limits {
            max_bytes: args.image_max_mib.saturating_mul(1 << 20),
            max_files: args.image_max_files,
        },
        max_pending: args.max_builds.max(1),
        max_pending_per_tenant: args.max_builds_per_tenant.max(1),
        cache_mount_mib: args.build_cache_mib,
        auto_prune: hutch_build::PrunePolicy {
            all: false,
            unused_for: (args.build_cache_max_age_hours > 0)
                .then(|| Duration::from_secs(args.build_cache_max_age_hours.saturating_mul(3600))),
            keep_bytes: (args.build_cache_max_mib > 0)
                .then(|| args.build_cache_max_mib.saturating_mul(1 << 20)),
        },
        downloads: args.build_egress == BuildEgress::Allow,
        ..hutch_build::BuildSettings::default()
    };
    settings.network.egress = match (args.network, args.build_egress) {
        (NetworkMode::Off, _) | (_, BuildEgress::None) => Egress::None,
        (NetworkMode::On, BuildEgress::Deny) => Egress::Deny,
        (NetworkMode::On, BuildEgress::Allow) => Egress::Allow,
    };
    // A build sandbox's disk is fitted to the ns disk pool by the manager, whatever made
    // the pool's size (this flag, or the free space when it was made).
    settings
}

/// How memory snapshots of running vm guests are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VmSnapshotArg {
    /// Device state alone and RAM copied out of QEMU (a full stream if that fails).
    Capture,
    /// Always a full migration stream.
    Stream,
}

fn network_config(args: &ServeArgs) -> anyhow::Result<Option<hutch_core::net::NetConfig>> {
    if args.network == NetworkMode::Off {
        return Ok(None);
    }
    let mut nc = hutch_core::net::NetConfig::new();
    nc.pool = args
        .net_pool
        .parse()
        .map_err(|e| anyhow::anyhow!("--net-pool: {e}"))?;
    if let Some(dns) = &args.net_upstream_dns {
        nc.upstream_dns = match dns.parse::<SocketAddr>() {
            Ok(a) => a,
            Err(_) => SocketAddr::new(
                dns.parse()
                    .with_context(|| format!("--net-upstream-dns {dns:?} is not an IP address"))?,
                53,
            ),
        };
    }
    if let Some(ports) = &args.net_blocked_ports {
        nc.mining_ports = ports.clone();
    }
    Ok(Some(nc))
}

/// Build a template, printing progress to stderr.
pub fn build_template(
    store: &TemplateStore,
    name: &str,
    quiet: bool,
    options: &BuildOptions,
) -> anyhow::Result<()> {
    let mut progress = |p: Progress| match p {
        Progress::Step(s) => eprintln!("[template {name}] {s}"),
        Progress::Output(line) if !quiet => eprintln!("[template {name}]   {line}"),
        Progress::Output(_) | Progress::Transfer(_) => {}
        Progress::Done { seconds } => eprintln!("[template {name}] ready in {seconds:.1} s"),
    };
    store
        .build(name, options, &mut progress)
        .with_context(|| format!("building template {name}"))?;
    Ok(())
}

/// Every ancestor of `dir` must be searchable by other users: sandboxes run as unprivileged
/// host uids and the jail resolves paths under the state directory with those ids.
fn check_traversable(dir: &Path) -> anyhow::Result<()> {
    let mut cur = Some(dir);
    while let Some(p) = cur {
        let meta = std::fs::metadata(p).with_context(|| format!("stat {}", p.display()))?;
        if meta.permissions().mode() & 0o001 == 0 {
            bail!(
                "{} is not searchable by other users (mode {:o}); sandboxes run as unprivileged uids and need to traverse it: chmod o+x it or choose another --state-dir",
                p.display(),
                meta.permissions().mode() & 0o7777
            );
        }
        cur = p.parent();
    }
    Ok(())
}

/// Copy the agent into the state directory (world-readable), so sandboxes can map it even
/// when the build tree is private.
fn install_agent(src: &Path, state_dir: &Path) -> anyhow::Result<PathBuf> {
    let bin = state_dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755))?;
    let dst = bin.join("hutch-agent");
    let same = std::fs::read(&dst).ok()
        == Some(std::fs::read(src).with_context(|| format!("reading {}", src.display()))?);
    if !same {
        let tmp = bin.join(format!(".hutch-agent.{}", std::process::id()));
        std::fs::copy(src, &tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
        std::fs::rename(&tmp, &dst)?;
    }
    Ok(dst)
}

/// Run the server until SIGINT/SIGTERM. Sandboxes keep running after it stops.
pub async fn serve(args: ServeArgs, state_dir: PathBuf) -> anyhow::Result<()> {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        tracing::warn!("cannot become a child subreaper: exited sandboxes may linger as zombies");
    }
    let open_files = raise_open_files_limit();
    // A bad certificate or key fails here, before anything starts.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(hutch_server::serve::tls::TlsIdentity::load(cert, key)?),
        _ => None,
    };
    let acceptor = |alpn| -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
        Ok(match &tls {
            Some(identity) => Some(identity.acceptor(alpn)?),
            None => None,
        })
    };
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("creating state directory {}", state_dir.display()))?;
    std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o711))?;
    let sandboxes = state_dir.join("sandboxes");
    std::fs::create_dir_all(&sandboxes)?;
    std::fs::set_permissions(&sandboxes, std::fs::Permissions::from_mode(0o711))?;
    check_traversable(&sandboxes)?;
    let agent = install_agent(
        &crate::paths::find_agent(args.agent.as_deref())?,
        &state_dir,
    )?;
    let exe = std::env::current_exe().context("locating the hutch executable")?;
    let network = network_config(&args)?;
    let build_settings = build_settings(&args);
    let mut cfg = Config::new(state_dir.clone(), exe, agent);
    if let Some(t) = args.templates_dir {
        cfg.templates_dir = t;
    }
    cfg.default_template = args.default_template.clone();
    cfg.default_ttl_seconds = args.default_ttl;
    if !(args.default_exec_timeout.is_finite() && args.default_exec_timeout > 0.0) {
        bail!(
            "--default-exec-timeout must be a positive number of seconds, got {}",
            args.default_exec_timeout
        );
    }
    cfg.default_exec_timeout = Duration::from_secs_f64(args.default_exec_timeout);
    cfg.reaper_interval = Duration::from_millis(args.reaper_interval_ms.max(10));
    cfg.reconcile_interval = Duration::from_secs(args.reconcile_interval_seconds.max(1));
    cfg.network = network;
    if let Some(dir) = args.vm_dir.clone() {
        cfg.vm_dir = dir;
    }
    cfg.qemu = args.qemu.clone();
    cfg.vm_kernel_root = args.vm_kernel_root.clone();
    cfg.vm_warm = args.vm_warm;
    cfg.vm_snapshot = match args.vm_snapshot {
        VmSnapshotArg::Capture => hutch_core::config::VmSnapshotMethod::Capture,
        VmSnapshotArg::Stream => hutch_core::config::VmSnapshotMethod::Stream,
    };
    cfg.ns_disk_pool_bytes = args.ns_disk_pool_gib.map(|g| g << 30);
    cfg.vm_console_bytes = args.vm_console_bytes;
    hutch_host_command::set_timeout(Duration::from_secs(
        args.host_command_timeout_seconds.max(1),
    ));
    cfg.exec_output_budget_bytes = args.exec_output_budget_mib.max(1) << 20;
    cfg.output_cap_bytes = args.exec_output_cap;
    cfg.max_execs_per_sandbox = args.max_execs_per_sandbox.max(1);
    cfg.uid_slots_dir = args.uid_slots_dir.clone();
    cfg.uid_slots = args.uid_slots;
    for (name, v) in [
        ("--usage-interval-seconds", args.usage_interval_seconds),
        (
            "--disk-usage-interval-seconds",
            args.disk_usage_interval_seconds,
        ),
    ] {
        if !(v.is_finite() && (0.05..=86_400.0).contains(&v)) {
            bail!("{name} must be from 0.05 to 86400 seconds, got {v}");
        }
    }
    cfg.usage_interval = Duration::from_secs_f64(args.usage_interval_seconds);
    cfg.disk_usage_interval = Duration::from_secs_f64(args.disk_usage_interval_seconds);
    cfg.usage_log = args.usage_log.clone();
    if let Some(path) = &args.rate_card {
        cfg.rate_card = Some(hutch_core::usage::RateCard::load(path)?);
    }
    cfg.budget_action = match args.budget_action {
        BudgetActionArg::Hibernate => hutch_core::config::BudgetAction::Hibernate,
        BudgetActionArg::Pause => hutch_core::config::BudgetAction::Pause,
    };
    std::fs::create_dir_all(&cfg.templates_dir)?;
    let store = TemplateStore::open(&cfg.templates_dir)?;
    let mut wanted = vec!["minimal"];
    if !args.no_build_base {
        wanted.push("base");
    }
    for name in wanted {
        if store.get(name).is_none_or(|t| !t.ready) {
            let store = TemplateStore::open(&cfg.templates_dir)?;
            let name = name.to_string();
            tokio::task::spawn_blocking(move || {
                build_template(&store, &name, false, &BuildOptions::default())
            })
            .await??;
        }
    }
    let cluster_cfg = args.cluster.config(args.listen)?;
    let (manager, cluster) = match cluster_cfg {
        None => (Manager::start(cfg).await?, None),
        Some(cc) => {
            let (cluster, store) = crate::serve_cluster::join(cc).await?;
            let state_dir = cfg.state_dir.clone();
            let manager = Manager::start_with_store(cfg, store).await?;
            cluster
                .open_object_store(&manager, &state_dir)
                .await
                .context("opening the object store")?;
            cluster.run(manager.clone());
            (manager, Some(cluster))
        }
    };
    manager.ensure_admin_key().await?;
    // Build contexts a previous server was given (this one holds the state directory now):
    // their builds died with it.
    let builds = state_dir.join("builds");
    if builds.exists() {
        std::fs::remove_dir_all(&builds)
            .with_context(|| format!("removing old build contexts in {}", builds.display()))?;
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let mut state = hutch_server::AppState::new(manager.clone())
        .with_json_body_limit(args.max_json_body)
        .with_build_settings(build_settings)
        .with_context_limits(hutch_server::build_context::ContextLimits {
            max_bytes: args.max_build_context as u64,
            ..Default::default()
        });
    if tls.is_some() {
        state = state.with_tls();
    }
    state.builder().spawn_auto_prune();
    let scheme = state.scheme();
    let mut limits = hutch_server::serve::ConnectionLimits::for_descriptor_limit(open_files);
    if let Some(n) = args.max_connections {
        limits.max_connections = n.max(1);
    }
    limits.header_timeout = Duration::from_secs(args.header_timeout_secs.max(1));
    limits.idle_timeout = Duration::from_secs(args.idle_timeout_secs.max(1));
    let mut preview_server = None;
    let mut preview_router = None;
    let (preview_tx, preview_rx) = tokio::sync::oneshot::channel::<()>();
    if let Some(preview_addr) = args.preview_listen.address(args.listen) {
        check_preview_domain(&args.preview_domain)?;
        let preview_listener = tokio::net::TcpListener::bind(preview_addr)
            .await
            .with_context(|| {
                format!(
                    "listening on {preview_addr} for the preview origin (choose another with \
                     --preview-listen, or `off`)"
                )
            })?;
        let bound = preview_listener.local_addr()?;
        state = state.with_preview(hutch_server::PreviewOrigin {
            domain: args.preview_domain.to_ascii_lowercase(),
            port: bound.port(),
            scheme,
        });
        // Printed before the API line: tools that wait for that line have both.
        println!(
            "hutch preview on {scheme}://{bound} ({scheme}://{{port}}-{{sandbox id}}.{}:{})",
            args.preview_domain,
            bound.port()
        );
        let preview = hutch_server::preview_app(state.clone());
        preview_router = Some(preview.clone());
        // In a cluster, any node's preview origin answers for every sandbox.
        let preview = match &cluster {
            Some(c) => hutch_cluster::preview::layer(
                preview,
                c.clone(),
                args.preview_domain.to_ascii_lowercase(),
            ),
            None => preview,
        };
        // The same connection cap and timeouts as the API's (counted apart).
        preview_server = Some(tokio::spawn(hutch_server::serve::serve(
            preview_listener,
            preview,
            limits.clone(),
            acceptor(hutch_server::serve::tls::Alpn::Http1)?,
            Default::default(),
            async {
                let _ = preview_rx.await;
            },
        )));
    }
    let mut e2b_server = None;
    let mut e2b_router = None;
    let (e2b_tx, e2b_rx) = tokio::sync::oneshot::channel::<()>();
    if let Some(e2b_addr) = args.e2b_listen {
        let e2b_listener = tokio::net::TcpListener::bind(e2b_addr)
            .await
            .with_context(|| format!("listening on {e2b_addr} for the E2B API"))?;
        let bound = e2b_listener.local_addr()?;
        // In a cluster, any node's E2B listener answers for every sandbox (`hutch-cluster`'s
        // `e2b.rs`): creates are placed, calls on a sandbox go to its node.
        let routing = cluster.as_ref().map(|c| {
            hutch_cluster::e2b::E2bRouting::new(c.clone(), state.clone())
                as std::sync::Arc<dyn hutch_e2b::ClusterRoute>
        });
        let e2b = hutch_e2b::router_routed(
            state.clone(),
            hutch_e2b::E2bConfig {
                domain: args.e2b_domain.to_ascii_lowercase(),
                port: bound.port(),
            },
            routing,
        );
        e2b_router = Some(e2b.clone());
        // Printed before the API line: tools that wait for that line have both.
        println!("hutch E2B API on {scheme}://{bound}");
        // The E2B SDKs speak HTTP/1.1 to plaintext URLs and HTTP/2 by ALPN under TLS; other
        // clients may want h2c.
        let mut e2b_limits = limits.clone();
        e2b_limits.h2c = true;
        e2b_server = Some(tokio::spawn(hutch_server::serve::serve(
            e2b_listener,
            e2b,
            e2b_limits,
            acceptor(hutch_server::serve::tls::Alpn::Http2AndHttp1)?,
            Default::default(),
            async {
                let _ = e2b_rx.await;
            },
        )));
    }
    println!("hutch listening on {scheme}://{addr}");
    println!("admin key in {}", manager.admin_key_path().display());
    let stats = state.connection_stats();
    let app = match cluster {
        None => hutch_server::app(state),
        Some(cluster) => {
            println!("hutch node {} in the cluster", cluster.node_id());
            let app = hutch_server::app(state.clone())
                .merge(hutch_cluster::api::router(cluster.clone(), state.clone()));
            let listeners = hutch_cluster::routing::Listeners {
                e2b: e2b_router,
                preview: preview_router,
            };
            hutch_cluster::routing::layer(app, cluster, state, listeners)
        }
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hutch_server::serve::serve(
        listener,
        app,
        limits,
        acceptor(hutch_server::serve::tls::Alpn::Http1)?,
        stats,
        async {
            let _ = rx.await;
        },
    ));
    shutdown_signal().await;
    tracing::info!("shutting down; sandboxes keep running and are re-adopted on the next start");
    let _ = tx.send(());
    let _ = preview_tx.send(());
    let _ = e2b_tx.send(());
    // Long-lived streams (events, PTYs, WebSockets) would hold graceful shutdown forever:
    // cap it.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = server.await;
        if let Some(preview) = preview_server {
            let _ = preview.await;
        }
        if let Some(e2b) = e2b_server {
            let _ = e2b.await;
        }
    })
    .await;
    // TTL refreshes are kept in memory between flushes.
    manager.flush_refreshes().await;
    // Warm vm guests are not sandboxes: nothing would re-adopt them.
    manager.drain_warm().await;
    // What sandboxes that moved to other nodes (or that no record names) left here goes
    // first; the ns disk pool stays mounted while sandboxes (to re-adopt) have their files
    // there.
    manager.remove_orphans().await;
    manager.release_disk_pool().await;
    Ok(())
}

/// A size such as `1048576`, `512KiB` or `1MiB`.
fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        other => return Err(format!("unknown size unit {other:?} (use KiB, MiB or GiB)")),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size such as 1048576, 512KiB or 1MiB"))?;
    n.checked_mul(1usize << shift)
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("{s:?} is not a usable size"))
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (every client connection, agent socket
/// and sandbox descriptor counts against it) and return the limit now in force.
fn raise_open_files_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        tracing::warn!("cannot read RLIMIT_NOFILE; sizing the connection cap for 1024");
        return 1024;
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    tracing::info!(
        before,
        now = lim.rlim_cur,
        hard = lim.rlim_max,
        "open files limit (RLIMIT_NOFILE)"
    );
    lim.rlim_cur
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => std::future::pending::<()>().await,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1 parsec").is_err());
    }
}
