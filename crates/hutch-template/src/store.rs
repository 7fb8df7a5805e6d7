//! [`TemplateStore`]: the directory of templates, and building, listing and removing them.
//!
//! # Layout of the templates directory
//!
//! ```text
//! <dir>/<name>/rootfs/          the root filesystem (0755, owned by root)
//! <dir>/<name>/template.json    metadata; see `info.rs` for the format
//! <dir>/.lock-<name>            flock taken while building or removing <name>
//! <dir>/.build-<name>-<16 hex>/ a build in progress (0700), renamed to <name> when done
//! <dir>/.remove-<name>-<16 hex>/ a template being deleted, renamed out of the way first
//! <dir>/.blobs/sha256/<hex>     image blobs (layers, configs), shared by image templates
//! ```
//!
//! A template becomes visible under its name only by an atomic rename of a finished build
//! directory, whose `template.json` (with `"ready": true`) was written last and flushed.
//! A failed build deletes its directory (after unmounting anything mounted inside it); one
//! interrupted by a crash leaves a `.build-*` directory that the next build or removal of
//! the same name deletes under the lock.

use std::fs;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use crate::build::{BuildContext, BuildOptions, Progress};
use hutch_image::BlobStore;

use crate::error::{IoContext, Result, TemplateError};
use crate::image::{self, ImageSource};
use crate::info::{rfc3339_utc, ResourceDefaults, TemplateFile, TemplateInfo, FORMAT_VERSION};
use crate::lock::TemplateLock;
use crate::recipes::Recipe;
use crate::{sys, tree};

/// Name of the metadata file inside a template directory.
const METADATA_FILE: &str = "template.json";

/// Prefix of build directories.
const BUILD_PREFIX: &str = ".build-";

/// Prefix of directories being deleted.
const REMOVE_PREFIX: &str = ".remove-";

/// The blob directory shared by image templates (not a valid template name, so never
/// listed).
const BLOB_DIR: &str = ".blobs";

/// The templates directory.
#[derive(Debug, Clone)]
pub struct TemplateStore {
    /// Absolute path of the directory.
    dir: PathBuf,
}

impl TemplateStore {
    /// Opens the templates directory `dir`, creating it (mode 0755) if needed.
    pub fn open(dir: impl AsRef<Path>) -> std::result::Result<Self, TemplateError> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            fs::create_dir_all(dir).at("creating directory", dir)?;
        }
        // Root filesystems hold setuid-root programs (an image's, not only Debian's): no host
        // user may reach them. Sandboxes never walk this directory (their root is an idmapped
        // bind made by root), so root only is enough.
        if fs::metadata(dir).at("reading", dir)?.permissions().mode() & 0o777 != 0o700 {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                .at("setting mode of", dir)?;
        }
        let dir = fs::canonicalize(dir).at("resolving", dir)?;
        Ok(Self { dir })
    }

    /// The templates directory (absolute).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every template directory, ready or not, sorted by name. Builds in progress are not
    /// listed.
    pub fn list(&self) -> std::result::Result<Vec<TemplateInfo>, TemplateError> {
        let mut templates = Vec::new();
        for entry in fs::read_dir(&self.dir).at("listing directory", &self.dir)? {
            let entry = entry.at("listing directory", &self.dir)?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if validate_name(&name).is_ok() && entry.file_type().is_ok_and(|t| t.is_dir()) {
                templates.push(self.read_info(&name));
            }
        }
        templates.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(templates)
    }

    /// The template called `name`, ready or not; `None` if there is no such directory.
    pub fn get(&self, name: &str) -> Option<TemplateInfo> {
        validate_name(name).ok()?;
        self.dir.join(name).is_dir().then(|| self.read_info(name))
    }

    /// Where the root filesystem of `name` is (whether or not it exists yet).
    pub fn rootfs(&self, name: &str) -> PathBuf {
        self.dir.join(name).join("rootfs")
    }

    /// Builds the built-in template `name` unless it is already ready (or rebuilds it with
    /// [`BuildOptions::force`]). Only one process builds a name at a time; others wait for
    /// it and then return its result. On failure nothing of the build is left behind.
    pub fn build(
        &self,
        name: &str,
        options: &BuildOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> std::result::Result<TemplateInfo, TemplateError> {
        validate_name(name).map_err(|_| TemplateError::Unknown(name.to_owned()))?;
        let recipe =
            Recipe::from_name(name).ok_or_else(|| TemplateError::Unknown(name.to_owned()))?;
        self.build_from(name, Source::Recipe(recipe), options, progress)
    }

    /// Builds template `name` from the OCI image `source` (pulled into the shared blob
    /// directory `<dir>/.blobs`), like [`Self::build`]: a ready template from the same
    /// reference is kept unless [`BuildOptions::force`]; one from another reference is
    /// replaced. Built-in names are refused.
    pub fn build_image(
        &self,
        name: &str,
        source: &ImageSource,
        options: &BuildOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> std::result::Result<TemplateInfo, TemplateError> {
        self.build_custom(name, Source::Image(source), options, progress)
    }

    /// Builds template `name` from another template's root with a layer applied (see
    /// [`LayeredSource`]); like every build it replaces the old template only once it
    /// succeeded, and a ready one with the same `build_key` (and start command) is kept.
    pub fn build_layered(
        &self,
        name: &str,
        source: &LayeredSource,
        options: &BuildOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> std::result::Result<TemplateInfo, TemplateError> {
        self.build_custom(name, Source::Layered(source), options, progress)
    }

    /// A build of a name that is not a built-in recipe's.
    fn build_custom(
        &self,
        name: &str,
        source: Source<'_>,
        options: &BuildOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<TemplateInfo> {
        validate_name(name)?;
        if Recipe::from_name(name).is_some() {
            return Err(TemplateError::BuiltinName(name.to_owned()));
        }
        self.build_from(name, source, options, progress)
    }

    /// The shared blob directory of image templates.
    pub fn blob_dir(&self) -> PathBuf {
        self.dir.join(BLOB_DIR)
    }

    /// The build flow of every source: lock, reuse a ready template, build privately,
    /// publish atomically.
    fn build_from(
        &self,
        name: &str,
        source: Source<'_>,
        options: &BuildOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<TemplateInfo> {
        let start = Instant::now();
        let _lock = TemplateLock::acquire(&self.dir, name, || {
            progress(Progress::Step(format!(
                "waiting for another build of `{name}`"
            )));
        })?;
        if !options.force {
            let same_source = |info: &TemplateInfo| match &source {
                Source::Recipe(_) => true,
                Source::Image(image) => {
                    // Other resources make a new revision: a revision is never edited.
                    let mut wanted = info.defaults.clone();
                    image.resources.apply(&mut wanted);
                    info.image
                        .as_ref()
                        .is_some_and(|i| i.reference == image.reference)
                        && wanted == info.defaults
                }
                Source::Layered(layered) => {
                    info.build_key.as_deref() == Some(layered.build_key.as_str())
                        && info.start == options.start
                        // The operator's isolation choice (`set_isolation`) is not the build's.
                        && ResourceDefaults {
                            isolation: None,
                            ..info.defaults.clone()
                        } == layered.defaults
                }
            };
            if let Some(info) = self
                .get(name)
                .filter(|info| info.ready && same_source(info))
            {
                progress(Progress::Step(format!(
                    "template `{name}` is already built"
                )));
                progress(Progress::Done {
                    seconds: start.elapsed().as_secs_f64(),
                });
                return Ok(info);
            }
        }
        self.remove_leftovers(name)?;

        let rev = self.next_rev(name);
        let build_dir = BuildDir::create(&self.dir, name)?;
        let mut ctx = BuildContext::new(options, progress);
        let result = self.build_in(&source, name, rev, &build_dir.path, &mut ctx);
        let info = match result {
            Ok(info) => info,
            Err(e) => {
                let e = ctx.in_step(e);
                tracing::warn!(template = name, error = %e, "template build failed");
                return Err(e);
            }
        };
        self.publish(build_dir, name)?;
        tracing::info!(
            template = name,
            size_bytes = info.size_bytes,
            "template built"
        );
        progress(Progress::Done {
            seconds: start.elapsed().as_secs_f64(),
        });
        Ok(info)
    }

    /// Deletes the template `name` (waiting for a build of it to finish first); `Ok(false)`
    /// if there was no such template. Must not be called while sandboxes use it.
    pub fn remove(&self, name: &str) -> std::result::Result<bool, TemplateError> {
        validate_name(name)?;
        let _lock = TemplateLock::acquire(&self.dir, name, || {})?;
        self.remove_leftovers(name)?;
        let path = self.dir.join(name);
        if fs::symlink_metadata(&path).is_err() {
            return Ok(false);
        }
        let trash = self
            .dir
            .join(format!("{REMOVE_PREFIX}{name}-{}", random_suffix()?));
        fs::rename(&path, &trash).at("moving aside", &path)?;
        tree::remove_tree(&trash)?;
        self.remove_revisions(name)?;
        self.remove_tags(name)?;
        Ok(true)
    }

    /// Sets the default isolation of sandboxes created from template `name` (`auto`, `ns`
    /// or `vm`; `auto` removes the default). Rewrites `template.json` atomically under the
    /// template's lock; a later rebuild starts again from the recipe's default.
    pub fn set_isolation(
        &self,
        name: &str,
        isolation: &str,
    ) -> std::result::Result<TemplateInfo, TemplateError> {
        let value = match isolation {
            "auto" => None,
            "ns" | "vm" => Some(isolation.to_owned()),
            other => return Err(TemplateError::InvalidIsolation(other.to_owned())),
        };
        self.edit(name, |info| info.defaults.isolation = value)
    }

    /// Sets (or with `None` removes) the start command and ready check of template `name`:
    /// sandboxes created from it afterwards run it; running ones keep what they started with.
    /// Rewrites `template.json` atomically under the template's lock.
    pub fn set_start(
        &self,
        name: &str,
        start: Option<hutch_proto::ServiceSpec>,
    ) -> std::result::Result<TemplateInfo, TemplateError> {
        self.edit(name, |info| info.start = start)
    }

    /// Change a ready template's `template.json` under its lock, atomically.
    fn edit(
        &self,
        name: &str,
        change: impl FnOnce(&mut TemplateInfo),
    ) -> std::result::Result<TemplateInfo, TemplateError> {
        validate_name(name)?;
        let _lock = TemplateLock::acquire(&self.dir, name, || {})?;
        if !self.read_info(name).ready {
            return Err(TemplateError::NotReady(name.to_owned()));
        }
        let path = self.dir.join(name).join(METADATA_FILE);
        let bytes = fs::read(&path).at("reading", &path)?;
        let mut file: TemplateFile = serde_json::from_slice(&bytes).map_err(|e| {
            TemplateError::io("parsing", &path, std::io::Error::other(e.to_string()))
        })?;
        change(&mut file.info);
        let json = serde_json::to_vec_pretty(&file).map_err(|e| {
            TemplateError::io("encoding", &path, std::io::Error::other(e.to_string()))
        })?;
        let tmp = path.with_extension("json.tmp");
        fs::write(&tmp, &json).at("writing", &tmp)?;
        fs::rename(&tmp, &path).at("replacing", &path)?;
        Ok(self.read_info(name))
    }

    /// Builds `source` into `build_dir/rootfs` and writes the metadata; returns what it
    /// wrote.
    fn build_in(
        &self,
        source: &Source<'_>,
        name: &str,
        rev: u64,
        build_dir: &Path,
        ctx: &mut BuildContext<'_>,
    ) -> Result<TemplateInfo> {
        let rootfs = build_dir.join("rootfs");
        fs::create_dir(&rootfs).at("creating directory", &rootfs)?;
        fs::set_permissions(&rootfs, fs::Permissions::from_mode(0o755))
            .at("setting mode of", &rootfs)?;
        let mut start = ctx.options.start.clone();
        let (recipe_name, revision, description, defaults, image) = match source {
            Source::Recipe(recipe) => {
                recipe.build(&rootfs, ctx).map_err(|e| ctx.in_step(e))?;
                let r = *recipe;
                start = start.or_else(|| r.start());
                (r.name(), r.revision(), r.description(), r.defaults(), None)
            }
            Source::Image(source) => {
                let blobs = BlobStore::open(self.blob_dir()).map_err(|e| TemplateError::Image {
                    step: String::from("opening the blob store"),
                    source: e,
                })?;
                // The collector waits (skips) while a pull writes and reads blobs.
                let blob_lock = crate::lock::BlobLock::shared(&self.dir)?;
                let config = image::build(&rootfs, &blobs, source, ctx)?;
                drop(blob_lock);
                let description = format!("OCI image {} ({})", config.reference, config.digest);
                let mut defaults = image::defaults(&config);
                source.resources.apply(&mut defaults);
                (image::RECIPE, 0, description, defaults, Some(config))
            }
            Source::Layered(layered) => {
                ctx.step("making the root filesystem (template and layer)")?;
                fs::remove_dir(&rootfs).at("removing", &rootfs)?;
                let empty = build_dir.join("empty-layer");
                let layer = match &layered.layer {
                    Some(layer) => layer.clone(),
                    None => {
                        fs::create_dir(&empty).at("creating directory", &empty)?;
                        empty.clone()
                    }
                };
                hutch_jail::flatten_layer(&hutch_jail::LayerFlatten {
                    base: layered.base.clone(),
                    layer,
                    dst: rootfs.clone(),
                })
                .map_err(|e| {
                    TemplateError::io(
                        "flattening into",
                        &rootfs,
                        std::io::Error::other(e.to_string()),
                    )
                })?;
                if empty.exists() {
                    fs::remove_dir(&empty).at("removing", &empty)?;
                }
                (
                    layered.recipe.as_str(),
                    0,
                    layered.description.clone(),
                    layered.defaults.clone(),
                    None,
                )
            }
        };

        ctx.step("recording metadata")?;
        let info = TemplateInfo {
            name: name.to_owned(),
            rev,
            ready: true,
            isolations: vec![String::from("ns"), String::from("vm")],
            size_bytes: tree::disk_usage(&rootfs)?,
            created_at: Some(rfc3339_utc(SystemTime::now())),
            description,
            defaults,
            image,
            start,
            build_key: match source {
                Source::Layered(layered) => Some(layered.build_key.clone()),
                _ => None,
            },
        };
        let file = TemplateFile {
            format: FORMAT_VERSION,
            recipe: recipe_name.to_owned(),
            revision,
            info: info.clone(),
        };
        let path = build_dir.join(METADATA_FILE);
        let json = serde_json::to_vec_pretty(&file)
            .map_err(|e| ctx.fail(format!("encoding metadata: {e}")))?;
        let mut out = fs::File::create(&path).at("creating", &path)?;
        out.write_all(&json).at("writing", &path)?;
        // Everything the build wrote reaches the disk before the rename publishes it.
        sys::syncfs(out.as_fd()).at("flushing", &path)?;
        fs::set_permissions(build_dir, fs::Permissions::from_mode(0o755))
            .at("setting mode of", build_dir)?;
        Ok(info)
    }

    /// Renames the finished build directory to `name`, atomically replacing an existing
    /// template directory; the replaced one becomes an old revision (a ready one) or is
    /// deleted.
    fn publish(&self, mut build_dir: BuildDir, name: &str) -> Result<()> {
        let target = self.dir.join(name);
        if fs::symlink_metadata(&target).is_ok() {
            sys::exchange(&build_dir.path, &target).at("replacing", &target)?;
            // The build directory now holds the old template.
            let old = self.read_info_at(name, &build_dir.path);
            if old.ready {
                self.keep_revision(name, old.rev, &build_dir.path)?;
                build_dir.armed = false;
            }
            drop(build_dir);
        } else {
            fs::rename(&build_dir.path, &target).at("publishing", &target)?;
            build_dir.armed = false;
        }
        Ok(())
    }

    /// Deletes `.build-<name>-*` and `.remove-<name>-*` directories left by crashed
    /// processes. Called with the lock of `name` held, so none of them is in use.
    fn remove_leftovers(&self, name: &str) -> Result<()> {
        for entry in fs::read_dir(&self.dir).at("listing directory", &self.dir)? {
            let entry = entry.at("listing directory", &self.dir)?;
            let file_name = entry.file_name();
            let Some(file_name) = file_name.to_str() else {
                continue;
            };
            let leftover = [BUILD_PREFIX, REMOVE_PREFIX].iter().any(|prefix| {
                file_name
                    .strip_prefix(prefix)
                    .and_then(|rest| rest.rsplit_once('-'))
                    .is_some_and(|(n, suffix)| n == name && is_random_suffix(suffix))
            });
            if leftover {
                tracing::warn!(path = %entry.path().display(), "deleting a leftover template directory");
                tree::remove_tree(&entry.path())?;
            }
        }
        Ok(())
    }

    /// Reads `template.json` of `name`; anything missing or unexpected means not ready.
    fn read_info(&self, name: &str) -> TemplateInfo {
        self.read_info_at(name, &self.dir.join(name))
    }

    /// Reads `template.json` in `dir` (a template's directory, current or an old
    /// revision's) of template `name`.
    pub(crate) fn read_info_at(&self, name: &str, dir: &Path) -> TemplateInfo {
        let dir = dir.to_path_buf();
        let path = dir.join(METADATA_FILE);
        let parsed = fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                serde_json::from_slice::<TemplateFile>(&bytes).map_err(|e| e.to_string())
            });
        match parsed {
            Ok(file)
                if file.format == FORMAT_VERSION
                    && file.info.ready
                    && Recipe::from_name(&file.recipe)
                        .is_none_or(|r| r.revision() == file.revision)
                    && dir.join("rootfs").is_dir() =>
            {
                TemplateInfo {
                    name: name.to_owned(),
                    // Every template runs on both backends (vm makes its image on first
                    // use), also those built before vm existed.
                    isolations: vec![String::from("ns"), String::from("vm")],
                    ..file.info
                }
            }
            Ok(_) => TemplateInfo::unready(name),
            Err(e) => {
                tracing::debug!(template = name, error = %e, "template has no readable metadata");
                TemplateInfo::unready(name)
            }
        }
    }
}

/// What a build makes a template from.
enum Source<'a> {
    /// A built-in recipe.
    Recipe(Recipe),
    /// An OCI image.
    Image(&'a ImageSource),
    /// A template's root with a layer over it.
    Layered(&'a LayeredSource),
}

/// A template made of another template's root and a 0-based layer over it (a snapshot of a
/// sandbox of that template): what a Dockerfile build's last step leaves
/// ([`TemplateStore::build_layered`]).
#[derive(Debug, Clone)]
pub struct LayeredSource {
    /// The root below (another template's `rootfs`).
    pub base: PathBuf,
    /// The layer applied onto it (`None`: the root as it is).
    pub layer: Option<PathBuf>,
    /// `recipe` recorded in `template.json` (`dockerfile`).
    pub recipe: String,
    /// What the template says it is.
    pub description: String,
    /// Its defaults (environment, resources).
    pub defaults: crate::info::ResourceDefaults,
    /// What identifies this build's input (a Dockerfile build's last cache key): a ready
    /// template with the same one is kept as it is.
    pub build_key: String,
}

/// A build directory that is deleted when dropped unless disarmed.
struct BuildDir {
    /// `<dir>/.build-<name>-<random>`.
    path: PathBuf,
    /// Whether dropping deletes it.
    armed: bool,
}

impl BuildDir {
    /// Creates a fresh, private build directory for `name`.
    fn create(dir: &Path, name: &str) -> Result<Self> {
        let path = dir.join(format!("{BUILD_PREFIX}{name}-{}", random_suffix()?));
        fs::create_dir(&path).at("creating directory", &path)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o700))
            .at("setting mode of", &path)?;
        Ok(Self { path, armed: true })
    }
}

impl Drop for BuildDir {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = tree::remove_tree(&self.path) {
                tracing::error!(path = %self.path.display(), error = %e, "could not delete a template build directory");
            }
        }
    }
}

/// Sixteen random lowercase hex digits.
fn random_suffix() -> Result<String> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| TemplateError::StepFailed {
        step: String::from("creating the build directory"),
        message: format!("no randomness available: {e}"),
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `s` looks like [`random_suffix`]'s output.
fn is_random_suffix(s: &str) -> bool {
    s.len() == 16
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks that `name` can name a template (1 to 63 characters of `a-z0-9._-`, starting
/// with a letter or digit): [`TemplateError::InvalidName`] otherwise.
pub fn validate_name(name: &str) -> std::result::Result<(), TemplateError> {
    let mut bytes = name.bytes();
    let valid = name.len() <= 63
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes.all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    if valid {
        Ok(())
    } else {
        Err(TemplateError::InvalidName(name.to_owned()))
    }
}

#[cfg(test)]
mod tests;
