//! Decoding of stored column values, shared by the SQL backends so both read rows the same way.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde_json::{Map, Value};
use subflow_contracts::RunStatus;
use uuid::Uuid;

use crate::records::{ModelUsage, NewRun, RunRecord, RunUsage};
use crate::{Error, Result};

fn corrupt(what: &'static str, detail: impl ToString) -> Error {
    Error::Corrupt {
        what,
        detail: detail.to_string(),
    }
}

/// Parses a JSON text column.
pub fn json(what: &'static str, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| corrupt(what, e))
}

/// Parses a JSON text column that must hold an object.
pub fn object(what: &'static str, text: &str) -> Result<Map<String, Value>> {
    match json(what, text)? {
        Value::Object(map) => Ok(map),
        other => Err(corrupt(
            what,
            format!("expected a JSON object, found {other}"),
        )),
    }
}

/// The metadata key never shown by the API (a caller's credential some clients put in a
/// run's metadata).
pub const HIDDEN_METADATA_KEY: &str = "auth_token";

/// One run event's stored columns, as a page of the API writes them out without
/// building a [`Value`] of its content or metadata.
#[derive(Debug)]
pub struct EventColumns<'a> {
    /// Thread id.
    pub thread_id: &'a str,
    /// Run id.
    pub run_id: &'a str,
    /// Thread-global sequence number.
    pub seq: i64,
    /// Event type.
    pub event_type: &'a str,
    /// Category.
    pub category: &'a str,
    /// JSON text of the content.
    pub content: &'a str,
    /// JSON text of the metadata object.
    pub metadata: &'a str,
    /// RFC 3339 time.
    pub created_at: &'a str,
    /// Run owner.
    pub user_id: Option<&'a str>,
    /// Idempotency key.
    pub event_id: Uuid,
}

impl EventColumns<'_> {
    /// The event these columns hold, its JSON columns decoded.
    pub fn decode(&self) -> Result<subflow_contracts::RunEvent> {
        Ok(subflow_contracts::RunEvent {
            thread_id: self.thread_id.to_owned(),
            run_id: self.run_id.to_owned(),
            seq: self.seq,
            event_type: self.event_type.to_owned(),
            category: self.category.to_owned(),
            content: json("run_events.content", self.content)?,
            metadata: object("run_events.metadata", self.metadata)?,
            created_at: self.created_at.to_owned(),
            user_id: self.user_id.map(str::to_owned),
            event_id: self.event_id,
        })
    }

    /// Appends the event to a JSON array under way in `out` (a comma first unless it is
    /// the array's first element), the same bytes serde writes for the
    /// [`subflow_contracts::RunEvent`] it decodes to, with [`HIDDEN_METADATA_KEY`] left
    /// out. The JSON columns are checked, not parsed into values: a column that is not
    /// JSON is [`Error::Corrupt`].
    pub fn write_json(&self, out: &mut Vec<u8>) -> Result<()> {
        fn raw<'t>(what: &'static str, text: &'t str) -> Result<&'t str> {
            let value: &serde_json::value::RawValue =
                serde_json::from_str(text).map_err(|e| corrupt(what, e))?;
            Ok(value.get())
        }
        let text = |out: &mut Vec<u8>, value: &str| {
            serde_json::to_writer(out, value).expect("a string always serialises")
        };
        let content = raw("run_events.content", self.content)?;
        let metadata = raw("run_events.metadata", self.metadata)?;
        if !metadata.starts_with('{') {
            return Err(corrupt(
                "run_events.metadata",
                format!("expected a JSON object, found {metadata}"),
            ));
        }
        out.push(if out.len() > 1 { b',' } else { b'[' });
        out.extend_from_slice(b"{\"thread_id\":");
        text(out, self.thread_id);
        out.extend_from_slice(b",\"run_id\":");
        text(out, self.run_id);
        out.extend_from_slice(format!(",\"seq\":{},\"event_type\":", self.seq).as_bytes());
        text(out, self.event_type);
        out.extend_from_slice(b",\"category\":");
        text(out, self.category);
        out.extend_from_slice(b",\"content\":");
        out.extend_from_slice(content.as_bytes());
        out.extend_from_slice(b",\"metadata\":");
        if metadata.contains(HIDDEN_METADATA_KEY) {
            let mut map = object("run_events.metadata", metadata)?;
            map.remove(HIDDEN_METADATA_KEY);
            serde_json::to_writer(&mut *out, &map).expect("a map always serialises");
        } else {
            out.extend_from_slice(metadata.as_bytes());
        }
        out.extend_from_slice(b",\"created_at\":");
        text(out, self.created_at);
        out.extend_from_slice(b",\"user_id\":");
        match self.user_id {
            Some(user) => text(out, user),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"event_id\":\"");
        out.extend_from_slice(
            self.event_id
                .hyphenated()
                .encode_lower(&mut Uuid::encode_buffer())
                .as_bytes(),
        );
        out.extend_from_slice(b"\"}");
        Ok(())
    }
}

/// Closes a JSON array [`EventColumns::write_json`] wrote to (`[]` when it wrote nothing).
pub fn finish_json_array(mut out: Vec<u8>) -> Vec<u8> {
    if out.is_empty() {
        out.push(b'[');
    }
    out.push(b']');
    out
}

/// Parses a closed-enum text column.
pub fn parse<T: FromStr>(what: &'static str, text: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|e| corrupt(what, e))
}

/// Reads a 16-byte UUID column.
pub fn uuid(what: &'static str, bytes: &[u8]) -> Result<Uuid> {
    Uuid::from_slice(bytes).map_err(|e| corrupt(what, e))
}

/// Parses a JSON text column into `T`.
pub fn decode<T: serde::de::DeserializeOwned>(what: &'static str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| corrupt(what, e))
}

/// Serialises a value for a JSON text column.
pub fn encode<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("plain data always serialises")
}

/// Parses the per-model usage JSON column.
pub fn by_model(what: &'static str, text: &str) -> Result<BTreeMap<String, ModelUsage>> {
    serde_json::from_str(text).map_err(|e| corrupt(what, e))
}

/// Serialises the per-model usage JSON column.
pub fn by_model_text(by_model: &BTreeMap<String, ModelUsage>) -> String {
    serde_json::to_string(by_model).expect("usage buckets always serialise")
}

/// The record of a run just created from `run` at time `now`.
pub fn new_run_record(run: NewRun, now: String) -> RunRecord {
    RunRecord {
        run_id: run.run_id,
        thread_id: run.thread_id,
        owner: run.owner,
        assistant_id: run.assistant_id,
        status: RunStatus::Pending,
        model_name: run.model_name,
        trace_id: run.trace_id,
        stop_reason: None,
        error: None,
        metadata: run.metadata,
        multitask_strategy: run.multitask_strategy,
        kwargs: run.kwargs,
        usage: RunUsage::default(),
        created_at: now.clone(),
        updated_at: now,
    }
}

/// Parses a token's permissions column, the comma-separated list
/// [`subflow_contracts::Permissions`] prints.
pub fn permissions(what: &'static str, text: &str) -> Result<subflow_contracts::Permissions> {
    subflow_contracts::Permissions::parse_list(text).map_err(|e| corrupt(what, e))
}
