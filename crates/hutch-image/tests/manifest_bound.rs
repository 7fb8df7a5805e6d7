//! A registry that answers a manifest request with an endless body, or with one that says it
//! is a gigabyte: the pull is refused at the 4 MiB manifest bound, having read little more
//! than that, instead of buffering whatever the registry sends. The "registry" is a few
//! lines of HTTP on loopback of the test's own (plain HTTP, asked for with
//! `insecure_registries`).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use hutch_image::{pull, BlobStore, ImageError, PullOptions};

/// How the hostile registry answers `GET /v2/evil/manifests/1`.
#[derive(Clone, Copy)]
enum Answer {
    /// No length, then bytes until the client hangs up.
    Endless,
    /// A `Content-Length` of 1 GiB (and the same bytes).
    Declared,
    /// A small manifest whose `Docker-Content-Digest` is not its hash.
    WrongDigest,
}

/// Start the registry; its address and how many body bytes it managed to send.
fn hostile_registry(answer: Answer) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let counter = counter.clone();
            thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                loop {
                    let mut request = String::new();
                    if reader.read_line(&mut request).unwrap_or(0) == 0 {
                        return;
                    }
                    // The rest of the head.
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                            break;
                        }
                    }
                    if request.starts_with("GET /v2/ ") || request.starts_with("GET /v2 ") {
                        let _ = stream.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}",
                        );
                        continue;
                    }
                    if let Answer::WrongDigest = answer {
                        let body = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size":2},"layers":[]}"#;
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nDocker-Content-Digest: sha256:{}\r\nContent-Length: {}\r\n\r\n",
                            "1".repeat(64),
                            body.len()
                        );
                        let _ = stream.write_all(head.as_bytes());
                        let _ = stream.write_all(body);
                        continue;
                    }
                    let head = match answer {
                        Answer::Endless => "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nConnection: close\r\n\r\n".to_owned(),
                        Answer::Declared | Answer::WrongDigest => format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nContent-Length: {}\r\n\r\n",
                            1u64 << 30
                        ),
                    };
                    if stream.write_all(head.as_bytes()).is_err() {
                        return;
                    }
                    let chunk = vec![b' '; 64 << 10];
                    // At most 1 GiB; the client is expected to hang up long before.
                    for _ in 0..(1u64 << 30) / chunk.len() as u64 {
                        if stream.write_all(&chunk).is_err() {
                            return;
                        }
                        counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                    return;
                }
            });
        }
    });
    (addr, sent)
}

fn pull_from(addr: &str) -> Result<hutch_image::PulledImage, ImageError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = BlobStore::open(dir.path().join("blobs")).expect("store");
    let options = PullOptions {
        insecure_registries: vec![addr.to_owned()],
        ignore_docker_config: true,
        ..PullOptions::default()
    };
    pull(&format!("{addr}/evil:1"), &store, &options, &mut |_| {})
}

#[test]
fn an_endless_manifest_is_cut_off_at_the_bound() {
    let (addr, sent) = hostile_registry(Answer::Endless);
    let err = pull_from(&addr).expect_err("refused");
    assert!(
        matches!(err, ImageError::TooLarge { what: "manifest", limit, .. } if limit == 4 << 20),
        "{err}"
    );
    assert!(
        err.to_string().contains("larger than 4194304 bytes"),
        "{err}"
    );
    // What the registry got out before the client hung up: the bound and what the socket
    // buffers hold, not the gigabyte it meant to send.
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent < 64 << 20, "the client read {sent} bytes");
}

#[test]
fn a_manifest_declared_too_large_is_refused_before_its_body() {
    let (addr, sent) = hostile_registry(Answer::Declared);
    let err = pull_from(&addr).expect_err("refused");
    assert!(
        matches!(
            err,
            ImageError::TooLarge {
                what: "manifest",
                ..
            }
        ),
        "{err}"
    );
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent < 64 << 20, "the client read {sent} bytes");
}

#[test]
fn a_manifest_that_is_not_what_the_registry_declares_is_refused() {
    let (addr, _) = hostile_registry(Answer::WrongDigest);
    let err = pull_from(&addr).expect_err("refused");
    assert!(
        matches!(
            err,
            ImageError::DigestMismatch {
                what: "manifest",
                ..
            }
        ),
        "{err}"
    );
}
