//! The PostgreSQL backend of the subflow store: threads, runs, run events and thread
//! state checkpoints in one database shared by many `serve` and `worker` processes
//! (SPEC §1.2). A thread's `seq` values are allocated under a transaction advisory
//! lock on the thread id, so any number of processes may append to the same thread
//! concurrently (SPEC §5.1). Run stream logs, run leases and cancel requests live here
//! too, announced to every process with `NOTIFY` (SPEC §2.5, §2.6).
//!
//! This crate implements the `subflow-store` traits and nothing else: it holds no
//! business rules beyond the reference semantics of `MemoryStore`, reads no
//! configuration or environment, and must return the same results as the SQLite
//! backend for the same history (JSON is stored as text for that reason).
//!
//! One file per store trait (`events`, `records`, `checkpoints`, `auth`, `streams`,
//! `batches`);
//! this file holds the pool, the migrations and the column helpers they share.

mod auth;
mod batches;
mod checkpoints;
mod events;
mod records;
mod streams;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use serde_json::{Map, Value};
use sqlx::postgres::{PgPoolOptions, PgRow};
use sqlx::{PgPool, Postgres, Row};
use subflow_store::{Error, Result};

/// The embedded schema migrations, applied by [`PostgresStore::connect`].
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// A [`subflow_store::Store`] on a PostgreSQL connection pool; cheap to clone.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects to `url` with a pool of at most `max_connections` and applies the migrations.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(url)
            .await
            .map_err(Error::backend)?;
        let store = PostgresStore::from_pool(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// A store on an existing pool whose database is already migrated.
    pub fn from_pool(pool: PgPool) -> Self {
        PostgresStore { pool }
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
