-- Durable batches (docs/batches.md#data-model): batches, their items and the workers' heartbeats.
-- A batch row carries its items' counts by status, updated in the transaction of every
-- item transition; every writer locks the batch row before item rows. Items go with
-- their batch (ON DELETE CASCADE); batches go with their thread (deleted by the thread
-- delete). Lease and heartbeat times are epoch milliseconds of the database clock
-- (`now()`), so workers on machines with different clocks agree on expiry; they are
-- integers so that every backend applies the same state machine to the same values.

CREATE TABLE subagent_batches (
    id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    run_id TEXT,
    tool_call_id TEXT,
    submission_key TEXT NOT NULL,
    title TEXT NOT NULL,
    subagent_type TEXT NOT NULL,
    status TEXT NOT NULL,
    total_items BIGINT NOT NULL,
    max_live_items BIGINT NOT NULL,
    max_running_items BIGINT NOT NULL,
    max_attempts BIGINT NOT NULL,
    execution_spec TEXT NOT NULL,
    pending_count BIGINT NOT NULL DEFAULT 0,
    queued_count BIGINT NOT NULL DEFAULT 0,
    leased_count BIGINT NOT NULL DEFAULT 0,
    running_count BIGINT NOT NULL DEFAULT 0,
    succeeded_count BIGINT NOT NULL DEFAULT 0,
    failed_count BIGINT NOT NULL DEFAULT 0,
    cancelled_count BIGINT NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    completed_at TEXT,
    UNIQUE (user_id, submission_key)
);

CREATE INDEX subagent_batches_newest
    ON subagent_batches (user_id, thread_id, created_at DESC, id DESC);
CREATE INDEX subagent_batches_thread ON subagent_batches (thread_id);
CREATE INDEX subagent_batches_active ON subagent_batches (created_at, id)
    WHERE status IN ('queued', 'running', 'paused');

CREATE TABLE subagent_batch_items (
    id TEXT PRIMARY KEY,
    batch_id TEXT NOT NULL REFERENCES subagent_batches (id) ON DELETE CASCADE,
    item_key TEXT NOT NULL,
    position BIGINT NOT NULL,
    status TEXT NOT NULL,
    attempt BIGINT NOT NULL DEFAULT 0,
    prompt TEXT NOT NULL,
    acceptance_criteria TEXT NOT NULL,
    acceptance_verdict TEXT,
    model_name TEXT,
    result TEXT,
    result_preview TEXT,
    result_truncated BOOLEAN NOT NULL DEFAULT FALSE,
    error TEXT,
    stop_reason TEXT,
    token_usage TEXT,
    lease_owner TEXT,
    lease_expires_at BIGINT,
    cancel_requested_at TEXT,
    started_at TEXT,
    completed_at TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (batch_id, item_key),
    UNIQUE (batch_id, position)
);

-- The claim pass reads a batch's pending, queued and expired items in position order.
CREATE INDEX subagent_batch_items_by_status
    ON subagent_batch_items (batch_id, status, position);

CREATE TABLE subagent_batch_workers (
    worker_id TEXT PRIMARY KEY,
    hostname TEXT NOT NULL,
    started_at TEXT NOT NULL,
    heartbeat_at BIGINT NOT NULL
);
