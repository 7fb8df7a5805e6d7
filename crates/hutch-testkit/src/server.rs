//! The test server: a real `hutch serve` on `127.0.0.1:0` with a temporary state directory,
//! a real HTTP client, and cleanup of everything the server made (sandboxes, snapshots,
//! mounts, cgroups, files) when dropped.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::paths::{agent_bin, ensure_minimal, hutch_bin, templates_dir, vm_cache_dir};
use crate::wait::wait_until;

/// A running server for one test.
pub struct TestServer {
    pub url: String,
    /// The preview origin's address (`http://127.0.0.1:N`), unless started with
    /// `--preview-listen off`.
    pub preview_url: Option<String>,
    /// The E2B-compatible API's address (`http://127.0.0.1:N`), when started with
    /// `--e2b-listen`.
    pub e2b_url: Option<String>,
    pub key: String,
    pub state_dir: PathBuf,
    child: Option<Child>,
    pub http: reqwest::Client,
    extra_args: Vec<String>,
    /// Environment variables set for the server process.
    env: Vec<(String, String)>,
    /// RLIMIT_NOFILE (soft and hard) of the server process, when a test sets one.
    open_files: Option<u64>,
    templates_dir: PathBuf,
    /// A PEM root certificate the test's clients trust (a server started with
    /// `--tls-cert`; see [`TestServer::trust_root`]).
    root_pem: Option<Vec<u8>>,
    /// Templates the test built through this server ([`TestServer::build_context_as`]):
    /// deleted when it is dropped, so the shared templates directory keeps none of them.
    pub(crate) built_templates: std::sync::Mutex<Vec<String>>,
}

impl TestServer {
    /// Start a server with the `minimal` template as default.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Start a server with extra `hutch serve` flags.
    pub async fn start_with(extra: &[&str]) -> Self {
        ensure_minimal();
        Self::start_in(templates_dir(), extra).await
    }

    /// Start a server on a templates directory of the test's own (its `minimal` must be
    /// built), for tests that change templates.
    pub async fn start_in(templates: PathBuf, extra: &[&str]) -> Self {
        Self::start_in_env(templates, extra, &[], None).await
    }

    /// Start a server with extra flags and environment variables (e.g. another `PATH`).
    pub async fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Self {
        ensure_minimal();
        Self::start_in_env(templates_dir(), extra, env, None).await
    }

    /// Start a server on a templates directory of the test's own, with extra flags and
    /// environment variables.
    pub async fn start_in_with_env(
        templates: PathBuf,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_in_env(templates, extra, env, None).await
    }

    async fn start_in_env(
        templates: PathBuf,
        extra: &[&str],
        env: &[(&str, &str)],
        open_files: Option<u64>,
    ) -> Self {
        let state_dir = tempfile::Builder::new()
            .prefix("hutch-test-")
            .tempdir_in("/tmp")
            .expect("tempdir")
            .keep();
        Self::start_on(state_dir, templates, extra, env, open_files).await
    }

    /// Start a server whose state directory is `state_dir` (an empty directory the test made,
    /// e.g. on a [`SmallDisk`](crate::SmallDisk)); it is removed when the server is dropped.
    pub async fn start_in_state_dir(state_dir: PathBuf, extra: &[&str]) -> Self {
        ensure_minimal();
        Self::start_on(state_dir, templates_dir(), extra, &[], None).await
    }

    async fn start_on(
        state_dir: PathBuf,
        templates: PathBuf,
        extra: &[&str],
        env: &[(&str, &str)],
        open_files: Option<u64>,
    ) -> Self {
        std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o755))
            .expect("chmod state dir");
        let mut s = Self {
            url: String::new(),
            preview_url: None,
            e2b_url: None,
            key: String::new(),
            state_dir,
            child: None,
            http: reqwest::Client::new(),
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            templates_dir: templates,
            open_files,
            root_pem: None,
            built_templates: Default::default(),
        };
        s.spawn_server().await;
        s
    }

    /// Start a server whose descriptor limit (RLIMIT_NOFILE, soft and hard) is `limit`.
    pub async fn start_with_open_files(extra: &[&str], limit: u64) -> Self {
        ensure_minimal();
        Self::start_in_env(templates_dir(), extra, &[], Some(limit)).await
    }

    /// Start a server serving TLS with `ca`'s certificate (and `extra` flags), its clients
    /// trusting `ca`.
    pub async fn start_with_tls(ca: &crate::TestCa, extra: &[&str]) -> Self {
        let mut args = ca.serve_args();
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut s = Self::start_with(&args).await;
        s.trust_root(&ca.root_pem());
        s
    }

    /// Trust the PEM root certificate `pem` in this server's clients (`http` and the
    /// cleanup's), for a server started with `--tls-cert` signed by it.
    pub fn trust_root(&mut self, pem: &[u8]) {
        self.root_pem = Some(pem.to_vec());
        self.http = http_client(self.root_pem.as_deref());
    }

    /// Pid of the server process.
    pub fn server_pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    /// The server's resident memory in KiB (`VmRSS` of `/proc/<pid>/status`).
    pub fn server_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.server_pid()))
            .expect("server status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmRSS")
    }

    /// Descriptors the server process has open.
    pub fn server_open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.server_pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// (Re)start the server process on the same state directory.
    pub async fn spawn_server(&mut self) {
        let mut cmd = Command::new(hutch_bin());
        cmd.arg("serve");
        // Tests run on the machine's own network: sandboxes get loopback only unless a test
        // builds its own world of namespaces and asks for `--network on` inside it. No warm
        // vm guests unless a test asks (they would run beside every other test's guests).
        // The ns disk pool is allocated on the host when made: 2 GiB per test server, not
        // the default share of the host's free space every parallel test would take.
        let vm_dir = vm_cache_dir();
        for (flag, default) in [
            ("--listen", "127.0.0.1:0"),
            ("--network", "off"),
            ("--vm-warm", "0"),
            ("--ns-disk-pool-gib", "2"),
            ("--vm-dir", vm_dir.to_str().expect("utf-8 path")),
        ] {
            if !self.extra_args.iter().any(|a| a == flag) {
                cmd.args([flag, default]);
            }
        }
        cmd.args(["--no-build-base", "--default-template", "minimal"])
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--templates-dir")
            .arg(&self.templates_dir)
            .arg("--agent")
            .arg(agent_bin())
            .args(&self.extra_args)
            .env("HUTCH_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(limit) = self.open_files {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec only setrlimit runs, which is async-signal-safe
            // and touches no memory shared with the parent.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("spawn hutch serve");
        let stdout = child.stdout.take().expect("stdout piped");
        let mut lines = BufReader::new(stdout).lines();
        let mut url = None;
        for line in lines.by_ref() {
            let line = line.expect("read server stdout");
            if let Some(rest) = line.strip_prefix("hutch E2B API on ") {
                self.e2b_url = Some(rest.trim().to_string());
            }
            if let Some(rest) = line.strip_prefix("hutch preview on ") {
                self.preview_url = rest.split_whitespace().next().map(str::to_string);
            }
            if let Some(u) = line.strip_prefix("hutch listening on ") {
                url = Some(u.trim().to_string());
                break;
            }
        }
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        self.url = url.expect("server printed its address");
        self.key = std::fs::read_to_string(self.state_dir.join("admin.key"))
            .expect("admin key written")
            .trim()
            .to_string();
        self.child = Some(child);
    }

    /// Set (`Some`) or remove (`None`) an environment variable of the server process, from
    /// the next [`TestServer::spawn_server`] on (e.g. the crash hook `HUTCH_TEST_CRASH_AT`).
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_string(), v.to_string()));
        }
    }

    /// Stop the server process (SIGTERM, then wait); sandboxes keep running.
    pub fn stop_server(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling a child we spawned, by its pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Kill the server process with SIGKILL (a crash: no shutdown work runs) and reap it;
    /// sandboxes keep running.
    pub fn kill_server(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Restart the server so that it aborts at crash point `point` (`HUTCH_TEST_CRASH_AT`,
    /// debug builds); make the call `method path` with `body` (none when null), which must
    /// get no answer (the server died on the way); reap the server and clear the hook. The
    /// next [`TestServer::spawn_server`] starts one that does not crash.
    pub async fn crash_during(&mut self, point: &str, method: Method, path: &str, body: Value) {
        const CRASH_AT: &str = "HUTCH_TEST_CRASH_AT";
        self.stop_server();
        self.set_env(CRASH_AT, Some(point));
        self.spawn_server().await;
        let mut request = reqwest::Client::new()
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.key)
            .timeout(Duration::from_secs(300));
        if !body.is_null() {
            request = request.json(&body);
        }
        let answer = request.send().await;
        assert!(
            answer.is_err(),
            "{point}: the server answered instead of crashing: {:?}",
            answer.map(|r| r.status())
        );
        self.kill_server();
        self.set_env(CRASH_AT, None);
    }

    /// The `/v1/metrics` text (every series, per-sandbox ones included).
    pub async fn metrics_text(&self) -> String {
        self.http
            .get(format!("{}/v1/metrics", self.url))
            .bearer_auth(&self.key)
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    /// Live-fork (or disk-fork) `parent` into `count` children; returns their ids.
    pub async fn fork(&self, parent: &str, count: u32, mode: &str) -> Vec<String> {
        let (st, v) = self
            .request(
                Method::POST,
                &format!("/v1/sandboxes/{parent}/fork"),
                Some(serde_json::json!({"count": count, "mode": mode})),
            )
            .await;
        assert_eq!(st, 201, "{v}");
        v["sandboxes"]
            .as_array()
            .expect("children")
            .iter()
            .map(|c| c["id"].as_str().expect("id").to_string())
            .collect()
    }

    /// Any request; returns status and JSON (Null when empty or not JSON).
    pub async fn request(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{}", self.url, path))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.expect("body");
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// Create a sandbox (201 expected) and return its object.
    pub async fn create(&self, body: Value) -> Value {
        let (status, v) = self
            .request(Method::POST, "/v1/sandboxes", Some(body))
            .await;
        assert_eq!(status, 201, "create failed: {v}");
        v
    }

    /// Create a volume; returns its id.
    pub async fn volume(&self, name: &str, size_mib: u64) -> String {
        let (st, v) = self
            .request(
                Method::POST,
                "/v1/volumes",
                Some(serde_json::json!({"name": name, "size_mib": size_mib})),
            )
            .await;
        assert_eq!(st, 201, "{v}");
        v["id"].as_str().expect("id").to_string()
    }

    /// Create a sandbox and return its id.
    pub async fn create_id(&self, body: Value) -> String {
        self.create(body).await["id"]
            .as_str()
            .expect("id")
            .to_string()
    }

    /// Exec (200 expected) and return the result object.
    pub async fn exec(&self, id: &str, body: Value) -> Value {
        let (status, v) = self
            .request(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(body),
            )
            .await;
        assert_eq!(status, 200, "exec failed: {v}");
        v
    }

    /// Run a shell command; returns (stdout, exit code).
    pub async fn sh(&self, id: &str, script: &str) -> (String, i64) {
        let v = self.exec(id, json!({ "cmd": script })).await;
        (
            v["stdout"].as_str().unwrap_or_default().to_string(),
            v["exit_code"].as_i64().unwrap_or(-1),
        )
    }

    /// Upload bytes to a sandbox file.
    pub async fn put_file(&self, id: &str, path: &str, mode: &str, data: Vec<u8>) {
        let resp = self
            .http
            .put(format!(
                "{}/v1/sandboxes/{id}/files?path={path}&mode={mode}",
                self.url
            ))
            .bearer_auth(&self.key)
            .body(data)
            .send()
            .await
            .expect("put");
        assert_eq!(
            resp.status().as_u16(),
            204,
            "put {path}: {:?}",
            resp.text().await
        );
    }

    /// Start a program inside sandbox `id` that outlives the call (`background` exec
    /// stream).
    pub async fn start_background(&self, id: &str, cmd: Value) {
        let resp = self
            .http
            .post(format!("{}/v1/sandboxes/{id}/exec/stream", self.url))
            .bearer_auth(&self.key)
            .json(&json!({"cmd": cmd, "background": true}))
            .send()
            .await
            .expect("exec stream");
        assert_eq!(resp.status().as_u16(), 200, "{:?}", resp.text().await);
    }

    /// Wait until something answers on `port` of sandbox `id` through the port proxy (not
    /// 502).
    pub async fn wait_for_port(&self, id: &str, port: u16) {
        let url = format!("{}/v1/sandboxes/{id}/ports/{port}/", self.url);
        let up = wait_until(Duration::from_secs(20), async || {
            let resp = self
                .http
                .get(&url)
                .bearer_auth(&self.key)
                .send()
                .await
                .ok()?;
            (resp.status().as_u16() != 502).then_some(())
        })
        .await;
        assert!(up.is_some(), "nothing came up on port {port} in {id}");
    }

    /// Delete a sandbox; returns the status.
    pub async fn kill(&self, id: &str) -> u16 {
        self.request(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
            .0
    }

    /// The host pid of a sandbox's init, found from its cgroup (for fault injection).
    pub fn init_pid(&self, id: &str) -> Option<i32> {
        let procs = std::fs::read_to_string(format!("/sys/fs/cgroup/pids/hutch/{id}/cgroup.procs"))
            .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/hutch/{id}/cgroup.procs")))
            .ok()?;
        procs
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .map(|s| {
                        s.lines().any(|l| {
                            l.starts_with("NSpid:") && l.split_whitespace().last() == Some("1")
                        })
                    })
                    .unwrap_or(false)
            })
    }

    /// The pid of the QEMU running vm sandbox `id` (its command line names the sandbox's QMP
    /// socket).
    pub fn qemu_pid(&self, id: &str) -> Option<i32> {
        let needle = self
            .state_dir
            .join("sandboxes")
            .join(id)
            .join("qmp.sock")
            .to_string_lossy()
            .into_owned();
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains(&needle)
                .then_some(pid)
        })
    }

    /// POST a JSON body (`Value::Null` sends none); returns status and JSON.
    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let body = (!body.is_null()).then_some(body);
        self.request(Method::POST, path, body).await
    }

    /// A lifecycle action on sandbox `id` (`pause`, `resume`, `hibernate`, `wake`), 200
    /// expected; returns the answer.
    pub async fn act(&self, id: &str, action: &str) -> Value {
        let (status, v) = self
            .request(Method::POST, &format!("/v1/sandboxes/{id}/{action}"), None)
            .await;
        assert_eq!(status, 200, "{action} {id}: {v}");
        v
    }

    /// The `state` of sandbox `id` ("" when it has none, e.g. a 404).
    pub async fn state(&self, id: &str) -> String {
        let (_, v) = self
            .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        v["state"].as_str().unwrap_or("").to_string()
    }

    /// Run a shell command that must exit 0; returns its stdout.
    pub async fn sh_ok(&self, id: &str, script: &str) -> String {
        let (out, code) = self.sh(id, script).await;
        assert_eq!(code, 0, "{script}: {out}");
        out
    }

    /// Ids of every sandbox the server lists.
    pub async fn sandbox_ids(&self) -> Vec<String> {
        let (_, v) = self.request(Method::GET, "/v1/sandboxes", None).await;
        v["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .filter_map(|s| s["id"].as_str().map(String::from))
            .collect()
    }

    /// Mount points under this server's state directory.
    pub fn mounts_under_state(&self) -> Vec<String> {
        let prefix = self.state_dir.to_string_lossy().to_string();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(String::from))
            .filter(|m| m.starts_with(&prefix))
            .collect()
    }
}

/// Delete every object listed at `/v1/{collection}` (best effort, for cleanup).
async fn delete_all(http: &reqwest::Client, url: &str, key: &str, collection: &str) {
    let Ok(resp) = http
        .get(format!("{url}/v1/{collection}"))
        .bearer_auth(key)
        .send()
        .await
    else {
        return;
    };
    let v: Value = resp.json().await.unwrap_or(Value::Null);
    for item in v[collection].as_array().cloned().unwrap_or_default() {
        if let Some(id) = item["id"].as_str() {
            let _ = http
                .delete(format!("{url}/v1/{collection}/{id}"))
                .bearer_auth(key)
                .send()
                .await;
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // A server the test killed (a test that failed before starting it again) left its
        // sandboxes running with their mounts: start it again, so it takes them back and
        // they are deleted below like any others, never left behind.
        if self.child.is_none() && self.has_sandboxes_on_disk() {
            let restarted = std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .expect("a runtime");
                        rt.block_on(self.spawn_server());
                    })
                    .join()
                    .is_ok()
            });
            if !restarted {
                eprintln!(
                    "hutch-testkit: could not start the server of {} again to clean up",
                    self.state_dir.display()
                );
            }
        }
        // Destroy every sandbox through the API, then stop the server.
        if self.child.is_some() {
            let url = self.url.clone();
            let key = self.key.clone();
            let root = self.root_pem.clone();
            let built_names: Vec<String> = self
                .built_templates
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let built = built_names.clone();
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                let Ok(rt) = rt else { return };
                rt.block_on(async {
                    let http = http_client(root.as_deref());
                    delete_all(&http, &url, &key, "sandboxes").await;
                    // Snapshots too: a vm snapshot's shared memory lives in the vm cache,
                    // outside the state directory removed below.
                    delete_all(&http, &url, &key, "snapshots").await;
                    // The templates it built, once nothing uses them.
                    for name in &built {
                        let _ = http
                            .delete(format!("{url}/v1/templates/{name}"))
                            .bearer_auth(&key)
                            .send()
                            .await;
                    }
                });
            })
            .join();
            // The store's lock file of a name stays after a removal.
            for name in &built_names {
                let _ = std::fs::remove_file(self.templates_dir.join(format!(".lock-{name}")));
            }
        }
        self.stop_server();
        let mut mounts = self.mounts_under_state();
        if !mounts.is_empty() && std::thread::panicking() {
            // The test failed where its server could not clean up (its cluster database
            // down, say): end its sandboxes by hand rather than leave them running.
            self.end_sandboxes_by_hand();
            mounts = self.mounts_under_state();
        }
        if mounts.is_empty() {
            let _ = std::fs::remove_dir_all(&self.state_dir);
        } else if !std::thread::panicking() {
            panic!("mounts left under the state dir after cleanup: {mounts:?}");
        }
    }
}

impl TestServer {
    /// Kill the processes of this server's sandboxes (found by their cgroups, named by the
    /// sandbox ids in its state directory: processes this test's server started) and
    /// unmount everything under the state directory, deepest first. For a failed test only:
    /// a passing one must leave nothing for this to do.
    fn end_sandboxes_by_hand(&self) {
        let ids: Vec<String> = std::fs::read_dir(self.state_dir.join("sandboxes"))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.starts_with("sbx_"))
                    .collect()
            })
            .unwrap_or_default();
        let procs = |id: &str| -> Vec<i32> {
            ["pids/hutch", "hutch", "unified/hutch"]
                .iter()
                .filter_map(|h| {
                    std::fs::read_to_string(format!("/sys/fs/cgroup/{h}/{id}/cgroup.procs")).ok()
                })
                .flat_map(|t| {
                    t.lines()
                        .filter_map(|l| l.trim().parse().ok())
                        .collect::<Vec<i32>>()
                })
                .collect()
        };
        for id in &ids {
            for pid in procs(id) {
                // SAFETY: signalling a pid of this test's own sandbox, read from its cgroup.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while ids.iter().any(|id| !procs(id).is_empty()) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        // Their cgroups (empty now), in every hierarchy, children first.
        let hierarchies: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
            .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
            .unwrap_or_default();
        for id in &ids {
            for root in hierarchies
                .iter()
                .map(|h| h.join("hutch").join(id))
                .chain([PathBuf::from("/sys/fs/cgroup/hutch").join(id)])
            {
                remove_cgroup_tree(&root);
            }
        }
        let mut mounts = self.mounts_under_state();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let Ok(path) = std::ffi::CString::new(m) else {
                continue;
            };
            // SAFETY: `path` is NUL-terminated and outlives the call.
            unsafe {
                libc::umount2(path.as_ptr(), libc::MNT_DETACH);
            }
        }
        eprintln!(
            "hutch-testkit: ended the sandboxes of {} by hand ({} left by a failed test)",
            self.state_dir.display(),
            ids.len()
        );
    }

    /// Whether the state directory holds a sandbox's directory.
    fn has_sandboxes_on_disk(&self) -> bool {
        std::fs::read_dir(self.state_dir.join("sandboxes"))
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    }
}

/// `rmdir` a cgroup directory and the cgroups below it, children first (a missing one is
/// fine).
fn remove_cgroup_tree(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// An HTTP client that also trusts the PEM root certificate `root`, when given.
fn http_client(root: Option<&[u8]>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder();
    if let Some(pem) = root {
        let cert = reqwest::Certificate::from_pem(pem).expect("a PEM root certificate");
        builder = builder.add_root_certificate(cert);
    }
    builder.build().expect("HTTP client")
}
