//! `hutch cp` of directories (tar streams through `…/files/archive`, made and unpacked by the
//! agent) and `-`, and both ends refusing hostile archives: an upload from an API caller, and
//! a download from a sandbox whose agent is not to be trusted.

use std::io::{Read, Write};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use hutch_testkit::{hutch_bin, TestServer};
use reqwest::Method;
use serde_json::json;

fn hutch_with(url: &str, state: &Path, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(hutch_bin())
        .args(args)
        .env("HUTCH_URL", url)
        .env("HUTCH_STATE_DIR", state)
        .env("HUTCH_API_KEY", "test-key-unused-by-the-fake")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run hutch");
    if let Some(data) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(data)
            .expect("write stdin");
    }
    child.wait_with_output().expect("hutch output")
}

fn hutch(s: &TestServer, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(hutch_bin())
        .args(args)
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_STATE_DIR", &s.state_dir)
        .env_remove("HUTCH_API_KEY")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run hutch");
    if let Some(data) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(data)
            .expect("write stdin");
    }
    child.wait_with_output().expect("hutch output")
}

fn utf8(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A tree with what a project has: nested directories, an executable, a relative symlink,
/// an empty directory, a name longer than tar's 100 bytes, a file of several chunks.
fn make_tree(root: &Path) -> Vec<u8> {
    std::fs::create_dir_all(root.join("src/deep")).expect("mkdir");
    std::fs::create_dir_all(root.join("empty")).expect("mkdir");
    std::fs::write(root.join("README"), "hello tree\n").expect("write");
    std::fs::write(root.join("src/run.sh"), "#!/bin/sh\necho ran\n").expect("write");
    std::fs::set_permissions(
        root.join("src/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    symlink("../README", root.join("src/readme-link")).expect("symlink");
    std::fs::write(root.join("src/deep").join("l".repeat(120)), "long name\n").expect("write");
    let big: Vec<u8> = (0..700_000u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(root.join("src/big.bin"), &big).expect("write");
    big
}

fn check_tree(root: &Path, big: &[u8]) {
    assert_eq!(
        std::fs::read_to_string(root.join("README")).expect("README"),
        "hello tree\n"
    );
    let run = std::fs::metadata(root.join("src/run.sh")).expect("run.sh");
    assert_eq!(run.mode() & 0o777, 0o755);
    assert_eq!(
        std::fs::read_link(root.join("src/readme-link")).expect("link"),
        Path::new("../README")
    );
    assert_eq!(
        std::fs::read_to_string(root.join("src/deep").join("l".repeat(120))).expect("long"),
        "long name\n"
    );
    assert_eq!(std::fs::read(root.join("src/big.bin")).expect("big"), big);
    assert!(root.join("empty").is_dir());
}

#[tokio::test]
async fn directories_copy_both_ways_and_dash_is_a_tar_stream() {
    let s = TestServer::start().await;
    let id = s
        .create_id(json!({"template": "minimal", "isolation": "ns"}))
        .await;
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("tree");
    let big = make_tree(&src);

    let o = hutch(
        &s,
        &[
            "--json",
            "cp",
            src.to_str().expect("utf8"),
            &format!("{id}:/root/tree"),
        ],
        None,
    );
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    // README, run.sh, the long name and big.bin; 8 entries with the 3 directories and the link.
    let file_bytes = 11 + 19 + 10 + 700_000;
    assert_eq!(
        (v["entries"].clone(), v["copied_bytes"].clone()),
        (8.into(), file_bytes.into()),
        "{v}"
    );
    let (out, code) = s
        .sh(&id, "cd /root/tree && cat README && ./src/run.sh && readlink src/readme-link && stat -c %a src/run.sh && wc -c < src/big.bin && ls -d empty")
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "hello tree\nran\n../README\n755\n700000\nempty\n");

    let back = tmp.path().join("back");
    let o = hutch(
        &s,
        &[
            "--json",
            "cp",
            &format!("{id}:/root/tree"),
            back.to_str().expect("utf8"),
        ],
        None,
    );
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["entries"], 8, "{v}");
    check_tree(&back, &big);

    // `-`: out as a tar stream on stdout, in again from stdin.
    let o = hutch(&s, &["cp", &format!("{id}:/root/tree"), "-"], None);
    assert!(o.status.success(), "{o:?}");
    let tar_bytes = o.stdout;
    let mut names: Vec<String> = tar::Archive::new(&tar_bytes[..])
        .entries()
        .expect("a tar stream")
        .map(|e| {
            e.expect("entry")
                .path()
                .expect("path")
                .display()
                .to_string()
        })
        .collect();
    names.sort();
    assert_eq!(names.len(), 8, "{names:?}");
    assert!(names.contains(&"src/run.sh".to_string()), "{names:?}");
    let o = hutch(
        &s,
        &["cp", "-", &format!("{id}:/root/again")],
        Some(&tar_bytes),
    );
    assert!(o.status.success(), "{o:?}");
    let (out, _) = s
        .sh(
            &id,
            "cat /root/again/README; readlink /root/again/src/readme-link",
        )
        .await;
    assert_eq!(out, "hello tree\n../README\n");
    // Files still copy as files.
    let o = hutch(
        &s,
        &[
            "cp",
            &format!("{id}:/root/tree/README"),
            tmp.path().join("r").to_str().expect("utf8"),
        ],
        None,
    );
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("r")).expect("read"),
        "hello tree\n"
    );
    s.kill(&id).await;
}

/// One raw GNU tar entry with any name, as a hostile client or agent would write it.
fn raw_entry(name: &[u8], kind: u8, link: &[u8], data: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().expect("gnu").name[..name.len()].copy_from_slice(name);
    h.as_gnu_mut().expect("gnu").linkname[..link.len()].copy_from_slice(link);
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn archive(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out: Vec<u8> = entries.concat();
    out.extend([0u8; 1024]);
    out
}

/// An API caller's archive cannot write outside the directory it names inside the sandbox:
/// `..`, absolute paths, symlinks out and writes through a symlink are 400, and the agent
/// (not the host) did the refusing.
#[tokio::test]
async fn uploaded_archives_cannot_leave_their_directory() {
    let s = TestServer::start().await;
    let id = s
        .create_id(json!({"template": "minimal", "isolation": "ns"}))
        .await;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            archive(&[raw_entry(b"../../escape-dotdot", b'0', b"", b"x")]),
            "`..` component",
        ),
        (
            archive(&[raw_entry(b"/root/escape-abs", b'0', b"", b"x")]),
            "absolute paths",
        ),
        (
            archive(&[raw_entry(b"out", b'2', b"../../root", b"")]),
            "climbs out",
        ),
        (
            archive(&[raw_entry(b"etc", b'2', b"/etc", b"")]),
            "absolute path",
        ),
        (
            archive(&[
                raw_entry(b"in", b'2', b".", b""),
                raw_entry(b"in/x", b'0', b"", b"x"),
            ]),
            "in is a symlink",
        ),
    ];
    let url = format!("{}/v1/sandboxes/{id}/files/archive?path=/root/dest", s.url);
    for (body, why) in cases {
        let resp = s
            .http
            .request(Method::PUT, &url)
            .bearer_auth(&s.key)
            .body(body)
            .send()
            .await
            .expect("put");
        let status = resp.status().as_u16();
        let v: serde_json::Value = resp.json().await.unwrap_or_default();
        assert_eq!(status, 400, "{why}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(
            msg.contains("refused archive entry") && msg.contains(why),
            "{why}: {v}"
        );
    }
    // The sandbox already has a symlink out of the destination: not followed either.
    s.sh(
        &id,
        "mkdir -p /root/dest2 && ln -s /etc /root/dest2/planted",
    )
    .await;
    let body = archive(&[raw_entry(b"planted/evil", b'0', b"", b"x")]);
    let (status, v) = put_archive(&s, &id, "/root/dest2", body).await;
    assert_eq!(status, 400, "{v}");
    let (out, code) = s
        .sh(
            &id,
            "test -e /etc/evil && echo EVIL; ls -A / /root /root/dest",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("EVIL") && !out.contains("escape"), "{out}");
    s.kill(&id).await;
}

async fn put_archive(
    s: &TestServer,
    id: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let resp = s
        .http
        .request(
            Method::PUT,
            format!("{}/v1/sandboxes/{id}/files/archive?path={path}", s.url),
        )
        .bearer_auth(&s.key)
        .body(body)
        .send()
        .await
        .expect("put");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

/// Links in the sandbox that point out of the copied directory are refused when it is copied
/// out, so the user's machine never gets a symlink to its own `/etc` from a sandbox.
#[tokio::test]
async fn a_download_with_links_out_of_the_directory_is_refused_here() {
    let s = TestServer::start().await;
    let id = s
        .create_id(json!({"template": "minimal", "isolation": "ns"}))
        .await;
    let tmp = tempfile::tempdir().expect("tmp");
    for (setup, dir, why) in [
        (
            "mkdir -p /root/a && echo x > /root/a/f && ln -s /etc /root/a/etc",
            "/root/a",
            "absolute path",
        ),
        (
            "mkdir -p /root/b/c && ln -s ../../.. /root/b/c/up",
            "/root/b",
            "climbs out",
        ),
    ] {
        let (_, code) = s.sh(&id, setup).await;
        assert_eq!(code, 0);
        let dst = tmp.path().join(why.replace(' ', "-"));
        let o = hutch(
            &s,
            &["cp", &format!("{id}:{dir}"), dst.to_str().expect("utf8")],
            None,
        );
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        assert!(utf8(&o.stderr).contains(why), "{o:?}");
        for name in ["etc", "c/up"] {
            assert!(
                std::fs::symlink_metadata(dst.join(name)).is_err(),
                "{name} made"
            );
        }
    }
    s.kill(&id).await;
}

/// A sandbox's agent is not trusted (on `vm` the guest kernel is the sandbox's): a server
/// relaying a hostile archive cannot make `hutch cp` write outside its destination. The
/// stand-in server answers like a compromised agent would.
#[tokio::test]
async fn a_hostile_archive_from_the_server_writes_nothing_outside_the_destination() {
    let tmp = tempfile::tempdir().expect("tmp");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            archive(&[raw_entry(b"../outside/dotdot", b'0', b"", b"pwned")]),
            "`..` component",
        ),
        (
            archive(&[raw_entry(
                format!("{}/abs", outside.display()).as_bytes(),
                b'0',
                b"",
                b"pwned",
            )]),
            "absolute paths",
        ),
        (
            archive(&[
                raw_entry(b"hop", b'2', b"../outside", b""),
                raw_entry(b"hop/through", b'0', b"", b"pwned"),
            ]),
            "climbs out",
        ),
        (
            archive(&[
                raw_entry(b"self", b'2', b".", b""),
                raw_entry(b"self/x", b'0', b"", b"pwned"),
            ]),
            "self is a symlink",
        ),
        (
            archive(&[raw_entry(b"hard", b'1', b"../outside/victim", b"")]),
            "hard link to a path outside",
        ),
        (
            archive(&[raw_entry(b"dev", b'3', b"", b"")]),
            "not unpacked",
        ),
    ];
    for (tar_bytes, why) in cases {
        let server = FakeServer::start(tar_bytes);
        let dst = tmp.path().join("dst");
        let o = hutch_with(
            &server.url,
            tmp.path(),
            &["cp", "sbx_hostile:/root/x", dst.to_str().expect("utf8")],
            None,
        );
        assert_eq!(o.status.code(), Some(1), "{why}: {o:?}");
        assert!(utf8(&o.stderr).contains(why), "{why}: {o:?}");
        let left: Vec<_> = std::fs::read_dir(&outside).expect("ls").flatten().collect();
        assert!(left.is_empty(), "{why}: wrote {left:?}");
        server.stop();
        let _ = std::fs::remove_dir_all(&dst);
    }
}

/// A one-connection-at-a-time HTTP/1.1 server on 127.0.0.1 answering `files/stat` with a
/// directory and `files/archive` with fixed bytes.
struct FakeServer {
    url: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeServer {
    fn start(archive: Vec<u8>) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    continue;
                };
                conn.set_nonblocking(false).expect("blocking");
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head);
                let (ctype, body): (&str, Vec<u8>) = if head.contains("/files/stat") {
                    ("application/json", br#"{"name":"x","path":"/root/x","type":"dir","size":0,"mode":493,"modified_at":"2025-01-01T00:00:00Z"}"#.to_vec())
                } else {
                    ("application/x-tar", archive.clone())
                };
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(&body);
            }
        });
        Self {
            url,
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("fake server thread");
        }
    }
}
