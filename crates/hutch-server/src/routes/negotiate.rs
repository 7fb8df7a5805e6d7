//! Content negotiation shared by the streaming routes: which media types an `Accept` header
//! names (the code runs' SSE, the file watches' SSE or NDJSON).

use axum::http::{header, HeaderMap};

/// Whether any `Accept` header names `media_type` (parameters and case ignored; `*/*` and
/// wildcards do not count: a streaming form is chosen only when asked for by name).
pub(crate) fn accepts(headers: &HeaderMap, media_type: &str) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case(media_type))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_are_matched_by_name() {
        let mut h = HeaderMap::new();
        assert!(!accepts(&h, "application/x-ndjson"));
        h.insert(
            header::ACCEPT,
            "text/html, Application/X-NDJSON;q=0.9"
                .parse()
                .expect("header"),
        );
        assert!(accepts(&h, "application/x-ndjson"));
        assert!(!accepts(&h, "text/event-stream"));
        h.insert(header::ACCEPT, "*/*".parse().expect("header"));
        assert!(!accepts(&h, "application/x-ndjson"));
    }
}
