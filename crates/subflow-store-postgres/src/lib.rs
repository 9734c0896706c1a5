//! The PostgreSQL backend of the subflow store: threads, runs, run events and thread
//! state checkpoints in one database shared by many `serve` and `worker` processes
//! (docs/configuration.md#sources). A thread's `seq` values are allocated under a transaction advisory
//! lock on the thread id, so any number of processes may append to the same thread
//! concurrently (docs/events.md#envelope). Run stream logs, run leases and cancel requests live here
//! too, announced to every process with `NOTIFY` (docs/api.md#resume-and-rejoin, docs/api.md#cancel).
//!
//! This crate implements the `subflow-store` traits and nothing else: it holds no
//! business rules beyond the reference semantics of `MemoryStore`, reads no
//! configuration or environment, and must return the same results as the SQLite
//! backend for the same history (JSON is stored as text for that reason).
//!
//! One file per store trait (`events`, `records`, `checkpoints`, `auth`, `streams`,
//! `batches`);
//! this file holds the pool, the migrations and the column helpers they share.
//!
//! # Map
//!
//! For many processes on many machines (sqlx). One round trip per batch: the server-side
//! function `subflow_append_events` takes `pg_advisory_xact_lock` on the thread id,
//! allocates `seq` from `MAX(seq)`, skips stored `event_id`s and inserts with `UNNEST`;
//! `UNIQUE (thread_id, seq)` backs the lock up. `streams.rs`: `subflow_append_frames`
//! locks the run's log row, skips stored ids, checks continuity, inserts and `NOTIFY`s
//! `subflow_stream` with `{run_id, last_id}` in one round trip; cancel requests `NOTIFY`
//! `subflow_cancel`; `listen` is one `PgListener` per process; leases and pruning use the
//! database clock. `open` tries one connection under a 5 s deadline before building the
//! pool, so an unreachable server is an error at once instead of after the pool's 30 s of
//! retries. `batches.rs`: each write one transaction running a shared
//! `subflow_store::batches::rows` function over `batches/rows.rs`, this backend's row
//! access: a claim pass locks the active batch rows `FOR UPDATE SKIP LOCKED`, then their
//! queued items the same way; every other batch write locks the batch row `FOR UPDATE`
//! before its item rows; lease times are `now()` in epoch milliseconds.

mod auth;
mod batches;
mod checkpoints;
mod events;
mod records;
mod streams;
mod tasks;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::time::Duration;

use serde_json::{Map, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{Connection, PgConnection, PgPool, Postgres, Row};
use subflow_store::{Error, Result};

/// The embedded schema migrations, applied by [`PostgresStore::connect`].
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// How long the first connection may take before the server counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A [`subflow_store::Store`] on a PostgreSQL connection pool; cheap to clone.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// Encodes checkpoints as deltas; remembers each thread's latest message hashes.
    deltas: std::sync::Arc<subflow_store::delta::DeltaCodec>,
}

impl PostgresStore {
    /// Connects to `url` with a pool of at most `max_connections` and applies the migrations.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let store = PostgresStore::open(url, max_connections).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Connects to `url` with a pool of at most `max_connections`, without migrating.
    /// A server that refuses, or does not answer within [`CONNECT_TIMEOUT`], is an error
    /// at once: the pool alone would retry until its 30 s acquire timeout.
    pub async fn open(url: &str, max_connections: u32) -> Result<Self> {
        let options: PgConnectOptions = url.parse().map_err(Error::backend)?;
        let probe = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options))
            .await
            .map_err(|_| {
                Error::backend(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
                ))
            })?
            .map_err(Error::backend)?;
        probe.close().await.ok();
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .connect_with(options)
            .await
            .map_err(Error::backend)?;
        Ok(PostgresStore::from_pool(pool))
    }

    /// A store on an existing pool whose database is already migrated.
    pub fn from_pool(pool: PgPool) -> Self {
        PostgresStore {
            pool,
            deltas: Default::default(),
        }
    }

    /// The underlying pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies any pending embedded migrations; safe to call from several processes at once.
    pub async fn migrate(&self) -> Result<()> {
        // The migrator serialises concurrent callers with its own advisory lock.
        MIGRATOR.run(&self.pool).await.map_err(Error::backend)?;
        tracing::debug!("postgres store migrations applied");
        Ok(())
    }
}

/// Reads one column, mapping a type mismatch to a backend error.
pub(crate) fn get<'r, T>(row: &'r PgRow, column: &str) -> Result<T>
where
    T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get(column).map_err(Error::backend)
}

/// A JSON value as the text stored in a column.
pub(crate) fn value_text(value: &Value) -> String {
    // A `Value` has only string keys, so serialising it cannot fail.
    serde_json::to_string(value).expect("a JSON value always serialises")
}

/// A JSON object as the text stored in a column.
pub(crate) fn object_text(object: &Map<String, Value>) -> String {
    serde_json::to_string(object).expect("a JSON object always serialises")
}
