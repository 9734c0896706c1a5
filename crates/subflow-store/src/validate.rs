//! Input checks every backend runs before it touches storage, and the shared clock format.

use subflow_contracts::events::{
    CATEGORY_MAX_CHARS, EVENT_TYPE_MAX_CHARS, MIDDLEWARE_PREFIX, MIDDLEWARE_TAG_MAX_CHARS,
    MIDDLEWARE_TYPE_MIN_CHARS,
};
use subflow_contracts::{NewEvent, ThreadId};

use crate::{Error, Result};

/// Checks a batch: one valid thread id, non-empty run ids, event types of 1–32
/// characters (middleware types 12–32 with a 1–21 character tag) and categories of
/// 1–16 characters. A batch that fails is not written at all.
pub fn validate_batch(batch: &[NewEvent]) -> Result<()> {
    let Some(first) = batch.first() else {
        return Ok(());
    };
    ThreadId::parse(&first.thread_id)?;
    for event in batch {
        if event.thread_id != first.thread_id {
            return Err(Error::MixedThreads {
                first: first.thread_id.clone(),
                other: event.thread_id.clone(),
            });
        }
        if event.run_id.is_empty() {
            return Err(Error::InvalidRunId);
        }
        if !valid_event_type(&event.event_type) {
            return Err(Error::InvalidEventType(event.event_type.clone()));
        }
        let category_chars = event.category.chars().count();
        if !(1..=CATEGORY_MAX_CHARS).contains(&category_chars) {
            return Err(Error::InvalidCategory(event.category.clone()));
        }
    }
    Ok(())
}

fn valid_event_type(event_type: &str) -> bool {
    let chars = event_type.chars().count();
    if !(1..=EVENT_TYPE_MAX_CHARS).contains(&chars) {
        return false;
    }
    match event_type.strip_prefix(MIDDLEWARE_PREFIX) {
        Some(tag) => {
            chars >= MIDDLEWARE_TYPE_MIN_CHARS
                && (1..=MIDDLEWARE_TAG_MAX_CHARS).contains(&tag.chars().count())
        }
        None => true,
    }
}

/// The clock format every backend stores, shared with the producers that stamp events.
pub use subflow_contracts::events::{now_rfc3339, rfc3339};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, json};

    fn event(thread: &str, event_type: &str, category: &str) -> NewEvent {
        NewEvent::new(thread, "r1", event_type, category, json!(null), Map::new())
    }

    #[test]
    fn accepts_a_well_formed_batch_and_an_empty_one() {
        assert!(validate_batch(&[]).is_ok());
        let batch = [
            event("t1", "subagent.step", "subagent"),
            event("t1", "middleware:loop_detection", "middleware"),
        ];
        assert!(validate_batch(&batch).is_ok());
    }

    #[test]
    fn rejects_each_kind_of_bad_input_with_its_own_error() {
        let long_type = "x".repeat(33);
        assert!(matches!(
            validate_batch(&[event("t1", &long_type, "trace")]),
            Err(Error::InvalidEventType(_))
        ));
        assert!(matches!(
            validate_batch(&[event("t1", "", "trace")]),
            Err(Error::InvalidEventType(_))
        ));
        assert!(matches!(
            validate_batch(&[event("t1", "middleware:", "middleware")]),
            Err(Error::InvalidEventType(_))
        ));
        let long_category = "c".repeat(17);
        assert!(matches!(
            validate_batch(&[event("t1", "run.start", &long_category)]),
            Err(Error::InvalidCategory(_))
        ));
        assert!(matches!(
            validate_batch(&[event("bad id", "run.start", "trace")]),
            Err(Error::InvalidThreadId(_))
        ));
        let mixed = [
            event("t1", "run.start", "trace"),
            event("t2", "run.start", "trace"),
        ];
        assert!(matches!(
            validate_batch(&mixed),
            Err(Error::MixedThreads { .. })
        ));
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_microseconds() {
        let stamp = now_rfc3339();
        assert_eq!(stamp.len(), "2026-01-01T00:00:00.000000Z".len());
        assert!(
            time::OffsetDateTime::parse(&stamp, &time::format_description::well_known::Rfc3339)
                .is_ok()
        );
    }
}
