//! `subflow batches`: durable batches from the terminal, through the gateway's routes
//! (docs/batches.md#routes) at `SUBFLOW_URL` with `SUBFLOW_TOKEN` (docs/operations.md#commands).
//!
//! `submit THREAD --type T --file items.jsonl` (a batch without a lead), `list THREAD`,
//! `show BATCH` (the items table: key, status, attempt, preview), `watch
//! BATCH` (a live progress bar until the batch ends: exit 0 completed, 1 failed, 130
//! cancelled or interrupted), `export BATCH` (the JSONL on stdout, unchanged), `pause`,
//! `resume`, `cancel` and `retry BATCH ITEM`. A batch is named by its id alone: its
//! thread comes from `GET /api/subagent-batches/{id}`. `--json` prints the gateway's
//! JSON; data goes to stdout, diagnostics to stderr.

mod submit;
mod summary;
mod watch;

use std::io::Write as _;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::UsageError;
use super::client::{Client, ClientArgs, encode};

pub use summary::summary;

/// What every `batches` command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// Print the gateway's JSON (one object, or JSON lines for `watch`).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

/// `subflow batches …`.
#[derive(Debug, clap::Subcommand)]
pub enum BatchesCommand {
    /// Submit a batch from a JSONL file of `{"key", "prompt"}` lines; prints its id.
    Submit(submit::SubmitArgs),
    /// A thread's batches, newest first, with their progress and spend.
    List {
        /// The thread.
        thread: String,
        /// How many batches (1-100).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[command(flatten)]
        common: Common,
    },
    /// A batch and its items: key, status, attempt and preview.
    Show {
        /// The batch id.
        batch: String,
        /// Only items with this status.
        #[arg(long, value_parser = item_status)]
        status: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// A live progress bar (counts, rate, ETA, cost) until the batch ends; exits 0 when
    /// it completed, 1 when it failed, 130 when it was cancelled or watching was
    /// interrupted.
    Watch {
        /// The batch id.
        batch: String,
        /// Seconds between polls (0.1-60).
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
        #[command(flatten)]
        common: Common,
    },
    /// Every item with its result, one JSON line each (`results.jsonl`), on stdout.
    Export {
        /// The batch id.
        batch: String,
        #[command(flatten)]
        common: Common,
    },
    /// Stop new claims (running items finish).
    Pause {
        /// The batch id.
        batch: String,
        #[command(flatten)]
        common: Common,
    },
    /// Let a paused batch be claimed again.
    Resume {
        /// The batch id.
        batch: String,
        #[command(flatten)]
        common: Common,
    },
    /// End every unfinished item at once.
    Cancel {
        /// The batch id.
        batch: String,
        #[command(flatten)]
        common: Common,
    },
    /// Run a failed item again (a finished batch runs again).
    Retry {
        /// The batch id.
        batch: String,
        /// The item: its id (`batch-item-…`) or its key.
        item: String,
        #[command(flatten)]
        common: Common,
    },
}

/// `--status`: one of the item statuses, else a usage error that lists them.
fn item_status(text: &str) -> Result<String, String> {
    match text.parse::<subflow_contracts::BatchItemStatus>() {
        Ok(status) => Ok(status.as_str().to_owned()),
        Err(_) => {
            let names: Vec<&str> = subflow_contracts::BatchItemStatus::ALL
                .iter()
                .map(|status| status.as_str())
                .collect();
            Err(format!("expected one of {}", names.join(", ")))
        }
    }
}

/// A batch located: its thread and public record.
pub(crate) struct Located {
    client: Client,
    thread: String,
    batch: Value,
}

impl Located {
    fn id(&self) -> &str {
        self.batch["id"].as_str().unwrap_or_default()
    }

    /// A path under this batch's thread route.
    fn path(&self, rest: &str) -> String {
        format!(
            "/api/threads/{}/subagent-batches/{}{rest}",
            encode(&self.thread),
            encode(self.id())
        )
    }
}

/// Finds a batch of the caller's by id alone (404 `Subagent batch not found`: exit 2).
async fn locate(common: &Common, batch: &str) -> anyhow::Result<Located> {
    let client = Client::new(&common.client)?;
    let found = client
        .get_json(&format!("/api/subagent-batches/{}", encode(batch)))
        .await?;
    let thread = found["thread_id"]
        .as_str()
        .context("the gateway's batch has no thread_id")?
        .to_owned();
    Ok(Located {
        client,
        thread,
        batch: found,
    })
}

/// Runs `subflow batches …`.
pub async fn run(command: BatchesCommand) -> anyhow::Result<()> {
    match command {
        BatchesCommand::Submit(args) => submit::submit(args).await,
        BatchesCommand::List {
            thread,
            limit,
            common,
        } => list(&thread, limit, &common).await,
        BatchesCommand::Show {
            batch,
            status,
            common,
        } => show(&batch, status.as_deref(), &common).await,
        BatchesCommand::Watch {
            batch,
            interval,
            common,
        } => {
            if !(0.1..=60.0).contains(&interval) {
                return Err(UsageError(format!(
                    "--interval must be between 0.1 and 60 seconds, got {interval}"
                ))
                .into());
            }
            let located = locate(&common, &batch).await?;
            watch::watch(located, interval, common.json).await
        }
        BatchesCommand::Export { batch, common } => export(&batch, &common).await,
        BatchesCommand::Pause { batch, common } => control(&batch, "pause", &common).await,
        BatchesCommand::Resume { batch, common } => control(&batch, "resume", &common).await,
        BatchesCommand::Cancel { batch, common } => control(&batch, "cancel", &common).await,
        BatchesCommand::Retry {
            batch,
            item,
            common,
        } => retry(&batch, &item, &common).await,
    }
}

/// One batch as two lines: id, status, progress and title, then its summary.
fn batch_line(batch: &Value) -> String {
    format!(
        "{}  {:<9}  {:>3.0}%  {}\n  {}",
        batch["id"].as_str().unwrap_or("?"),
        batch["status"].as_str().unwrap_or("?"),
        summary::percent(batch).floor(),
        batch["title"].as_str().unwrap_or(""),
        summary(batch)
    )
}

async fn list(thread: &str, limit: u32, common: &Common) -> anyhow::Result<()> {
    super::client::thread_arg(thread)?;
    let client = Client::new(&common.client)?;
    // The list reads an unknown thread as empty; a thread the user names must exist.
    client.thread(thread).await?;
    let path = format!(
        "/api/threads/{}/subagent-batches?limit={limit}",
        encode(thread)
    );
    let batches = client.get_json(&path).await?;
    if common.json {
        return Ok(outln!("{batches}")?);
    }
    let batches = batches.as_array().cloned().unwrap_or_default();
    if batches.is_empty() {
        eprintln!("subflow: thread {thread} has no batches");
    }
    for batch in &batches {
        outln!("{}", batch_line(batch))?;
    }
    Ok(())
}

/// Every item of the batch (with `status` only those), in pages of 500.
async fn all_items(located: &Located, status: Option<&str>) -> anyhow::Result<Vec<Value>> {
    const PAGE: usize = 500;
    let filter = status.map_or(String::new(), |s| format!("&status={}", encode(s)));
    let mut items = Vec::new();
    loop {
        let path = located.path(&format!(
            "/items?offset={}&limit={PAGE}{filter}",
            items.len()
        ));
        let page = located.client.get_json(&path).await?;
        let page = page.as_array().cloned().unwrap_or_default();
        let short = page.len() < PAGE;
        items.extend(page);
        if short {
            return Ok(items);
        }
    }
}

/// The first line of `text`, cut to `width` characters.
fn first_line(text: &str, width: usize) -> String {
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if line.chars().count() > width {
        let cut: String = line.chars().take(width.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

/// The items table: key, status, attempt (and manual retries), and the preview (the
/// error for an item that did not succeed).
fn items_table(items: &[Value]) -> String {
    let key_width = items
        .iter()
        .filter_map(|i| i["item_key"].as_str())
        .map(|k| k.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(3, 40);
    let attempts: Vec<String> = items.iter().map(summary::attempt_text).collect();
    let attempt_width = attempts
        .iter()
        .map(|a| a.chars().count())
        .max()
        .unwrap_or(0)
        .max("ATTEMPT".len());
    let mut out = format!(
        "{:<key_width$}  {:<9}  {:<attempt_width$}  PREVIEW\n",
        "KEY", "STATUS", "ATTEMPT"
    );
    for (item, attempt) in items.iter().zip(&attempts) {
        let status = item["status"].as_str().unwrap_or("?");
        let text = match (item["error"].as_str(), status) {
            (Some(error), "failed" | "cancelled" | "queued") => error,
            _ => item["result_preview"].as_str().unwrap_or(""),
        };
        out.push_str(&format!(
            "{:<key_width$}  {status:<9}  {attempt:<attempt_width$}  {}\n",
            first_line(item["item_key"].as_str().unwrap_or("?"), 40),
            first_line(text, 72)
        ));
    }
    out
}

async fn show(batch: &str, status: Option<&str>, common: &Common) -> anyhow::Result<()> {
    let located = locate(common, batch).await?;
    let items = all_items(&located, status).await?;
    if common.json {
        return Ok(outln!(
            "{}",
            json!({"batch": located.batch, "items": items})
        )?);
    }
    let b = &located.batch;
    outln!("{}", batch_line(b))?;
    outln!(
        "  {} · thread {} · limits {} live, {} running, {} attempts · created {}",
        b["subagent_type"].as_str().unwrap_or("?"),
        located.thread,
        b["max_live_items"],
        b["max_running_items"],
        b["max_attempts"],
        b["created_at"].as_str().unwrap_or("?")
    )?;
    out!("{}", items_table(&items))?;
    Ok(())
}

async fn export(batch: &str, common: &Common) -> anyhow::Result<()> {
    let located = locate(common, batch).await?;
    let mut response = located
        .client
        .get_streamed(&located.path("/results.jsonl"))
        .await?;
    let mut stdout = std::io::stdout().lock();
    while let Some(chunk) = response.chunk().await.context("reading the export")? {
        stdout.write_all(&chunk)?;
    }
    stdout.flush()?;
    Ok(())
}

async fn control(batch: &str, action: &str, common: &Common) -> anyhow::Result<()> {
    let located = locate(common, batch).await?;
    let changed = located
        .client
        .post_json(&located.path(&format!("/{action}")), &json!({}), None)
        .await?;
    if common.json {
        return Ok(outln!("{changed}")?);
    }
    outln!("{}", batch_line(&changed))?;
    Ok(())
}

async fn retry(batch: &str, item: &str, common: &Common) -> anyhow::Result<()> {
    let located = locate(common, batch).await?;
    let item_id = if item.starts_with(subflow_store::batches::ITEM_ID_PREFIX) {
        item.to_owned()
    } else {
        all_items(&located, None)
            .await?
            .iter()
            .find(|i| i["item_key"] == item)
            .and_then(|i| i["id"].as_str().map(str::to_owned))
            .ok_or_else(|| UsageError(format!("batch {batch} has no item with key '{item}'")))?
    };
    let retried = located
        .client
        .post_json(
            &located.path(&format!("/items/{}/retry", encode(&item_id))),
            &json!({}),
            None,
        )
        .await?;
    if common.json {
        return Ok(outln!("{retried}")?);
    }
    outln!(
        "{}  {}  {}",
        retried["id"].as_str().unwrap_or("?"),
        retried["item_key"].as_str().unwrap_or("?"),
        retried["status"].as_str().unwrap_or("?")
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_items_table_shows_previews_and_errors_on_one_line_each() {
        let items = json!([
            {"item_key": "item-1", "status": "succeeded", "attempt": 1, "result_preview": "\nFirst line\nsecond", "error": null},
            {"item_key": "item-22", "status": "failed", "attempt": 3, "result_preview": null, "error": "boom"},
            {"item_key": "item-3", "status": "pending", "attempt": 0, "result_preview": null, "error": null}
        ]);
        assert_eq!(
            items_table(items.as_array().unwrap()),
            "\
KEY      STATUS     ATTEMPT  PREVIEW
item-1   succeeded  1        First line
item-22  failed     3        boom
item-3   pending    0        \n"
        );
        let retried = json!([
            {"item_key": "a", "status": "failed", "attempt": 1, "retries": 1, "result_preview": null, "error": "boom again"},
            {"item_key": "b", "status": "succeeded", "attempt": 1, "retries": 0, "result_preview": "ok", "error": null}
        ]);
        assert_eq!(
            items_table(retried.as_array().unwrap()),
            "\
KEY  STATUS     ATTEMPT           PREVIEW
a    failed     1 · retried once  boom again
b    succeeded  1                 ok\n"
        );
        assert_eq!(
            first_line(&"x".repeat(80), 10),
            format!("{}…", "x".repeat(9))
        );
    }
}
