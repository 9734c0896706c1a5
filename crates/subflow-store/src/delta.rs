//! Checkpoint values stored as deltas, shared by the SQL backends, so a long thread does
//! not store its whole conversation again at every step (issue 15: 150 runs on one
//! thread took 40 times the storage of 150 runs on separate threads).
//!
//! A stored row is either a **keyframe** (the whole values) or a **delta** of a base
//! row, the thread's previous checkpoint: the first `keep` messages are the base's, and
//! the row's own text is the values with `messages` holding only the rest. Decoding a
//! checkpoint reads its chain back to a keyframe and replays it ([`decode_rows`]). A row becomes a new
//! keyframe once the deltas since the last one would outweigh it twice
//! ([`KEYFRAME_RATIO`]) or the chain reaches [`MAX_DEPTH`] rows, so keyframes grow
//! geometrically: all of a thread's rows together hold about three times its latest
//! state, and decoding one reads at most about three states.
//!
//! Which messages a new checkpoint keeps is found by comparing per-message hashes with
//! the previous checkpoint's, which a per-process [`DeltaCodec`] remembers for recently
//! written threads (a miss decodes the previous checkpoint once). Messages are compared
//! by their serialised text, so a message changed in place (usage added to an AI
//! message after its tool results) ends the kept prefix there.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use crate::{Error, Result};

/// A row is a keyframe when the deltas since the last keyframe, with its own, exceed
/// this many times the keyframe.
pub const KEYFRAME_RATIO: i64 = 2;

/// The longest chain of deltas after a keyframe.
pub const MAX_DEPTH: i64 = 512;

/// Threads whose latest message hashes are remembered; past it, the memory starts over.
const CACHED_THREADS: usize = 1024;

/// The thread's latest stored row, as the writer reads it before appending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latest {
    /// The row id (`checkpoints.id`).
    pub row: i64,
    /// Its checkpoint id.
    pub checkpoint_id: String,
    /// The bytes of its chain's keyframe.
    pub key_bytes: i64,
    /// The bytes of the deltas after that keyframe, its own included.
    pub delta_bytes: i64,
    /// Deltas after the keyframe, its own included (0 for a keyframe).
    pub depth: i64,
}

/// A checkpoint's values as a row stores them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// The `state_values` text: whole values, or the values with only the new messages.
    pub text: String,
    /// The base row of a delta; `None` for a keyframe.
    pub base: Option<i64>,
    /// Messages taken from the base (0 for a keyframe).
    pub keep: i64,
    /// See [`Latest::key_bytes`].
    pub key_bytes: i64,
    /// See [`Latest::delta_bytes`].
    pub delta_bytes: i64,
    /// See [`Latest::depth`].
    pub depth: i64,
    /// The hashes of every message of the values, for the next write.
    pub hashes: Arc<[u64]>,
}

/// A stored row as read for decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainRow {
    /// Its id (`checkpoints.id`).
    pub row: i64,
    /// The row it is a delta of; `None` for a keyframe.
    pub base: Option<i64>,
    /// Messages taken from the base.
    pub keep: i64,
    /// Its `state_values` text.
    pub text: String,
}

/// Decodes the `wanted` rows from `rows`, which hold them and every row their chains
/// pass through, ascending by id (a base is always older than its deltas). Each
/// decoded value is exactly what was written, key order included. Rows no longer
/// needed as a base are dropped as the walk goes, so memory stays near the wanted
/// values plus one state.
pub fn decode_rows(rows: Vec<ChainRow>, wanted: &[i64]) -> Result<HashMap<i64, Value>> {
    let mut uses: HashMap<i64, usize> = HashMap::new();
    for row in &rows {
        if let Some(base) = row.base {
            *uses.entry(base).or_default() += 1;
        }
    }
    let mut decoded: HashMap<i64, Value> = HashMap::new();
    for row in rows {
        let value = match row.base {
            None => crate::codec::json("checkpoints.state_values", &row.text)?,
            Some(base) => {
                let left = uses.get_mut(&base).expect("counted above");
                *left -= 1;
                // The last delta of a base nobody asked for takes it instead of a copy.
                let base_value = if *left == 0 && !wanted.contains(&base) {
                    decoded.remove(&base)
                } else {
                    decoded.get(&base).cloned()
                };
                let base_value =
                    base_value.ok_or_else(|| corrupt("a delta whose base is missing"))?;
                apply(base_value, row.keep, &row.text)?
            }
        };
        if wanted.contains(&row.row) || uses.get(&row.row).is_some_and(|n| *n > 0) {
            decoded.insert(row.row, value);
        }
    }
    decoded.retain(|row, _| wanted.contains(row));
    Ok(decoded)
}

/// The values of a delta row (`keep`, `text`) after its decoded base.
fn apply(mut base: Value, keep: i64, text: &str) -> Result<Value> {
    let mut next = crate::codec::object("checkpoints.state_values", text)?;
    let mut messages = base
        .get_mut("messages")
        .and_then(Value::as_array_mut)
        .map(std::mem::take)
        .ok_or_else(|| corrupt("a delta whose base has no messages"))?;
    let Some(Value::Array(tail)) = next.get_mut("messages") else {
        return Err(corrupt("a delta without messages"));
    };
    let keep = usize::try_from(keep).map_err(|_| corrupt("a negative keep"))?;
    if keep > messages.len() {
        return Err(corrupt("a delta keeping more messages than its base has"));
    }
    messages.truncate(keep);
    messages.append(tail);
    *tail = messages;
    Ok(Value::Object(next))
}

fn corrupt(detail: &str) -> Error {
    Error::Corrupt {
        what: "checkpoints.state_values",
        detail: detail.to_owned(),
    }
}

/// Encodes checkpoints as deltas and remembers each thread's latest message hashes.
#[derive(Debug, Default)]
pub struct DeltaCodec {
    hasher: RandomState,
    latest: Mutex<HashMap<String, Remembered>>,
}

impl DeltaCodec {
    /// A codec with an empty memory and its own hash keys.
    pub fn new() -> Self {
        DeltaCodec::default()
    }

    fn latest(&self) -> std::sync::MutexGuard<'_, HashMap<String, Remembered>> {
        self.latest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The message hashes of the thread's `latest` row if it is the one last written
    /// here; `None` means decode it and call [`DeltaCodec::hashes`].
    pub fn cached(&self, thread_id: &str, latest: &Latest) -> Option<Arc<[u64]>> {
        self.latest()
            .get(thread_id)
            .filter(|r| r.row == latest.row && r.checkpoint_id == latest.checkpoint_id)
            .map(|r| r.hashes.clone())
    }

    /// The hashes of the messages of decoded `values`.
    pub fn hashes(&self, values: &Value) -> Arc<[u64]> {
        messages(values)
            .map(|messages| {
                messages
                    .iter()
                    .map(|m| self.hasher.hash_one(m.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `values` as a row after `base` (the thread's latest row and its message hashes).
    pub fn encode(&self, values: &Value, base: Option<(&Latest, &[u64])>) -> Encoded {
        let texts: Vec<String> = messages(values)
            .map(|messages| messages.iter().map(Value::to_string).collect())
            .unwrap_or_default();
        let hashes: Arc<[u64]> = texts.iter().map(|t| self.hasher.hash_one(t)).collect();
        let delta = base.and_then(|(latest, base_hashes)| {
            let keep = base_hashes
                .iter()
                .zip(hashes.iter())
                .take_while(|(a, b)| a == b)
                .count();
            if keep == 0 || latest.depth >= MAX_DEPTH {
                return None;
            }
            let text = write_values(values, &texts[keep..]);
            let delta_bytes = latest.delta_bytes + text.len() as i64;
            (delta_bytes <= KEYFRAME_RATIO * latest.key_bytes).then(|| Encoded {
                text,
                base: Some(latest.row),
                keep: keep as i64,
                key_bytes: latest.key_bytes,
                delta_bytes,
                depth: latest.depth + 1,
                hashes: hashes.clone(),
            })
        });
        delta.unwrap_or_else(|| {
            let text = if texts.is_empty() {
                values.to_string()
            } else {
                write_values(values, &texts)
            };
            Encoded {
                key_bytes: text.len() as i64,
                text,
                base: None,
                keep: 0,
                delta_bytes: 0,
                depth: 0,
                hashes,
            }
        })
    }

    /// Remembers the hashes of the row just committed as the thread's latest.
    pub fn remember(&self, thread_id: &str, row: i64, checkpoint_id: &str, hashes: Arc<[u64]>) {
        let mut latest = self.latest();
        if latest.len() >= CACHED_THREADS && !latest.contains_key(thread_id) {
            latest.clear();
        }
        let remembered = Remembered {
            row,
            checkpoint_id: checkpoint_id.to_owned(),
            hashes,
        };
        latest.insert(thread_id.to_owned(), remembered);
    }

    /// Forgets a thread (its checkpoints were deleted or rewritten).
    pub fn forget(&self, thread_id: &str) {
        self.latest().remove(thread_id);
    }
}

/// A thread's latest row as written by this process.
#[derive(Debug)]
struct Remembered {
    row: i64,
    checkpoint_id: String,
    hashes: Arc<[u64]>,
}

/// The `messages` array of an object of values, when it has one.
fn messages(values: &Value) -> Option<&Vec<Value>> {
    values.get("messages").and_then(Value::as_array)
}

/// `values` (an object with `messages`) as JSON text with `messages` replaced by the
/// already serialised `texts`, keys in their order.
fn write_values(values: &Value, texts: &[String]) -> String {
    let object: &Map<String, Value> = values.as_object().expect("values with messages");
    let mut out = String::from("{");
    for (n, (key, value)) in object.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        out.push_str(&Value::String(key.clone()).to_string());
        out.push(':');
        if key == "messages" {
            out.push('[');
            out.push_str(&texts.join(","));
            out.push(']');
        } else {
            out.push_str(&value.to_string());
        }
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// Writes `states` in order through a codec, as a backend does, and decodes each
    /// alone and all of them together.
    fn round_trip(states: &[Value]) -> Vec<(Encoded, Value)> {
        let codec = DeltaCodec::new();
        let mut rows: Vec<ChainRow> = Vec::new();
        let mut latest: Option<Latest> = None;
        let mut out = Vec::new();
        for (n, values) in states.iter().enumerate() {
            let hashes = latest.as_ref().map(|b| codec.cached("t", b).unwrap());
            let encoded = codec.encode(values, latest.as_ref().zip(hashes.as_deref()));
            let row = n as i64;
            codec.remember("t", row, &format!("c{n}"), encoded.hashes.clone());
            rows.push(ChainRow {
                row,
                base: encoded.base,
                keep: encoded.keep,
                text: encoded.text.clone(),
            });
            latest = Some(Latest {
                row,
                checkpoint_id: format!("c{n}"),
                key_bytes: encoded.key_bytes,
                delta_bytes: encoded.delta_bytes,
                depth: encoded.depth,
            });
            let mut decoded = decode_rows(rows.clone(), &[row]).unwrap();
            out.push((encoded, decoded.remove(&row).unwrap()));
        }
        let all: Vec<i64> = (0..states.len() as i64).collect();
        let decoded = decode_rows(rows, &all).unwrap();
        for (row, (_, alone)) in out.iter().enumerate() {
            assert_eq!(&decoded[&(row as i64)], alone);
        }
        out
    }

    #[test]
    fn a_growing_conversation_is_stored_as_deltas_and_decodes_exactly() {
        let mut messages = Vec::new();
        let mut states = Vec::new();
        for n in 0..200 {
            messages.push(json!({"type": "human", "content": format!("question {n}"), "id": n}));
            states.push(json!({"title": "t", "messages": messages, "z": {"b": 1, "a": 2}}));
        }
        let written = round_trip(&states);
        for ((_, decoded), state) in written.iter().zip(&states) {
            assert_eq!(decoded.to_string(), state.to_string());
        }
        let stored: usize = written.iter().map(|(e, _)| e.text.len()).sum();
        let whole: usize = states.iter().map(|s| s.to_string().len()).sum();
        let last = states.last().unwrap().to_string().len();
        assert!(
            stored < 4 * last,
            "{stored} bytes stored for a {last}-byte state"
        );
        assert!(
            whole > 10 * stored,
            "{whole} bytes of whole states, {stored} stored"
        );
        assert!(written.iter().filter(|(e, _)| e.base.is_none()).count() < 12);
    }

    #[test]
    fn a_message_changed_in_place_ends_the_kept_prefix() {
        let a = json!({"messages": [{"id": 1}, {"id": 2, "usage": 1}]});
        let b = json!({"messages": [{"id": 1}, {"id": 2, "usage": 9}, {"id": 3}]});
        let written = round_trip(&[a.clone(), a.clone(), b.clone()]);
        assert_eq!(written[1].0.keep, 2);
        assert_eq!(written[2].0.keep, 1);
        assert_eq!(written[2].1, b);
    }

    fn message() -> impl Strategy<Value = Value> {
        (0..4u8, "[a-c]{0,3}").prop_map(|(id, text)| json!({"id": id, "content": text}))
    }

    fn state() -> impl Strategy<Value = Value> {
        prop_oneof![
            prop::collection::vec(message(), 0..6).prop_map(|m| json!({"messages": m})),
            prop::collection::vec(message(), 0..6)
                .prop_map(|m| json!({"x": 1, "messages": m, "a": [m.len()]})),
            Just(json!({"title": "no messages"})),
            Just(json!([1, 2])),
            Just(json!({"messages": "not a list"})),
        ]
    }

    proptest! {
        /// Whatever follows what, every checkpoint decodes to exactly what was written.
        #[test]
        fn any_history_decodes_to_what_was_written(states in prop::collection::vec(state(), 1..30)) {
            for ((_, decoded), state) in round_trip(&states).iter().zip(&states) {
                prop_assert_eq!(decoded.to_string(), state.to_string());
            }
        }
    }
}
