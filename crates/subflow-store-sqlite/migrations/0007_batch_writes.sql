-- Cheaper item transitions. Every transition rewrites its batch row (the counts) and
-- moves the item within the status index; both now write less.
--
-- A batch's execution_spec moves to a table of its own: SQLite rewrites a WITHOUT ROWID
-- row whole, so with the spec (kilobytes, on overflow pages) in the batch row, each
-- transition copied and logged the spec again. It is written once, at submit.
CREATE TABLE subagent_batch_specs (
    batch_id       TEXT PRIMARY KEY NOT NULL REFERENCES subagent_batches (id) ON DELETE CASCADE,
    execution_spec TEXT NOT NULL
) WITHOUT ROWID;
INSERT INTO subagent_batch_specs (batch_id, execution_spec)
    SELECT id, execution_spec FROM subagent_batches;
ALTER TABLE subagent_batches DROP COLUMN execution_spec;

-- The status index holds the items a claim pass looks for (pending, queued, leased,
-- running) and no longer the finished ones, which no query finds through it: finishing
-- an item only removes its entry. Queries name one status (`status = 'queued'`), which
-- SQLite proves is covered by this OR (it does not prove it for an IN list).
DROP INDEX subagent_batch_items_by_status;
CREATE INDEX subagent_batch_items_unfinished ON subagent_batch_items (batch_id, status, position)
    WHERE status = 'pending' OR status = 'queued' OR status = 'leased' OR status = 'running';
