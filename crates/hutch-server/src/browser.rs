//! Browsers on the port proxy: sandbox tokens in links and cookies (see `docs/ports.md`).
//!
//! A browser cannot send `Authorization`, so it opens a link holding a short-lived *link*
//! token (`?hutch_token=hst1.…`, from `POST /v1/sandboxes/{id}/port-tokens`). A request that
//! carries `hutch_token` in its query is never proxied: a valid link token is answered `303`
//! to the same URL without it, setting an `HttpOnly; SameSite=Strict` cookie that holds a
//! *session* token for that one sandbox and port; anything else there (the API key above
//! all) is `401`. So the service's page never runs at a URL holding a credential, and its
//! scripts never see one.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hutch_core::sandbox_token::{
    is_token_shaped, TokenClaims, TokenError, TokenScope, TokenUse, TOKEN_PREFIX,
};

use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Name of the query parameter (link token) and cookie (session token).
pub const TOKEN_PARAM: &str = "hutch_token";

/// Default life of a link token.
pub const LINK_TTL_SECONDS: u64 = 300;

/// Longest life a link token may be given.
pub const MAX_LINK_TTL_SECONDS: u64 = 3600;

/// Life of the session cookie a link is exchanged for.
pub const SESSION_TTL_SECONDS: u64 = 3600;

/// What a browser request brings to the port proxy.
#[derive(Debug, PartialEq, Eq)]
pub enum BrowserCredential {
    /// `?hutch_token=…` (possibly empty, possibly not a token at all).
    Link(String),
    /// The `hutch_token` cookie.
    Session(String),
    /// Neither.
    None,
}

/// The credential of a browser request: the query parameter first, else the cookie.
pub fn browser_credential(uri: &Uri, headers: &HeaderMap) -> BrowserCredential {
    if let (_, Some(token)) = split_token(uri.query()) {
        return BrowserCredential::Link(token);
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == TOKEN_PARAM)
        .map_or(BrowserCredential::None, |(_, value)| {
            BrowserCredential::Session(value.to_string())
        })
}

/// Sign a link token for sandbox `id` (`port`, or every port), valid `ttl_seconds`; returns
/// it and its expiry (ms since the epoch).
pub fn issue_link(
    state: &AppState,
    id: &str,
    port: Option<u16>,
    ttl_seconds: u64,
) -> (String, i64) {
    let exp = hutch_core::time::now_ms() + (ttl_seconds as i64) * 1000;
    let claims = TokenClaims {
        sbx: id.to_string(),
        scope: TokenScope::Port { port },
        token_use: TokenUse::Link,
        exp,
    };
    (state.manager.sandbox_tokens().issue(&claims), exp)
}

/// Answer a link: verify it for `id`/`port`, then `303` to `location` (the same URL without
/// `hutch_token`) with the session cookie on `cookie_path`. Never proxied.
pub fn exchange_link(
    state: &AppState,
    id: &str,
    port: u16,
    token: &str,
    location: &str,
    cookie_path: &str,
) -> ApiResult<Response> {
    if !is_token_shaped(token) {
        return Err(ApiError::unauthorized(format!(
            "`{TOKEN_PARAM}` takes a sandbox token, never the API key: ask \
             `POST /v1/sandboxes/{id}/port-tokens` (with the key in the `Authorization` \
             header) for a link"
        )));
    }
    verify(state, token, id, TokenUse::Link, port)?;
    let session = TokenClaims {
        sbx: id.to_string(),
        scope: TokenScope::Port { port: Some(port) },
        token_use: TokenUse::Session,
        exp: hutch_core::time::now_ms() + (SESSION_TTL_SECONDS as i64) * 1000,
    };
    let session = state.manager.sandbox_tokens().issue(&session);
    let cookie = format!(
        "{TOKEN_PARAM}={session}; Path={cookie_path}; Max-Age={SESSION_TTL_SECONDS}; HttpOnly; \
         SameSite=Strict"
    );
    let cookie = HeaderValue::from_str(&cookie).expect("tokens and paths are header-safe");
    let location = HeaderValue::from_str(location)
        .map_err(|_| ApiError::bad_request("invalid path for the port proxy"))?;
    Ok((
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, location),
            (header::SET_COOKIE, cookie),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
        ],
    )
        .into_response())
}

/// Check a session cookie for `id`/`port`.
pub fn check_session(state: &AppState, id: &str, port: u16, token: &str) -> ApiResult<()> {
    verify(state, token, id, TokenUse::Session, port)
}

fn verify(
    state: &AppState,
    token: &str,
    id: &str,
    token_use: TokenUse,
    port: u16,
) -> ApiResult<()> {
    let refuse = |e: TokenError| ApiError::unauthorized(e.to_string());
    let claims = state
        .manager
        .sandbox_tokens()
        .verify(token, hutch_core::time::now_ms())
        .map_err(refuse)?;
    claims.require_port(id, token_use, port).map_err(refuse)
}

/// `path` and what is left of `query` without `hutch_token`: where a link redirects to.
pub fn location_without_token(path: &str, query: Option<&str>) -> String {
    match split_token(query).0 {
        Some(rest) => format!("{path}?{rest}"),
        None => path.to_string(),
    }
}

/// The query without `hutch_token`, and the parameter's value if it was there (`""` for a
/// bare `hutch_token`).
pub fn split_token(query: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(query) = query else {
        return (None, None);
    };
    let mut token = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if name == TOKEN_PARAM {
                token = Some(value.to_string());
                false
            } else {
                !pair.is_empty()
            }
        })
        .collect();
    let kept = (!kept.is_empty()).then(|| kept.join("&"));
    (kept, token)
}

/// Whether one `name=value` cookie pair is Hutch's.
pub fn is_token_cookie(cookie: &str) -> bool {
    cookie
        .split_once('=')
        .is_some_and(|(name, _)| name.trim() == TOKEN_PARAM)
}

/// Whether a header value (a `Referer`, an `Origin`) could carry a credential.
pub fn carries_credential(value: &[u8]) -> bool {
    let has = |needle: &[u8]| value.windows(needle.len()).any(|w| w == needle);
    has(TOKEN_PARAM.as_bytes()) || has(TOKEN_PREFIX.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_taken_out_of_the_query() {
        assert_eq!(split_token(None), (None, None));
        assert_eq!(split_token(Some("a=1&b=2")), (Some("a=1&b=2".into()), None));
        assert_eq!(
            split_token(Some("a=1&hutch_token=k3y&b=2")),
            (Some("a=1&b=2".into()), Some("k3y".into()))
        );
        assert_eq!(
            split_token(Some("hutch_token=k3y")),
            (None, Some("k3y".into()))
        );
        assert_eq!(
            split_token(Some("hutch_token")),
            (None, Some(String::new()))
        );
        assert_eq!(
            location_without_token("/p/", Some("x=1&hutch_token=t")),
            "/p/?x=1"
        );
        assert_eq!(location_without_token("/p/", Some("hutch_token=t")), "/p/");
    }

    #[test]
    fn the_query_comes_before_the_cookie() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; hutch_token=hst1.s"),
        );
        let uri: Uri = "/x?hutch_token=hst1.l".parse().expect("uri");
        assert_eq!(
            browser_credential(&uri, &h),
            BrowserCredential::Link("hst1.l".into())
        );
        let uri: Uri = "/x?y=1".parse().expect("uri");
        assert_eq!(
            browser_credential(&uri, &h),
            BrowserCredential::Session("hst1.s".into())
        );
        assert_eq!(
            browser_credential(&uri, &HeaderMap::new()),
            BrowserCredential::None
        );
    }

    #[test]
    fn credentials_in_referrers_are_spotted() {
        assert!(carries_credential(b"http://h/?hutch_token=hk_1"));
        assert!(carries_credential(b"http://h/?t=hst1.a.b"));
        assert!(!carries_credential(b"http://h/page?q=1"));
    }
}
