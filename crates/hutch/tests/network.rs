//! Sandbox networking and egress policy, proven from inside sandboxes in a world of network
//! namespaces built here: the server and its sandboxes live in a "world" namespace whose only
//! link leads to a "fake internet" namespace holding the test hosts (tests/net/world.py). No
//! packet of these tests can leave the machine, even when a block under test fails: every
//! address probed (the metadata service included) is a test host of ours.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hutch_testkit::{repo_root, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The world and fake-internet namespaces, the test hosts and their certificates.
struct World {
    world: String,
    inet: String,
    hosts: Option<Child>,
    dir: std::path::PathBuf,
}

impl World {
    fn build() -> World {
        let tag = format!("{:08x}", rand_u32());
        let (world, inet) = (format!("hzw{tag}"), format!("hzi{tag}"));
        let dir = std::env::temp_dir().join(format!("hutch-net-{tag}"));
        std::fs::create_dir_all(&dir).expect("cert dir");
        let mut w = World {
            world: world.clone(),
            inet: inet.clone(),
            hosts: None,
            dir: dir.clone(),
        };
        for ns in [&world, &inet] {
            run(&["ip", "netns", "add", ns]);
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        run(&[
            "ip", "-n", &world, "link", "add", "up0", "type", "veth", "peer", "name", "eth0",
            "netns", &inet,
        ]);
        run(&[
            "ip",
            "-n",
            &world,
            "addr",
            "add",
            "203.0.113.1/24",
            "dev",
            "up0",
        ]);
        run(&["ip", "-n", &world, "link", "set", "up0", "up"]);
        run(&[
            "ip",
            "-n",
            &inet,
            "addr",
            "add",
            "203.0.113.2/24",
            "dev",
            "eth0",
        ]);
        for a in [
            "203.0.113.10/32",
            "203.0.113.20/32",
            "203.0.113.53/32",
            "169.254.169.254/32",
        ] {
            run(&["ip", "-n", &inet, "addr", "add", a, "dev", "eth0"]);
        }
        run(&["ip", "-n", &inet, "link", "set", "eth0", "up"]);
        // The world's only way out is the fake internet, link-local included.
        run(&[
            "ip",
            "-n",
            &world,
            "route",
            "add",
            "default",
            "via",
            "203.0.113.2",
        ]);
        run(&[
            "ip",
            "-n",
            &world,
            "route",
            "add",
            "169.254.0.0/16",
            "via",
            "203.0.113.2",
        ]);
        for (name, san) in [
            ("good", "DNS:good.test,DNS:*.good.test"),
            ("bad", "DNS:bad.test"),
        ] {
            let d = dir.display();
            run(&[
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "1",
                "-subj",
                &format!("/CN={name}.test"),
                "-addext",
                &format!("subjectAltName={san}"),
                "-keyout",
                &format!("{d}/{name}.key"),
                "-out",
                &format!("{d}/{name}.crt"),
            ]);
        }
        let mut hosts = Command::new("ip")
            .args(["netns", "exec", &inet, "python3"])
            .arg(repo_root().join("crates/hutch/tests/net/world.py"))
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the test hosts");
        let mut line = String::new();
        BufReader::new(hosts.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read");
        assert_eq!(line.trim(), "ready", "test hosts did not start");
        w.hosts = Some(hosts);
        w
    }

    /// Run `f` on a thread inside the world namespace (so the server it starts, and every
    /// socket it opens, live there), on a single-threaded runtime.
    fn run<F, Fut>(&self, f: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()>,
    {
        let path = format!("/run/netns/{}", self.world);
        let t = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("open world netns");
            // SAFETY: setns on an open namespace descriptor; affects this thread only.
            let rc =
                unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns into the world");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(f());
        });
        if let Err(p) = t.join() {
            std::panic::resume_unwind(p);
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(mut h) = self.hosts.take() {
            let _ = h.kill();
            let _ = h.wait();
        }
        for ns in [&self.world, &self.inet] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rand_u32() -> u32 {
    use std::io::Read;
    let mut b = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("random");
    u32::from_ne_bytes(b)
}

async fn server() -> TestServer {
    server_with(&[]).await
}

async fn server_with(extra: &[&str]) -> TestServer {
    hutch_testkit::ensure_template("base");
    let mut args = vec![
        "--network",
        "on",
        "--listen",
        "0.0.0.0:0",
        "--net-upstream-dns",
        "203.0.113.53",
    ];
    args.extend_from_slice(extra);
    TestServer::start_with(&args).await
}

const CLIENT: &str = include_str!("net/client.py");

/// A `base` sandbox with `network`, with the check client installed.
async fn sandbox(s: &TestServer, network: Value) -> (String, Value) {
    let v = s
        .create(json!({"template": "base", "network": network}))
        .await;
    let id = v["id"].as_str().expect("id").to_string();
    s.put_file(&id, "/root/c.py", "644", CLIENT.as_bytes().to_vec())
        .await;
    (id, v)
}

/// Run the check client in a sandbox; returns its one line.
async fn check(s: &TestServer, id: &str, args: &str) -> String {
    let (out, _) = s.sh(id, &format!("python3 /root/c.py {args}")).await;
    out.trim().to_string()
}

/// `PUT /v1/sandboxes/{id}/network` with `policy`; status and answer.
async fn put_network(s: &TestServer, id: &str, policy: Value) -> (u16, Value) {
    s.request(
        Method::PUT,
        &format!("/v1/sandboxes/{id}/network"),
        Some(policy),
    )
    .await
}

fn gateway_of(v: &Value) -> String {
    let addr: std::net::Ipv4Addr = v["network"]["address"]
        .as_str()
        .expect("address")
        .parse()
        .expect("ipv4");
    std::net::Ipv4Addr::from(u32::from(addr) - 1).to_string()
}

#[test]
fn default_allow_reaches_the_internet_and_nothing_forbidden() {
    let world = World::build();
    world.run(|| async {
        let s = server().await;
        let (a, va) = sandbox(&s, json!({"egress": "allow"})).await;
        let (b, vb) = sandbox(&s, json!({})).await;
        assert_eq!(
            vb["network"]["egress"], "allow",
            "allow is the default: {vb}"
        );
        let b_addr = vb["network"]["address"]
            .as_str()
            .expect("b address")
            .to_string();
        assert_ne!(va["network"]["address"], vb["network"]["address"]);

        // A test host, by address and by name (through Hutch's resolver).
        assert_eq!(
            check(&s, &a, "http plain.test 203.0.113.10 80").await,
            "HTTP/1.1 200 OK | plain host=plain.test"
        );
        assert_eq!(check(&s, &a, "resolve plain.test").await, "ok 203.0.113.10");
        // DNS to another server is redirected to Hutch's resolver, not sent there.
        let (out, _) = s.sh(&a, "cat /etc/resolv.conf").await;
        assert!(
            out.contains(&format!("nameserver {}", gateway_of(&va))),
            "{out}"
        );

        // Always blocked: metadata, mining ports, another sandbox, the host's services.
        assert!(
            check(&s, &a, "http x 169.254.169.254 80")
                .await
                .starts_with("err"),
            "metadata reachable"
        );
        assert!(
            check(&s, &a, "tcp 203.0.113.10 3333")
                .await
                .starts_with("err"),
            "mining port reachable"
        );
        assert_eq!(
            check(&s, &a, "tcp 203.0.113.10 3000").await,
            "hello3000",
            "an ordinary port is reachable"
        );
        s.sh(&b, "nohup python3 -m http.server 8080 >/dev/null 2>&1 &")
            .await;
        let b_self = wait_for(
            || check(&s, &b, "http b 127.0.0.1 8080"),
            |o| o.contains("200"),
        )
        .await;
        assert!(b_self.contains("200"), "b serves itself: {b_self}");
        assert!(
            check(&s, &a, &format!("http b {b_addr} 8080"))
                .await
                .starts_with("err"),
            "sandbox b reachable from a"
        );
        let api_port = s
            .url
            .rsplit(':')
            .next()
            .expect("port")
            .trim_end_matches('/')
            .to_string();
        let gw = gateway_of(&va);
        assert!(
            check(&s, &a, &format!("tcp {gw} {api_port}"))
                .await
                .starts_with("err"),
            "the Hutch API is reachable from a sandbox"
        );

        // Spoofed sources are dropped: the same connection succeeds from the sandbox's own
        // address and fails from another sandbox's (b's) or an outside one.
        s.put_file(
            &a,
            "/tmp/probe",
            "755",
            hutch_testkit::static_c_binary("probe"),
        )
        .await;
        let own = va["network"]["address"].as_str().expect("address");
        let (out, _) = s
            .sh(&a, &format!("/tmp/probe connect {own} 203.0.113.10 3000"))
            .await;
        assert_eq!(out.trim(), "connect OK");
        for src in [b_addr.as_str(), "203.0.113.77"] {
            let (out, _) = s
                .sh(&a, &format!("/tmp/probe connect {src} 203.0.113.10 3000"))
                .await;
            assert_ne!(out.trim(), "connect OK", "spoofed source {src} got through");
        }

        // Root inside cannot change its own network.
        let (out, code) = s
            .sh(
                &a,
                "ip link set eth0 down 2>&1 || echo denied; cat /proc/sys/net/ipv4/ip_forward",
            )
            .await;
        assert!(
            code == 0 && out.contains("denied")
                || out.contains("Operation not permitted")
                || out.contains("not found"),
            "{out}"
        );

        // Traffic is attributed to the sandbox (counters are read at most a second old).
        let counted = hutch_testkit::wait_until(Duration::from_secs(5), async || {
            let (st, v) = s
                .request(Method::GET, &format!("/v1/sandboxes/{a}"), None)
                .await;
            assert_eq!(st, 200);
            let seen = v["network"]["connections_out"].as_u64().unwrap_or(0) >= 2
                && v["network"]["bytes_out"].as_u64().unwrap_or(0) > 0;
            seen.then_some(v)
        })
        .await;
        assert!(counted.is_some(), "no traffic counted for {a}");
        let (_, _) = s.request(Method::GET, "/healthz", None).await;
        let metrics = s.metrics_text().await;
        assert!(
            metrics.contains(&format!(
                "hutch_sandbox_network_bytes_out{{sandbox=\"{a}\"}}"
            )),
            "{metrics}"
        );
        // Without a key, /metrics has the server-wide sums and names no sandbox; the
        // per-sandbox series need one.
        let public = reqwest::get(format!("{}/metrics", s.url))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        assert!(
            !public.contains(&a) && !public.contains("sandbox=\""),
            "{public}"
        );
        assert!(public.contains("hutch_network_bytes_out "), "{public}");
        let anonymous = reqwest::get(format!("{}/v1/metrics", s.url))
            .await
            .expect("v1 metrics");
        assert_eq!(anonymous.status().as_u16(), 401);
    });
}

async fn wait_for<F, Fut>(mut f: F, ok: impl Fn(&str) -> bool) -> String
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = f().await;
        if ok(&out) || Instant::now() > deadline {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn deny_with_a_domain_allowlist_admits_only_those_names() {
    let world = World::build();
    world.run(|| async {
        let s = server().await;
        let (id, _) = sandbox(
            &s,
            json!({"egress": "deny", "allow": ["good.test", "*.good.test"]}),
        )
        .await;
        assert_eq!(check(&s, &id, "resolve good.test").await, "ok 203.0.113.20");
        assert_eq!(
            check(&s, &id, "resolve api.good.test").await,
            "ok 203.0.113.20",
            "wildcard"
        );
        assert!(
            check(&s, &id, "resolve bad.test").await.starts_with("err"),
            "denied name resolves"
        );
        assert!(check(&s, &id, "resolve plain.test")
            .await
            .starts_with("err"));
        // TLS by SNI: good.test passes; bad.test on the same (pinned) address does not.
        assert_eq!(
            check(&s, &id, "tls good.test 203.0.113.20").await,
            "tls sni=good.test"
        );
        assert_eq!(
            check(&s, &id, "tls api.good.test 203.0.113.20").await,
            "tls sni=api.good.test"
        );
        assert!(
            !check(&s, &id, "tls bad.test 203.0.113.20")
                .await
                .contains("sni=bad.test"),
            "SNI check bypassed"
        );
        // HTTP by Host, same rule.
        assert_eq!(
            check(&s, &id, "http good.test 203.0.113.20 80").await,
            "HTTP/1.1 200 OK | shared host=good.test"
        );
        assert!(
            check(&s, &id, "http bad.test 203.0.113.20 80")
                .await
                .contains("403"),
            "Host check bypassed"
        );
        // Not by raw IP: an address no allowed name resolved to, on any port.
        assert!(
            !check(&s, &id, "http plain.test 203.0.113.10 80")
                .await
                .contains("200"),
            "raw IP reachable"
        );
        assert!(
            check(&s, &id, "tcp 203.0.113.10 3000")
                .await
                .starts_with("err"),
            "raw IP port reachable"
        );
        // Rebinding: an allowed name answering with an inside address is refused.
        let (st, _) = put_network(
            &s,
            &id,
            json!({"egress": "deny", "allow": ["rebind.test", "meta.test"]}),
        )
        .await;
        assert_eq!(st, 200);
        assert!(
            check(&s, &id, "resolve rebind.test")
                .await
                .starts_with("err"),
            "rebinding answer passed"
        );
        assert!(
            check(&s, &id, "resolve meta.test").await.starts_with("err"),
            "link-local answer passed"
        );
        // IP allow entries work without names.
        let (st, v) = put_network(
            &s,
            &id,
            json!({"egress": "deny", "allow": ["203.0.113.10/32"]}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["network"]["allow"], json!(["203.0.113.10"]));
        assert_eq!(check(&s, &id, "tcp 203.0.113.10 3000").await, "hello3000");
        assert!(check(&s, &id, "tcp 203.0.113.20 80")
            .await
            .starts_with("err"));
    });
}

#[test]
fn a_live_policy_change_cuts_open_connections_and_none_means_loopback() {
    let world = World::build();
    world.run(|| async {
        let s = server().await;
        let (id, _) = sandbox(&s, json!({})).await;
        s.sh(
            &id,
            "nohup python3 /root/c.py hold 203.0.113.10 7000 30 > /tmp/hold 2>&1 &",
        )
        .await;
        let ticks = wait_for(
            || async { s.sh(&id, "cat /tmp/ticks 2>/dev/null").await.0 },
            |o| o.trim().parse::<u32>().unwrap_or(0) >= 3,
        )
        .await;
        assert!(
            ticks.trim().parse::<u32>().unwrap_or(0) >= 3,
            "the stream runs: {ticks}"
        );
        let t0 = Instant::now();
        let (st, v) = put_network(&s, &id, json!({"egress": "deny"})).await;
        assert_eq!(st, 200, "{v}");
        let ended = wait_for(
            || async { s.sh(&id, "cat /tmp/hold").await.0 },
            |o| o.contains("ended"),
        )
        .await;
        assert!(
            ended.contains("ended") && !ended.contains("timeout"),
            "connection not cut: {ended}"
        );
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert!(check(&s, &id, "tcp 203.0.113.10 3000")
            .await
            .starts_with("err"));
        // Back to allow: reachable again.
        let (st, _) = put_network(
            &s,
            &id,
            json!({"egress": "allow", "deny": ["203.0.113.10"]}),
        )
        .await;
        assert_eq!(st, 200);
        assert!(
            check(&s, &id, "tcp 203.0.113.10 3000")
                .await
                .starts_with("err"),
            "deny entry ignored"
        );
        assert_eq!(
            check(&s, &id, "http x 203.0.113.20 80").await,
            "HTTP/1.1 200 OK | shared host=x"
        );

        // The CLI shows and replaces the policy (it runs in the world too: a child of this
        // thread).
        let cli = |args: &[&str]| {
            let out = Command::new(hutch_testkit::hutch_bin())
                .args(args)
                .env("HUTCH_URL", &s.url)
                .env("HUTCH_STATE_DIR", &s.state_dir)
                .env_remove("HUTCH_API_KEY")
                .output()
                .expect("run hutch");
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let shown = cli(&[
            "network",
            &id,
            "--egress",
            "deny",
            "--allow",
            "203.0.113.10",
            "--allow",
            "*.good.test",
        ]);
        assert!(
            shown.contains("egress=deny allow=203.0.113.10,*.good.test"),
            "{shown}"
        );
        assert_eq!(check(&s, &id, "tcp 203.0.113.10 3000").await, "hello3000");
        let v: Value = serde_json::from_str(&cli(&["--json", "network", &id])).expect("json");
        assert_eq!(v["egress"], "deny");
        assert!(v["address"].as_str().is_some(), "{v}");

        // Loopback only.
        let (none, v) = sandbox(&s, json!({"egress": "none"})).await;
        assert!(v["network"].get("address").is_none(), "{v}");
        let (out, _) = s.sh(&none, "cat /proc/net/dev").await;
        assert!(out.contains("lo:") && !out.contains("eth0"), "{out}");
        assert!(check(&s, &none, "tcp 203.0.113.10 3000")
            .await
            .starts_with("err"));
        // It cannot gain a network later; bad policies are 4xx with a message.
        let (st, _) = put_network(&s, &none, json!({"egress": "allow"})).await;
        assert_eq!(st, 409);
        for (body, want) in [
            (json!({"egress": "sometimes"}), 400),
            (json!({"allow": ["::1"]}), 422),
            (json!({"allow": ["bad name.test"]}), 422),
            (json!({"egress": "allow", "extra": 1}), 400),
        ] {
            let (st, v) = put_network(&s, &id, body.clone()).await;
            assert_eq!(st, want, "{body} -> {v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{v}"
            );
        }
        let (st, _) = put_network(&s, "sbx_nope", json!({})).await;
        assert_eq!(st, 404);
    });
}

/// Wait (up to 10 s) until the world's DNS server has been asked for slow.test `n` times.
async fn slow_test_asked(dir: &std::path::Path, n: usize) -> bool {
    let file = dir.join("asked-slow.test");
    hutch_testkit::wait_until(Duration::from_secs(10), async || {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        (text.lines().count() >= n).then_some(())
    })
    .await
    .is_some()
}

#[test]
fn an_answer_upstream_during_a_policy_change_follows_the_new_policy() {
    let world = World::build();
    let dir = world.dir.clone();
    world.run(move || async move {
        let s = server().await;
        let (id, _) = sandbox(&s, json!({"egress": "deny", "allow": ["slow.test"]})).await;
        // The world's DNS server answers slow.test's A query 1.5 s late: while the resolver
        // waits for it, the policy changes and no longer allows the name.
        s.sh(
            &id,
            "nohup python3 /root/c.py resolve slow.test > /tmp/r 2>&1 &",
        )
        .await;
        assert!(slow_test_asked(&dir, 1).await, "the query reached upstream");
        let (st, v) =
            put_network(&s, &id, json!({"egress": "deny", "allow": ["plain.test"]})).await;
        assert_eq!(st, 200, "{v}");
        let out = wait_for(
            || async { s.sh(&id, "cat /tmp/r").await.0 },
            |o| !o.trim().is_empty(),
        )
        .await;
        assert!(
            out.trim().starts_with("err"),
            "answered under the policy of before the change: {out}"
        );
        assert!(
            check(&s, &id, "tcp 203.0.113.10 3000")
                .await
                .starts_with("err"),
            "the answer pinned its address after the change"
        );
        // The name allowed now still resolves and is pinned.
        assert_eq!(
            check(&s, &id, "resolve plain.test").await,
            "ok 203.0.113.10"
        );
        assert_eq!(check(&s, &id, "tcp 203.0.113.10 3000").await, "hello3000");
    });
}

#[test]
fn replies_to_queries_sharing_an_id_keep_their_order() {
    // busybox nslookup in a guest with a coarse clock sends its A and AAAA queries with one
    // ID and takes the first reply for the A query: an AAAA reply overtaking it (here: the
    // A answer comes 1.5 s late upstream) lost the A record.
    let world = World::build();
    let dir = world.dir.clone();
    world.run(move || async move {
        let s = server().await;
        let (id, _) = sandbox(&s, json!({"egress": "allow"})).await;
        assert_eq!(check(&s, &id, "sameid slow.test").await, "order 1 28");
        assert!(slow_test_asked(&dir, 2).await, "both queries went upstream");
    });
}

#[test]
fn the_network_survives_hibernation_and_a_server_restart() {
    let world = World::build();
    world.run(|| async {
        let mut s = server().await;
        let policy = json!({"egress": "deny", "allow": ["203.0.113.10"]});
        let (id, v) = sandbox(&s, policy).await;
        let address = v["network"]["address"].clone();
        assert_eq!(check(&s, &id, "tcp 203.0.113.10 3000").await, "hello3000");
        assert!(check(&s, &id, "tcp 203.0.113.20 80")
            .await
            .starts_with("err"));

        // Hibernate and wake: same address, same policy.
        let (st, _) = s
            .request(Method::POST, &format!("/v1/sandboxes/{id}/hibernate"), None)
            .await;
        assert_eq!(st, 200);
        assert_eq!(check(&s, &id, "tcp 203.0.113.10 3000").await, "hello3000");
        assert!(check(&s, &id, "tcp 203.0.113.20 80")
            .await
            .starts_with("err"));
        let (_, v) = s
            .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        assert_eq!(v["network"]["address"], address);

        // Restart the server (it reloads its ruleset): the running sandbox keeps its network
        // and its policy is enforced again, not lost.
        s.stop_server();
        s.spawn_server().await;
        assert_eq!(check(&s, &id, "tcp 203.0.113.10 3000").await, "hello3000");
        assert!(
            check(&s, &id, "tcp 203.0.113.20 80")
                .await
                .starts_with("err"),
            "policy lost over a restart"
        );
        assert!(check(&s, &id, "http x 169.254.169.254 80")
            .await
            .starts_with("err"));
        // A new sandbox after the restart gets another address and works.
        let (other, v) = sandbox(&s, json!({})).await;
        assert_ne!(v["network"]["address"], address);
        assert_eq!(
            check(&s, &other, "tcp 203.0.113.10 3000").await,
            "hello3000"
        );
    });
}

/// The sandbox links (`hz<N>`, one per built slot) in the world namespace.
fn host_veths(world: &str) -> usize {
    let out = Command::new("ip")
        .args(["-n", world, "-o", "link", "show"])
        .output()
        .expect("ip link");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|n| n.starts_with("hz"))
        })
        .count()
}

/// `hutch_network_slots{state}` from `/metrics`.
async fn slots(s: &TestServer, state: &str) -> u64 {
    let prefix = format!("hutch_network_slots{{state=\"{state}\"}} ");
    s.metrics_text()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {prefix} in /metrics"))
}

#[test]
fn hibernated_sandboxes_give_their_network_slot_back_and_wake_onto_one() {
    let world = World::build();
    let name = world.world.clone();
    world.run(move || async move {
        let s = server().await;
        let policy = json!({"egress": "deny", "allow": ["203.0.113.10"]});
        let mut sandboxes = Vec::new();
        for _ in 0..3 {
            let (id, v) = sandbox(&s, policy.clone()).await;
            assert_eq!(check(&s, &id, "tcp 203.0.113.10 3000").await, "hello3000");
            sandboxes.push((
                id,
                v["network"]["address"]
                    .as_str()
                    .expect("address")
                    .to_string(),
            ));
        }
        let used = slots(&s, "used").await;
        assert_eq!(used, 3);
        let veths = host_veths(&name);
        for (id, _) in &sandboxes {
            s.act(id, "hibernate").await;
        }
        // Their veths, namespaces and /30s are back in the pool (warm slots stay built).
        assert_eq!(slots(&s, "used").await, 0);
        let dropped = hutch_testkit::wait_until(Duration::from_secs(10), async || {
            (host_veths(&name) == veths - 3).then_some(())
        })
        .await;
        assert!(
            dropped.is_some(),
            "veths: {} before, {} now",
            veths,
            host_veths(&name)
        );

        // Other sandboxes take the free slots (the warm ones, then the given-back ones) until
        // one has the first one's old address; the others go again.
        let (first, first_address) = sandboxes[0].clone();
        let mut taken = None;
        let mut others = Vec::new();
        for _ in 0..12 {
            let (other, v) = sandbox(&s, json!({"egress": "allow"})).await;
            if v["network"]["address"].as_str() == Some(first_address.as_str()) {
                taken = Some(other);
                break;
            }
            others.push(other);
        }
        let taken = taken.expect("no sandbox got the hibernated one's old address");
        for other in &others {
            assert_eq!(s.kill(other).await, 204);
        }

        // A wake takes a slot again: the old address when free, else a new one; the policy
        // and the port proxy work either way. (The first wakes last: a slot it takes instead
        // of its own may be another's old one.)
        sandboxes.rotate_left(1);
        for (id, address) in &sandboxes {
            let v = s.act(id, "wake").await;
            let now = v["network"]["address"]
                .as_str()
                .expect("address")
                .to_string();
            if *id == first {
                assert_ne!(&now, address, "two sandboxes on one address");
            } else {
                assert_eq!(&now, address, "its address was free");
            }
            assert_eq!(check(&s, id, "tcp 203.0.113.10 3000").await, "hello3000");
            assert!(check(&s, id, "tcp 203.0.113.20 80")
                .await
                .starts_with("err"));
            let (out, _) = s.sh(id, "cat /proc/net/fib_trie").await;
            assert!(out.contains(&now), "{now} not on its interface: {out}");
        }
        assert_eq!(slots(&s, "used").await, 4);
        // The sandbox holding the old address kept its network.
        assert_eq!(
            check(&s, &taken, "tcp 203.0.113.10 3000").await,
            "hello3000"
        );
        s.start_background(
            &first,
            json!([
                "python3",
                "-m",
                "http.server",
                "8000",
                "--bind",
                "127.0.0.1"
            ]),
        )
        .await;
        s.wait_for_port(&first, 8000).await;
        let resp = s
            .http
            .get(format!("{}/v1/sandboxes/{first}/ports/8000/", s.url))
            .bearer_auth(&s.key)
            .send()
            .await
            .expect("port proxy");
        assert_eq!(resp.status().as_u16(), 200);
    });
}

/// Create and kill one `vm` sandbox on a server outside the world, so the shared vm cache
/// (the guest kernel from Debian's registry, the template's image and bake) is ready: inside
/// the world nothing can be downloaded.
fn warm_vm_cache() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let s = TestServer::start().await;
        let id = s
            .create_id(json!({"isolation": "vm", "network": {"egress": "none"}}))
            .await;
        let (st, _) = s
            .request(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await;
        assert_eq!(st, 204);
    });
}

#[test]
fn a_vm_sandbox_gets_a_network_under_the_same_policy() {
    warm_vm_cache();
    let world = World::build();
    world.run(|| async {
        // One warm guest kept ready: the second create below claims it.
        let s = server_with(&["--vm-warm", "1"]).await;
        let v = s
            .create(json!({"isolation": "vm", "network": {"egress": "deny", "allow": ["203.0.113.10"]}}))
            .await;
        let id = v["id"].as_str().expect("id").to_string();
        let address = v["network"]["address"].as_str().expect("address").to_string();
        // Wait for the warm guest the create above asked for: its restore would otherwise
        // compete for the 2 cores with the timing-sensitive checks below.
        let hidden = || {
            std::fs::read_dir(s.state_dir.join("sandboxes"))
                .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let known = [id.clone()];
        let warm = hutch_testkit::wait_until(std::time::Duration::from_secs(60), async || {
            // Ready (restored, warmed up, paused), not merely being restored.
            if !s.metrics_text().await.contains("hutch_vm_warm_guests 1") {
                return None;
            }
            let (_, list) = s.request(Method::GET, "/v1/sandboxes", None).await;
            let listed = list.to_string();
            hidden().into_iter().find(|d| !known.contains(d) && !listed.contains(d.as_str()))
        })
        .await
        .expect("a warm guest");
        // The guest's own interface carries the slot's address.
        let (out, _) = s.sh(&id, "ip -o -4 addr show; cat /etc/resolv.conf").await;
        assert!(out.contains(&format!("{address}/30")), "{out}");
        let (out, _) = s.sh(&id, "echo | nc 203.0.113.10 3000").await;
        assert_eq!(out.trim(), "hello3000", "allowed address");
        // busybox's wget is static glibc and crashes resolving in a guest without NSS
        // libraries; plain `nc` with a hand-written request avoids it.
        let get = |host: &str| format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {host} 80 2>&1; echo rc=$?");
        let (out, _) = s.sh(&id, &get("203.0.113.20")).await;
        assert!(!out.contains("shared") && !out.contains("rc=139"), "denied address reached: {out}");
        let (out, _) = s.sh(&id, &get("169.254.169.254")).await;
        assert!(!out.contains("metadata") && !out.contains("rc=139"), "metadata reached: {out}");
        // Live change, and DNS through Hutch's resolver.
        let (st, _) = put_network(&s, &id, json!({"egress": "allow"})).await;
        assert_eq!(st, 200);
        let (out, _) = s.sh(&id, &get("203.0.113.20")).await;
        assert!(out.contains("shared host="), "{out}");
        let (out, _) = s.sh(&id, "nslookup plain.test 2>&1").await;
        assert!(out.contains("203.0.113.10"), "{out}");

        // Hibernate and wake (a new QEMU from the saved memory, a new TAP on the same slot).
        let (st, v) = s
            .request(Method::POST, &format!("/v1/sandboxes/{id}/hibernate"), None)
            .await;
        assert_eq!(st, 200, "{v}");
        let (out, _) = s.sh(&id, "echo | nc 203.0.113.10 3000").await;
        assert_eq!(out.trim(), "hello3000", "after wake");
        // A live fork child: the parent's memory, its own slot, address and route.
        let (st, v) = s
            .request(Method::POST, &format!("/v1/sandboxes/{id}/fork"), Some(json!({"count": 1, "mode": "live"})))
            .await;
        assert_eq!(st, 201, "{v}");
        let child = v["sandboxes"][0]["id"].as_str().expect("child").to_string();
        let child_addr = v["sandboxes"][0]["network"]["address"].as_str().expect("child address").to_string();
        assert_ne!(child_addr, address);
        let (out, _) = s.sh(&child, "ip -o -4 addr show; echo | nc 203.0.113.10 3000").await;
        assert!(out.contains(&format!("{child_addr}/30")) && out.contains("hello3000"), "{out}");

        // The warm guest restored meanwhile (its slot closed: egress deny, no address yet)
        // takes the claiming create's policy and address.
        let v = s
            .create(json!({"isolation": "vm", "network": {"egress": "deny", "allow": ["203.0.113.20"]}}))
            .await;
        let claimed = v["id"].as_str().expect("id").to_string();
        assert_eq!(claimed, warm, "the create claimed the warm guest");
        let claimed_addr = v["network"]["address"].as_str().expect("address").to_string();
        assert!(claimed_addr != address && claimed_addr != child_addr);
        let (out, _) = s.sh(&claimed, "ip -o -4 addr show").await;
        assert!(out.contains(&format!("{claimed_addr}/30")), "{out}");
        let (out, _) = s.sh(&claimed, &get("203.0.113.20")).await;
        assert!(out.contains("shared host="), "the claim's allow rule: {out}");
        let (out, _) = s.sh(&claimed, "echo | nc -w 3 203.0.113.10 3000 2>&1").await;
        assert!(!out.contains("hello3000"), "denied for the claimed guest: {out}");
        let (out, _) = s.sh(&claimed, &get("169.254.169.254")).await;
        assert!(!out.contains("metadata") && !out.contains("rc=139"), "metadata reached: {out}");
    });
}

/// E2B's network settings through the published SDK (`tests/e2b/scenarios.py`, scenario
/// `network`), inside the world: the SDK's process is spawned from the world's thread, so
/// it reaches the server on the world's loopback and nothing else.
#[test]
fn e2b_sdk_network_settings_allow_and_deny_test_hosts() {
    let world = World::build();
    world.run(|| async {
        let s = server_with(&["--e2b-listen", "127.0.0.1:0"]).await;
        let url = s.e2b_url.clone().expect("started with --e2b-listen");
        let python = std::env::var_os("HUTCH_TEST_PYTHON").unwrap_or_else(|| "python3".into());
        let out = Command::new(python)
            .arg(repo_root().join("crates/hutch/tests/e2b/scenarios.py"))
            .arg("network")
            .env("E2B_API_URL", &url)
            .env("E2B_SANDBOX_URL", &url)
            .env("E2B_API_KEY", &s.key)
            .output()
            .expect("run python (HUTCH_TEST_PYTHON, with e2b installed)");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success() && text.contains("ok"), "{text}");
    });
}
