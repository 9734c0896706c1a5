//! `subflow batches submit THREAD --type T --file items.jsonl`: a batch from a file of
//! `{"key", "prompt", "acceptance_criteria"?}` lines, through
//! `POST /api/threads/{thread_id}/subagent-batches`. The submission key defaults to a
//! digest of the thread, the options and the file, so running the same command again
//! returns the batch the first run created instead of a second one.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;

use serde_json::{Value, json};
use subflow_contracts::api::BatchSubmissionItem;
use subflow_contracts::task_result::sha256_hex;

use super::Common;
use crate::commands::UsageError;
use crate::commands::client::{Client, encode, thread_arg};

/// Arguments of `subflow batches submit`.
#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// The thread the batch belongs to (created when new).
    thread: String,
    /// The subagent type every item runs as.
    #[arg(long = "type", value_name = "TYPE")]
    subagent_type: String,
    /// The items: one JSON object per line, `{"key": …, "prompt": …}` with optional
    /// `"acceptance_criteria": […]`; blank lines are skipped.
    #[arg(long, value_name = "FILE")]
    file: PathBuf,
    /// Items running at once (default: the gateway's).
    #[arg(long)]
    max_running: Option<u32>,
    /// Items claimed at once (default: the gateway's).
    #[arg(long)]
    max_live: Option<u32>,
    /// A title shown with the batch.
    #[arg(long)]
    title: Option<String>,
    /// The submission key; a second submission with it returns the first batch
    /// (default: a digest of the thread, the options and the file).
    #[arg(long)]
    key: Option<String>,
    #[command(flatten)]
    common: Common,
}

/// Runs `subflow batches submit`: prints the batch id on stdout.
pub async fn submit(args: SubmitArgs) -> anyhow::Result<()> {
    thread_arg(&args.thread)?;
    let name = args.file.display().to_string();
    let text = std::fs::read_to_string(&args.file)
        .map_err(|error| UsageError(format!("cannot read {name}: {error}")))?;
    let items = parse_items(&text, &name)?;
    let mut body = json!({
        "subagent_type": args.subagent_type,
        "items": items,
    });
    if let Some(title) = &args.title {
        body["title"] = json!(title);
    }
    if let Some(running) = args.max_running {
        body["max_running_items"] = json!(running);
    }
    if let Some(live) = args.max_live {
        body["max_live_items"] = json!(live);
    }
    let key = args.key.clone().unwrap_or_else(|| {
        let options = format!("{}\n{body}", args.thread);
        format!("file-sha256:{}", &sha256_hex(&options)[..32])
    });
    body["submission_key"] = json!(key);
    let bytes = serde_json::to_vec(&body)?;
    let client = Client::new(&args.common.client)?;
    let path = format!("/api/threads/{}/subagent-batches", encode(&args.thread));
    let progress = Upload::new(&name, bytes.len());
    let (status, batch) = client
        .post_json_bytes(&path, bytes, move |sent| progress.sent(sent))
        .await?;
    if args.common.json {
        outln!("{batch}")?;
        return Ok(());
    }
    let id = batch["id"].as_str().unwrap_or_default();
    let total = batch["total_items"].as_u64().unwrap_or(0);
    if status == 201 {
        eprintln!("subflow: batch {id} submitted with {total} items (key {key})");
    } else {
        eprintln!("subflow: batch {id} was already submitted with key {key} ({total} items)");
    }
    outln!("{id}")?;
    Ok(())
}

/// The items of a JSONL file; a line that is not an item is a usage error naming it.
fn parse_items(text: &str, name: &str) -> Result<Vec<Value>, UsageError> {
    let mut items = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let item: BatchSubmissionItem = serde_json::from_str(line).map_err(|error| {
            // serde's position is within the line; the line number is the useful one.
            let reason = error.to_string();
            let reason = reason.split(" at line ").next().unwrap_or(&reason);
            UsageError(format!(
                "{name} line {}: not an item ({{\"key\": …, \"prompt\": …}}): {reason}",
                index + 1
            ))
        })?;
        items.push(serde_json::to_value(item).expect("an item always serialises"));
    }
    if items.is_empty() {
        return Err(UsageError(format!("{name} holds no items")));
    }
    Ok(items)
}

/// The upload's progress on stderr: one line rewritten in place on a terminal; else,
/// for a body of a mebibyte or more, a line at each quarter.
struct Upload {
    name: String,
    total: usize,
    terminal: bool,
    shown: std::sync::atomic::AtomicUsize,
}

impl Upload {
    fn new(name: &str, total: usize) -> Self {
        Upload {
            name: name.to_owned(),
            total,
            terminal: std::io::stderr().is_terminal(),
            shown: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn sent(&self, sent: usize) {
        let percent = (sent * 100).checked_div(self.total).unwrap_or(100);
        let line = format!(
            "uploading {}: {} of {} ({percent}%)",
            self.name,
            size(sent),
            size(self.total)
        );
        let mut stderr = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(stderr, "\r{line}");
            if sent == self.total {
                let _ = writeln!(stderr);
            }
        } else if self.total >= 1 << 20 {
            let quarter = percent / 25;
            if self
                .shown
                .fetch_max(quarter, std::sync::atomic::Ordering::Relaxed)
                < quarter
            {
                let _ = writeln!(stderr, "{line}");
            }
        }
    }
}

/// A byte count in KiB or MiB.
fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    } else {
        format!("{:.0} KiB", (bytes as f64 / 1024.0).ceil())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_read_line_by_line_and_a_bad_line_is_named() {
        let text = "{\"key\": \"a\", \"prompt\": \"p\"}\n\n{\"key\": \"b\", \"prompt\": \"q\", \"acceptance_criteria\": [\"c\"]}\n";
        let items = parse_items(text, "items.jsonl").unwrap();
        assert_eq!(
            items,
            [
                json!({"key": "a", "prompt": "p"}),
                json!({"key": "b", "prompt": "q", "acceptance_criteria": ["c"]})
            ]
        );
        for (text, reason) in [
            (
                "{\"key\": \"a\", \"prompt\": \"p\"}\n{\"key\": \"b\"}\n",
                "line 2: not an item ({\"key\": …, \"prompt\": …}): missing field `prompt`",
            ),
            (
                "{\"key\": \"a\", \"prompt\": \"p\", \"extra\": 1}",
                "line 1: not an item ({\"key\": …, \"prompt\": …}): unknown field `extra`",
            ),
            ("\n\nnot json", "line 3: not an item"),
            ("\n  \n", "holds no items"),
        ] {
            let error = parse_items(text, "items.jsonl").unwrap_err().0;
            assert!(error.contains(reason), "{error}");
        }
    }

    #[test]
    fn sizes_read_in_kib_or_mib() {
        assert_eq!(size(1), "1 KiB");
        assert_eq!(size(1536), "2 KiB");
        assert_eq!(size(3 << 20), "3.0 MiB");
    }
}
