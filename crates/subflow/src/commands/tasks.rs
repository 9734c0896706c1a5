//! `subflow tasks cancel THREAD RUN TASK`: stops one task of a run through
//! `POST …/runs/{run_id}/tasks/{task_id}/cancel`; the run goes on without it. The task
//! id is the `task` tool call id that `subflow tail --json` and the task events show.

use serde_json::json;

use super::client::{Client, ClientArgs, encode};

/// `subflow tasks …`.
#[derive(Debug, clap::Subcommand)]
pub enum TasksCommand {
    /// Cancel one running task of a run; the run and its other tasks go on.
    Cancel {
        /// The thread.
        thread: String,
        /// The run.
        run: String,
        /// The task: its `task` tool call id (`call_…`).
        task: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// Runs `subflow tasks …`.
pub async fn run(command: TasksCommand) -> anyhow::Result<()> {
    let TasksCommand::Cancel {
        thread,
        run,
        task,
        client,
    } = command;
    super::client::thread_arg(&thread)?;
    let client = Client::new(&client)?;
    let path = format!(
        "/api/threads/{}/runs/{}/tasks/{}/cancel",
        encode(&thread),
        encode(&run),
        encode(&task)
    );
    client.post_json(&path, &json!({}), None).await?;
    outln!("Task {task} of run {run} is being cancelled; the run goes on without it.")?;
    Ok(())
}
