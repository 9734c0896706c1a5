//! The configuration (docs/configuration.md#sources): defaults, layering, validation messages that name the
//! key, model building, and `subflow config default|check` with their exit codes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

// The binary has no library target, so its configuration module is compiled into this
// test crate as well and tested through the same API `serve` calls.
#[path = "../../src/config/mod.rs"]
mod api;

use api::{AuthMode, Config, LogFormat, ModelConfig, Provider};

/// A temporary directory holding a `subflow.toml` with `text`.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new(text: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("subflow.toml"), text).unwrap();
        Fixture { dir }
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("subflow.toml")
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn load(&self, env: &[(&str, &str)], overrides: &[(&str, &str)]) -> Result<Config, String> {
        Config::load(Some(&self.file()), &env_map(env), overrides).map_err(|e| e.to_string())
    }
}

fn env_map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Loads `text` as the whole file and returns the error, which must start with the
/// file's name and contain `expected`.
fn check_error(text: &str, expected: &str) {
    let fixture = Fixture::new(text);
    let error = fixture
        .load(&[], &[])
        .expect_err(&format!("{text:?} should be rejected"));
    let prefix = format!("{}: ", fixture.file().display());
    assert!(
        error.starts_with(&prefix),
        "{error:?} should start with {prefix:?}"
    );
    assert!(
        error.contains(expected),
        "{error:?} should contain {expected:?}"
    );
}

fn subflow(args: &[&str], dir: &Path, env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_subflow"));
    command
        .args(args)
        .current_dir(dir)
        .env_remove("SUBFLOW_CONFIG");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SUBFLOW__") {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    command.output().expect("the subflow binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_defaults_are_those_of_the_spec() {
    let config = Config::default();
    assert_eq!(config.server.listen, "127.0.0.1:8001");
    assert!(config.server.cors_origins.is_empty());
    assert_eq!(
        (
            config.server.idle_timeout_seconds,
            config.server.header_timeout_seconds,
            config.server.body_timeout_seconds
        ),
        (60, 10, 60)
    );
    assert_eq!(config.auth.mode, AuthMode::Local);
    assert_eq!(config.database.url, "sqlite://subflow.db");
    assert_eq!(config.database.max_connections, 10);
    assert_eq!(
        (
            config.streams.retention_seconds,
            config.streams.heartbeat_seconds
        ),
        (3600, 15)
    );
    assert_eq!(
        (config.runs.timeout_seconds, config.runs.lease_seconds),
        (3600, 30)
    );
    assert_eq!(
        (config.lead.model.as_deref(), config.lead.max_turns),
        (None, 100)
    );
    assert!(config.token_usage.enabled);
    assert!(config.run_events.track_token_usage);
    assert_eq!(config.run_events.max_trace_content, 10_240);
    assert_eq!(config.run_events.flush_interval_ms, 250);
    assert_eq!(config.logging.level, "info");
    assert!(!config.logging.enhance.enabled);
    assert_eq!(config.logging.enhance.format, LogFormat::Text);
    assert_eq!(config.tracing.environment, None);
    assert!(!config.tracing.langfuse.enabled);
    assert_eq!(
        config.tracing.langfuse.base_url,
        "https://cloud.langfuse.com"
    );
    assert_eq!(
        config.tracing.langfuse.public_key_env,
        "LANGFUSE_PUBLIC_KEY"
    );
    assert_eq!(
        config.tracing.langfuse.secret_key_env,
        "LANGFUSE_SECRET_KEY"
    );
    assert_eq!(config.tracing.otlp.endpoint, None);
    assert!(config.tracing.otlp.headers.is_empty());
    assert_eq!(
        (
            config.tracing.queue_size,
            config.tracing.export_timeout_seconds
        ),
        (2048, 10)
    );
    assert!(config.subagents.enabled);
    assert_eq!(config.subagents.timeout_seconds, 1800);
    assert_eq!(
        (
            config.subagents.max_concurrent,
            config.subagents.max_total_per_run
        ),
        (3, 6)
    );
    assert!(config.subagents.definitions.is_empty());
    assert_eq!(config.subagent_runtime.max_running, 3);
    assert_eq!(config.subagent_runtime.max_queued, 64);
    assert_eq!(config.subagent_runtime.queue_timeout_seconds, 300);
    assert_eq!(config.models, vec![ModelConfig::default_scripted()]);
    let model = &config.models[0];
    assert_eq!(
        (model.name.as_str(), model.provider, model.model_id()),
        ("scripted", Provider::Scripted, "scripted-1")
    );
    assert_eq!((model.max_retries, model.demo_delay_ms), (2, 40));
    assert!(!model.supports_thinking && !model.supports_reasoning_effort);
    assert!(config.loop_detection.enabled);
    assert!(!config.token_budget.enabled);
    let batches = &config.subagent_batches;
    assert!(batches.enabled);
    assert_eq!(batches.lease_seconds, 120);
    assert_eq!(batches.poll_interval_seconds, 1.0);
    assert_eq!(batches.max_attempts, 3);
    assert_eq!(batches.max_items_per_batch, 5000);
    assert_eq!(
        (
            batches.default_max_live_items,
            batches.max_live_items_per_batch
        ),
        (100, 1000)
    );
    assert_eq!(
        (
            batches.default_max_running_items,
            batches.max_running_items_per_batch
        ),
        (3, 64)
    );
    assert_eq!(
        (batches.max_result_chars, batches.result_preview_max_chars),
        (100_000, 2000)
    );
    assert!(config.observers.webhooks.is_empty());
    assert!(config.metrics.enabled && !config.metrics.public);
    assert!(config.web.enabled);
    assert_eq!(config.tools.workspace_root, None);
    assert_eq!(config.validate(), Ok(()));
}

#[test]
fn an_empty_file_gives_the_defaults() {
    let fixture = Fixture::new("");
    assert_eq!(fixture.load(&[], &[]), Ok(Config::default()));
}

#[test]
fn the_printed_example_loads_back_as_the_defaults() {
    let fixture = Fixture::new(api::EXAMPLE);
    assert_eq!(fixture.load(&[], &[]), Ok(Config::default()));
}

/// The example's commented-out subagent definition loads once uncommented, and says
/// "required" on exactly the keys whose removal makes it fail.
#[test]
fn the_example_definition_marks_its_required_keys() {
    let block: Vec<&str> = api::EXAMPLE
        .lines()
        .skip_while(|line| *line != "# [[subagents.definitions]]")
        .take_while(|line| line.starts_with("# "))
        .map(|line| &line[2..])
        .collect();
    assert!(block.len() > 3, "the example shows a definition");
    let load = |lines: &[&str]| Fixture::new(&(lines.join("\n") + "\n")).load(&[], &[]);
    assert!(load(&block).is_ok(), "{:?}", load(&block));
    for (index, line) in block.iter().enumerate().skip(1) {
        let mut without = block.clone();
        without.remove(index);
        assert_eq!(
            load(&without).is_err(),
            line.contains("required"),
            "{line}: marked required exactly when the definition needs it"
        );
    }
}

#[test]
fn every_key_is_documented_in_the_example() {
    // An unknown key makes serde list every key of its table: probe each table.
    let tables = [
        ("", ""),
        ("server", "[server]"),
        ("auth", "[auth]"),
        ("database", "[database]"),
        ("streams", "[streams]"),
        ("runs", "[runs]"),
        ("lead", "[lead]"),
        ("token_usage", "[token_usage]"),
        ("run_events", "[run_events]"),
        ("logging", "[logging]"),
        ("logging.enhance", "[logging.enhance]"),
        ("tracing", "[tracing]"),
        ("tracing.langfuse", "[tracing.langfuse]"),
        ("tracing.otlp", "[tracing.otlp]"),
        ("subagents", "[subagents]"),
        (
            "subagents.definitions[0]",
            "[[subagents.definitions]]\nname = 'x'",
        ),
        ("subagent_runtime", "[subagent_runtime]"),
        ("models[0]", "[[models]]\nname = 'x'\nprovider = 'scripted'"),
        (
            "models[0].pricing",
            "[[models]]\nname = 'x'\nprovider = 'scripted'\n[models.pricing]",
        ),
        ("loop_detection", "[loop_detection]"),
        ("token_budget", "[token_budget]"),
        ("budgets", "[budgets]"),
        ("subagent_batches", "[subagent_batches]"),
        ("observers", "[observers]"),
        ("observers.webhooks[0]", "[[observers.webhooks]]\nurl = 'x'"),
        ("metrics", "[metrics]"),
        ("web", "[web]"),
        ("tools", "[tools]"),
    ];
    let documented = documented_keys(api::EXAMPLE);
    for (path, header) in tables {
        let error = Fixture::new(&format!("{header}\nzz_probe = 1\n"))
            .load(&[], &[])
            .unwrap_err();
        let expected = error
            .split("expected ")
            .nth(1)
            .unwrap_or_else(|| panic!("{path}: {error}"));
        let keys: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        assert!(!keys.is_empty(), "{path}: {error}");
        for key in keys {
            let dotted = match path.replace("[0]", "") {
                table if table.is_empty() => key.to_owned(),
                table => format!("{table}.{key}"),
            };
            assert!(
                documented.contains(&dotted),
                "{dotted} is not documented in the example"
            );
        }
    }
}

/// The dotted keys and tables the example shows, commented out or not.
fn documented_keys(example: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut table = String::new();
    for line in example.lines() {
        let line = line.trim_start_matches(['#', ' ']);
        if line.starts_with('[') {
            table = line
                .split(']')
                .next()
                .unwrap()
                .trim_start_matches('[')
                .to_owned();
            let mut prefix = String::new();
            for part in table.split('.') {
                prefix = if prefix.is_empty() {
                    part.to_owned()
                } else {
                    format!("{prefix}.{part}")
                };
                keys.push(prefix.clone());
            }
        } else if let Some((key, _)) = line.split_once(" = ")
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            keys.push(format!("{table}.{key}"));
        }
    }
    keys
}

#[test]
fn environment_overrides_the_file_and_flags_override_both() {
    let fixture = Fixture::new(
        "[database]\nurl = 'sqlite://file.db'\nmax_connections = 5\n\
         [subagents]\nmax_concurrent = 2\nmax_total_per_run = 4\n",
    );
    let config = fixture
        .load(
            &[
                ("SUBFLOW__DATABASE__URL", "sqlite://env.db"),
                ("SUBFLOW__DATABASE__MAX_CONNECTIONS", "7"),
                ("SUBFLOW__SUBAGENTS__MAX_CONCURRENT", "4"),
                ("SUBFLOW__TRACING__LANGFUSE__ENABLED", "true"),
                ("SUBFLOW__SERVER__CORS_ORIGINS", r#"["http://a.test"]"#),
            ],
            &[
                ("database.url", "sqlite://flag.db"),
                ("server.listen", "localhost:9000"),
            ],
        )
        .unwrap();
    assert_eq!(config.database.url, "sqlite://flag.db");
    assert_eq!(config.database.max_connections, 7);
    assert_eq!(config.subagents.max_concurrent, 4);
    assert_eq!(config.subagents.max_total_per_run, 4);
    assert!(config.tracing.langfuse.enabled);
    assert_eq!(config.server.cors_origins, ["http://a.test"]);
    assert_eq!(config.server.listen, "localhost:9000");
}

#[test]
fn the_file_comes_from_the_flag_else_subflow_config_else_the_working_directory() {
    let flagged = Fixture::new("[lead]\nmax_turns = 1\n");
    let named = Fixture::new("[lead]\nmax_turns = 2\n");
    let env = env_map(&[("SUBFLOW_CONFIG", named.file().to_str().unwrap())]);
    let config = Config::load(Some(&flagged.file()), &env, &[]).unwrap();
    assert_eq!(config.lead.max_turns, 1);
    let config = Config::load(None, &env, &[]).unwrap();
    assert_eq!(config.lead.max_turns, 2);

    let missing = flagged.dir.path().join("missing.toml");
    let error = Config::load(Some(&missing), &HashMap::new(), &[]).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("cannot read the configuration file"),
        "{error}"
    );
    let env = env_map(&[("SUBFLOW_CONFIG", missing.to_str().unwrap())]);
    assert!(Config::load(None, &env, &[]).is_err());
}

#[test]
fn override_text_that_looks_like_a_number_can_still_be_a_string() {
    let fixture = Fixture::new("[[models]]\nname = '4'\nprovider = 'scripted'\n");
    let config = fixture.load(&[("SUBFLOW__LEAD__MODEL", "4")], &[]).unwrap();
    assert_eq!(config.lead.model.as_deref(), Some("4"));
    let error = fixture
        .load(&[("SUBFLOW__LEAD__MAX_TURNS", "-1")], &[])
        .unwrap_err();
    assert!(
        error.starts_with("SUBFLOW__LEAD__MAX_TURNS: lead.max_turns: invalid value: integer `-1`"),
        "{error}"
    );
}

#[test]
fn overrides_reach_into_tables_of_a_list_by_position() {
    let fixture = Fixture::new("[[models]]\nname = 'a'\nprovider = 'scripted'\n");
    let config = fixture
        .load(&[("SUBFLOW__MODELS__0__DEMO_DELAY_MS", "0")], &[])
        .unwrap();
    assert_eq!(config.models[0].demo_delay_ms, 0);
    let error = fixture
        .load(&[("SUBFLOW__MODELS__1__DEMO_DELAY_MS", "0")], &[])
        .unwrap_err();
    assert!(
        error.starts_with("SUBFLOW__MODELS__1__DEMO_DELAY_MS: cannot set models.1.demo_delay_ms: models is a list of 1"),
        "{error}"
    );
    let fixture = Fixture::new("[server]\nlisten = '127.0.0.1:1'\n");
    let error = fixture
        .load(&[("SUBFLOW__SERVER__LISTEN__PORT", "1")], &[])
        .unwrap_err();
    assert_eq!(
        error,
        "SUBFLOW__SERVER__LISTEN__PORT: cannot set server.listen.port: server.listen is not a table"
    );
}

#[test]
fn the_environment_tag_defaults_to_subflow_env_then_environment() {
    let fixture = Fixture::new("");
    let config = fixture
        .load(&[("SUBFLOW_ENV", "staging"), ("ENVIRONMENT", "prod")], &[])
        .unwrap();
    assert_eq!(config.tracing.environment.as_deref(), Some("staging"));
    let config = fixture.load(&[("ENVIRONMENT", "prod")], &[]).unwrap();
    assert_eq!(config.tracing.environment.as_deref(), Some("prod"));
    let fixture = Fixture::new("[tracing]\nenvironment = 'file'\n");
    let config = fixture.load(&[("SUBFLOW_ENV", "staging")], &[]).unwrap();
    assert_eq!(config.tracing.environment.as_deref(), Some("file"));
}

#[test]
fn langfuse_variables_are_honoured_below_subflow_variables() {
    let fixture = Fixture::new("");
    let config = fixture
        .load(
            &[
                ("LANGFUSE_TRACING", "true"),
                ("LANGFUSE_BASE_URL", "https://eu.langfuse.test"),
            ],
            &[],
        )
        .unwrap();
    assert!(config.tracing.langfuse.enabled);
    assert_eq!(config.tracing.langfuse.base_url, "https://eu.langfuse.test");
    let config = fixture
        .load(
            &[
                ("LANGFUSE_TRACING", "true"),
                ("SUBFLOW__TRACING__LANGFUSE__ENABLED", "false"),
            ],
            &[],
        )
        .unwrap();
    assert!(!config.tracing.langfuse.enabled);
    let error = fixture
        .load(&[("LANGFUSE_TRACING", "maybe")], &[])
        .unwrap_err();
    assert!(
        error.starts_with("LANGFUSE_TRACING: must be true or false"),
        "{error}"
    );
}

#[test]
fn unknown_keys_are_rejected_with_their_dotted_path() {
    check_error(
        "[subagents]\nmax_concurent = 3\n",
        "subagents.max_concurent: unknown field `max_concurent`, expected one of",
    );
    check_error("[serve]\n", "serve: unknown field `serve`");
    check_error(
        "[tracing.langfuse]\nenable = true\n",
        "tracing.langfuse.enable: unknown field",
    );
    check_error(
        "[[models]]\nname = 'a'\nprovider = 'scripted'\ntemperature = 1\n",
        "models[0].temperature: unknown field",
    );
    check_error(
        "[loop_detection]\nwarn = 3\n",
        "loop_detection.warn: unknown field `warn`",
    );
    check_error(
        "[loop_detection.tool_freq_overrides.bash]\nwarning = 3\n",
        "loop_detection.tool_freq_overrides.bash.warning: unknown field",
    );
    check_error(
        "[token_budget]\nmax = 3\n",
        "token_budget.max: unknown field",
    );
    // Host commands are not offered: a configuration asking for them is refused, not
    // silently ignored.
    check_error(
        "[tools]\nallow_host_bash = true\n",
        "tools.allow_host_bash: unknown field `allow_host_bash`, expected `workspace_root`",
    );
    let error = Fixture::new("")
        .load(&[("SUBFLOW__SERVER__LISTN", "x")], &[])
        .unwrap_err();
    assert!(
        error.starts_with("SUBFLOW__SERVER__LISTN: server.listn: unknown field"),
        "{error}"
    );
    let error = Fixture::new("")
        .load(&[("SUBFLOW__SERVER____LISTEN", "x")], &[])
        .unwrap_err();
    assert!(error.contains("SUBFLOW__SECTION__KEY"), "{error}");
}

#[test]
fn wrong_types_and_missing_fields_name_the_key() {
    check_error(
        "[database]\nmax_connections = 'ten'\n",
        "database.max_connections: invalid type: string \"ten\"",
    );
    check_error(
        "[[models]]\nname = 'a'\n",
        "models[0].provider: missing field `provider`",
    );
    check_error(
        "[[models]]\nname = 'a'\nprovider = 'gemini'\n",
        "models[0].provider: unknown variant `gemini`",
    );
    check_error(
        "[auth]\nmode = 'open'\n",
        "auth.mode: unknown variant `open`",
    );
    check_error("server = 1\n", "server: invalid type");
    check_error("[server\n", "TOML parse error at line 1");
}

#[test]
fn each_validation_rule_names_its_key() {
    for (text, expected) in [
        (
            "[subagents]\nmax_concurrent = 9\n",
            "subagents.max_concurrent must be between 1 and 4, got 9",
        ),
        (
            "[subagents]\nmax_concurrent = 0\n",
            "subagents.max_concurrent must be between 1 and 4, got 0",
        ),
        (
            "[subagents]\nmax_total_per_run = 51\n",
            "subagents.max_total_per_run must be between 1 and 50, got 51",
        ),
        (
            "[subagents]\ntimeout_seconds = 0\n",
            "subagents.timeout_seconds must be at least 1, got 0",
        ),
        (
            "[subagent_runtime]\nmax_running = 65\n",
            "subagent_runtime.max_running must be between 1 and 64, got 65",
        ),
        (
            "[subagent_runtime]\nmax_queued = 10001\n",
            "subagent_runtime.max_queued must be between 0 and 10000, got 10001",
        ),
        (
            "[loop_detection]\nwarn_threshold = 6\n",
            "loop_detection.hard_limit (5) must be >= loop_detection.warn_threshold (6)",
        ),
        (
            "[token_budget]\nmax_tokens = 10\n",
            "token_budget.max_tokens (10) must be >= 1000",
        ),
        (
            "[subagent_batches]\nlease_seconds = 5\n",
            "subagent_batches.lease_seconds must be between 10 and 3600, got 5",
        ),
        (
            "[subagent_batches]\npoll_interval_seconds = 0.05\n",
            "subagent_batches.poll_interval_seconds must be between 0.1 and 60, got 0.05",
        ),
        (
            "[subagent_batches]\nmax_attempts = 11\n",
            "subagent_batches.max_attempts must be between 1 and 10, got 11",
        ),
        (
            "[subagent_batches]\nmax_items_per_batch = 0\n",
            "subagent_batches.max_items_per_batch must be between 1 and 100000, got 0",
        ),
        (
            "[subagent_batches]\ndefault_max_live_items = 500\nmax_live_items_per_batch = 400\n",
            "subagent_batches.default_max_live_items (500) must be <= subagent_batches.max_live_items_per_batch (400)",
        ),
        (
            "[subagent_batches]\ndefault_max_running_items = 50\nmax_running_items_per_batch = 40\n",
            "subagent_batches.default_max_running_items (50) must be <= subagent_batches.max_running_items_per_batch (40)",
        ),
        (
            "[subagent_batches]\ndefault_max_running_items = 10\ndefault_max_live_items = 5\n",
            "subagent_batches.default_max_running_items (10) must be <= subagent_batches.default_max_live_items (5)",
        ),
        (
            "[subagent_batches]\nmax_result_chars = 4000\nresult_preview_max_chars = 5000\n",
            "subagent_batches.result_preview_max_chars (5000) must be <= subagent_batches.max_result_chars (4000)",
        ),
        (
            "[subagent_batches]\nmax_result_chars = 999\n",
            "subagent_batches.max_result_chars must be between 1000 and 1000000, got 999",
        ),
        ("models = []\n", "models must list at least one model"),
        (
            "[[models]]\nname = 'a'\nprovider = 'scripted'\n[[models]]\nname = 'a'\nprovider = 'scripted'\n",
            "models[1].name \"a\" is already used by models[0]",
        ),
        (
            "[[models]]\nname = 'gpt'\nprovider = 'openai'\n",
            "models[0].model is required for provider openai",
        ),
        (
            "[[models]]\nname = 'claude'\nprovider = 'anthropic'\n",
            "models[0].model is required for provider anthropic",
        ),
        (
            "[[models]]\nname = 'gpt'\nprovider = 'openai'\nmodel = 'gpt-4o'\nscript = 'a.toml'\n",
            "models[0].script is only for scripted models, not provider openai",
        ),
        (
            "[[models]]\nname = 'a'\nprovider = 'scripted'\n[models.pricing]\ninput_per_million = -1.0\n",
            "models[0].pricing.input_per_million must be a number >= 0, got -1",
        ),
        (
            "[[models]]\nname = 'a'\nprovider = 'scripted'\n[models.pricing]\ninput_per_million = 1.0\ninput_cache_write_per_million = -0.5\n",
            "models[0].pricing.input_cache_write_per_million must be a number >= 0, got -0.5",
        ),
        (
            "[lead]\nmodel = 'gpt'\n",
            "lead.model \"gpt\" names no configured model; use one of: scripted",
        ),
        (
            "[budgets]\nrun_max_cost = 0.0\n",
            "budgets.run_max_cost (0) must be > 0",
        ),
        (
            "[budgets]\nwarn_fractions = [0.9, 0.8]\n",
            "budgets.warn_fractions ([0.9, 0.8]) must ascend, each above 0 and below 1",
        ),
        (
            "[budgets]\nthread_max_cost = 1.0\n[[models]]\nname = 'a'\nprovider = 'scripted'\n[models.pricing]\ninput_per_million = 1.0\n[[models]]\nname = 'b'\nprovider = 'scripted'\n[models.pricing]\ncurrency = 'EUR'\ninput_per_million = 1.0\n",
            "budgets: amounts are in one currency, but the models are priced in EUR and USD; price every model in one currency",
        ),
        (
            "[server]\nlisten = '0.0.0.0:8001'\n",
            "auth.mode=local requires a loopback listen address",
        ),
        (
            "[server]\nlisten = '8001'\n",
            "server.listen must be HOST:PORT",
        ),
        (
            "[server]\nheader_timeout_seconds = 0\n",
            "server.header_timeout_seconds must be between 1 and 86400, got 0",
        ),
        (
            "[database]\nmax_connections = 0\n",
            "database.max_connections must be at least 1, got 0",
        ),
        (
            "[[subagents.definitions]]\nname = 'r'\ndescription = 'd'\nsystem_prompt = 'p'\nmax_turns = 5\ntimeout_seconds = 60\nmodel = 'gpt'\n",
            "subagents.definitions[0].model \"gpt\" names no configured model",
        ),
        (
            "[[subagents.definitions]]\nname = 'r'\ndescription = 'd'\nsystem_prompt = 'p'\nmax_turns = 5\ntimeout_seconds = 60\ntools = ['ls', 'task']\n",
            "subagents.definitions[0].tools must not include task",
        ),
        (
            "[[subagents.definitions]]\nname = 'r'\ndescription = 'd'\nsystem_prompt = 'p'\nmax_turns = 0\ntimeout_seconds = 60\n",
            "subagents.definitions[0].max_turns must be at least 1, got 0",
        ),
        (
            "[[subagents.definitions]]\nname = 'r'\ndescription = 'd'\nsystem_prompt = 'p'\nmax_turns = 5\ntimeout_seconds = 60\n\
             [[subagents.definitions]]\nname = 'r'\ndescription = 'd'\nsystem_prompt = 'p'\nmax_turns = 5\ntimeout_seconds = 60\n",
            "subagents.definitions[1].name \"r\" is already used by subagents.definitions[0]",
        ),
    ] {
        check_error(text, expected);
    }
}

#[test]
fn the_local_mode_message_is_exact_and_token_mode_may_listen_anywhere() {
    let error = Config::load(
        Some(&Fixture::new("").file()),
        &HashMap::new(),
        &[("server.listen", "0.0.0.0:8001")],
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "command line: auth.mode=local requires a loopback listen address"
    );
    let fixture = Fixture::new("[auth]\nmode = 'token'\n[server]\nlisten = '0.0.0.0:8001'\n");
    assert_eq!(fixture.load(&[], &[]).unwrap().auth.mode, AuthMode::Token);
}

#[test]
fn a_value_set_by_a_variable_is_blamed_on_the_variable() {
    let fixture = Fixture::new("[subagents]\nmax_concurrent = 2\n");
    let error = fixture
        .load(&[("SUBFLOW__SUBAGENTS__MAX_CONCURRENT", "9")], &[])
        .unwrap_err();
    assert_eq!(
        error,
        "SUBFLOW__SUBAGENTS__MAX_CONCURRENT: subagents.max_concurrent must be between 1 and 4, got 9"
    );
}

#[test]
fn pricing_currency_defaults_to_usd_and_is_upper_cased() {
    let fixture = Fixture::new(
        "[[models]]\nname = 'a'\nprovider = 'scripted'\n[models.pricing]\ninput_per_million = 1.0\n\
         [[models]]\nname = 'b'\nprovider = 'scripted'\n[models.pricing]\ncurrency = 'eur'\n",
    );
    let config = fixture.load(&[], &[]).unwrap();
    let currencies: Vec<&str> = config
        .models
        .iter()
        .map(|m| m.pricing.as_ref().unwrap().currency.as_str())
        .collect();
    assert_eq!(currencies, ["USD", "EUR"]);
}

#[test]
fn models_are_built_with_the_lead_first_and_keys_from_the_environment() {
    let fixture = Fixture::new(
        "[lead]\nmodel = 'claude'\n\
         [[models]]\nname = 'demo'\nprovider = 'scripted'\n\
         [[models]]\nname = 'gpt'\nprovider = 'openai'\nmodel = 'gpt-4o'\napi_key_env = 'TEST_OPENAI_KEY'\n\
         [[models]]\nname = 'claude'\nprovider = 'anthropic'\nmodel = 'claude-x'\nbase_url = 'http://127.0.0.1:9/v1'\n",
    );
    let env = env_map(&[("TEST_OPENAI_KEY", "sk-test")]);
    let built = api::load_and_build(Some(&fixture.file()), &env, &[]).unwrap();
    let infos: Vec<(&str, &str, &str)> = built
        .models
        .iter()
        .map(|m| {
            let info = m.info();
            (info.name.as_str(), info.model.as_str(), info.provider)
        })
        .collect();
    assert_eq!(
        infos,
        [
            ("claude", "claude-x", "anthropic"),
            ("demo", "scripted-1", "scripted"),
            ("gpt", "gpt-4o", "openai"),
        ]
    );
    assert_eq!(built.config.lead_model().name, "claude");

    let error = api::build_models(&built.config, &HashMap::new()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "models[1].api_key_env names TEST_OPENAI_KEY, which is not set: export it or remove api_key_env"
    );
}

#[test]
fn a_script_that_does_not_parse_is_a_config_error_with_file_and_line() {
    let fixture = Fixture::new("");
    let script = fixture.write("bad.toml", "[[rules]]\nagent = 'lead_agent'\nturns = [\n");
    std::fs::write(
        fixture.file(),
        format!(
            "[[models]]\nname = 's'\nprovider = 'scripted'\nscript = '{}'\n",
            script.display()
        ),
    )
    .unwrap();
    let error = api::load_and_build(Some(&fixture.file()), &HashMap::new(), &[]).unwrap_err();
    let message = error.to_string();
    let location = format!("models[0].script: {}:", script.display());
    assert!(message.starts_with(&location), "{message}");
    assert!(
        message[location.len()..].starts_with(|c: char| c.is_ascii_digit()),
        "{message} names the line"
    );
}

#[test]
fn webhook_secrets_come_from_the_environment_and_urls_are_checked() {
    let fixture = Fixture::new(
        "[[observers.webhooks]]\nurl = 'https://hooks.test/x'\nsecret_env = 'HOOK_KEY'\n",
    );
    let env = env_map(&[("HOOK_KEY", "s3cret")]);
    let built = api::load_and_build(Some(&fixture.file()), &env, &[]).unwrap();
    let observers = format!("{:?}", built.observers);
    assert!(
        observers.contains("https://hooks.test/x") && observers.contains("signed: true"),
        "{observers}"
    );
    assert!(!observers.contains("s3cret"), "{observers}");
    let error = api::load_and_build(Some(&fixture.file()), &HashMap::new(), &[]).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("observers.webhooks[0].secret_env names HOOK_KEY, which is not set"),
        "{error}"
    );
    let fixture = Fixture::new("[[observers.webhooks]]\nurl = 'ftp://hooks.test/x'\n");
    let error = api::load_and_build(Some(&fixture.file()), &HashMap::new(), &[]).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("observers.webhooks[0]: invalid webhook URL"),
        "{error}"
    );
}

#[test]
fn span_exporters_follow_tracing_with_langfuse_keys_from_the_environment() {
    let none = api::load_and_build(None, &HashMap::new(), &[]).unwrap();
    assert!(none.exporters.is_empty(), "export is off by default");

    let fixture = Fixture::new(
        "[tracing]\nqueue_size = 16\nexport_timeout_seconds = 3\n[tracing.otlp]\nendpoint = 'http://127.0.0.1:4318/v1/traces'\nheaders = { 'x-team' = 'agents' }\n",
    );
    // LANGFUSE_TRACING and LANGFUSE_BASE_URL are honoured (docs/configuration.md#sources).
    let env = env_map(&[
        ("LANGFUSE_TRACING", "true"),
        ("LANGFUSE_BASE_URL", "https://lf.example"),
        ("LANGFUSE_PUBLIC_KEY", "pk-1"),
        ("LANGFUSE_SECRET_KEY", "sk-very-secret"),
    ]);
    let built = api::load_and_build(Some(&fixture.file()), &env, &[]).unwrap();
    let names: Vec<&str> = built.exporters.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["langfuse", "otlp"]);
    let langfuse = &built.exporters[0];
    assert_eq!(
        langfuse.endpoint,
        "https://lf.example/api/public/otel/v1/traces"
    );
    assert_eq!(langfuse.queue_size, 16);
    assert_eq!(langfuse.export_timeout, std::time::Duration::from_secs(3));
    assert!(!format!("{langfuse:?}").contains("sk-very-secret"));
    let otlp = &built.exporters[1];
    assert_eq!(
        otlp.endpoint, "http://127.0.0.1:4318/v1/traces",
        "used verbatim"
    );
    assert_eq!(otlp.headers, [("x-team".to_owned(), "agents".to_owned())]);

    let error = api::load_and_build(None, &env_map(&[("LANGFUSE_TRACING", "1")]), &[]).unwrap_err();
    assert!(
        error.to_string().starts_with(
            "tracing.langfuse.public_key_env names LANGFUSE_PUBLIC_KEY, which is not set"
        ),
        "{error}"
    );
    let fixture = Fixture::new("[tracing.otlp]\nendpoint = 'collector:4318'\n");
    let error = api::load_and_build(Some(&fixture.file()), &HashMap::new(), &[]).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("tracing.otlp.endpoint: the endpoint must be an http:// or https:// URL"),
        "{error}"
    );
}

#[test]
fn the_runtime_configuration_follows_the_file() {
    let fixture = Fixture::new(
        "[lead]\nmax_turns = 7\n[subagents]\ntimeout_seconds = 99\nmax_concurrent = 2\n\
         [[subagents.definitions]]\nname = 'researcher'\ndescription = 'd'\nsystem_prompt = 'p'\nmax_turns = 5\ntimeout_seconds = 60\n\
         [run_events]\nflush_interval_ms = 100\n",
    );
    let config = fixture.load(&[], &[]).unwrap();
    let runtime = config.runtime_config(Path::new("/data"));
    assert_eq!(runtime.lead_max_turns, 7);
    assert_eq!(runtime.max_concurrent, 2);
    assert_eq!(runtime.flush_interval.as_millis(), 100);
    assert_eq!(runtime.workspace_root, Path::new("/data/workspaces"));
    let names: Vec<(&str, u64)> = runtime
        .definitions
        .iter()
        .map(|d| (d.name.as_str(), d.timeout_seconds))
        .collect();
    assert_eq!(names, [("general-purpose", 99), ("researcher", 60)]);

    let fixture = Fixture::new(
        "[tools]\nworkspace_root = '/w'\n\
         [[subagents.definitions]]\nname = 'general-purpose'\ndescription = 'd'\nsystem_prompt = 'p'\nmax_turns = 5\ntimeout_seconds = 60\n",
    );
    let runtime = fixture
        .load(&[], &[])
        .unwrap()
        .runtime_config(Path::new("."));
    assert_eq!(runtime.workspace_root, Path::new("/w"));
    assert_eq!(runtime.definitions.len(), 1);
    assert_eq!(runtime.definitions[0].max_turns, 5);
}

#[test]
fn config_default_prints_the_documented_example() {
    let dir = tempfile::tempdir().unwrap();
    let output = subflow(&["config", "default"], dir.path(), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(String::from_utf8(output.stdout).unwrap(), api::EXAMPLE);
}

#[test]
fn config_check_accepts_the_defaults_with_or_without_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let output = subflow(&["config", "check"], dir.path(), &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok\n");

    std::fs::write(dir.path().join("example.toml"), api::EXAMPLE).unwrap();
    let output = subflow(
        &["config", "check", "--config", "example.toml"],
        dir.path(),
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn the_readme_model_example_is_a_valid_priced_openai_model() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let (_, rest) = readme
        .split_once("```toml\n[[models]]")
        .expect("a [[models]] example");
    let (example, _) = rest.split_once("```").unwrap();
    let fixture = Fixture::new(&format!("[[models]]{example}"));

    let config = fixture.load(&[("OPENAI_API_KEY", "sk-test")], &[]).unwrap();
    let model = &config.models[0];
    assert_eq!(model.provider, Provider::Openai);
    assert_eq!(model.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
    let pricing = model.pricing.as_ref().expect("the example has prices");
    assert!(pricing.input_per_million > 0.0 && pricing.output_per_million > 0.0);

    let output = subflow(
        &["config", "check"],
        fixture.dir.path(),
        &[("OPENAI_API_KEY", "sk-test")],
    );
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn config_check_exits_2_with_the_file_and_key_of_an_invalid_value() {
    let fixture = Fixture::new("[subagents]\nmax_concurrent = 9\n");
    let output = subflow(&["config", "check"], fixture.dir.path(), &[]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert_eq!(
        stderr(&output).trim(),
        "subflow: subflow.toml: subagents.max_concurrent must be between 1 and 4, got 9"
    );
    assert!(output.stdout.is_empty());

    let output = subflow(
        &["config", "check"],
        fixture.dir.path(),
        &[
            ("SUBFLOW__SUBAGENTS__MAX_CONCURRENT", "2"),
            ("SUBFLOW__SERVER__LISTEN", "0.0.0.0:1"),
        ],
    );
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        stderr(&output).trim(),
        "subflow: SUBFLOW__SERVER__LISTEN: auth.mode=local requires a loopback listen address"
    );
}

#[test]
fn config_check_exits_2_on_a_missing_file_or_a_script_that_does_not_parse() {
    let fixture = Fixture::new("");
    let output = subflow(
        &["config", "check", "--config", "nowhere.toml"],
        fixture.dir.path(),
        &[],
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("nowhere.toml: cannot read the configuration file"),
        "{}",
        stderr(&output)
    );

    fixture.write(
        "script.toml",
        "[[rules]]\nagent = 'lead_agent'\ncontains = 3\n",
    );
    fixture.write(
        "subflow.toml",
        "[[models]]\nname = 's'\nprovider = 'scripted'\nscript = 'script.toml'\n",
    );
    let output = subflow(&["config", "check"], fixture.dir.path(), &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("models[0].script: script.toml:3"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn config_check_exits_2_on_an_unsupported_database_url() {
    let dir = tempfile::tempdir().unwrap();
    let output = subflow(
        &["config", "check"],
        dir.path(),
        &[("SUBFLOW__DATABASE__URL", "mysql://x")],
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("use sqlite://PATH"),
        "{}",
        stderr(&output)
    );
}
