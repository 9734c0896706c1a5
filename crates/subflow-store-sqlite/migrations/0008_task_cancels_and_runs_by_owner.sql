-- Requests to cancel one task of a run, for the process executing the run; forgotten
-- with the run's lease.
CREATE TABLE task_cancel_requests (
    run_id       TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    task_id      TEXT NOT NULL,
    requested_at TEXT NOT NULL,
    PRIMARY KEY (run_id, task_id)
) WITHOUT ROWID;

-- A user's runs across threads, newest first.
CREATE INDEX runs_by_owner ON runs (owner, created_at);
