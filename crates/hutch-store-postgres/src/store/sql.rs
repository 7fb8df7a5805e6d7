//! The pieces every query of [`super::PostgresStore`] is made of: statements built with
//! their parameters numbered as they are bound ([`Query`]), run as prepared statements
//! cached per connection, the page clause and its opaque cursors, and the one mapping of a
//! database failure to a [`CoreError`] ([`db_error`]).

use base64::Engine as _;
use deadpool_postgres::GenericClient;
use hutch_core::store::{Cursor, Page, PageRequest};
use hutch_core::{CoreError, CoreResult};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::DbError;

/// A failure of the database as the core sees it: [`CoreError::StoreUnavailable`] when the
/// database could not be reached ([`DbError::is_unreachable`]), [`CoreError::Conflict`] for a
/// unique violation (as SQLite's store answers a taken key), [`CoreError::SharedStore`] for
/// anything else.
pub fn db_error(e: DbError) -> CoreError {
    if e.is_unreachable() {
        return CoreError::StoreUnavailable(Box::new(e));
    }
    if let DbError::Query(q) = &e {
        if q.code() == Some(&SqlState::UNIQUE_VIOLATION) {
            let what = q
                .as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_else(|| q.to_string());
            return CoreError::Conflict(what);
        }
    }
    CoreError::SharedStore(Box::new(e))
}

/// [`db_error`] of a statement's error (for `map_err`).
pub(crate) fn pg(e: tokio_postgres::Error) -> CoreError {
    db_error(DbError::Query(e))
}

/// A record that does not decode.
pub(crate) fn corrupt(e: serde_json::Error) -> CoreError {
    CoreError::CorruptRecord(e)
}

/// A value of a `u64` field as a `BIGINT` (saturating: no count or size comes near).
pub(crate) fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A `BIGINT` count as a `u64` (a negative one is 0).
pub(crate) fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// A parameter of a [`Query`].
type Param = Box<dyn ToSql + Sync + Send>;

/// A statement built piece by piece: each bound value becomes the next `$n`.
pub(crate) struct Query {
    sql: String,
    params: Vec<Param>,
}

impl Query {
    /// A statement starting with `sql`.
    pub(crate) fn new(sql: impl Into<String>) -> Self {
        Self {
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    /// Bind `value`; its placeholder (`$n`).
    pub(crate) fn bind<T: ToSql + Sync + Send + 'static>(&mut self, value: T) -> String {
        self.params.push(Box::new(value));
        format!("${}", self.params.len())
    }

    /// Append SQL text.
    pub(crate) fn push(&mut self, sql: &str) {
        self.sql.push_str(sql);
    }

    /// Append ` AND {condition} $n` with `value` as `$n` (`condition` ends in its operator:
    /// `"tenant ="`).
    pub(crate) fn and<T: ToSql + Sync + Send + 'static>(&mut self, condition: &str, value: T) {
        let at = self.bind(value);
        self.sql.push_str(&format!(" AND {condition} {at}"));
    }

    /// Append ` AND tenant = $n` for a one-tenant scope.
    pub(crate) fn scope(&mut self, scope: &hutch_core::tenant::TenantScope) {
        if let Some(t) = scope.tenant() {
            self.and("tenant =", t.as_str().to_string());
        }
    }

    /// Append the page clause: rows after the cursor (a cursor of `table`) by `column`, in
    /// that order, one more than the limit (to know whether more follow).
    pub(crate) fn page(&mut self, table: &str, column: &str, page: &PageRequest) -> CoreResult<()> {
        if let Some(after) = &page.after {
            self.and(&format!("{column} >"), decode_cursor(table, after)?);
        }
        self.sql.push_str(&format!(" ORDER BY {column}"));
        if let Some(n) = page.limit {
            let limit = self.bind(i64::try_from(n).unwrap_or(i64::MAX - 1) + 1);
            self.sql.push_str(&format!(" LIMIT {limit}"));
        }
        Ok(())
    }

    /// The statement's text.
    #[cfg(test)]
    pub(crate) fn sql(&self) -> &str {
        &self.sql
    }

    /// Run it; its rows.
    pub(crate) async fn rows<C: GenericClient>(&self, client: &C) -> CoreResult<Vec<Row>> {
        let params: Vec<&(dyn ToSql + Sync)> = self
            .params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect();
        rows(client, &self.sql, &params).await
    }
}

/// Run `sql` (prepared once per connection) with `params`; its rows.
pub(crate) async fn rows<C: GenericClient>(
    client: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> CoreResult<Vec<Row>> {
    let statement = client.prepare_cached(sql).await.map_err(pg)?;
    client.query(&statement, params).await.map_err(pg)
}

/// Run `sql` (prepared once per connection) with `params`; the rows it changed.
pub(crate) async fn execute<C: GenericClient>(
    client: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> CoreResult<u64> {
    let statement = client.prepare_cached(sql).await.map_err(pg)?;
    client.execute(&statement, params).await.map_err(pg)
}

/// Run `sql`, which returns one row.
pub(crate) async fn one<C: GenericClient>(
    client: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> CoreResult<Row> {
    let statement = client.prepare_cached(sql).await.map_err(pg)?;
    client.query_one(&statement, params).await.map_err(pg)
}

/// A column of a row (a type that does not match is a bug of this store's SQL).
pub(crate) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    column: &str,
) -> CoreResult<T> {
    row.try_get(column).map_err(pg)
}

/// One page out of rows of `(seq, item)`, at most one more than `limit`: the extra row
/// only says that another page follows, whose cursor is the last kept row's `seq`.
pub(crate) fn page_of<T>(
    table: &str,
    limit: Option<usize>,
    rows: impl IntoIterator<Item = CoreResult<(i64, T)>>,
) -> CoreResult<Page<T>> {
    let mut items = Vec::new();
    let mut last = None;
    let mut more = false;
    for row in rows {
        if limit.is_some_and(|n| items.len() == n) {
            more = true;
            break;
        }
        let (seq, item) = row?;
        items.push(item);
        last = Some(seq);
    }
    let next = match (more, last) {
        (true, Some(seq)) => Some(encode_cursor(table, seq)),
        _ => None,
    };
    Ok(Page { items, next })
}

/// The cursor after row `seq` of `table` (`table:seq`, base64url).
pub(crate) fn encode_cursor(table: &str, seq: i64) -> Cursor {
    Cursor::from_client(
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{table}:{seq}")),
    )
}

/// The `seq` a cursor of `table` stands for; 422 for anything this store did not issue
/// for that table.
pub(crate) fn decode_cursor(table: &str, cursor: &Cursor) -> CoreResult<i64> {
    let invalid = || {
        CoreError::InvalidArgument(format!(
            "invalid cursor {:?}: pass back the next_cursor of the previous page as it came",
            cursor.as_str()
        ))
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor.as_str())
        .map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    text.strip_prefix(table)
        .and_then(|r| r.strip_prefix(':'))
        .and_then(|n| n.parse::<i64>().ok())
        .ok_or_else(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_only_for_its_own_table() {
        let c = encode_cursor("sandboxes", 42);
        assert_eq!(decode_cursor("sandboxes", &c).expect("ours"), 42);
        assert!(matches!(
            decode_cursor("volumes", &c),
            Err(CoreError::InvalidArgument(_))
        ));
        assert!(decode_cursor("sandboxes", &Cursor::from_client("garbage!")).is_err());
    }

    #[test]
    fn placeholders_are_numbered_as_values_are_bound() {
        let mut q = Query::new("SELECT 1 FROM sandboxes WHERE ");
        let node = q.bind("a".to_string());
        q.push(&format!("node_id = {node}"));
        q.and("tenant =", "acme".to_string());
        q.page(
            "sandboxes",
            "seq",
            &PageRequest::new(Some(5), Some(encode_cursor("sandboxes", 7))).expect("page"),
        )
        .expect("clause");
        assert_eq!(
            q.sql(),
            "SELECT 1 FROM sandboxes WHERE node_id = $1 AND tenant = $2 AND seq > $3 ORDER BY seq LIMIT $4"
        );
        assert_eq!(q.params.len(), 4);
    }

    #[test]
    fn a_page_keeps_the_limit_and_says_whether_more_follow() {
        let rows = (1..=4).map(|i| Ok((i * 10, i)));
        let page = page_of("t", Some(3), rows).expect("page");
        assert_eq!(page.items, [1, 2, 3]);
        assert_eq!(page.next, Some(encode_cursor("t", 30)));
        let page = page_of("t", Some(4), (1..=4).map(|i| Ok((i, i)))).expect("page");
        assert_eq!(page.next, None);
        let page = page_of("t", None, (1..=4).map(|i| Ok((i, i)))).expect("page");
        assert_eq!((page.items.len(), page.next), (4, None));
    }
}
