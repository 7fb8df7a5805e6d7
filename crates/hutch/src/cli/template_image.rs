//! `hutch template build NAME --from-image REF`: an image build through the server's API.
//! A registry image is named in a JSON body (`POST /v1/templates`), and the server pulls
//! it; local files are uploaded (`?image_archive=true`): a `docker save` archive or an OCI
//! layout tarball as they are, an OCI layout directory as a tar stream made here. The
//! build's log is followed like a Dockerfile build's, each layer's download and extraction
//! as a progress bar.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};

use super::progress::UploadProgress;
use super::template_build::{send_directory, watch};
use crate::client::{encode, Api};

/// An image build as asked on the command line.
#[derive(Debug, Clone)]
pub struct ImageBuildArgs {
    /// The template to make.
    pub name: String,
    /// `--from-image`.
    pub reference: String,
    /// `--insecure-registry`.
    pub insecure_registries: Vec<String>,
    /// `--registry-auth USER:PASS`.
    pub registry_auth: Option<String>,
    /// The start command and ready check.
    pub start: Option<hutch_proto::ServiceSpec>,
    /// `--force`: pull and unpack again.
    pub force: bool,
    /// `--cpus`, `--memory-mib`, `--disk-mib`.
    pub cpus: Option<f64>,
    pub memory_mib: Option<u64>,
    pub disk_mib: Option<u64>,
}

impl ImageBuildArgs {
    /// The JSON body of a registry image's build.
    fn body(&self) -> Value {
        let mut body = json!({"name": self.name, "from_image": self.reference});
        if let Some(auth) = &self.registry_auth {
            body["registry_auth"] = auth.as_str().into();
        }
        if !self.insecure_registries.is_empty() {
            body["insecure_registries"] = json!(self.insecure_registries);
        }
        if let Some(start) = &self.start {
            body["start"] = json!(start);
        }
        if self.force {
            body["force"] = true.into();
        }
        for (key, value) in [
            ("cpus", self.cpus.map(Value::from)),
            ("memory_mib", self.memory_mib.map(Value::from)),
            ("disk_mib", self.disk_mib.map(Value::from)),
        ] {
            if let Some(v) = value {
                body[key] = v;
            }
        }
        body
    }

    /// The query of an upload's build.
    fn upload_query(&self, tag: Option<&str>) -> anyhow::Result<String> {
        let mut query = format!("name={}&image_archive=true", encode(&self.name));
        if let Some(tag) = tag {
            query.push_str(&format!("&image_tag={}", encode(tag)));
        }
        if let Some(start) = &self.start {
            query.push_str(&format!(
                "&start={}",
                encode(&serde_json::to_string(start)?)
            ));
        }
        if let Some(cpus) = self.cpus {
            query.push_str(&format!("&cpus={cpus}"));
        }
        if let Some(mib) = self.memory_mib {
            query.push_str(&format!("&memory_mib={mib}"));
        }
        if let Some(mib) = self.disk_mib {
            query.push_str(&format!("&disk_mib={mib}"));
        }
        Ok(query)
    }
}

/// Upload the tarball `file` as the body of `POST /v1/templates?{query}`.
async fn send_file(api: &Api, file: &Path, query: &str) -> anyhow::Result<Value> {
    let opened = tokio::fs::File::open(file)
        .await
        .with_context(|| format!("opening {}", file.display()))?;
    let progress = Arc::new(UploadProgress::new("the image"));
    let counted = progress.clone();
    let stream = tokio_util::io::ReaderStream::with_capacity(opened, 256 << 10).map(move |item| {
        if let Ok(chunk) = &item {
            counted.sent(chunk.len() as u64);
        }
        item
    });
    let answer = api
        .send_body(
            Method::POST,
            &format!("/v1/templates?{query}"),
            "application/x-tar",
            reqwest::Body::wrap_stream(stream),
            &[],
        )
        .await;
    let resp = match answer {
        Ok(resp) => resp,
        Err(e) => {
            progress.finish(None);
            return Err(e);
        }
    };
    progress.finish(Some(""));
    resp.json().await.context("reading the server's answer")
}

/// Run an image build through the API at HUTCH_URL.
pub async fn run(api: &Api, args: ImageBuildArgs, json_out: bool) -> anyhow::Result<()> {
    let started = match hutch_template::local_image_path(&args.reference) {
        Some((path, tag)) => {
            let path = Path::new(path);
            let query = args.upload_query(tag)?;
            if args.reference.starts_with("oci:") {
                if !path.is_dir() {
                    bail!("{} is not an OCI image layout directory", path.display());
                }
                send_directory(api, path, &query, "the image layout").await?
            } else {
                if !path.is_file() {
                    bail!("{} is not an image archive file", path.display());
                }
                send_file(api, path, &query).await?
            }
        }
        None => {
            api.call(Method::POST, "/v1/templates", Some(&args.body()))
                .await?
        }
    };
    watch(api, &args.name, &started, json_out).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ImageBuildArgs {
        ImageBuildArgs {
            name: "web".into(),
            reference: "registry:5000/team/web:1".into(),
            insecure_registries: vec!["registry:5000".into()],
            registry_auth: Some("u:p".into()),
            start: None,
            force: true,
            cpus: None,
            memory_mib: Some(256),
            disk_mib: None,
        }
    }

    #[test]
    fn a_registry_image_is_a_json_body_and_an_upload_a_query() {
        assert_eq!(
            args().body(),
            json!({"name": "web", "from_image": "registry:5000/team/web:1",
                   "registry_auth": "u:p", "insecure_registries": ["registry:5000"],
                   "force": true, "memory_mib": 256})
        );
        assert_eq!(
            args().upload_query(Some("1")).expect("query"),
            "name=web&image_archive=true&image_tag=1&memory_mib=256"
        );
    }
}
