-- Checkpoints stored as deltas of the thread's previous checkpoint (subflow_store::delta):
-- `base_id` is the row a delta continues (NULL for a keyframe, which holds the whole
-- values), `keep` how many of its messages the delta keeps, and `state_values` the
-- values with only the messages after those. `key_bytes`, `delta_bytes` and `depth`
-- decide when the next row is a keyframe. Existing rows are keyframes.
ALTER TABLE checkpoints ADD COLUMN base_id INTEGER;
ALTER TABLE checkpoints ADD COLUMN keep INTEGER NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN key_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN delta_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
UPDATE checkpoints SET key_bytes = length(CAST(state_values AS BLOB));
CREATE INDEX checkpoints_by_base ON checkpoints (base_id) WHERE base_id IS NOT NULL;
