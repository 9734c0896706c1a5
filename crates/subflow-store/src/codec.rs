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
