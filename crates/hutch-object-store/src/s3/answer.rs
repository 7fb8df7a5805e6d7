//! What an S3 answer means: transport failures and HTTP statuses with their S3 error
//! documents, mapped to [`ObjectStoreError`] (the one place this is decided).

use crate::ObjectStoreError;

/// A transport error (nothing usable came back): the store is unavailable. The message
/// drops the URL, whose query string is a signature.
pub(super) fn transport(op: &'static str, key: &str, e: reqwest::Error) -> ObjectStoreError {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "the connection failed"
    };
    let mut reason = kind.to_string();
    let e = e.without_url();
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(&e);
    while let Some(s) = source {
        reason.push_str(": ");
        reason.push_str(&s.to_string());
        source = s.source();
    }
    ObjectStoreError::Unavailable {
        op,
        key: key.to_string(),
        reason,
    }
}

/// The error an HTTP answer (`status`, an S3 error document in `body`) means.
pub(super) fn answer_error(
    op: &'static str,
    key: &str,
    status: u16,
    body: &str,
) -> ObjectStoreError {
    let code = xml_text(body, "Code");
    let message = xml_text(body, "Message");
    let reason = match (code, message) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c.to_string(),
        (None, _) => format!("HTTP {status} without an S3 error document"),
    };
    let key = key.to_string();
    let server_trouble = matches!(
        code,
        Some("InternalError" | "SlowDown" | "ServiceUnavailable" | "RequestTimeout")
    );
    match status {
        404 if !matches!(code, Some("NoSuchBucket" | "NoSuchUpload")) => {
            ObjectStoreError::NotFound { key }
        }
        401 | 403 => ObjectStoreError::Denied { op, key, reason },
        429 | 500..=599 => ObjectStoreError::Unavailable { op, key, reason },
        _ if server_trouble => ObjectStoreError::Unavailable { op, key, reason },
        _ => ObjectStoreError::Rejected {
            op,
            key,
            status,
            reason,
        },
    }
}

pub(super) fn unreadable(
    op: &'static str,
    key: &str,
    what: &str,
    e: &dyn std::fmt::Display,
    body: &str,
) -> ObjectStoreError {
    if body.contains("<Error>") {
        return answer_error(op, key, 200, body);
    }
    ObjectStoreError::Rejected {
        op,
        key: key.to_string(),
        status: 200,
        reason: format!("an unreadable {what} answer: {e}"),
    }
}

/// The text of the first `<tag>` in `xml` (S3 error documents are flat and small).
fn xml_text<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find("</")? + start;
    Some(xml[start..end].trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_typed_errors() {
        let doc = "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code>\
                   <Message>Access Denied</Message></Error>";
        let e = answer_error("GET", "k", 403, doc);
        assert_eq!(
            e.to_string(),
            "object store denied GET k: AccessDenied: Access Denied"
        );
        assert!(!e.is_unavailable());
        assert!(answer_error("HEAD", "k", 404, "").is_not_found());
        assert!(
            !answer_error("GET", "k", 404, "<Error><Code>NoSuchBucket</Code></Error>")
                .is_not_found()
        );
        assert!(
            answer_error("PUT", "k", 503, "<Error><Code>SlowDown</Code></Error>").is_unavailable()
        );
        assert!(
            answer_error("PUT", "k", 200, "<Error><Code>InternalError</Code></Error>")
                .is_unavailable()
        );
        let e = answer_error(
            "PUT",
            "k",
            400,
            "<Error><Code>EntityTooSmall</Code></Error>",
        );
        assert_eq!(
            e.to_string(),
            "object store refused PUT k: HTTP 400: EntityTooSmall"
        );
    }
}
