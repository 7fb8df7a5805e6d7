//! Sandbox tokens: short-lived credentials that name one sandbox and one use of it, signed
//! by the server and verified without a database lookup.
//!
//! A browser cannot send `Authorization: Bearer`, so links that open a sandbox's web app
//! carry a sandbox token instead of the API key, and signed file URLs ([`FileGrant`]) carry
//! a signature made the same way. A token grants only what its [`TokenScope`]
//! says, on the one sandbox it names, until it expires; it never authenticates an API call.
//!
//! # Format (version 1)
//!
//! `hst1.<claims>.<mac>`, where `<claims>` is the unpadded base64url of a JSON object
//! [`TokenClaims`] and `<mac>` the unpadded base64url of HMAC-SHA256 over the bytes
//! `hst1.<claims>`, keyed with the server's secret. The secret (32 random bytes, hex) lives
//! in `<state-dir>/token.secret`, mode 0600, created on first start; deleting it (and
//! restarting) revokes every token. A token is at most [`MAX_TOKEN_LEN`] bytes and uses only
//! base64url characters and `.`, so it is safe in a query string and a cookie value.
//!
//! # Signed file URLs
//!
//! `…/files?path=P&user=U&expires=E&signature=S` reads (GET) or writes (PUT) one file without
//! the API key. `S` is the `<mac>` a token with the claims [`FileGrant`] `{sbx, scope: "file",
//! path: P, op, user: U, use: "file_url", exp: E}` would carry (E in Unix seconds): the claims
//! travel as the URL's own parameters instead of inside the token, and the server rebuilds
//! them from the request (the sandbox from the URL's path, `op` from its method) before it
//! checks the MAC. Changing any of them, the expiry included, breaks the signature.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// What every version-1 token starts with.
pub const TOKEN_PREFIX: &str = "hst1.";

/// Longest token accepted (claims are small; anything longer is not ours).
pub const MAX_TOKEN_LEN: usize = 1024;

/// Bytes of the signing secret.
const SECRET_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// Why a token was refused. The messages are shown to clients.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not a token this server could have issued.
    #[error("malformed sandbox token")]
    Malformed,
    /// The signature does not match (tampered, or signed with another secret).
    #[error("invalid sandbox token signature")]
    BadSignature,
    /// Past its expiry.
    #[error("the sandbox token has expired")]
    Expired,
    /// Issued for another sandbox.
    #[error("the sandbox token is for another sandbox")]
    WrongSandbox,
    /// Its scope does not cover what was asked.
    #[error("the sandbox token does not grant this ({0})")]
    OutOfScope(&'static str),
    /// Issued for another use (a link token offered as a session, or the reverse).
    #[error("the sandbox token is a {found} token, not a {wanted} token")]
    WrongUse {
        /// The use asked for.
        wanted: TokenUse,
        /// The token's own use.
        found: TokenUse,
    },
    /// The secret file could not be read or created.
    #[error("sandbox token secret {path}: {reason}")]
    Secret {
        /// The secret's path.
        path: String,
        /// What went wrong.
        reason: String,
    },
}

/// What a token grants on its sandbox. Only ports exist today; other sandbox-scoped grants
/// (tenancy, sharing) add variants here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "scope", rename_all = "snake_case")]
pub enum TokenScope {
    /// The port proxy of one port, or of every port when `port` is `None`.
    Port {
        /// The one port, if limited to one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<u16>,
    },
}

impl TokenScope {
    /// Whether the scope lets a browser through the proxy to `port`.
    pub fn allows_port(&self, port: u16) -> bool {
        match self {
            Self::Port { port: None } => true,
            Self::Port { port: Some(p) } => *p == port,
        }
    }
}

/// How a token is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenUse {
    /// In a URL (`?hutch_token=`): short-lived, only exchanged for a session cookie.
    Link,
    /// In an `HttpOnly` cookie set by that exchange.
    Session,
}

impl std::fmt::Display for TokenUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Link => "link",
            Self::Session => "session",
        })
    }
}

/// What a token says. (Unknown fields are not refused: serde cannot with a flattened scope,
/// and only this server signs claims.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenClaims {
    /// The sandbox id.
    pub sbx: String,
    /// What it grants.
    #[serde(flatten)]
    pub scope: TokenScope,
    /// How it is carried.
    #[serde(rename = "use")]
    pub token_use: TokenUse,
    /// Expiry, milliseconds since the Unix epoch.
    pub exp: i64,
}

/// What a signed file URL lets its holder do with its one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileOp {
    /// `GET …/files?path=`: read the file's bytes.
    Read,
    /// `PUT …/files?path=`: write (create or replace) the file.
    Write,
}

impl FileOp {
    /// The wire name (`read`, `write`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
        }
    }
}

/// What a signed file URL grants: one operation on one path of one sandbox, as one user,
/// until a time. The URL carries every field in its query; the signature covers them all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileGrant {
    /// The sandbox id.
    pub sbx: String,
    /// Always `file` (a port token's claims say `port`: the two never sign the same bytes).
    scope: FileScope,
    /// The absolute path inside the sandbox.
    pub path: String,
    /// Read or write.
    pub op: FileOp,
    /// The user the file is read or written as (`None`: the default, root).
    pub user: Option<String>,
    /// Always `file_url`.
    #[serde(rename = "use")]
    token_use: FileUse,
    /// Expiry, Unix seconds (the URL's `expires`).
    pub exp: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FileScope {
    File,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FileUse {
    FileUrl,
}

impl FileGrant {
    /// A grant of `op` on `path` of sandbox `sbx` as `user`, until `exp` (Unix seconds).
    pub fn new(sbx: &str, path: &str, op: FileOp, user: Option<&str>, exp: i64) -> Self {
        Self {
            sbx: sbx.to_string(),
            scope: FileScope::File,
            path: path.to_string(),
            op,
            user: user.map(str::to_string),
            token_use: FileUse::FileUrl,
            exp,
        }
    }

    /// The bytes the signature is computed over: a version-1 token's signed part with the
    /// grant as its claims (`hst1.<base64url of the grant's JSON>`).
    fn signed_bytes(&self) -> String {
        let json = serde_json::to_vec(self).expect("file grants always serialize");
        format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
    }
}

/// Longest file URL signature accepted (a base64url HMAC-SHA256 is 43 characters).
const MAX_SIGNATURE_LEN: usize = 64;

/// Signs and verifies sandbox tokens with the server's secret.
#[derive(Clone)]
pub struct TokenSigner {
    secret: [u8; SECRET_LEN],
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenSigner(..)")
    }
}

impl TokenSigner {
    /// A signer over a given secret (tests; the server uses [`TokenSigner::load_or_create`]).
    pub fn from_secret(secret: [u8; SECRET_LEN]) -> Self {
        Self { secret }
    }

    /// Read the secret at `path`, or create it (32 random bytes, hex, mode 0600).
    pub fn load_or_create(path: &Path) -> Result<Self, TokenError> {
        let fail = |reason: String| TokenError::Secret {
            path: path.display().to_string(),
            reason,
        };
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let secret = parse_hex_secret(text.trim())
                    .ok_or_else(|| fail("not 64 hex digits".to_string()))?;
                return Ok(Self { secret });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(e.to_string())),
        }
        let mut secret = [0u8; SECRET_LEN];
        getrandom::fill(&mut secret).map_err(|e| fail(e.to_string()))?;
        let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        write_new_secret(path, &hex).map_err(|e| fail(e.to_string()))?;
        // Another server starting on the same state dir may have won the race: use its.
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let secret =
            parse_hex_secret(text.trim()).ok_or_else(|| fail("not 64 hex digits".into()))?;
        Ok(Self { secret })
    }

    /// Sign `claims` into a token.
    pub fn issue(&self, claims: &TokenClaims) -> String {
        let json = serde_json::to_vec(claims).expect("token claims always serialize");
        let signed = format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(json));
        let mac = self.mac(signed.as_bytes()).finalize().into_bytes();
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(mac))
    }

    /// Check the signature and expiry of `token` at time `now_ms`, and return its claims.
    /// Callers then check the sandbox, use and scope ([`TokenClaims::require`]).
    pub fn verify(&self, token: &str, now_ms: i64) -> Result<TokenClaims, TokenError> {
        if token.len() > MAX_TOKEN_LEN || !token.starts_with(TOKEN_PREFIX) {
            return Err(TokenError::Malformed);
        }
        let (signed, mac) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let mac = URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| TokenError::Malformed)?;
        self.mac(signed.as_bytes())
            .verify_slice(&mac)
            .map_err(|_| TokenError::BadSignature)?;
        let claims = URL_SAFE_NO_PAD
            .decode(&signed[TOKEN_PREFIX.len()..])
            .map_err(|_| TokenError::Malformed)?;
        let claims: TokenClaims =
            serde_json::from_slice(&claims).map_err(|_| TokenError::Malformed)?;
        if claims.exp <= now_ms {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }

    /// A secret of `subject` for one `purpose`, derived from the server's secret (hex
    /// HMAC-SHA256 of `purpose`, a NUL and `subject`): stable across restarts, different for
    /// every purpose and subject, and unforgeable without the server's secret. The E2B
    /// adapter's per-sandbox access tokens are `derive("e2b-envd", sandbox id)`.
    pub fn derive(&self, purpose: &str, subject: &str) -> String {
        let mut mac = self.mac(purpose.as_bytes());
        mac.update(&[0]);
        mac.update(subject.as_bytes());
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The signature of a file URL (`signature=`): the unpadded base64url HMAC-SHA256, with
    /// the tokens' secret, of [`FileGrant`] encoded as a token's claims. File URLs and
    /// sandbox tokens are one scheme: one secret, one claims encoding, one MAC.
    pub fn sign_file_url(&self, grant: &FileGrant) -> String {
        let mac = self.mac(grant.signed_bytes().as_bytes()).finalize();
        URL_SAFE_NO_PAD.encode(mac.into_bytes())
    }

    /// Check a file URL's `signature` for `grant` (rebuilt from the request: its sandbox,
    /// `path`, method, `user` and `expires`) at time `now_ms`. The comparison is
    /// constant-time; a grant that differs in any field, a changed expiry included, is
    /// [`TokenError::BadSignature`]; a valid signature past its expiry is
    /// [`TokenError::Expired`].
    pub fn verify_file_url(
        &self,
        grant: &FileGrant,
        signature: &str,
        now_ms: i64,
    ) -> Result<(), TokenError> {
        if signature.len() > MAX_SIGNATURE_LEN {
            return Err(TokenError::Malformed);
        }
        let mac = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| TokenError::Malformed)?;
        self.mac(grant.signed_bytes().as_bytes())
            .verify_slice(&mac)
            .map_err(|_| TokenError::BadSignature)?;
        if grant.exp.saturating_mul(1000) <= now_ms {
            return Err(TokenError::Expired);
        }
        Ok(())
    }

    fn mac(&self, data: &[u8]) -> HmacSha256 {
        let mut mac =
            HmacSha256::new_from_slice(&self.secret).expect("HMAC takes a key of any length");
        mac.update(data);
        mac
    }
}

impl TokenClaims {
    /// Refuse the claims unless they are for sandbox `id`, carried as `token_use`, and grant
    /// the port proxy of `port`.
    pub fn require_port(&self, id: &str, token_use: TokenUse, port: u16) -> Result<(), TokenError> {
        if self.sbx != id {
            return Err(TokenError::WrongSandbox);
        }
        if self.token_use != token_use {
            return Err(TokenError::WrongUse {
                wanted: token_use,
                found: self.token_use,
            });
        }
        if !self.scope.allows_port(port) {
            return Err(TokenError::OutOfScope("another port"));
        }
        Ok(())
    }
}

/// Whether `s` could be a token (shape only: prefix, length, characters).
pub fn is_token_shaped(s: &str) -> bool {
    s.len() <= MAX_TOKEN_LEN
        && s.starts_with(TOKEN_PREFIX)
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn parse_hex_secret(text: &str) -> Option<[u8; SECRET_LEN]> {
    if text.len() != SECRET_LEN * 2 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut secret = [0u8; SECRET_LEN];
    for (i, byte) in secret.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(secret)
}

/// Create `path` with `text`, mode 0600, only if it does not exist yet.
fn write_new_secret(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e),
    };
    f.write_all(format!("{text}\n").as_bytes())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn signer() -> TokenSigner {
        TokenSigner::from_secret([7; SECRET_LEN])
    }

    fn claims(port: Option<u16>, token_use: TokenUse, exp: i64) -> TokenClaims {
        TokenClaims {
            sbx: "sbx_aaaa".into(),
            scope: TokenScope::Port { port },
            token_use,
            exp,
        }
    }

    #[test]
    fn a_token_round_trips_and_is_cookie_safe() {
        let c = claims(Some(8000), TokenUse::Link, NOW + 60_000);
        let token = signer().issue(&c);
        assert!(is_token_shaped(&token), "{token}");
        assert_eq!(signer().verify(&token, NOW), Ok(c.clone()));
        assert_eq!(c.require_port("sbx_aaaa", TokenUse::Link, 8000), Ok(()));
    }

    #[test]
    fn derived_secrets_differ_by_purpose_subject_and_server() {
        let a = signer();
        let x = a.derive("e2b-envd", "sbx_1");
        assert_eq!(x.len(), 64);
        assert_eq!(x, a.derive("e2b-envd", "sbx_1"));
        assert_ne!(x, a.derive("e2b-envd", "sbx_2"));
        assert_ne!(x, a.derive("other", "sbx_1"));
        assert_ne!(
            x,
            TokenSigner::from_secret([9; SECRET_LEN]).derive("e2b-envd", "sbx_1")
        );
    }

    #[test]
    fn an_expired_token_is_refused() {
        let token = signer().issue(&claims(Some(8000), TokenUse::Link, NOW));
        assert_eq!(signer().verify(&token, NOW), Err(TokenError::Expired));
        assert!(signer().verify(&token, NOW - 1).is_ok());
    }

    #[test]
    fn another_sandbox_port_or_use_is_refused() {
        let c = claims(Some(8000), TokenUse::Link, NOW + 1);
        assert_eq!(
            c.require_port("sbx_bbbb", TokenUse::Link, 8000),
            Err(TokenError::WrongSandbox)
        );
        assert_eq!(
            c.require_port("sbx_aaaa", TokenUse::Link, 8001),
            Err(TokenError::OutOfScope("another port"))
        );
        assert_eq!(
            c.require_port("sbx_aaaa", TokenUse::Session, 8000),
            Err(TokenError::WrongUse {
                wanted: TokenUse::Session,
                found: TokenUse::Link
            })
        );
        let any = claims(None, TokenUse::Session, NOW + 1);
        assert_eq!(any.require_port("sbx_aaaa", TokenUse::Session, 1), Ok(()));
        assert_eq!(
            any.require_port("sbx_aaaa", TokenUse::Session, 65535),
            Ok(())
        );
    }

    #[test]
    fn a_tampered_token_is_refused() {
        let token = signer().issue(&claims(Some(8000), TokenUse::Link, NOW + 60_000));
        let (signed, mac) = token.rsplit_once('.').expect("two parts");
        // Other claims under the old signature: another sandbox and every port.
        let forged = claims(None, TokenUse::Link, NOW + 60_000);
        let forged = TokenClaims {
            sbx: "sbx_bbbb".into(),
            ..forged
        };
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).expect("json"));
        let swapped = format!("{TOKEN_PREFIX}{body}.{mac}");
        assert_eq!(
            signer().verify(&swapped, NOW),
            Err(TokenError::BadSignature)
        );
        // One flipped character of the signature.
        let mut bad_mac = mac.to_string().into_bytes();
        bad_mac[0] = if bad_mac[0] == b'A' { b'B' } else { b'A' };
        let flipped = format!("{signed}.{}", String::from_utf8(bad_mac).expect("ascii"));
        assert_eq!(
            signer().verify(&flipped, NOW),
            Err(TokenError::BadSignature)
        );
        // Signed with another secret.
        let other = TokenSigner::from_secret([8; SECRET_LEN]);
        assert_eq!(other.verify(&token, NOW), Err(TokenError::BadSignature));
        // Not a token at all.
        for junk in ["", "hk_abc", "hst1.", "hst1.x", "hst1.!!.!!"] {
            assert!(signer().verify(junk, NOW).is_err(), "{junk}");
        }
        assert_eq!(
            signer().verify(&"hst1.a".repeat(400), NOW),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn a_file_url_signature_covers_every_field_of_its_grant() {
        let exp = NOW / 1000 + 60;
        let grant = FileGrant::new("sbx_aaaa", "/w/a.txt", FileOp::Read, Some("user"), exp);
        let signature = signer().sign_file_url(&grant);
        assert_eq!(signature.len(), 43, "{signature}");
        assert_eq!(signer().verify_file_url(&grant, &signature, NOW), Ok(()));
        let others = [
            FileGrant::new("sbx_bbbb", "/w/a.txt", FileOp::Read, Some("user"), exp),
            FileGrant::new("sbx_aaaa", "/w/b.txt", FileOp::Read, Some("user"), exp),
            FileGrant::new("sbx_aaaa", "/w/a.txt", FileOp::Write, Some("user"), exp),
            FileGrant::new("sbx_aaaa", "/w/a.txt", FileOp::Read, Some("root"), exp),
            FileGrant::new("sbx_aaaa", "/w/a.txt", FileOp::Read, None, exp),
            FileGrant::new("sbx_aaaa", "/w/a.txt", FileOp::Read, Some("user"), exp + 1),
        ];
        for other in others {
            assert_eq!(
                signer().verify_file_url(&other, &signature, NOW),
                Err(TokenError::BadSignature),
                "{other:?}"
            );
        }
        assert_eq!(
            signer().verify_file_url(&grant, &signature, exp * 1000),
            Err(TokenError::Expired)
        );
        let other_secret = TokenSigner::from_secret([8; SECRET_LEN]);
        assert_eq!(
            other_secret.verify_file_url(&grant, &signature, NOW),
            Err(TokenError::BadSignature)
        );
        for junk in ["", "!!", &"A".repeat(100)] {
            assert!(
                signer().verify_file_url(&grant, junk, NOW).is_err(),
                "{junk}"
            );
        }
        // A port token's signature never passes as a file URL's, nor the reverse.
        let token = signer().issue(&claims(None, TokenUse::Link, NOW + 60_000));
        let (_, port_mac) = token.rsplit_once('.').expect("two parts");
        assert!(signer().verify_file_url(&grant, port_mac, NOW).is_err());
    }

    #[test]
    fn the_secret_is_created_once_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token.secret");
        let first = TokenSigner::load_or_create(&path).expect("create");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let token = first.issue(&claims(Some(1), TokenUse::Session, NOW + 1));
        let again = TokenSigner::load_or_create(&path).expect("load");
        assert!(
            again.verify(&token, NOW).is_ok(),
            "a restart keeps tokens valid"
        );
        std::fs::write(&path, "short\n").expect("write");
        assert!(matches!(
            TokenSigner::load_or_create(&path),
            Err(TokenError::Secret { .. })
        ));
    }
}
