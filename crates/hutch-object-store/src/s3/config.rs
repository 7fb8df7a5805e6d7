//! The configuration of an [`S3ObjectStore`](super::S3ObjectStore) beyond its URL:
//! credentials (never shown in `Debug`) and the part size and timeouts.

use std::time::Duration;

use super::DEFAULT_PART_SIZE;

/// Credentials for S3 (static, or temporary with a session token).
#[derive(Clone)]
pub struct S3Credentials {
    /// `AWS_ACCESS_KEY_ID`.
    pub access_key_id: String,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret_access_key: String,
    /// `AWS_SESSION_TOKEN`, for temporary credentials.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl S3Credentials {
    /// Static credentials.
    pub fn new(access_key_id: impl Into<String>, secret_access_key: impl Into<String>) -> Self {
        Self {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            session_token: None,
        }
    }

    /// The standard environment variables: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`
    /// and, if set, `AWS_SESSION_TOKEN`; `None` unless both of the first two are set.
    pub fn from_env() -> Option<Self> {
        let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        Some(Self {
            access_key_id: var("AWS_ACCESS_KEY_ID")?,
            secret_access_key: var("AWS_SECRET_ACCESS_KEY")?,
            session_token: var("AWS_SESSION_TOKEN"),
        })
    }

    pub(super) fn signing(&self) -> rusty_s3::Credentials {
        match &self.session_token {
            Some(token) => rusty_s3::Credentials::new_with_token(
                &self.access_key_id,
                &self.secret_access_key,
                token,
            ),
            None => rusty_s3::Credentials::new(&self.access_key_id, &self.secret_access_key),
        }
    }
}

/// Sizes and timeouts of an [`S3ObjectStore`](super::S3ObjectStore).
#[derive(Debug, Clone)]
pub struct S3Options {
    /// Files larger than this go up in parts of this size (at least
    /// [`MIN_PART_SIZE`](super::MIN_PART_SIZE);
    /// larger for a file that would need more than 10,000 parts).
    pub part_size: u64,
    /// Connecting to the server.
    pub connect_timeout: Duration,
    /// A whole small request: HEAD, DELETE, a list page, starting or aborting a multipart
    /// upload.
    pub request_timeout: Duration,
    /// A whole PUT of one object or one part (up to `part_size` bytes), and completing a
    /// multipart upload.
    pub part_timeout: Duration,
    /// A download, between two reads.
    pub read_timeout: Duration,
}

impl Default for S3Options {
    fn default() -> Self {
        Self {
            part_size: DEFAULT_PART_SIZE,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            part_timeout: Duration::from_secs(300),
            read_timeout: Duration::from_secs(30),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_show_in_debug() {
        let c = S3Credentials {
            session_token: Some("tok".into()),
            ..S3Credentials::new("AKIA1", "very-secret")
        };
        let shown = format!("{c:?}");
        assert!(shown.contains("AKIA1"));
        assert!(
            !shown.contains("very-secret") && !shown.contains("tok\""),
            "{shown}"
        );
    }
}
