//! Manifests read with a bound. `oci-client` 0.18 reads a manifest's whole body into memory
//! before anything can look at its size (`Response::bytes`; upstream
//! oras-project/rust-oci-client#206), so a registry could make the server buffer gigabytes.
//! Here the client only authenticates (`Client::auth`, which also keeps the token for the
//! blob downloads); the manifest — and, for an index or a Docker manifest list, the
//! `linux/amd64` manifest it names — is fetched by this module with `reqwest`, through the
//! same proxy and trust roots, reading at most [`MAX_MANIFEST`] bytes, and its sha256 is
//! checked against the digest the reference (or the index) names and the one the registry
//! declares (`Docker-Content-Digest`).

use futures_util::StreamExt;
use oci_client::client::linux_amd64_resolver;
use oci_client::manifest::{
    ImageIndexEntry, OciImageIndex, OciImageManifest, IMAGE_MANIFEST_LIST_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE,
};
use sha2::{Digest as _, Sha256};

use crate::error::{ImageError, Result};

/// The largest manifest (or index) read: the distribution spec's recommended 4 MiB.
pub(crate) const MAX_MANIFEST: usize = 4 << 20;

/// What a manifest request accepts.
const ACCEPT: [&str; 4] = [
    OCI_IMAGE_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];

/// How to reach one repository's manifests.
pub(crate) struct ManifestSource<'a> {
    /// The HTTP client (the pull's proxy and roots).
    pub http: reqwest::Client,
    /// `https://host[:port]` (or `http://` for an insecure registry).
    pub base: String,
    /// The repository (`library/debian`).
    pub repository: &'a str,
    /// `Authorization`, when the registry wants one.
    pub authorization: Option<String>,
    /// The registry, for errors.
    pub registry: &'a str,
    /// The reference as given, for errors.
    pub reference: &'a str,
}

/// One manifest as fetched.
struct Fetched {
    body: Vec<u8>,
    /// `sha256:…` of the body.
    digest: String,
    /// Its media type ([`media_type_of`]).
    kind: String,
}

impl ManifestSource<'_> {
    fn error(&self, message: String) -> ImageError {
        ImageError::Registry {
            registry: self.registry.to_owned(),
            reference: self.reference.to_owned(),
            message,
        }
    }

    /// GET `manifests/<tag or digest>`, at most [`MAX_MANIFEST`] bytes.
    async fn fetch(&self, tag_or_digest: &str) -> Result<Fetched> {
        let url = format!(
            "{}/v2/{}/manifests/{tag_or_digest}",
            self.base, self.repository
        );
        let mut request = self.http.get(&url).header("Accept", ACCEPT.join(", "));
        if let Some(auth) = &self.authorization {
            request = request.header("Authorization", auth);
        }
        let response = request
            .send()
            .await
            .map_err(|e| self.error(format!("GET {url}: {}", crate::registry::error_chain(&e))))?;
        let status = response.status();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(ImageError::Unauthorized {
                registry: self.registry.to_owned(),
                reference: self.reference.to_owned(),
            });
        }
        if !status.is_success() {
            return Err(self.error(format!("GET {url}: {status}")));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_MANIFEST as u64)
        {
            return Err(too_large(tag_or_digest));
        }
        let media_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_owned());
        // What the registry says the body hashes to (checked when it is a sha256, as the
        // registry client did).
        let declared = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.starts_with("sha256:"))
            .map(str::to_owned);
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                self.error(format!(
                    "reading the manifest: {}",
                    crate::registry::error_chain(&e)
                ))
            })?;
            if body.len() + chunk.len() > MAX_MANIFEST {
                return Err(too_large(tag_or_digest));
            }
            body.extend_from_slice(&chunk);
        }
        let digest = format!("sha256:{:x}", Sha256::digest(&body));
        check_digest(declared.as_deref(), &digest)?;
        let kind = media_type_of(&body, media_type);
        Ok(Fetched { body, digest, kind })
    }

    /// The image manifest `tag_or_digest` names (through an index or a manifest list, its
    /// `linux/amd64` entry), with its digest. `expected`: the digest the reference pins.
    pub(crate) async fn image_manifest(
        &self,
        tag_or_digest: &str,
        expected: Option<&str>,
    ) -> Result<(OciImageManifest, String)> {
        let top = self.fetch(tag_or_digest).await?;
        check_digest(expected, &top.digest)?;
        if is_index(&top.kind) {
            let index: OciImageIndex = serde_json::from_slice(&top.body)
                .map_err(|e| self.error(format!("the image index is not valid: {e}")))?;
            let entries: &[ImageIndexEntry] = &index.manifests;
            let Some(digest) = linux_amd64_resolver(entries) else {
                return Err(ImageError::WrongPlatform {
                    reference: self.reference.to_owned(),
                    found: String::from("its index lists other platforms only"),
                });
            };
            let manifest = self.fetch(&digest).await?;
            check_digest(Some(&digest), &manifest.digest)?;
            if is_index(&manifest.kind) {
                return Err(self.error("its index names another index for linux/amd64".into()));
            }
            return self.parse(&manifest);
        }
        self.parse(&top)
    }

    fn parse(&self, fetched: &Fetched) -> Result<(OciImageManifest, String)> {
        let manifest: OciImageManifest = serde_json::from_slice(&fetched.body)
            .map_err(|e| self.error(format!("the manifest is not valid: {e}")))?;
        if manifest.schema_version != 2 {
            return Err(ImageError::UnsupportedMediaType {
                what: "manifest",
                media_type: format!("schema version {}", manifest.schema_version),
            });
        }
        let kind = &fetched.kind;
        if kind != OCI_IMAGE_MEDIA_TYPE && kind != IMAGE_MANIFEST_MEDIA_TYPE {
            return Err(ImageError::UnsupportedMediaType {
                what: "manifest",
                media_type: kind.clone(),
            });
        }
        Ok((manifest, fetched.digest.clone()))
    }
}

/// A body's media type: its `mediaType` field, else the `Content-Type` it came with
/// (`content_type`; OCI manifests may leave the field out), else an OCI manifest.
fn media_type_of(body: &[u8], content_type: Option<String>) -> String {
    #[derive(serde::Deserialize)]
    struct Kind {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
    }
    serde_json::from_slice::<Kind>(body)
        .ok()
        .and_then(|k| k.media_type)
        .or(content_type)
        .unwrap_or_else(|| OCI_IMAGE_MEDIA_TYPE.to_owned())
}

/// Whether media type `kind` is an image index or a Docker manifest list.
fn is_index(kind: &str) -> bool {
    kind == OCI_IMAGE_INDEX_MEDIA_TYPE || kind == IMAGE_MANIFEST_LIST_MEDIA_TYPE
}

fn check_digest(expected: Option<&str>, actual: &str) -> Result<()> {
    match expected {
        Some(expected) if expected != actual => Err(ImageError::DigestMismatch {
            what: "manifest",
            expected: expected.to_owned(),
            actual: actual.to_owned(),
        }),
        _ => Ok(()),
    }
}

fn too_large(name: &str) -> ImageError {
    ImageError::TooLarge {
        what: "manifest",
        digest: name.to_owned(),
        limit: MAX_MANIFEST as u64,
    }
}
