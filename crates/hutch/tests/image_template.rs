//! `hutch template build --from-image` from a real registry on loopback (TLS from a test
//! CA, htpasswd auth), then an `ns` sandbox from the template runs the image's programs with
//! its environment, on Hutch's `/etc` and `/workspace` even though the image links them
//! elsewhere. The registry and layer helpers are `hutch-image`'s test support.

#[path = "../../hutch-image/tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};

use serde_json::{json, Value};
use support::layers::{tar, E};
use support::oci::{self, busybox_layer, LayerBlob};
use support::registry::{Registry, PASSWORD, USER};

use hutch_testkit::TestServer;

/// Runs `hutch template build` with `args` into `templates`.
fn template_build(templates: &std::path::Path, args: &[&str], auth: &str) -> Output {
    Command::new(hutch_testkit::hutch_bin())
        .args(["template", "build"])
        .args(args)
        .arg("--templates-dir")
        .arg(templates)
        .env("HUTCH_REGISTRY_AUTH", auth)
        .output()
        .expect("run hutch template build")
}

#[tokio::test]
async fn an_ns_sandbox_runs_a_command_from_a_pulled_image() {
    let templates = tempfile::Builder::new()
        .prefix("hutch-image-templates-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let registry = Registry::start();
    let layout = registry.dir.path().join("layout");
    // The second layer points /workspace and /etc/resolv.conf at host paths.
    let hostile = tar(&[
        E::Symlink("workspace", "/etc"),
        E::Symlink("etc/resolv.conf", "/etc/shadow"),
    ]);
    let top = oci::image(
        &layout,
        "amd64",
        &[
            LayerBlob::gzip(&busybox_layer("pulled from the registry")),
            LayerBlob::zstd(&hostile),
        ],
        json!({"Env": ["PATH=/bin", "GREETING=hello from the image"], "Cmd": ["/bin/sh"],
               "WorkingDir": "/srv", "ExposedPorts": {"8080/tcp": {}}}),
    );
    oci::finish(&layout, "1", top);
    let reference = registry.push(&layout, "1", "team/busybox", false, false);
    let ca = registry.ca.display().to_string();
    let args = ["img", "--from-image", &reference, "--registry-ca", &ca];

    let refused = template_build(templates.path(), &args, &format!("{USER}:wrong"));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("401 Unauthorized") && stderr.contains(&registry.host),
        "{stderr}"
    );

    let built = template_build(templates.path(), &args, &format!("{USER}:{PASSWORD}"));
    let stderr = String::from_utf8_lossy(&built.stderr);
    assert!(built.status.success(), "{stderr}\n{}", registry.log());
    assert!(stderr.contains("unpacking layer 2/2"), "{stderr}");
    let meta: Value = serde_json::from_slice(
        &std::fs::read(templates.path().join("img/template.json")).expect("template.json"),
    )
    .expect("json");
    assert_eq!(meta["recipe"], "image");
    assert_eq!(meta["image"]["reference"], reference.as_str());
    assert_eq!(meta["image"]["cmd"], json!(["/bin/sh"]));
    assert_eq!(meta["image"]["working_dir"], "/srv");
    assert_eq!(meta["image"]["exposed_ports"], json!(["8080/tcp"]));
    assert_eq!(meta["defaults"]["env"]["GREETING"], "hello from the image");

    let minimal = template_build(templates.path(), &["minimal"], "");
    assert!(minimal.status.success(), "{minimal:?}");
    let server = TestServer::start_in(templates.path().to_path_buf(), &[]).await;
    let id = server
        .create_id(json!({"template": "img", "isolation": "ns"}))
        .await;
    let (out, code) = server
        .sh(
            &id,
            "cat /from-image; echo; echo \"$GREETING\"; cat /etc/hosts; \
             test -d /workspace && ! test -L /workspace && echo workspace-is-a-dir; \
             echo \"cwd=$PWD\"",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("pulled from the registry"), "{out}");
    assert!(
        out.contains("hello from the image"),
        "the image's Env: {out}"
    );
    assert!(
        out.contains("127.0.0.1\tlocalhost") && !out.contains("image-hosts"),
        "{out}"
    );
    assert!(out.contains("workspace-is-a-dir"), "{out}");
    // No layer makes /srv: the build makes it, as a container runtime would.
    assert!(out.contains("cwd=/srv\n"), "the image's WorkingDir: {out}");
    drop(server);
}

#[tokio::test]
async fn templates_come_from_local_oci_layouts_and_docker_archives() {
    let work = tempfile::Builder::new()
        .prefix("hutch-image-local-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let templates = work.path().join("templates");
    let layout = work.path().join("layout");
    let top = oci::image(
        &layout,
        "amd64",
        &[LayerBlob::gzip(&busybox_layer("read from a local file"))],
        json!({"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]}),
    );
    oci::finish(&layout, "1", top);
    // The same image as a tarball of the layout, and as `docker save` writes it.
    let oci_tar = work.path().join("image-oci.tar");
    let tarred = Command::new("tar")
        .arg("-cf")
        .arg(&oci_tar)
        .arg("-C")
        .arg(&layout)
        .arg(".")
        .status()
        .expect("tar");
    assert!(tarred.success());
    let docker_tar = work.path().join("image-docker.tar");
    let copied = Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!("oci:{}:1", layout.display()))
        .arg(format!(
            "docker-archive:{}:local/busybox:1",
            docker_tar.display()
        ))
        .output()
        .expect("skopeo");
    assert!(copied.status.success(), "{copied:?}");

    for (name, reference) in [
        ("from-layout", format!("oci:{}:1", layout.display())),
        ("from-oci-tar", format!("oci-archive:{}", oci_tar.display())),
        (
            "from-docker",
            format!("docker-archive:{}", docker_tar.display()),
        ),
    ] {
        let built = template_build(
            &templates,
            &[name, "--from-image", &reference],
            "unused:unused",
        );
        assert!(built.status.success(), "{reference}: {built:?}");
        let meta: Value = serde_json::from_slice(
            &std::fs::read(templates.join(name).join("template.json")).expect("template.json"),
        )
        .expect("json");
        assert_eq!(meta["image"]["reference"], reference.as_str(), "{meta}");
        let marker = std::fs::read_to_string(templates.join(name).join("rootfs/from-image"))
            .expect("the layer's file");
        assert_eq!(marker, "read from a local file");
    }
    // A tag the layout does not have is named in the error.
    let missing = template_build(
        &templates,
        &[
            "nope",
            "--from-image",
            &format!("oci:{}:2", layout.display()),
        ],
        "unused:unused",
    );
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no image tagged \"2\""),
        "{missing:?}"
    );

    let minimal = template_build(&templates, &["minimal"], "");
    assert!(minimal.status.success(), "{minimal:?}");
    let server = TestServer::start_in(templates.clone(), &[]).await;
    let id = server
        .create_id(json!({"template": "from-docker", "isolation": "ns"}))
        .await;
    let (out, code) = server.sh(&id, "cat /from-image").await;
    assert_eq!((out.as_str(), code), ("read from a local file", 0));
}
