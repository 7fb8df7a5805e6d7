//! `COPY`/`ADD` in a build sandbox: context files as a tar stream the sandbox's agent
//! unpacks (`PUT /v1/files/archive?owners=keep`), another stage's files streamed out of a
//! sandbox of that stage into this one.

use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;
use hutch_dockerfile::{Context, ContextEntry, CopyStep, DockerIgnore, EntryKind};
use hutch_proto::client::AgentClient;

use crate::builds::{Build, BuildRequest, Builder};
use crate::engine::{blocking, Sources, StageState};
use crate::error::BuildError;
use crate::log::LogStream;
use crate::mounts::StepFiles;

/// Run a `COPY` or `ADD` step.
pub(crate) async fn copy(
    files: &StepFiles<'_>,
    copy: &CopyStep,
    client: &AgentClient,
) -> Result<(), BuildError> {
    let StepFiles {
        builder,
        build,
        n,
        step,
        ctx,
        ignore,
        states,
        request,
    } = *files;
    let owner = match &copy.chown {
        Some(spec) => Some(resolve_owner(client, spec, &step.config).await?),
        None => None,
    };
    match &copy.from {
        None => {
            let urls = copy.url_sources();
            if !urls.is_empty() {
                copy_downloads(build, n, copy, client, states, &urls, owner).await?;
                if copy.path_sources().is_empty() {
                    return Ok(());
                }
            }
            copy_context(build, n, copy, client, ctx, ignore, owner).await
        }
        Some(from) => {
            let state = states.of(from)?;
            copy_from_stage(builder, build, n, copy, client, state, request, owner).await
        }
    }
}

/// `ADD --checksum=sha256:<hex> <url>`: the download must have it.
pub(crate) fn check_checksum(
    copy: &CopyStep,
    url: &str,
    fetched: &crate::fetch::Fetched,
) -> Result<(), BuildError> {
    let Some(want) = &copy.checksum else {
        return Ok(());
    };
    let hex = want.strip_prefix("sha256:").ok_or_else(|| {
        BuildError::StepFailed(format!(
            "ADD --checksum={want}: only sha256:<hex> is supported"
        ))
    })?;
    if !hex.eq_ignore_ascii_case(&fetched.sha256) {
        return Err(BuildError::StepFailed(format!(
            "ADD {url}: the download's sha256 is {}, not {hex} (--checksum)",
            fetched.sha256
        )));
    }
    Ok(())
}

/// `ADD <url> <dest>`: the files downloaded before the step's key was made, as one tar
/// stream (mode 0600 unless `--chmod`, the answer's `Last-Modified` as their time).
async fn copy_downloads(
    build: &Arc<Build>,
    n: usize,
    copy: &CopyStep,
    client: &AgentClient,
    states: &Sources,
    urls: &[String],
    owner: Option<(u32, u32)>,
) -> Result<(), BuildError> {
    // One download onto a path that is a directory in the stage lands inside it.
    let into_dir = copy.dest_is_dir
        || client
            .stat(&copy.dest)
            .await
            .is_ok_and(|e| e.file_type == hutch_proto::FileType::Dir);
    let mut files = Vec::new();
    for url in urls {
        let fetched = states
            .downloads
            .get(url)
            .ok_or_else(|| BuildError::StepFailed(format!("ADD {url}: it was not downloaded")))?;
        let target = if into_dir {
            format!("{}/{}", copy.dest.trim_end_matches('/'), fetched.name)
        } else {
            copy.dest.clone()
        };
        build.log(
            Some(n),
            LogStream::Status,
            &format!(" ---> {url} ({} bytes) to {target}", fetched.bytes),
        );
        files.push((fetched, target));
    }
    let chmod = copy.chmod;
    let tar = blocking(move || {
        let (uid, gid) = owner.unwrap_or((0, 0));
        let mut builder = tar::Builder::new(Vec::new());
        for (fetched, target) in &files {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_uid(u64::from(uid));
            header.set_gid(u64::from(gid));
            header.set_mode(chmod.unwrap_or(0o600));
            header.set_mtime(fetched.mtime.unwrap_or(0));
            header.set_size(fetched.bytes);
            let file = std::fs::File::open(&fetched.path).map_err(BuildError::io(format!(
                "reading {}",
                fetched.path.display()
            )))?;
            builder
                .append_data(&mut header, target.trim_start_matches('/'), file)
                .map_err(BuildError::io(format!("adding {target} to the copy")))?;
        }
        builder
            .into_inner()
            .map_err(BuildError::io("finishing the copy".to_string()))
    })
    .await?;
    client.write_archive_as("/", true, body_of(&tar)).await?;
    Ok(())
}

/// `uid:gid` of a `--chown` value, names looked up in the build sandbox's passwd and group.
async fn resolve_owner(
    client: &AgentClient,
    spec: &str,
    _config: &hutch_dockerfile::StageConfig,
) -> Result<(u32, u32), BuildError> {
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let read = |path: &'static str| async move {
        match client.read_file(path).await {
            Ok(stream) => stream
                .collect_bytes(4 << 20)
                .await
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default(),
            Err(_) => String::new(),
        }
    };
    let lookup = |table: &str, name: &str, field: usize| -> Option<(u32, Option<u32>)> {
        table.lines().find_map(|line| {
            let parts: Vec<&str> = line.split(':').collect();
            (parts.first() == Some(&name)).then(|| {
                let id = parts.get(field).and_then(|v| v.parse().ok())?;
                Some((id, parts.get(3).and_then(|g| g.parse().ok())))
            })?
        })
    };
    let passwd = read("/etc/passwd").await;
    let (uid, primary) = match user.parse::<u32>() {
        Ok(uid) => (uid, lookup(&passwd, user, 2).and_then(|(_, g)| g)),
        Err(_) => {
            let (uid, gid) = lookup(&passwd, user, 2).ok_or_else(|| {
                BuildError::StepFailed(format!(
                    "--chown: no user {user:?} in the stage's /etc/passwd"
                ))
            })?;
            (uid, gid)
        }
    };
    let gid = match group {
        None => primary.unwrap_or(uid),
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let groups = read("/etc/group").await;
                lookup(&groups, g, 2).map(|(gid, _)| gid).ok_or_else(|| {
                    BuildError::StepFailed(format!(
                        "--chown: no group {g:?} in the stage's /etc/group"
                    ))
                })?
            }
        },
    };
    Ok((uid, gid))
}

/// Copy context files: one tar stream of every entry at its target path.
async fn copy_context(
    build: &Arc<Build>,
    n: usize,
    copy: &CopyStep,
    client: &AgentClient,
    ctx: &Arc<Context>,
    ignore: &Arc<DockerIgnore>,
    owner: Option<(u32, u32)>,
) -> Result<(), BuildError> {
    let (c, i, sources) = (ctx.clone(), ignore.clone(), copy.path_sources());
    let mut entries = blocking(move || Ok(c.resolve(&sources, &i)?)).await?;
    if copy.kind == hutch_dockerfile::CopyKind::Add {
        // ADD unpacks a local tar archive (plain, gzip, bzip2 or xz) into the destination,
        // as Docker does; every other source is copied.
        let mut archives = Vec::new();
        for e in std::mem::take(&mut entries) {
            let c = ctx.clone();
            let path = e.path.clone();
            let is_archive = e.is_source_root
                && e.kind == EntryKind::File
                && blocking(move || Ok(archive_kind(&c, &path)))
                    .await?
                    .is_some();
            if is_archive {
                archives.push(e);
            } else {
                entries.push(e);
            }
        }
        for archive in archives {
            unpack_archive(build, n, copy, client, ctx, &archive).await?;
        }
        if entries.is_empty() {
            if let Some((uid, gid)) = owner {
                chown_tree(build, n, client, &copy.dest, uid, gid).await?;
            }
            return Ok(());
        }
    }
    let roots = entries.iter().filter(|e| e.is_source_root).count();
    // One file onto a path that is a directory in the stage lands inside it, as in Docker.
    let into_dir = !copy.dest_is_dir
        && roots == 1
        && entries.len() == 1
        && entries[0].kind != EntryKind::Directory
        && client
            .stat(&copy.dest)
            .await
            .is_ok_and(|e| e.file_type == hutch_proto::FileType::Dir);
    let mut copy = copy.clone();
    if into_dir {
        copy.dest_is_dir = true;
    }
    let targets: Vec<(ContextEntry, String)> = entries
        .into_iter()
        .map(|e| {
            let target = copy.target_path(&e, roots);
            (e, target)
        })
        .collect();
    build.log(
        Some(n),
        LogStream::Status,
        &format!(" ---> {} entries from the context", targets.len()),
    );
    let (c, chmod) = (ctx.clone(), copy.chmod);
    let tar = blocking(move || make_tar(&c, &targets, owner, chmod)).await?;
    client.write_archive_as("/", true, body_of(&tar)).await?;
    Ok(())
}

/// How an archive `ADD` unpacks is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Packing {
    Plain,
    Gzip,
    Bzip2,
    Xz,
}

/// What kind of archive a context file is, by its first bytes (Docker's four: a tar, plain
/// or compressed with gzip, bzip2 or xz); `None`: not an archive ADD unpacks.
fn archive_kind(ctx: &Context, path: &str) -> Option<Packing> {
    let mut head = [0u8; 512];
    let mut file = ctx.open_file(path).ok()?;
    let mut read = 0;
    while read < head.len() {
        match file.read(&mut head[read..]) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(_) => return None,
        }
    }
    if read >= 2 && head[..2] == [0x1f, 0x8b] {
        return Some(Packing::Gzip);
    }
    if read >= 4 && &head[..3] == b"BZh" && (b'1'..=b'9').contains(&head[3]) {
        return Some(Packing::Bzip2);
    }
    if read >= 6 && head[..6] == [0xfd, b'7', b'z', b'X', b'Z', 0x00] {
        return Some(Packing::Xz);
    }
    (read == 512 && &head[257..262] == b"ustar").then_some(Packing::Plain)
}

/// A writer that refuses past `limit` bytes (an xz stream decoded into memory).
struct Capped {
    out: Vec<u8>,
    limit: u64,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() as u64 + buf.len() as u64 > self.limit {
            return Err(std::io::Error::other("the archive unpacks to too much"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `ADD archive.tar[.gz] dest`: the archive, decompressed here, unpacked by the sandbox's
/// agent into `dest` with the owners it records.
async fn unpack_archive(
    build: &Arc<Build>,
    n: usize,
    copy: &CopyStep,
    client: &AgentClient,
    ctx: &Arc<Context>,
    entry: &ContextEntry,
) -> Result<(), BuildError> {
    build.log(
        Some(n),
        LogStream::Status,
        &format!(" ---> unpacking {} into {}", entry.path, copy.dest),
    );
    let (c, path) = (ctx.clone(), entry.path.clone());
    let bytes = blocking(move || {
        let packing = archive_kind(&c, &path).unwrap_or(Packing::Plain);
        let file = c.open_file(&path)?;
        let mut out = Vec::new();
        let read = match packing {
            Packing::Gzip => flate2::read::GzDecoder::new(file)
                .take(MAX_UNPACKED)
                .read_to_end(&mut out),
            Packing::Bzip2 => bzip2::read::MultiBzDecoder::new(file)
                .take(MAX_UNPACKED)
                .read_to_end(&mut out),
            Packing::Xz => {
                let mut capped = Capped {
                    out: Vec::new(),
                    limit: MAX_UNPACKED,
                };
                let mut input = std::io::BufReader::new(file);
                let decoded = lzma_rs::xz_decompress(&mut input, &mut capped)
                    .map_err(|e| std::io::Error::other(e.to_string()));
                out = capped.out;
                decoded.map(|()| out.len())
            }
            Packing::Plain => file.take(MAX_UNPACKED).read_to_end(&mut out),
        };
        read.map_err(BuildError::io(format!("reading the archive {path}")))?;
        if out.len() as u64 >= MAX_UNPACKED {
            return Err(BuildError::StepFailed(format!(
                "ADD {path}: the archive unpacks to more than {} GiB",
                MAX_UNPACKED >> 30
            )));
        }
        Ok(out)
    })
    .await?;
    client
        .write_archive_as(&copy.dest, true, body_of(&bytes))
        .await?;
    Ok(())
}

/// `bytes` as an upload body of 64 KiB chunks.
fn body_of(
    bytes: &[u8],
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let chunks: Vec<_> = bytes
        .chunks(64 << 10)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    futures_util::stream::iter(chunks)
}

/// Most bytes an `ADD` archive may unpack to (held in memory while sent).
const MAX_UNPACKED: u64 = 1 << 30;

/// `chown -R uid:gid path` in the build sandbox.
async fn chown_tree(
    build: &Arc<Build>,
    n: usize,
    client: &AgentClient,
    path: &str,
    uid: u32,
    gid: u32,
) -> Result<(), BuildError> {
    let owner = format!("{uid}:{gid}");
    crate::engine::run_tool(build, n, client, &["chown", "-R", &owner, path], 600_000).await
}

/// The tar stream of `targets` (paths relative to `/`), owned by `owner` (else 0:0).
fn make_tar(
    ctx: &Context,
    targets: &[(ContextEntry, String)],
    owner: Option<(u32, u32)>,
    chmod: Option<u32>,
) -> Result<Vec<u8>, BuildError> {
    let (uid, gid) = owner.unwrap_or((0, 0));
    let mut builder = tar::Builder::new(Vec::new());
    for (entry, target) in targets {
        let path = target.trim_start_matches('/');
        if path.is_empty() {
            continue;
        }
        let mut header = tar::Header::new_gnu();
        header.set_uid(u64::from(uid));
        header.set_gid(u64::from(gid));
        header.set_mtime(0);
        let mode = chmod.unwrap_or(entry.mode);
        header.set_mode(mode);
        let io = BuildError::io(format!("adding {} to the copy", entry.path));
        match entry.kind {
            EntryKind::Directory => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder
                    .append_data(&mut header, format!("{path}/"), std::io::empty())
                    .map_err(io)?;
            }
            EntryKind::File => {
                let mut file = ctx.open_file(&entry.path)?;
                let mut data = Vec::with_capacity(entry.size as usize);
                (&mut file)
                    .take(entry.size)
                    .read_to_end(&mut data)
                    .map_err(BuildError::io(format!("reading {}", entry.path)))?;
                data.resize(entry.size as usize, 0);
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(entry.size);
                builder
                    .append_data(&mut header, path, data.as_slice())
                    .map_err(io)?;
            }
            EntryKind::Symlink => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                let target = entry.symlink_target.clone().unwrap_or_default();
                builder.append_link(&mut header, path, target).map_err(io)?;
            }
        }
    }
    builder
        .into_inner()
        .map_err(BuildError::io("finishing the copy's archive"))
}

/// `COPY --from=stage`: each source read out of a sandbox of that stage as a tar stream
/// and unpacked at the destination.
#[allow(clippy::too_many_arguments)]
async fn copy_from_stage(
    builder: &Arc<Builder>,
    build: &Arc<Build>,
    n: usize,
    copy: &CopyStep,
    client: &AgentClient,
    state: &StageState,
    request: &BuildRequest,
    owner: Option<(u32, u32)>,
) -> Result<(), BuildError> {
    let (src_id, src) = crate::engine::stage_sandbox(builder, request, state).await?;
    let copied = async {
        let sources = expand_stage_sources(&src, &copy.path_sources()).await?;
        for source in &sources {
            let stat = src
                .stat(source)
                .await
                .map_err(|e| BuildError::StepFailed(format!("COPY --from: {source}: {e}")))?;
            let is_dir = stat.file_type == hutch_proto::FileType::Dir;
            let name = source
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or("")
                .to_string();
            // A directory's contents go into dest; a file into dest/ (or as dest).
            let (into, rename) = if is_dir || copy.dest_is_dir || sources.len() > 1 {
                (copy.dest.clone(), None)
            } else {
                let dest = copy.dest.trim_end_matches('/');
                let parent = match dest.rsplit_once('/') {
                    Some(("", _)) | None => "/".to_string(),
                    Some((p, _)) => p.to_string(),
                };
                let landed = format!("{}/{name}", parent.trim_end_matches('/'));
                (parent, (landed != dest).then(|| (landed, dest.to_string())))
            };
            build.log(
                Some(n),
                LogStream::Status,
                &format!(" ---> {source} from stage"),
            );
            client.mkdir(&into).await.or_else(|e| match &e {
                hutch_proto::client::ClientError::Agent(a)
                    if a.code == hutch_proto::AgentErrorCode::AlreadyExists =>
                {
                    Ok(())
                }
                _ => Err(e),
            })?;
            let archive = src.read_archive(source).await?;
            let archive = futures_util::StreamExt::map(archive, |chunk| {
                chunk.map_err(|e| std::io::Error::other(e.to_string()))
            });
            client.write_archive(&into, archive).await?;
            if let Some((from, to)) = rename {
                client.rename(&from, &to).await?;
            }
        }
        if let Some((uid, gid)) = owner {
            chown_tree(build, n, client, &copy.dest, uid, gid).await?;
        }
        Ok(())
    }
    .await;
    let _ = builder.manager.kill(&src_id).await;
    copied
}

/// `COPY --from` sources with their wildcards matched against the stage's files (in path
/// order, as Docker copies them); a wildcard that matches nothing fails the step.
async fn expand_stage_sources(
    src: &AgentClient,
    sources: &[String],
) -> Result<Vec<String>, BuildError> {
    let mut out = Vec::new();
    for source in sources {
        let pattern = hutch_dockerfile::PathPattern::parse(source)
            .map_err(|e| BuildError::StepFailed(format!("COPY --from: {source}: {e}")))?;
        let Some(pattern) = pattern else {
            out.push(source.clone());
            continue;
        };
        let listed = match src.list(pattern.base(), Some(pattern.depth())).await {
            Ok(l) => l.entries,
            Err(hutch_proto::client::ClientError::Agent(a))
                if matches!(
                    a.code,
                    hutch_proto::AgentErrorCode::NotFound
                        | hutch_proto::AgentErrorCode::NotADirectory
                ) =>
            {
                Vec::new()
            }
            Err(e) => return Err(e.into()),
        };
        let before = out.len();
        out.extend(
            listed
                .into_iter()
                .filter(|e| pattern.matches(&e.path))
                .map(|e| e.path),
        );
        if out.len() == before {
            return Err(BuildError::StepFailed(format!(
                "COPY --from: no files match {source}"
            )));
        }
    }
    Ok(out)
}
