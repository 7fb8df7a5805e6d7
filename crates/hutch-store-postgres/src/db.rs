//! [`Db`]: the connection pool and the schema migrations.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

use crate::schema::MIGRATIONS;
use crate::DbTls;

/// How long a connection attempt, or a wait for a free pooled connection, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The advisory lock the migrating node holds (any constant every node agrees on).
const MIGRATION_LOCK: i64 = 0x6875_7463_6801;

/// A failure of the database or of talking to it.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The connection URL does not parse.
    #[error("database URL: {0}")]
    Url(#[source] tokio_postgres::Error),
    /// No connection could be had (the server is down, unreachable or refuses us).
    #[error("database unreachable: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// A statement failed.
    #[error("database: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// The database's schema is newer than this binary knows.
    #[error("database schema is at version {found}, newer than this hutch knows ({known}): upgrade this node")]
    SchemaTooNew {
        /// The database's version.
        found: i64,
        /// The newest this binary has.
        known: i64,
    },
    /// The pool could not be built.
    #[error("database pool: {0}")]
    Build(#[from] deadpool_postgres::BuildError),
    /// TLS to the database cannot be set up as asked (`tls.rs`).
    #[error("database TLS: {0}")]
    Tls(String),
}

impl DbError {
    /// Whether the database could not be reached (as opposed to refusing a statement): no
    /// connection, a connection lost, or the server ending ours (it is shutting down, or
    /// was told to).
    pub fn is_unreachable(&self) -> bool {
        match self {
            DbError::Pool(_) => true,
            DbError::Query(e) => {
                e.is_closed() || e.as_db_error().is_none_or(|d| lost_connection(d.code()))
            }
            _ => false,
        }
    }
}

/// Whether the server's answer says our connection is gone rather than our statement
/// wrong: class 08 (connection exception), and a server shutting down, crashed, or not
/// accepting connections yet (57P01 to 57P03; a statement in flight when the server stops
/// gets 57P01).
fn lost_connection(code: &SqlState) -> bool {
    code.code().starts_with("08")
        || [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
        ]
        .contains(code)
}

/// A connection listening for notifications ([`Db::listen`]).
pub struct Listener {
    client: tokio_postgres::Client,
    rx: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Listener {
    /// The next notification's payload; `None` once the connection ended.
    pub async fn recv(&mut self) -> Option<String> {
        self.rx.recv().await
    }

    /// Check the connection still works (a round trip).
    pub async fn ping(&self) -> Result<(), DbError> {
        self.client.simple_query("SELECT 1").await?;
        Ok(())
    }
}

/// A pool of connections to the cluster's database.
#[derive(Clone)]
pub struct Db {
    pool: Pool,
    cfg: std::sync::Arc<tokio_postgres::Config>,
    tls: DbTls,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").finish_non_exhaustive()
    }
}

impl Db {
    /// A pool of up to `max_size` connections to `url` (`postgres://user:pass@host/db`, or
    /// the key=value form), in plain text unless the URL asks for TLS (then verified
    /// against the system's roots: [`Db::connect_with`]). Connects lazily: a database that
    /// is down fails the first use.
    pub fn connect(url: &str, max_size: usize) -> Result<Self, DbError> {
        Self::connect_with(url, max_size, DbTls::for_url(url, None)?)
    }

    /// [`Db::connect`] with connections made as `tls` says.
    pub fn connect_with(url: &str, max_size: usize, tls: DbTls) -> Result<Self, DbError> {
        let mut cfg: tokio_postgres::Config = url.parse().map_err(DbError::Url)?;
        if cfg.get_connect_timeout().is_none() {
            cfg.connect_timeout(CONNECT_TIMEOUT);
        }
        cfg.application_name("hutch");
        let manager_cfg = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match tls.connector() {
            Some(connector) => Manager::from_config(cfg.clone(), connector, manager_cfg),
            None => Manager::from_config(cfg.clone(), NoTls, manager_cfg),
        };
        let pool = Pool::builder(manager)
            .max_size(max_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .build()?;
        Ok(Self {
            pool,
            cfg: std::sync::Arc::new(cfg),
            tls,
        })
    }

    /// A connection of its own, outside the pool, that `LISTEN`s on `channel` (a plain
    /// identifier). Each notification's payload arrives on [`Listener::recv`] until the
    /// connection ends; [`Listener::ping`] checks that it still lives.
    pub async fn listen(&self, channel: &str) -> Result<Listener, DbError> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let client = match self.tls.connector() {
            Some(connector) => {
                let (client, connection) = self.cfg.connect(connector).await?;
                tokio::spawn(forward_notifications(connection, tx));
                client
            }
            None => {
                let (client, connection) = self.cfg.connect(NoTls).await?;
                tokio::spawn(forward_notifications(connection, tx));
                client
            }
        };
        client
            .batch_execute(&format!("LISTEN \"{}\"", channel.replace('"', "")))
            .await?;
        Ok(Listener { client, rx })
    }

    /// A pooled connection.
    pub async fn client(&self) -> Result<deadpool_postgres::Client, DbError> {
        Ok(self.pool.get().await?)
    }

    /// Bring the schema to this binary's version: each missing migration in a transaction
    /// of its own, under an advisory lock so that nodes starting together migrate once.
    /// Returns the version reached.
    pub async fn migrate(&self) -> Result<i64, DbError> {
        let mut client = self.client().await?;
        client
            .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        let result = migrate_locked(&mut client).await;
        let unlock = client
            .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .await;
        let version = result?;
        unlock?;
        Ok(version)
    }
}

async fn migrate_locked(client: &mut deadpool_postgres::Client) -> Result<i64, DbError> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS hutch_schema (
                version BIGINT PRIMARY KEY,
                applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
            )",
        )
        .await?;
    let row = client
        .query_one("SELECT coalesce(max(version), 0) FROM hutch_schema", &[])
        .await?;
    let found: i64 = row.get(0);
    let known = MIGRATIONS.len() as i64;
    if found > known {
        return Err(DbError::SchemaTooNew { found, known });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = i as i64 + 1;
        let tx = client.transaction().await?;
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO hutch_schema (version) VALUES ($1)",
            &[&version],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(version, "database schema migrated");
    }
    Ok(known)
}

/// `CREATE DATABASE "name"` on the server `url` points at, over a connection of its own:
/// for tools that make a scratch database (`hutch bench cluster`). `name` is a plain
/// identifier.
pub async fn create_database(url: &str, name: &str) -> Result<(), DbError> {
    let name = name.replace('"', "");
    execute_once(url, &format!("CREATE DATABASE \"{name}\"")).await
}

/// `DROP DATABASE IF EXISTS "name" WITH (FORCE)`, likewise ([`create_database`]).
pub async fn drop_database(url: &str, name: &str) -> Result<(), DbError> {
    let name = name.replace('"', "");
    execute_once(
        url,
        &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
    )
    .await
}

/// Run `sql` on a connection of its own to `url` (TLS as the URL asks), then close it.
async fn execute_once(url: &str, sql: &str) -> Result<(), DbError> {
    let mut cfg: tokio_postgres::Config = url.parse().map_err(DbError::Url)?;
    cfg.connect_timeout(CONNECT_TIMEOUT);
    match DbTls::for_url(url, None)?.connector() {
        Some(connector) => {
            let (client, connection) = cfg.connect(connector).await?;
            run_once(client, tokio::spawn(connection), sql).await
        }
        None => {
            let (client, connection) = cfg.connect(NoTls).await?;
            run_once(client, tokio::spawn(connection), sql).await
        }
    }
}

async fn run_once<E>(
    client: tokio_postgres::Client,
    task: tokio::task::JoinHandle<Result<(), E>>,
    sql: &str,
) -> Result<(), DbError> {
    let result = client.batch_execute(sql).await;
    drop(client);
    let _ = task.await;
    result.map_err(DbError::from)
}

/// Poll a listening connection, sending each notification's payload to `tx`, until it ends
/// or nobody listens any more.
async fn forward_notifications<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    tx: tokio::sync::mpsc::UnboundedSender<String>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                if tx.send(n.payload().to_string()).is_err() {
                    break;
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::debug!(error = %e, "the listening connection ended");
                break;
            }
            None => break,
        }
    }
}
