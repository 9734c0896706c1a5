//! `subflow tail THREAD [--run RUN] [--json]` (docs/workspace.md#in-the-terminal): follows a run's stream (modes
//! `custom` and `values`) and shows one card per task with the docs/workspace.md#task-card rules, redrawn in
//! place on a terminal, else one JSON line per card change. It reconnects with
//! `Last-Event-ID` and recovers from `gap` by reloading the state and the steps. A run
//! that had already ended is not followed: its cards are printed once, final, from its
//! task summaries (`…/runs/{run_id}/tasks`).
//! Exit codes: 0 for a successful run, 1 for an error or timeout, 130 when the run or the
//! command was interrupted.

mod board;
mod sse;

use std::collections::{HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::bail;
use serde_json::Value;
use subflow_contracts::task_card;

use super::client::{Client, ClientArgs, encode};
use super::{Exit, UsageError};
use board::Board;
use sse::SseDecoder;

/// Consecutive `gap` recoveries before giving up (docs/workspace.md#task-card).
const MAX_GAPS: u32 = 5;
/// Consecutive failed reconnects before giving up.
const MAX_RECONNECTS: u32 = 5;

/// Arguments of `subflow tail`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The thread whose run to follow.
    thread: String,
    /// The run to follow; by default the thread's active run, else its latest.
    #[arg(long)]
    run: Option<String>,
    /// Print one JSON line per card change, also on a terminal.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

/// How a stream response ended.
enum Outcome {
    /// `end`: the run is over.
    End,
    /// `gap`: frames after the cursor were pruned.
    Gap(Value),
    /// The body closed, or the connection broke, before `end`.
    Closed,
}

/// What [`follow_run`] shows, and where.
#[derive(Debug, Clone, Copy)]
pub enum Show {
    /// `subflow tail`: the cards are the data, on stdout; JSON lines with `json` or
    /// when stdout is not a terminal.
    Cards {
        /// `--json`.
        json: bool,
    },
    /// `subflow run --follow`: the lead's text streamed to stdout as it arrives, the cards
    /// on stderr (JSON lines when stderr is not a terminal).
    AnswerAndCards,
}

/// Where cards go: a terminal redrawn in place, or JSON lines.
struct Screen {
    /// Cards on stderr rather than stdout.
    stderr: bool,
    json: bool,
    width: usize,
    drawn: usize,
    printed: HashMap<String, Value>,
    last_lines: Vec<String>,
}

impl Screen {
    fn show(&mut self, board: &Board) -> std::io::Result<()> {
        let mut out: Box<dyn Write> = if self.stderr {
            Box::new(std::io::stderr().lock())
        } else {
            Box::new(std::io::stdout().lock())
        };
        if self.json {
            for (id, record) in board.records() {
                if self.printed.get(&id) != Some(&record) {
                    writeln!(out, "{record}")?;
                    self.printed.insert(id, record);
                }
            }
            return out.flush();
        }
        let lines = board.lines(self.width);
        if lines == self.last_lines {
            return Ok(());
        }
        // Back to the top of the previous drawing, clear it, draw again.
        if self.drawn > 0 {
            write!(out, "\x1b[{}F\x1b[J", self.drawn)?;
        }
        for line in &lines {
            writeln!(out, "{line}")?;
        }
        self.drawn = lines.len();
        self.last_lines = lines;
        out.flush()
    }

    /// Other text went to the same terminal below the cards: the next drawing starts
    /// below it instead of redrawing over it.
    fn below_text(&mut self) {
        self.drawn = 0;
    }
}

/// The lead's text on stdout, streamed from `messages` frames: each AI message's deltas
/// as they arrive, its line ended when the turn ends.
#[derive(Default)]
struct Answer {
    /// The message whose text is being printed.
    message_id: Option<String>,
    /// The printed text does not end with a newline yet.
    open_line: bool,
}

impl Answer {
    fn write(&mut self, text: &str) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()?;
        self.open_line = !text.ends_with('\n');
        Ok(())
    }

    fn end_line(&mut self) -> std::io::Result<()> {
        if self.open_line {
            self.write("\n")?;
        }
        Ok(())
    }
}

/// The message id and text of a `messages` frame (`[chunk, metadata]`) that is an AI
/// text delta.
fn ai_delta(data: &Value) -> Option<(Option<&str>, &str)> {
    let message = data.get(0)?;
    if message.get("type").and_then(Value::as_str) != Some("AIMessageChunk") {
        return None;
    }
    let text = message
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())?;
    Some((message.get("id").and_then(Value::as_str), text))
}

struct Tail {
    client: Client,
    thread: String,
    run: String,
    board: Board,
    screen: Screen,
    /// The lead's text, when it is streamed to stdout.
    answer: Option<Answer>,
    /// Both the cards and the answer go to this one terminal.
    shared_terminal: bool,
    last_event_id: Option<String>,
    error: Option<String>,
    /// Cards whose steps were read from `/events`, so they are read once.
    backfilled: HashSet<String>,
}

impl Tail {
    /// Shows the cards, unless they share a terminal with an answer line still being
    /// streamed: they wait for it to end rather than cut into it.
    fn show(&mut self) -> std::io::Result<()> {
        if self.shared_terminal && self.answer.as_ref().is_some_and(|a| a.open_line) {
            return Ok(());
        }
        self.screen.show(&self.board)
    }

    /// Prints an AI text delta on stdout (`run --follow`); any other frame ends the turn.
    fn stream_answer(&mut self, data: &Value) -> std::io::Result<()> {
        let Some(answer) = self.answer.as_mut() else {
            return Ok(());
        };
        let Some((id, text)) = ai_delta(data) else {
            return answer.end_line();
        };
        if answer.message_id.as_deref() != id {
            answer.end_line()?;
            answer.message_id = id.map(str::to_owned);
            // The cards as they stand before this text, which then goes below them.
            self.screen.show(&self.board)?;
            if self.shared_terminal {
                self.screen.below_text();
            }
        }
        answer.write(text)
    }

    fn end_answer_line(&mut self) -> std::io::Result<()> {
        match self.answer.as_mut() {
            Some(answer) => answer.end_line(),
            None => Ok(()),
        }
    }

    fn stream_path(&self) -> String {
        let messages = if self.answer.is_some() {
            "&stream_mode=messages-tuple"
        } else {
            ""
        };
        format!(
            "/api/threads/{}/runs/{}/stream?stream_mode=custom&stream_mode=values{messages}",
            encode(&self.thread),
            encode(&self.run)
        )
    }

    /// Reads one response of the stream, showing changes as frames arrive.
    async fn consume(&mut self, mut response: reqwest::Response) -> anyhow::Result<Outcome> {
        let mut decoder = SseDecoder::default();
        loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => return Ok(Outcome::Closed),
                Err(error) => {
                    tracing::debug!(%error, "the run's stream broke");
                    return Ok(Outcome::Closed);
                }
            };
            for frame in decoder.push(&chunk) {
                if let Some(id) = frame.id {
                    self.last_event_id = Some(id);
                }
                match frame.event.as_str() {
                    "values" => {
                        self.end_answer_line()?;
                        self.board.apply_values(&frame.data);
                    }
                    "custom" => {
                        self.end_answer_line()?;
                        self.board.apply_task_event(&frame.data);
                    }
                    "messages" => self.stream_answer(&frame.data)?,
                    "error" => {
                        self.error = frame
                            .data
                            .get("message")
                            .and_then(Value::as_str)
                            .map(str::to_owned);
                    }
                    "end" => return Ok(Outcome::End),
                    "gap" => return Ok(Outcome::Gap(frame.data)),
                    _ => {}
                }
            }
            self.backfill_settled().await?;
            self.show()?;
        }
    }

    /// Every step of a task from `/events`, paged by `after_seq` (docs/workspace.md#task-card).
    async fn fetch_steps(&self, id: &str) -> anyhow::Result<Vec<task_card::Step>> {
        let mut steps = Vec::new();
        let mut after_seq = None;
        for pages in 1.. {
            let path = task_card::backfill_path(&self.thread, &self.run, id, after_seq);
            let records = self.client.get_json(&path).await?;
            steps.extend(task_card::backfill_steps(&records, id));
            let next = task_card::backfill_next(&records, pages, task_card::BACKFILL_LIMIT);
            if next.done {
                break;
            }
            after_seq = next.after_seq;
        }
        Ok(steps)
    }

    /// Steps of answered cards that the stream carried none of: a run started without
    /// `custom` has no task events in its log, but its steps are always persisted.
    async fn backfill_settled(&mut self) -> anyhow::Result<()> {
        for id in self.board.settled_without_steps() {
            if self.backfilled.insert(id.clone()) {
                let steps = self.fetch_steps(&id).await?;
                self.board.apply_steps(&id, steps);
            }
        }
        Ok(())
    }

    /// docs/workspace.md#task-card gap recovery: live task state is cleared, the state reloaded and backfilled.
    async fn recover(&mut self) -> anyhow::Result<()> {
        self.board.reset_live();
        let state = self
            .client
            .get_json(&format!("/api/threads/{}/state", encode(&self.thread)))
            .await?;
        self.board.apply_values(&state["values"]);
        for id in self.board.shown_ids() {
            let steps = self.fetch_steps(&id).await?;
            self.board.apply_steps(&id, steps);
        }
        self.show()?;
        Ok(())
    }

    /// Follows the stream to `end`, reconnecting and recovering as docs/api.md#resume-and-rejoin, docs/workspace.md#task-card say.
    async fn follow(&mut self) -> anyhow::Result<()> {
        let (mut gaps, mut failures) = (0, 0);
        loop {
            let response = self
                .client
                .stream(&self.stream_path(), self.last_event_id.as_deref())
                .await;
            let outcome = match response {
                Ok(response) => {
                    let before = self.last_event_id.clone();
                    let outcome = self.consume(response).await?;
                    if self.last_event_id != before {
                        failures = 0;
                    }
                    outcome
                }
                Err(error) if failures < MAX_RECONNECTS && !is_refusal(&error) => {
                    tracing::debug!(%error, "cannot open the run's stream");
                    Outcome::Closed
                }
                Err(error) => return Err(error),
            };
            match outcome {
                Outcome::End => return Ok(()),
                Outcome::Gap(gap) => {
                    gaps += 1;
                    if gaps > MAX_GAPS {
                        bail!("the run's stream kept losing frames ({MAX_GAPS} gaps in a row)");
                    }
                    eprintln!("subflow: frames were pruned; reloading the run's state");
                    self.recover().await?;
                    self.last_event_id = gap
                        .get("latest_available_event_id")
                        .map(|id| match id {
                            Value::String(id) => id.clone(),
                            other => other.to_string(),
                        })
                        .or(self.last_event_id.take());
                }
                Outcome::Closed => {
                    gaps = 0;
                    failures += 1;
                    if failures > MAX_RECONNECTS {
                        bail!("lost the run's stream {MAX_RECONNECTS} times in a row");
                    }
                    eprintln!("subflow: reconnecting to the run's stream");
                    tokio::time::sleep(Duration::from_millis(250 << failures.min(4))).await;
                }
            }
        }
    }
}

/// A 4xx answer: retrying will not help.
fn is_refusal(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<super::client::HttpError>()
        .is_some_and(|e| (400..500).contains(&e.status))
}

/// The run to follow: the given one, else the thread's active run, else its latest.
async fn pick_run(client: &Client, thread: &str, run: Option<String>) -> anyhow::Result<String> {
    // The runs of an unknown thread read as empty; a thread the user names must exist.
    client.thread(thread).await?;
    if let Some(run) = run {
        return Ok(run);
    }
    let runs = client
        .get_json(&format!("/api/threads/{}/runs?limit=100", encode(thread)))
        .await?;
    let runs = runs.as_array().cloned().unwrap_or_default();
    let active = runs.iter().find(|run| {
        matches!(
            run.get("status").and_then(Value::as_str),
            Some("running" | "pending")
        )
    });
    active
        .or(runs.first())
        .and_then(|run| run.get("run_id").and_then(Value::as_str))
        .map(str::to_owned)
        .ok_or_else(|| {
            UsageError(format!(
                "thread {thread} has no runs; `subflow run --thread {thread} PROMPT` starts one"
            ))
            .into()
        })
}

/// Runs `subflow tail`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    super::client::thread_arg(&args.thread)?;
    let client = Client::new(&args.client)?;
    let run = pick_run(&client, &args.thread, args.run).await?;
    follow_run(client, args.thread, run, Show::Cards { json: args.json }).await
}

/// Draws the cards of `run` until it ends, as `show` says; the error carries the exit
/// code of docs/workspace.md#in-the-terminal unless the run succeeded.
pub async fn follow_run(
    client: Client,
    thread: String,
    run: String,
    show: Show,
) -> anyhow::Result<()> {
    let models = client.get_json("/api/models").await?;
    if let Show::Cards { json } = show {
        let run_path = format!("/api/threads/{}/runs/{}", encode(&thread), encode(&run));
        let record = client.get_json(&run_path).await?;
        if !is_active(&record) {
            return show_finished(client, &thread, &record, &models, json).await;
        }
    }
    let latest = client
        .get_json(&format!("/api/threads/{}/runs?limit=1", encode(&thread)))
        .await?;
    let mut board = Board::new(&models);
    // The thread's state shows the latest run's turn before any frame arrives, and is
    // all there is when that run's stream log was pruned.
    if latest.pointer("/0/run_id").and_then(Value::as_str) == Some(run.as_str()) {
        let state = client
            .get_json(&format!("/api/threads/{}/state", encode(&thread)))
            .await?;
        board.apply_values(&state["values"]);
    }
    let (stderr, json, answer) = match show {
        Show::Cards { json } => (false, json, None),
        Show::AnswerAndCards => (true, false, Some(Answer::default())),
    };
    let terminal = if stderr {
        std::io::stderr().is_terminal()
    } else {
        std::io::stdout().is_terminal()
    };
    let shared_terminal = terminal && stderr && std::io::stdout().is_terminal();
    let width = terminal_width();
    let mut tail = Tail {
        client,
        thread,
        run,
        board,
        screen: Screen {
            stderr,
            json: json || !terminal,
            width,
            drawn: 0,
            printed: HashMap::new(),
            last_lines: Vec::new(),
        },
        answer,
        shared_terminal,
        last_event_id: None,
        error: None,
        backfilled: HashSet::new(),
    };
    eprintln!(
        "subflow: following run {} of thread {}",
        tail.run, tail.thread
    );
    tail.show()?;
    tokio::select! {
        followed = tail.follow() => followed?,
        _ = tokio::signal::ctrl_c() => return Err(Exit::new(130, "interrupted").into()),
    }
    tail.end_answer_line()?;
    tail.board.end_turn();
    tail.backfill_settled().await?;
    tail.show()?;
    let record = tail
        .client
        .get_json(&format!(
            "/api/threads/{}/runs/{}",
            encode(&tail.thread),
            encode(&tail.run)
        ))
        .await?;
    outcome(&record, tail.error.as_deref())
}

fn is_active(record: &Value) -> bool {
    matches!(
        record.get("status").and_then(Value::as_str),
        Some("pending" | "running")
    )
}

/// A run that had ended before `tail` started: its cards painted once, final, from the
/// thread's state (the ToolMessages) and the run's task summaries, rather than replaying
/// its stream, which would show every card growing again.
async fn show_finished(
    client: Client,
    thread: &str,
    record: &Value,
    models: &Value,
    json: bool,
) -> anyhow::Result<()> {
    let run = record.get("run_id").and_then(Value::as_str).unwrap_or("");
    let state = client
        .get_json(&format!("/api/threads/{}/state", encode(thread)))
        .await?;
    let tasks = client
        .get_json(&format!(
            "/api/threads/{}/runs/{}/tasks",
            encode(thread),
            encode(run)
        ))
        .await?;
    let mut board = Board::new(models);
    board.apply_values(&state["values"]);
    board.apply_summaries(&tasks);
    board.end_turn();
    let terminal = std::io::stdout().is_terminal();
    let mut screen = Screen {
        stderr: false,
        json: json || !terminal,
        width: terminal_width(),
        drawn: 0,
        printed: HashMap::new(),
        last_lines: Vec::new(),
    };
    eprintln!("subflow: run {run} of thread {thread} has ended");
    screen.show(&board)?;
    outcome(record, None)
}

/// The exit of docs/workspace.md#in-the-terminal for a run's final record: 0 for success, 130 when interrupted,
/// else 1 with the error.
fn outcome(record: &Value, stream_error: Option<&str>) -> anyhow::Result<()> {
    let run = record.get("run_id").and_then(Value::as_str).unwrap_or("?");
    let status = record
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let detail = stream_error
        .or(record.get("error").and_then(Value::as_str))
        .map(|error| format!(": {error}"))
        .unwrap_or_default();
    match status {
        "success" => {
            eprintln!("subflow: run {run} ended: success");
            Ok(())
        }
        "interrupted" => Err(Exit::new(130, format!("run {run} was interrupted")).into()),
        other => Err(Exit::new(1, format!("run {run} ended: {other}{detail}")).into()),
    }
}

/// `$COLUMNS`, else 100, at least 20.
fn terminal_width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(100usize)
        .max(20)
}
