//! Run stream logs, run leases and cancel requests (docs/api.md#resume-and-rejoin, docs/api.md#cancel) on SQLite, with the
//! semantics of `MemoryStore`. One process uses the file, so leases run on this
//! process's clock and notices go to listeners of this store value.

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};
use subflow_contracts::{NewEvent, RunStatus};
use subflow_store::streams::{epoch_millis, millis, validate_frame_page};
use subflow_store::{
    AppendOutcome, Error, FrameBatch, NewFrame, OrphanScope, OrphanedRun, RecoveredRun, Result,
    RunStatusUpdate, StreamFrame, StreamLog, StreamNotice, StreamNotices, StreamStore, codec,
    now_rfc3339,
};

use crate::events::EventRows;
use crate::{Db, Route, SqliteStore, query_all};

const INSERT_FRAME: &str =
    "INSERT INTO stream_frames (run_id, id, event, data) VALUES (?, ?, ?, ?)";

/// Creates the run's log row when missing; returns its `(last_id, ended)`.
fn open_log(tx: &Connection, run_id: &str, thread_id: &str) -> Result<(i64, bool)> {
    tx.prepare_cached(
        "INSERT INTO run_streams (run_id, thread_id) VALUES (?, ?) ON CONFLICT (run_id) DO NOTHING",
    )
    .db()?
    .execute([run_id, thread_id])
    .db()?;
    tx.prepare_cached("SELECT last_id, ended_at IS NOT NULL FROM run_streams WHERE run_id = ?")
        .db()?
        .query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?)))
        .db()
}

/// Moves the log's end to `last_id`, ending it when `ends`.
fn advance_log(tx: &Connection, run_id: &str, last_id: i64, ends: bool) -> Result<()> {
    tx.prepare_cached(
        "UPDATE run_streams SET last_id = ?, ended_at = CASE WHEN ? THEN ? ELSE ended_at END \
         WHERE run_id = ?",
    )
    .db()?
    .execute(params![last_id, ends, epoch_millis(), run_id])
    .db()?;
    Ok(())
}

/// The run's thread and status.
fn run_state(tx: &Connection, run_id: &str) -> Result<Option<(String, RunStatus)>> {
    let row: Option<(String, String)> = tx
        .prepare_cached("SELECT thread_id, status FROM runs WHERE run_id = ?")
        .db()?
        .query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()
        .db()?;
    row.map(|(thread, status)| Ok((thread, codec::parse("runs.status", &status)?)))
        .transpose()
}

impl SqliteStore {
    /// Stores a cancel request of an active run (`insert`, bound to `values` and the time
    /// now) and announces it; false when the run does not exist or has ended.
    async fn store_cancel_request(
        &self,
        run_id: &str,
        insert: &'static str,
        mut values: Vec<String>,
    ) -> Result<bool> {
        let run = run_id.to_owned();
        values.push(now_rfc3339());
        let stored = self
            .write(move |conn| {
                let tx: &Connection = conn;
                if !run_state(tx, &run)?.is_some_and(|(_, status)| status.is_active()) {
                    return Ok(false);
                }
                tx.prepare_cached(insert)
                    .db()?
                    .execute(params_from_iter(values))
                    .db()?;
                Ok(true)
            })
            .await?;
        if stored {
            self.inner.notices.publish(StreamNotice::CancelRequested {
                run_id: run_id.to_owned(),
            });
        }
        Ok(stored)
    }
}

/// Appends `batch` in the writer's transaction: how many frames were new, and the last
/// id to announce when the log moved (or ended).
fn insert_frames(tx: &Connection, batch: &FrameBatch) -> Result<(usize, Option<i64>)> {
    let exists = tx
        .prepare_cached("SELECT 1 FROM runs WHERE run_id = ? AND thread_id = ?")
        .db()?
        .query_row([&batch.run_id, &batch.thread_id], |_| Ok(()))
        .optional()
        .db()?
        .is_some();
    if !exists {
        return Err(Error::RunNotFound(batch.run_id.clone()));
    }
    check_lease(tx, &batch.run_id, batch.lease_owner.as_deref())?;
    let (last_id, ended) = open_log(tx, &batch.run_id, &batch.thread_id)?;
    if ended {
        return Ok((0, None));
    }
    let fresh = batch.fresh_after(last_id)?;
    {
        let mut insert = tx.prepare_cached(INSERT_FRAME).db()?;
        for frame in fresh {
            insert
                .execute(params![batch.run_id, frame.id, frame.event, frame.data])
                .db()?;
        }
    }
    let new_last = fresh.last().map_or(last_id, |f| f.id);
    advance_log(tx, &batch.run_id, new_last, batch.ends)?;
    let announce = !fresh.is_empty() || batch.ends;
    Ok((fresh.len(), announce.then_some(new_last)))
}

fn forget_lease(tx: &Connection, run_id: &str) -> Result<()> {
    for sql in [
        "DELETE FROM run_leases WHERE run_id = ?",
        "DELETE FROM run_cancel_requests WHERE run_id = ?",
        "DELETE FROM task_cancel_requests WHERE run_id = ?",
    ] {
        tx.prepare_cached(sql).db()?.execute([run_id]).db()?;
    }
    Ok(())
}

#[async_trait]
impl StreamStore for SqliteStore {
    async fn append_frames(&self, batch: &FrameBatch) -> Result<AppendOutcome> {
        self.append_events_and_frames(&[], batch).await
    }

    /// One writer job: the events and the frames share a transaction.
    async fn append_events_and_frames(
        &self,
        events: &[NewEvent],
        batch: &FrameBatch,
    ) -> Result<AppendOutcome> {
        batch.validate()?;
        let owned = (EventRows::new(events)?, batch.clone());
        let route = Route::in_place_for(events.len() + batch.frames.len());
        let (written, announce) = self
            .write_owned(route, owned, |conn, (rows, frames)| {
                let tx: &Connection = conn;
                rows.insert(tx)?;
                insert_frames(tx, frames)
            })
            .await?;
        if let Some(last_id) = announce {
            self.inner.notices.publish(StreamNotice::Appended {
                run_id: batch.run_id.clone(),
                last_id,
            });
        }
        Ok(AppendOutcome {
            written,
            skipped: batch.frames.len() - written,
        })
    }

    async fn read_frames(
        &self,
        run_id: &str,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<StreamFrame>> {
        validate_frame_page(after_id, limit)?;
        let run_id = run_id.to_owned();
        self.read(move |conn| {
            query_all(
                conn,
                "SELECT id, event, data FROM stream_frames WHERE run_id = ? AND id > ? \
                 ORDER BY id LIMIT ?",
                params![run_id, after_id, limit],
                |row| {
                    Ok(StreamFrame {
                        id: row.get(0).db()?,
                        event: row.get(1).db()?,
                        data: row.get(2).db()?,
                    })
                },
            )
        })
        .await
    }

    async fn stream_log(&self, run_id: &str) -> Result<Option<StreamLog>> {
        let run_id = run_id.to_owned();
        self.read(move |conn| {
            conn.prepare_cached(
                "SELECT thread_id, last_id, ended_at IS NOT NULL, pruned, \
                 (SELECT MIN(id) FROM stream_frames f WHERE f.run_id = s.run_id), \
                 (SELECT MAX(id) FROM stream_frames f WHERE f.run_id = s.run_id) \
                 FROM run_streams s WHERE run_id = ?",
            )
            .db()?
            .query_row([run_id], |row| {
                Ok(StreamLog {
                    thread_id: row.get(0)?,
                    last_id: row.get(1)?,
                    ended: row.get(2)?,
                    pruned: row.get(3)?,
                    earliest_id: row.get(4)?,
                    latest_id: row.get(5)?,
                })
            })
            .optional()
            .db()
        })
        .await
    }

    async fn prune_streams(&self, retention: Duration) -> Result<u64> {
        let cutoff = epoch_millis().saturating_sub(millis(retention));
        self.write(move |conn| {
            let tx: &Connection = conn;
            tx.execute(
                "DELETE FROM stream_frames WHERE run_id IN (SELECT run_id FROM run_streams \
                 WHERE pruned = 0 AND ended_at <= ?)",
                [cutoff],
            )
            .db()?;
            let pruned = tx
                .execute(
                    "UPDATE run_streams SET pruned = 1 WHERE pruned = 0 AND ended_at <= ?",
                    [cutoff],
                )
                .db()?;
            Ok(pruned as u64)
        })
        .await
    }

    async fn acquire_run_lease(&self, run_id: &str, owner: &str, ttl: Duration) -> Result<bool> {
        let (run_id, owner) = (run_id.to_owned(), owner.to_owned());
        self.write_small(move |conn| {
            let tx: &Connection = conn;
            if run_state(tx, &run_id)?.is_none() {
                return Err(Error::RunNotFound(run_id));
            }
            let now = epoch_millis();
            let taken = tx
                .prepare_cached(
                    "INSERT INTO run_leases (run_id, owner, expires_at) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, \
                     expires_at = excluded.expires_at \
                     WHERE run_leases.owner = excluded.owner OR run_leases.expires_at <= ?4",
                )
                .db()?
                .execute(params![run_id, owner, now.saturating_add(millis(ttl)), now])
                .db()?;
            Ok(taken > 0)
        })
        .await
    }

    async fn renew_run_lease(&self, run_id: &str, owner: &str, ttl: Duration) -> Result<bool> {
        let (run_id, owner) = (run_id.to_owned(), owner.to_owned());
        let expires = epoch_millis().saturating_add(millis(ttl));
        let renewed = self
            .write_small(move |conn| {
                conn.prepare_cached(
                    "UPDATE run_leases SET expires_at = ? WHERE run_id = ? AND owner = ?",
                )
                .db()?
                .execute(params![expires, run_id, owner])
                .db()
            })
            .await?;
        Ok(renewed > 0)
    }

    async fn release_run_lease(&self, run_id: &str, owner: &str) -> Result<bool> {
        let (run_id, owner) = (run_id.to_owned(), owner.to_owned());
        self.write_small(move |conn| {
            let tx: &Connection = conn;
            let released = tx
                .prepare_cached("DELETE FROM run_leases WHERE run_id = ? AND owner = ?")
                .db()?
                .execute([&run_id, &owner])
                .db()?;
            if released > 0 {
                forget_lease(tx, &run_id)?;
            }
            Ok(released > 0)
        })
        .await
    }

    async fn find_orphaned_runs(&self, scope: OrphanScope, limit: u32) -> Result<Vec<OrphanedRun>> {
        let now = epoch_millis();
        self.read(move |conn| {
            let decode = |row: &rusqlite::Row<'_>| {
                Ok(OrphanedRun {
                    run_id: row.get(0).db()?,
                    thread_id: row.get(1).db()?,
                })
            };
            match scope {
                OrphanScope::ExpiredLeases => query_all(
                    conn,
                    "SELECT l.run_id, r.thread_id FROM run_leases l \
                     JOIN runs r ON r.run_id = l.run_id WHERE l.expires_at <= ? \
                     ORDER BY l.expires_at LIMIT ?",
                    params![now, limit],
                    decode,
                ),
                OrphanScope::AllActive => query_all(
                    conn,
                    "SELECT run_id, thread_id FROM runs WHERE status IN ('pending', 'running') \
                     OR run_id IN (SELECT run_id FROM run_leases) LIMIT ?",
                    params![limit],
                    decode,
                ),
            }
        })
        .await
    }

    async fn recover_orphan(
        &self,
        run_id: &str,
        scope: OrphanScope,
        update: &RunStatusUpdate,
        closing: &[NewFrame],
    ) -> Result<Option<RecoveredRun>> {
        let owned = run_id.to_owned();
        let update = update.clone();
        let closing = closing.to_vec();
        let recovered = self
            .write(move |conn| {
                let run_id = owned;
                let tx: &Connection = conn;
                let Some((thread_id, status)) = run_state(tx, &run_id)? else {
                    return Ok(None);
                };
                let lease: Option<i64> = tx
                    .prepare_cached("SELECT expires_at FROM run_leases WHERE run_id = ?")
                    .db()?
                    .query_row([&run_id], |row| row.get(0))
                    .optional()
                    .db()?;
                let orphaned = match scope {
                    OrphanScope::ExpiredLeases => {
                        lease.is_some_and(|expires| expires <= epoch_millis())
                    }
                    OrphanScope::AllActive => lease.is_some() || status.is_active(),
                };
                if !orphaned {
                    return Ok(None);
                }
                let was_active = status.is_active();
                if was_active {
                    tx.prepare_cached(
                        "UPDATE runs SET status = ?, stop_reason = ?, error = ?, updated_at = ? \
                         WHERE run_id = ?",
                    )
                    .db()?
                    .execute(params![
                        update.status.as_str(),
                        update.stop_reason.map(|reason| reason.as_str()),
                        update.error,
                        now_rfc3339(),
                        run_id
                    ])
                    .db()?;
                }
                let (mut last_id, ended) = open_log(tx, &run_id, &thread_id)?;
                let mut frames_appended = 0;
                if !ended {
                    {
                        let mut insert = tx.prepare_cached(INSERT_FRAME).db()?;
                        for frame in &closing {
                            last_id += 1;
                            insert
                                .execute(params![run_id, last_id, frame.event, frame.data])
                                .db()?;
                        }
                    }
                    frames_appended = closing.len();
                    advance_log(tx, &run_id, last_id, true)?;
                }
                forget_lease(tx, &run_id)?;
                Ok(Some((
                    RecoveredRun {
                        thread_id,
                        was_active,
                        frames_appended,
                    },
                    last_id,
                )))
            })
            .await?;
        Ok(recovered.map(|(recovered, last_id)| {
            if recovered.frames_appended > 0 {
                self.inner.notices.publish(StreamNotice::Appended {
                    run_id: run_id.to_owned(),
                    last_id,
                });
            }
            recovered
        }))
    }

    async fn request_cancel(&self, run_id: &str) -> Result<bool> {
        self.store_cancel_request(
            run_id,
            "INSERT INTO run_cancel_requests (run_id, requested_at) VALUES (?, ?) \
             ON CONFLICT (run_id) DO NOTHING",
            vec![run_id.to_owned()],
        )
        .await
    }

    async fn take_cancel_requests(&self, run_ids: &[String]) -> Result<Vec<String>> {
        let run_ids = run_ids.to_vec();
        self.write(move |conn| {
            let tx: &Connection = conn;
            let mut taken = Vec::new();
            {
                let mut delete = tx
                    .prepare_cached("DELETE FROM run_cancel_requests WHERE run_id = ?")
                    .db()?;
                for run_id in run_ids {
                    if delete.execute([&run_id]).db()? > 0 {
                        taken.push(run_id);
                    }
                }
            }
            Ok(taken)
        })
        .await
    }

    async fn request_task_cancel(&self, run_id: &str, task_id: &str) -> Result<bool> {
        self.store_cancel_request(
            run_id,
            "INSERT INTO task_cancel_requests (run_id, task_id, requested_at) \
             VALUES (?, ?, ?) ON CONFLICT (run_id, task_id) DO NOTHING",
            vec![run_id.to_owned(), task_id.to_owned()],
        )
        .await
    }

    async fn take_task_cancel_requests(&self, run_ids: &[String]) -> Result<Vec<(String, String)>> {
        let run_ids = run_ids.to_vec();
        self.write(move |conn| {
            let tx: &Connection = conn;
            let mut taken = Vec::new();
            {
                let mut delete = tx
                    .prepare_cached(
                        "DELETE FROM task_cancel_requests WHERE run_id = ? RETURNING task_id",
                    )
                    .db()?;
                for run_id in run_ids {
                    let mut tasks: Vec<String> = delete
                        .query_map([&run_id], |row| row.get(0))
                        .db()?
                        .collect::<std::result::Result<_, _>>()
                        .db()?;
                    tasks.sort();
                    taken.extend(tasks.into_iter().map(|task| (run_id.clone(), task)));
                }
            }
            Ok(taken)
        })
        .await
    }

    async fn listen(&self) -> Result<StreamNotices> {
        Ok(self.inner.notices.subscribe())
    }

    fn is_shared(&self) -> bool {
        false
    }
}

/// [`Error::LeaseLost`] unless `owner` (when given) holds `run_id`'s lease; read in the
/// caller's transaction, so the write it guards lands under the lease or not at all.
pub(crate) fn check_lease(conn: &Connection, run_id: &str, owner: Option<&str>) -> Result<()> {
    let Some(owner) = owner else {
        return Ok(());
    };
    let held: Option<String> = conn
        .prepare_cached("SELECT owner FROM run_leases WHERE run_id = ?")
        .db()?
        .query_row([run_id], |row| row.get(0))
        .optional()
        .db()?;
    if held.as_deref() == Some(owner) {
        Ok(())
    } else {
        Err(Error::LeaseLost(run_id.to_owned()))
    }
}
