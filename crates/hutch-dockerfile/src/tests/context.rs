//! The build context: source expansion, refusals, `.dockerignore`, destinations.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use super::{plan_ok, steps};
use crate::{Context, ContextEntry, ContextError, DockerIgnore, EntryKind, Instruction};

/// A context beside a directory it must never reach:
///
/// ```text
/// outside/secret
/// ctx/app.py (0750)  ctx/README.md  ctx/notes.txt
/// ctx/src/main.py  ctx/src/lib/util.py  ctx/src/lib/.hidden  ctx/src/lib/self -> ../main.py
/// ctx/manual/a.md  ctx/manual/keep/b.md
/// ctx/link_in -> src/main.py   ctx/dirlink -> src
/// ctx/escape -> ../outside/secret   ctx/abs -> /etc   ctx/up -> src/../../outside
/// ```
struct Fixture {
    _dir: tempfile::TempDir,
    ctx: std::path::PathBuf,
    outside: std::path::PathBuf,
}

fn write(path: &Path, content: &str) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, content).expect("write");
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = dir.path().join("ctx");
    let outside = dir.path().join("outside");
    write(&outside.join("secret"), "do not read");
    write(&ctx.join("app.py"), "print('app')\n");
    fs::set_permissions(ctx.join("app.py"), fs::Permissions::from_mode(0o750)).expect("chmod");
    write(&ctx.join("README.md"), "# readme\n");
    write(&ctx.join("notes.txt"), "notes\n");
    write(&ctx.join("src/main.py"), "main\n");
    write(&ctx.join("src/lib/util.py"), "util\n");
    write(&ctx.join("src/lib/.hidden"), "hidden\n");
    symlink("../main.py", ctx.join("src/lib/self")).expect("symlink");
    write(&ctx.join("manual/a.md"), "a\n");
    write(&ctx.join("manual/keep/b.md"), "b\n");
    symlink("src/main.py", ctx.join("link_in")).expect("symlink");
    symlink("src", ctx.join("dirlink")).expect("symlink");
    symlink("../outside/secret", ctx.join("escape")).expect("symlink");
    symlink("/etc", ctx.join("abs")).expect("symlink");
    symlink("src/../../outside", ctx.join("up")).expect("symlink");
    Fixture {
        _dir: dir,
        ctx,
        outside,
    }
}

fn resolve(context: &Context, sources: &[&str]) -> Result<Vec<ContextEntry>, ContextError> {
    context.resolve(sources, &DockerIgnore::none())
}

fn paths(entries: &[ContextEntry]) -> Vec<&str> {
    entries.iter().map(|e| e.path.as_str()).collect()
}

#[test]
fn wildcards_match_within_one_component() {
    let f = fixture();
    let context = Context::open(&f.ctx).expect("open");
    assert_eq!(
        paths(&resolve(&context, &["*.md"]).expect("md")),
        vec!["README.md"]
    );
    assert_eq!(
        paths(&resolve(&context, &["src/*.py"]).expect("py")),
        vec!["src/main.py"]
    );
    let nested = resolve(&context, &["s?c/l[a-z]b/*.py"]).expect("nested");
    assert_eq!(paths(&nested), vec!["src/lib/util.py"]);
    assert_eq!(nested[0].dest_relative, "util.py");
    assert!(nested[0].is_source_root);
    let two = resolve(&context, &["*.txt", "app.py"]).expect("two");
    assert_eq!(paths(&two), vec!["notes.txt", "app.py"]);
    let err = resolve(&context, &["*.nope"]).expect_err("no match");
    assert_eq!(
        err.to_string(),
        "COPY source `*.nope` matched no files in the build context"
    );
}

#[test]
fn a_missing_source_is_named() {
    let f = fixture();
    let context = Context::open(&f.ctx).expect("open");
    let err = resolve(&context, &["app.py", "missing.txt"]).expect_err("missing");
    assert_eq!(
        err.to_string(),
        "COPY source `missing.txt` not found in the build context"
    );
    assert!(matches!(
        resolve(&context, &["app.py/inside"]),
        Err(ContextError::NotFound { .. })
    ));
}

#[test]
fn sources_outside_the_context_are_refused() {
    let f = fixture();
    let context = Context::open(&f.ctx).expect("open");
    for source in ["../x", "src/../../outside/secret", ".."] {
        let err = resolve(&context, &[source]).expect_err("outside");
        assert!(
            matches!(err, ContextError::Outside { .. }),
            "{source}: {err}"
        );
    }
    let err = resolve(&context, &["/etc/passwd"]).expect_err("absolute");
    assert!(matches!(err, ContextError::Absolute { .. }), "{err}");
    assert!(err.to_string().contains("write `etc/passwd`"), "{err}");
}

#[test]
fn symlinks_that_lead_out_are_refused() {
    let f = fixture();
    assert!(f.outside.join("secret").exists());
    let context = Context::open(&f.ctx).expect("open");
    let err = resolve(&context, &["escape"]).expect_err("relative escape");
    assert_eq!(
        err.to_string(),
        "COPY source `escape`: `escape` is a symlink to `../outside/secret`, outside the build \
         context; symlinks are followed only inside it"
    );
    for source in ["abs", "abs/passwd", "up", "up/secret", "e*"] {
        let err = resolve(&context, &[source]).expect_err("leads out");
        assert!(
            matches!(err, ContextError::SymlinkOutside { .. }),
            "{source}: {err}"
        );
    }
}

#[test]
fn symlinks_inside_the_context_are_followed_for_sources_and_kept_below_them() {
    let f = fixture();
    let context = Context::open(&f.ctx).expect("open");
    let via_link = resolve(&context, &["link_in"]).expect("inside");
    assert_eq!(via_link.len(), 1);
    assert_eq!(via_link[0].path, "src/main.py");
    assert_eq!(via_link[0].dest_relative, "link_in", "named as written");
    assert_eq!(via_link[0].kind, EntryKind::File);
    let through_dir = resolve(&context, &["dirlink/lib/util.py"]).expect("dir link");
    assert_eq!(paths(&through_dir), vec!["src/lib/util.py"]);
}

#[test]
fn a_directory_source_copies_its_contents() {
    let f = fixture();
    let context = Context::open(&f.ctx).expect("open");
    let entries = resolve(&context, &["src"]).expect("dir");
    let summary: Vec<(&str, &str, EntryKind)> = entries
        .iter()
        .map(|e| (e.path.as_str(), e.dest_relative.as_str(), e.kind))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("src", "", EntryKind::Directory),
            ("src/lib", "lib", EntryKind::Directory),
            ("src/lib/.hidden", "lib/.hidden", EntryKind::File),
            ("src/lib/self", "lib/self", EntryKind::Symlink),
            ("src/lib/util.py", "lib/util.py", EntryKind::File),
            ("src/main.py", "main.py", EntryKind::File),
        ]
    );
    assert_eq!(entries[3].symlink_target.as_deref(), Some("../main.py"));
    assert_eq!(entries[4].size, 5);
    let app = resolve(&context, &["app.py"]).expect("file");
    assert_eq!(app[0].mode, 0o750);
    assert_eq!(app[0].size, 13);
    // `.` is the whole context, whose symlinks are copied as symlinks (not followed).
    let all = resolve(&context, &["."]).expect("all");
    let abs = all.iter().find(|e| e.path == "abs").expect("abs listed");
    assert_eq!(abs.kind, EntryKind::Symlink);
    assert_eq!(abs.symlink_target.as_deref(), Some("/etc"));
    assert_eq!(all[0].path, ".");
    assert!(!all.iter().any(|e| e.path.contains("outside")));
}

#[test]
fn dockerignore_rules_hide_entries_with_exceptions() {
    let f = fixture();
    let context = Context::open(&f.ctx).expect("open");
    let ignore = DockerIgnore::parse("manual\n!manual/keep\n*.txt\nsrc/lib/.*\n").expect("rules");
    let all = context.resolve(&["."], &ignore).expect("all");
    let listed = paths(&all);
    assert!(!listed.contains(&"notes.txt"));
    assert!(!listed.contains(&"manual/a.md"));
    assert!(!listed.contains(&"src/lib/.hidden"));
    assert!(
        listed.contains(&"manual"),
        "kept for what the exception brings back"
    );
    assert!(listed.contains(&"manual/keep/b.md"));
    assert!(listed.contains(&"src/lib/util.py"));

    let err = context
        .resolve(&["notes.txt"], &ignore)
        .expect_err("ignored");
    assert!(matches!(err, ContextError::NotFound { .. }), "{err}");
    let err = context.resolve(&["*.txt"], &ignore).expect_err("ignored");
    assert!(matches!(err, ContextError::NoMatch { .. }), "{err}");
    let manual = context.resolve(&["manual"], &ignore).expect("manual");
    assert_eq!(
        paths(&manual),
        vec!["manual", "manual/keep", "manual/keep/b.md"]
    );

    // An excluded directory with nothing brought back is not there at all.
    let only_manual = DockerIgnore::parse("manual\n").expect("rules");
    assert!(context.resolve(&["manual"], &only_manual).is_err());
    // A symlink to an excluded file leads nowhere.
    let main_hidden = DockerIgnore::parse("src/main.py\n").expect("rules");
    assert!(matches!(
        context.resolve(&["link_in"], &main_hidden),
        Err(ContextError::NotFound { .. })
    ));
}

#[test]
fn fifos_and_other_special_files_are_refused() {
    let f = fixture();
    fs::create_dir(f.ctx.join("special")).expect("mkdir");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.ctx.join("special/pipe").as_path(),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("mkfifo");
    let context = Context::open(&f.ctx).expect("open");
    let err = resolve(&context, &["special"]).expect_err("fifo");
    assert_eq!(
        err.to_string(),
        "`special/pipe` in the build context is a fifo; only files, directories and symlinks can be copied"
    );
    // Reading it as a file does not block and is refused.
    assert!(context.open_file("special/pipe").is_err());
    let ignore = DockerIgnore::parse("special/pipe\n").expect("rules");
    assert!(
        context.resolve(&["special"], &ignore).is_ok(),
        "an ignored fifo is no problem"
    );
}

#[test]
fn small_files_are_read_without_following_symlinks() {
    let f = fixture();
    write(&f.ctx.join("Dockerfile"), "FROM scratch\n");
    symlink("../outside/secret", f.ctx.join("Dockerfile.link")).expect("symlink");
    let context = Context::open(&f.ctx).expect("open");
    assert_eq!(
        context
            .read_to_string("Dockerfile", 1024)
            .expect("read")
            .as_deref(),
        Some("FROM scratch\n")
    );
    assert_eq!(
        context
            .read_to_string(".dockerignore", 1024)
            .expect("missing"),
        None
    );
    assert!(context.read_to_string("Dockerfile.link", 1024).is_err());
    assert!(matches!(
        context.read_to_string("Dockerfile", 4),
        Err(ContextError::TooLarge { limit: 4, .. })
    ));
    assert!(
        context.open_file("escape").is_err(),
        "the final symlink is not followed"
    );
    assert!(
        context.open_file("dirlink/main.py").is_err(),
        "nor one on the way"
    );
    assert!(matches!(
        context.open_file("../outside/secret"),
        Err(ContextError::Outside { .. })
    ));
    assert!(matches!(
        context.read_to_string("../outside/secret", 1024),
        Err(ContextError::Outside { .. })
    ));
    let mut content = String::new();
    std::io::Read::read_to_string(
        &mut context.open_file("src/../app.py").expect("cleaned inside"),
        &mut content,
    )
    .expect("read");
    assert_eq!(content, "print('app')\n");
}

#[test]
fn copy_destinations_follow_docker_s_rules() {
    let f = fixture();
    let context = Context::open(&f.ctx).expect("open");
    let plan = plan_ok(
        "FROM scratch\nCOPY app.py /dst/\nCOPY app.py /dst/renamed.py\nCOPY src /dst\nCOPY *.md *.py /many/\nCOPY *.py /one\n",
    );
    let copies: Vec<&crate::CopyStep> = steps(&plan)
        .iter()
        .filter_map(|s| match &s.instruction {
            Instruction::Copy(c) => Some(c),
            _ => None,
        })
        .collect();
    let targets = |copy: &crate::CopyStep, sources: &[&str]| -> Vec<String> {
        let entries = resolve(&context, sources).expect("resolves");
        let roots = entries.iter().filter(|e| e.is_source_root).count();
        entries.iter().map(|e| copy.target_path(e, roots)).collect()
    };
    assert_eq!(targets(copies[0], &["app.py"]), vec!["/dst/app.py"]);
    assert_eq!(targets(copies[1], &["app.py"]), vec!["/dst/renamed.py"]);
    assert_eq!(
        targets(copies[2], &["src"]),
        vec![
            "/dst",
            "/dst/lib",
            "/dst/lib/.hidden",
            "/dst/lib/self",
            "/dst/lib/util.py",
            "/dst/main.py"
        ]
    );
    assert_eq!(
        targets(copies[3], &["*.md", "*.py"]),
        vec!["/many/README.md", "/many/app.py"]
    );
    assert_eq!(
        targets(copies[4], &["*.py"]),
        vec!["/one"],
        "one match: dest is the file"
    );
}
