//! The private server a benchmark runs against, and the calls it times.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use futures_util::StreamExt;
use serde_json::{json, Value};

/// A `hutch serve` child with its own temporary state directory.
pub struct BenchServer {
    url: String,
    e2b_url: Option<String>,
    key: String,
    template: String,
    http: reqwest::Client,
    child: Child,
    state_dir: std::path::PathBuf,
}

impl BenchServer {
    /// Start it (builds the template first if needed), with `vm_warm` warm vm guests per
    /// shape (`hutch serve --vm-warm`).
    pub async fn start(
        templates_dir: &Path,
        template: &str,
        vm_dir: &Path,
        network: bool,
        vm_warm: usize,
    ) -> anyhow::Result<Self> {
        let none: [&str; 0] = [];
        Self::start_with(
            templates_dir,
            template,
            vm_dir,
            network,
            vm_warm,
            "127.0.0.1:0",
            &none,
        )
        .await
    }

    /// [`BenchServer::start`] listening on `listen`, with `extra` flags of `hutch serve`
    /// (a cluster node's) and the environment they need.
    pub async fn start_with(
        templates_dir: &Path,
        template: &str,
        vm_dir: &Path,
        network: bool,
        vm_warm: usize,
        listen: &str,
        extra: &[impl AsRef<std::ffi::OsStr>],
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let state_dir = tempfile::Builder::new()
            .prefix("hutch-bench-")
            .tempdir_in("/tmp")?
            .keep();
        std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o755))?;
        let mut child = Command::new(&exe)
            .arg("serve")
            .args([
                "--listen",
                listen,
                "--network",
                if network { "on" } else { "off" },
                "--no-build-base",
                "--default-template",
                template,
            ])
            .arg("--state-dir")
            .arg(&state_dir)
            .arg("--templates-dir")
            .arg(templates_dir)
            .arg("--vm-dir")
            .arg(vm_dir)
            .args(["--vm-warm", &vm_warm.to_string()])
            .args(extra)
            // The ns disk pool is allocated on the host when made; the bench's sandboxes
            // write little, so not the default share of the free space.
            .args(["--ns-disk-pool-gib", "4"])
            // The E2B-compatible API too (`hutch bench e2b`): one more listener.
            .args(["--e2b-listen", "127.0.0.1:0"])
            // `HUTCH_BENCH_LOG` (e.g. `hutch_core=debug`) shows the server's own timings.
            .env(
                "HUTCH_LOG",
                std::env::var("HUTCH_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting hutch serve")?;
        let stdout = child.stdout.take().context("server stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let (mut url, mut e2b_url) = (None, None);
        for line in lines.by_ref() {
            let line = line?;
            if let Some(u) = line.strip_prefix("hutch E2B API on ") {
                e2b_url = Some(u.trim().to_string());
            }
            if let Some(u) = line.strip_prefix("hutch listening on ") {
                url = Some(u.trim().to_string());
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        let Some(url) = url else {
            bail!("the benchmark server did not start")
        };
        let key = std::fs::read_to_string(state_dir.join("admin.key"))?
            .trim()
            .to_string();
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()?;
        Ok(Self {
            url,
            e2b_url,
            key,
            template: template.to_string(),
            http,
            child,
            state_dir,
        })
    }

    /// The E2B-compatible API's address (`http://127.0.0.1:N`).
    pub fn e2b_url(&self) -> Option<&str> {
        self.e2b_url.as_deref()
    }

    /// Pid of the server process (for its memory).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server process's resident memory (KiB), open descriptors and threads now.
    pub fn process_stats(&self) -> serde_json::Value {
        let pid = self.child.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count())
            .unwrap_or(0);
        serde_json::json!({"rss_kib": field("VmRSS:"), "fds": fds, "threads": field("Threads:")})
    }

    /// The server's state directory (its `state.db`).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Base URL and key, for callers that make their own requests.
    pub fn endpoint(&self) -> (&str, &str, &reqwest::Client) {
        (&self.url, &self.key, &self.http)
    }

    /// The value of an unlabelled gauge or counter of `/metrics`.
    pub async fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let text = self
            .http
            .get(format!("{}/metrics", self.url))
            .bearer_auth(&self.key)
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no {name} in /metrics"))
    }

    /// Wait until the server's vm warm pool holds a guest (`hutch_vm_warm_guests` ≥ 1), at
    /// most `within`; `what` names the pool in the error.
    pub async fn wait_warm_guest(
        &self,
        within: std::time::Duration,
        what: &str,
    ) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + within;
        while self.metric("hutch_vm_warm_guests").await? < 1.0 {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the warm pool of {what} did not refill within {within:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// GET a path with the admin key and read its whole body (on the client's kept-alive
    /// connections); fails on a non-2xx answer.
    pub async fn get_ok(&self, path: &str) -> anyhow::Result<()> {
        self.http
            .get(format!("{}{}", self.url, path))
            .bearer_auth(&self.key)
            .send()
            .await?
            .error_for_status()?
            .bytes()
            .await?;
        Ok(())
    }

    /// The template every sandbox is created from.
    pub fn template(&self) -> &str {
        &self.template
    }

    /// POST JSON; the answer's JSON (Null for 204).
    pub async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.send_json(reqwest::Method::POST, path, body).await
    }

    /// PUT JSON; the answer's JSON.
    pub async fn put(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.send_json(reqwest::Method::PUT, path, body).await
    }

    async fn send_json(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
    ) -> anyhow::Result<Value> {
        let r = self
            .http
            .request(method.clone(), format!("{}{}", self.url, path))
            .bearer_auth(&self.key)
            .json(&body)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!(
                "{method} {path}: {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            );
        }
        if r.status().as_u16() == 204 {
            return Ok(Value::Null);
        }
        Ok(r.json().await?)
    }

    /// DELETE a path.
    pub async fn delete(&self, path: &str) -> anyhow::Result<()> {
        let r = self
            .http
            .delete(format!("{}{}", self.url, path))
            .bearer_auth(&self.key)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("DELETE {path}: {}", r.status());
        }
        Ok(())
    }

    /// Create a sandbox; its id.
    pub async fn create(&self) -> anyhow::Result<String> {
        let v = self
            .post(
                "/v1/sandboxes",
                json!({"template": self.template, "ttl_seconds": 600}),
            )
            .await?;
        v["id"].as_str().map(String::from).context("no id")
    }

    /// Run `true`.
    pub async fn exec_true(&self, id: &str) -> anyhow::Result<()> {
        let v = self
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                json!({"cmd": ["true"]}),
            )
            .await?;
        if v["exit_code"] != 0 {
            bail!("true failed: {v}");
        }
        Ok(())
    }

    /// Destroy a sandbox.
    pub async fn kill(&self, id: &str) -> anyhow::Result<()> {
        let r = self
            .http
            .delete(format!("{}/v1/sandboxes/{id}", self.url))
            .bearer_auth(&self.key)
            .send()
            .await?;
        if r.status().as_u16() != 204 {
            bail!("kill {id}: {}", r.status());
        }
        Ok(())
    }

    /// MB/s of stdout through `exec/stream`.
    pub async fn stream_throughput(&self, id: &str, mib: u64) -> anyhow::Result<f64> {
        let t0 = Instant::now();
        let r = self
            .http
            .post(format!("{}/v1/sandboxes/{id}/exec/stream", self.url))
            .bearer_auth(&self.key)
            .json(&json!({"cmd": format!("head -c {} /dev/zero | tr '\\0' a", mib << 20)}))
            .send()
            .await?;
        let mut body = r.bytes_stream();
        let mut n = 0usize;
        while let Some(c) = body.next().await {
            n += c?.len();
        }
        if n < (mib << 20) as usize {
            bail!(
                "stream delivered {n} bytes, expected at least {}",
                mib << 20
            );
        }
        Ok(mib as f64 * 1.048_576 / t0.elapsed().as_secs_f64())
    }

    /// MB/s writing then reading a file of `mib` MiB.
    pub async fn file_throughput(&self, id: &str, mib: usize) -> anyhow::Result<(f64, f64)> {
        let data = vec![7u8; mib << 20];
        let url = format!("{}/v1/sandboxes/{id}/files?path=/tmp/bench.bin", self.url);
        let t0 = Instant::now();
        let r = self
            .http
            .put(&url)
            .bearer_auth(&self.key)
            .body(data)
            .send()
            .await?;
        if r.status().as_u16() != 204 {
            bail!("write: {}", r.status());
        }
        let write = mib as f64 * 1.048_576 / t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let got = self
            .http
            .get(&url)
            .bearer_auth(&self.key)
            .send()
            .await?
            .bytes()
            .await?;
        if got.len() != mib << 20 {
            bail!("read {} bytes", got.len());
        }
        let read = mib as f64 * 1.048_576 / t0.elapsed().as_secs_f64();
        Ok((write, read))
    }

    /// Destroy every sandbox of this server (after a failed measurement).
    pub async fn destroy_all(&self) {
        let Ok(r) = self
            .http
            .get(format!("{}/v1/sandboxes", self.url))
            .bearer_auth(&self.key)
            .send()
            .await
        else {
            return;
        };
        let v: Value = r.json().await.unwrap_or(Value::Null);
        for s in v["sandboxes"].as_array().cloned().unwrap_or_default() {
            if let Some(id) = s["id"].as_str() {
                let _ = self.kill(id).await;
            }
        }
    }

    /// Stop the server and remove its state.
    pub fn stop(mut self) {
        // SAFETY: signalling the server child we started, by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        // Never delete through a mount point: a server stopped with sandboxes left keeps its
        // layers image (or a volume) mounted under the state directory.
        let prefix = format!("{}/", self.state_dir.display());
        let mounted = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .any(|m| m.starts_with(&prefix));
        if mounted {
            eprintln!(
                "hutch bench: {} still has mounts; left in place",
                self.state_dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.state_dir);
        }
    }
}
