//! Thread state checkpoints (SPEC §2.3) with the semantics of `MemoryStore`.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use subflow_store::{Checkpoint, CheckpointStore, Error, NewCheckpoint, Result, codec};

use crate::{PostgresStore, get, object_text, value_text};

/// The `SELECT` of every column [`checkpoint_from_row`] reads, as a literal for `concat!`.
macro_rules! select_checkpoints {
    () => {
        "SELECT thread_id, checkpoint_id, parent_checkpoint_id, run_id, state_values, \
         metadata, created_at FROM checkpoints"
    };
}

#[async_trait]
impl CheckpointStore for PostgresStore {
    async fn put_checkpoint(&self, checkpoint: NewCheckpoint) -> Result<Checkpoint> {
        let stored = checkpoint.into_stored()?;
        sqlx::query(
            "INSERT INTO checkpoints (thread_id, checkpoint_id, parent_checkpoint_id, run_id, \
             state_values, metadata, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&stored.thread_id)
        .bind(&stored.checkpoint_id)
        .bind(&stored.parent_checkpoint_id)
        .bind(&stored.run_id)
        .bind(value_text(&stored.values))
        .bind(object_text(&stored.metadata))
        .bind(&stored.created_at)
        .execute(self.pool())
        .await
        .map_err(Error::backend)?;
        Ok(stored)
    }

    async fn latest_checkpoint(&self, thread_id: &str) -> Result<Option<Checkpoint>> {
        let row = sqlx::query(concat!(
            select_checkpoints!(),
            " WHERE thread_id = $1 ORDER BY id DESC LIMIT 1"
        ))
        .bind(thread_id)
        .fetch_optional(self.pool())
        .await
        .map_err(Error::backend)?;
        row.as_ref().map(checkpoint_from_row).transpose()
    }

    async fn list_checkpoints(
        &self,
        thread_id: &str,
        limit: u32,
        before: Option<&str>,
    ) -> Result<Vec<Checkpoint>> {
        // An id unknown in this thread makes the subquery NULL, so nothing matches.
        let rows = sqlx::query(concat!(
            select_checkpoints!(),
            " WHERE thread_id = $1 AND ($2::text IS NULL OR id < (SELECT id FROM checkpoints",
            " WHERE thread_id = $1 AND checkpoint_id = $2))",
            " ORDER BY id DESC LIMIT $3"
        ))
        .bind(thread_id)
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await
        .map_err(Error::backend)?;
        rows.iter().map(checkpoint_from_row).collect()
    }

    async fn delete_run_checkpoints(&self, thread_id: &str, run_id: &str) -> Result<u64> {
        let deleted = sqlx::query("DELETE FROM checkpoints WHERE thread_id = $1 AND run_id = $2")
            .bind(thread_id)
            .bind(run_id)
            .execute(self.pool())
            .await
            .map_err(Error::backend)?;
        Ok(deleted.rows_affected())
    }
}

fn checkpoint_from_row(row: &PgRow) -> Result<Checkpoint> {
    Ok(Checkpoint {
        thread_id: get(row, "thread_id")?,
        checkpoint_id: get(row, "checkpoint_id")?,
        parent_checkpoint_id: get(row, "parent_checkpoint_id")?,
        run_id: get(row, "run_id")?,
        values: codec::json(
            "checkpoints.state_values",
            &get::<String>(row, "state_values")?,
        )?,
        metadata: codec::object("checkpoints.metadata", &get::<String>(row, "metadata")?)?,
        created_at: get(row, "created_at")?,
    })
}
