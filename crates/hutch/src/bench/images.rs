//! Image template series: a 3-layer image (8 MiB of incompressible files per gzip layer)
//! pulled from a registry on loopback (Debian's `docker-registry`, plain HTTP, started here)
//! through `POST /v1/templates`: cold (no blob stored, no template), with its blobs stored
//! but unpacked again (`force`), and fully cached (the template is from that image
//! already). Skipped when `docker-registry` or `skopeo` is missing.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::baselines::Skipped;
use super::server::BenchServer;
use super::stats::{summarize, Summary};

/// The template the series build.
const NAME: &str = "bench-image";
/// Layers of the image.
const LAYERS: usize = 3;
/// Files per layer, and the bytes of each.
const FILES: usize = 4;
const FILE_BYTES: usize = 2 << 20;

/// A registry of this run's own: the child and its directory.
struct LocalRegistry {
    child: Child,
    host: String,
    _dir: tempfile::TempDir,
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sha256:<hex>` of `bytes`.
fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// Bytes no compressor shrinks (xorshift), different per `seed`.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Layer `i` as (uncompressed tar, gzip of it).
fn layer(i: usize) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let mut b = tar::Builder::new(Vec::new());
    for dir in ["data/".to_string(), format!("data/layer{i}/")] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_mode(0o755);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        b.append_data(&mut h, dir, std::io::empty())?;
    }
    for f in 0..FILES {
        let data = noise((i * FILES + f) as u64 + 1, FILE_BYTES);
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        b.append_data(&mut h, format!("data/layer{i}/file{f}"), data.as_slice())?;
    }
    let tar = b.into_inner()?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar)?;
    Ok((tar, gz.finish()?))
}

/// Write the image as an OCI layout at `dir` (tag `1`).
fn write_layout(dir: &Path) -> anyhow::Result<()> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let put = |bytes: &[u8]| -> anyhow::Result<(String, usize)> {
        let d = digest(bytes);
        std::fs::write(blobs.join(&d["sha256:".len()..]), bytes)?;
        Ok((d, bytes.len()))
    };
    let mut diff_ids = Vec::new();
    let mut layers = Vec::new();
    for i in 0..LAYERS {
        let (tar, gz) = layer(i)?;
        diff_ids.push(digest(&tar));
        let (d, size) = put(&gz)?;
        layers.push(
            json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                           "digest": d, "size": size}),
        );
    }
    let config = json!({"architecture": "amd64", "os": "linux",
                        "config": {"Env": ["PATH=/bin"]},
                        "rootfs": {"type": "layers", "diff_ids": diff_ids}});
    let (config_digest, config_size) = put(&serde_json::to_vec(&config)?)?;
    let manifest = json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": layers});
    let (manifest_digest, manifest_size) = put(&serde_json::to_vec(&manifest)?)?;
    let index = json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": manifest_digest, "size": manifest_size,
        "annotations": {"org.opencontainers.image.ref.name": "1"}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(())
}

/// Start a plain-HTTP registry on a free loopback port and push the image to it; the
/// registry and the reference.
fn registry_with_image() -> anyhow::Result<(LocalRegistry, String)> {
    for tool in ["docker-registry", "skopeo"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
        {
            bail!("{tool} is not installed (apt-get install {tool})");
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("hutch-bench-registry-")
        .tempdir_in("/tmp")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let host = format!("127.0.0.1:{port}");
    let storage = dir.path().join("storage");
    std::fs::create_dir_all(&storage)?;
    let config = dir.path().join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {host}\n",
            storage.display()
        ),
    )?;
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting docker-registry")?;
    let registry = LocalRegistry {
        child,
        host: host.clone(),
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(&registry.host).is_err() {
        if Instant::now() > deadline {
            bail!("docker-registry did not listen on {host}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let layout = registry._dir.path().join("layout");
    write_layout(&layout)?;
    let policy = registry._dir.path().join("policy.json");
    std::fs::write(
        &policy,
        r#"{"default": [{"type": "insecureAcceptAnything"}]}"#,
    )?;
    let reference = format!("{host}/bench/image:1");
    let pushed = Command::new("skopeo")
        .arg("--policy")
        .arg(&policy)
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:1", layout.display()))
        .arg(format!("docker://{reference}"))
        .env("HOME", registry._dir.path())
        .env("XDG_RUNTIME_DIR", registry._dir.path())
        .output()
        .context("running skopeo")?;
    if !pushed.status.success() {
        bail!(
            "skopeo copy to {reference}: {}",
            String::from_utf8_lossy(&pushed.stderr)
        );
    }
    Ok((registry, reference))
}

/// Build the image's template through the API; ms from the POST to the end.
async fn build(srv: &BenchServer, reference: &str, force: bool) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let started = srv
        .post(
            "/v1/templates",
            json!({"name": NAME, "from_image": reference, "force": force}),
        )
        .await?;
    super::templates::wait_build(srv, &started, t0).await
}

/// Run the series `n` times each, on a server of their own (it must speak plain HTTP to
/// the registry).
pub async fn run(
    templates_dir: &Path,
    template: &str,
    vm_dir: &Path,
    n: usize,
) -> (Vec<Summary>, Vec<Skipped>) {
    let skipped = |e: anyhow::Error| {
        (
            Vec::new(),
            vec![Skipped {
                name: "image_build_cold".into(),
                reason: format!("{e:#}"),
            }],
        )
    };
    let (registry, reference) = match tokio::task::spawn_blocking(registry_with_image).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return skipped(e),
        Err(e) => return skipped(e.into()),
    };
    let flags = ["--insecure-registry".to_string(), registry.host.clone()];
    let srv = match BenchServer::start_with(
        templates_dir,
        template,
        vm_dir,
        false,
        0,
        "127.0.0.1:0",
        &flags,
    )
    .await
    {
        Ok(s) => s,
        Err(e) => return skipped(e),
    };
    let measured = measure(&srv, &reference, n).await;
    let _ = srv.delete(&format!("/v1/templates/{NAME}")).await;
    srv.destroy_all().await;
    srv.stop();
    drop(registry);
    match measured {
        Ok(series) => (series, Vec::new()),
        Err(e) => skipped(e),
    }
}

async fn measure(srv: &BenchServer, reference: &str, n: usize) -> anyhow::Result<Vec<Summary>> {
    let mut cold = Vec::new();
    let mut unpack = Vec::new();
    let mut cached = Vec::new();
    for _ in 0..n {
        // Deleting the template collects its blobs: the next build downloads everything.
        let _ = srv.delete(&format!("/v1/templates/{NAME}")).await;
        cold.push(build(srv, reference, false).await?);
        unpack.push(build(srv, reference, true).await?);
        cached.push(build(srv, reference, false).await?);
    }
    Ok(vec![
        summarize("image_build_cold", "ms", &cold),
        summarize("image_build_unpack_only", "ms", &unpack),
        summarize("image_build_cached", "ms", &cached),
    ])
}
