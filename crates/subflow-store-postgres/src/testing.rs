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
