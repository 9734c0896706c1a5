-- Checkpoints stored as deltas of the thread's previous checkpoint (subflow_store::delta):
-- `base_id` is the row a delta continues (NULL for a keyframe, which holds the whole
-- values), `keep` how many of its messages the delta keeps, and `state_values` the
-- values with only the messages after those. `key_bytes`, `delta_bytes` and `depth`
-- decide when the next row is a keyframe. Existing rows are keyframes.
ALTER TABLE checkpoints
    ADD COLUMN base_id BIGINT,
    ADD COLUMN keep BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN key_bytes BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN delta_bytes BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN depth BIGINT NOT NULL DEFAULT 0;
UPDATE checkpoints SET key_bytes = octet_length(state_values);
CREATE INDEX checkpoints_by_base ON checkpoints (base_id) WHERE base_id IS NOT NULL;
