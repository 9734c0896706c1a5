-- Threads, runs and run events (docs/configuration.md#sources, docs/api.md#objects, docs/events.md#envelope, docs/usage-and-cost.md#run-buckets).
--
-- JSON is stored as TEXT written by serde_json, not JSONB: JSONB reorders object
-- keys, and both backends must return byte-identical `/events` results.
-- Timestamps are RFC 3339 TEXT for the same reason. The BIGSERIAL `id` columns
-- break ties between records created within the same microsecond.

CREATE TABLE threads (
    id BIGSERIAL NOT NULL UNIQUE,
    thread_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    status TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE INDEX threads_owner_newest ON threads (owner, created_at DESC, id DESC);

CREATE TABLE runs (
    id BIGSERIAL NOT NULL UNIQUE,
    run_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    assistant_id TEXT NOT NULL,
    status TEXT NOT NULL,
    model_name TEXT,
    trace_id TEXT,
    stop_reason TEXT,
    error TEXT,
    metadata TEXT NOT NULL,
    multitask_strategy TEXT NOT NULL,
    kwargs TEXT NOT NULL,
    total_input_tokens BIGINT NOT NULL DEFAULT 0,
    total_output_tokens BIGINT NOT NULL DEFAULT 0,
    total_tokens BIGINT NOT NULL DEFAULT 0,
    llm_call_count BIGINT NOT NULL DEFAULT 0,
    lead_agent_tokens BIGINT NOT NULL DEFAULT 0,
    subagent_tokens BIGINT NOT NULL DEFAULT 0,
    middleware_tokens BIGINT NOT NULL DEFAULT 0,
    message_count BIGINT NOT NULL DEFAULT 0,
    token_usage_by_model TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE INDEX runs_thread_newest ON runs (thread_id, created_at DESC, id DESC);

-- `seq` is allocated under a per-thread transaction advisory lock; the unique
-- constraint is the backstop that turns any allocation bug into an error rather
-- than a duplicate.
CREATE TABLE run_events (
    id BIGSERIAL PRIMARY KEY,
    event_id UUID NOT NULL UNIQUE,
    thread_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    event_type TEXT NOT NULL,
    category TEXT NOT NULL,
    content TEXT NOT NULL,
    metadata TEXT NOT NULL,
    -- `metadata.task_id` when it is a string, so the task filter runs before LIMIT.
    task_id TEXT,
    user_id TEXT,
    created_at TEXT NOT NULL,
    UNIQUE (thread_id, seq)
);

CREATE INDEX run_events_run_seq ON run_events (thread_id, run_id, seq);
CREATE INDEX run_events_task_seq ON run_events (thread_id, run_id, task_id, seq)
    WHERE task_id IS NOT NULL;
