//! How frames are kept in the durable log when the log would otherwise copy the
//! thread's history: a `values` frame carries the whole state, which is exactly a
//! checkpoint's values, so the log stores a reference to that checkpoint and a reader
//! puts the values back. A run's log then grows with what the run adds, not with the
//! length of its thread, and a replay sends the frames byte for byte as they went live
//! (the checkpoint's values serialise to the text that was sent).

use axum::body::Bytes;
use serde_json::{Value, json};
use subflow_store::{Store, StreamFrame};

use crate::sse;

/// The stored event of a `values` frame kept as a checkpoint reference.
pub(crate) const CHECKPOINT_VALUES: &str = "values:checkpoint";

/// Stored frame data a read page stops after (at least one frame is read): a page of
/// `values` frames of a long thread is many whole states.
const PAGE_BYTES: usize = 4 * 1024 * 1024;

/// The stored form of a `values` frame whose values checkpoint `checkpoint_id` holds.
pub(crate) fn checkpoint_reference(checkpoint_id: &str) -> (&'static str, String) {
    (
        CHECKPOINT_VALUES,
        json!({"checkpoint_id": checkpoint_id}).to_string(),
    )
}

/// A stored frame as a watcher gets it.
pub(crate) struct Resolved {
    /// The SSE id.
    pub id: u64,
    /// The SSE event name.
    pub event: String,
    /// The encoded frame; `None` for one that cannot be sent (its checkpoint was
    /// deleted with its run) or that the watcher does not want, which the cursor passes.
    pub sse: Option<Bytes>,
}

/// `frames` of a run of `thread_id` as sent live, checkpoint references resolved for a
/// watcher that `wants` an event; cut short after [`PAGE_BYTES`] of data.
pub(crate) async fn resolve(
    store: &dyn Store,
    thread_id: &str,
    frames: Vec<StreamFrame>,
    wants: impl Fn(&str) -> bool,
) -> subflow_store::Result<Vec<Resolved>> {
    let mut resolved = Vec::with_capacity(frames.len());
    let mut bytes = 0;
    for frame in frames {
        let id = u64::try_from(frame.id).unwrap_or(0);
        let reference = frame.event == CHECKPOINT_VALUES;
        let event = if reference {
            "values".to_owned()
        } else {
            frame.event
        };
        let sse = if !wants(&event) {
            None
        } else if reference {
            let values = checkpoint_values(store, thread_id, &frame.data).await?;
            values.map(|values| sse::frame_text(&event, &values.to_string(), id))
        } else {
            Some(sse::frame_text(&event, &frame.data, id))
        };
        bytes += sse.as_ref().map_or(0, Bytes::len);
        resolved.push(Resolved { id, event, sse });
        if bytes >= PAGE_BYTES {
            break;
        }
    }
    Ok(resolved)
}

/// The values a checkpoint reference names, or `None` once the checkpoint is gone.
async fn checkpoint_values(
    store: &dyn Store,
    thread_id: &str,
    reference: &str,
) -> subflow_store::Result<Option<Value>> {
    let checkpoint_id = serde_json::from_str::<Value>(reference).ok().and_then(|r| {
        r.get("checkpoint_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let Some(checkpoint_id) = checkpoint_id else {
        tracing::error!(
            reference,
            "a stored values frame names no checkpoint; it is skipped"
        );
        return Ok(None);
    };
    let found = store.get_checkpoint(thread_id, &checkpoint_id).await?;
    if found.is_none() {
        tracing::warn!(
            checkpoint_id,
            "a values frame's checkpoint is gone (rolled back); it is skipped"
        );
    }
    Ok(found.map(|c| c.values))
}
