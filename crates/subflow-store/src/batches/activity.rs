//! What a batch's progress and spend are computed from (the additive progress fields of
//! the public batch and the `batches` section of `/token-usage`): its items' usage summed
//! per model, and how many items finished recently.
//!
//! The store only sums; pricing, the rate and the ETA are the gateway's pure function,
//! so every backend answers with the same numbers and none of them knows prices. Every
//! backend groups its items into [`ActivityRow`]s (one per batch and model) and folds
//! them with [`fold_activity`], so the merging rules live here once.

use serde::Serialize;

use super::ItemUsage;
use crate::{Error, Result};

/// Most batches one [`ActivityQuery`] may name: a page of the batch list.
pub const ACTIVITY_MAX_BATCHES: usize = super::LIST_MAX_LIMIT as usize;

/// Which batches [`BatchStore::batch_activity`](super::BatchStore::batch_activity) sums.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityQuery {
    /// Only these batches (at most [`ACTIVITY_MAX_BATCHES`]); `None` for every batch in
    /// the scope.
    pub batch_ids: Option<Vec<String>>,
    /// RFC 3339 (the stored form): items that became `succeeded` or `failed` at or after
    /// this moment are the recent completions.
    pub completed_since: String,
}

impl ActivityQuery {
    /// Checks the number of batch ids.
    pub fn validate(&self) -> Result<()> {
        match &self.batch_ids {
            Some(ids) if ids.len() > ACTIVITY_MAX_BATCHES => Err(Error::InvalidQuery(format!(
                "at most {ACTIVITY_MAX_BATCHES} batch ids per activity query, got {}",
                ids.len()
            ))),
            _ => Ok(()),
        }
    }
}

/// The items of one model in one batch that reported usage.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ModelItemUsage {
    /// The item's `model_name`; `None` when the attempt named none.
    pub model_name: Option<String>,
    /// How many items reported usage.
    pub items: u64,
    /// Their `token_usage`, summed.
    pub usage: ItemUsage,
}

/// One batch's spend and recent pace. A batch without usage or recent completions reads
/// as [`BatchActivity::default`] with its id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BatchActivity {
    /// The batch.
    pub batch_id: String,
    /// Items with usage, per model, ordered by model name (`None` first).
    pub by_model: Vec<ModelItemUsage>,
    /// Items that became `succeeded` or `failed` at or after
    /// [`ActivityQuery::completed_since`].
    pub recent_completions: u64,
    /// The earliest `started_at` (else `completed_at`) among those items, RFC 3339: where
    /// the window of the rate begins when the batch started or resumed inside it.
    pub recent_first_start: Option<String>,
}

impl BatchActivity {
    /// No usage and no recent completions.
    pub fn empty(batch_id: impl Into<String>) -> Self {
        BatchActivity {
            batch_id: batch_id.into(),
            ..BatchActivity::default()
        }
    }

    /// What its items cost at `models`' prices, by the one price function; items on an
    /// unpriced model count as nothing.
    pub fn spent(&self, models: &[subflow_contracts::cost::ModelFacts]) -> f64 {
        self.by_model
            .iter()
            .filter_map(|group| {
                let model = group.model_name.as_deref()?;
                subflow_contracts::cost::priced(models, model, &group.usage.tokens())
            })
            .map(|(_, _, cost)| cost)
            .sum()
    }

    /// The activity of `batch_id` among `activities`, else [`BatchActivity::empty`].
    pub fn find(activities: &[BatchActivity], batch_id: &str) -> Self {
        activities
            .iter()
            .find(|activity| activity.batch_id == batch_id)
            .cloned()
            .unwrap_or_else(|| BatchActivity::empty(batch_id))
    }
}

/// One group of items as a backend sums them: a batch and a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityRow {
    /// The batch.
    pub batch_id: String,
    /// The items' `model_name`.
    pub model_name: Option<String>,
    /// Items of the group with `token_usage`.
    pub items_with_usage: u64,
    /// Their usage, summed.
    pub usage: ItemUsage,
    /// Items of the group that completed recently.
    pub recent_completions: u64,
    /// The earliest start (else completion) among those.
    pub recent_first_start: Option<String>,
}

/// Merges rows into one [`BatchActivity`] per batch, ordered by batch id. Rows may
/// repeat a (batch, model) pair (the memory store gives one row per item); groups
/// without usage contribute only their recent completions, and groups with neither
/// nothing.
pub fn fold_activity(rows: impl IntoIterator<Item = ActivityRow>) -> Vec<BatchActivity> {
    let mut batches: std::collections::BTreeMap<String, BatchActivity> = Default::default();
    for row in rows {
        if row.items_with_usage == 0 && row.recent_completions == 0 {
            continue;
        }
        let activity = batches
            .entry(row.batch_id.clone())
            .or_insert_with(|| BatchActivity::empty(row.batch_id.clone()));
        activity.recent_completions += row.recent_completions;
        if let Some(start) = row.recent_first_start
            && activity
                .recent_first_start
                .as_ref()
                .is_none_or(|first| start < *first)
        {
            activity.recent_first_start = Some(start);
        }
        if row.items_with_usage == 0 {
            continue;
        }
        let model = match activity
            .by_model
            .binary_search_by(|m| m.model_name.cmp(&row.model_name))
        {
            Ok(index) => &mut activity.by_model[index],
            Err(index) => {
                activity.by_model.insert(
                    index,
                    ModelItemUsage {
                        model_name: row.model_name.clone(),
                        ..ModelItemUsage::default()
                    },
                );
                &mut activity.by_model[index]
            }
        };
        model.items += row.items_with_usage;
        model.usage.input_tokens += row.usage.input_tokens;
        model.usage.output_tokens += row.usage.output_tokens;
        model.usage.total_tokens += row.usage.total_tokens;
        model.usage.cache_read_tokens += row.usage.cache_read_tokens;
        model.usage.cache_write_tokens += row.usage.cache_write_tokens;
    }
    batches.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        batch: &str,
        model: Option<&str>,
        items: u64,
        recent: u64,
        start: Option<&str>,
    ) -> ActivityRow {
        ActivityRow {
            batch_id: batch.into(),
            model_name: model.map(str::to_owned),
            items_with_usage: items,
            usage: ItemUsage {
                input_tokens: 10 * items as i64,
                output_tokens: items as i64,
                total_tokens: 11 * items as i64,
                cache_read_tokens: 4 * items as i64,
                cache_write_tokens: items as i64,
            },
            recent_completions: recent,
            recent_first_start: start.map(str::to_owned),
        }
    }

    #[test]
    fn rows_merge_per_batch_and_model_and_keep_the_earliest_start() {
        let folded = fold_activity([
            row("b", Some("gpt"), 1, 1, Some("2026-01-01T00:00:02.000000Z")),
            row("a", None, 0, 1, Some("2026-01-01T00:00:09.000000Z")),
            row("b", Some("gpt"), 2, 0, None),
            row("b", None, 1, 1, Some("2026-01-01T00:00:01.000000Z")),
        ]);
        assert_eq!(folded.len(), 2);
        assert_eq!(folded[0].batch_id, "a");
        assert!(folded[0].by_model.is_empty(), "no usage, no model entry");
        assert_eq!(folded[0].recent_completions, 1);
        let b = &folded[1];
        assert_eq!(b.recent_completions, 2);
        assert_eq!(
            b.recent_first_start.as_deref(),
            Some("2026-01-01T00:00:01.000000Z")
        );
        assert_eq!(b.by_model.len(), 2);
        assert_eq!(b.by_model[0].model_name, None);
        assert_eq!(b.by_model[1].items, 3);
        assert_eq!(b.by_model[1].usage.total_tokens, 33);
        assert_eq!(
            (
                b.by_model[1].usage.cache_read_tokens,
                b.by_model[1].usage.cache_write_tokens
            ),
            (12, 3)
        );
        assert_eq!(
            BatchActivity::find(&folded, "zz"),
            BatchActivity::empty("zz")
        );
    }
}
