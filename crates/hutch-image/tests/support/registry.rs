//! A real registry for tests: Debian's `docker-registry` on a free loopback port, with TLS
//! from a CA the test makes (openssl) and htpasswd basic auth (`htpasswd -B`), storing into
//! a temporary directory. Images are pushed from OCI layouts with `skopeo copy`. The
//! registry is stopped by its pid and its directory removed when the value is dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// User and password the registry accepts.
pub const USER: &str = "hutch";
/// The password.
pub const PASSWORD: &str = "correct horse";

/// A running registry.
pub struct Registry {
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// The test CA's certificate (PEM).
    pub ca: PathBuf,
    /// Where the registry stores blobs (`docker/registry/v2/...`).
    pub storage: PathBuf,
    /// The working directory (certificates, config, storage, layouts).
    pub dir: tempfile::TempDir,
    /// The registry process.
    child: Child,
}

/// Runs a command, panicking with its output if it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Makes a CA and a server certificate for 127.0.0.1 signed by it, in `dir`.
fn make_certificates(dir: &Path) {
    let ssl = |args: &[&str]| {
        run(Command::new("openssl").args(args).current_dir(dir));
    };
    ssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=hutch test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    ssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("write san.ext");
    ssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    ]);
}

impl Registry {
    /// Starts a registry and waits until it accepts connections.
    pub fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("hutch-registry-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        make_certificates(d);
        run(Command::new("htpasswd")
            .args(["-Bbc"])
            .arg(d.join("htpasswd"))
            .args([USER, PASSWORD]));
        let storage = d.join("storage");
        std::fs::create_dir(&storage).expect("mkdir storage");
        let port = free_port();
        let host = format!("127.0.0.1:{port}");
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {storage}\n\
             http:\n  addr: {host}\n  tls:\n    certificate: {d}/server.pem\n    key: {d}/server.key\n\
             auth:\n  htpasswd:\n    realm: hutch-test\n    path: {d}/htpasswd\n",
            storage = storage.display(),
            d = d.display(),
        );
        std::fs::write(d.join("config.yml"), config).expect("write config");
        let log = std::fs::File::create(d.join("registry.log")).expect("log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(d.join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start docker-registry (apt-get install docker-registry)");
        let mut registry = Self {
            host,
            ca: d.join("ca.pem"),
            storage,
            dir,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&registry.host).is_err() {
            if let Ok(Some(status)) = registry.child.try_wait() {
                panic!("docker-registry exited with {status}: {}", registry.log());
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen: {}",
                registry.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    /// The registry's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Pushes the OCI layout at `layout` (tag `tag`) to `repo:tag`; `all` pushes every
    /// platform of an index, `docker_v2` converts to a Docker schema 2 manifest.
    pub fn push(&self, layout: &Path, tag: &str, repo: &str, all: bool, docker_v2: bool) -> String {
        let policy = self.dir.path().join("policy.json");
        std::fs::write(
            &policy,
            r#"{"default": [{"type": "insecureAcceptAnything"}]}"#,
        )
        .expect("policy");
        let certs = self.dir.path().join("certs.d");
        std::fs::create_dir_all(&certs).expect("mkdir");
        std::fs::copy(&self.ca, certs.join("ca.crt")).expect("copy ca");
        let reference = format!("{}/{repo}:{tag}", self.host);
        let mut cmd = Command::new("skopeo");
        cmd.arg("--policy").arg(&policy).args(["copy", "--quiet"]);
        if all {
            cmd.arg("--all");
        }
        if docker_v2 {
            cmd.args(["--format", "v2s2"]);
        }
        cmd.arg("--dest-cert-dir")
            .arg(&certs)
            .args(["--dest-creds", &format!("{USER}:{PASSWORD}")])
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{reference}"))
            .env("HOME", self.dir.path())
            .env("XDG_RUNTIME_DIR", self.dir.path());
        run(&mut cmd);
        reference
    }

    /// The registry's stored file of blob `digest` (`sha256:…`).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("sha256");
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // Only the process this value started, by its pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
