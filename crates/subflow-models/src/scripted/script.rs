//! Script files: their format (docs/configuration.md#models), loading with positioned errors, and rule
//! matching.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

/// A script file that cannot be used; its `Display` names the file, the line (and
/// column when known) and the reason, because it stops startup and must say what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    /// The file could not be read.
    #[error("{}: cannot read script: {reason}", path.display())]
    Read {
        /// The configured path.
        path: PathBuf,
        /// The IO error.
        reason: String,
    },
    /// The file name does not say which format it is in.
    #[error("{}: unsupported script file extension; use .toml or .json", path.display())]
    Extension {
        /// The configured path.
        path: PathBuf,
    },
    /// The file does not parse or does not follow the script format.
    #[error("{}: {reason}", location(path, *line, *column))]
    Parse {
        /// The configured path.
        path: PathBuf,
        /// 1-based line of the problem, when the parser knows it.
        line: Option<usize>,
        /// 1-based column of the problem, when the parser knows it.
        column: Option<usize>,
        /// What is wrong.
        reason: String,
    },
}

fn location(path: &Path, line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(line), Some(column)) => format!("{}:{line}:{column}", path.display()),
        (Some(line), None) => format!("{}:{line}", path.display()),
        _ => path.display().to_string(),
    }
}

/// A parsed script: the first rule matching a call answers it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Script {
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    #[serde(deserialize_with = "agent")]
    agent: String,
    #[serde(default)]
    contains: Option<String>,
    #[serde(deserialize_with = "non_empty_turns")]
    turns: Vec<Turn>,
}

/// One scripted answer.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Turn {
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    #[serde(default)]
    pub usage: Option<ScriptedUsage>,
    #[serde(default)]
    pub delay_ms: u64,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// A tool call a turn makes; without `id` one is derived like the no-script ids.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScriptedCall {
    #[serde(deserialize_with = "non_empty")]
    pub name: String,
    #[serde(default, deserialize_with = "object")]
    pub args: Map<String, Value>,
    #[serde(default)]
    pub id: Option<String>,
}

/// Usage a turn reports; a missing field keeps its computed default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScriptedUsage {
    #[serde(default)]
    pub input: Option<u64>,
    #[serde(default)]
    pub output: Option<u64>,
    #[serde(default)]
    pub cache_read: Option<u64>,
    #[serde(default)]
    pub cache_write: Option<u64>,
}

// Validation runs inside deserialisation so that both parsers attach the position of
// the offending value to the error.

fn agent<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let agent = String::deserialize(deserializer)?;
    let is_subagent = agent
        .strip_prefix("subagent:")
        .is_some_and(|name| !name.is_empty());
    if agent == "lead_agent" || is_subagent {
        Ok(agent)
    } else {
        Err(serde::de::Error::custom(format!(
            "agent must be \"lead_agent\" or \"subagent:<name>\", not {agent:?}"
        )))
    }
}

fn non_empty_turns<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Turn>, D::Error> {
    let turns = Vec::<Turn>::deserialize(deserializer)?;
    if turns.is_empty() {
        return Err(serde::de::Error::custom(
            "a rule needs at least one turn in `turns`",
        ));
    }
    Ok(turns)
}

fn non_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let text = String::deserialize(deserializer)?;
    if text.trim().is_empty() {
        return Err(serde::de::Error::custom(
            "a tool call needs a non-empty `name`",
        ));
    }
    Ok(text)
}

fn object<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Map<String, Value>, D::Error> {
    match Value::deserialize(deserializer)? {
        Value::Object(args) => Ok(args),
        other => Err(serde::de::Error::custom(format!(
            "tool call `args` must be a table/object, not {other}"
        ))),
    }
}

impl Script {
    /// Reads and validates the script at `path`, choosing the format by extension.
    pub(crate) fn load(path: &Path) -> Result<Script, ScriptError> {
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        // The extension is checked before reading so that a wrong name is reported as
        // such even when the file also does not exist.
        let is_toml = match extension.as_deref() {
            Some("toml") => true,
            Some("json") => false,
            _ => {
                return Err(ScriptError::Extension {
                    path: path.to_owned(),
                });
            }
        };
        let source = std::fs::read_to_string(path).map_err(|e| ScriptError::Read {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        if is_toml {
            Script::from_toml(path, &source)
        } else {
            Script::from_json(path, &source)
        }
    }

    fn from_toml(path: &Path, source: &str) -> Result<Script, ScriptError> {
        toml::from_str(source).map_err(|e| {
            let (line, column) = match e.span() {
                Some(span) => {
                    let (line, column) = line_and_column(source, span.start);
                    (Some(line), Some(column))
                }
                None => (None, None),
            };
            ScriptError::Parse {
                path: path.to_owned(),
                line,
                column,
                reason: e.message().trim().to_owned(),
            }
        })
    }

    fn from_json(path: &Path, source: &str) -> Result<Script, ScriptError> {
        serde_json::from_str(source).map_err(|e| {
            // serde_json appends the position to its message; it is reported separately.
            let full = e.to_string();
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            let reason = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
            ScriptError::Parse {
                path: path.to_owned(),
                line: (e.line() > 0).then_some(e.line()),
                column: (e.line() > 0 && e.column() > 0).then_some(e.column()),
                reason,
            }
        })
    }

    /// The turn answering call `call_index` (1-based) of `agent`, from the first rule
    /// whose agent equals `agent` and whose `contains` (if any) is part of
    /// `first_human`. The last turn repeats.
    pub(crate) fn turn(&self, agent: &str, first_human: &str, call_index: u32) -> Option<&Turn> {
        let rule = self.rules.iter().find(|rule| {
            rule.agent == agent
                && rule
                    .contains
                    .as_deref()
                    .is_none_or(|needle| first_human.contains(needle))
        })?;
        let position = usize::try_from(call_index.max(1) - 1).unwrap_or(usize::MAX);
        rule.turns.get(position).or_else(|| rule.turns.last())
    }
}

/// 1-based line and column (in characters) of byte `offset` in `source`.
fn line_and_column(source: &str, offset: usize) -> (usize, usize) {
    let before = &source[..source.floor_char_boundary(offset.min(source.len()))];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_and_count_characters() {
        let source = "a = 1\néé = x\n";
        assert_eq!(line_and_column(source, 0), (1, 1));
        assert_eq!(line_and_column(source, 6), (2, 1));
        assert_eq!(line_and_column(source, source.find('x').unwrap()), (2, 6));
    }

    #[test]
    fn a_rule_without_contains_matches_everything_for_its_agent() {
        let script: Script = toml::from_str(
            r#"
            [[rules]]
            agent = "lead_agent"
            turns = [{ text = "one" }, { text = "two" }]
            "#,
        )
        .unwrap();
        let text = |n| script.turn("lead_agent", "hi", n).unwrap().text.clone();
        assert_eq!(text(1).as_deref(), Some("one"));
        assert_eq!(text(7).as_deref(), Some("two"));
        assert!(script.turn("subagent:general-purpose", "hi", 1).is_none());
    }
}
