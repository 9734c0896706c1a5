//! Picks and opens the storage backend named by `database.url`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use subflow_store::Store;
use subflow_store_postgres::PostgresStore;
use subflow_store_sqlite::SqliteStore;

/// A `database.url` naming no supported backend.
#[derive(Debug, thiserror::Error)]
#[error("database.url '{0}' is not supported: use sqlite://PATH or postgres://USER@HOST:PORT/DB")]
pub struct UnsupportedUrl(pub String);

/// A database that must exist and does not; a configuration error (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error(
    "no database at {} (database.url = {url}); `subflow migrate` creates it (with the same \
     --config, --database-url or SUBFLOW__DATABASE__URL), or point database.url at an existing one",
    path.display()
)]
pub struct MissingDatabase {
    /// Where the file was looked for.
    pub path: PathBuf,
    /// The URL that named it.
    pub url: String,
}

/// A database server that cannot be reached; a configuration error (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to PostgreSQL at {url} (database.url): {cause}")]
pub struct UnreachableDatabase {
    /// The URL, password hidden.
    pub url: String,
    /// Why, from the driver.
    pub cause: subflow_store::Error,
}

/// The backend a URL selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// `sqlite://` or `sqlite:`.
    Sqlite,
    /// `postgres://` or `postgresql://`.
    Postgres,
}

impl BackendKind {
    /// Reads the backend from a database URL.
    pub fn of(url: &str) -> Result<Self, UnsupportedUrl> {
        if url.starts_with("sqlite:") {
            Ok(BackendKind::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(BackendKind::Postgres)
        } else {
            Err(UnsupportedUrl(url.to_owned()))
        }
    }
}

/// An open store of either backend.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The embedded default.
    Sqlite(SqliteStore),
    /// Shared by many processes.
    Postgres(PostgresStore),
}

impl Backend {
    /// Opens the database at `url`, creating a missing SQLite file, and applies the
    /// embedded migrations.
    pub async fn open(url: &str, max_connections: u32) -> anyhow::Result<Self> {
        Ok(match BackendKind::of(url)? {
            BackendKind::Sqlite => Backend::Sqlite(
                SqliteStore::open(url, max_connections)
                    .await
                    .with_context(|| format!("opening SQLite database {url}"))?,
            ),
            BackendKind::Postgres => {
                let store = PostgresStore::open(url, max_connections)
                    .await
                    .map_err(|cause| UnreachableDatabase {
                        url: redact(url),
                        cause,
                    })?;
                store
                    .migrate()
                    .await
                    .with_context(|| format!("migrating PostgreSQL at {}", redact(url)))?;
                Backend::Postgres(store)
            }
        })
    }

    /// [`Backend::open`] for commands that administer an existing database: a SQLite
    /// file that does not exist is [`MissingDatabase`], never created.
    pub async fn open_existing(url: &str, max_connections: u32) -> anyhow::Result<Self> {
        BackendKind::of(url)?;
        if let Some(path) = sqlite_file(url)
            && !path.exists()
        {
            let path = std::path::absolute(&path).unwrap_or(path);
            return Err(MissingDatabase {
                path,
                url: url.to_owned(),
            }
            .into());
        }
        Backend::open(url, max_connections).await
    }

    /// The store behind the traits the rest of subflow uses.
    pub fn store(&self) -> Arc<dyn Store> {
        match self {
            Backend::Sqlite(store) => Arc::new(store.clone()),
            Backend::Postgres(store) => Arc::new(store.clone()),
        }
    }

    /// What a starting `serve` recovers beyond its runs: on SQLite, the batch item leases
    /// of the process that used the file before (one process uses it, so none is still
    /// held). PostgreSQL's leases belong to live processes until they expire.
    pub async fn recover_item_leases(&self) -> anyhow::Result<u64> {
        match self {
            Backend::Sqlite(store) => Ok(store.expire_item_leases().await?),
            Backend::Postgres(_) => Ok(0),
        }
    }

    /// Closes the connections; SQLite folds its write-ahead log back into the file.
    pub async fn close(&self) {
        match self {
            Backend::Sqlite(store) => store.close().await,
            Backend::Postgres(store) => store.pool().close().await,
        }
    }
}

/// The file a `sqlite:` URL names; `None` for other backends and in-memory databases.
fn sqlite_file(url: &str) -> Option<PathBuf> {
    url.strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .map(|path| path.split('?').next().unwrap_or(path))
        .filter(|path| !path.is_empty() && !path.starts_with(":memory:"))
        .map(PathBuf::from)
}

/// The data directory: beside the SQLite file, else the working directory.
pub fn data_dir(url: &str) -> PathBuf {
    sqlite_file(url)
        .and_then(|path| path.parent().map(PathBuf::from))
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("."))
}

/// A URL with any password hidden, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_select_their_backend_or_a_usage_error() {
        assert_eq!(
            BackendKind::of("sqlite://subflow.db").unwrap(),
            BackendKind::Sqlite
        );
        assert_eq!(
            BackendKind::of("postgresql://u@h/db").unwrap(),
            BackendKind::Postgres
        );
        let error = BackendKind::of("mysql://x").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("use sqlite://PATH or postgres://")
        );
    }

    #[test]
    fn the_data_dir_sits_beside_the_sqlite_file() {
        assert_eq!(data_dir("sqlite://subflow.db"), PathBuf::from("."));
        assert_eq!(
            data_dir("sqlite:///var/lib/subflow/s.db?mode=rwc"),
            PathBuf::from("/var/lib/subflow")
        );
        assert_eq!(data_dir("postgres://u@h/db"), PathBuf::from("."));
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("postgres://me:secret@h:5432/db"),
            "postgres://me:***@h:5432/db"
        );
        assert_eq!(redact("postgres://me@h/db"), "postgres://me@h/db");
    }
}
