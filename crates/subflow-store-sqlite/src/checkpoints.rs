//! Thread state checkpoints (SPEC §2.3) on SQLite, with the semantics of `MemoryStore`.

use async_trait::async_trait;
use rusqlite::types::Value as SqlValue;
use rusqlite::{Row, params, params_from_iter};
use subflow_store::{Checkpoint, CheckpointStore, NewCheckpoint, Result, codec};

use crate::{Db, SqliteStore, query_all, text};

const CHECKPOINT_COLUMNS: &str = "thread_id, checkpoint_id, parent_checkpoint_id, run_id, \
     state_values, metadata, created_at";

fn decode_checkpoint(row: &Row<'_>) -> Result<Checkpoint> {
    Ok(Checkpoint {
        thread_id: row.get(0).db()?,
        checkpoint_id: row.get(1).db()?,
        parent_checkpoint_id: row.get(2).db()?,
        run_id: row.get(3).db()?,
        values: codec::json("checkpoints.state_values", text(row, 4)?)?,
        metadata: codec::object("checkpoints.metadata", text(row, 5)?)?,
        created_at: row.get(6).db()?,
    })
}

#[async_trait]
impl CheckpointStore for SqliteStore {
    async fn put_checkpoint(&self, checkpoint: NewCheckpoint) -> Result<Checkpoint> {
        let stored = checkpoint.into_stored()?;
        let row = (
            stored.thread_id.clone(),
            stored.checkpoint_id.clone(),
            stored.parent_checkpoint_id.clone(),
            stored.run_id.clone(),
            serde_json::to_string(&stored.values).expect("a JSON value always serialises"),
            serde_json::to_string(&stored.metadata).expect("a JSON map always serialises"),
            stored.created_at.clone(),
        );
        self.write(move |conn| {
            let (thread_id, checkpoint_id, parent, run_id, values, metadata, created_at) = row;
            conn.prepare_cached(
                "INSERT INTO checkpoints (thread_id, checkpoint_id, parent_checkpoint_id, \
                 run_id, state_values, metadata, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .db()?
            .execute(params![
                thread_id,
                checkpoint_id,
                parent,
                run_id,
                values,
                metadata,
                created_at
            ])
            .db()
        })
        .await?;
        Ok(stored)
    }

    async fn latest_checkpoint(&self, thread_id: &str) -> Result<Option<Checkpoint>> {
        let thread_id = thread_id.to_owned();
        self.read(move |conn| {
            let sql = format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE thread_id = ? \
                 ORDER BY id DESC LIMIT 1"
            );
            let mut statement = conn.prepare_cached(&sql).db()?;
            let mut rows = statement.query([thread_id]).db()?;
            rows.next().db()?.map(decode_checkpoint).transpose()
        })
        .await
    }

    async fn list_checkpoints(
        &self,
        thread_id: &str,
        limit: u32,
        before: Option<&str>,
    ) -> Result<Vec<Checkpoint>> {
        let mut sql = format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE thread_id = ?1");
        let mut params = vec![SqlValue::Text(thread_id.to_owned())];
        if let Some(before) = before {
            // An id unknown in this thread makes the subquery NULL, so nothing matches.
            sql.push_str(
                " AND id < (SELECT id FROM checkpoints WHERE thread_id = ?1 \
                 AND checkpoint_id = ?2)",
            );
            params.push(SqlValue::Text(before.to_owned()));
        }
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", params.len() + 1));
        params.push(SqlValue::Integer(i64::from(limit)));
        self.read(move |conn| query_all(conn, &sql, params_from_iter(params), decode_checkpoint))
            .await
    }

    async fn delete_run_checkpoints(&self, thread_id: &str, run_id: &str) -> Result<u64> {
        let (thread_id, run_id) = (thread_id.to_owned(), run_id.to_owned());
        let deleted = self
            .write(move |conn| {
                conn.prepare_cached("DELETE FROM checkpoints WHERE thread_id = ? AND run_id = ?")
                    .db()?
                    .execute([thread_id, run_id])
                    .db()
            })
            .await?;
        Ok(deleted as u64)
    }
}
