//! The `subflow` binary: the command line and the composition root. It is the only
//! crate that reads configuration and the only one that picks a storage backend.
//!
//! # Map
//!
//! The binary: CLI (`commands/<noun>.rs`) and composition root. `config/` is the one
//! typed configuration tree (defaults → `subflow.toml` → `SUBFLOW__…` env → flags, merged
//! as TOML before deserialising so errors name the key; validation; building models and
//! observers); `storage.rs` picks the backend from `database.url`; `process.rs` is what
//! `serve` and `worker` share (the runtime's and the batch worker's options from the
//! configuration, the shutdown signal); `commands/serve.rs` maps the configuration onto
//! the gateway's `AppOptions` in one function (`app_options`: runtime, exporters, the
//! worker unless `--no-worker`) and runs the built `Application`; `commands/worker.rs` runs a worker alone and refuses anything but
//! PostgreSQL; `commands/bench/batches.rs` times the worker against the executor alone,
//! claim passes, and 1 against 3 worker processes; `commands/users.rs` and
//! `commands/tokens.rs` administer users and tokens in the configured database
//! (`commands/admin.rs` opens it, and never creates one: `commands/migrate.rs` does) and
//! generate tokens from the OS random source. `commands/tail/` (`subflow tail`: the
//! stream follower with reconnects and gap recovery, `board.rs` applying `task_card` to a
//! run's frames — or, for a run that had ended, to its state and task summaries, printed
//! once — a small SSE decoder), `commands/run.rs` (`subflow run`: a background run, then
//! a join and the answer, or `tail`'s follower streaming the lead's text to stdout and
//! the cards to stderr; Ctrl-C cancels the run), `commands/usage.rs` and
//! `commands/batches/` (`subflow batches`: `mod.rs` for list, show, export, pause,
//! resume, cancel and retry, `watch.rs` for the `indicatif` bar or JSON lines and the
//! exit codes 0/1/130, `summary.rs` the summary line's Rust port of
//! `web/assets/batches.mjs`) are HTTP clients of the gateway through `commands/client.rs`
//! (`SUBFLOW_URL`, `SUBFLOW_TOKEN`). The only crate that reads configuration or the
//! environment.

/// `print!` returning an `io::Result` instead of panicking, so a closed stdout
/// (`subflow … | head`) ends the command normally (see `exit_code`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        write!(stdout, $($arg)*).and_then(|()| stdout.flush())
    }};
}

/// `println!` returning an `io::Result`, as [`out!`] does.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, $($arg)*).and_then(|()| stdout.flush())
    }};
}

mod commands;
mod config;
mod logging;
mod process;
mod storage;

use std::process::ExitCode;

/// jemalloc gives freed memory back to the system after a second (its dirty pages decay
/// on a background thread; `dirty_decay_ms`, and the single arena `narenas:1`, are set
/// in `.cargo/config.toml`), where the system allocator kept what a long thread's or a
/// large batch's peak took for the life of the process; SQLite allocates through it too.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use clap::{Parser, Subcommand};

/// Exit code for usage and configuration errors (docs/operations.md#commands).
const EXIT_USAGE: u8 = 2;
/// Exit code for runtime errors.
const EXIT_RUNTIME: u8 = 1;

#[derive(Debug, Parser)]
#[command(
    name = "subflow",
    version,
    about = "Runtime and HTTP gateway for LLM agents that delegate work to subagents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Migrate the database and start the gateway.
    Serve(commands::serve::Args),
    /// Run a batch worker only (PostgreSQL only): lease and run durable batch items.
    Worker(commands::worker::Args),
    /// Start a run through the gateway and print its answer (SUBFLOW_URL, SUBFLOW_TOKEN).
    Run(commands::run::Args),
    /// Follow a run's task cards live (SUBFLOW_URL, SUBFLOW_TOKEN).
    Tail(commands::tail::Args),
    /// Print a thread's token usage and cost (SUBFLOW_URL, SUBFLOW_TOKEN).
    Usage(commands::usage::Args),
    /// List, watch, control and export durable batches (SUBFLOW_URL, SUBFLOW_TOKEN).
    #[command(subcommand)]
    Batches(commands::batches::BatchesCommand),
    /// Stop one task of a run (SUBFLOW_URL, SUBFLOW_TOKEN).
    #[command(subcommand)]
    Tasks(commands::tasks::TasksCommand),
    /// Apply the embedded migrations to the database.
    Migrate(commands::migrate::Args),
    /// Print the binary and contract versions.
    Version,
    /// Print the documented default configuration, or check a configuration.
    #[command(subcommand)]
    Config(commands::config::ConfigCommand),
    /// Add, list and disable users (direct database administration).
    #[command(subcommand)]
    Users(commands::users::UsersCommand),
    /// Create, list and revoke API tokens (direct database administration).
    #[command(subcommand)]
    Tokens(commands::tokens::TokensCommand),
    /// Measure subflow's speed against a baseline taken in the same run.
    #[command(subcommand)]
    Bench(commands::bench::Bench),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    // `serve` configures logging from its configuration file once it has read it.
    // Benchmarks log only warnings, so formatting log lines is not part of what they time.
    match cli.command {
        Command::Serve(_) | Command::Worker(_) => {}
        Command::Bench(_) => logging::init("warn", logging::LineFormat::Plain),
        _ => logging::init("info", logging::LineFormat::Plain),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("subflow: cannot start the async runtime: {error}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => commands::serve::run(args).await,
            Command::Worker(args) => commands::worker::run(args).await,
            Command::Run(args) => commands::run::run(args).await,
            Command::Tail(args) => commands::tail::run(args).await,
            Command::Usage(args) => commands::usage::run(args).await,
            Command::Batches(command) => commands::batches::run(command).await,
            Command::Tasks(command) => commands::tasks::run(command).await,
            Command::Migrate(args) => commands::migrate::run(args).await,
            Command::Version => commands::version::run(),
            Command::Config(command) => commands::config::run(command),
            Command::Users(command) => commands::users::run(command).await,
            Command::Tokens(command) => commands::tokens::run(command).await,
            Command::Bench(bench) => commands::bench::run(bench).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => exit_code(&error),
    }
}

/// Prints `error` on stderr (unless stdout was closed) and picks its exit code.
fn exit_code(error: &anyhow::Error) -> ExitCode {
    // `subflow … | head`: the reader has all it wanted, so the command ends normally.
    let closed_pipe = error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    });
    if closed_pipe {
        return ExitCode::SUCCESS;
    }
    if let Some(exit) = error.downcast_ref::<commands::Exit>() {
        eprintln!("subflow: {}", exit.message);
        return ExitCode::from(exit.code);
    }
    eprintln!("subflow: {error:#}");
    let usage = error.downcast_ref::<storage::UnsupportedUrl>().is_some()
        || error.downcast_ref::<storage::MissingDatabase>().is_some()
        || error
            .downcast_ref::<storage::UnreachableDatabase>()
            .is_some()
        || error.downcast_ref::<commands::UsageError>().is_some()
        || error.downcast_ref::<config::ConfigError>().is_some()
        || error
            .downcast_ref::<commands::client::HttpError>()
            .is_some_and(commands::client::HttpError::is_usage_error);
    ExitCode::from(if usage { EXIT_USAGE } else { EXIT_RUNTIME })
}
