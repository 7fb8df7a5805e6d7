//! `hutch template build --from-image` through the server's API: from a real registry on
//! loopback (TLS from a test CA the server trusts with `--registry-ca`, htpasswd auth), and
//! from local files uploaded by the CLI. An `ns` sandbox from the template runs the image's
//! programs with its environment, on Hutch's `/etc` and `/workspace` even though the image
//! links them elsewhere. The registry and layer helpers are `hutch-image`'s test support.

#[path = "../../hutch-image/tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};

use serde_json::{json, Value};
use support::layers::{tar, E};
use support::oci::{self, busybox_layer, LayerBlob};
use support::registry::{Registry, PASSWORD, USER};

use hutch_testkit::TestServer;

/// Runs `hutch template build` with `args` against the server `s`.
fn template_build(s: &TestServer, args: &[&str], auth: &str) -> Output {
    Command::new(hutch_testkit::hutch_bin())
        .args(["template", "build"])
        .args(args)
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_STATE_DIR", &s.state_dir)
        .env_remove("HUTCH_API_KEY")
        .env("HUTCH_REGISTRY_AUTH", auth)
        .output()
        .expect("run hutch template build")
}

/// `GET /v1/templates/{name}`.
async fn template(s: &TestServer, name: &str) -> Value {
    let resp = s
        .http
        .get(format!("{}/v1/templates/{name}", s.url))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("get template");
    assert_eq!(resp.status().as_u16(), 200, "{name}");
    resp.json().await.expect("json")
}

#[tokio::test]
async fn an_ns_sandbox_runs_a_command_from_a_pulled_image() {
    let templates = tempfile::Builder::new()
        .prefix("hutch-image-templates-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    hutch_testkit::private_templates(templates.path());
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
    let server =
        TestServer::start_in(templates.path().to_path_buf(), &["--registry-ca", &ca]).await;
    let args = ["img", "--from-image", &reference];

    let refused = template_build(&server, &args, &format!("{USER}:wrong"));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("401 Unauthorized") && stderr.contains(&registry.host),
        "{stderr}"
    );

    let built = template_build(&server, &args, &format!("{USER}:{PASSWORD}"));
    let stderr = String::from_utf8_lossy(&built.stderr);
    assert!(built.status.success(), "{stderr}\n{}", registry.log());
    assert!(stderr.contains("unpacking layer 2/2"), "{stderr}");
    // Off a terminal, each finished transfer is one line: both layers were downloaded and
    // extracted.
    for action in ["download", "extract"] {
        for layer in ["layer 1/2", "layer 2/2"] {
            assert!(
                stderr
                    .lines()
                    .any(|l| l.starts_with(layer) && l.contains(&format!(": {action} "))),
                "{layer} {action}: {stderr}"
            );
        }
    }
    let recorded: Value = serde_json::from_slice(
        &std::fs::read(templates.path().join("img/template.json")).expect("template.json"),
    )
    .expect("json");
    assert_eq!(recorded["recipe"], "image");
    let meta = template(&server, "img").await;
    assert_eq!(meta["image"]["reference"], reference.as_str());
    assert_eq!(meta["image"]["cmd"], json!(["/bin/sh"]));
    assert_eq!(meta["image"]["working_dir"], "/srv");
    assert_eq!(meta["image"]["exposed_ports"], json!(["8080/tcp"]));
    assert_eq!(meta["defaults"]["env"]["GREETING"], "hello from the image");

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

    // The same image with other default resources is a new revision that has them from the
    // moment it is published (a revision is never edited after); the same resources again
    // are already built.
    let rev = meta["rev"].as_u64().expect("rev");
    let auth = format!("{USER}:{PASSWORD}");
    let more = [&args[..], &["--memory-mib", "300"]].concat();
    let built = template_build(&server, &more, &auth);
    assert!(built.status.success(), "{built:?}");
    let meta = template(&server, "img").await;
    assert_eq!(meta["rev"].as_u64(), Some(rev + 1), "{meta}");
    assert_eq!(meta["defaults"]["memory_mib"], 300, "{meta}");
    let recorded: Value = serde_json::from_slice(
        &std::fs::read(templates.path().join("img/template.json")).expect("template.json"),
    )
    .expect("json");
    assert_eq!(recorded["defaults"]["memory_mib"], 300, "{recorded}");
    let again = template_build(&server, &more, &auth);
    assert!(again.status.success(), "{again:?}");
    assert_eq!(
        template(&server, "img").await["rev"].as_u64(),
        Some(rev + 1)
    );
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

    hutch_testkit::private_templates(&templates);
    let server = TestServer::start_in(templates.clone(), &[]).await;
    for (name, reference, recorded) in [
        (
            "from-layout",
            format!("oci:{}:1", layout.display()),
            "upload:1",
        ),
        (
            "from-oci-tar",
            format!("oci-archive:{}", oci_tar.display()),
            "upload",
        ),
        (
            "from-docker",
            format!("docker-archive:{}", docker_tar.display()),
            "upload",
        ),
    ] {
        let built = template_build(
            &server,
            &[name, "--from-image", &reference, "--memory-mib", "300"],
            "unused:unused",
        );
        assert!(built.status.success(), "{reference}: {built:?}");
        let meta = template(&server, name).await;
        assert_eq!(meta["image"]["reference"], recorded, "{meta}");
        assert_eq!(meta["defaults"]["memory_mib"], 300, "{meta}");
        let marker = std::fs::read_to_string(templates.join(name).join("rootfs/from-image"))
            .expect("the layer's file");
        assert_eq!(marker, "read from a local file");
    }
    // A tag the layout does not have is named in the build's error.
    let missing = template_build(
        &server,
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

    // The server's own unpack limits (`--image-max-files`, `--image-max-mib`) hold for an
    // upload: the same layout on a server that allows 3 entries is refused naming the limit.
    let strict_templates = work.path().join("strict-templates");
    hutch_testkit::private_templates(&strict_templates);
    let strict = TestServer::start_in(strict_templates, &["--image-max-files", "3"]).await;
    let refused = template_build(
        &strict,
        &[
            "few",
            "--from-image",
            &format!("oci:{}:1", layout.display()),
        ],
        "unused:unused",
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("file count limit of 3"),
        "the limit is named: {stderr}"
    );
    drop(strict);

    // Through the API a file of the server's is never an image, and an upload may not
    // lead out of itself: the layout below names its blobs through `blobs`, a link to a
    // directory outside it.
    let resp = server
        .http
        .post(format!("{}/v1/templates", server.url))
        .bearer_auth(&server.key)
        .json(&json!({"name": "sneaky", "from_image": format!("oci:{}:1", layout.display())}))
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status().as_u16(), 400);
    let v: Value = resp.json().await.expect("json");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("image_archive=true"),
        "{v}"
    );
    let linked = work.path().join("linked");
    let outside = work.path().join("outside");
    std::fs::create_dir_all(outside.join("sha256")).expect("dir");
    for entry in std::fs::read_dir(layout.join("blobs/sha256")).expect("blobs") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), outside.join("sha256").join(entry.file_name())).expect("cp");
    }
    std::fs::create_dir_all(&linked).expect("dir");
    for file in ["oci-layout", "index.json"] {
        std::fs::copy(layout.join(file), linked.join(file)).expect("cp");
    }
    std::os::unix::fs::symlink(&outside, linked.join("blobs")).expect("symlink");
    let refused = template_build(
        &server,
        &[
            "linked",
            "--from-image",
            &format!("oci:{}:1", linked.display()),
        ],
        "unused:unused",
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    // The upload's receiver refuses the link (the image reader would not follow it out
    // either: `hutch-image`'s `a_layout_link_out_of_its_directory_is_not_followed`).
    assert!(
        stderr.contains("points outside the destination"),
        "{stderr}"
    );
    assert!(!templates.join("linked").exists());

    let id = server
        .create_id(json!({"template": "from-docker", "isolation": "ns"}))
        .await;
    let (out, code) = server.sh(&id, "cat /from-image").await;
    assert_eq!((out.as_str(), code), ("read from a local file", 0));

    // Blobs go with the last template that records them: the two OCI forms share theirs
    // (a gzip layer), the docker archive has its own (an uncompressed one).
    let blobs_of = |name: &str| -> Vec<String> {
        let meta: Value = serde_json::from_slice(
            &std::fs::read(templates.join(name).join("template.json")).expect("template.json"),
        )
        .expect("json");
        meta["image"]["blobs"]
            .as_array()
            .expect("the template records its blobs")
            .iter()
            .filter_map(|d| d.as_str()?.strip_prefix("sha256:").map(String::from))
            .collect()
    };
    let blob_file = |hex: &str| templates.join(".blobs/sha256").join(hex);
    let (oci, docker) = (blobs_of("from-layout"), blobs_of("from-docker"));
    assert!(oci.iter().all(|b| blob_file(b).exists()), "{oci:?}");
    for name in ["from-layout", "from-oci-tar"] {
        let resp = server
            .http
            .delete(format!("{}/v1/templates/{name}", server.url))
            .bearer_auth(&server.key)
            .send()
            .await
            .expect("delete");
        assert_eq!(resp.status().as_u16(), 204, "{name}");
        if name == "from-layout" {
            assert!(oci.iter().all(|b| blob_file(b).exists()), "still used");
        }
    }
    let gone: Vec<&String> = oci.iter().filter(|b| !docker.contains(b)).collect();
    assert!(!gone.is_empty());
    assert!(gone.iter().all(|b| !blob_file(b).exists()), "{gone:?}");
    assert!(docker.iter().all(|b| blob_file(b).exists()), "{docker:?}");
}
