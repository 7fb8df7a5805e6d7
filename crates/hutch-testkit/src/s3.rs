//! An S3 server of a test's own: moto's (`python -m moto.server`, from `HUTCH_TEST_PYTHON`,
//! which scripts/venv.sh makes with `moto[server]`), on a free loopback port. It keeps
//! everything in memory and accepts any credentials; [`S3Server::stop`] and
//! [`S3Server::start_again`] (same port) let a test take the store down and bring it back
//! — with its buckets and objects gone, since moto keeps nothing. Dropping it stops the
//! server and removes its log directory.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running moto S3 server (see the module docs).
pub struct S3Server {
    python: PathBuf,
    env: Vec<(String, String)>,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl S3Server {
    /// Start moto on a free port and wait until it answers. `None` (after saying so on
    /// stderr) when `HUTCH_TEST_PYTHON` is unset: the caller skips its test.
    pub fn start() -> Option<Self> {
        Self::start_with_env(&[])
    }

    /// [`S3Server::start`] with environment variables of moto's own (its settings, such as
    /// `S3_UPLOAD_PART_MIN_SIZE`), kept for [`S3Server::start_again`].
    pub fn start_with_env(env: &[(&str, &str)]) -> Option<Self> {
        let Some(python) = std::env::var_os("HUTCH_TEST_PYTHON") else {
            eprintln!(
                "skipped: HUTCH_TEST_PYTHON is unset (set it to $(scripts/venv.sh), which \
                 installs moto[server])"
            );
            return None;
        };
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = tempfile::Builder::new()
            .prefix("hutch-s3-")
            .tempdir_in("/tmp")
            .expect("tempdir")
            .keep();
        let mut server = Self {
            python: PathBuf::from(python),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            port,
            dir,
            child: None,
        };
        server.launch();
        Some(server)
    }

    fn launch(&mut self) {
        let log = std::fs::File::create(self.dir.join("moto.log")).expect("moto log");
        let child = Command::new(&self.python)
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .env("PYTHONUNBUFFERED", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("run HUTCH_TEST_PYTHON -m moto.server (scripts/venv.sh installs moto)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.request("GET", "/").is_some() {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("moto exited ({status}): {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "moto did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One HTTP/1.1 request without a body; the status, or `None` if nothing answered.
    fn request(&self, method: &str, path: &str) -> Option<u16> {
        self.request_text(method, path).map(|(status, _)| status)
    }

    /// An unsigned GET of `path_and_query` (moto checks no signature): the status and body,
    /// for what the store under test cannot ask, such as `/BUCKET?uploads`.
    pub fn get(&self, path_and_query: &str) -> (u16, String) {
        self.request_text("GET", path_and_query)
            .unwrap_or_else(|| panic!("GET {path_and_query}: no answer: {}", self.log()))
    }

    fn request_text(&self, method: &str, path: &str) -> Option<(u16, String)> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .ok()?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\n\
             Connection: close\r\n\r\n",
            self.port
        )
        .ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).ok()?;
        let answer = String::from_utf8_lossy(&answer);
        let status = answer.split_whitespace().nth(1)?.parse().ok()?;
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Some((status, body.to_string()))
    }

    /// moto's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("moto.log")).unwrap_or_default()
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Make bucket `name` (moto checks no signature: a plain PUT does it).
    pub fn create_bucket(&self, name: &str) {
        let status = self.request("PUT", &format!("/{name}"));
        assert_eq!(status, Some(200), "create bucket {name}: {}", self.log());
    }

    /// The `s3://` URL of `bucket` on this server.
    pub fn url(&self, bucket: &str) -> String {
        format!(
            "s3://{bucket}?endpoint=http://127.0.0.1:{}&path_style=true",
            self.port
        )
    }

    /// Stop the server (SIGTERM to its pid) and wait for it: its port refuses connections.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: signalling the pid of the child this fixture started and has not reaped.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Start it again on the same port after [`S3Server::stop`]. moto keeps nothing: the
    /// buckets (and objects) are gone, so make them again.
    pub fn start_again(&mut self) {
        if self.child.is_none() {
            self.launch();
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
