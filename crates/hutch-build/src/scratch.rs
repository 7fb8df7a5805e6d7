//! `FROM scratch`: an empty root. Its stages run in sandboxes of the template
//! `image-scratch`, an image of no layers made here once (an OCI layout of a config and a
//! manifest, unpacked by the template store like any image): so the root holds only what
//! every Hutch template has (`/etc/hosts`, `/etc/passwd`'s root, `/workspace`, the mount
//! points) and what the stage copies in. There is no shell: a `RUN` fails, as in Docker.

use std::path::Path;
use std::sync::Arc;

use hutch_template::{BuildOptions, ImageSource, LocalImage, Progress};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::builds::{Build, Builder};
use crate::engine::{blocking, log_progress};
use crate::error::BuildError;

/// The template scratch stages run on.
pub(crate) const TEMPLATE: &str = "image-scratch";

/// Write an image of no layers as an OCI layout at `dir`.
fn write_layout(dir: &Path) -> std::io::Result<()> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let put = |bytes: Vec<u8>| -> std::io::Result<(String, usize)> {
        let hex = format!("{:x}", Sha256::digest(&bytes));
        std::fs::write(blobs.join(&hex), &bytes)?;
        Ok((format!("sha256:{hex}"), bytes.len()))
    };
    let config = json!({"architecture": "amd64", "os": "linux", "config": {},
                        "rootfs": {"type": "layers", "diff_ids": []}});
    let (config_digest, config_size) = put(config.to_string().into_bytes())?;
    let manifest = json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": []});
    let (digest, size) = put(manifest.to_string().into_bytes())?;
    let index = json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digest, "size": size}]});
    std::fs::write(dir.join("index.json"), index.to_string())?;
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
}

/// Make [`TEMPLATE`] unless it is ready.
pub(crate) async fn ensure(builder: &Arc<Builder>, build: &Arc<Build>) -> Result<(), BuildError> {
    if builder
        .manager
        .templates()
        .get(TEMPLATE)
        .is_some_and(|i| i.ready)
    {
        return Ok(());
    }
    let manager = builder.manager.clone();
    let b = build.clone();
    blocking(move || {
        let store = manager.templates();
        let work = store
            .dir()
            .join(format!(".scratch-{}", hutch_core::ids::random_token(8)));
        let made = write_layout(&work).map_err(BuildError::io("writing the scratch image"));
        let built = made.and_then(|()| {
            let source = ImageSource {
                reference: "scratch".into(),
                pull: Default::default(),
                local: Some(LocalImage {
                    path: work.clone(),
                    tag: None,
                }),
                resources: Default::default(),
            };
            let mut progress = |p: Progress| log_progress(&b, p);
            store.build_image(TEMPLATE, &source, &BuildOptions::default(), &mut progress)?;
            Ok(())
        });
        let _ = std::fs::remove_dir_all(&work);
        built
    })
    .await
}
