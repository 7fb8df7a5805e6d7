//! Templates from OCI images: the image is pulled into the store's shared blob directory,
//! its layers are applied to the build's `rootfs` ([`hutch_image::Unpacker`]), and the root
//! gets what every template has ([`layout::prepare_image_root`]).

use std::collections::BTreeMap;
use std::path::Path;

use hutch_image::{
    BlobStore, ImageConfig, Layer, PullEvent, PullOptions, RootDir, Throttle, TransferAction,
    Unpacker,
};

use crate::build::BuildContext;
use crate::error::{Result, TemplateError};
use crate::info::ResourceDefaults;
use crate::recipes::layout;

/// `recipe` recorded in `template.json` for templates built from images.
pub(crate) const RECIPE: &str = "image";

/// What to build a template from.
#[derive(Debug, Clone)]
pub struct ImageSource {
    /// The image reference (`registry.example:5000/team/tools:1`, `debian:12`).
    pub reference: String,
    /// How to reach the registry, and the unpack limits.
    pub pull: PullOptions,
    /// Read the image from these local files instead (an upload through the API, say);
    /// `reference` is then only what the template records.
    pub local: Option<LocalImage>,
    /// The default resources the template gives its sandboxes, over the image's: written
    /// with the revision, so no create sees it without them.
    pub resources: crate::SandboxResources,
}

/// An image in local files: an OCI image layout (a directory or a tarball of one) or a
/// `docker save` archive (a tarball, or a directory it was unpacked into).
#[derive(Debug, Clone)]
pub struct LocalImage {
    /// The directory or the tarball.
    pub path: std::path::PathBuf,
    /// Which of its images (a layout's `org.opencontainers.image.ref.name`, an archive's
    /// `RepoTags` entry); without one it must hold exactly one.
    pub tag: Option<String>,
}

/// Pulls `source` and fills the empty `rootfs` from it; returns the image's configuration.
pub(crate) fn build(
    rootfs: &Path,
    blobs: &BlobStore,
    source: &ImageSource,
    ctx: &mut BuildContext<'_>,
) -> Result<ImageConfig> {
    let local = match &source.local {
        Some(l) => Some((l.path.as_path(), l.tag.as_deref())),
        None => local_path(&source.reference).map(|(p, t)| (Path::new(p), t)),
    };
    let pulled = match local {
        Some((path, tag)) => {
            ctx.step(format!("reading {}", source.reference))?;
            hutch_image::load(
                &source.reference,
                path,
                tag,
                blobs,
                &source.pull.limits,
                &mut |line| ctx.output(line),
            )
        }
        None => {
            ctx.step(format!("pulling {}", source.reference))?;
            // A cancel of the build stops the pull even in the middle of a layer.
            let pull = hutch_image::PullOptions {
                cancel: ctx.options.cancel.clone(),
                ..source.pull.clone()
            };
            hutch_image::pull(&source.reference, blobs, &pull, &mut |event| match event {
                PullEvent::Line(line) => ctx.output(line),
                PullEvent::Transfer(t) => ctx.transfer(t),
            })
        }
    };
    let image = pulled.map_err(|e| in_step(ctx, e))?;

    let root = RootDir::open(rootfs).map_err(|e| in_step(ctx, e))?;
    let mut unpacker =
        Unpacker::new(&root, source.pull.limits).with_cancel(ctx.options.cancel.clone());
    let count = image.layers.len();
    for (i, layer) in image.layers.iter().enumerate() {
        ctx.step(format!(
            "unpacking layer {}/{count} {} ({} bytes)",
            i + 1,
            layer.digest.short(),
            layer.size
        ))?;
        let blob = blobs.path(&layer.digest);
        let digest = layer.digest.to_string();
        let label = format!("layer {}/{count}", i + 1);
        let mut throttle = Throttle::new(&digest, &label, TransferAction::Extract, layer.size);
        let applied = unpacker.apply_reporting(
            &Layer {
                blob: &blob,
                digest: &digest,
                compression: layer.compression,
                diff_id: Some(&layer.diff_id),
            },
            &mut |n| {
                if let Some(t) = throttle.advance(n) {
                    ctx.transfer(t);
                }
            },
        );
        applied.map_err(|e| in_step(ctx, e))?;
        if let Some(t) = throttle.finish() {
            ctx.transfer(t);
        }
    }
    let s = unpacker.summary().clone();
    ctx.output(format!(
        "{} entries, {} bytes of file data",
        s.files, s.bytes
    ));
    for (n, what) in [
        (s.setid_stripped, "set-uid/set-gid bits stripped"),
        (s.devices_skipped, "device nodes skipped"),
        (s.xattrs_ignored, "entries' extended attributes not applied"),
    ] {
        if n > 0 {
            ctx.output(format!("note: {n} {what}"));
        }
    }

    ctx.step("preparing sandbox directories and /etc")?;
    layout::prepare_image_root(rootfs)?;
    make_working_dir(&root, rootfs, image.config.working_dir.as_deref(), ctx);
    Ok(image.config)
}

/// Creates the image's `WorkingDir` when no layer made it, as a container runtime does at
/// start (`mkdir -p`, owned by root): commands run there by default. A path that exists in
/// any form (a symlink too) is left alone; one that cannot be made is noted, and the exec
/// that needs it later says so.
fn make_working_dir(root: &RootDir, rootfs: &Path, dir: Option<&str>, ctx: &mut BuildContext<'_>) {
    let Some(rel) = dir
        .map(|d| d.trim_start_matches('/'))
        .filter(|d| !d.is_empty())
    else {
        return;
    };
    if rootfs.join(rel).symlink_metadata().is_ok() {
        return;
    }
    match root.ensure_dir_keeping(rel, 0o755) {
        Ok(()) => ctx.output(format!("created the working directory /{rel}")),
        Err(e) => ctx.output(format!("note: working directory /{rel} not created: {e}")),
    }
}

/// Whether `reference` names local files (`oci:`, `oci-archive:`, `docker-archive:`), not
/// an image in a registry.
pub fn is_local_reference(reference: &str) -> bool {
    local_path(reference).is_some()
}

/// A local image reference, as skopeo and podman spell them: `oci:PATH[:TAG]` (an OCI
/// layout directory), `oci-archive:PATH[:TAG]` (a tarball of one), `docker-archive:PATH[:TAG]`
/// (`docker save`). `None` for a registry reference.
pub fn local_path(reference: &str) -> Option<(&str, Option<&str>)> {
    let rest = ["oci:", "oci-archive:", "docker-archive:"]
        .iter()
        .find_map(|prefix| reference.strip_prefix(prefix))?;
    match rest.rsplit_once(':') {
        Some((path, tag)) if !tag.is_empty() && !tag.contains('/') => Some((path, Some(tag))),
        _ => Some((rest, None)),
    }
}

/// Default resources of a template from an image: like `base`, with the image's `Env`
/// (and the usual `PATH` when the image sets none).
pub(crate) fn defaults(config: &ImageConfig) -> ResourceDefaults {
    let mut env: BTreeMap<String, String> = config
        .env
        .iter()
        .filter_map(|pair| pair.split_once('='))
        .filter(|(key, _)| !key.is_empty())
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    env.entry(String::from("PATH")).or_insert_with(|| {
        String::from("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    });
    ResourceDefaults {
        cpus: 1.0,
        memory_mib: 512,
        disk_mib: 2048,
        pids_max: 1024,
        env,
        isolation: None,
        // `docker exec`'s defaults: the image's working directory and user.
        exec: hutch_proto::ExecDefaults {
            cwd: config.working_dir.clone(),
            user: config.user.clone(),
        },
    }
}

/// Attributes an image error to the current step.
fn in_step(ctx: &BuildContext<'_>, source: hutch_image::ImageError) -> TemplateError {
    TemplateError::Image {
        step: ctx.current_step().to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_references_name_a_path_and_maybe_a_tag() {
        assert_eq!(
            local_path("oci:/tmp/layout:1"),
            Some(("/tmp/layout", Some("1")))
        );
        assert_eq!(
            local_path("oci-archive:/tmp/i.tar"),
            Some(("/tmp/i.tar", None))
        );
        assert_eq!(
            local_path("docker-archive:/tmp/d.tar:app"),
            Some(("/tmp/d.tar", Some("app")))
        );
        assert_eq!(local_path("registry:5000/team/tools:1"), None);
    }

    #[test]
    fn image_env_becomes_the_default_env() {
        let config = ImageConfig {
            env: vec!["A=b=c".into(), "NOVALUE".into(), "=x".into()],
            ..ImageConfig::default()
        };
        let d = defaults(&config);
        assert_eq!(d.env.get("A").map(String::as_str), Some("b=c"));
        assert!(d.env.get("PATH").is_some_and(|p| p.contains("/usr/bin")));
        assert_eq!(d.env.len(), 2);
        let config = ImageConfig {
            env: vec!["PATH=/opt/bin".into()],
            ..ImageConfig::default()
        };
        assert_eq!(defaults(&config).env["PATH"], "/opt/bin");
    }
}
