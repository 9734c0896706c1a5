//! Backfill paging (docs/workspace.md#task-card "Backfill"): when an expanded card fetches its steps from
//! `/events`, the path of each page, the steps a page holds and where paging goes next.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{BACKFILL_LIMIT, BACKFILL_MAX_PAGES, Card, Step, merge_steps, step_from_record};
use crate::task_result::non_negative_integer;
use crate::text::js_trim;

/// Whether expanding a card should fetch its steps.
pub fn should_backfill(
    card: &Card,
    expanded: bool,
    thread_id: Option<&str>,
    run_id: Option<&str>,
) -> bool {
    let given = |id: Option<&str>| id.is_some_and(|id| !js_trim(id).is_empty());
    expanded && card.steps.is_empty() && given(thread_id) && given(run_id)
}

/// JavaScript's `encodeURIComponent`.
fn encode_component(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The path of one backfill page.
pub fn backfill_path(
    thread_id: &str,
    run_id: &str,
    task_id: &str,
    after_seq: Option<u64>,
) -> String {
    let path = format!(
        "/api/threads/{}/runs/{}/events?event_types=subagent.step&task_id={}&limit={BACKFILL_LIMIT}",
        encode_component(thread_id),
        encode_component(run_id),
        encode_component(task_id)
    );
    match after_seq {
        Some(seq) => format!("{path}&after_seq={seq}"),
        None => path,
    }
}

/// The steps of one task in a page of `/events` records.
pub fn backfill_steps(records: &Value, task_id: &str) -> Vec<Step> {
    let steps: Vec<Step> = records
        .as_array()
        .into_iter()
        .flatten()
        .filter(|record| {
            let matches = |field: &str| {
                record
                    .get(field)
                    .and_then(|f| f.get("task_id"))
                    .and_then(Value::as_str)
                    == Some(task_id)
            };
            record.get("event_type").and_then(Value::as_str) == Some("subagent.step")
                && (matches("content") || matches("metadata"))
        })
        .filter_map(step_from_record)
        .collect();
    merge_steps(&[], &steps)
}

/// Where backfill paging goes after a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackfillNext {
    /// No further page.
    pub done: bool,
    /// The cursor of the next page.
    pub after_seq: Option<u64>,
}

/// Done on a page shorter than `limit`, a record without `seq`, or after
/// [`BACKFILL_MAX_PAGES`] pages; else on from the page's last `seq`.
pub fn backfill_next(records: &Value, pages_fetched: u32, limit: usize) -> BackfillNext {
    let page = records.as_array().map(Vec::as_slice).unwrap_or_default();
    let seqs: Option<Vec<u64>> = page
        .iter()
        .map(|record| record.get("seq").and_then(non_negative_integer))
        .collect();
    match seqs {
        Some(seqs) if page.len() >= limit && pages_fetched < BACKFILL_MAX_PAGES => BackfillNext {
            done: false,
            after_seq: seqs.last().copied(),
        },
        _ => BackfillNext {
            done: true,
            after_seq: None,
        },
    }
}
