//! The schema migrations against a real PostgreSQL of the test's own.

use hutch_store_postgres::{schema::MIGRATIONS, Db, DbError};
use hutch_testkit::PrivatePostgres;

#[tokio::test]
async fn nodes_starting_together_migrate_once_and_a_newer_schema_is_refused() {
    let pg = PrivatePostgres::start();
    let url = pg.create_database("migrate");
    let dbs: Vec<Db> = (0..4)
        .map(|_| Db::connect(&url, 2).expect("pool"))
        .collect();
    let runs = dbs.iter().map(|db| db.migrate());
    for version in futures_util::future::join_all(runs).await {
        assert_eq!(version.expect("migrate"), MIGRATIONS.len() as i64);
    }
    let applied = pg.psql("migrate", "SELECT count(*) FROM hutch_schema");
    assert_eq!(applied, MIGRATIONS.len().to_string(), "each migration once");
    pg.psql(
        "migrate",
        &format!(
            "INSERT INTO hutch_schema (version) VALUES ({})",
            MIGRATIONS.len() + 1
        ),
    );
    match dbs[0].migrate().await {
        Err(DbError::SchemaTooNew { found, known }) => {
            assert_eq!(
                (found, known),
                (MIGRATIONS.len() as i64 + 1, MIGRATIONS.len() as i64)
            );
        }
        other => panic!("a newer schema must be refused, got {other:?}"),
    }
}

#[tokio::test]
async fn a_database_that_is_down_is_reported_unreachable() {
    let mut pg = PrivatePostgres::start();
    let url = pg.create_database("down");
    pg.stop();
    let db = Db::connect(&url, 1).expect("pool");
    let err = db.migrate().await.expect_err("the server is down");
    assert!(err.is_unreachable(), "{err}");
}
