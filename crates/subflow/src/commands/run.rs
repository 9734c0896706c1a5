//! `subflow run PROMPT [--thread] [--model] [--follow]` (docs/operations.md#commands): starts a run through
//! the gateway and prints its answer on stdout; `--follow` streams the lead's text to
//! stdout as it arrives and draws the task cards of `subflow tail` on stderr. Ctrl-C
//! cancels the run.

use serde_json::{Value, json};

use super::Exit;
use super::client::{Client, ClientArgs, encode, thread_arg};

/// Arguments of `subflow run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to ask the lead agent.
    prompt: String,
    /// The thread to run on (created if it does not exist); by default a new one.
    #[arg(long)]
    thread: Option<String>,
    /// A configured model name for the lead agent, instead of the gateway's default.
    #[arg(long)]
    model: Option<String>,
    /// Stream the answer as it comes and show the task cards on stderr (JSON lines when
    /// stderr is not a terminal).
    #[arg(long)]
    follow: bool,
    #[command(flatten)]
    client: ClientArgs,
}

/// The request body: the prompt as a human message, the model if one was chosen. The
/// stream log keeps the lead's text deltas too when they are to be followed.
fn request(prompt: &str, model: Option<&str>, follow: bool) -> Value {
    let modes: &[&str] = if follow {
        &["values", "custom", "messages-tuple"]
    } else {
        &["values", "custom"]
    };
    let mut body = json!({
        "input": {"messages": [{"role": "user", "content": prompt}]},
        "stream_mode": modes,
    });
    if let Some(model) = model {
        body["config"] = json!({"configurable": {"model_name": model}});
    }
    body
}

/// The text of the last AI message of `values`, blocks joined.
fn answer(values: &Value) -> Option<String> {
    let message = values
        .get("messages")?
        .as_array()?
        .iter()
        .rev()
        .find(|m| m.get("type").and_then(Value::as_str) == Some("ai"))?;
    match message.get("content")? {
        Value::String(text) => Some(text.clone()),
        Value::Array(blocks) => Some(
            blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
        ),
        _ => None,
    }
}

/// Runs `subflow run`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let thread = match args.thread {
        Some(thread) => thread_arg(&thread)?.to_owned(),
        None => uuid::Uuid::new_v4().simple().to_string(),
    };
    let client = Client::new(&args.client)?;
    let runs = format!("/api/threads/{}/runs", encode(&thread));
    // A background run: losing this process does not cancel it, Ctrl-C does.
    let started = client
        .post_json(
            &runs,
            &request(&args.prompt, args.model.as_deref(), args.follow),
            None,
        )
        .await?;
    let run_id = started
        .get("run_id")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow::anyhow!("the gateway answered a run without run_id: {started}"))?
        .to_owned();
    eprintln!("subflow: run {run_id} on thread {thread}");
    let run_path = format!("{runs}/{}", encode(&run_id));
    let waited = async {
        if args.follow {
            super::tail::follow_run(
                client.clone(),
                thread.clone(),
                run_id.clone(),
                super::tail::Show::AnswerAndCards,
            )
            .await
        } else {
            client
                .get_text_within(&format!("{run_path}/join"), None)
                .await
                .map(drop)
        }
    };
    let ended = tokio::select! {
        ended = waited => ended,
        _ = tokio::signal::ctrl_c() => Err(Exit::new(130, "interrupted").into()),
    };
    if let Err(error) = &ended
        && error
            .downcast_ref::<Exit>()
            .is_some_and(|exit| exit.code == 130)
    {
        // Interrupted here or elsewhere: make sure the run stops.
        let _ = client
            .post_json(&format!("{run_path}/cancel"), &Value::Null, None)
            .await;
        return ended;
    }
    if args.follow {
        // `follow_run` has streamed the answer and judged the run's status.
        return ended;
    }
    let state = client
        .get_json(&format!("/api/threads/{}/state", encode(&thread)))
        .await?;
    if let Some(text) = answer(&state["values"]) {
        outln!("{text}")?;
    }
    let record = client.get_json(&run_path).await?;
    match record.get("status").and_then(Value::as_str) {
        Some("success") => Ok(()),
        Some("interrupted") => Err(Exit::new(130, format!("run {run_id} was interrupted")).into()),
        other => {
            let error = record
                .get("error")
                .and_then(Value::as_str)
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            Err(Exit::new(
                1,
                format!("run {run_id} ended: {}{error}", other.unwrap_or("unknown")),
            )
            .into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_the_last_ai_message_text() {
        let values = json!({"messages": [
            {"type": "human", "content": "q"},
            {"type": "ai", "content": "first"},
            {"type": "tool", "content": "t"},
            {"type": "ai", "content": [{"type": "text", "text": "se"}, {"type": "text", "text": "cond"}]},
        ]});
        assert_eq!(answer(&values).as_deref(), Some("second"));
        assert_eq!(answer(&json!({"messages": []})), None);
    }

    #[test]
    fn a_chosen_model_goes_into_the_configurable_section() {
        assert_eq!(
            request("hi", Some("fast"), false)["config"]["configurable"]["model_name"],
            "fast"
        );
        assert!(request("hi", None, false).get("config").is_none());
        assert_eq!(
            request("hi", None, true)["stream_mode"],
            json!(["values", "custom", "messages-tuple"])
        );
    }
}
