-- A batch's execution_spec moves to a table of its own. Every item transition rewrites
-- its batch row (the counts), and SQLite rewrites a WITHOUT ROWID row whole: with the
-- spec (kilobytes, on overflow pages) in it, each transition copied and logged the spec
-- again. The spec is written once, at submit, and read by claims and the routes.
CREATE TABLE subagent_batch_specs (
    batch_id       TEXT PRIMARY KEY NOT NULL REFERENCES subagent_batches (id) ON DELETE CASCADE,
    execution_spec TEXT NOT NULL
) WITHOUT ROWID;
INSERT INTO subagent_batch_specs (batch_id, execution_spec)
    SELECT id, execution_spec FROM subagent_batches;
ALTER TABLE subagent_batches DROP COLUMN execution_spec;
