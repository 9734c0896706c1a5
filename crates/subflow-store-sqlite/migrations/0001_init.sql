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

-- The last seq handed out per thread. seq is allocated from here inside the
-- BEGIN IMMEDIATE writer transaction, so run_events needs no (thread_id, seq) index
-- and a seq is never reused, even after a run is deleted.
CREATE TABLE thread_seq (
    thread_id TEXT PRIMARY KEY NOT NULL,
    last_seq  INTEGER NOT NULL
) WITHOUT ROWID;

-- Clustered by (thread_id, run_id, seq), the order every /events page reads. Three
-- b-trees per step row: the table, the event_id key and the task index; the message
-- index only holds message rows.
CREATE TABLE run_events (
    thread_id  TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    event_id   BLOB NOT NULL,
    event_type TEXT NOT NULL,
    category   TEXT NOT NULL,
    content    TEXT NOT NULL,
    metadata   TEXT NOT NULL,
    task_id    TEXT,
    user_id    TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (thread_id, run_id, seq)
) WITHOUT ROWID;
CREATE UNIQUE INDEX run_events_by_event_id ON run_events (event_id);
CREATE INDEX run_events_by_task ON run_events (thread_id, run_id, task_id, seq) WHERE task_id IS NOT NULL;
CREATE INDEX run_events_messages ON run_events (thread_id, seq) WHERE category = 'message';
