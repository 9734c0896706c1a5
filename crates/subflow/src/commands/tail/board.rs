//! The cards `subflow tail` shows: the docs/workspace.md#task-card rules of `subflow_contracts::task_card`
//! (the port of the web UI's `cards.mjs`) applied to one run's frames, each card's JSON
//! line (docs/workspace.md#in-the-terminal) and its lines on a terminal.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};
use subflow_contracts::task_card::{
    self, Card, CardStatus, CardUpdate, CardView, Step, ViewContext,
};

/// The cards of one run.
#[derive(Debug)]
pub struct Board {
    order: Vec<String>,
    cards: HashMap<String, Card>,
    turn_of: HashMap<String, u64>,
    /// Cards that task events of this run named.
    live: HashSet<String>,
    /// A finished run's tasks, from its summaries: exactly the cards shown.
    run_tasks: Option<Vec<String>>,
    turns: u64,
    loading: bool,
    models: Value,
    token_usage_enabled: bool,
}

impl Board {
    /// An empty board for a run that is still loading; `models` is `/api/models`.
    pub fn new(models: &Value) -> Board {
        Board {
            order: Vec::new(),
            cards: HashMap::new(),
            turn_of: HashMap::new(),
            live: HashSet::new(),
            run_tasks: None,
            turns: 0,
            loading: true,
            models: models.get("models").cloned().unwrap_or(Value::Null),
            token_usage_enabled: models
                .pointer("/token_usage/enabled")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        }
    }

    fn update(&mut self, id: &str, update: &CardUpdate) {
        if !self.cards.contains_key(id) {
            self.order.push(id.to_owned());
        }
        let card = self
            .cards
            .remove(id)
            .unwrap_or_else(|| task_card::new_card(id));
        let merged = task_card::merge_card(&card, update);
        self.cards.insert(id.to_owned(), merged.card);
    }

    /// A `values` frame (or the thread state): task calls open cards, ToolMessages answer them.
    pub fn apply_values(&mut self, values: &Value) {
        let Some(messages) = values.get("messages") else {
            return;
        };
        let found = task_card::message_card_updates(messages);
        self.turns = found.turns;
        for entry in found.updates {
            self.turn_of.entry(entry.id.clone()).or_insert(entry.turn);
            self.update(&entry.id, &entry.update);
        }
    }

    /// A `custom` frame: a live task event.
    pub fn apply_task_event(&mut self, event: &Value) {
        let (Some(update), Some(id)) = (
            task_card::task_event_update(event),
            event.get("task_id").and_then(Value::as_str),
        ) else {
            return;
        };
        self.turn_of.entry(id.to_owned()).or_insert(self.turns);
        self.live.insert(id.to_owned());
        self.update(id, &update);
    }

    /// A run's task summaries (`GET …/runs/{run_id}/tasks`): its cards, painted before any
    /// step is loaded, and from now on the only cards shown.
    pub fn apply_summaries(&mut self, summaries: &Value) {
        let mut ids = Vec::new();
        for summary in summaries.as_array().into_iter().flatten() {
            let (Some(id), Some(update)) = (
                summary.get("task_id").and_then(Value::as_str),
                task_card::summary_update(summary),
            ) else {
                continue;
            };
            self.update(id, &update);
            ids.push(id.to_owned());
        }
        self.run_tasks = Some(ids);
    }

    /// Steps from the `/events` backfill.
    pub fn apply_steps(&mut self, id: &str, steps: Vec<Step>) {
        let update = CardUpdate {
            steps: Some(steps),
            ..CardUpdate::default()
        };
        self.update(id, &update);
    }

    /// The run's stream ended: unanswered cards are failed from now on.
    pub fn end_turn(&mut self) {
        self.loading = false;
    }

    /// Forgets the live state of the shown cards before a `gap` recovery reloads it.
    pub fn reset_live(&mut self) {
        for id in self.shown_ids() {
            self.cards.insert(id.clone(), task_card::new_card(&id));
        }
    }

    /// The ids of the run's cards, in the order they appeared: the current turn's calls
    /// and the tasks its events named.
    pub fn shown_ids(&self) -> Vec<String> {
        if let Some(ids) = &self.run_tasks {
            return ids.clone();
        }
        self.order
            .iter()
            .filter(|id| self.live.contains(*id) || self.turn_of.get(*id) == Some(&self.turns))
            .cloned()
            .collect()
    }

    /// Shown cards a ToolMessage answered, or whose turn ended, that have no steps yet.
    pub fn settled_without_steps(&self) -> Vec<String> {
        self.shown_ids()
            .into_iter()
            .filter(|id| {
                self.cards.get(id).is_some_and(|card| {
                    (card.tool_message || !self.loading) && card.steps.is_empty()
                })
            })
            .collect()
    }

    fn view(&self, id: &str) -> Option<(&Card, CardView)> {
        let card = self.cards.get(id)?;
        let context = ViewContext {
            turn_loading: self.loading,
            token_usage_enabled: self.token_usage_enabled,
            models: self.models.clone(),
        };
        Some((card, task_card::card_view(card, &context)))
    }

    /// One JSON line per shown card: `{task_id, status, subagent_type, description,
    /// model_name, usage, step_count, error, result}`.
    pub fn records(&self) -> Vec<(String, Value)> {
        self.shown_ids()
            .into_iter()
            .filter_map(|id| {
                let (card, view) = self.view(&id)?;
                let usage = card.usage.map(|u| {
                    json!({"input_tokens": u.input_tokens, "output_tokens": u.output_tokens, "total_tokens": u.total_tokens})
                });
                let record = json!({
                    "task_id": id,
                    "status": view.status.as_str(),
                    "subagent_type": card.subagent_type,
                    "description": card.description,
                    "model_name": card.model_name,
                    "usage": usage,
                    "step_count": view.step_count,
                    "error": view.error,
                    "result": view.result,
                });
                Some((id, record))
            })
            .collect()
    }

    /// The cards as terminal lines, each cut to `width` characters.
    pub fn lines(&self, width: usize) -> Vec<String> {
        let ids = self.shown_ids();
        if ids.is_empty() {
            return Vec::new();
        }
        let mut lines = vec![task_card::group_header(ids.len())];
        for id in &ids {
            let Some((_, view)) = self.view(id) else {
                continue;
            };
            let icon = match view.status {
                CardStatus::InProgress => "…",
                CardStatus::Completed => "✓",
                CardStatus::Failed => "✗",
            };
            let mut meta: Vec<String> = [
                view.subagent_type.clone(),
                view.model_label.clone(),
                view.token_label.clone(),
                view.cost_label.clone(),
            ]
            .into_iter()
            .flatten()
            .collect();
            meta.push(format!(
                "{} {}",
                view.step_count,
                if view.step_count == 1 {
                    "step"
                } else {
                    "steps"
                }
            ));
            if let Some(reason) = &view.stop_reason {
                meta.push(format!("capped: {reason}"));
            }
            let title = view.description.clone().unwrap_or_else(|| view.id.clone());
            lines.push(format!("{icon} {title}  [{}]", meta.join(" · ")));
            let mut status = format!("    {}", view.header);
            if view.status == CardStatus::InProgress
                && let Some(step) = &view.latest_step
            {
                status.push_str(&format!(" — latest: {step}"));
            }
            lines.push(status);
            if let Some(result) = &view.result {
                lines.push(format!("    Result: {}", first_line(result)));
            }
            if let Some(error) = &view.error {
                lines.push(format!("    Error: {}", first_line(error)));
            }
        }
        lines.into_iter().map(|line| cut(&line, width)).collect()
    }
}

fn first_line(text: &str) -> &str {
    text.trim().lines().next().unwrap_or("")
}

/// `line` cut to `width` characters, ending in `…` when cut.
fn cut(line: &str, width: usize) -> String {
    if line.chars().count() <= width {
        return line.to_owned();
    }
    let mut kept: String = line.chars().take(width.saturating_sub(1)).collect();
    kept.push('…');
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models(enabled: bool) -> Value {
        json!({"models": [{"name": "scripted", "display_name": "Scripted demo"}], "token_usage": {"enabled": enabled}})
    }

    fn values(tool_messages: Value) -> Value {
        let mut messages = vec![
            json!({"type": "human", "content": "earlier"}),
            json!({"type": "ai", "content": "", "tool_calls": [{"id": "old", "name": "task", "args": {"description": "Old"}}]}),
            json!({"type": "human", "content": "Compare two queues"}),
            json!({"type": "ai", "content": "", "tool_calls": [
                {"id": "a", "name": "task", "args": {"description": "Background", "subagent_type": "general-purpose", "prompt": "p"}},
                {"id": "b", "name": "task", "args": {"description": "Risks", "subagent_type": "general-purpose", "prompt": "p"}}
            ]}),
        ];
        messages.extend(tool_messages.as_array().unwrap().iter().cloned());
        json!({ "messages": messages })
    }

    fn running(id: &str, index: u64, total: u64) -> Value {
        json!({"type": "task_running", "task_id": id, "message": {"type": "tool", "name": "read_file", "content": "# Notes\nmore"},
               "message_index": index, "total_messages": index,
               "usage": {"input_tokens": total - 10, "output_tokens": 10, "total_tokens": total}, "model_name": "scripted"})
    }

    #[test]
    fn only_the_current_turn_is_shown_and_records_follow_the_card_rules() {
        let mut board = Board::new(&models(true));
        board.apply_values(&values(json!([])));
        board.apply_task_event(&json!({"type": "task_started", "task_id": "a", "description": "Background", "model_name": "scripted"}));
        board.apply_task_event(&running("a", 1, 100));
        board.apply_task_event(&running("a", 2, 250));
        assert_eq!(board.shown_ids(), ["a", "b"]);
        let records = board.records();
        assert_eq!(
            records[0].1,
            json!({"task_id": "a", "status": "in_progress", "subagent_type": "general-purpose", "description": "Background",
                   "model_name": "scripted", "usage": {"input_tokens": 240, "output_tokens": 10, "total_tokens": 250},
                   "step_count": 2, "error": null, "result": null})
        );

        // The ToolMessage decides a; b never gets one and fails once the turn ends.
        board.apply_values(&values(json!([{"type": "tool", "name": "task", "tool_call_id": "a", "content": "Task Succeeded. Result: done",
            "additional_kwargs": {"subagent_status": "completed", "subagent_result_brief": "done"}}])));
        board.end_turn();
        let records = board.records();
        assert_eq!(records[0].1["status"], "completed");
        assert_eq!(records[0].1["result"], "done");
        assert_eq!(records[1].1["status"], "failed");
        assert_eq!(records[1].1["usage"], Value::Null);
    }

    #[test]
    fn terminal_lines_show_labels_the_latest_step_and_results() {
        let mut board = Board::new(&models(true));
        board.apply_values(&values(json!([])));
        board.apply_task_event(&running("a", 1, 12_345));
        let lines = board.lines(200);
        assert_eq!(lines[0], "Executing 2 subtasks in parallel");
        assert_eq!(
            lines[1],
            "… Background  [general-purpose · Scripted demo · 12.3K Tokens · 1 step]"
        );
        assert_eq!(lines[2], "    Running subtask — latest: read_file: # Notes");
        assert_eq!(
            lines[3],
            "… Risks  [general-purpose · Collecting tokens · 0 steps]"
        );
        board.apply_values(&values(json!([{"type": "tool", "name": "task", "tool_call_id": "b", "content": "Task failed. Error: boom",
            "additional_kwargs": {"subagent_status": "failed", "subagent_error": "boom", "subagent_stop_reason": "turn_capped"}}])));
        let lines = board.lines(40);
        assert_eq!(lines[4], "    Subtask failed");
        assert_eq!(lines[5], "    Error: boom");
        // Cut to 40 characters, the last one an ellipsis.
        assert_eq!(lines[3], "✗ Risks  [general-purpose · No usage re…");
    }

    #[test]
    fn without_token_usage_there_is_no_token_label() {
        let mut board = Board::new(&models(false));
        board.apply_values(&values(json!([])));
        board.apply_task_event(&running("a", 1, 500));
        assert_eq!(
            board.lines(200)[1],
            "… Background  [general-purpose · Scripted demo · 1 step]"
        );
        // The JSON line still carries the usage: it is data, not a label.
        assert_eq!(board.records()[0].1["usage"]["total_tokens"], 500);
    }

    #[test]
    fn a_finished_run_is_painted_from_its_summaries_with_counts_cost_and_only_its_tasks() {
        let models = json!({"models": [{"name": "scripted", "model": "scripted-1", "display_name": "Scripted demo",
            "pricing": {"currency": "USD", "input_per_million": 2.0, "output_per_million": 8.0}}], "token_usage": {"enabled": true}});
        let mut board = Board::new(&models);
        board.apply_values(&values(json!([{"type": "tool", "name": "task", "tool_call_id": "a", "content": "Task Succeeded. Result: done",
            "additional_kwargs": {"subagent_status": "completed", "subagent_result_brief": "done"}}])));
        let usage = json!({"input_tokens": 1500, "output_tokens": 493, "total_tokens": 1993});
        board.apply_summaries(&json!([
            {"task_id": "a", "subagent_type": "general-purpose", "description": "Background", "model_name": "scripted",
             "status": "completed", "step_count": 2, "latest_step": {"kind": "tool", "text": "# Notes", "tool_name": "read_file"},
             "result_step": {"kind": "ai", "text": "done", "tool_name": null}, "usage": usage},
            {"task_id": "b", "subagent_type": "general-purpose", "description": "Risks", "model_name": "scripted",
             "status": "cancelled", "step_count": 3, "latest_step": {"kind": "ai", "text": "Thinking", "tool_name": null},
             "result_step": null, "usage": usage, "error": "Cancelled by user"}
        ]));
        board.end_turn();
        assert_eq!(
            board.shown_ids(),
            ["a", "b"],
            "the run's tasks, not the old turn's"
        );
        let records = board.records();
        assert_eq!(records[0].1["step_count"], 2);
        assert_eq!(records[0].1["status"], "completed");
        assert_eq!(records[1].1["step_count"], 3);
        assert_eq!(records[1].1["status"], "failed");
        assert_eq!(records[1].1["error"], "Cancelled by user");
        let lines = board.lines(200);
        assert_eq!(
            lines[1],
            "✓ Background  [general-purpose · Scripted demo · 1,993 Tokens · $0.0069 · 2 steps]"
        );
        assert_eq!(lines[3], "    Result: done");
        assert_eq!(
            lines[4],
            "✗ Risks  [general-purpose · Scripted demo · 1,993 Tokens · $0.0069 · 3 steps]"
        );
        assert_eq!(lines[6], "    Error: Cancelled by user");
    }

    #[test]
    fn a_gap_reset_keeps_the_cards_but_forgets_their_live_state() {
        let mut board = Board::new(&models(true));
        board.apply_values(&values(json!([])));
        board.apply_task_event(&running("a", 1, 100));
        board.reset_live();
        assert_eq!(board.records()[0].1["step_count"], 0);
        board.apply_values(&values(json!([])));
        board.apply_steps(
            "a",
            vec![task_card::step_from_message(
                &json!({"type": "tool", "name": "ls", "content": "x"}),
                1,
            )],
        );
        let record = &board.records()[0].1;
        assert_eq!(record["description"], "Background");
        assert_eq!(record["step_count"], 1);
    }
}
