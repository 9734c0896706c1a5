//! Thread state checkpoints (docs/api.md#objects) on SQLite, with the semantics of `MemoryStore`,
//! each stored as a delta of the thread's previous one (`subflow_store::delta`).

use std::collections::HashMap;

use async_trait::async_trait;
use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, Row, params, params_from_iter};
use serde_json::Value;
use subflow_store::delta::{ChainRow, Latest, decode_rows};
use subflow_store::{Checkpoint, CheckpointStore, NewCheckpoint, Result, codec};

use crate::{Db, Route, SqliteStore, query_all, text};

/// A checkpoint row without its values, which need its chain.
struct Head {
    row: i64,
    checkpoint: Checkpoint,
}

const HEAD_COLUMNS: &str =
    "id, thread_id, checkpoint_id, parent_checkpoint_id, run_id, metadata, created_at";

fn decode_head(row: &Row<'_>) -> Result<Head> {
    Ok(Head {
        row: row.get(0).db()?,
        checkpoint: Checkpoint {
            thread_id: row.get(1).db()?,
            checkpoint_id: row.get(2).db()?,
            parent_checkpoint_id: row.get(3).db()?,
            run_id: row.get(4).db()?,
            values: Value::Null,
            metadata: codec::object("checkpoints.metadata", text(row, 5)?)?,
            created_at: row.get(6).db()?,
        },
    })
}

/// The rows `rows` and every row their chains pass through, ascending by id.
fn chains(conn: &Connection, rows: &[i64]) -> Result<Vec<ChainRow>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let seeds = vec!["?"; rows.len()].join(", ");
    let sql = format!(
        "WITH RECURSIVE chain(id) AS (SELECT id FROM checkpoints WHERE id IN ({seeds}) \
         UNION SELECT c.base_id FROM checkpoints c JOIN chain ON c.id = chain.id \
         WHERE c.base_id IS NOT NULL) \
         SELECT c.id, c.base_id, c.keep, c.state_values FROM checkpoints c \
         JOIN chain ON c.id = chain.id ORDER BY c.id"
    );
    query_all(conn, &sql, params_from_iter(rows.iter()), |row| {
        Ok(ChainRow {
            row: row.get(0).db()?,
            base: row.get(1).db()?,
            keep: row.get(2).db()?,
            text: text(row, 3)?.to_owned(),
        })
    })
}

/// `heads` with their values decoded, in their order.
fn with_values(conn: &Connection, heads: Vec<Head>) -> Result<Vec<Checkpoint>> {
    let rows: Vec<i64> = heads.iter().map(|h| h.row).collect();
    let mut values: HashMap<i64, Value> = decode_rows(chains(conn, &rows)?, &rows)?;
    heads
        .into_iter()
        .map(|head| {
            let mut checkpoint = head.checkpoint;
            checkpoint.values =
                values
                    .remove(&head.row)
                    .ok_or_else(|| subflow_store::Error::Corrupt {
                        what: "checkpoints",
                        detail: format!("row {} has no decodable chain", head.row),
                    })?;
            Ok(checkpoint)
        })
        .collect()
}

/// The checkpoints of `sql` (selecting [`HEAD_COLUMNS`]), values decoded.
fn load(conn: &Connection, sql: &str, params: Vec<SqlValue>) -> Result<Vec<Checkpoint>> {
    let heads = query_all(conn, sql, params_from_iter(params), decode_head)?;
    with_values(conn, heads)
}

#[async_trait]
impl CheckpointStore for SqliteStore {
    async fn put_checkpoint(&self, checkpoint: NewCheckpoint) -> Result<Checkpoint> {
        let fence = checkpoint.fence()?;
        let stored = checkpoint.into_stored()?;
        let metadata =
            serde_json::to_string(&stored.metadata).expect("a JSON map always serialises");
        let deltas = self.inner.deltas.clone();
        let row = stored.clone();
        // Encoding the delta is part of the write: its cost grows with the messages.
        let messages = stored.values["messages"].as_array().map_or(0, Vec::len);
        let hashes = self
            .write_by(Route::in_place_for(messages), move |conn| {
                let tx: &Connection = conn;
                if let Some((run_id, owner)) = &fence {
                    crate::streams::check_lease(tx, run_id, Some(owner))?;
                }
                let latest = {
                    let mut statement = tx
                        .prepare_cached(
                            "SELECT id, checkpoint_id, key_bytes, delta_bytes, depth \
                             FROM checkpoints WHERE thread_id = ? ORDER BY id DESC LIMIT 1",
                        )
                        .db()?;
                    let mut rows = statement.query([&row.thread_id]).db()?;
                    match rows.next().db()? {
                        Some(r) => Some(Latest {
                            row: r.get(0).db()?,
                            checkpoint_id: r.get(1).db()?,
                            key_bytes: r.get(2).db()?,
                            delta_bytes: r.get(3).db()?,
                            depth: r.get(4).db()?,
                        }),
                        None => None,
                    }
                };
                let base_hashes = match &latest {
                    None => None,
                    Some(latest) => Some(match deltas.cached(&row.thread_id, latest) {
                        Some(hashes) => hashes,
                        None => {
                            let mut decoded =
                                decode_rows(chains(tx, &[latest.row])?, &[latest.row])?;
                            let values = decoded.remove(&latest.row).unwrap_or_default();
                            deltas.hashes(&values)
                        }
                    }),
                };
                let encoded =
                    deltas.encode(&row.values, latest.as_ref().zip(base_hashes.as_deref()));
                tx.prepare_cached(
                    "INSERT INTO checkpoints (thread_id, checkpoint_id, parent_checkpoint_id, \
                     run_id, state_values, metadata, created_at, base_id, keep, key_bytes, \
                     delta_bytes, depth) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                )
                .db()?
                .execute(params![
                    row.thread_id,
                    row.checkpoint_id,
                    row.parent_checkpoint_id,
                    row.run_id,
                    encoded.text,
                    metadata,
                    row.created_at,
                    encoded.base,
                    encoded.keep,
                    encoded.key_bytes,
                    encoded.delta_bytes,
                    encoded.depth,
                ])
                .db()?;
                let inserted = tx.last_insert_rowid();
                Ok((inserted, encoded.hashes))
            })
            .await?;
        let (inserted, hashes) = hashes;
        self.inner
            .deltas
            .remember(&stored.thread_id, inserted, &stored.checkpoint_id, hashes);
        Ok(stored)
    }

    async fn latest_checkpoint(&self, thread_id: &str) -> Result<Option<Checkpoint>> {
        let thread_id = thread_id.to_owned();
        self.read(move |conn| {
            let sql = format!(
                "SELECT {HEAD_COLUMNS} FROM checkpoints WHERE thread_id = ? \
                 ORDER BY id DESC LIMIT 1"
            );
            Ok(load(conn, &sql, vec![SqlValue::Text(thread_id)])?.pop())
        })
        .await
    }

    async fn get_checkpoint(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<Option<Checkpoint>> {
        let params = vec![
            SqlValue::Text(thread_id.to_owned()),
            SqlValue::Text(checkpoint_id.to_owned()),
        ];
        self.read(move |conn| {
            let sql = format!(
                "SELECT {HEAD_COLUMNS} FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?"
            );
            Ok(load(conn, &sql, params)?.pop())
        })
        .await
    }

    async fn list_checkpoints(
        &self,
        thread_id: &str,
        limit: u32,
        before: Option<&str>,
    ) -> Result<Vec<Checkpoint>> {
        let mut sql = format!("SELECT {HEAD_COLUMNS} FROM checkpoints WHERE thread_id = ?1");
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
        self.read(move |conn| load(conn, &sql, params)).await
    }

    async fn delete_run_checkpoints(&self, thread_id: &str, run_id: &str) -> Result<u64> {
        let (thread_id, run_id) = (thread_id.to_owned(), run_id.to_owned());
        let deltas = self.inner.deltas.clone();
        let deleted = self
            .write(move |conn| {
                let tx: &Connection = conn;
                // Deltas of other runs whose base goes become keyframes first, with the
                // values they decode to now.
                let orphans = query_all(
                    tx,
                    "SELECT c.id FROM checkpoints c JOIN checkpoints b ON c.base_id = b.id \
                     WHERE c.thread_id = ?1 AND b.run_id = ?2 AND c.run_id IS NOT ?2",
                    params![thread_id, run_id],
                    |row| row.get::<_, i64>(0).db(),
                )?;
                let mut values = decode_rows(chains(tx, &orphans)?, &orphans)?;
                for row in &orphans {
                    let whole = deltas.encode(&values.remove(row).unwrap_or_default(), None);
                    tx.prepare_cached(
                        "UPDATE checkpoints SET state_values = ?, base_id = NULL, keep = 0, \
                         key_bytes = ?, delta_bytes = 0, depth = 0 WHERE id = ?",
                    )
                    .db()?
                    .execute(params![whole.text, whole.key_bytes, row])
                    .db()?;
                }
                let deleted = tx
                    .prepare_cached("DELETE FROM checkpoints WHERE thread_id = ? AND run_id = ?")
                    .db()?
                    .execute([&thread_id, &run_id])
                    .db()?;
                deltas.forget(&thread_id);
                Ok(deleted)
            })
            .await?;
        Ok(deleted as u64)
    }
}
