//! The scripted model: built-in commands, the demo plan, streaming, ids, usage, script
//! files and the errors that stop startup on a bad one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use subflow_contracts::messages::{AiMessage, Message, ToolMessage};
use subflow_models::{
    ChatEvent, ChatModel, ChatRequest, Error, ScriptError, ScriptedConfig, ScriptedModel, ToolSpec,
    assemble,
};
use tempfile::TempDir;
use tokio::time::Instant;

fn built_in() -> ScriptedModel {
    ScriptedModel::new(ScriptedConfig::default()).unwrap()
}

fn scripted(path: &Path) -> ScriptedModel {
    ScriptedModel::new(ScriptedConfig {
        script: Some(path.to_owned()),
        ..ScriptedConfig::default()
    })
    .unwrap()
}

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn tool_spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: String::new(),
        parameters: json!({"type": "object"}),
    }
}

fn request(agent: &str, call_index: u32, messages: Vec<Message>) -> ChatRequest {
    ChatRequest {
        messages: messages.into(),
        tools: Vec::new().into(),
        agent: agent.into(),
        call_index,
        run_id: "run-1".into(),
    }
}

fn lead(call_index: u32, messages: Vec<Message>) -> ChatRequest {
    request("lead_agent", call_index, messages)
}

fn tool_result(id: &str, name: &str, text: &str) -> Message {
    Message::Tool(ToolMessage {
        content: json!(text),
        name: Some(name.into()),
        tool_call_id: id.into(),
        ..ToolMessage::default()
    })
}

async fn events(model: &ScriptedModel, request: ChatRequest) -> Vec<ChatEvent> {
    let stream = model.stream(request).await.unwrap();
    stream.map(Result::unwrap).collect().await
}

async fn answer(model: &ScriptedModel, request: ChatRequest) -> AiMessage {
    let stream = model.stream(request).await.unwrap();
    let (message, _) = assemble(stream, "unused", |_| {}).await.unwrap();
    message
}

fn text(message: &AiMessage) -> &str {
    message.content.as_str().unwrap()
}

fn finish(message: &AiMessage) -> &str {
    message.response_metadata["finish_reason"].as_str().unwrap()
}

fn usage(message: &AiMessage) -> (u64, u64, u64, u64) {
    let u = message.usage_metadata.unwrap();
    (
        u.input_tokens,
        u.output_tokens,
        u.total_tokens,
        u.input_token_details.cache_read,
    )
}

fn is_call_id(id: &str) -> bool {
    id.len() == 29
        && id.starts_with("call_")
        && id[5..]
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

// Built-in commands.

#[tokio::test(start_paused = true)]
async fn echo_answers_with_the_text_and_usage_of_a_quarter_of_the_characters() {
    let message = answer(
        &built_in(),
        lead(1, vec![Message::human("/echo hello world")]),
    )
    .await;
    assert_eq!(text(&message), "echo: hello world");
    assert_eq!(finish(&message), "stop");
    assert_eq!(message.response_metadata["model_name"], "scripted-1");
    // "/echo hello world" is 17 characters, "echo: hello world" 17 as well.
    assert_eq!(usage(&message), (5, 5, 10, 0));
}

#[tokio::test(start_paused = true)]
async fn task_emits_one_task_call_then_replies_with_the_tool_text() {
    let model = built_in();
    let prompt = "Write a detailed comparison of the three storage backends we support today";
    let human = Message::human(format!("/task general-purpose {prompt}"));
    let first = answer(&model, lead(1, vec![human.clone()])).await;
    assert_eq!(text(&first), "");
    assert_eq!(finish(&first), "tool_calls");
    let [call] = first.tool_calls.as_slice() else {
        panic!("one call: {first:?}")
    };
    assert_eq!(call.name, "task");
    assert!(is_call_id(&call.id), "{}", call.id);
    assert_eq!(
        call.args,
        json!({
            "description": prompt.chars().take(60).collect::<String>(),
            "prompt": prompt,
            "subagent_type": "general-purpose",
        })
    );

    let result = "Task Succeeded. Result: SQLite for one process, PostgreSQL for many.";
    let second = answer(
        &model,
        lead(
            2,
            vec![
                human,
                Message::Ai(first.clone()),
                tool_result(&call.id, "task", result),
            ],
        ),
    )
    .await;
    assert_eq!(text(&second), result);
    assert!(second.tool_calls.is_empty());
    assert_eq!(finish(&second), "stop");
}

#[tokio::test(start_paused = true)]
async fn task_without_a_prompt_explains_its_usage() {
    let message = answer(
        &built_in(),
        lead(1, vec![Message::human("/task general-purpose")]),
    )
    .await;
    assert_eq!(text(&message), "Usage: /task TYPE PROMPT");
    assert!(message.tool_calls.is_empty());
}

#[tokio::test(start_paused = true)]
async fn batch_emits_batch_task_with_one_keyed_item_per_line_then_summarises() {
    let model = built_in();
    let human =
        Message::human("/batch general-purpose\nSummarise chapter 1\n\nSummarise chapter 2\n");
    let first = answer(&model, lead(1, vec![human.clone()])).await;
    let [call] = first.tool_calls.as_slice() else {
        panic!("one call: {first:?}")
    };
    assert_eq!(call.name, "batch_task");
    assert_eq!(call.args["subagent_type"], "general-purpose");
    assert_eq!(
        call.args["items"],
        json!([
            {"key": "item-1", "prompt": "Summarise chapter 1"},
            {"key": "item-2", "prompt": "Summarise chapter 2"},
        ])
    );
    assert!(!call.args["title"].as_str().unwrap().is_empty());

    let tool_text = "Batch b-1 submitted with 2 items. Follow its progress with batch_status.";
    let second = answer(
        &model,
        lead(
            2,
            vec![
                human,
                Message::Ai(first.clone()),
                tool_result(&call.id, "batch_task", tool_text),
            ],
        ),
    )
    .await;
    assert!(text(&second).contains(tool_text), "{}", text(&second));
    assert_eq!(finish(&second), "stop");
}

#[tokio::test(start_paused = true)]
async fn a_subagent_outside_a_demo_plan_echoes_its_prompt() {
    let model = built_in();
    let message = answer(
        &model,
        request(
            "subagent:general-purpose",
            1,
            vec![
                Message::system("You help."),
                Message::human("Count the files"),
            ],
        ),
    )
    .await;
    assert_eq!(text(&message), "echo: Count the files");
    // Commands are the lead's: a subagent echoes them like any prompt.
    let message = answer(
        &model,
        request(
            "subagent:general-purpose",
            1,
            vec![Message::human("/task x y")],
        ),
    )
    .await;
    assert_eq!(text(&message), "echo: /task x y");
}

#[tokio::test(start_paused = true)]
async fn a_later_turn_of_a_thread_answers_its_own_message() {
    let model = built_in();
    let earlier = answer(&model, lead(1, vec![Message::human("/echo one")])).await;
    let message = answer(
        &model,
        lead(
            1,
            vec![
                Message::human("/echo one"),
                Message::Ai(earlier),
                Message::human("/echo two"),
            ],
        ),
    )
    .await;
    assert_eq!(text(&message), "echo: two");
}

// The demo plan, played through as the runtime would.

#[tokio::test(start_paused = true)]
async fn the_demo_plan_delegates_three_angles_takes_two_workspace_steps_and_cites_every_result() {
    let model = built_in();
    let mut lead_messages = vec![
        Message::system("You are the lead agent."),
        Message::human("Plan a two-day offsite for a team of twelve"),
    ];
    let mut lead_request = lead(1, lead_messages.clone());
    lead_request.tools = vec![
        tool_spec("task"),
        tool_spec("write_file"),
        tool_spec("read_file"),
    ]
    .into();
    let plan = answer(&model, lead_request.clone()).await;
    assert_eq!(finish(&plan), "tool_calls");
    assert!(!text(&plan).is_empty(), "the lead says what it is doing");
    assert_eq!(plan.tool_calls.len(), 3);
    let mut ids: Vec<&str> = plan.tool_calls.iter().map(|c| c.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "ids are unique");
    for call in &plan.tool_calls {
        assert_eq!(call.name, "task");
        assert_eq!(call.args["subagent_type"], "general-purpose");
        assert!(call.args["description"].as_str().unwrap().chars().count() <= 60);
        let prompt = call.args["prompt"].as_str().unwrap();
        assert!(prompt.contains("Plan a two-day offsite for a team of twelve"));
    }
    let angles: Vec<String> = plan
        .tool_calls
        .iter()
        .map(|c| c.args["description"].as_str().unwrap().to_owned())
        .collect();
    assert!(angles[0].starts_with("Background and context"));
    assert!(angles[1].starts_with("Options and trade-offs"));
    assert!(angles[2].starts_with("Risks and open questions"));

    lead_messages.push(Message::Ai(plan.clone()));
    let mut answers = Vec::new();
    let mut note_paths = Vec::new();
    for call in &plan.tool_calls {
        let prompt = call.args["prompt"].as_str().unwrap();
        let mut messages = vec![
            Message::system("You are a subagent."),
            Message::human(prompt),
        ];
        let mut sub = request("subagent:general-purpose", 1, messages.clone());
        sub.tools = vec![
            tool_spec("ls"),
            tool_spec("write_file"),
            tool_spec("read_file"),
        ]
        .into();

        let write = answer(&model, sub.clone()).await;
        let [write_call] = write.tool_calls.as_slice() else {
            panic!("write_file first: {write:?}")
        };
        assert_eq!(write_call.name, "write_file");
        let path = write_call.args["path"].as_str().unwrap().to_owned();
        assert!(
            path.starts_with("notes/") && path.ends_with(".md"),
            "{path}"
        );
        let note = write_call.args["content"].as_str().unwrap().to_owned();
        assert!(note.contains("offsite"), "{note}");
        messages.push(Message::Ai(write.clone()));
        messages.push(tool_result(
            &write_call.id,
            "write_file",
            &format!("Wrote {path}"),
        ));

        sub.messages = messages.clone().into();
        sub.call_index = 2;
        let read = answer(&model, sub.clone()).await;
        let [read_call] = read.tool_calls.as_slice() else {
            panic!("read_file second: {read:?}")
        };
        assert_eq!(read_call.name, "read_file");
        assert_eq!(read_call.args, json!({"path": path}));
        assert_ne!(read_call.id, write_call.id);
        messages.push(Message::Ai(read.clone()));
        messages.push(tool_result(&read_call.id, "read_file", &note));

        sub.messages = messages.into();
        sub.call_index = 3;
        let done = answer(&model, sub).await;
        assert!(done.tool_calls.is_empty());
        assert_eq!(finish(&done), "stop");
        let final_text = text(&done).to_owned();
        assert!(final_text.contains(&path), "cites its note: {final_text}");
        let first_point = note.lines().find(|l| l.starts_with("- ")).unwrap();
        assert!(
            final_text.contains(&first_point[2..]),
            "quotes the note: {final_text}"
        );
        // Later calls re-send the earlier prompt, which a provider would have cached.
        let (input, _, _, cache_read) = usage(&done);
        assert!(cache_read > 0 && cache_read < input, "{:?}", usage(&done));
        answers.push(final_text);
        note_paths.push(path);
    }
    note_paths.dedup();
    assert_eq!(note_paths.len(), 3, "one note per angle");

    for (call, result) in plan.tool_calls.iter().zip(&answers) {
        lead_messages.push(tool_result(
            &call.id,
            "task",
            &format!("Task Succeeded. Result: {result}"),
        ));
    }
    lead_request.messages = lead_messages.into();
    lead_request.call_index = 2;
    let summary = answer(&model, lead_request).await;
    assert_eq!(finish(&summary), "stop");
    assert!(summary.tool_calls.is_empty());
    let summary_text = text(&summary);
    for (call, result) in plan.tool_calls.iter().zip(&answers) {
        assert!(summary_text.contains(&call.id), "references {}", call.id);
        let quoted: String = result.chars().take(60).collect();
        assert!(
            summary_text.contains(&quoted),
            "quotes {quoted:?} in {summary_text}"
        );
    }
    let (input, output, total, cache_read) = usage(&summary);
    assert!(cache_read > 0 && cache_read < input);
    assert_eq!(total, input + output);
}

#[tokio::test(start_paused = true)]
async fn without_the_task_tool_the_demo_lead_answers_directly() {
    let mut req = lead(1, vec![Message::human("Choose a database")]);
    req.tools = vec![tool_spec("ls")].into();
    let message = answer(&built_in(), req).await;
    assert!(message.tool_calls.is_empty());
    assert!(text(&message).contains("Risks and open questions"));
}

// Streaming.

#[tokio::test(start_paused = true)]
async fn text_streams_in_pieces_of_at_most_16_characters_with_the_demo_delay_before_and_between() {
    let model = ScriptedModel::new(ScriptedConfig {
        demo_delay_ms: 25,
        ..ScriptedConfig::default()
    })
    .unwrap();
    let said = "ünïcödé text that is clearly longer than sixteen characters, twice over";
    let req = lead(1, vec![Message::human(format!("/echo {said}"))]);
    let started = Instant::now();
    let all = events(&model, req.clone()).await;
    let pieces: Vec<&str> = all
        .iter()
        .filter_map(|e| match e {
            ChatEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert!(pieces.len() > 1);
    assert!(pieces.iter().all(|p| p.chars().count() <= 16), "{pieces:?}");
    assert_eq!(pieces.concat(), format!("echo: {said}"));
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(25 * pieces.len() as u64),
        "one pause before the first piece and one between each two"
    );
    assert!(matches!(all[all.len() - 2], ChatEvent::Usage(_)));
    assert_eq!(
        all.last(),
        Some(&ChatEvent::Finish {
            reason: "stop".into(),
            model: Some("scripted-1".into())
        })
    );

    let mut seen = String::new();
    let stream = model.stream(req).await.unwrap();
    let (message, usage) = assemble(stream, "x", |d| seen.push_str(d)).await.unwrap();
    assert_eq!(seen, format!("echo: {said}"));
    assert_eq!(text(&message), seen);
    assert!(usage.is_some());
}

#[tokio::test(start_paused = true)]
async fn tool_call_deltas_follow_the_text() {
    let all = events(&built_in(), lead(1, vec![Message::human("Write a poem")])).await;
    let first_call = all
        .iter()
        .position(|e| matches!(e, ChatEvent::ToolCallDelta { .. }))
        .unwrap();
    let last_text = all
        .iter()
        .rposition(|e| matches!(e, ChatEvent::TextDelta(_)))
        .unwrap();
    assert!(last_text < first_call);
}

// Ids.

#[tokio::test(start_paused = true)]
async fn ids_are_deterministic_and_differ_by_call_index_run_and_position() {
    let model = built_in();
    let human = || vec![Message::human("Compare two queues")];
    let ids = |message: AiMessage| -> Vec<String> {
        message.tool_calls.into_iter().map(|c| c.id).collect()
    };
    let first = ids(answer(&model, lead(1, human())).await);
    let again = ids(answer(&built_in(), lead(1, human())).await);
    assert_eq!(first, again);
    assert!(first.iter().all(|id| is_call_id(id)));
    assert_ne!(first[0], first[1]);

    let later_ids = ids(answer(&model, lead(2, human())).await);
    assert!(later_ids.iter().all(|id| !first.contains(id)));

    let mut other_run = lead(1, human());
    other_run.run_id = "run-2".into();
    let other_ids = ids(answer(&model, other_run).await);
    assert!(other_ids.iter().all(|id| !first.contains(id)));
}

// Script files.

const TOML_SCRIPT: &str = r#"
# Rules are tried in order.
[[rules]]
agent = "lead_agent"
contains = "deploy"
turns = [
  { text = "Checking the workspace.", tool_calls = [{ name = "ls", args = { path = "." } }] },
  { text = "Deploying.", usage = { input = 100, output = 20, cache_read = 60 }, finish_reason = "length" },
  { text = "Done deploying.", delay_ms = 500 },
]

[[rules]]
agent = "lead_agent"
contains = "fail"
turns = [{ error = "provider exploded", delay_ms = 200 }]

[[rules]]
agent = "subagent:researcher"
turns = [{ text = "research", tool_calls = [{ name = "read_file", args = { path = "a.md" }, id = "call_fixed" }] }]
"#;

#[tokio::test(start_paused = true)]
async fn toml_rules_match_agent_and_contains_and_answer_turn_n_with_the_last_repeating() {
    let dir = TempDir::new().unwrap();
    let model = scripted(&write(&dir, "script.toml", TOML_SCRIPT));
    let human = || vec![Message::human("please deploy the site")];

    let first = answer(&model, lead(1, human())).await;
    assert_eq!(text(&first), "Checking the workspace.");
    assert_eq!(first.tool_calls.len(), 1);
    assert_eq!(first.tool_calls[0].name, "ls");
    assert_eq!(first.tool_calls[0].args, json!({"path": "."}));
    assert!(is_call_id(&first.tool_calls[0].id));
    assert_eq!(finish(&first), "tool_calls");

    let second = answer(&model, lead(2, human())).await;
    assert_eq!(text(&second), "Deploying.");
    assert_eq!(finish(&second), "length");
    assert_eq!(usage(&second), (100, 20, 120, 60));

    for call_index in [3, 4, 9] {
        let started = Instant::now();
        let repeated = answer(&model, lead(call_index, human())).await;
        assert_eq!(text(&repeated), "Done deploying.");
        assert_eq!(finish(&repeated), "stop");
        assert_eq!(started.elapsed(), Duration::from_millis(500));
    }

    let sub = answer(
        &model,
        request("subagent:researcher", 1, vec![Message::human("anything")]),
    )
    .await;
    assert_eq!(sub.tool_calls[0].id, "call_fixed");
    assert_eq!(text(&sub), "research");
}

#[tokio::test(start_paused = true)]
async fn an_error_turn_fails_the_call_after_its_delay() {
    let dir = TempDir::new().unwrap();
    let model = scripted(&write(&dir, "script.toml", TOML_SCRIPT));
    let started = Instant::now();
    let Err(error) = model
        .stream(lead(1, vec![Message::human("this will fail")]))
        .await
    else {
        panic!("the call fails")
    };
    assert_eq!(error, Error::Scripted("provider exploded".into()));
    assert_eq!(started.elapsed(), Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn calls_no_rule_matches_get_the_built_in_behaviour() {
    let dir = TempDir::new().unwrap();
    let model = scripted(&write(&dir, "script.toml", TOML_SCRIPT));
    let message = answer(&model, lead(1, vec![Message::human("/echo unscripted")])).await;
    assert_eq!(text(&message), "echo: unscripted");
    let other_agent = answer(
        &model,
        request(
            "subagent:general-purpose",
            1,
            vec![Message::human("deploy")],
        ),
    )
    .await;
    assert_eq!(text(&other_agent), "echo: deploy");
}

#[tokio::test(start_paused = true)]
async fn contains_reads_the_first_human_message() {
    let dir = TempDir::new().unwrap();
    let model = scripted(&write(&dir, "script.toml", TOML_SCRIPT));
    let earlier = AiMessage {
        content: json!("ok"),
        ..AiMessage::default()
    };
    let matched = answer(
        &model,
        lead(
            1,
            vec![
                Message::human("deploy it"),
                Message::Ai(earlier.clone()),
                Message::human("/echo hi"),
            ],
        ),
    )
    .await;
    assert_eq!(text(&matched), "Checking the workspace.");
    let unmatched = answer(
        &model,
        lead(
            1,
            vec![
                Message::system("deploy"),
                Message::human("/echo hi"),
                Message::Ai(earlier),
                Message::human("deploy"),
            ],
        ),
    )
    .await;
    assert_ne!(text(&unmatched), "Checking the workspace.");
}

#[tokio::test(start_paused = true)]
async fn json_scripts_work_the_same_and_default_usage_to_a_quarter_of_the_characters() {
    let dir = TempDir::new().unwrap();
    let script = json!({
        "rules": [
            {"agent": "subagent:general-purpose", "contains": "review", "turns": [
                {"text": "looks good", "finish_reason": "content_filter"},
            ]},
            {"agent": "lead_agent", "turns": [
                {"tool_calls": [{"name": "task", "args": {"description": "d", "prompt": "p", "subagent_type": "general-purpose"}}]},
                {"text": "12345678", "usage": {"cache_read": 2}},
            ]},
        ]
    });
    let model = scripted(&write(&dir, "script.json", &script.to_string()));

    let sub = answer(
        &model,
        request(
            "subagent:general-purpose",
            1,
            vec![Message::human("review this")],
        ),
    )
    .await;
    assert_eq!(text(&sub), "looks good");
    assert_eq!(finish(&sub), "content_filter");
    // input "review this" = 11 characters → 3; output 10 → 3.
    assert_eq!(usage(&sub), (3, 3, 6, 0));

    let first = answer(&model, lead(1, vec![Message::human("x")])).await;
    assert_eq!(first.tool_calls[0].name, "task");
    assert_eq!(finish(&first), "tool_calls");
    let second = answer(&model, lead(2, vec![Message::human("1234")])).await;
    assert_eq!(usage(&second), (1, 2, 3, 2));
}

// Bad scripts stop startup with the file, the line and the reason.

fn load_error(dir: &TempDir, name: &str, text: &str) -> (PathBuf, ScriptError, String) {
    let path = write(dir, name, text);
    let error = ScriptedModel::new(ScriptedConfig {
        script: Some(path.clone()),
        ..ScriptedConfig::default()
    })
    .unwrap_err();
    let shown = error.to_string();
    (path, error, shown)
}

#[test]
fn a_toml_syntax_error_names_file_line_and_reason() {
    let dir = TempDir::new().unwrap();
    let (path, error, shown) = load_error(
        &dir,
        "script.toml",
        "[[rules]]\nagent = \"lead_agent\"\nturns = [{ text = \"a\" }\n",
    );
    assert!(
        shown.starts_with(&format!("{}:3:", path.display())),
        "{shown}"
    );
    let ScriptError::Parse { line, reason, .. } = error else {
        panic!("{error:?}")
    };
    assert_eq!(line, Some(3));
    assert!(!reason.is_empty());
}

#[test]
fn an_unknown_toml_field_is_named_with_its_line() {
    let dir = TempDir::new().unwrap();
    let (path, _, shown) = load_error(
        &dir,
        "script.toml",
        "[[rules]]\nagent = \"lead_agent\"\n\n\n\n\nturnz = [{ text = \"a\" }]\n",
    );
    assert!(
        shown.starts_with(&format!("{}:7:1: ", path.display())),
        "{shown}"
    );
    assert!(shown.contains("unknown field `turnz`"), "{shown}");
}

#[test]
fn an_unknown_field_inside_a_turn_is_caught() {
    let dir = TempDir::new().unwrap();
    let (path, _, shown) = load_error(
        &dir,
        "script.toml",
        "[[rules]]\nagent = \"lead_agent\"\nturns = [\n  { txet = \"a\" },\n]\n",
    );
    assert!(
        shown.starts_with(&format!("{}:4:", path.display())),
        "{shown}"
    );
    assert!(shown.contains("unknown field `txet`"), "{shown}");
}

#[test]
fn invalid_values_are_reported_where_they_are() {
    let dir = TempDir::new().unwrap();
    let (path, _, shown) = load_error(
        &dir,
        "bad-agent.toml",
        "[[rules]]\nagent = \"lead\"\nturns = [{ text = \"a\" }]\n",
    );
    assert!(
        shown.starts_with(&format!("{}:2:", path.display())),
        "{shown}"
    );
    assert!(shown.contains("subagent:<name>"), "{shown}");

    let (path, _, shown) = load_error(
        &dir,
        "no-turns.toml",
        "[[rules]]\nagent = \"lead_agent\"\nturns = []\n",
    );
    assert!(
        shown.starts_with(&format!("{}:3:", path.display())),
        "{shown}"
    );
    assert!(shown.contains("at least one turn"), "{shown}");

    let (path, _, shown) = load_error(
        &dir,
        "bad-args.toml",
        "[[rules]]\nagent = \"lead_agent\"\nturns = [{ tool_calls = [{ name = \"ls\", args = 3 }] }]\n",
    );
    assert!(
        shown.starts_with(&format!("{}:3:", path.display())),
        "{shown}"
    );
    assert!(shown.contains("args"), "{shown}");
}

#[test]
fn json_errors_name_file_line_and_column() {
    let dir = TempDir::new().unwrap();
    let (path, error, shown) = load_error(
        &dir,
        "script.json",
        "{\n  \"rules\": [\n    {\"agent\": \"lead_agent\",,}\n  ]\n}\n",
    );
    assert!(
        shown.starts_with(&format!("{}:3:", path.display())),
        "{shown}"
    );
    assert!(
        !shown.contains(" at line "),
        "position is not repeated: {shown}"
    );
    assert!(matches!(
        error,
        ScriptError::Parse {
            column: Some(_),
            ..
        }
    ));

    let (path, _, shown) = load_error(
        &dir,
        "unknown.json",
        "{\"rules\": [\n {\"agent\": \"lead_agent\",\n  \"turns\": [{\"text\": \"a\"}],\n  \"contain\": \"x\"}]}",
    );
    assert!(
        shown.starts_with(&format!("{}:4:", path.display())),
        "{shown}"
    );
    assert!(shown.contains("unknown field `contain`"), "{shown}");
}

#[test]
fn a_wrong_extension_names_the_accepted_ones() {
    let dir = TempDir::new().unwrap();
    let (path, error, shown) = load_error(&dir, "script.yaml", "rules: []\n");
    assert_eq!(error, ScriptError::Extension { path: path.clone() });
    assert!(shown.starts_with(&path.display().to_string()));
    assert!(
        shown.contains(".toml") && shown.contains(".json"),
        "{shown}"
    );
}

#[test]
fn a_missing_file_is_named() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("absent.toml");
    let error = ScriptedModel::new(ScriptedConfig {
        script: Some(path.clone()),
        ..ScriptedConfig::default()
    })
    .unwrap_err();
    assert!(matches!(error, ScriptError::Read { .. }), "{error:?}");
    let shown = error.to_string();
    assert!(
        shown.starts_with(&format!("{}: cannot read script", path.display())),
        "{shown}"
    );
}

#[test]
fn the_model_reports_its_names() {
    let model = ScriptedModel::new(ScriptedConfig {
        name: "demo".into(),
        model: "scripted-2".into(),
        ..ScriptedConfig::default()
    })
    .unwrap();
    let info = model.info();
    assert_eq!(
        (info.name.as_str(), info.model.as_str(), info.provider),
        ("demo", "scripted-2", "scripted")
    );
}
