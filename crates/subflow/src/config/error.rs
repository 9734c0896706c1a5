//! The one error of the configuration: what is wrong, where it came from, what to fix.

use std::fmt;

/// A configuration that cannot be used; `subflow` exits with code 2 on it.
///
/// `Display` is `<origin>: <message>`, where the origin is the file, environment variable
/// or command line that set the offending key, and the message names the key, e.g.
/// `subflow.toml: subagents.max_concurrent must be between 1 and 4, got 9`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    origin: Option<String>,
    key: Option<String>,
    message: String,
}

impl ConfigError {
    /// An error about `key` (dotted, `models[0].name` style); `message` names the key.
    pub(super) fn at(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            origin: None,
            key: Some(key.into()),
            message: message.into(),
        }
    }

    /// An error about a whole source (an unreadable file, a malformed variable name).
    pub(super) fn source(origin: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            origin: Some(origin.into()),
            key: None,
            message: message.into(),
        }
    }

    /// A message from a runtime component's `validate`, which starts with the key.
    pub(super) fn from_component(message: String) -> Self {
        let key = message
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned();
        ConfigError::at(key, message)
    }

    /// The offending key, in `models[0].name` style.
    pub(super) fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// Says where the offending value came from, unless that is already known.
    pub(super) fn with_origin(mut self, origin: Option<String>) -> Self {
        if self.origin.is_none() {
            self.origin = origin;
        }
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.origin {
            Some(origin) => write!(f, "{origin}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ConfigError {}
