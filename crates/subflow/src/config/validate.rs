//! The rules a loaded configuration must follow (docs/configuration.md#sources, docs/configuration.md#models, docs/events.md#loop-detection, docs/batches.md#configuration, docs/api.md#auth-and-ownership).
//! Each failure names its key and says what would be accepted.

use std::collections::HashMap;
use std::fmt::Display;
use std::net::SocketAddr;

use super::{AuthMode, Config, ConfigError, ModelConfig, Provider, SubagentBatchesConfig};

/// Tools a subagent never gets (docs/configuration.md#subagents-and-tools).
const LEAD_ONLY_TOOLS: [&str; 4] = ["task", "batch_task", "batch_status", "cancel_batch"];

/// The exact startup error of docs/api.md#auth-and-ownership.
const LOCAL_MODE_NEEDS_LOOPBACK: &str = "auth.mode=local requires a loopback listen address";

impl Config {
    /// Checks every documented range and rule; the first failure names its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_server()?;
        at_least_one("database.max_connections", self.database.max_connections)?;
        not_empty("database.url", &self.database.url)?;
        at_least_one("streams.heartbeat_seconds", self.streams.heartbeat_seconds)?;
        at_least_one("runs.timeout_seconds", self.runs.timeout_seconds)?;
        at_least_one("runs.lease_seconds", self.runs.lease_seconds)?;
        at_least_one("lead.max_turns", self.lead.max_turns)?;
        at_least_one(
            "run_events.max_trace_content",
            self.run_events.max_trace_content,
        )?;
        at_least_one(
            "run_events.flush_interval_ms",
            self.run_events.flush_interval_ms,
        )?;
        not_empty("logging.level", &self.logging.level)?;
        at_least_one("tracing.queue_size", self.tracing.queue_size)?;
        at_least_one(
            "tracing.export_timeout_seconds",
            self.tracing.export_timeout_seconds,
        )?;
        not_empty("tracing.langfuse.base_url", &self.tracing.langfuse.base_url)?;
        not_empty(
            "tracing.langfuse.public_key_env",
            &self.tracing.langfuse.public_key_env,
        )?;
        not_empty(
            "tracing.langfuse.secret_key_env",
            &self.tracing.langfuse.secret_key_env,
        )?;
        self.validate_models()?;
        self.validate_subagents()?;
        self.subagent_runtime
            .validate()
            .map_err(ConfigError::from_component)?;
        self.loop_detection
            .validate()
            .map_err(ConfigError::from_component)?;
        self.token_budget
            .validate()
            .map_err(ConfigError::from_component)?;
        self.validate_budgets()?;
        validate_batches(&self.subagent_batches)?;
        for (index, webhook) in self.observers.webhooks.iter().enumerate() {
            let key = format!("observers.webhooks[{index}]");
            not_empty(&format!("{key}.url"), &webhook.url)?;
            if let Some(name) = &webhook.secret_env {
                not_empty(&format!("{key}.secret_env"), name)?;
            }
        }
        Ok(())
    }

    /// `budgets.*`: positive limits, ascending warn fractions, and amounts in one
    /// currency, so every priced model must price in the same one.
    fn validate_budgets(&self) -> Result<(), ConfigError> {
        self.budgets
            .validate()
            .map_err(ConfigError::from_component)?;
        if !self.budgets.any() {
            return Ok(());
        }
        let mut currencies: Vec<String> = self
            .models
            .iter()
            .filter_map(|m| m.pricing.as_ref())
            .filter(|p| p.input_per_million > 0.0 || p.output_per_million > 0.0)
            .map(|p| p.currency.to_uppercase())
            .collect();
        currencies.sort();
        currencies.dedup();
        if currencies.len() > 1 {
            return Err(ConfigError::at(
                "budgets",
                format!(
                    "budgets: amounts are in one currency, but the models are priced in {}; price every model in one currency",
                    currencies.join(" and ")
                ),
            ));
        }
        Ok(())
    }

    fn validate_server(&self) -> Result<(), ConfigError> {
        let listen = &self.server.listen;
        let loopback = listen_is_loopback(listen).ok_or_else(|| {
            ConfigError::at(
                "server.listen",
                format!("server.listen must be HOST:PORT, such as 127.0.0.1:8001, got {listen:?}"),
            )
        })?;
        for (key, seconds) in [
            (
                "server.idle_timeout_seconds",
                self.server.idle_timeout_seconds,
            ),
            (
                "server.header_timeout_seconds",
                self.server.header_timeout_seconds,
            ),
            (
                "server.body_timeout_seconds",
                self.server.body_timeout_seconds,
            ),
        ] {
            range(key, seconds, 1, 86_400)?;
        }
        if self.auth.mode == AuthMode::Local && !loopback {
            // The key is `server.listen` so the error names the source that set it.
            return Err(ConfigError::at("server.listen", LOCAL_MODE_NEEDS_LOOPBACK));
        }
        Ok(())
    }

    fn validate_models(&self) -> Result<(), ConfigError> {
        if self.models.is_empty() {
            return Err(ConfigError::at(
                "models",
                "models must list at least one model",
            ));
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (index, model) in self.models.iter().enumerate() {
            let key = format!("models[{index}]");
            not_empty(&format!("{key}.name"), &model.name)?;
            if let Some(first) = seen.insert(&model.name, index) {
                return Err(ConfigError::at(
                    format!("{key}.name"),
                    format!(
                        "{key}.name {:?} is already used by models[{first}]; model names must be unique",
                        model.name
                    ),
                ));
            }
            validate_model(&key, model)?;
        }
        if let Some(lead) = &self.lead.model {
            self.known_model("lead.model", lead)?;
        }
        Ok(())
    }

    fn known_model(&self, key: &str, name: &str) -> Result<(), ConfigError> {
        if self.models.iter().any(|m| m.name == name) {
            return Ok(());
        }
        let names: Vec<&str> = self.models.iter().map(|m| m.name.as_str()).collect();
        Err(ConfigError::at(
            key,
            format!(
                "{key} {name:?} names no configured model; use one of: {}",
                names.join(", ")
            ),
        ))
    }

    fn validate_subagents(&self) -> Result<(), ConfigError> {
        let subagents = &self.subagents;
        range("subagents.max_concurrent", subagents.max_concurrent, 1, 4)?;
        range(
            "subagents.max_total_per_run",
            subagents.max_total_per_run,
            1,
            50,
        )?;
        at_least_one("subagents.timeout_seconds", subagents.timeout_seconds)?;
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (index, definition) in subagents.definitions.iter().enumerate() {
            let key = format!("subagents.definitions[{index}]");
            not_empty(&format!("{key}.name"), &definition.name)?;
            if let Some(first) = seen.insert(&definition.name, index) {
                return Err(ConfigError::at(
                    format!("{key}.name"),
                    format!(
                        "{key}.name {:?} is already used by subagents.definitions[{first}]",
                        definition.name
                    ),
                ));
            }
            at_least_one(&format!("{key}.max_turns"), definition.max_turns)?;
            at_least_one(
                &format!("{key}.timeout_seconds"),
                definition.timeout_seconds,
            )?;
            if let Some(model) = &definition.model {
                self.known_model(&format!("{key}.model"), model)?;
            }
            let lead_only = definition
                .tools
                .iter()
                .flatten()
                .find(|tool| LEAD_ONLY_TOOLS.contains(&tool.as_str()));
            if let Some(tool) = lead_only {
                return Err(ConfigError::at(
                    format!("{key}.tools"),
                    format!(
                        "{key}.tools must not include {tool}: subagents never get task or the batch tools"
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn validate_model(key: &str, model: &ModelConfig) -> Result<(), ConfigError> {
    let provider = model.provider.as_str();
    match (&model.model, model.provider) {
        (Some(id), _) => not_empty(&format!("{key}.model"), id)?,
        (None, Provider::Scripted) => {}
        (None, Provider::Openai | Provider::Anthropic) => {
            return Err(ConfigError::at(
                format!("{key}.model"),
                format!(
                    "{key}.model is required for provider {provider} (model {:?}): set the provider's model id",
                    model.name
                ),
            ));
        }
    }
    if model.script.is_some() && model.provider != Provider::Scripted {
        return Err(ConfigError::at(
            format!("{key}.script"),
            format!("{key}.script is only for scripted models, not provider {provider}"),
        ));
    }
    for (field, value) in [
        ("base_url", &model.base_url),
        ("api_key_env", &model.api_key_env),
    ] {
        if let Some(value) = value {
            not_empty(&format!("{key}.{field}"), value)?;
        }
    }
    if let Some(window) = model.context_window {
        at_least_one(&format!("{key}.context_window"), window)?;
    }
    if let Some(pricing) = &model.pricing {
        let key = format!("{key}.pricing");
        not_empty(&format!("{key}.currency"), &pricing.currency)?;
        for (field, price) in [
            ("input_per_million", Some(pricing.input_per_million)),
            ("output_per_million", Some(pricing.output_per_million)),
            (
                "input_cache_hit_per_million",
                pricing.input_cache_hit_per_million,
            ),
            (
                "input_cache_write_per_million",
                pricing.input_cache_write_per_million,
            ),
        ] {
            if let Some(price) = price
                && !(price.is_finite() && price >= 0.0)
            {
                return Err(ConfigError::at(
                    format!("{key}.{field}"),
                    format!("{key}.{field} must be a number >= 0, got {price}"),
                ));
            }
        }
    }
    Ok(())
}

fn validate_batches(batches: &SubagentBatchesConfig) -> Result<(), ConfigError> {
    let key = |name: &str| format!("subagent_batches.{name}");
    range(&key("lease_seconds"), batches.lease_seconds, 10, 3600)?;
    let poll = batches.poll_interval_seconds;
    if !(0.1..=60.0).contains(&poll) {
        return Err(ConfigError::at(
            key("poll_interval_seconds"),
            format!(
                "{} must be between 0.1 and 60, got {poll}",
                key("poll_interval_seconds")
            ),
        ));
    }
    range(&key("max_attempts"), batches.max_attempts, 1, 10)?;
    range(
        &key("max_items_per_batch"),
        batches.max_items_per_batch,
        1,
        100_000,
    )?;
    range(
        &key("default_max_live_items"),
        batches.default_max_live_items,
        1,
        10_000,
    )?;
    range(
        &key("max_live_items_per_batch"),
        batches.max_live_items_per_batch,
        1,
        100_000,
    )?;
    range(
        &key("default_max_running_items"),
        batches.default_max_running_items,
        1,
        64,
    )?;
    range(
        &key("max_running_items_per_batch"),
        batches.max_running_items_per_batch,
        1,
        1000,
    )?;
    range(
        &key("max_result_chars"),
        batches.max_result_chars,
        1000,
        1_000_000,
    )?;
    range(
        &key("result_preview_max_chars"),
        batches.result_preview_max_chars,
        64,
        100_000,
    )?;
    not_above(
        (
            &key("default_max_live_items"),
            batches.default_max_live_items,
        ),
        (
            &key("max_live_items_per_batch"),
            batches.max_live_items_per_batch,
        ),
    )?;
    not_above(
        (
            &key("default_max_running_items"),
            batches.default_max_running_items,
        ),
        (
            &key("max_running_items_per_batch"),
            batches.max_running_items_per_batch,
        ),
    )?;
    not_above(
        (
            &key("default_max_running_items"),
            batches.default_max_running_items,
        ),
        (
            &key("default_max_live_items"),
            batches.default_max_live_items,
        ),
    )?;
    not_above(
        (
            &key("result_preview_max_chars"),
            batches.result_preview_max_chars,
        ),
        (&key("max_result_chars"), batches.max_result_chars),
    )
}

/// Whether a `HOST:PORT` listen address is loopback; `None` when it is not `HOST:PORT`.
fn listen_is_loopback(listen: &str) -> Option<bool> {
    if let Ok(address) = listen.parse::<SocketAddr>() {
        return Some(address.ip().is_loopback());
    }
    let (host, port) = listen.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let valid_host = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    valid_host.then(|| host.eq_ignore_ascii_case("localhost"))
}

fn range<T: PartialOrd + Display>(key: &str, value: T, low: T, high: T) -> Result<(), ConfigError> {
    if value < low || value > high {
        return Err(ConfigError::at(
            key,
            format!("{key} must be between {low} and {high}, got {value}"),
        ));
    }
    Ok(())
}

fn at_least_one<T: PartialOrd + From<u8> + Display>(
    key: &str,
    value: T,
) -> Result<(), ConfigError> {
    if value < T::from(1) {
        return Err(ConfigError::at(
            key,
            format!("{key} must be at least 1, got {value}"),
        ));
    }
    Ok(())
}

fn not_empty(key: &str, value: &str) -> Result<(), ConfigError> {
    if value.trim().is_empty() {
        return Err(ConfigError::at(key, format!("{key} must not be empty")));
    }
    Ok(())
}

fn not_above(
    (key, value): (&str, usize),
    (limit_key, limit): (&str, usize),
) -> Result<(), ConfigError> {
    if value > limit {
        return Err(ConfigError::at(
            key,
            format!("{key} ({value}) must be <= {limit_key} ({limit})"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_are_loopback_only_on_loopback_hosts() {
        for (listen, loopback) in [
            ("127.0.0.1:8001", Some(true)),
            ("[::1]:8001", Some(true)),
            ("localhost:8001", Some(true)),
            ("0.0.0.0:8001", Some(false)),
            ("[::]:80", Some(false)),
            ("example.com:443", Some(false)),
            ("127.0.0.1", None),
            (":8001", None),
            ("host:port", None),
            ("a b:1", None),
        ] {
            assert_eq!(listen_is_loopback(listen), loopback, "{listen}");
        }
    }
}
