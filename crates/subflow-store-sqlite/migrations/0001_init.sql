-- Threads, runs and run events. JSON columns hold serialized JSON text so that
-- key order, and therefore every response, is identical across backends.

CREATE TABLE threads (
    thread_id  TEXT PRIMARY KEY NOT NULL,
    owner      TEXT NOT NULL,
    status     TEXT NOT NULL,
    metadata   TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX threads_by_owner ON threads (owner, created_at);

CREATE TABLE runs (
    run_id               TEXT PRIMARY KEY NOT NULL,
    thread_id            TEXT NOT NULL,
    owner                TEXT NOT NULL,
    assistant_id         TEXT NOT NULL,
    status               TEXT NOT NULL,
    model_name           TEXT,
    trace_id             TEXT,
    stop_reason          TEXT,
    error                TEXT,
    metadata             TEXT NOT NULL,
    multitask_strategy   TEXT NOT NULL,
    kwargs               TEXT NOT NULL,
    total_input_tokens   INTEGER NOT NULL DEFAULT 0,
    total_output_tokens  INTEGER NOT NULL DEFAULT 0,
    total_tokens         INTEGER NOT NULL DEFAULT 0,
    llm_call_count       INTEGER NOT NULL DEFAULT 0,
    lead_agent_tokens    INTEGER NOT NULL DEFAULT 0,
    subagent_tokens      INTEGER NOT NULL DEFAULT 0,
    middleware_tokens    INTEGER NOT NULL DEFAULT 0,
    message_count        INTEGER NOT NULL DEFAULT 0,
    token_usage_by_model TEXT NOT NULL DEFAULT '{}',
    created_at           TEXT NOT NULL,
    updated_at           TEXT NOT NULL
);
CREATE INDEX runs_by_thread ON runs (thread_id, created_at);

-- Clustered by (thread_id, seq): seq is thread-global and allocated inside the
-- BEGIN IMMEDIATE writer transaction as MAX(seq) + 1.
CREATE TABLE run_events (
    thread_id  TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    run_id     TEXT NOT NULL,
    event_id   BLOB NOT NULL UNIQUE,
    event_type TEXT NOT NULL,
    category   TEXT NOT NULL,
    content    TEXT NOT NULL,
    metadata   TEXT NOT NULL,
    task_id    TEXT,
    user_id    TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (thread_id, seq)
) WITHOUT ROWID;
CREATE INDEX run_events_by_run ON run_events (thread_id, run_id, seq);
CREATE INDEX run_events_by_task ON run_events (thread_id, run_id, task_id, seq) WHERE task_id IS NOT NULL;
