-- Thread state checkpoints (docs/api.md#objects ThreadState). `state_values` and `metadata`
-- hold serialized JSON text, as every JSON column does, so key order is kept and
-- results are identical across backends.
--
-- `id` aliases the rowid and orders a thread's checkpoints (newest = highest id). It
-- is declared rather than left implicit because VACUUM may renumber an implicit
-- rowid; (thread_id, checkpoint_id) is the natural key.
CREATE TABLE checkpoints (
    id                   INTEGER PRIMARY KEY,
    thread_id            TEXT NOT NULL,
    checkpoint_id        TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    run_id               TEXT,
    state_values         TEXT NOT NULL,
    metadata             TEXT NOT NULL,
    created_at           TEXT NOT NULL,
    UNIQUE (thread_id, checkpoint_id)
);
CREATE INDEX checkpoints_by_thread ON checkpoints (thread_id, id);
