//! What one attempt of an item sends and stores (docs/batches.md#leases-and-fencing, docs/batches.md#running-an-item): the at-least-once
//! preamble before its prompt, and the caps on its result, preview and error.

use subflow_contracts::task_result::TokenUsage;
use subflow_store::ItemUsage;

/// Characters of an attempt's error that are stored (docs/batches.md#running-an-item).
pub const ERROR_MAX_CHARS: usize = 4_000;

/// The prompt a subagent gets for the item `item_key`: the at-least-once preamble of
/// docs/batches.md#leases-and-fencing, a blank line, then the item's prompt.
pub fn item_prompt(item_key: &str, prompt: &str) -> String {
    format!(
        "[Durable batch item \"{item_key}\"] This item may be executed more than once after a worker failure (at-least-once delivery). Treat the item key as its idempotency identity: make side effects idempotent on it, or avoid them.\n\n{prompt}"
    )
}

/// The first `max` characters of `text`, and whether anything was cut.
fn prefix(text: &str, max: usize) -> (&str, bool) {
    // No more bytes than `max` is no more characters either: nothing to count.
    if text.len() <= max {
        return (text, false);
    }
    match text.char_indices().nth(max) {
        Some((end, _)) => (&text[..end], true),
        None => (text, false),
    }
}

/// A result as stored: capped at `max_result_chars` (with `result_truncated`), and its
/// preview, a prefix of at most `preview_max_chars`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResult {
    /// The result, at most `max_result_chars` characters.
    pub result: String,
    /// Whether the result was cut.
    pub truncated: bool,
    /// A prefix of the result.
    pub preview: String,
}

impl StoredResult {
    /// Caps `result` for storage.
    pub fn cap(result: &str, max_result_chars: usize, preview_max_chars: usize) -> Self {
        let (kept, truncated) = prefix(result, max_result_chars);
        let (preview, _) = prefix(kept, preview_max_chars);
        StoredResult {
            result: kept.to_owned(),
            truncated,
            preview: preview.to_owned(),
        }
    }
}

/// An attempt's error as stored: at most [`ERROR_MAX_CHARS`] characters.
pub fn capped_error(error: &str) -> String {
    prefix(error, ERROR_MAX_CHARS).0.to_owned()
}

/// The summed usage of an attempt as an item stores it.
pub fn item_usage(usage: Option<TokenUsage>) -> Option<ItemUsage> {
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    usage.map(|u| ItemUsage {
        input_tokens: count(u.input_tokens),
        output_tokens: count(u.output_tokens),
        total_tokens: count(u.total_tokens),
        cache_read_tokens: count(u.cache_read_tokens),
        cache_write_tokens: count(u.cache_write_tokens),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preamble_names_the_key_and_precedes_the_prompt() {
        assert_eq!(
            item_prompt("item-7", "Summarise chapter 7"),
            "[Durable batch item \"item-7\"] This item may be executed more than once after a worker failure (at-least-once delivery). Treat the item key as its idempotency identity: make side effects idempotent on it, or avoid them.\n\nSummarise chapter 7"
        );
    }

    #[test]
    fn results_are_cut_at_the_cap_in_characters_and_previewed_from_the_kept_text() {
        let fits = StoredResult::cap("short", 1000, 64);
        assert_eq!(
            fits,
            StoredResult {
                result: "short".into(),
                truncated: false,
                preview: "short".into()
            }
        );
        let long = "é".repeat(1500);
        let cut = StoredResult::cap(&long, 1000, 64);
        assert!(cut.truncated);
        assert_eq!(cut.result.chars().count(), 1000);
        assert_eq!(cut.preview, "é".repeat(64));
        let exact = StoredResult::cap(&"x".repeat(1000), 1000, 2000);
        assert!(!exact.truncated);
        assert_eq!(exact.preview.len(), 1000);
        // More bytes than the cap but fewer characters: kept whole.
        let wide = StoredResult::cap(&"é".repeat(600), 1000, 64);
        assert!(!wide.truncated);
        assert_eq!(wide.result.chars().count(), 600);
    }

    #[test]
    fn errors_keep_their_first_4000_characters() {
        assert_eq!(capped_error("boom"), "boom");
        let long = "ü".repeat(ERROR_MAX_CHARS + 1);
        assert_eq!(capped_error(&long).chars().count(), ERROR_MAX_CHARS);
    }

    #[test]
    fn usage_converts_and_stays_absent_without_records() {
        assert_eq!(item_usage(None), None);
        let usage = TokenUsage {
            cache_read_tokens: 2,
            ..TokenUsage::new(3, 2, 5)
        };
        assert_eq!(
            item_usage(Some(usage)),
            Some(ItemUsage {
                input_tokens: 3,
                output_tokens: 2,
                total_tokens: 5,
                cache_read_tokens: 2,
                cache_write_tokens: 0,
            })
        );
    }
}
