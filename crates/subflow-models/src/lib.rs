//! The `ChatModel` trait and its providers. A provider turns a [`ChatRequest`] into a
//! stream of [`ChatEvent`]s (text deltas, tool-call deltas, usage, finish reason);
//! [`assemble`] folds such a stream into one AI message with normalised usage.
//!
//! This crate knows model wire formats and nothing about runs, storage or HTTP serving.
//! Cancellation is by dropping the stream: an in-flight request is aborted with it.

mod anthropic;
mod assemble;
mod content;
mod http;
mod openai;
mod scripted;
mod secret;
mod sse;
mod types;

pub use anthropic::{
    ANTHROPIC_BASE_URL, ANTHROPIC_VERSION, AnthropicConfig, AnthropicModel, DEFAULT_MAX_TOKENS,
};
pub use assemble::assemble;
pub use http::{Backoff, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT};
pub use openai::{OPENAI_BASE_URL, OpenAiConfig, OpenAiModel};
pub use scripted::{ScriptError, ScriptedConfig, ScriptedModel};
pub use secret::Secret;
pub use types::{ChatEvent, ChatModel, ChatRequest, ChatStream, Error, ModelInfo, ToolSpec, Usage};
