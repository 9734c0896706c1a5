//! Thread state checkpoints (docs/api.md#objects) with the semantics of `MemoryStore`, each
//! stored as a delta of the thread's previous one (`subflow_store::delta`).

use std::collections::HashMap;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Postgres};
use subflow_store::delta::{ChainRow, Latest, decode_rows};
use subflow_store::{Checkpoint, CheckpointStore, Error, NewCheckpoint, Result, codec};

use crate::{PostgresStore, get, object_text};

/// The `SELECT` of every column [`head_from_row`] reads, as a literal for `concat!`.
macro_rules! select_heads {
    () => {
        "SELECT id, thread_id, checkpoint_id, parent_checkpoint_id, run_id, metadata, \
         created_at FROM checkpoints"
    };
}

/// A checkpoint row without its values, which need its chain.
struct Head {
    row: i64,
    checkpoint: Checkpoint,
}

fn head_from_row(row: &PgRow) -> Result<Head> {
    Ok(Head {
        row: get(row, "id")?,
        checkpoint: Checkpoint {
            thread_id: get(row, "thread_id")?,
            checkpoint_id: get(row, "checkpoint_id")?,
            parent_checkpoint_id: get(row, "parent_checkpoint_id")?,
            run_id: get(row, "run_id")?,
            values: Value::Null,
            metadata: codec::object("checkpoints.metadata", &get::<String>(row, "metadata")?)?,
            created_at: get(row, "created_at")?,
        },
    })
}

/// The rows `rows` and every row their chains pass through, ascending by id.
async fn chains(conn: &mut PgConnection, rows: &[i64]) -> Result<Vec<ChainRow>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let found = sqlx::query(
        "WITH RECURSIVE chain(id) AS (SELECT id FROM checkpoints WHERE id = ANY($1) \
         UNION SELECT c.base_id FROM checkpoints c JOIN chain ON c.id = chain.id \
         WHERE c.base_id IS NOT NULL) \
         SELECT c.id, c.base_id, c.keep, c.state_values FROM checkpoints c \
         JOIN chain ON c.id = chain.id ORDER BY c.id",
    )
    .bind(rows)
    .fetch_all(&mut *conn)
    .await
    .map_err(Error::backend)?;
    found
        .iter()
        .map(|row| {
            Ok(ChainRow {
                row: get(row, "id")?,
                base: get(row, "base_id")?,
                keep: get(row, "keep")?,
                text: get(row, "state_values")?,
            })
        })
        .collect()
}

/// The checkpoints of `heads` with their values decoded, in their order.
async fn with_values(conn: &mut PgConnection, found: &[PgRow]) -> Result<Vec<Checkpoint>> {
    let heads: Vec<Head> = found.iter().map(head_from_row).collect::<Result<_>>()?;
    let rows: Vec<i64> = heads.iter().map(|h| h.row).collect();
    let mut values: HashMap<i64, Value> = decode_rows(chains(conn, &rows).await?, &rows)?;
    heads
        .into_iter()
        .map(|head| {
            let mut checkpoint = head.checkpoint;
            checkpoint.values = values.remove(&head.row).ok_or_else(|| Error::Corrupt {
                what: "checkpoints",
                detail: format!("row {} has no decodable chain", head.row),
            })?;
            Ok(checkpoint)
        })
        .collect()
}

impl PostgresStore {
    /// The checkpoints `query` selects ([`select_heads!`]), values decoded, read in one
    /// transaction so a chain cannot change between the two reads.
    async fn load(
        &self,
        query: sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Vec<Checkpoint>> {
        let mut tx = self.pool().begin().await.map_err(Error::backend)?;
        let found = query.fetch_all(&mut *tx).await.map_err(Error::backend)?;
        let checkpoints = with_values(&mut tx, &found).await?;
        tx.commit().await.map_err(Error::backend)?;
        Ok(checkpoints)
    }
}

#[async_trait]
impl CheckpointStore for PostgresStore {
    async fn put_checkpoint(&self, checkpoint: NewCheckpoint) -> Result<Checkpoint> {
        let fence = checkpoint.fence()?;
        let stored = checkpoint.into_stored()?;
        let mut tx = self.pool().begin().await.map_err(Error::backend)?;
        // One writer per thread at a time, so the base read below is still the latest
        // when the row is inserted.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('subflow.checkpoints'), hashtext($1))")
            .bind(&stored.thread_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::backend)?;
        let latest = sqlx::query(
            "SELECT id, checkpoint_id, key_bytes, delta_bytes, depth FROM checkpoints \
             WHERE thread_id = $1 ORDER BY id DESC LIMIT 1",
        )
        .bind(&stored.thread_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(Error::backend)?
        .map(|row| {
            Ok::<_, Error>(Latest {
                row: get(&row, "id")?,
                checkpoint_id: get(&row, "checkpoint_id")?,
                key_bytes: get(&row, "key_bytes")?,
                delta_bytes: get(&row, "delta_bytes")?,
                depth: get(&row, "depth")?,
            })
        })
        .transpose()?;
        let base_hashes = match &latest {
            None => None,
            Some(latest) => Some(match self.deltas.cached(&stored.thread_id, latest) {
                Some(hashes) => hashes,
                None => {
                    let chain = chains(&mut tx, &[latest.row]).await?;
                    let mut decoded = decode_rows(chain, &[latest.row])?;
                    self.deltas
                        .hashes(&decoded.remove(&latest.row).unwrap_or_default())
                }
            }),
        };
        let encoded = self
            .deltas
            .encode(&stored.values, latest.as_ref().zip(base_hashes.as_deref()));
        let inserted: i64 = sqlx::query_scalar(
            "INSERT INTO checkpoints (thread_id, checkpoint_id, parent_checkpoint_id, run_id, \
             state_values, metadata, created_at, base_id, keep, key_bytes, delta_bytes, depth) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id",
        )
        .bind(&stored.thread_id)
        .bind(&stored.checkpoint_id)
        .bind(&stored.parent_checkpoint_id)
        .bind(&stored.run_id)
        .bind(&encoded.text)
        .bind(object_text(&stored.metadata))
        .bind(&stored.created_at)
        .bind(encoded.base)
        .bind(encoded.keep)
        .bind(encoded.key_bytes)
        .bind(encoded.delta_bytes)
        .bind(encoded.depth)
        .fetch_one(&mut *tx)
        .await
        .map_err(Error::backend)?;
        if let Some((run_id, owner)) = &fence {
            crate::streams::check_lease(&mut tx, run_id, Some(owner)).await?;
        }
        tx.commit().await.map_err(Error::backend)?;
        self.deltas.remember(
            &stored.thread_id,
            inserted,
            &stored.checkpoint_id,
            encoded.hashes,
        );
        Ok(stored)
    }

    async fn latest_checkpoint(&self, thread_id: &str) -> Result<Option<Checkpoint>> {
        let query = sqlx::query(concat!(
            select_heads!(),
            " WHERE thread_id = $1 ORDER BY id DESC LIMIT 1"
        ))
        .bind(thread_id);
        Ok(self.load(query).await?.pop())
    }

    async fn get_checkpoint(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<Option<Checkpoint>> {
        let query = sqlx::query(concat!(
            select_heads!(),
            " WHERE thread_id = $1 AND checkpoint_id = $2"
        ))
        .bind(thread_id)
        .bind(checkpoint_id);
        Ok(self.load(query).await?.pop())
    }

    async fn list_checkpoints(
        &self,
        thread_id: &str,
        limit: u32,
        before: Option<&str>,
    ) -> Result<Vec<Checkpoint>> {
        // An id unknown in this thread makes the subquery NULL, so nothing matches.
        let query = sqlx::query(concat!(
            select_heads!(),
            " WHERE thread_id = $1 AND ($2::text IS NULL OR id < (SELECT id FROM checkpoints",
            " WHERE thread_id = $1 AND checkpoint_id = $2))",
            " ORDER BY id DESC LIMIT $3"
        ))
        .bind(thread_id)
        .bind(before)
        .bind(i64::from(limit));
        self.load(query).await
    }

    async fn delete_run_checkpoints(&self, thread_id: &str, run_id: &str) -> Result<u64> {
        let mut tx = self.pool().begin().await.map_err(Error::backend)?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('subflow.checkpoints'), hashtext($1))")
            .bind(thread_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::backend)?;
        // Deltas of other runs whose base goes become keyframes first, with the values
        // they decode to now.
        let orphans: Vec<i64> = sqlx::query_scalar(
            "SELECT c.id FROM checkpoints c JOIN checkpoints b ON c.base_id = b.id \
             WHERE c.thread_id = $1 AND b.run_id = $2 AND c.run_id IS DISTINCT FROM $2",
        )
        .bind(thread_id)
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::backend)?;
        let mut values = decode_rows(chains(&mut tx, &orphans).await?, &orphans)?;
        for row in &orphans {
            let whole = self
                .deltas
                .encode(&values.remove(row).unwrap_or_default(), None);
            sqlx::query(
                "UPDATE checkpoints SET state_values = $1, base_id = NULL, keep = 0, \
                 key_bytes = $2, delta_bytes = 0, depth = 0 WHERE id = $3",
            )
            .bind(&whole.text)
            .bind(whole.key_bytes)
            .bind(row)
            .execute(&mut *tx)
            .await
            .map_err(Error::backend)?;
        }
        let deleted = sqlx::query("DELETE FROM checkpoints WHERE thread_id = $1 AND run_id = $2")
            .bind(thread_id)
            .bind(run_id)
            .execute(&mut *tx)
            .await
            .map_err(Error::backend)?;
        tx.commit().await.map_err(Error::backend)?;
        self.deltas.forget(thread_id);
        Ok(deleted.rows_affected())
    }
}
