//! TLS to the cluster database: a server that refuses plain TCP, reached with
//! `sslmode=require` and its certificate verified against the test's CA; without the CA
//! (the system's roots) and without TLS, nothing connects.

use hutch_store_postgres::{Db, DbError, DbTls};
use hutch_testkit::{PrivatePostgres, TestCa};

/// An error with every cause it carries.
fn chain(e: &DbError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text.to_lowercase()
}

async fn try_query(db: &Db) -> Result<String, DbError> {
    let client = db.client().await?;
    let row = client
        .query_one(
            "SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test]
async fn the_database_is_reached_over_verified_tls_only() {
    let ca = TestCa::new();
    let pg = PrivatePostgres::start_with_tls(&ca);
    let url = pg.create_database("hutch");

    let tls_url = format!("{url}?sslmode=require");
    let tls = DbTls::for_url(&tls_url, Some(&ca.root())).expect("the CA");
    let db = Db::connect_with(&tls_url, 4, tls).expect("a pool");
    assert_eq!(
        db.migrate().await.expect("migrate over TLS"),
        hutch_store_postgres::schema::MIGRATIONS.len() as i64
    );
    assert_eq!(
        try_query(&db).await.expect("a query"),
        "true",
        "the session is encrypted"
    );
    // LISTEN/NOTIFY (the owner caches) over TLS too.
    let mut listener = db.listen("hutch_test").await.expect("listen over TLS");
    db.client()
        .await
        .expect("client")
        .execute("SELECT pg_notify('hutch_test', 'hello')", &[])
        .await
        .expect("notify");
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
        .await
        .expect("a notification in time");
    assert_eq!(got.as_deref(), Some("hello"));

    // Plain TCP is refused by the server.
    let plain = Db::connect(&url, 1).expect("a pool");
    let err = try_query(&plain).await.expect_err("plain TCP refused");
    assert!(chain(&err).contains("no encryption"), "{}", chain(&err));

    // TLS without the test's CA: the server's certificate is not trusted.
    let untrusted = Db::connect_with(
        &tls_url,
        1,
        DbTls::for_url(&tls_url, None).expect("system roots"),
    )
    .expect("a pool");
    let err = try_query(&untrusted)
        .await
        .expect_err("an untrusted certificate");
    let text = chain(&err);
    assert!(
        text.contains("certificate") || text.contains("unknownissuer"),
        "{text}"
    );
}
