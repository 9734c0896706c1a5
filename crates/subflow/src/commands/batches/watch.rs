//! `subflow batches watch BATCH`: polls the batch until it ends. On a terminal it draws
//! an `indicatif` progress bar on stdout whose message is the batch's status and summary
//! (counts, rate, ETA, cost); with `--json`, or when stdout is not a terminal, it prints
//! the public batch as one JSON line each time it changed. Exit codes: 0 completed, 1
//! failed, 130 cancelled or interrupted (Ctrl-C).

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;

use super::Located;
use super::summary::{done, fitted, is_terminal, summary};
use crate::commands::Exit;

/// Where the progress goes.
enum Display {
    Bar(ProgressBar),
    Lines { last: Option<Value> },
}

impl Display {
    fn new(json: bool, total: u64) -> Self {
        if json || !std::io::stdout().is_terminal() {
            return Display::Lines { last: None };
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stdout());
        let style = ProgressStyle::with_template("{bar:30.cyan/blue} {percent:>3}% {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("█▉▊▋▌▍▎▏ ");
        bar.set_style(style);
        Display::Bar(bar)
    }

    fn show(&mut self, batch: &Value) -> anyhow::Result<()> {
        match self {
            Display::Bar(bar) => {
                // The message first: each setter may redraw, and the bar must never show
                // a new position beside an old summary. It fits the terminal beside the
                // bar (30 columns), the percentage and the status.
                let status = batch["status"].as_str().unwrap_or("?");
                let (_, columns) = console::Term::stdout().size();
                let room = usize::from(columns).saturating_sub(30 + 6 + status.len() + 3);
                bar.set_message(format!("{status} · {}", fitted(batch, room)));
                bar.set_length(batch["total_items"].as_u64().unwrap_or(0));
                bar.set_position(done(batch));
            }
            Display::Lines { last } => {
                if last.as_ref() != Some(batch) {
                    outln!("{batch}")?;
                    *last = Some(batch.clone());
                }
            }
        }
        Ok(())
    }

    /// Leaves the last bar on screen and ends its line.
    fn finish(&self) -> anyhow::Result<()> {
        if let Display::Bar(bar) = self {
            bar.finish();
            outln!()?;
        }
        Ok(())
    }
}

/// Polls every `interval` seconds until the batch ends or Ctrl-C.
pub(super) async fn watch(located: Located, interval: f64, json: bool) -> anyhow::Result<()> {
    let id = located.id().to_owned();
    let mut display = Display::new(json, located.batch["total_items"].as_u64().unwrap_or(0));
    eprintln!("subflow: watching batch {id} of thread {}", located.thread);
    let mut batch = located.batch.clone();
    let path = located.path("");
    let poll = Duration::from_secs_f64(interval);
    loop {
        display.show(&batch)?;
        if is_terminal(batch["status"].as_str().unwrap_or("")) {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            _ = tokio::signal::ctrl_c() => {
                display.finish()?;
                return Err(Exit::new(130, "interrupted").into());
            }
        }
        batch = located.client.get_json(&path).await?;
    }
    display.finish()?;
    let line = summary(&batch);
    match batch["status"].as_str() {
        Some("completed") => {
            eprintln!("subflow: batch {id} completed: {line}");
            Ok(())
        }
        Some("cancelled") => {
            Err(Exit::new(130, format!("batch {id} was cancelled: {line}")).into())
        }
        other => Err(Exit::new(
            1,
            format!("batch {id} ended {}: {line}", other.unwrap_or("unknown")),
        )
        .into()),
    }
}
