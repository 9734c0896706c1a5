//! Scratch databases for tests (feature `testing`): each test gets a fresh, migrated
//! database of its own on the server named by `SUBFLOW_TEST_PG_URL`, so tests never
//! see each other's rows, and an unreachable server fails loudly instead of skipping.

use std::time::Duration;

use crate::PostgresStore;
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use uuid::Uuid;

/// The variable naming the PostgreSQL server the tests may create databases on.
pub const URL_VAR: &str = "SUBFLOW_TEST_PG_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The server URL from [`URL_VAR`], or the local default.
pub fn server_url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A fresh, migrated database of its own; dropped (best effort) when the value is.
#[derive(Debug)]
pub struct TestDb {
    /// A store on the database.
    pub store: PostgresStore,
    /// The database's URL, for other processes.
    pub url: String,
    server: String,
    name: String,
}

impl TestDb {
    /// Creates `subflow_test_<uuid>` on the server and connects a migrated store to it.
    pub async fn new() -> TestDb {
        let server = server_url();
        let name = format!("subflow_test_{}", Uuid::new_v4().simple());
        let mut admin = connect_admin(&server).await;
        // The name is generated above from hex digits only, so formatting it is safe.
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("cannot create a test database on {URL_VAR}={server}: {e}"));
        admin.close().await.ok();
        let url = with_database(&server, &name);
        let store = PostgresStore::connect(&url, 4)
            .await
            .unwrap_or_else(|e| panic!("cannot open the test database {url}: {e}"));
        TestDb {
            store,
            url,
            server,
            name,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop cannot await, and the test's runtime may be the one running this, so the
        // cleanup gets a thread and runtime of its own. Failures only leave a database behind.
        let server = self.server.clone();
        let name = self.name.clone();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let Ok(runtime) = runtime else { return };
            runtime.block_on(async {
                if let Ok(Ok(mut admin)) =
                    tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect(&server)).await
                {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    sqlx::query(AssertSqlSafe(sql))
                        .execute(&mut admin)
                        .await
                        .ok();
                    admin.close().await.ok();
                }
            });
        });
        cleanup.join().ok();
    }
}

/// A connection to the server's own database, failing the test loudly when it is unreachable.
async fn connect_admin(server: &str) -> PgConnection {
    let hint = format!(
        "PostgreSQL is unreachable at {URL_VAR}={server}; start it or point {URL_VAR} at a \
         server where the tests may create databases"
    );
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect(server)).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(error)) => panic!("{hint}: {error}"),
        Err(_) => panic!("{hint}: no answer within {CONNECT_TIMEOUT:?}"),
    }
}

/// `url` with its path (the database name) replaced by `database`, query string kept.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    let mut result = format!("{}/{database}", &base[..path_start]);
    if let Some(query) = query {
        result.push('?');
        result.push_str(query);
    }
    result
}

/// One change of a batch item's status or lease, as [`ItemHistory`] recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemChange {
    /// Order of the change over the whole database.
    pub seq: i64,
    /// The item.
    pub item_id: String,
    /// Its key.
    pub item_key: String,
    /// Status before.
    pub from_status: String,
    /// Status after.
    pub to_status: String,
    /// `attempt` after.
    pub attempt: i64,
    /// `lease_owner` before.
    pub owner_before: Option<String>,
    /// `lease_owner` after.
    pub owner_after: Option<String>,
    /// `lease_expires_at` before (epoch ms, database clock).
    pub expires_before: Option<i64>,
    /// `error` after.
    pub error: Option<String>,
    /// When the change committed's statement ran: epoch ms of the database clock.
    pub at_ms: i64,
}

/// A test-only audit of a database's batch items: a trigger records every change of an
/// item's status or lease owner, whichever process makes it, so a test can check the
/// attempt history of items run by several worker processes.
#[derive(Debug)]
pub struct ItemHistory;

impl ItemHistory {
    /// Installs the audit table and trigger on `store`'s database.
    pub async fn install(store: &PostgresStore) {
        let statements = [
            "CREATE TABLE subflow_test_item_history (
                seq BIGSERIAL PRIMARY KEY, item_id TEXT NOT NULL, item_key TEXT NOT NULL,
                from_status TEXT NOT NULL, to_status TEXT NOT NULL, attempt BIGINT NOT NULL,
                owner_before TEXT, owner_after TEXT, expires_before BIGINT, error TEXT,
                at_ms BIGINT NOT NULL)",
            "CREATE FUNCTION subflow_test_record_item() RETURNS trigger AS $$
             BEGIN
                 INSERT INTO subflow_test_item_history (item_id, item_key, from_status,
                     to_status, attempt, owner_before, owner_after, expires_before, error, at_ms)
                 VALUES (NEW.id, NEW.item_key, OLD.status, NEW.status, NEW.attempt,
                     OLD.lease_owner, NEW.lease_owner, OLD.lease_expires_at, NEW.error,
                     (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT);
                 RETURN NEW;
             END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER subflow_test_item_history AFTER UPDATE ON subagent_batch_items
             FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                 OR OLD.lease_owner IS DISTINCT FROM NEW.lease_owner)
             EXECUTE FUNCTION subflow_test_record_item()",
        ];
        for statement in statements {
            sqlx::query(statement)
                .execute(store.pool())
                .await
                .unwrap_or_else(|e| panic!("installing the item audit: {e}"));
        }
    }

    /// Every recorded change in the order they were made; an item's changes are
    /// serialised by its row lock, so they read in the order they committed.
    pub async fn read(store: &PostgresStore) -> Vec<ItemChange> {
        type Row = (
            i64,
            String,
            String,
            String,
            String,
            i64,
            Option<String>,
            Option<String>,
            Option<i64>,
            Option<String>,
            i64,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT seq, item_id, item_key, from_status, to_status, attempt, owner_before,
                    owner_after, expires_before, error, at_ms
             FROM subflow_test_item_history ORDER BY seq",
        )
        .fetch_all(store.pool())
        .await
        .unwrap_or_else(|e| panic!("reading the item audit: {e}"));
        rows.into_iter()
            .map(|row| ItemChange {
                seq: row.0,
                item_id: row.1,
                item_key: row.2,
                from_status: row.3,
                to_status: row.4,
                attempt: row.5,
                owner_before: row.6,
                owner_after: row.7,
                expires_before: row.8,
                error: row.9,
                at_ms: row.10,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_name_replaces_only_the_url_path() {
        let check = |url: &str, expected: &str| assert_eq!(with_database(url, "db2"), expected);
        check(
            "postgres://postgres@127.0.0.1:5432/test",
            "postgres://postgres@127.0.0.1:5432/db2",
        );
        check(
            "postgres://u:p@h/test?sslmode=disable",
            "postgres://u:p@h/db2?sslmode=disable",
        );
        check("postgres://localhost", "postgres://localhost/db2");
        check(
            "postgres://localhost?application_name=x",
            "postgres://localhost/db2?application_name=x",
        );
    }
}

/// A test-only full disk: every insert, update and delete on the store's tables fails
/// with PostgreSQL's own `disk_full` error (SQLSTATE 53100) until it is healed, while
/// reads go on working, as they do on a server whose volume filled up.
#[derive(Debug)]
pub struct FullDisk;

impl FullDisk {
    /// Makes every write fail.
    pub async fn fill(store: &PostgresStore) {
        let statements = [
            "CREATE OR REPLACE FUNCTION subflow_test_disk_full() RETURNS trigger AS $$
             BEGIN
                 RAISE EXCEPTION 'could not extend file: No space left on device'
                     USING ERRCODE = 'disk_full';
             END $$ LANGUAGE plpgsql",
            "DO $$ DECLARE t TEXT; BEGIN
                 FOR t IN SELECT tablename FROM pg_tables
                          WHERE schemaname = current_schema()
                            AND tablename NOT LIKE '\\_sqlx%' AND tablename NOT LIKE 'subflow\\_test%'
                 LOOP
                     EXECUTE format('CREATE TRIGGER subflow_test_disk_full BEFORE INSERT OR UPDATE
                         OR DELETE ON %I FOR EACH STATEMENT
                         EXECUTE FUNCTION subflow_test_disk_full()', t);
                 END LOOP;
             END $$",
        ];
        for statement in statements {
            sqlx::raw_sql(statement)
                .execute(store.pool())
                .await
                .unwrap_or_else(|e| panic!("filling the disk: {e}"));
        }
    }

    /// Lets writes through again.
    pub async fn heal(store: &PostgresStore) {
        sqlx::raw_sql(
            "DO $$ DECLARE t TEXT; BEGIN
                 FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = current_schema()
                 LOOP
                     EXECUTE format('DROP TRIGGER IF EXISTS subflow_test_disk_full ON %I', t);
                 END LOOP;
             END $$",
        )
        .execute(store.pool())
        .await
        .unwrap_or_else(|e| panic!("healing the disk: {e}"));
    }
}
