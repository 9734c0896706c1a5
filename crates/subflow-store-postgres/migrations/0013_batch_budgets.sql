-- Money budgets of batches: why a paused batch is paused (`budget` when its
-- `batch_max_cost` was reached), and how many of the budget's warn fractions, then its
-- limit, were reported, so each crossing is reported once across workers.
ALTER TABLE subagent_batches ADD COLUMN pause_reason TEXT;
ALTER TABLE subagent_batches ADD COLUMN budget_level BIGINT NOT NULL DEFAULT 0;
