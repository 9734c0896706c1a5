-- Thread state checkpoints (docs/api.md#objects ThreadState). `state_values` and `metadata` are
-- serde_json TEXT, not JSONB, for the same reason as run_events.content: key order
-- and therefore results must be identical across backends. `id` orders a thread's
-- checkpoints: the newest has the highest id.

CREATE TABLE checkpoints (
    id BIGSERIAL NOT NULL UNIQUE,
    thread_id TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    run_id TEXT,
    state_values TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_id)
);

CREATE INDEX checkpoints_thread_newest ON checkpoints (thread_id, id DESC);
