//! OCI image layouts written by the tests (`oci-layout`, `index.json`, `blobs/sha256/`), to
//! be pushed with `skopeo copy oci:DIR:TAG docker://…`.

use std::path::Path;

use serde_json::{json, Value};

use super::layers::sha256;

/// A layer: the blob, its media type and the uncompressed tar's digest.
pub struct LayerBlob {
    /// Bytes as stored.
    pub blob: Vec<u8>,
    /// `application/vnd.oci.image.layer.v1.tar+gzip`, …
    pub media_type: &'static str,
    /// sha256 of the uncompressed tar.
    pub diff_id: String,
}

impl LayerBlob {
    /// A gzip layer of `tar`.
    pub fn gzip(tar: &[u8]) -> Self {
        Self {
            blob: super::layers::gzip(tar),
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip",
            diff_id: sha256(tar),
        }
    }

    /// A zstd layer of `tar`.
    pub fn zstd(tar: &[u8]) -> Self {
        Self {
            blob: super::layers::zstd(tar),
            media_type: "application/vnd.oci.image.layer.v1.tar+zstd",
            diff_id: sha256(tar),
        }
    }

    /// An uncompressed layer.
    pub fn plain(tar: &[u8]) -> Self {
        Self {
            blob: tar.to_vec(),
            media_type: "application/vnd.oci.image.layer.v1.tar",
            diff_id: sha256(tar),
        }
    }
}

/// Writes `data` as a blob of the layout; returns its descriptor fields.
fn put(layout: &Path, data: &[u8]) -> (String, usize) {
    let digest = sha256(data);
    let dir = layout.join("blobs/sha256");
    std::fs::create_dir_all(&dir).expect("mkdir blobs");
    std::fs::write(dir.join(&digest["sha256:".len()..]), data).expect("write blob");
    (digest, data.len())
}

/// Writes an image manifest for `arch` with `layers` and a config whose `config` object is
/// `runtime`; returns the manifest's descriptor.
pub fn image(layout: &Path, arch: &str, layers: &[LayerBlob], runtime: Value) -> Value {
    let config = json!({
        "architecture": arch, "os": "linux", "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
    });
    let config_bytes = serde_json::to_vec(&config).expect("json");
    let (config_digest, config_size) = put(layout, &config_bytes);
    let layer_descriptors: Vec<Value> = layers
        .iter()
        .map(|l| {
            let (digest, size) = put(layout, &l.blob);
            json!({"mediaType": l.media_type, "digest": digest, "size": size})
        })
        .collect();
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
        "layers": layer_descriptors,
    });
    let bytes = serde_json::to_vec(&manifest).expect("json");
    let (digest, size) = put(layout, &bytes);
    json!({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": size,
           "platform": {"architecture": arch, "os": "linux"}})
}

/// Writes an image index of `manifests`; returns its descriptor.
pub fn index(layout: &Path, manifests: Vec<Value>) -> Value {
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                       "manifests": manifests});
    let bytes = serde_json::to_vec(&index).expect("json");
    let (digest, size) = put(layout, &bytes);
    json!({"mediaType": "application/vnd.oci.image.index.v1+json", "digest": digest, "size": size})
}

/// Writes `oci-layout` and an `index.json` naming `top` as `tag`.
pub fn finish(layout: &Path, tag: &str, mut top: Value) {
    top["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
    if let Some(obj) = top.as_object_mut() {
        obj.remove("platform");
    }
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion": "1.0.0"}"#,
    )
    .expect("oci-layout");
    let index = json!({"schemaVersion": 2, "manifests": [top]});
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).expect("json"),
    )
    .expect("index.json");
}

/// The layer of a small busybox image: `/bin/busybox` from this host (Debian's
/// `busybox-static`), `/bin/sh` linking to it, `/etc/passwd` and a marker file.
pub fn busybox_layer(marker: &str) -> Vec<u8> {
    let busybox =
        std::fs::read("/bin/busybox").expect("/bin/busybox (apt-get install busybox-static)");
    super::layers::tar(&[
        super::layers::E::Dir("bin/", 0o755),
        super::layers::E::File("bin/busybox", &busybox, 0o755),
        super::layers::E::Symlink("bin/sh", "busybox"),
        super::layers::E::Symlink("bin/cat", "busybox"),
        super::layers::E::Symlink("bin/ls", "busybox"),
        super::layers::E::Dir("etc/", 0o755),
        super::layers::E::File("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644),
        super::layers::E::File("etc/hosts", b"10.0.0.1 image-hosts\n", 0o644),
        super::layers::E::File("from-image", marker.as_bytes(), 0o644),
    ])
}
