//! The no-script behaviour (docs/configuration.md#models): `/task`, `/batch`, `/echo` and the demo plan.
//!
//! Every decision is taken from the conversation in the request, not from hidden state,
//! so a model instance can serve any number of runs and agents at once.

use serde_json::{Value, json};
use subflow_contracts::messages::Message;

use crate::ChatRequest;

/// Opens every prompt the demo lead writes; a subagent whose prompt starts with it is
/// "in a demo plan" and takes the two workspace steps before answering.
pub(crate) const DEMO_PLAN_MARKER: &str = "[subflow demo plan]";

/// The angles the demo lead explores in parallel, with the points each note records.
const ANGLES: [(&str, [&str; 3]); 3] = [
    (
        "Background and context",
        [
            "What is being asked, and why it matters now.",
            "Who is affected, and what is already in place.",
            "Which facts are settled and which are assumptions.",
        ],
    ),
    (
        "Options and trade-offs",
        [
            "The simplest option that could work, and what it costs.",
            "A more thorough alternative, and when it pays off.",
            "What each option makes harder to change later.",
        ],
    ),
    (
        "Risks and open questions",
        [
            "What could go wrong first, and how we would notice.",
            "Questions to settle before committing.",
            "A fallback if the chosen approach stalls.",
        ],
    ),
];

const GENERIC_POINTS: [&str; 3] = [
    "The main facts that bear on this angle.",
    "What they imply for the request.",
    "What still needs checking.",
];

/// What the model answers: text, then tool calls (name and arguments).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Reply {
    pub text: String,
    pub calls: Vec<(String, Value)>,
}

impl Reply {
    fn text(text: impl Into<String>) -> Reply {
        Reply {
            text: text.into(),
            calls: Vec::new(),
        }
    }
}

/// The no-script answer to `request`.
pub(crate) fn respond(request: &ChatRequest) -> Reply {
    let conversation = Conversation::of(request);
    let is_subagent = request.agent.starts_with("subagent:");
    let prompt = conversation.prompt.trim();
    let (command, rest) = split_command(prompt);
    match command {
        Some("echo") => Reply::text(format!("echo: {rest}")),
        Some("task") if !is_subagent => lead_task(&conversation, rest),
        Some("batch") if !is_subagent => lead_batch(&conversation, rest),
        _ if is_subagent => match DemoPrompt::parse(prompt) {
            Some(demo) => demo_subagent(&conversation, &demo),
            None => Reply::text(format!("echo: {prompt}")),
        },
        _ => demo_lead(&conversation, prompt),
    }
}

/// The part of the request the no-script behaviour reads.
struct Conversation<'a> {
    request: &'a ChatRequest,
    /// The text of the human message that opened the current turn.
    prompt: String,
    /// The messages after that human message.
    after: &'a [Message],
}

impl<'a> Conversation<'a> {
    fn of(request: &'a ChatRequest) -> Conversation<'a> {
        let messages = &request.messages;
        match turn_opening(messages) {
            Some(index) => Conversation {
                request,
                prompt: messages[index].text(),
                after: &messages[index + 1..],
            },
            None => Conversation {
                request,
                prompt: String::new(),
                after: &[],
            },
        }
    }

    /// Whether the model already answered in this turn (so tool results may be back).
    fn answered_before(&self) -> bool {
        self.steps_taken() > 0
    }

    fn steps_taken(&self) -> usize {
        self.after
            .iter()
            .filter(|m| matches!(m, Message::Ai(_)))
            .count()
    }

    fn last_tool_text(&self) -> Option<String> {
        self.after.iter().rev().find_map(|m| match m {
            Message::Tool(_) => Some(m.text()),
            _ => None,
        })
    }

    /// Tool calls made in this turn, each with the text of its result when it is back.
    fn calls_with_results(&self) -> Vec<(&'a str, &'a Value, &'a str, Option<String>)> {
        let mut calls = Vec::new();
        for message in self.after {
            if let Message::Ai(ai) = message {
                for call in &ai.tool_calls {
                    let result = self.after.iter().find_map(|m| match m {
                        Message::Tool(tool) if tool.tool_call_id == call.id => Some(m.text()),
                        _ => None,
                    });
                    calls.push((call.name.as_str(), &call.args, call.id.as_str(), result));
                }
            }
        }
        calls
    }

    /// Whether the agent may call `tool`. An empty tool list means the caller did not
    /// declare its tools (library use), so nothing is ruled out.
    fn offers(&self, tool: &str) -> bool {
        self.request.tools.is_empty() || self.request.tools.iter().any(|t| t.name == tool)
    }
}

/// The index of the human message that opened the current turn. In a thread with
/// several turns that is the latest user message, not the first one; guard warnings
/// (loop detection, token budget) are human messages injected mid-turn, after tool
/// results or named, so they are skipped.
fn turn_opening(messages: &[Message]) -> Option<usize> {
    let mut opening = None;
    let mut injected = false;
    for (index, message) in messages.iter().enumerate() {
        if let Message::Human(human) = message {
            let after_tool = index > 0 && matches!(messages[index - 1], Message::Tool(_));
            let after_injected =
                index > 0 && matches!(messages[index - 1], Message::Human(_)) && injected;
            injected = human.name.is_some() || after_tool || after_injected;
            if !injected || opening.is_none() {
                opening = Some(index);
            }
        }
    }
    opening
}

/// Splits `/command rest` into the command name and the rest; plain text has no command.
fn split_command(prompt: &str) -> (Option<&str>, &str) {
    let Some(body) = prompt.strip_prefix('/') else {
        return (None, prompt);
    };
    let end = body.find(char::is_whitespace).unwrap_or(body.len());
    (Some(&body[..end]), body[end..].trim())
}

fn lead_task(conversation: &Conversation, rest: &str) -> Reply {
    if conversation.answered_before() {
        return Reply::text(
            conversation
                .last_tool_text()
                .unwrap_or_else(|| "The task returned nothing.".to_owned()),
        );
    }
    let (kind, prompt) = match rest.split_once(char::is_whitespace) {
        Some((kind, prompt)) if !prompt.trim().is_empty() => (kind, prompt.trim()),
        _ => return Reply::text("Usage: /task TYPE PROMPT"),
    };
    if !conversation.offers("task") {
        return Reply::text("The task tool is not available here (subagents are disabled).");
    }
    Reply {
        text: String::new(),
        calls: vec![(
            "task".to_owned(),
            json!({
                "description": prompt.chars().take(60).collect::<String>(),
                "prompt": prompt,
                "subagent_type": kind,
            }),
        )],
    }
}

fn lead_batch(conversation: &Conversation, rest: &str) -> Reply {
    let (first_line, item_lines) = rest.split_once('\n').unwrap_or((rest, ""));
    let kind = first_line.trim();
    let prompts: Vec<&str> = item_lines
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    if conversation.answered_before() {
        let result = conversation
            .last_tool_text()
            .unwrap_or_else(|| "The batch tool returned nothing.".to_owned());
        return Reply::text(format!(
            "Batch of {} {kind} item(s): {result}",
            prompts.len()
        ));
    }
    if kind.is_empty() || kind.contains(char::is_whitespace) {
        return Reply::text("Usage: /batch TYPE, then one item prompt per line");
    }
    if !conversation.offers("batch_task") {
        return Reply::text("The batch_task tool is not available here (batches are disabled).");
    }
    let items: Vec<Value> = prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| json!({"key": format!("item-{}", i + 1), "prompt": prompt}))
        .collect();
    Reply {
        text: String::new(),
        calls: vec![(
            "batch_task".to_owned(),
            json!({
                "title": format!("{kind} batch of {} item(s)", items.len()),
                "subagent_type": kind,
                "items": items,
            }),
        )],
    }
}

fn demo_lead(conversation: &Conversation, message: &str) -> Reply {
    let topic = prefix(&one_line(message), 80);
    if conversation.answered_before() {
        return demo_summary(conversation, &topic);
    }
    if !conversation.offers("task") {
        let mut text = format!("Three angles on \"{topic}\":\n");
        for (angle, points) in ANGLES {
            text.push_str(&format!("\n{angle}: {}", points.join(" ")));
        }
        return Reply::text(text);
    }
    let calls = ANGLES
        .iter()
        .map(|(angle, _)| {
            let prompt = format!(
                "{DEMO_PLAN_MARKER} Explore one angle of the request below: keep a short note \
                 in your workspace, then answer in a few sentences.\nAngle: {angle}\nRequest:\n{message}"
            );
            let description = prefix(&format!("{angle}: {topic}"), 60);
            (
                "task".to_owned(),
                json!({
                    "description": description,
                    "prompt": prompt,
                    "subagent_type": "general-purpose",
                }),
            )
        })
        .collect();
    Reply {
        text: format!(
            "I'll explore \"{topic}\" from three angles in parallel: background and context, \
             options and trade-offs, and risks and open questions."
        ),
        calls,
    }
}

fn demo_summary(conversation: &Conversation, topic: &str) -> Reply {
    let results: Vec<_> = conversation
        .calls_with_results()
        .into_iter()
        .filter(|(name, ..)| *name == "task")
        .collect();
    if results.is_empty() {
        return Reply::text(format!("I could not delegate any work on \"{topic}\"."));
    }
    let mut text = format!(
        "Summary of \"{topic}\" from {} parallel explorations:\n",
        results.len()
    );
    for (number, (_, args, id, result)) in results.iter().enumerate() {
        let label = args
            .get("prompt")
            .and_then(Value::as_str)
            .and_then(DemoPrompt::parse)
            .map(|demo| demo.angle.to_owned())
            .or_else(|| {
                args.get("description")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| format!("Task {}", number + 1));
        let cited = match result {
            Some(text) => {
                let body = text.strip_prefix("Task Succeeded. Result:").unwrap_or(text);
                format!("“{}”", prefix(&one_line(body), 400))
            }
            None => "no result came back".to_owned(),
        };
        text.push_str(&format!("\n{}. {label} [{id}]: {cited}", number + 1));
    }
    text.push_str(
        "\n\nTogether these cover the context, the choices and the risks; each subagent's \
         note is in the workspace under notes/.",
    );
    Reply::text(text)
}

/// A prompt written by the demo lead.
struct DemoPrompt<'a> {
    angle: &'a str,
    request: &'a str,
}

impl<'a> DemoPrompt<'a> {
    fn parse(prompt: &'a str) -> Option<DemoPrompt<'a>> {
        let body = prompt.trim_start().strip_prefix(DEMO_PLAN_MARKER)?;
        let angle = body
            .lines()
            .find_map(|line| line.strip_prefix("Angle:"))
            .map(str::trim)
            .filter(|angle| !angle.is_empty())
            .unwrap_or("General");
        let request = body
            .split_once("\nRequest:")
            .map_or("", |(_, request)| request.trim());
        Some(DemoPrompt { angle, request })
    }

    fn note_path(&self) -> String {
        format!("notes/{}.md", slug(self.angle))
    }

    fn note(&self) -> String {
        let points = ANGLES
            .iter()
            .find(|(angle, _)| *angle == self.angle)
            .map_or(GENERIC_POINTS, |(_, points)| *points);
        let mut note = format!(
            "# {}\n\nRequest: {}\n",
            self.angle,
            prefix(&one_line(self.request), 200)
        );
        for point in points {
            note.push_str(&format!("\n- {point}"));
        }
        note.push('\n');
        note
    }
}

/// Demo subagent: `write_file` the note, `read_file` it back, then answer citing it.
fn demo_subagent(conversation: &Conversation, demo: &DemoPrompt) -> Reply {
    let path = demo.note_path();
    let step = conversation.steps_taken();
    if step == 0 && conversation.offers("write_file") {
        return Reply {
            text: String::new(),
            calls: vec![(
                "write_file".to_owned(),
                json!({"path": path, "content": demo.note()}),
            )],
        };
    }
    if step == 1 && conversation.offers("read_file") {
        return Reply {
            text: String::new(),
            calls: vec![("read_file".to_owned(), json!({"path": path}))],
        };
    }
    let topic = prefix(&one_line(demo.request), 80);
    // The answer is built from what read_file returned, so it shows the tool steps
    // worked; without them it falls back to the note it would have written.
    let note = if step == 0 {
        demo.note()
    } else {
        conversation.last_tool_text().unwrap_or_default()
    };
    let points: Vec<&str> = note.lines().filter_map(bullet).collect();
    let findings = if points.is_empty() {
        format!("\"{}\"", prefix(&one_line(&note), 200))
    } else {
        points.join(" ")
    };
    Reply::text(format!(
        "{} for \"{topic}\": {findings} (from my note {path})",
        demo.angle
    ))
}

/// The text of a `- ` list item, also when read_file prefixed the line with its number.
fn bullet(line: &str) -> Option<&str> {
    line.trim_start_matches(|c: char| {
        c.is_ascii_digit() || c.is_whitespace() || c == '|' || c == ':'
    })
    .strip_prefix("- ")
    .map(str::trim)
    .filter(|point| !point.is_empty())
}

/// The first `max` characters of `text`, ending in `…` when it was cut.
fn prefix(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Lowercase ASCII letters and digits joined by single dashes, for file names.
fn slug(text: &str) -> String {
    let mut slug = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug: String = slug.trim_end_matches('-').chars().take(48).collect();
    if slug.is_empty() {
        "note".to_owned()
    } else {
        slug
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use subflow_contracts::messages::{HumanMessage, ToolMessage};

    fn tool(text: &str) -> Message {
        Message::Tool(ToolMessage {
            content: json!(text),
            tool_call_id: "c".into(),
            ..ToolMessage::default()
        })
    }

    #[test]
    fn the_turn_opens_at_the_latest_user_message_not_at_an_injected_warning() {
        let warning = Message::Human(HumanMessage {
            content: json!("[LOOP DETECTED] stop"),
            name: Some("loop_warning".into()),
            ..HumanMessage::default()
        });
        let messages = vec![
            Message::system("s"),
            Message::human("first"),
            Message::Ai(Default::default()),
            Message::human("second"),
            Message::Ai(Default::default()),
            tool("r"),
            warning,
        ];
        assert_eq!(turn_opening(&messages), Some(3));
        assert_eq!(turn_opening(&messages[..1]), None);
    }

    #[test]
    fn bullets_are_found_with_or_without_line_numbers() {
        assert_eq!(bullet("- a point"), Some("a point"));
        assert_eq!(bullet("     4\t- a point"), Some("a point"));
        assert_eq!(bullet("3| - a point"), Some("a point"));
        assert_eq!(bullet("# heading"), None);
        assert_eq!(bullet("-"), None);
    }

    #[test]
    fn slugs_and_prefixes_count_characters() {
        assert_eq!(slug("Options and trade-offs"), "options-and-trade-offs");
        assert_eq!(slug("¿¿"), "note");
        assert_eq!(prefix("héllo", 5), "héllo");
        assert_eq!(prefix("héllo!", 5), "héll…");
    }

    #[test]
    fn commands_split_on_the_first_whitespace() {
        assert_eq!(split_command("/echo  hi there"), (Some("echo"), "hi there"));
        assert_eq!(split_command("/echo"), (Some("echo"), ""));
        assert_eq!(split_command("plain"), (None, "plain"));
    }
}
