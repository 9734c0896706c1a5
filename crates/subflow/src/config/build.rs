//! Turns a validated configuration into the parts the composition root wires together:
//! chat models, webhook observers and the runtime's configuration.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use subflow_models::{
    AnthropicConfig, AnthropicModel, ChatModel, OpenAiConfig, OpenAiModel, ScriptedConfig,
    ScriptedModel, Secret,
};
use subflow_runtime::observers::{ObserverSet, WebhookConfig};
use subflow_runtime::runtime::BatchToolConfig;
use subflow_runtime::runtime::RuntimeConfig;
use subflow_runtime::subagent::SubagentDefinition;
use subflow_telemetry::ExporterConfig;

use super::{Config, ConfigError, ModelConfig, Provider};

/// A loaded, validated configuration and what was built from it, before any database is
/// opened.
#[derive(Debug)]
pub struct Built {
    /// The configuration.
    pub config: Config,
    /// Every model, the lead's first, ready for `subflow_runtime::runtime::Models::new`.
    pub models: Vec<Arc<dyn ChatModel>>,
    /// The `observers.webhooks`, for `RuntimeOptions::observers`.
    pub observers: ObserverSet,
    /// The span exporters of `tracing.*` (Langfuse first), not yet started.
    pub exporters: Vec<ExporterConfig>,
}

/// Builds every configured model, the lead's first (so `Models::new` makes it the
/// default) and the rest in configured order, with API keys read from `env`.
pub fn build_models(
    config: &Config,
    env: &HashMap<String, String>,
) -> Result<Vec<Arc<dyn ChatModel>>, ConfigError> {
    let lead = &config.lead_model().name;
    let mut models = Vec::with_capacity(config.models.len());
    for (index, model) in config.models.iter().enumerate() {
        let built = build_model(&format!("models[{index}]"), model, env)?;
        if model.name == *lead {
            models.insert(0, built);
        } else {
            models.push(built);
        }
    }
    Ok(models)
}

fn build_model(
    key: &str,
    model: &ModelConfig,
    env: &HashMap<String, String>,
) -> Result<Arc<dyn ChatModel>, ConfigError> {
    let invalid = |error: subflow_models::Error| ConfigError::at(key, format!("{key}: {error}"));
    let api_key = match &model.api_key_env {
        None => None,
        Some(name) => match env.get(name).filter(|value| !value.is_empty()) {
            Some(value) => Some(Secret::new(value.as_str())),
            None => {
                return Err(ConfigError::at(
                    format!("{key}.api_key_env"),
                    format!(
                        "{key}.api_key_env names {name}, which is not set: export it or remove api_key_env"
                    ),
                ));
            }
        },
    };
    Ok(match model.provider {
        Provider::Scripted => Arc::new(
            ScriptedModel::new(ScriptedConfig {
                name: model.name.clone(),
                model: model.model_id().to_owned(),
                script: model.script.clone(),
                demo_delay_ms: model.demo_delay_ms,
            })
            .map_err(|error| {
                ConfigError::at(format!("{key}.script"), format!("{key}.script: {error}"))
            })?,
        ),
        Provider::Openai => {
            let mut settings = OpenAiConfig::new(&model.name, model.model_id());
            if let Some(base_url) = &model.base_url {
                settings.base_url.clone_from(base_url);
            }
            settings.api_key = api_key;
            settings.max_retries = model.max_retries;
            Arc::new(OpenAiModel::new(settings).map_err(invalid)?)
        }
        Provider::Anthropic => {
            let mut settings = AnthropicConfig::new(&model.name, model.model_id());
            if let Some(base_url) = &model.base_url {
                settings.base_url.clone_from(base_url);
            }
            settings.api_key = api_key;
            settings.max_retries = model.max_retries;
            Arc::new(AnthropicModel::new(settings).map_err(invalid)?)
        }
    })
}

/// The webhook observers of `observers.webhooks`, with signing secrets read from `env`.
pub fn build_observers(
    config: &Config,
    env: &HashMap<String, String>,
) -> Result<ObserverSet, ConfigError> {
    let mut observers = ObserverSet::new();
    for (index, webhook) in config.observers.webhooks.iter().enumerate() {
        let key = format!("observers.webhooks[{index}]");
        let secret = match &webhook.secret_env {
            None => None,
            Some(name) => Some(
                env.get(name)
                    .filter(|value| !value.is_empty())
                    .cloned()
                    .ok_or_else(|| {
                        ConfigError::at(
                            format!("{key}.secret_env"),
                            format!(
                                "{key}.secret_env names {name}, which is not set: export it or remove secret_env"
                            ),
                        )
                    })?,
            ),
        };
        observers = observers
            .with_webhooks([WebhookConfig {
                url: webhook.url.clone(),
                secret,
                headers: webhook.headers.clone(),
            }])
            .map_err(|error| ConfigError::at(&key, format!("{key}: {error}")))?;
    }
    Ok(observers)
}

/// The span exporters of `tracing.*` (docs/operations.md#langfuse-and-otlp): Langfuse when enabled, with its key
/// pair read from the variables `public_key_env` and `secret_key_env` name, and a generic
/// OTLP exporter when `tracing.otlp.endpoint` is set.
pub fn build_exporters(
    config: &Config,
    env: &HashMap<String, String>,
) -> Result<Vec<ExporterConfig>, ConfigError> {
    let tracing = &config.tracing;
    let mut exporters = Vec::new();
    let limits = |mut exporter: ExporterConfig| {
        exporter.queue_size = tracing.queue_size;
        exporter.export_timeout = Duration::from_secs(tracing.export_timeout_seconds);
        exporter
    };
    if tracing.langfuse.enabled {
        let key = |field: &str, name: &str| {
            env.get(name)
                .filter(|value| !value.is_empty())
                .cloned()
                .ok_or_else(|| {
                    ConfigError::at(
                        format!("tracing.langfuse.{field}"),
                        format!(
                            "tracing.langfuse.{field} names {name}, which is not set: export it, or turn Langfuse off (tracing.langfuse.enabled = false)"
                        ),
                    )
                })
        };
        let public = key("public_key_env", &tracing.langfuse.public_key_env)?;
        let secret = key("secret_key_env", &tracing.langfuse.secret_key_env)?;
        let exporter = ExporterConfig::langfuse(&tracing.langfuse.base_url, &public, &secret);
        exporter.validate().map_err(|error| {
            ConfigError::at(
                "tracing.langfuse.base_url",
                format!("tracing.langfuse.base_url: {error}"),
            )
        })?;
        exporters.push(limits(exporter));
    }
    if let Some(endpoint) = &tracing.otlp.endpoint {
        let headers = tracing
            .otlp
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        let exporter = ExporterConfig::otlp(endpoint, headers);
        exporter.validate().map_err(|error| {
            let key = match error {
                subflow_telemetry::otlp::Error::Header(_) => "tracing.otlp.headers",
                _ => "tracing.otlp.endpoint",
            };
            ConfigError::at(key, format!("{key}: {error}"))
        })?;
        exporters.push(limits(exporter));
    }
    Ok(exporters)
}

impl Config {
    /// The runtime's configuration; thread workspaces go under `tools.workspace_root`,
    /// else `<data_dir>/workspaces`. Configured subagent definitions follow the built-in
    /// `general-purpose`, and one of that name replaces it.
    pub fn runtime_config(&self, data_dir: &Path) -> RuntimeConfig {
        let workspace_root = self
            .tools
            .workspace_root
            .clone()
            .unwrap_or_else(|| data_dir.join("workspaces"));
        let mut runtime = RuntimeConfig::with_defaults(workspace_root);
        let mut definitions = vec![SubagentDefinition::general_purpose(
            self.subagents.timeout_seconds,
        )];
        for definition in &self.subagents.definitions {
            definitions.retain(|d| d.name != definition.name);
            definitions.push(definition.clone());
        }
        runtime.lead_max_turns = self.lead.max_turns;
        runtime.subagents_enabled = self.subagents.enabled;
        runtime.max_concurrent = self.subagents.max_concurrent;
        runtime.max_total_per_run = self.subagents.max_total_per_run;
        runtime.definitions = definitions;
        runtime.token_usage_enabled = self.token_usage.enabled;
        runtime.track_token_usage = self.run_events.track_token_usage;
        runtime.max_trace_content = self.run_events.max_trace_content;
        runtime.flush_interval = Duration::from_millis(self.run_events.flush_interval_ms);
        runtime.loop_detection = self.loop_detection.clone();
        runtime.token_budget = self.token_budget.clone();
        let batches = &self.subagent_batches;
        // Validation keeps every value in range, far below u32::MAX.
        let narrow = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        runtime.batches = BatchToolConfig {
            enabled: batches.enabled,
            max_attempts: batches.max_attempts,
            max_items_per_batch: batches.max_items_per_batch,
            default_max_live_items: narrow(batches.default_max_live_items),
            max_live_items_per_batch: narrow(batches.max_live_items_per_batch),
            default_max_running_items: narrow(batches.default_max_running_items),
            max_running_items_per_batch: narrow(batches.max_running_items_per_batch),
        };
        runtime
    }
}
