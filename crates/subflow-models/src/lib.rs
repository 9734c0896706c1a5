//! The `ChatModel` trait and its providers. A provider turns a [`ChatRequest`] into a
//! stream of [`ChatEvent`]s (text deltas, tool-call deltas, usage, finish reason);
//! [`assemble`] folds such a stream into one AI message with normalised usage.
//!
//! This crate knows model wire formats and nothing about runs, storage or HTTP serving.
//! Cancellation is by dropping the stream: an in-flight request is aborted with it.

mod assemble;
mod types;

pub use assemble::assemble;
pub use types::{ChatEvent, ChatModel, ChatRequest, ChatStream, Error, ModelInfo, ToolSpec, Usage};
