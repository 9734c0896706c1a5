//! What `subflow users` and `subflow tokens` share (docs/api.md#auth-and-ownership): the database they
//! administer, found the way `serve` finds it (`--config` / `$SUBFLOW_CONFIG` /
//! `./subflow.toml`, `SUBFLOW__…` variables, `--database-url`); it must exist (a missing
//! SQLite file is an error naming `subflow migrate`, never created) and is migrated on
//! open; the mapping of store input errors to usage errors; and plain-text tables.

use std::sync::Arc;

use subflow_store::Store;

use super::{DatabaseArgs, UsageError};
use crate::storage::Backend;

/// Where the users and tokens live, and how to print them.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// An open, migrated database; close it before exiting so SQLite folds its WAL back.
#[derive(Debug)]
pub struct Database {
    backend: Backend,
    /// The store behind the traits.
    pub store: Arc<dyn Store>,
}

impl AdminArgs {
    /// Loads the configuration and opens (migrating) its existing database.
    pub async fn open(&self) -> anyhow::Result<Database> {
        let config = self.database.load()?;
        let backend =
            Backend::open_existing(&config.database.url, config.database.max_connections).await?;
        let store = backend.store();
        Ok(Database { backend, store })
    }
}

impl Database {
    /// Closes the connections.
    pub async fn close(self) {
        drop(self.store);
        self.backend.close().await;
    }
}

/// A store error: input errors (a taken name, a bad value) become usage errors (exit
/// code 2) with the store's message; anything else is a runtime error.
pub fn store_error(error: subflow_store::Error) -> anyhow::Error {
    if error.is_invalid_input() {
        UsageError(error.to_string()).into()
    } else {
        anyhow::Error::new(error).context("the database call failed")
    }
}

/// Rows as left-aligned columns two spaces apart, the first row being the header.
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .map(|row| row[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut text = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        text.push_str(cells.join("  ").trim_end());
        text.push('\n');
    }
    text
}

/// An optional value as a table cell.
pub fn cell(value: Option<&str>) -> String {
    value.unwrap_or("-").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_trim_line_ends() {
        let rows = vec![
            vec!["ID".to_owned(), "NAME".to_owned(), "X".to_owned()],
            vec!["1".to_owned(), "ana-lopez".to_owned(), String::new()],
        ];
        assert_eq!(table(&rows), "ID  NAME       X\n1   ana-lopez\n");
        assert_eq!(table(&[]), "");
    }

    #[test]
    fn input_errors_are_usage_errors_and_backend_errors_are_not() {
        let taken = store_error(subflow_store::Error::UserExists("ana".into()));
        assert_eq!(
            taken.downcast_ref::<UsageError>().map(|e| e.0.as_str()),
            Some("user 'ana' already exists")
        );
        let down = store_error(subflow_store::Error::backend(std::io::Error::other("down")));
        assert!(down.downcast_ref::<UsageError>().is_none());
    }
}
