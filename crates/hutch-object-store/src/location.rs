//! Where a store is: the URL forms `s3://BUCKET[/PREFIX]?endpoint=...&region=...&path_style=...`
//! and `file:///PATH`, parsed and checked into a [`Location`].
//!
//! - `endpoint`: the S3 server, `http://` or `https://` (MinIO, Ceph RGW, Garage, ...);
//!   without it, AWS S3 at `https://s3.REGION.amazonaws.com`.
//! - `region`: signed into every request; default `us-east-1`.
//! - `path_style`: `true` puts the bucket in the path (`http://host/bucket/key`), `false` in
//!   the host name (`https://bucket.host/key`); default `true` with an `endpoint` (what
//!   self-hosted servers expect), `false` on AWS.
//!
//! Credentials never belong in the URL (it is logged and shown): a URL with a user or
//! password is refused, and an error message never repeats them.

use std::path::PathBuf;

use url::Url;

use crate::key::check_prefix;
use crate::ObjectStoreError;

/// The region signed into requests when the URL names none.
pub const DEFAULT_REGION: &str = "us-east-1";

/// A store's location (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// An S3 bucket.
    S3(S3Location),
    /// A directory (absolute).
    Fs(PathBuf),
}

/// An S3 bucket, and the prefix under which this store's keys are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    /// The bucket's name.
    pub bucket: String,
    /// The prefix of every key, without a trailing `/` (`None`: the bucket's root).
    pub prefix: Option<String>,
    /// The server (`https://s3.REGION.amazonaws.com` when the URL names none).
    pub endpoint: Url,
    /// The region signed into requests.
    pub region: String,
    /// Whether the bucket goes in the path rather than the host name.
    pub path_style: bool,
}

impl S3Location {
    /// The full S3 key of `key` (the prefix, `/`, the key).
    pub fn full_key(&self, key: &str) -> String {
        match &self.prefix {
            Some(prefix) => format!("{prefix}/{key}"),
            None => key.to_string(),
        }
    }

    /// `key` relative to the prefix, if it is under it.
    pub fn relative_key<'a>(&self, full: &'a str) -> Option<&'a str> {
        match &self.prefix {
            Some(prefix) => full.strip_prefix(prefix.as_str())?.strip_prefix('/'),
            None => Some(full),
        }
    }
}

impl std::fmt::Display for S3Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}", self.bucket)?;
        if let Some(prefix) = &self.prefix {
            write!(f, "/{prefix}")?;
        }
        write!(f, " at {} ({})", self.endpoint, self.region)
    }
}

impl Location {
    /// Parse and check `url` (see the module docs).
    pub fn parse(url: &str) -> Result<Self, ObjectStoreError> {
        let bad = |reason: &str| ObjectStoreError::BadUrl {
            url: redact(url),
            reason: reason.to_string(),
        };
        let parsed = Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(bad(
                "credentials do not belong in the URL: set AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY",
            ));
        }
        if parsed.fragment().is_some() {
            return Err(bad("it has a #fragment"));
        }
        match parsed.scheme() {
            "s3" => parse_s3(&parsed, url).map(Self::S3).map_err(|r| bad(&r)),
            "file" => {
                if parsed.query().is_some() {
                    return Err(bad("a file:// URL takes no ?parameters"));
                }
                let path = parsed
                    .to_file_path()
                    .map_err(|()| bad("a file:// URL must be file:///ABSOLUTE/PATH"))?;
                Ok(Self::Fs(path))
            }
            other => Err(bad(&format!("the scheme is {other}:, not s3: or file:"))),
        }
    }
}

fn parse_s3(url: &Url, raw: &str) -> Result<S3Location, String> {
    let bucket = url.host_str().unwrap_or_default();
    check_bucket(bucket)?;
    if url.port().is_some() {
        return Err("s3://BUCKET takes no port: the server goes in ?endpoint=".to_string());
    }
    let prefix = parse_prefix(raw)?;
    let mut endpoint = None;
    let mut region = None;
    let mut path_style = None;
    for (name, value) in url.query_pairs() {
        let seen = match name.as_ref() {
            "endpoint" => endpoint.replace(parse_endpoint(&value)?).is_some(),
            "region" => {
                if value.is_empty()
                    || !value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                {
                    return Err(format!("region {value:?} is not a region name"));
                }
                region.replace(value.to_string()).is_some()
            }
            "path_style" => {
                let v = match value.as_ref() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(format!("path_style is {value:?}, not true or false")),
                };
                path_style.replace(v).is_some()
            }
            other => {
                return Err(format!(
                    "unknown parameter {other:?} (endpoint, region and path_style are known)"
                ))
            }
        };
        if seen {
            return Err(format!("{name} is given twice"));
        }
    }
    let region = region.unwrap_or_else(|| DEFAULT_REGION.to_string());
    let path_style = path_style.unwrap_or(endpoint.is_some());
    let endpoint = match endpoint {
        Some(e) => e,
        None => Url::parse(&format!("https://s3.{region}.amazonaws.com"))
            .map_err(|e| format!("the AWS endpoint of region {region}: {e}"))?,
    };
    if !path_style && bucket.contains('.') && endpoint.scheme() == "https" {
        return Err(
            "a bucket name with dots needs path_style=true over https (its host name would \
             not match the certificate)"
                .to_string(),
        );
    }
    Ok(S3Location {
        bucket: bucket.to_string(),
        prefix,
        endpoint,
        region,
        path_style,
    })
}

/// S3's bucket naming rules: 3 to 63 of lowercase letters, digits, `.` and `-`, starting
/// and ending with a letter or digit.
fn check_bucket(bucket: &str) -> Result<(), String> {
    let ok_chars = bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    let ok_ends = bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
        && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
    if bucket.is_empty() {
        return Err("no bucket: the form is s3://BUCKET[/PREFIX]".to_string());
    }
    if !(3..=63).contains(&bucket.len()) || !ok_chars || !ok_ends {
        return Err(format!(
            "bucket {bucket:?} is not an S3 bucket name (3 to 63 of a-z, 0-9, . and -, \
             starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

fn parse_endpoint(value: &str) -> Result<Url, String> {
    let endpoint = Url::parse(value).map_err(|e| format!("endpoint {:?}: {e}", redact(value)))?;
    if !matches!(endpoint.scheme(), "http" | "https") {
        return Err(format!(
            "endpoint {:?} is not http:// or https://",
            redact(value)
        ));
    }
    if !endpoint.username().is_empty() || endpoint.password().is_some() {
        return Err(
            "credentials do not belong in the endpoint: set AWS_ACCESS_KEY_ID and \
                    AWS_SECRET_ACCESS_KEY"
                .to_string(),
        );
    }
    if endpoint.query().is_some() || endpoint.fragment().is_some() {
        return Err(format!("endpoint {value:?} has a query or fragment"));
    }
    Ok(endpoint)
}

/// The prefix as written in `raw` (`s3://BUCKET/PREFIX?...`), before the URL parser
/// resolves `.` and `..` segments: letters, digits, `.`, `_`, `-` and `/`, checked like a
/// key prefix.
fn parse_prefix(raw: &str) -> Result<Option<String>, String> {
    let after_scheme = raw.split_once("://").map_or(raw, |(_, rest)| rest);
    let end = after_scheme.find(['?', '#']).unwrap_or(after_scheme.len());
    let Some((_, path)) = after_scheme[..end].split_once('/') else {
        return Ok(None);
    };
    let path = path.trim_end_matches('/');
    if path.is_empty() {
        return Ok(None);
    }
    if let Some(c) = path
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')))
    {
        return Err(format!(
            "the prefix {path:?} has {c:?}: a prefix is letters, digits, ., _, - and /"
        ));
    }
    check_prefix(path).map_err(|e| match e {
        ObjectStoreError::BadKey { reason, .. } => format!("the prefix {path:?}: {reason}"),
        other => other.to_string(),
    })?;
    Ok(Some(path.to_string()))
}

/// `url` without the `user:password@` of its authority, or of an `endpoint=` in it.
fn redact(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let authority_end = tail.find(['/', '?', '&', '#']).unwrap_or(tail.len());
        match tail[..authority_end].rfind('@') {
            Some(at) => {
                out.push_str("***@");
                rest = &tail[at + 1..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(url: &str) -> S3Location {
        match Location::parse(url).expect(url) {
            Location::S3(l) => l,
            other => panic!("not s3: {other:?}"),
        }
    }

    fn refused(url: &str) -> String {
        Location::parse(url).expect_err(url).to_string()
    }

    #[test]
    fn the_full_form_and_its_defaults() {
        let l = s3("s3://hutch-snaps/cluster-a/?endpoint=http://127.0.0.1:9000&region=eu-west-1&path_style=false");
        assert_eq!(l.bucket, "hutch-snaps");
        assert_eq!(l.prefix.as_deref(), Some("cluster-a"));
        assert_eq!(l.endpoint.as_str(), "http://127.0.0.1:9000/");
        assert_eq!(l.region, "eu-west-1");
        assert!(!l.path_style);
        assert_eq!(l.full_key("a/b"), "cluster-a/a/b");
        assert_eq!(l.relative_key("cluster-a/a/b"), Some("a/b"));
        assert_eq!(l.relative_key("cluster-ab/c"), None);

        let aws = s3("s3://hutch-snaps");
        assert_eq!(aws.prefix, None);
        assert_eq!(aws.endpoint.as_str(), "https://s3.us-east-1.amazonaws.com/");
        assert_eq!(aws.region, "us-east-1");
        assert!(!aws.path_style, "AWS: virtual-host style by default");

        let minio = s3("s3://b12/x/y?endpoint=https://minio.lan:9000");
        assert!(minio.path_style, "an endpoint: path style by default");
        assert_eq!(minio.prefix.as_deref(), Some("x/y"));
        assert_eq!(minio.full_key("k"), "x/y/k");
    }

    #[test]
    fn file_urls_name_an_absolute_directory() {
        assert_eq!(
            Location::parse("file:///var/lib/hutch/objects").expect("file"),
            Location::Fs(PathBuf::from("/var/lib/hutch/objects"))
        );
    }

    #[test]
    fn bad_urls_have_exact_messages() {
        assert_eq!(
            refused("http://bucket"),
            "bad object store URL \"http://bucket\": the scheme is http:, not s3: or file:"
        );
        assert_eq!(
            refused("s3://AB"),
            "bad object store URL \"s3://AB\": bucket \"AB\" is not an S3 bucket name (3 to 63 \
             of a-z, 0-9, . and -, starting and ending with a letter or digit)"
        );
        assert_eq!(
            refused("s3://bucket?endpoint=ftp://h"),
            "bad object store URL \"s3://bucket?endpoint=ftp://h\": endpoint \"ftp://h\" is not \
             http:// or https://"
        );
        assert_eq!(
            refused("s3://bucket?colour=blue"),
            "bad object store URL \"s3://bucket?colour=blue\": unknown parameter \"colour\" \
             (endpoint, region and path_style are known)"
        );
        assert_eq!(
            refused("s3://bucket?path_style=yes"),
            "bad object store URL \"s3://bucket?path_style=yes\": path_style is \"yes\", not \
             true or false"
        );
        assert_eq!(
            refused("s3://bucket/a/../b"),
            "bad object store URL \"s3://bucket/a/../b\": the prefix \"a/../b\": it has a . or \
             .. segment"
        );
        assert_eq!(
            refused("s3://bucket?region=us-east-1&region=eu-west-1"),
            "bad object store URL \"s3://bucket?region=us-east-1&region=eu-west-1\": region is \
             given twice"
        );
        assert_eq!(
            refused("file://host/x"),
            "bad object store URL \"file://host/x\": a file:// URL must be file:///ABSOLUTE/PATH"
        );
        assert_eq!(
            refused("not a url"),
            "bad object store URL \"not a url\": relative URL without a base"
        );
    }

    #[test]
    fn credentials_in_the_url_are_refused_and_never_repeated() {
        let msg = refused("s3://AKIA:secret@bucket");
        assert_eq!(
            msg,
            "bad object store URL \"s3://***@bucket\": credentials do not belong in the URL: \
             set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        );
        let msg = refused("s3://bucket?endpoint=http://AKIA:secret@127.0.0.1:9000");
        assert!(!msg.contains("secret"), "{msg}");
        assert!(
            msg.contains("credentials do not belong in the endpoint"),
            "{msg}"
        );
    }
}
