//! Pulls from a real registry on loopback (Debian's `docker-registry`, TLS from a test CA,
//! htpasswd auth) holding images the tests make: a multi-platform index, a Docker v2 image
//! with whiteouts, a wrong password, a tampered blob, credentials from a Docker
//! `config.json`, an untrusted certificate and a malicious layer.

mod support;

use std::fs;
use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use hutch_image::{
    pull, BlobStore, Credentials, ImageError, Layer, Limits, PullEvent, PullOptions, PulledImage,
    RootDir, Transfer, TransferAction, Unpacker,
};
use serde_json::json;
use support::layers::{tar, E};
use support::oci::{self, busybox_layer, LayerBlob};
use support::registry::{run, Registry, PASSWORD, USER};

/// Options that trust the registry's CA and log in.
fn options(registry: &Registry) -> PullOptions {
    PullOptions {
        credentials: Some(Credentials::new(USER, PASSWORD)),
        docker_config: Some(registry.dir.path().join("no-config.json")),
        ca_certificates: vec![registry.ca.clone()],
        ..PullOptions::default()
    }
}

/// Pulls `reference` into a fresh store under `dir`, collecting progress lines.
fn pull_into(
    dir: &Path,
    reference: &str,
    options: &PullOptions,
) -> (Result<PulledImage, ImageError>, Vec<String>) {
    let store = BlobStore::open(dir.join("blobs")).expect("store");
    let mut lines = Vec::new();
    let mut transfers: Vec<Transfer> = Vec::new();
    let result = pull(reference, &store, options, &mut |event| match event {
        PullEvent::Line(l) => lines.push(l),
        PullEvent::Transfer(t) => transfers.push(t),
    });
    if result.is_ok() {
        // Every blob downloaded was reported, ending at its full size.
        let downloaded = lines.iter().filter(|l| l.contains(" downloading ")).count();
        let finished: Vec<&Transfer> = transfers
            .iter()
            .filter(|t| t.current == t.total && t.action == TransferAction::Download)
            .collect();
        assert_eq!(finished.len(), downloaded, "{lines:?}\n{transfers:?}");
        assert!(finished.iter().all(|t| t.digest.starts_with("sha256:")));
    }
    (result, lines)
}

/// Applies a pulled image's layers to `dir/rootfs`.
fn unpack(dir: &Path, image: &PulledImage) -> Result<(), ImageError> {
    let store = BlobStore::open(dir.join("blobs")).expect("store");
    let root_path = dir.join("rootfs");
    fs::create_dir_all(&root_path).expect("mkdir");
    let root = RootDir::open(&root_path).expect("root");
    let mut unpacker = Unpacker::new(&root, Limits::default());
    for layer in &image.layers {
        let blob = store.path(&layer.digest);
        let digest = layer.digest.to_string();
        unpacker.apply(&Layer {
            blob: &blob,
            digest: &digest,
            compression: layer.compression,
            diff_id: Some(&layer.diff_id),
        })?;
    }
    Ok(())
}

#[test]
fn pulls_the_amd64_image_of_a_multi_platform_index_and_stores_blobs_once() {
    let registry = Registry::start();
    let layout = registry.dir.path().join("layout");
    let runtime = json!({"Env": ["PATH=/bin", "GREETING=hi"], "WorkingDir": "/srv", "User": "1000",
                         "Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo served"], "ExposedPorts": {"8080/tcp": {}}});
    let amd64 = oci::image(
        &layout,
        "amd64",
        &[
            LayerBlob::gzip(&busybox_layer("amd64")),
            LayerBlob::zstd(&tar(&[E::File("second", b"2", 0o644)])),
        ],
        runtime.clone(),
    );
    let arm64 = oci::image(
        &layout,
        "arm64",
        &[LayerBlob::gzip(&busybox_layer("arm64"))],
        runtime,
    );
    let index = oci::index(&layout, vec![arm64, amd64]);
    oci::finish(&layout, "multi", index);
    let reference = registry.push(&layout, "multi", "tools", true, false);

    let work = tempfile::tempdir().expect("tempdir");
    let (image, lines) = pull_into(work.path(), &reference, &options(&registry));
    let image = image.unwrap_or_else(|e| panic!("{e}\n{}", registry.log()));
    assert_eq!(image.layers.len(), 2, "{lines:?}");
    assert_eq!(image.config.env, vec!["PATH=/bin", "GREETING=hi"]);
    assert_eq!(image.config.working_dir.as_deref(), Some("/srv"));
    assert_eq!(image.config.user.as_deref(), Some("1000"));
    assert_eq!(
        image.config.start_command(),
        vec!["/bin/sh", "-c", "echo served"]
    );
    assert_eq!(image.config.exposed_ports, vec!["8080/tcp"]);
    unpack(work.path(), &image).expect("unpacks");
    assert_eq!(
        fs::read(work.path().join("rootfs/from-image")).expect("marker"),
        b"amd64"
    );
    assert_eq!(
        fs::read(work.path().join("rootfs/second")).expect("zstd layer"),
        b"2"
    );

    // A second pull downloads nothing.
    let (again, lines) = pull_into(work.path(), &reference, &options(&registry));
    assert_eq!(again.expect("pulls again"), image);
    let stored: Vec<&String> = lines
        .iter()
        .filter(|l| l.ends_with("already stored"))
        .collect();
    assert_eq!(
        stored.len(),
        3,
        "config and both layers come from the store: {lines:?}"
    );
}

#[test]
fn pulls_a_docker_v2_image_and_applies_its_whiteouts() {
    let registry = Registry::start();
    let layout = registry.dir.path().join("layout");
    let lower = tar(&[
        E::Dir("opt/", 0o755),
        E::Dir("opt/old/", 0o755),
        E::File("opt/old/a", b"a", 0o644),
        E::File("opt/old/b", b"b", 0o644),
        E::File("gone", b"gone", 0o644),
    ]);
    let upper = tar(&[
        E::File(".wh.gone", b"", 0o644),
        E::Dir("opt/old/", 0o755),
        E::File("opt/old/.wh..wh..opq", b"", 0o644),
        E::File("opt/old/c", b"c", 0o644),
    ]);
    let top = oci::image(
        &layout,
        "amd64",
        &[
            LayerBlob::gzip(&busybox_layer("v2")),
            LayerBlob::gzip(&lower),
            LayerBlob::gzip(&upper),
        ],
        json!({"Cmd": ["/bin/sh"]}),
    );
    oci::finish(&layout, "v2", top);
    let reference = registry.push(&layout, "v2", "docker", false, true);
    let manifest = run(Command::new("curl")
        .args(["-sS", "--cacert"])
        .arg(&registry.ca)
        .args([
            "-u",
            &format!("{USER}:{PASSWORD}"),
            "-H",
            "Accept: application/vnd.docker.distribution.manifest.v2+json",
            &format!("https://{}/v2/docker/manifests/v2", registry.host),
        ]));
    assert!(
        manifest.contains("application/vnd.docker.distribution.manifest.v2+json")
            && manifest.contains("application/vnd.docker.image.rootfs.diff.tar.gzip"),
        "skopeo stored a Docker schema 2 manifest: {manifest}"
    );

    let work = tempfile::tempdir().expect("tempdir");
    let (image, _) = pull_into(work.path(), &reference, &options(&registry));
    let image = image.unwrap_or_else(|e| panic!("{e}\n{}", registry.log()));
    unpack(work.path(), &image).expect("unpacks");
    let root = work.path().join("rootfs");
    assert!(!root.join("gone").exists(), "whiteout applied");
    assert!(
        !root.join("opt/old/a").exists() && !root.join("opt/old/b").exists(),
        "opaque dir applied"
    );
    assert_eq!(fs::read(root.join("opt/old/c")).expect("c"), b"c");
    assert_eq!(image.config.cmd, vec!["/bin/sh"]);
}

#[test]
fn a_wrong_password_is_a_clear_401_and_config_json_credentials_work() {
    let registry = Registry::start();
    let layout = registry.dir.path().join("layout");
    let top = oci::image(
        &layout,
        "amd64",
        &[LayerBlob::plain(&busybox_layer("auth"))],
        json!({}),
    );
    oci::finish(&layout, "auth", top);
    let reference = registry.push(&layout, "auth", "private", false, false);
    let work = tempfile::tempdir().expect("tempdir");

    for credentials in [Some(Credentials::new(USER, "wrong password")), None] {
        let opts = PullOptions {
            credentials,
            ..options(&registry)
        };
        let (result, _) = pull_into(work.path(), &reference, &opts);
        let err = result.expect_err("refused");
        assert!(matches!(err, ImageError::Unauthorized { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("401 Unauthorized") && text.contains(&registry.host),
            "{text}"
        );
    }

    let config = work.path().join("config.json");
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    fs::write(
        &config,
        format!(
            r#"{{"auths": {{"https://{}": {{"auth": "{auth}"}}}}}}"#,
            registry.host
        ),
    )
    .expect("write config.json");
    let opts = PullOptions {
        credentials: None,
        docker_config: Some(config.clone()),
        ..options(&registry)
    };
    let (result, _) = pull_into(work.path(), &reference, &opts);
    result.expect("credentials from config.json");

    // The same credentials from a credential helper the file names for the registry
    // (`docker-credential-<name> get`, found on PATH), as Docker runs it.
    let bin = work.path().join("helpers");
    fs::create_dir(&bin).expect("mkdir");
    let helper = bin.join("docker-credential-hutch-test");
    fs::write(
        &helper,
        format!(
            "#!/bin/sh\nread server\n[ \"$1 $server\" = 'get {}' ] || exit 1\n\
             echo '{{\"Username\":\"{USER}\",\"Secret\":\"{PASSWORD}\"}}'\n",
            registry.host
        ),
    )
    .expect("write helper");
    fs::set_permissions(&helper, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    fs::write(
        &config,
        format!(
            r#"{{"credHelpers": {{"{}": "hutch-test"}}}}"#,
            registry.host
        ),
    )
    .expect("write config.json");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![bin.clone()];
    dirs.extend(std::env::split_paths(&path));
    // This test's own process (nextest runs each test in one of its own).
    std::env::set_var("PATH", std::env::join_paths(dirs).expect("PATH"));
    let work2 = tempfile::tempdir().expect("tempdir");
    let (result, _) = pull_into(work2.path(), &reference, &opts);
    result.expect("credentials from the credential helper");
}

#[test]
fn a_tampered_blob_and_an_untrusted_certificate_are_refused() {
    let registry = Registry::start();
    let layout = registry.dir.path().join("layout");
    let layer = LayerBlob::gzip(&busybox_layer("tampered"));
    let digest = support::layers::sha256(&layer.blob);
    let top = oci::image(&layout, "amd64", &[layer], json!({}));
    oci::finish(&layout, "t", top);
    let reference = registry.push(&layout, "t", "tampered", false, false);

    let work = tempfile::tempdir().expect("tempdir");
    let opts = PullOptions {
        ca_certificates: Vec::new(),
        ..options(&registry)
    };
    let (result, _) = pull_into(work.path(), &reference, &opts);
    let err = result.expect_err("untrusted certificate");
    assert!(matches!(err, ImageError::Registry { .. }), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );

    let file = registry.blob_file(&digest);
    let mut bytes = fs::read(&file).expect("registry blob");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    fs::write(&file, &bytes).expect("tamper");
    let (result, _) = pull_into(work.path(), &reference, &options(&registry));
    let err = result.expect_err("tampered");
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&digest), "{err}");
    let store = BlobStore::open(work.path().join("blobs")).expect("store");
    assert!(!store.contains(&hutch_image::Digest::parse(&digest).expect("digest")));
    assert_eq!(
        fs::read_dir(store.dir().join("tmp")).expect("ls").count(),
        0,
        "no partial download left"
    );
}

#[test]
fn a_malicious_layer_from_the_registry_writes_nothing_outside() {
    let registry = Registry::start();
    let layout = registry.dir.path().join("layout");
    let work = tempfile::tempdir().expect("tempdir");
    let outside = work.path().join("outside");
    fs::create_dir(&outside).expect("mkdir");
    let evil = tar(&[
        E::File("ok", b"fine", 0o644),
        E::Symlink("link", &outside.display().to_string()),
        E::File("link/pwned", b"x", 0o644),
    ]);
    let top = oci::image(&layout, "amd64", &[LayerBlob::gzip(&evil)], json!({}));
    oci::finish(&layout, "evil", top);
    let reference = registry.push(&layout, "evil", "evil", false, false);
    let (image, _) = pull_into(work.path(), &reference, &options(&registry));
    let err = unpack(work.path(), &image.expect("the blob itself is intact")).expect_err("refused");
    assert!(matches!(err, ImageError::UnsafeEntry { .. }), "{err}");
    assert!(err.to_string().contains("`link` is a symlink"), "{err}");
    assert_eq!(
        fs::read_dir(&outside).expect("ls").count(),
        0,
        "nothing written through the link"
    );
}

/// A TCP proxy of the test's own in front of `upstream` that passes what the client sends
/// at once and what the server sends at about 320 KiB/s: a download that takes minutes.
/// Its address (`127.0.0.1:port`, which the registry's certificate names too).
fn slow_proxy(upstream: String) -> String {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            let (mut c_read, mut s_write) = (
                client.try_clone().expect("clone"),
                server.try_clone().expect("clone"),
            );
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c_read, &mut s_write);
            });
            let (mut s_read, mut c_write) = (server, client);
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 << 10];
                loop {
                    match s_read.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if c_write.write_all(&buf[..n]).is_err() {
                                break;
                            }
                            std::thread::sleep(std::time::Duration::from_millis(50));
                        }
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn a_cancel_stops_a_pull_in_the_middle_of_a_layer() {
    let registry = Registry::start();
    let layout = registry.dir.path().join("layout");
    // 24 MiB that does not compress: at the proxy's pace, over a minute to download.
    let mut data = vec![0u8; 24 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let layer = LayerBlob::plain(&tar(&[E::File("big.bin", &data, 0o644)]));
    let digest = support::layers::sha256(&layer.blob);
    let top = oci::image(&layout, "amd64", &[layer], json!({}));
    oci::finish(&layout, "big", top);
    let reference = registry.push(&layout, "big", "big", false, false);
    let proxy = slow_proxy(registry.host.clone());
    let through_proxy = reference.replacen(&registry.host, &proxy, 1);

    let work = tempfile::tempdir().expect("tempdir");
    let store = BlobStore::open(work.path().join("blobs")).expect("store");
    let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let opts = PullOptions {
        cancel: Some(cancel.clone()),
        ..options(&registry)
    };
    let mut downloaded = 0u64;
    let mut asked = None;
    let result = pull(&through_proxy, &store, &opts, &mut |event| {
        if let PullEvent::Transfer(t) = event {
            downloaded = t.current;
            // Once a megabyte of the layer has come: cancel.
            if t.total > 1 << 20 && t.current >= 1 << 20 && asked.is_none() {
                cancel.store(true, std::sync::atomic::Ordering::Relaxed);
                asked = Some(std::time::Instant::now());
            }
        }
    });
    let err = result.expect_err("the pull was cancelled");
    assert!(matches!(err, ImageError::Cancelled), "{err}");
    let asked = asked.expect("the layer's download was under way");
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(20),
        "stopped long before the layer's end (took {:?})",
        asked.elapsed()
    );
    assert!(
        downloaded < (24 << 20),
        "{downloaded} bytes: the layer was not finished"
    );
    assert!(!store.contains(&hutch_image::Digest::parse(&digest).expect("digest")));
    assert_eq!(
        fs::read_dir(store.dir().join("tmp")).expect("ls").count(),
        0,
        "no partial download left"
    );
}
