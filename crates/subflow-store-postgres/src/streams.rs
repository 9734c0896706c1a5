//! Run stream logs, run leases and cancel requests (docs/api.md#resume-and-rejoin, docs/api.md#cancel) with the semantics
//! of `MemoryStore`, shared by every process on the database. Appends and cancel
//! requests are announced with `NOTIFY` inside their transaction, so a process woken by
//! one always finds what it announces; [`StreamStore::listen`] is a `LISTEN` connection.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgListener, PgNotification};
use sqlx::{Postgres, Transaction};
use subflow_contracts::RunStatus;
use subflow_store::streams::{CANCEL_CHANNEL, STREAM_CHANNEL, millis, validate_frame_page};
use subflow_store::{
    AppendOutcome, Error, FrameBatch, NewFrame, OrphanScope, OrphanedRun, RecoveredRun, Result,
    RunStatusUpdate, StreamFrame, StreamLog, StreamNotice, StreamNotices, StreamStore, codec,
    now_rfc3339,
};
use tokio::sync::mpsc;

use crate::PostgresStore;
use crate::get;

/// Notices a listener may hold before its `LISTEN` connection waits for the reader.
const NOTICE_BUFFER: usize = 1024;

/// How long a failed `LISTEN` connection waits before it tries again.
const LISTEN_RETRY: Duration = Duration::from_secs(1);

fn db(error: sqlx::Error) -> Error {
    Error::backend(error)
}

async fn begin(store: &PostgresStore) -> Result<Transaction<'static, Postgres>> {
    store.pool().begin().await.map_err(db)
}

/// Announces a stored cancel request to the run's owner and commits it: the notice is
/// delivered at commit, so whoever hears it finds the request.
async fn announce_cancel(mut tx: Transaction<'static, Postgres>, run_id: &str) -> Result<bool> {
    sqlx::query("SELECT pg_notify($1, json_build_object('run_id', $2::text)::text)")
        .bind(CANCEL_CHANNEL)
        .bind(run_id)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(true)
}

/// Deletes the run's lease and cancel requests.
async fn forget_lease(tx: &mut Transaction<'static, Postgres>, run_id: &str) -> Result<()> {
    for sql in [
        "DELETE FROM run_leases WHERE run_id = $1",
        "DELETE FROM run_cancel_requests WHERE run_id = $1",
        "DELETE FROM task_cancel_requests WHERE run_id = $1",
    ] {
        sqlx::query(sql)
            .bind(run_id)
            .execute(&mut **tx)
            .await
            .map_err(db)?;
    }
    Ok(())
}

/// A notification as a notice; anything unreadable asks listeners to re-read.
fn notice(notification: &PgNotification) -> StreamNotice {
    let parsed = serde_json::from_str::<StreamNotice>(notification.payload());
    match (notification.channel(), parsed) {
        (STREAM_CHANNEL, Ok(notice @ StreamNotice::Appended { .. })) => notice,
        (CANCEL_CHANNEL, Ok(StreamNotice::CancelRequested { run_id }))
        | (CANCEL_CHANNEL, Ok(StreamNotice::Appended { run_id, .. })) => {
            StreamNotice::CancelRequested { run_id }
        }
        _ => StreamNotice::Resync,
    }
}

/// Forwards notifications until the listener's reader goes away. A lost connection is
/// re-established (sqlx listens on the channels again) and reported as a resync, since
/// notifications sent meanwhile are gone.
async fn forward(mut listener: PgListener, sender: mpsc::Sender<StreamNotice>) {
    loop {
        let received = tokio::select! {
            () = sender.closed() => return,
            received = listener.try_recv() => received,
        };
        let notice = match received {
            Ok(Some(notification)) => notice(&notification),
            Ok(None) => StreamNotice::Resync,
            Err(error) => {
                tracing::warn!(%error, "the stream LISTEN connection failed; retrying");
                tokio::time::sleep(LISTEN_RETRY).await;
                StreamNotice::Resync
            }
        };
        if sender.send(notice).await.is_err() {
            return;
        }
    }
}

#[async_trait]
impl StreamStore for PostgresStore {
    async fn append_frames(&self, batch: &FrameBatch) -> Result<AppendOutcome> {
        batch.validate()?;
        let ids: Vec<i64> = batch.frames.iter().map(|f| f.id).collect();
        let events: Vec<&str> = batch.frames.iter().map(|f| f.event.as_str()).collect();
        let data: Vec<&str> = batch.frames.iter().map(|f| f.data.as_str()).collect();
        // `subflow_append_frames` (migration 0011) checks the lease, locks the log, skips
        // stored frames, checks continuity, inserts and NOTIFYs in one round trip.
        let written: Option<i64> =
            sqlx::query_scalar("SELECT subflow_append_frames($1, $2, $3, $4, $5, $6, $7)")
                .bind(&batch.run_id)
                .bind(&batch.thread_id)
                .bind(ids)
                .bind(events)
                .bind(data)
                .bind(batch.ends)
                .bind(&batch.lease_owner)
                .fetch_one(self.pool())
                .await
                .map_err(db)?;
        let written = match written {
            None => return Err(Error::RunNotFound(batch.run_id.clone())),
            Some(-2) => return Err(Error::LeaseLost(batch.run_id.clone())),
            Some(-1) => {
                return Err(Error::InvalidFrame(format!(
                    "frame {} does not continue the stored log of run {}",
                    batch.frames.first().map_or(0, |f| f.id),
                    batch.run_id
                )));
            }
            Some(written) => usize::try_from(written).unwrap_or(0),
        };
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
        let rows = sqlx::query(
            "SELECT id, event, data FROM stream_frames WHERE run_id = $1 AND id > $2 \
             ORDER BY id LIMIT $3",
        )
        .bind(run_id)
        .bind(after_id)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        rows.iter()
            .map(|row| {
                Ok(StreamFrame {
                    id: get(row, "id")?,
                    event: get(row, "event")?,
                    data: get(row, "data")?,
                })
            })
            .collect()
    }

    async fn stream_log(&self, run_id: &str) -> Result<Option<StreamLog>> {
        let row = sqlx::query(
            "SELECT thread_id, last_id, ended_at IS NOT NULL AS ended, pruned, \
             (SELECT MIN(id) FROM stream_frames f WHERE f.run_id = s.run_id) AS earliest, \
             (SELECT MAX(id) FROM stream_frames f WHERE f.run_id = s.run_id) AS latest \
             FROM run_streams s WHERE run_id = $1",
        )
        .bind(run_id)
        .fetch_optional(self.pool())
        .await
        .map_err(db)?;
        row.map(|row| {
            Ok(StreamLog {
                thread_id: get(&row, "thread_id")?,
                last_id: get(&row, "last_id")?,
                earliest_id: get(&row, "earliest")?,
                latest_id: get(&row, "latest")?,
                ended: get(&row, "ended")?,
                pruned: get(&row, "pruned")?,
            })
        })
        .transpose()
    }

    async fn prune_streams(&self, retention: Duration) -> Result<u64> {
        let pruned: i64 = sqlx::query_scalar(
            "WITH pruned AS ( \
                 UPDATE run_streams SET pruned = TRUE \
                 WHERE NOT pruned AND ended_at <= now() - $1 * interval '1 millisecond' \
                 RETURNING run_id), \
             dropped AS ( \
                 DELETE FROM stream_frames f USING pruned p WHERE f.run_id = p.run_id) \
             SELECT COUNT(*) FROM pruned",
        )
        .bind(millis(retention))
        .fetch_one(self.pool())
        .await
        .map_err(db)?;
        Ok(u64::try_from(pruned).unwrap_or(0))
    }

    async fn acquire_run_lease(&self, run_id: &str, owner: &str, ttl: Duration) -> Result<bool> {
        let taken = sqlx::query(
            "INSERT INTO run_leases (run_id, owner, expires_at) \
             SELECT run_id, $2, now() + $3 * interval '1 millisecond' FROM runs WHERE run_id = $1 \
             ON CONFLICT (run_id) DO UPDATE SET owner = EXCLUDED.owner, \
             expires_at = EXCLUDED.expires_at \
             WHERE run_leases.owner = EXCLUDED.owner OR run_leases.expires_at <= now()",
        )
        .bind(run_id)
        .bind(owner)
        .bind(millis(ttl))
        .execute(self.pool())
        .await
        .map_err(db)?
        .rows_affected();
        if taken > 0 {
            return Ok(true);
        }
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = $1)")
                .bind(run_id)
                .fetch_one(self.pool())
                .await
                .map_err(db)?;
        if exists {
            Ok(false)
        } else {
            Err(Error::RunNotFound(run_id.to_owned()))
        }
    }

    async fn renew_run_lease(&self, run_id: &str, owner: &str, ttl: Duration) -> Result<bool> {
        let renewed = sqlx::query(
            "UPDATE run_leases SET expires_at = now() + $3 * interval '1 millisecond' \
             WHERE run_id = $1 AND owner = $2",
        )
        .bind(run_id)
        .bind(owner)
        .bind(millis(ttl))
        .execute(self.pool())
        .await
        .map_err(db)?
        .rows_affected();
        Ok(renewed > 0)
    }

    async fn release_run_lease(&self, run_id: &str, owner: &str) -> Result<bool> {
        let released: i64 = sqlx::query_scalar(
            "WITH released AS ( \
                 DELETE FROM run_leases WHERE run_id = $1 AND owner = $2 RETURNING run_id), \
             forgotten AS ( \
                 DELETE FROM run_cancel_requests c USING released r WHERE c.run_id = r.run_id), \
             forgotten_tasks AS ( \
                 DELETE FROM task_cancel_requests c USING released r WHERE c.run_id = r.run_id) \
             SELECT COUNT(*) FROM released",
        )
        .bind(run_id)
        .bind(owner)
        .fetch_one(self.pool())
        .await
        .map_err(db)?;
        Ok(released > 0)
    }

    async fn find_orphaned_runs(&self, scope: OrphanScope, limit: u32) -> Result<Vec<OrphanedRun>> {
        let sql = match scope {
            OrphanScope::ExpiredLeases => {
                "SELECT l.run_id, r.thread_id FROM run_leases l \
                 JOIN runs r ON r.run_id = l.run_id WHERE l.expires_at <= now() \
                 ORDER BY l.expires_at LIMIT $1"
            }
            OrphanScope::AllActive => {
                "SELECT run_id, thread_id FROM runs WHERE status IN ('pending', 'running') \
                 OR run_id IN (SELECT run_id FROM run_leases) LIMIT $1"
            }
        };
        let rows = sqlx::query(sql)
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await
            .map_err(db)?;
        rows.iter()
            .map(|row| {
                Ok(OrphanedRun {
                    run_id: get(row, "run_id")?,
                    thread_id: get(row, "thread_id")?,
                })
            })
            .collect()
    }

    async fn recover_orphan(
        &self,
        run_id: &str,
        scope: OrphanScope,
        update: &RunStatusUpdate,
        closing: &[NewFrame],
    ) -> Result<Option<RecoveredRun>> {
        let mut tx = begin(self).await?;
        // FOR NO KEY UPDATE, not FOR UPDATE: a first append's foreign-key check on the
        // run (FOR KEY SHARE) must not wait for this transaction while it waits for the log.
        let run =
            sqlx::query("SELECT thread_id, status FROM runs WHERE run_id = $1 FOR NO KEY UPDATE")
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
        let Some(run) = run else {
            return Ok(None);
        };
        let thread_id: String = get(&run, "thread_id")?;
        let status: RunStatus = codec::parse("runs.status", &get::<String>(&run, "status")?)?;
        let expired: Option<bool> = sqlx::query_scalar(
            "SELECT expires_at <= now() FROM run_leases WHERE run_id = $1 FOR UPDATE",
        )
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        let orphaned = match scope {
            OrphanScope::ExpiredLeases => expired == Some(true),
            OrphanScope::AllActive => expired.is_some() || status.is_active(),
        };
        if !orphaned {
            return Ok(None);
        }
        let was_active = status.is_active();
        if was_active {
            sqlx::query(
                "UPDATE runs SET status = $2, stop_reason = $3, error = $4, updated_at = $5 \
                 WHERE run_id = $1",
            )
            .bind(run_id)
            .bind(update.status.as_str())
            .bind(update.stop_reason.map(|reason| reason.as_str()))
            .bind(&update.error)
            .bind(now_rfc3339())
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        }
        sqlx::query(
            "INSERT INTO run_streams (run_id, thread_id) VALUES ($1, $2) \
             ON CONFLICT (run_id) DO NOTHING",
        )
        .bind(run_id)
        .bind(&thread_id)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        let log = sqlx::query(
            "SELECT last_id, ended_at IS NOT NULL AS ended FROM run_streams \
             WHERE run_id = $1 FOR UPDATE",
        )
        .bind(run_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        let last_id: i64 = get(&log, "last_id")?;
        let mut frames_appended = 0;
        if !get::<bool>(&log, "ended")? {
            let events: Vec<&str> = closing.iter().map(|f| f.event.as_str()).collect();
            let data: Vec<&str> = closing.iter().map(|f| f.data.as_str()).collect();
            sqlx::query(
                "INSERT INTO stream_frames (run_id, id, event, data) \
                 SELECT $1, $2 + f.ord, f.event, f.data \
                 FROM UNNEST($3::text[], $4::text[]) WITH ORDINALITY AS f(event, data, ord)",
            )
            .bind(run_id)
            .bind(last_id)
            .bind(events)
            .bind(data)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            frames_appended = closing.len();
            let new_last = last_id + closing.len() as i64;
            sqlx::query("UPDATE run_streams SET last_id = $2, ended_at = now() WHERE run_id = $1")
                .bind(run_id)
                .bind(new_last)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            sqlx::query(
                "SELECT pg_notify($1, json_build_object('run_id', $2::text, 'last_id', $3::bigint)::text)",
            )
            .bind(STREAM_CHANNEL)
            .bind(run_id)
            .bind(new_last)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        }
        forget_lease(&mut tx, run_id).await?;
        tx.commit().await.map_err(db)?;
        Ok(Some(RecoveredRun {
            thread_id,
            was_active,
            frames_appended,
        }))
    }

    async fn request_cancel(&self, run_id: &str) -> Result<bool> {
        let mut tx = begin(self).await?;
        let stored = sqlx::query(
            "INSERT INTO run_cancel_requests (run_id, requested_at) \
             SELECT run_id, $2 FROM runs WHERE run_id = $1 AND status IN ('pending', 'running') \
             ON CONFLICT (run_id) DO UPDATE SET requested_at = run_cancel_requests.requested_at",
        )
        .bind(run_id)
        .bind(now_rfc3339())
        .execute(&mut *tx)
        .await
        .map_err(db)?
        .rows_affected();
        if stored == 0 {
            return Ok(false);
        }
        announce_cancel(tx, run_id).await
    }

    async fn request_task_cancel(&self, run_id: &str, task_id: &str) -> Result<bool> {
        let mut tx = begin(self).await?;
        let stored = sqlx::query(
            "INSERT INTO task_cancel_requests (run_id, task_id, requested_at) \
             SELECT run_id, $2, $3 FROM runs WHERE run_id = $1 AND status IN ('pending', 'running') \
             ON CONFLICT (run_id, task_id) DO UPDATE \
             SET requested_at = task_cancel_requests.requested_at",
        )
        .bind(run_id)
        .bind(task_id)
        .bind(now_rfc3339())
        .execute(&mut *tx)
        .await
        .map_err(db)?
        .rows_affected();
        if stored == 0 {
            return Ok(false);
        }
        announce_cancel(tx, run_id).await
    }

    async fn take_task_cancel_requests(&self, run_ids: &[String]) -> Result<Vec<(String, String)>> {
        let rows = sqlx::query(
            "DELETE FROM task_cancel_requests WHERE run_id = ANY($1) RETURNING run_id, task_id",
        )
        .bind(run_ids)
        .fetch_all(self.pool())
        .await
        .map_err(db)?;
        let mut taken = rows
            .iter()
            .map(|row| Ok((get(row, "run_id")?, get(row, "task_id")?)))
            .collect::<Result<Vec<(String, String)>>>()?;
        taken.sort();
        Ok(taken)
    }

    async fn take_cancel_requests(&self, run_ids: &[String]) -> Result<Vec<String>> {
        let rows =
            sqlx::query("DELETE FROM run_cancel_requests WHERE run_id = ANY($1) RETURNING run_id")
                .bind(run_ids)
                .fetch_all(self.pool())
                .await
                .map_err(db)?;
        rows.iter().map(|row| get(row, "run_id")).collect()
    }

    async fn listen(&self) -> Result<StreamNotices> {
        let mut listener = PgListener::connect_with(self.pool()).await.map_err(db)?;
        listener
            .listen_all([STREAM_CHANNEL, CANCEL_CHANNEL])
            .await
            .map_err(db)?;
        let (sender, receiver) = mpsc::channel(NOTICE_BUFFER);
        tokio::spawn(forward(listener, sender));
        Ok(StreamNotices::remote(receiver))
    }

    fn is_shared(&self) -> bool {
        true
    }
}

/// [`Error::LeaseLost`] unless `owner` (when given) holds `run_id`'s lease, read in the
/// caller's transaction without a lock: a transaction of several statements must not
/// hold the lease row, since a process frozen before its commit would stall the
/// recovery that takes it. A recovery committing between this read and the caller's
/// commit is the one interleaving left, a single round trip wide.
pub(crate) async fn check_lease(
    tx: &mut sqlx::PgConnection,
    run_id: &str,
    owner: Option<&str>,
) -> Result<()> {
    let Some(owner) = owner else {
        return Ok(());
    };
    let held: Option<String> = sqlx::query_scalar("SELECT owner FROM run_leases WHERE run_id = $1")
        .bind(run_id)
        .fetch_optional(tx)
        .await
        .map_err(Error::backend)?;
    if held.as_deref() == Some(owner) {
        Ok(())
    } else {
        Err(Error::LeaseLost(run_id.to_owned()))
    }
}
