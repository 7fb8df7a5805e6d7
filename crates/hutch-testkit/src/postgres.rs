//! A PostgreSQL server of a test's own: Debian's `postgresql-15` binaries, `initdb` into a
//! temporary directory owned by the `postgres` user (the server refuses to run as root),
//! listening on a free port of the address the test chooses and on a Unix socket in that
//! directory. Dropping it stops the server (fast shutdown, by its pid) and removes the
//! directory.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The superuser the cluster is made with (trust authentication: only this machine's
/// test processes reach it).
const SUPERUSER: &str = "hutch";

/// A running PostgreSQL server of the test's own (see the module docs).
pub struct PrivatePostgres {
    root: PathBuf,
    bin: PathBuf,
    listen: IpAddr,
    port: u16,
    child: Option<Child>,
    /// Settings given to the server (`-c name=value`) beyond the fixture's own.
    settings: Vec<String>,
}

/// The newest `/usr/lib/postgresql/<major>/bin` holding `initdb`.
fn bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed (scripts/deps.sh installs postgresql-15)")
        .filter_map(|e| {
            let e = e.ok()?;
            let major: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((major, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .expect("no PostgreSQL initdb under /usr/lib/postgresql")
        .1
}

fn free_port(addr: IpAddr) -> u16 {
    TcpListener::bind((addr, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `cmd` run as the `postgres` user (setpriv execs it: the pid is the program's).
fn as_postgres(program: &Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=postgres",
        "--regid=postgres",
        "--init-groups",
        "--",
    ])
    .arg(program);
    cmd
}

impl PrivatePostgres {
    /// Make a cluster and start it on loopback.
    pub fn start() -> Self {
        Self::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Make a cluster and start it listening on `listen` (an address of this network
    /// namespace, such as a test bridge's).
    pub fn start_on(listen: IpAddr) -> Self {
        let root = tempfile::Builder::new()
            .prefix("hutch-pg-")
            .tempdir_in("/tmp")
            .expect("tempdir")
            .keep();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let chown = Command::new("chown")
            .arg("postgres:postgres")
            .arg(&root)
            .status()
            .expect("chown");
        assert!(chown.success(), "chown {}", root.display());
        let bin = bin_dir();
        let out = as_postgres(&bin.join("initdb"))
            .args(["-D"])
            .arg(root.join("data"))
            .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut pg = Self {
            root,
            bin,
            listen,
            port: free_port(listen),
            child: None,
            settings: Vec::new(),
        };
        pg.launch();
        pg
    }

    /// [`PrivatePostgres::start`] speaking TLS only over TCP, with `ca`'s certificate for
    /// 127.0.0.1: a TCP connection without TLS is refused (`pg_hba.conf` has only
    /// `hostssl` lines); psql keeps the unix socket.
    pub fn start_with_tls(ca: &crate::TestCa) -> Self {
        let mut pg = Self::start();
        pg.stop();
        for (from, name, mode) in [
            (ca.cert(), "server.crt", 0o644),
            (ca.key(), "server.key", 0o600),
        ] {
            let to = pg.root.join(name);
            std::fs::copy(&from, &to).expect("copy the certificate");
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let chown = Command::new("chown")
                .arg("postgres:postgres")
                .arg(&to)
                .status()
                .expect("chown");
            assert!(chown.success(), "chown {}", to.display());
        }
        std::fs::write(
            pg.root.join("data/pg_hba.conf"),
            "local all all trust
hostssl all all 127.0.0.1/32 trust
hostssl all all ::1/128 trust
",
        )
        .expect("write pg_hba.conf");
        pg.settings = vec![
            "ssl=on".into(),
            format!("ssl_cert_file={}", pg.root.join("server.crt").display()),
            format!("ssl_key_file={}", pg.root.join("server.key").display()),
        ];
        pg.launch();
        pg
    }

    fn launch(&mut self) {
        let log = std::fs::File::create(self.root.join("server.log")).expect("server log");
        let child = as_postgres(&self.bin.join("postgres"))
            .arg("-D")
            .arg(self.root.join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&self.root)
            .args(["-c", &format!("listen_addresses={}", self.listen)])
            .args(["-c", "fsync=off", "-c", "max_connections=300"])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start postgres");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args([
                    "-q",
                    "-h",
                    &self.listen.to_string(),
                    "-p",
                    &self.port.to_string(),
                ])
                .status()
                .expect("pg_isready");
            if ready.success() {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("postgres exited ({status}): {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default()
    }

    /// The address and port it listens on.
    pub fn addr(&self) -> (IpAddr, u16) {
        (self.listen, self.port)
    }

    /// Make database `name` and return its `postgres://` URL.
    pub fn create_database(&self, name: &str) -> String {
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\""));
        self.url(name)
    }

    /// The URL of database `name`.
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgres://{SUPERUSER}@{}:{}/{name}",
            self.listen, self.port
        )
    }

    /// Run one SQL statement in database `db` with psql, returning what it printed
    /// (unaligned, tuples only).
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.root)
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                SUPERUSER,
                "-d",
                db,
                "-c",
                sql,
            ])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Stop the server (fast shutdown: clients are disconnected) and wait for it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: signalling the pid of the child this fixture started and has not reaped.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop the server, then start it again on the same address and port (its data kept).
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Start it again after [`PrivatePostgres::stop`].
    pub fn start_again(&mut self) {
        if self.child.is_none() {
            self.launch();
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
