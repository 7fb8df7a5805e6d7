//! Pagination of the listings (`GET /v1/sandboxes`, `/v1/snapshots`, `/v1/volumes`):
//! `?limit=N&cursor=C` in, `"next_cursor"` out.
//!
//! Without `limit` a listing answers every record as it did before pagination, and no
//! `next_cursor`. With it, at most `limit` records (1 to 1000) in a stable order (oldest
//! first), and `next_cursor` when more follow: pass it back as `cursor=` for the next page.
//! A cursor is opaque; walking the pages returns every record that existed throughout exactly
//! once, whatever is created or deleted meanwhile.

use hutch_core::store::{Cursor, Page, PageRequest, MAX_PAGE_LIMIT};
use hutch_core::CoreError;
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ApiResult};

/// The query of a paginated listing (other parameters are ignored, as they were).
#[derive(Debug, Default, Deserialize)]
pub struct PageParams {
    limit: Option<String>,
    cursor: Option<String>,
}

impl PageParams {
    /// The page these parameters ask for.
    pub fn request(&self) -> ApiResult<PageRequest> {
        page_request(self.limit.as_deref(), self.cursor.as_deref())
    }
}

/// The page `limit` and `cursor` (as the client wrote them) ask for; 400 for a bad limit.
pub fn page_request(limit: Option<&str>, cursor: Option<&str>) -> ApiResult<PageRequest> {
    let bad_limit = || {
        ApiError::bad_request(format!(
            "limit must be a number from 1 to {MAX_PAGE_LIMIT}, got {:?}",
            limit.unwrap_or_default()
        ))
    };
    let limit = match limit {
        None => None,
        Some(text) => Some(text.trim().parse::<usize>().map_err(|_| bad_limit())?),
    };
    if limit.is_some_and(|n| !(1..=MAX_PAGE_LIMIT).contains(&n)) {
        return Err(bad_limit());
    }
    let after = cursor.filter(|c| !c.is_empty()).map(Cursor::from_client);
    Ok(PageRequest::new(limit, after)?)
}

/// The error of a listing: a cursor the store cannot read is a bad query (400), like a bad
/// `limit`.
pub fn listing_error(e: CoreError) -> ApiError {
    match e {
        CoreError::InvalidArgument(m) => ApiError::bad_request(m),
        other => ApiError::from(other),
    }
}

/// `{"<key>": [...]}`, with `"next_cursor"` when more records follow.
pub fn page_answer<T: Serialize>(key: &str, page: Page<T>) -> serde_json::Value {
    let mut body = serde_json::Map::new();
    body.insert(key.to_string(), serde_json::json!(page.items));
    if let Some(next) = page.next {
        body.insert("next_cursor".into(), next.as_str().into());
    }
    serde_json::Value::Object(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked_and_a_last_page_has_no_cursor() {
        assert_eq!(page_request(None, None).expect("none").limit, None);
        assert_eq!(
            page_request(Some("100"), None).expect("100").limit,
            Some(100)
        );
        for bad in ["0", "1001", "-1", "ten", ""] {
            let err = page_request(Some(bad), None).expect_err(bad);
            assert_eq!(err.status.as_u16(), 400, "{bad}");
        }
        let last = page_answer::<u32>(
            "sandboxes",
            Page {
                items: vec![1, 2],
                next: None,
            },
        );
        assert_eq!(last, serde_json::json!({"sandboxes": [1, 2]}));
        let more = page_answer(
            "volumes",
            Page {
                items: vec![1],
                next: Some(Cursor::from_client("abc")),
            },
        );
        assert_eq!(
            more,
            serde_json::json!({"volumes": [1], "next_cursor": "abc"})
        );
    }
}
