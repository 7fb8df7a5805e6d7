//! Images from local files: an OCI image layout (a directory with `oci-layout` and
//! `index.json`, or a tar of one) or a `docker save` archive (`manifest.json` listing the
//! config and layer files). Every blob goes into the [`BlobStore`] with its sha256 checked,
//! exactly as a pull's; what follows (unpacking) is the same.
//!
//! A tarball is read in a few passes (the JSON documents first, then the layers) without
//! being unpacked anywhere: only the entries the image names are read, by their path in the
//! archive, and paths with `..` or an absolute start are never looked at.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use oci_spec::image::{ImageIndex, ImageManifest};
use sha2::{Digest as _, Sha256};

use crate::blobs::{BlobStore, Digest};
use crate::config;
use crate::error::{ImageError, IoContext, Result};
use crate::registry::{PulledImage, PulledLayer};
use crate::unpack::{Compression, Limits};

/// Largest JSON document (index, manifest, config) read from a local image.
const MAX_JSON: u64 = 4 << 20;

/// Where the files are.
enum Files {
    /// An unpacked OCI layout.
    Dir(PathBuf),
    /// A tarball (OCI layout or `docker save`).
    Tar(PathBuf),
}

/// `path` relative to the archive root, refused when it could leave it.
fn clean(path: &str) -> Option<String> {
    let p = path.trim_start_matches("./");
    (!p.is_empty() && !p.starts_with('/') && !p.split('/').any(|c| c == "..")).then(|| p.to_owned())
}

/// `rel` in the layout directory `dir`, where its symlinks lead, if that is still inside
/// `dir` (a `docker save` archive links its layers to each other; a link out of the
/// directory is as if the file were not there). The directory is the caller's own (an
/// upload the server unpacked, a layout the operator named): nothing changes it meanwhile.
fn inside(dir: &Path, rel: &str) -> Option<PathBuf> {
    let root = std::fs::canonicalize(dir).ok()?;
    let path = std::fs::canonicalize(dir.join(rel)).ok()?;
    path.starts_with(&root).then_some(path)
}

impl Files {
    /// The whole file `rel` if it exists and is at most `limit` bytes.
    fn read(&self, rel: &str, limit: u64) -> Result<Option<Vec<u8>>> {
        let Some(rel) = clean(rel) else {
            return Ok(None);
        };
        match self {
            Files::Dir(dir) => {
                let Some(path) = inside(dir, &rel) else {
                    return Ok(None);
                };
                match std::fs::symlink_metadata(&path) {
                    Ok(m) if m.is_file() && m.len() <= limit => {
                        Ok(Some(std::fs::read(&path).at("reading", &path)?))
                    }
                    Ok(m) if m.is_file() => Err(too_large(&rel, limit)),
                    _ => Ok(None),
                }
            }
            Files::Tar(tar) => {
                let mut found = None;
                each_entry(tar, |name, entry| {
                    if name != rel {
                        return Ok(true);
                    }
                    if entry.header().size().unwrap_or(u64::MAX) > limit {
                        return Err(too_large(&rel, limit));
                    }
                    let mut bytes = Vec::new();
                    entry.read_to_end(&mut bytes).at("reading", tar)?;
                    found = Some(bytes);
                    Ok(false)
                })?;
                Ok(found)
            }
        }
    }

    /// Copy each `(path, digest)` into the store (skipping stored ones), each at most `max`
    /// bytes and checked against its digest.
    fn copy_blobs(&self, wanted: &[(String, Digest)], store: &BlobStore, max: u64) -> Result<()> {
        let missing: BTreeMap<String, Digest> = wanted
            .iter()
            .filter(|(_, d)| !store.contains(d))
            .filter_map(|(p, d)| Some((clean(p)?, d.clone())))
            .collect();
        match self {
            Files::Dir(dir) => {
                for (rel, digest) in &missing {
                    let path = inside(dir, rel).ok_or_else(|| missing_file(rel))?;
                    if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                        return Err(missing_file(rel));
                    }
                    let file = File::open(&path).at("opening", &path)?;
                    copy_into(store, digest, file, max, &path)?;
                }
            }
            Files::Tar(tar) => {
                let mut left = missing.clone();
                each_entry(tar, |name, entry| {
                    if let Some(digest) = left.remove(name) {
                        copy_into(store, &digest, entry, max, tar)?;
                    }
                    Ok(!left.is_empty())
                })?;
                if let Some((rel, _)) = left.into_iter().next() {
                    return Err(missing_file(&rel));
                }
            }
        }
        Ok(())
    }
}

fn too_large(rel: &str, limit: u64) -> ImageError {
    ImageError::TooLarge {
        what: "local image file",
        digest: rel.to_owned(),
        limit,
    }
}

fn missing_file(rel: &str) -> ImageError {
    ImageError::Config {
        reference: String::from("local image"),
        reason: format!("it names {rel}, which is not in it"),
    }
}

/// Call `f` with each regular entry of the tarball `tar` (cleaned name) until it says stop.
fn each_entry(
    tar: &Path,
    mut f: impl FnMut(&str, &mut tar::Entry<'_, File>) -> Result<bool>,
) -> Result<()> {
    let file = File::open(tar).at("opening", tar)?;
    let mut archive = tar::Archive::new(file);
    for entry in archive.entries().at("reading", tar)? {
        let mut entry = entry.at("reading", tar)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path_bytes().into_owned();
        let Some(name) = std::str::from_utf8(&name).ok().and_then(clean) else {
            continue;
        };
        if !f(&name, &mut entry)? {
            break;
        }
    }
    Ok(())
}

fn copy_into(
    store: &BlobStore,
    digest: &Digest,
    mut from: impl Read,
    max: u64,
    path: &Path,
) -> Result<()> {
    let mut writer = store.begin(digest, max)?;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = from.read(&mut buf).at("reading", path)?;
        if n == 0 {
            break;
        }
        writer.write(&buf[..n])?;
    }
    writer.commit().map(drop)
}

/// `blobs/sha256/<hex>` of an OCI layout.
fn blob_path(digest: &Digest) -> String {
    format!("blobs/sha256/{}", digest.hex())
}

/// Loads the image at `path` (an OCI layout directory or tarball, or a `docker save`
/// archive) into `store`. `tag` picks one of several images (an OCI layout's
/// `org.opencontainers.image.ref.name`, a docker archive's `RepoTags`); without one the
/// file must hold exactly one. The image is named `reference` in what the template records
/// (`oci:/path:1`, as the user gave it).
pub fn load(
    reference: &str,
    path: &Path,
    tag: Option<&str>,
    store: &BlobStore,
    limits: &Limits,
    progress: &mut dyn FnMut(String),
) -> Result<PulledImage> {
    let files = if path.is_dir() {
        Files::Dir(path.to_path_buf())
    } else {
        Files::Tar(path.to_path_buf())
    };
    if files.read("oci-layout", MAX_JSON)?.is_some() {
        load_oci(&files, reference, tag, store, limits, progress)
    } else if let Some(manifest) = files.read("manifest.json", MAX_JSON)? {
        load_docker(&files, reference, &manifest, tag, store, limits, progress)
    } else {
        Err(ImageError::Config {
            reference: reference.to_owned(),
            reason: String::from(
                "not an OCI image layout (no oci-layout file) nor a docker save archive (no manifest.json)",
            ),
        })
    }
}

fn bad(reference: &str, reason: impl Into<String>) -> ImageError {
    ImageError::Config {
        reference: reference.to_owned(),
        reason: reason.into(),
    }
}

/// A JSON blob of an OCI layout, read and checked against its digest.
fn read_blob(files: &Files, reference: &str, digest: &Digest) -> Result<Vec<u8>> {
    let bytes = files
        .read(&blob_path(digest), MAX_JSON)?
        .ok_or_else(|| bad(reference, format!("blob {digest} is missing")))?;
    let actual = format!("sha256:{:x}", Sha256::digest(&bytes));
    if actual != digest.to_string() {
        return Err(ImageError::DigestMismatch {
            what: "blob",
            expected: digest.to_string(),
            actual,
        });
    }
    Ok(bytes)
}

fn load_oci(
    files: &Files,
    reference: &str,
    tag: Option<&str>,
    store: &BlobStore,
    limits: &Limits,
    progress: &mut dyn FnMut(String),
) -> Result<PulledImage> {
    let index = files
        .read("index.json", MAX_JSON)?
        .ok_or_else(|| bad(reference, "the layout has no index.json"))?;
    let index: ImageIndex =
        serde_json::from_slice(&index).map_err(|e| bad(reference, format!("index.json: {e}")))?;
    let entries = index.manifests();
    let chosen = match tag {
        Some(tag) => entries
            .iter()
            .find(|d| {
                d.annotations()
                    .as_ref()
                    .and_then(|a| a.get("org.opencontainers.image.ref.name"))
                    .is_some_and(|n| n == tag)
            })
            .ok_or_else(|| bad(reference, format!("no image tagged {tag:?} in its index")))?,
        None if entries.len() == 1 => &entries[0],
        None => {
            return Err(bad(
                reference,
                format!(
                    "its index holds {} images: name one with :TAG",
                    entries.len()
                ),
            ))
        }
    };
    let mut digest = Digest::parse(chosen.digest().as_ref())?;
    // An index inside: its linux/amd64 manifest (at most a few levels).
    let mut manifest = None;
    for _ in 0..4 {
        let bytes = read_blob(files, reference, &digest)?;
        if let Ok(m) = serde_json::from_slice::<ImageManifest>(&bytes) {
            if !m.layers().is_empty() || m.config().media_type().to_string().contains("config") {
                manifest = Some((m, digest.clone()));
                break;
            }
        }
        let inner: ImageIndex = serde_json::from_slice(&bytes)
            .map_err(|e| bad(reference, format!("manifest {digest}: {e}")))?;
        let amd64 = inner
            .manifests()
            .iter()
            .find(|d| {
                d.platform().as_ref().is_some_and(|p| {
                    p.os().to_string() == "linux" && p.architecture().to_string() == "amd64"
                })
            })
            .ok_or_else(|| ImageError::WrongPlatform {
                reference: reference.to_owned(),
                found: String::from("its index lists other platforms only"),
            })?;
        digest = Digest::parse(amd64.digest().as_ref())?;
    }
    let (manifest, manifest_digest) =
        manifest.ok_or_else(|| bad(reference, "no image manifest found in its index"))?;
    progress(format!(
        "manifest {manifest_digest} ({} layers)",
        manifest.layers().len()
    ));
    let config_digest = Digest::parse(manifest.config().digest().as_ref())?;
    let config_bytes = read_blob(files, reference, &config_digest)?;
    files.copy_blobs(
        &[(blob_path(&config_digest), config_digest.clone())],
        store,
        MAX_JSON,
    )?;
    let (config, diff_ids) = config::parse(reference, &manifest_digest.to_string(), &config_bytes)?;
    if diff_ids.len() != manifest.layers().len() {
        return Err(bad(
            reference,
            format!(
                "it lists {} diff_ids for {} layers",
                diff_ids.len(),
                manifest.layers().len()
            ),
        ));
    }
    let mut layers = Vec::new();
    let mut wanted = Vec::new();
    for (layer, diff_id) in manifest.layers().iter().zip(diff_ids) {
        let media_type = layer.media_type().to_string();
        let compression = Compression::from_media_type(&media_type).ok_or_else(|| {
            ImageError::UnsupportedMediaType {
                what: "layer",
                media_type: media_type.clone(),
            }
        })?;
        let digest = Digest::parse(layer.digest().as_ref())?;
        Digest::parse(&diff_id)?;
        wanted.push((blob_path(&digest), digest.clone()));
        layers.push(PulledLayer {
            digest,
            compression,
            size: layer.size(),
            diff_id,
        });
    }
    progress(format!(
        "copying {} layers into the blob store",
        layers.len()
    ));
    files.copy_blobs(&wanted, store, limits.max_bytes)?;
    let mut config = config;
    config.blobs = std::iter::once(config_digest.to_string())
        .chain(layers.iter().map(|l| l.digest.to_string()))
        .collect();
    Ok(PulledImage { config, layers })
}

/// One image of a `docker save` archive's `manifest.json`.
#[derive(serde::Deserialize)]
struct DockerEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

fn load_docker(
    files: &Files,
    reference: &str,
    manifest: &[u8],
    tag: Option<&str>,
    store: &BlobStore,
    limits: &Limits,
    progress: &mut dyn FnMut(String),
) -> Result<PulledImage> {
    let entries: Vec<DockerEntry> = serde_json::from_slice(manifest)
        .map_err(|e| bad(reference, format!("manifest.json: {e}")))?;
    let entry = match tag {
        Some(tag) => entries
            .iter()
            .find(|e| {
                e.repo_tags
                    .iter()
                    .flatten()
                    .any(|t| t == tag || t.rsplit_once(':').is_some_and(|(_, t)| t == tag))
            })
            .ok_or_else(|| {
                bad(
                    reference,
                    format!("no image tagged {tag:?} in manifest.json"),
                )
            })?,
        None if entries.len() == 1 => &entries[0],
        None => {
            return Err(bad(
                reference,
                format!("it holds {} images: name one with :TAG", entries.len()),
            ))
        }
    };
    let config_bytes = files
        .read(&entry.config, MAX_JSON)?
        .ok_or_else(|| missing_file(&entry.config))?;
    let config_digest = Digest::parse(&format!("sha256:{:x}", Sha256::digest(&config_bytes)))?;
    let (config, diff_ids) = config::parse(reference, &config_digest.to_string(), &config_bytes)?;
    if diff_ids.len() != entry.layers.len() {
        return Err(bad(
            reference,
            format!(
                "its config lists {} diff_ids for {} layers",
                diff_ids.len(),
                entry.layers.len()
            ),
        ));
    }
    progress(format!(
        "docker archive image ({} layers)",
        entry.layers.len()
    ));
    // `docker save` writes layers uncompressed: each one's sha256 is its diff_id.
    let mut wanted = Vec::new();
    let mut layers = Vec::new();
    for (path, diff_id) in entry.layers.iter().zip(diff_ids) {
        let digest = Digest::parse(&diff_id)?;
        wanted.push((path.clone(), digest.clone()));
        layers.push(PulledLayer {
            digest,
            compression: Compression::None,
            size: 0,
            diff_id,
        });
    }
    files.copy_blobs(&wanted, store, limits.max_bytes)?;
    for layer in &mut layers {
        layer.size = std::fs::metadata(store.path(&layer.digest))
            .map(|m| m.len())
            .unwrap_or(0);
    }
    let mut config = config;
    config.blobs = layers.iter().map(|l| l.digest.to_string()).collect();
    Ok(PulledImage { config, layers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_link_out_of_its_directory_is_not_followed() {
        let work = tempfile::tempdir().expect("tempdir");
        let layout = work.path().join("layout");
        let outside = work.path().join("outside");
        std::fs::create_dir_all(layout.join("blobs/sha256")).expect("dirs");
        std::fs::create_dir_all(&outside).expect("dir");
        std::fs::write(outside.join("secret"), b"host file").expect("write");
        std::fs::write(layout.join("blobs/sha256/inner"), b"in the layout").expect("write");
        // A link that stays inside is followed (docker save links layers to each other).
        std::os::unix::fs::symlink("inner", layout.join("blobs/sha256/alias")).expect("link");
        std::os::unix::fs::symlink(&outside, layout.join("out")).expect("link");
        std::os::unix::fs::symlink("../outside/secret", layout.join("up")).expect("link");
        let files = Files::Dir(layout.clone());
        assert_eq!(
            files.read("blobs/sha256/alias", 100).expect("read"),
            Some(b"in the layout".to_vec())
        );
        assert_eq!(files.read("out/secret", 100).expect("read"), None);
        assert_eq!(files.read("up", 100).expect("read"), None);
        let store = BlobStore::open(work.path().join("store")).expect("store");
        let digest =
            Digest::parse(&format!("sha256:{:x}", Sha256::digest(b"host file"))).expect("digest");
        let copied = files.copy_blobs(&[("out/secret".into(), digest.clone())], &store, 100);
        assert!(copied.is_err(), "a blob through a link out is missing");
        assert!(!store.contains(&digest));
    }
}
