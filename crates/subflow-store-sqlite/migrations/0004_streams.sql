-- Run stream logs, run leases and cancel requests (docs/api.md#resume-and-rejoin, docs/api.md#cancel). Every row belongs
-- to a run and goes with it: deleting a run (rollback) or its thread cascades here.
-- Times are Unix epoch milliseconds of this process's clock: one process uses the file.

-- One row per run that has logged a frame. `last_id` is the highest frame id ever
-- appended and survives pruning, so a cursor into pruned frames is told apart from
-- one past the end. A log with `ended_at` set takes no more frames.
CREATE TABLE run_streams (
    run_id    TEXT PRIMARY KEY NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    thread_id TEXT NOT NULL,
    last_id   INTEGER NOT NULL DEFAULT 0,
    ended_at  INTEGER,
    pruned    INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX run_streams_prunable ON run_streams (ended_at) WHERE pruned = 0;

-- The frames, clustered in the order every replay reads them.
CREATE TABLE stream_frames (
    run_id TEXT NOT NULL REFERENCES run_streams (run_id) ON DELETE CASCADE,
    id     INTEGER NOT NULL,
    event  TEXT NOT NULL,
    data   TEXT NOT NULL,
    PRIMARY KEY (run_id, id)
) WITHOUT ROWID;

CREATE TABLE run_leases (
    run_id     TEXT PRIMARY KEY NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    owner      TEXT NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX run_leases_by_expiry ON run_leases (expires_at);

CREATE TABLE run_cancel_requests (
    run_id       TEXT PRIMARY KEY NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    requested_at TEXT NOT NULL
) WITHOUT ROWID;
