//! Layering: defaults ← the file ← `SUBFLOW__…` variables ← command-line flags, merged
//! into one TOML table before it is deserialised, so every error can name its key and
//! the source that set it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::{Config, ConfigError};

/// The file read when neither `--config` nor `$SUBFLOW_CONFIG` names one.
const DEFAULT_FILE: &str = "subflow.toml";
/// The variable naming the configuration file.
const CONFIG_FILE_VAR: &str = "SUBFLOW_CONFIG";
/// The prefix of variables that override keys: `SUBFLOW__A__B` sets `a.b`.
const ENV_PREFIX: &str = "SUBFLOW__";
/// How command-line overrides are named in errors.
const COMMAND_LINE: &str = "command line";

/// Keys of `loop_detection.*`, a runtime type that does not reject unknown keys itself.
pub(super) const LOOP_DETECTION_KEYS: [&str; 8] = [
    "enabled",
    "warn_threshold",
    "hard_limit",
    "window_size",
    "max_tracked_threads",
    "tool_freq_warn",
    "tool_freq_hard_limit",
    "tool_freq_overrides",
];
/// Keys of one `loop_detection.tool_freq_overrides.<tool>` table.
pub(super) const TOOL_FREQ_OVERRIDE_KEYS: [&str; 2] = ["warn", "hard_limit"];
/// Keys of `token_budget.*`, a runtime type that does not reject unknown keys itself.
pub(super) const TOKEN_BUDGET_KEYS: [&str; 6] = [
    "enabled",
    "max_tokens",
    "max_input_tokens",
    "max_output_tokens",
    "warn_threshold",
    "hard_stop_threshold",
];

impl Config {
    /// Loads and validates the configuration: the file `path`, else `$SUBFLOW_CONFIG`,
    /// else `./subflow.toml` (only this last one may be missing), then the
    /// `SUBFLOW__A__B=v` variables of `env` (plus `LANGFUSE_TRACING` and
    /// `LANGFUSE_BASE_URL`), then `overrides` as (dotted key, value) pairs from flags.
    /// Override values are TOML values when they parse as one (`9`, `true`, `["a"]`),
    /// else strings. `tracing.environment` defaults to `$SUBFLOW_ENV`, else `$ENVIRONMENT`.
    pub fn load(
        path: Option<&Path>,
        env: &HashMap<String, String>,
        overrides: &[(&str, &str)],
    ) -> Result<Config, ConfigError> {
        let mut layers = Layers::from_file(path, env)?;
        layers.apply_env(env)?;
        for (key, value) in overrides {
            layers.set(key, value, COMMAND_LINE)?;
        }
        let mut config = layers.deserialize()?;
        if config.tracing.environment.is_none() {
            config.tracing.environment = ["SUBFLOW_ENV", "ENVIRONMENT"]
                .iter()
                .filter_map(|name| env.get(*name))
                .find(|value| !value.is_empty())
                .cloned();
        }
        config.validate().map_err(|error| layers.attribute(error))?;
        Ok(config)
    }
}

/// The merged table and where each overridden key came from.
struct Layers {
    table: Table,
    /// The file's name as given, when one was read.
    file: Option<String>,
    /// (dotted key, origin) of every override, in the order applied.
    origins: Vec<(String, String)>,
    /// Overrides whose text parsed as a non-string TOML value: (dotted key, text).
    coerced: Vec<(String, String)>,
}

impl Layers {
    fn from_file(path: Option<&Path>, env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let (file, required) = match path {
            Some(path) => (path.to_path_buf(), true),
            None => match env.get(CONFIG_FILE_VAR).filter(|value| !value.is_empty()) {
                Some(value) => (PathBuf::from(value), true),
                None => (PathBuf::from(DEFAULT_FILE), false),
            },
        };
        let label = file.display().to_string();
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && !required => {
                return Ok(Layers {
                    table: Table::new(),
                    file: None,
                    origins: Vec::new(),
                    coerced: Vec::new(),
                });
            }
            Err(error) => {
                return Err(ConfigError::source(
                    label,
                    format!("cannot read the configuration file: {error}"),
                ));
            }
        };
        let table = toml::from_str::<Table>(&text)
            .map_err(|error| ConfigError::source(&label, error.to_string().trim_end()))?;
        Ok(Layers {
            table,
            file: Some(label),
            origins: Vec::new(),
            coerced: Vec::new(),
        })
    }

    fn apply_env(&mut self, env: &HashMap<String, String>) -> Result<(), ConfigError> {
        if let Some(value) = env.get("LANGFUSE_TRACING") {
            let enabled = match value.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => "true",
                "0" | "false" | "no" | "off" | "" => "false",
                _ => {
                    return Err(ConfigError::source(
                        "LANGFUSE_TRACING",
                        format!("must be true or false, got {value:?}"),
                    ));
                }
            };
            self.set("tracing.langfuse.enabled", enabled, "LANGFUSE_TRACING")?;
        }
        if let Some(value) = env.get("LANGFUSE_BASE_URL").filter(|v| !v.is_empty()) {
            self.set_value(
                "tracing.langfuse.base_url",
                Value::String(value.clone()),
                "LANGFUSE_BASE_URL",
            )?;
        }
        // Sorted, so a whole-table variable (`SUBFLOW__TRACING`) comes before the
        // variables that set keys inside it, and the result does not depend on hashing.
        let mut names: Vec<&String> = env.keys().filter(|n| n.starts_with(ENV_PREFIX)).collect();
        names.sort();
        for name in names {
            let segments: Vec<String> = name[ENV_PREFIX.len()..]
                .split("__")
                .map(str::to_ascii_lowercase)
                .collect();
            if segments.iter().any(String::is_empty) {
                return Err(ConfigError::source(
                    name,
                    "does not name a key: write SUBFLOW__SECTION__KEY, e.g. SUBFLOW__SERVER__LISTEN",
                ));
            }
            self.set(&segments.join("."), &env[name], name)?;
        }
        Ok(())
    }

    /// Sets `key` from override text, parsed as a TOML value when it is one.
    fn set(&mut self, key: &str, text: &str, origin: &str) -> Result<(), ConfigError> {
        let value = parse_value(text);
        let coerced = !value.is_str();
        self.set_value(key, value, origin)?;
        if coerced {
            self.coerced.push((key.to_owned(), text.to_owned()));
        }
        Ok(())
    }

    fn set_value(&mut self, key: &str, value: Value, origin: &str) -> Result<(), ConfigError> {
        let segments: Vec<&str> = key.split('.').collect();
        if segments.iter().any(|s| s.is_empty()) {
            return Err(ConfigError::source(
                origin,
                format!("{key:?} is not a dotted configuration key such as server.listen"),
            ));
        }
        insert(&mut self.table, &segments, value, "").map_err(|message| {
            ConfigError::source(origin, format!("cannot set {key}: {message}"))
        })?;
        // A later layer replaces what an earlier one set at or below this key.
        let below = format!("{key}.");
        self.coerced
            .retain(|(k, _)| k != key && !k.starts_with(&below));
        self.origins.push((key.to_owned(), origin.to_owned()));
        Ok(())
    }

    fn deserialize(&mut self) -> Result<Config, ConfigError> {
        reject_unknown_runtime_keys(&self.table).map_err(|error| self.attribute(error))?;
        let mut error = match deserialize(&self.table) {
            Ok(config) => return Ok(config),
            Err(error) => error,
        };
        // A value that looked like a number or a boolean may have been meant as text
        // (`SUBFLOW__LEAD__MODEL=4`): retry it as a string before giving up, and report
        // the first error if the string does not fit either.
        while let Some(index) = error
            .key()
            .map(dotted)
            .and_then(|key| self.coerced.iter().position(|(k, _)| *k == key))
        {
            let (key, text) = self.coerced.remove(index);
            let segments: Vec<&str> = key.split('.').collect();
            if insert(&mut self.table, &segments, Value::String(text), "").is_err() {
                break;
            }
            match deserialize(&self.table) {
                Ok(config) => return Ok(config),
                Err(next) if next.key() == error.key() => break,
                Err(next) => error = next,
            }
        }
        Err(self.attribute(error))
    }

    /// Names the source of the offending key: the last override that set it or a
    /// table holding it, else the file.
    fn attribute(&self, error: ConfigError) -> ConfigError {
        let key = error.key().map(dotted).unwrap_or_default();
        let origin = self
            .origins
            .iter()
            .rev()
            .find(|(k, _)| key == *k || key.starts_with(&format!("{k}.")))
            .map(|(_, origin)| origin.clone())
            .or_else(|| self.file.clone());
        error.with_origin(origin)
    }
}

/// `models[0].name` → `models.0.name`, the form overrides are written in.
fn dotted(key: &str) -> String {
    key.replace('[', ".").replace(']', "")
}

/// Override text as a TOML value (`9`, `0.5`, `true`, `["a"]`, `{a = 1}`, `"quoted"`),
/// else the text itself. Dates stay text.
fn parse_value(text: &str) -> Value {
    match toml::from_str::<Table>(&format!("value = {text}")) {
        Ok(mut table) if table.len() == 1 => match table.remove("value") {
            Some(Value::Datetime(_)) | None => Value::String(text.to_owned()),
            Some(value) => value,
        },
        _ => Value::String(text.to_owned()),
    }
}

/// Sets `value` at `segments` below `table` (at `path`), creating tables on the way; a
/// numeric segment indexes a list that is already there (`models.0.script`).
fn insert(table: &mut Table, segments: &[&str], value: Value, path: &str) -> Result<(), String> {
    let (first, rest) = segments.split_first().expect("a key has a segment");
    let path = if path.is_empty() {
        (*first).to_owned()
    } else {
        format!("{path}.{first}")
    };
    if rest.is_empty() {
        table.insert((*first).to_owned(), value);
        return Ok(());
    }
    let slot = table
        .entry((*first).to_owned())
        .or_insert_with(|| Value::Table(Table::new()));
    insert_into(slot, rest, value, &path)
}

fn insert_into(
    slot: &mut Value,
    segments: &[&str],
    value: Value,
    path: &str,
) -> Result<(), String> {
    match slot {
        Value::Table(table) => insert(table, segments, value, path),
        Value::Array(items) => {
            let (first, rest) = segments.split_first().expect("a key has a segment");
            let len = items.len();
            let index = first
                .parse::<usize>()
                .ok()
                .filter(|index| *index < len)
                .ok_or_else(|| {
                    format!("{path} is a list of {len}; index an entry by its position from 0")
                })?;
            if rest.is_empty() {
                items[index] = value;
                Ok(())
            } else {
                insert_into(&mut items[index], rest, value, &format!("{path}.{index}"))
            }
        }
        _ => Err(format!("{path} is not a table")),
    }
}

fn deserialize(table: &Table) -> Result<Config, ConfigError> {
    serde_path_to_error::deserialize(Value::Table(table.clone())).map_err(|error| {
        let path = error.path().to_string();
        let message = error.inner().message().to_owned();
        // Missing fields are reported at their table; name the field itself.
        let key = match message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
        {
            Some(field) if path == "." => field.to_owned(),
            Some(field) => format!("{path}.{field}"),
            None => path,
        };
        ConfigError::at(&key, format!("{key}: {message}"))
    })
}

/// `loop_detection` and `token_budget` are runtime types without
/// `deny_unknown_fields`; check their keys here so a typo is not silently ignored.
fn reject_unknown_runtime_keys(table: &Table) -> Result<(), ConfigError> {
    if let Some(Value::Table(section)) = table.get("loop_detection") {
        known_keys("loop_detection", section, &LOOP_DETECTION_KEYS)?;
        if let Some(Value::Table(overrides)) = section.get("tool_freq_overrides") {
            for (tool, thresholds) in overrides {
                if let Value::Table(thresholds) = thresholds {
                    known_keys(
                        &format!("loop_detection.tool_freq_overrides.{tool}"),
                        thresholds,
                        &TOOL_FREQ_OVERRIDE_KEYS,
                    )?;
                }
            }
        }
    }
    if let Some(Value::Table(section)) = table.get("token_budget") {
        known_keys("token_budget", section, &TOKEN_BUDGET_KEYS)?;
    }
    Ok(())
}

fn known_keys(path: &str, table: &Table, known: &[&str]) -> Result<(), ConfigError> {
    match table.keys().find(|key| !known.contains(&key.as_str())) {
        None => Ok(()),
        Some(unknown) => {
            let expected: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
            let key = format!("{path}.{unknown}");
            Err(ConfigError::at(
                &key,
                format!(
                    "{key}: unknown field `{unknown}`, expected one of {}",
                    expected.join(", ")
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use subflow_runtime::guards::{LoopDetectionConfig, TokenBudgetConfig, ToolFreqOverride};

    #[test]
    fn override_text_is_a_toml_value_when_it_parses_as_one() {
        assert_eq!(parse_value("9"), Value::Integer(9));
        assert_eq!(parse_value("true"), Value::Boolean(true));
        assert_eq!(parse_value("0.5"), Value::Float(0.5));
        assert_eq!(parse_value("\"9\""), Value::String("9".into()));
        assert_eq!(
            parse_value("127.0.0.1:8001"),
            Value::String("127.0.0.1:8001".into())
        );
        assert_eq!(
            parse_value("2024-01-01"),
            Value::String("2024-01-01".into())
        );
        assert_eq!(
            parse_value("1\nextra = 2"),
            Value::String("1\nextra = 2".into())
        );
    }

    #[test]
    fn the_runtime_key_lists_match_the_runtime_types() {
        let mut loop_detection = LoopDetectionConfig::default();
        loop_detection.tool_freq_overrides.insert(
            "bash".into(),
            ToolFreqOverride {
                warn: 1,
                hard_limit: 2,
            },
        );
        let Value::Table(table) = Value::try_from(&loop_detection).unwrap() else {
            panic!("a table");
        };
        let keys: Vec<&str> = table.keys().map(String::as_str).collect();
        assert_eq!(keys, LOOP_DETECTION_KEYS);
        let Value::Table(overrides) = &table["tool_freq_overrides"]["bash"] else {
            panic!("a table");
        };
        let keys: Vec<&str> = overrides.keys().map(String::as_str).collect();
        assert_eq!(keys, TOOL_FREQ_OVERRIDE_KEYS);

        let budget = TokenBudgetConfig {
            max_input_tokens: Some(1),
            max_output_tokens: Some(1),
            ..TokenBudgetConfig::default()
        };
        let Value::Table(table) = Value::try_from(&budget).unwrap() else {
            panic!("a table");
        };
        let keys: Vec<&str> = table.keys().map(String::as_str).collect();
        assert_eq!(keys, TOKEN_BUDGET_KEYS);
    }
}
