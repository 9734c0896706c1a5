-- Manual retries of a batch item: a retry resets `attempt`, this keeps the count that the
-- item ran before.
ALTER TABLE subagent_batch_items ADD COLUMN retries INTEGER NOT NULL DEFAULT 0;
