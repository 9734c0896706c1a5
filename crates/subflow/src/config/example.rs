//! The documented example printed by `subflow config default`. A test loads it back and
//! compares it with `Config::default()`, so it cannot drift from the defaults.

/// A `subflow.toml` that sets every key to its default, with one comment per key.
/// Optional keys without a default are shown commented out.
pub const EXAMPLE: &str = r#"# subflow.toml: the configuration of `subflow` (SPEC §1.2).
#
# Read from --config FILE, else $SUBFLOW_CONFIG, else ./subflow.toml; a missing
# ./subflow.toml means every default below. Later sources win:
#   this file < SUBFLOW__SECTION__KEY=value environment variables < command-line flags.
# Example: SUBFLOW__SUBAGENTS__MAX_CONCURRENT=2, SUBFLOW__TRACING__LANGFUSE__ENABLED=true.
# Secrets are never written here: keys ending in _env name environment variables.
# Every key takes effect at the next restart.

[server]
# Address the gateway listens on, HOST:PORT.
listen = "127.0.0.1:8001"
# Extra origins allowed by CORS and by the local-mode origin check.
cors_origins = []
# Connection timeouts, 1-86400 seconds, so slow or silent clients cannot hold
# connections: a connection with no request in flight is closed after
# idle_timeout_seconds; a request's headers must arrive within header_timeout_seconds
# of its first byte; its body within body_timeout_seconds of its headers (else 408).
# A long answer (an SSE stream, /join, /runs/wait) is never cut by them.
idle_timeout_seconds = 60
header_timeout_seconds = 10
body_timeout_seconds = 60

[auth]
# "local": every request is the user `default`; needs a loopback listen address.
# "token": requests need `Authorization: Bearer <token>` (see `subflow tokens`).
mode = "local"

[database]
# sqlite://PATH (one serve process) or postgres://USER@HOST:PORT/DB (many processes).
url = "sqlite://subflow.db"
# Connections in the pool.
max_connections = 10

[streams]
# Seconds a finished run's stream stays replayable.
retention_seconds = 3600
# Seconds between SSE heartbeats.
heartbeat_seconds = 15

[runs]
# A run running longer than this ends with status `timeout`.
timeout_seconds = 3600
# Seconds a process holds a running run before another may take it over.
lease_seconds = 30

[lead]
# The lead agent's model, by name; the first [[models]] entry when unset.
# model = "scripted"
# Model calls before the lead must answer.
max_turns = 100

[token_usage]
# Attribute subagent usage to the lead's task calls and show token labels.
enabled = true

[run_events]
# Record token usage in the run journal.
track_token_usage = true
# Longest trace content kept in one event, in bytes.
max_trace_content = 10240
# Milliseconds buffered events may wait before they are written.
flush_interval_ms = 250

[logging]
# Log level or filter directive, e.g. "info" or "info,subflow=debug".
level = "info"

[logging.enhance]
# Add the request trace id to every log line.
enabled = false
# "text" or "json" (one object per line).
format = "text"

[tracing]
# The env:<environment> trace tag; defaults to $SUBFLOW_ENV, else $ENVIRONMENT.
# environment = "production"
# Spans queued per exporter; spans beyond it are dropped and counted.
queue_size = 2048
# Seconds one batch export may take.
export_timeout_seconds = 10

[tracing.langfuse]
# Export traces to Langfuse ($LANGFUSE_TRACING also sets this).
enabled = false
# The Langfuse host ($LANGFUSE_BASE_URL also sets this).
base_url = "https://cloud.langfuse.com"
# Environment variable holding the Langfuse public key.
public_key_env = "LANGFUSE_PUBLIC_KEY"
# Environment variable holding the Langfuse secret key.
secret_key_env = "LANGFUSE_SECRET_KEY"

[tracing.otlp]
# OTLP/HTTP traces endpoint, used verbatim (include /v1/traces); unset: no exporter.
# endpoint = "http://127.0.0.1:4318/v1/traces"
# Extra headers sent with every export.
headers = {}

[subagents]
# Give the lead the `task` tool.
enabled = true
# Wall-clock limit of one built-in general-purpose execution, in seconds.
timeout_seconds = 1800
# Task calls kept from one model response (1-4).
max_concurrent = 3
# Tasks per run (1-50).
max_total_per_run = 6
# Subagent types beside the built-in general-purpose, one table each (none by default);
# one named "general-purpose" replaces the built-in.
# [[subagents.definitions]]
# name = "researcher"               # the subagent_type the lead asks for
# description = "Finds sources."     # shown to the lead
# system_prompt = "You research."    # the subagent's system prompt
# model = "scripted"                 # a [[models]] name; the lead's when unset
# tools = ["ls", "read_file"]        # built-in tools; all of them when unset
# max_turns = 50                     # model calls before it must answer
# timeout_seconds = 600              # wall-clock limit of one execution

[subagent_runtime]
# Subagent executions (tasks and batch items) running at once in this process (1-64).
max_running = 3
# Executions waiting for a slot (0-10000).
max_queued = 64
# "queue" waits for a slot in order; "reject" fails at once when all are busy.
admission_policy = "queue"
# Longest wait for a slot, in seconds.
queue_timeout_seconds = 300

# Models; the first is the default. provider: "scripted" | "openai" | "anthropic".
[[models]]
# Unique name that runs, lead.model and subagents refer to.
name = "scripted"
# scripted: deterministic and offline; openai: Chat Completions; anthropic: Messages.
provider = "scripted"
# The provider's model id; required for openai and anthropic.
model = "scripted-1"
# Shown by GET /api/models.
# display_name = "Scripted demo"
# Shown by GET /api/models.
# description = "Deterministic, offline"
# API root; the provider's public API when unset.
# base_url = "https://api.openai.com/v1"
# Environment variable holding the API key.
# api_key_env = "OPENAI_API_KEY"
# Context window in tokens, for the context-usage display.
# context_window = 128000
# Shown by GET /api/models.
supports_thinking = false
# Shown by GET /api/models.
supports_reasoning_effort = false
# Further attempts after a connection error, HTTP 429 or 5xx.
max_retries = 2
# A TOML or JSON script of canned answers (scripted models only).
# script = "script.toml"
# Milliseconds between streamed pieces of built-in answers (scripted models only).
demo_delay_ms = 40
# Prices per million tokens, for cost reporting.
# [models.pricing]
# currency = "USD"                    # upper-cased
# input_per_million = 2.5             # uncached input
# output_per_million = 10.0           # output
# input_cache_hit_per_million = 1.25  # cached input; input_per_million when unset

[loop_detection]
# Attach a loop detector to the lead and every subagent execution.
enabled = true
# Identical tool-call sets in the window that queue a warning.
warn_threshold = 3
# Identical tool-call sets in the window that force a final answer (>= warn_threshold).
hard_limit = 5
# Model responses remembered for identical-call detection.
window_size = 20
# Threads whose detector state is kept (least recently used evicted).
max_tracked_threads = 100
# Calls of one tool that queue a warning.
tool_freq_warn = 30
# Calls of one tool that force a final answer (>= tool_freq_warn).
tool_freq_hard_limit = 50
# Per-tool thresholds, e.g. { bash = { warn = 10, hard_limit = 20 } }.
tool_freq_overrides = {}

[token_budget]
# Enforce a token budget per run and per subagent execution.
enabled = false
# Limit on input plus output tokens (>= 1000).
max_tokens = 200000
# Optional limit on input tokens.
# max_input_tokens = 150000
# Optional limit on output tokens.
# max_output_tokens = 50000
# Fraction of a limit that queues a warning.
warn_threshold = 0.8
# Fraction of a limit that forces a final answer (>= warn_threshold).
hard_stop_threshold = 1.0

[subagent_batches]
# Give the lead the batch tools and run a batch worker.
enabled = true
# Seconds a worker holds an item lease (10-3600).
lease_seconds = 120
# Seconds between worker polls (0.1-60).
poll_interval_seconds = 1.0
# Attempts per item (1-10).
max_attempts = 3
# Items per batch (1-100000).
max_items_per_batch = 5000
# Live items of a batch that sets none (1-10000, <= max_live_items_per_batch).
default_max_live_items = 100
# Ceiling of a batch's live items (1-100000).
max_live_items_per_batch = 1000
# Running items of a batch that sets none (1-64, <= max_running_items_per_batch and
# <= default_max_live_items).
default_max_running_items = 3
# Ceiling of a batch's running items (1-1000).
max_running_items_per_batch = 64
# Characters of an item result kept (1000-1000000).
max_result_chars = 100000
# Characters of the result preview (64-100000, <= max_result_chars).
result_preview_max_chars = 2000

# Webhooks that receive a POST on every task start and stop, one table each (none by
# default).
# [[observers.webhooks]]
# url = "https://example.com/hooks/subflow"   # http or https
# secret_env = "SUBFLOW_WEBHOOK_SECRET"       # HMAC-SHA256 key; unsigned when unset
# headers = { "X-Team" = "agents" }           # extra request headers

[metrics]
# Serve Prometheus metrics at GET /metrics.
enabled = true
# Serve them without the admin permission in token mode.
public = false

[web]
# Serve the web UI at /.
enabled = true

[tools]
# Base directory of thread workspaces; <dir of the SQLite file>/workspaces when unset.
# workspace_root = "/var/lib/subflow/workspaces"
# Add the `bash` tool and subagent, running commands on this host.
allow_host_bash = false
"#;
