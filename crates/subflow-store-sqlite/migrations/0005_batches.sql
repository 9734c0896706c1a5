-- Durable batches (docs/batches.md#data-model): batches, their items and the workers' heartbeats.
-- A batch row carries its items' counts by status, updated in the transaction of every
-- item transition. Items go with their batch (ON DELETE CASCADE); batches go with their
-- thread (deleted by the thread delete). Lease and heartbeat times are Unix epoch
-- milliseconds of this process's clock: one process uses the file.

CREATE TABLE subagent_batches (
    id                TEXT PRIMARY KEY NOT NULL,
    thread_id         TEXT NOT NULL,
    user_id           TEXT NOT NULL,
    run_id            TEXT,
    tool_call_id      TEXT,
    submission_key    TEXT NOT NULL,
    title             TEXT NOT NULL,
    subagent_type     TEXT NOT NULL,
    status            TEXT NOT NULL,
    total_items       INTEGER NOT NULL,
    max_live_items    INTEGER NOT NULL,
    max_running_items INTEGER NOT NULL,
    max_attempts      INTEGER NOT NULL,
    execution_spec    TEXT NOT NULL,
    pending_count     INTEGER NOT NULL DEFAULT 0,
    queued_count      INTEGER NOT NULL DEFAULT 0,
    leased_count      INTEGER NOT NULL DEFAULT 0,
    running_count     INTEGER NOT NULL DEFAULT 0,
    succeeded_count   INTEGER NOT NULL DEFAULT 0,
    failed_count      INTEGER NOT NULL DEFAULT 0,
    cancelled_count   INTEGER NOT NULL DEFAULT 0,
    created_at        TEXT NOT NULL,
    updated_at        TEXT NOT NULL,
    completed_at      TEXT,
    UNIQUE (user_id, submission_key)
) WITHOUT ROWID;
CREATE INDEX subagent_batches_newest ON subagent_batches (user_id, thread_id, created_at DESC, id DESC);
CREATE INDEX subagent_batches_thread ON subagent_batches (thread_id);
CREATE INDEX subagent_batches_active ON subagent_batches (created_at, id)
    WHERE status IN ('queued', 'running', 'paused');

CREATE TABLE subagent_batch_items (
    id                  TEXT PRIMARY KEY NOT NULL,
    batch_id            TEXT NOT NULL REFERENCES subagent_batches (id) ON DELETE CASCADE,
    item_key            TEXT NOT NULL,
    position            INTEGER NOT NULL,
    status              TEXT NOT NULL,
    attempt             INTEGER NOT NULL DEFAULT 0,
    prompt              TEXT NOT NULL,
    acceptance_criteria TEXT NOT NULL,
    acceptance_verdict  TEXT,
    model_name          TEXT,
    result              TEXT,
    result_preview      TEXT,
    result_truncated    INTEGER NOT NULL DEFAULT 0,
    error               TEXT,
    stop_reason         TEXT,
    token_usage         TEXT,
    lease_owner         TEXT,
    lease_expires_at    INTEGER,
    cancel_requested_at TEXT,
    started_at          TEXT,
    completed_at        TEXT,
    created_at          TEXT NOT NULL,
    updated_at          TEXT NOT NULL,
    UNIQUE (batch_id, item_key),
    UNIQUE (batch_id, position)
);
-- The claim pass reads a batch's pending, queued and expired items in position order.
CREATE INDEX subagent_batch_items_by_status ON subagent_batch_items (batch_id, status, position);

CREATE TABLE subagent_batch_workers (
    worker_id    TEXT PRIMARY KEY NOT NULL,
    hostname     TEXT NOT NULL,
    started_at   TEXT NOT NULL,
    heartbeat_at INTEGER NOT NULL
) WITHOUT ROWID;
