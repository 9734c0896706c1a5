//! The typed configuration of `subflow` (docs/configuration.md#sources): defaults, then
//! `subflow.toml`, then `SUBFLOW__SECTION__KEY` environment variables, then command-line
//! flags, validated at startup with messages that name the key.
//!
//! This module reads no process state itself: the environment comes in as a map, so
//! everything here is testable, and libraries below the binary get plain values.

mod build;
mod error;
mod example;
mod load;
mod validate;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};
use subflow_runtime::admission::AdmissionConfig;
use subflow_runtime::budget::BudgetsConfig;
use subflow_runtime::guards::{LoopDetectionConfig, TokenBudgetConfig};
use subflow_runtime::subagent::SubagentDefinition;

pub use build::{Built, build_exporters, build_models, build_observers};
pub use error::ConfigError;
pub use example::EXAMPLE;

/// [`Config::load`], then [`build_models`], [`build_observers`] and [`build_exporters`]: every configuration
/// error `serve` can meet before it touches the database.
pub fn load_and_build(
    path: Option<&Path>,
    env: &HashMap<String, String>,
    overrides: &[(&str, &str)],
) -> Result<Built, ConfigError> {
    let config = Config::load(path, env, overrides)?;
    let models = build_models(&config, env)?;
    let observers = build_observers(&config, env)?;
    let exporters = build_exporters(&config, env)?;
    Ok(Built {
        config,
        models,
        observers,
        exporters,
    })
}

/// The whole configuration tree; `Config::default()` is what an empty file gives.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `server.*`.
    pub server: ServerConfig,
    /// `auth.*`.
    pub auth: AuthConfig,
    /// `database.*`.
    pub database: DatabaseConfig,
    /// `streams.*`.
    pub streams: StreamsConfig,
    /// `runs.*`.
    pub runs: RunsConfig,
    /// `lead.*`.
    pub lead: LeadConfig,
    /// `token_usage.*`.
    pub token_usage: TokenUsageConfig,
    /// `run_events.*`.
    pub run_events: RunEventsConfig,
    /// `logging.*`.
    pub logging: LoggingConfig,
    /// `tracing.*`.
    pub tracing: TracingConfig,
    /// `subagents.*`.
    pub subagents: SubagentsConfig,
    /// `subagent_runtime.*`: admission slots shared by tasks and batch items.
    pub subagent_runtime: AdmissionConfig,
    /// `[[models]]`; the first is the default.
    pub models: Vec<ModelConfig>,
    /// `loop_detection.*` (docs/events.md#loop-detection).
    pub loop_detection: LoopDetectionConfig,
    /// `token_budget.*` (docs/events.md#other-guards).
    pub token_budget: TokenBudgetConfig,
    /// `budgets.*`: money budgets (docs/usage-and-cost.md#budgets).
    pub budgets: BudgetsConfig,
    /// `subagent_batches.*` (docs/batches.md#configuration).
    pub subagent_batches: SubagentBatchesConfig,
    /// `observers.*`.
    pub observers: ObserversConfig,
    /// `metrics.*`.
    pub metrics: MetricsConfig,
    /// `web.*`.
    pub web: WebConfig,
    /// `tools.*`.
    pub tools: ToolsConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server: ServerConfig::default(),
            auth: AuthConfig::default(),
            database: DatabaseConfig::default(),
            streams: StreamsConfig::default(),
            runs: RunsConfig::default(),
            lead: LeadConfig::default(),
            token_usage: TokenUsageConfig::default(),
            run_events: RunEventsConfig::default(),
            logging: LoggingConfig::default(),
            tracing: TracingConfig::default(),
            subagents: SubagentsConfig::default(),
            subagent_runtime: AdmissionConfig::default(),
            models: vec![ModelConfig::default_scripted()],
            loop_detection: LoopDetectionConfig::default(),
            token_budget: TokenBudgetConfig::default(),
            budgets: BudgetsConfig::default(),
            subagent_batches: SubagentBatchesConfig::default(),
            observers: ObserversConfig::default(),
            metrics: MetricsConfig::default(),
            web: WebConfig::default(),
            tools: ToolsConfig::default(),
        }
    }
}

impl Config {
    /// The lead agent's model: `lead.model`, else the first model (validation guarantees
    /// both exist).
    pub fn lead_model(&self) -> &ModelConfig {
        self.lead
            .model
            .as_deref()
            .and_then(|name| self.models.iter().find(|m| m.name == name))
            .or_else(|| self.models.first())
            .expect("a validated configuration has at least one model")
    }
}

/// `server.*`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// `HOST:PORT` the gateway listens on.
    pub listen: String,
    /// Extra origins allowed by CORS and by the local-mode origin check.
    pub cors_origins: Vec<String>,
    /// Seconds a connection may stay open with no request in flight.
    pub idle_timeout_seconds: u64,
    /// Seconds from a request's first byte to the end of its headers.
    pub header_timeout_seconds: u64,
    /// Seconds from the end of a request's headers to the end of its body (else 408).
    pub body_timeout_seconds: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8001".to_owned(),
            cors_origins: Vec::new(),
            idle_timeout_seconds: 60,
            header_timeout_seconds: 10,
            body_timeout_seconds: 60,
        }
    }
}

/// `auth.*` (docs/api.md#auth-and-ownership).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// `local` or `token`.
    pub mode: AuthMode,
}

/// How requests are authenticated (docs/api.md#auth-and-ownership).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Every request is the implicit user `default`; loopback listen addresses only.
    #[default]
    Local,
    /// `Authorization: Bearer <token>`.
    Token,
}

/// `database.*`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `sqlite://PATH` or `postgres://USER@HOST:PORT/DB`.
    pub url: String,
    /// Connections in the pool.
    pub max_connections: u32,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: "sqlite://subflow.db".to_owned(),
            max_connections: 10,
        }
    }
}

/// `streams.*` (docs/api.md#resume-and-rejoin).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamsConfig {
    /// How long stream frames are kept after a run ends.
    pub retention_seconds: u64,
    /// Interval of SSE heartbeats.
    pub heartbeat_seconds: u64,
}

impl Default for StreamsConfig {
    fn default() -> Self {
        StreamsConfig {
            retention_seconds: 3600,
            heartbeat_seconds: 15,
        }
    }
}

/// `runs.*` (docs/api.md#cancel).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunsConfig {
    /// A run running longer ends with status `timeout`.
    pub timeout_seconds: u64,
    /// Ownership lease of a running run.
    pub lease_seconds: u64,
}

impl Default for RunsConfig {
    fn default() -> Self {
        RunsConfig {
            timeout_seconds: 3600,
            lease_seconds: 30,
        }
    }
}

/// `lead.*`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeadConfig {
    /// The lead's model name; the first model when absent.
    pub model: Option<String>,
    /// Model calls before the lead must stop.
    pub max_turns: u32,
}

impl Default for LeadConfig {
    fn default() -> Self {
        LeadConfig {
            model: None,
            max_turns: 100,
        }
    }
}

/// `token_usage.*` (docs/api.md#token-usage-and-models).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TokenUsageConfig {
    /// Lead attribution of subagent usage and the token labels.
    pub enabled: bool,
}

impl Default for TokenUsageConfig {
    fn default() -> Self {
        TokenUsageConfig { enabled: true }
    }
}

/// `run_events.*` (docs/events.md#buffering-and-durability).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunEventsConfig {
    /// Whether usage is recorded in the journal.
    pub track_token_usage: bool,
    /// Longest trace content kept in an event, in bytes.
    pub max_trace_content: usize,
    /// Longest wait before buffered events are written.
    pub flush_interval_ms: u64,
}

impl Default for RunEventsConfig {
    fn default() -> Self {
        RunEventsConfig {
            track_token_usage: true,
            max_trace_content: 10_240,
            flush_interval_ms: 250,
        }
    }
}

/// `logging.*` (docs/operations.md#logging).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingConfig {
    /// A level or an env-filter directive such as `info,subflow=debug`.
    pub level: String,
    /// `logging.enhance.*`.
    pub enhance: LogEnhanceConfig,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            level: "info".to_owned(),
            enhance: LogEnhanceConfig::default(),
        }
    }
}

/// `logging.enhance.*`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogEnhanceConfig {
    /// Adds the trace id to every line.
    pub enabled: bool,
    /// `text` or `json`.
    pub format: LogFormat,
}

/// The enhanced log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `{time} - {target} - {LEVEL} - [trace_id=…] - {message}`.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `tracing.*` (docs/operations.md#langfuse-and-otlp).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracingConfig {
    /// The `env:` trace tag; the loader fills it from `$SUBFLOW_ENV`, else `$ENVIRONMENT`.
    pub environment: Option<String>,
    /// `tracing.langfuse.*`.
    pub langfuse: LangfuseConfig,
    /// `tracing.otlp.*`.
    pub otlp: OtlpConfig,
    /// Spans queued per exporter before new ones are dropped.
    pub queue_size: usize,
    /// Longest wait for one batch export.
    pub export_timeout_seconds: u64,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            environment: None,
            langfuse: LangfuseConfig::default(),
            otlp: OtlpConfig::default(),
            queue_size: 2048,
            export_timeout_seconds: 10,
        }
    }
}

/// `tracing.langfuse.*`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LangfuseConfig {
    /// Export traces to Langfuse.
    pub enabled: bool,
    /// The Langfuse host.
    pub base_url: String,
    /// Environment variable holding the public key.
    pub public_key_env: String,
    /// Environment variable holding the secret key.
    pub secret_key_env: String,
}

impl Default for LangfuseConfig {
    fn default() -> Self {
        LangfuseConfig {
            enabled: false,
            base_url: "https://cloud.langfuse.com".to_owned(),
            public_key_env: "LANGFUSE_PUBLIC_KEY".to_owned(),
            secret_key_env: "LANGFUSE_SECRET_KEY".to_owned(),
        }
    }
}

/// `tracing.otlp.*`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpConfig {
    /// OTLP/HTTP traces endpoint, used verbatim; no generic exporter when absent.
    pub endpoint: Option<String>,
    /// Extra request headers.
    pub headers: BTreeMap<String, String>,
}

/// `subagents.*`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubagentsConfig {
    /// Whether the lead gets the `task` tool.
    pub enabled: bool,
    /// Wall-clock limit of the built-in `general-purpose` subagent.
    pub timeout_seconds: u64,
    /// Task calls kept from one model response (1–4).
    pub max_concurrent: usize,
    /// Tasks per run (1–50).
    pub max_total_per_run: usize,
    /// Subagent types beside the built-in ones; one named `general-purpose` replaces it.
    pub definitions: Vec<SubagentDefinition>,
}

impl Default for SubagentsConfig {
    fn default() -> Self {
        SubagentsConfig {
            enabled: true,
            timeout_seconds: 1800,
            max_concurrent: 3,
            max_total_per_run: 6,
            definitions: Vec::new(),
        }
    }
}

/// One `[[models]]` entry (docs/configuration.md#models).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Unique name runs and subagents refer to.
    pub name: String,
    /// `scripted`, `openai` or `anthropic`.
    pub provider: Provider,
    /// The provider's model id; required for `openai` and `anthropic`.
    #[serde(default)]
    pub model: Option<String>,
    /// Shown by `GET /api/models`.
    #[serde(default)]
    pub display_name: Option<String>,
    /// Shown by `GET /api/models`.
    #[serde(default)]
    pub description: Option<String>,
    /// The API root; the provider's public API when absent.
    #[serde(default)]
    pub base_url: Option<String>,
    /// Environment variable holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Context window in tokens, for the context-usage display.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// Shown by `GET /api/models`.
    #[serde(default)]
    pub supports_thinking: bool,
    /// Shown by `GET /api/models`.
    #[serde(default)]
    pub supports_reasoning_effort: bool,
    /// Further attempts after a transient provider failure.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// A TOML or JSON script (scripted models only).
    #[serde(default)]
    pub script: Option<PathBuf>,
    /// Pause between streamed pieces of built-in answers (scripted models only).
    #[serde(default = "default_demo_delay_ms")]
    pub demo_delay_ms: u64,
    /// Prices for cost reporting (docs/usage-and-cost.md#cost).
    #[serde(default)]
    pub pricing: Option<Pricing>,
}

/// The model id of a scripted model that names none.
pub const SCRIPTED_MODEL_ID: &str = "scripted-1";

fn default_max_retries() -> u32 {
    2
}

fn default_demo_delay_ms() -> u64 {
    40
}

impl ModelConfig {
    /// The default model: scripted, named `scripted`, model id `scripted-1`.
    pub fn default_scripted() -> Self {
        ModelConfig::new("scripted", Provider::Scripted, Some(SCRIPTED_MODEL_ID))
    }

    /// An entry with every optional field at its default.
    pub fn new(name: &str, provider: Provider, model: Option<&str>) -> Self {
        ModelConfig {
            name: name.to_owned(),
            provider,
            model: model.map(str::to_owned),
            display_name: None,
            description: None,
            base_url: None,
            api_key_env: None,
            context_window: None,
            supports_thinking: false,
            supports_reasoning_effort: false,
            max_retries: default_max_retries(),
            script: None,
            demo_delay_ms: default_demo_delay_ms(),
            pricing: None,
        }
    }

    /// The provider's model id (`scripted-1` for a scripted model that names none).
    pub fn model_id(&self) -> &str {
        self.model.as_deref().unwrap_or(SCRIPTED_MODEL_ID)
    }
}

/// A model provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// Deterministic and offline.
    Scripted,
    /// An OpenAI-compatible Chat Completions endpoint.
    Openai,
    /// The Anthropic Messages API.
    Anthropic,
}

impl Provider {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Scripted => "scripted",
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
        }
    }
}

/// `models[].pricing` (docs/usage-and-cost.md#cost), prices per million tokens.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    /// ISO currency code, upper-cased.
    #[serde(default = "default_currency", deserialize_with = "upper_case")]
    pub currency: String,
    /// Price of uncached input.
    #[serde(default)]
    pub input_per_million: f64,
    /// Price of output.
    #[serde(default)]
    pub output_per_million: f64,
    /// Price of cached input; `input_per_million` when absent.
    #[serde(default)]
    pub input_cache_hit_per_million: Option<f64>,
    /// Price of input written to the cache; `input_per_million` when absent.
    #[serde(default)]
    pub input_cache_write_per_million: Option<f64>,
}

fn default_currency() -> String {
    "USD".to_owned()
}

fn upper_case<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    String::deserialize(deserializer).map(|currency| currency.to_uppercase())
}

/// `subagent_batches.*` (docs/batches.md#configuration).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubagentBatchesConfig {
    /// Whether the lead gets the batch tools and a worker runs.
    pub enabled: bool,
    /// Item lease (10–3600).
    pub lease_seconds: u64,
    /// Worker poll interval (0.1–60).
    pub poll_interval_seconds: f64,
    /// Attempts per item (1–10).
    pub max_attempts: u32,
    /// Items per batch (1–100,000).
    pub max_items_per_batch: usize,
    /// Live items of a batch that sets none (1–10,000).
    pub default_max_live_items: usize,
    /// Ceiling of a batch's live items (1–100,000).
    pub max_live_items_per_batch: usize,
    /// Running items of a batch that sets none (1–64).
    pub default_max_running_items: usize,
    /// Ceiling of a batch's running items (1–1000).
    pub max_running_items_per_batch: usize,
    /// Stored result length cap (1,000–1,000,000).
    pub max_result_chars: usize,
    /// Result preview length (64–100,000).
    pub result_preview_max_chars: usize,
}

impl Default for SubagentBatchesConfig {
    fn default() -> Self {
        // The tools' limits default as the runtime's do: one source for both.
        let tool = subflow_runtime::runtime::BatchToolConfig::default();
        SubagentBatchesConfig {
            enabled: tool.enabled,
            lease_seconds: 120,
            poll_interval_seconds: 1.0,
            max_attempts: tool.max_attempts,
            max_items_per_batch: tool.max_items_per_batch,
            default_max_live_items: tool.default_max_live_items as usize,
            max_live_items_per_batch: tool.max_live_items_per_batch as usize,
            default_max_running_items: tool.default_max_running_items as usize,
            max_running_items_per_batch: tool.max_running_items_per_batch as usize,
            max_result_chars: 100_000,
            result_preview_max_chars: 2000,
        }
    }
}

/// `observers.*` (docs/events.md#webhooks).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObserversConfig {
    /// Webhooks that receive task start and stop events.
    pub webhooks: Vec<WebhookEntry>,
}

/// One `observers.webhooks` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookEntry {
    /// The `http` or `https` URL that receives the `POST`s.
    pub url: String,
    /// Environment variable holding the HMAC signing secret.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// Extra request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// `metrics.*` (docs/operations.md#metrics).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `GET /metrics`.
    pub enabled: bool,
    /// Serve it without `admin` in token mode.
    pub public: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            public: false,
        }
    }
}

/// `web.*`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    /// Serve the embedded web UI at `/`.
    pub enabled: bool,
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig { enabled: true }
    }
}

/// `tools.*` (docs/configuration.md#subagents-and-tools).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    /// Base of the thread workspaces; `<data dir>/workspaces` when absent.
    pub workspace_root: Option<PathBuf>,
}
