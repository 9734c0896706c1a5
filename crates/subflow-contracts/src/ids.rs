//! Validated identifiers.

use std::fmt;

/// The longest thread id accepted (docs/README.md).
pub const THREAD_ID_MAX_LEN: usize = 64;

/// A thread id matching `^[A-Za-z0-9_-]{1,64}$`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct ThreadId(String);

/// A string that is not a valid thread id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid thread_id '{0}': expected 1-64 characters from A-Z, a-z, 0-9, '_' and '-'")]
pub struct InvalidThreadId(pub String);

impl ThreadId {
    /// Parses a thread id, rejecting anything outside `^[A-Za-z0-9_-]{1,64}$`.
    pub fn parse(text: &str) -> Result<Self, InvalidThreadId> {
        if is_valid_thread_id(text) {
            Ok(ThreadId(text.to_owned()))
        } else {
            Err(InvalidThreadId(text.to_owned()))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `text` matches `^[A-Za-z0-9_-]{1,64}$`.
pub fn is_valid_thread_id(text: &str) -> bool {
    (1..=THREAD_ID_MAX_LEN).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for ThreadId {
    type Error = InvalidThreadId;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        if is_valid_thread_id(&text) {
            Ok(ThreadId(text))
        } else {
            Err(InvalidThreadId(text))
        }
    }
}

impl<'de> serde::Deserialize<'de> for ThreadId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ThreadId::try_from(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_alphabet_up_to_64_characters() {
        assert!(ThreadId::parse("t1").is_ok());
        assert!(ThreadId::parse("A-b_9").is_ok());
        assert!(ThreadId::parse(&"x".repeat(64)).is_ok());
    }

    #[test]
    fn rejects_empty_long_and_foreign_characters() {
        for bad in ["", "a b", "a/b", "é", "t.1", &"x".repeat(65)] {
            assert_eq!(
                ThreadId::parse(bad),
                Err(InvalidThreadId(bad.to_owned())),
                "{bad:?}"
            );
        }
        assert!(serde_json::from_str::<ThreadId>("\"../etc\"").is_err());
    }
}
