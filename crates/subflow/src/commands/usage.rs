//! `subflow usage THREAD [--json]` (docs/workspace.md#in-the-terminal): a thread's token usage and cost from
//! `GET /api/threads/{id}/token-usage` — totals, `by_caller`, `by_model` with a cost
//! column, the cost total and currency, what stopped runs and batch items spent beside
//! them, and the context usage. `subflow usage --all [--since 7d] [--by day|model|…]`
//! prints `GET /api/usage` (docs/usage-and-cost.md#usage-across-threads) as a table of groups. `--json` prints
//! the response unchanged.

use std::fmt::Write as _;

use serde_json::Value;
use subflow_contracts::task_card::stopped_runs_line;

use super::client::{Client, ClientArgs, encode};

/// Arguments of `subflow usage`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The thread.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    thread: Option<String>,
    /// Usage across every thread of yours (every user's with an admin token).
    #[arg(long)]
    all: bool,
    /// With --all: how far back, as a number of days (`7d`) or hours (`24h`); 30d when
    /// not given.
    #[arg(long, value_parser = since)]
    since: Option<time::Duration>,
    /// With --all: group by `day` (when not given), `model`, `caller`, `thread` or
    /// `user`.
    #[arg(long, value_parser = ["day", "model", "caller", "thread", "user"])]
    by: Option<String>,
    /// Print the gateway's response unchanged.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    client: ClientArgs,
}

/// `7d` or `24h`: a positive whole number of days or hours.
fn since(text: &str) -> Result<time::Duration, String> {
    let (number, unit) = text.split_at(text.len().saturating_sub(1));
    let amount: i64 = number.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
        format!("expected a number of days or hours such as 7d or 24h, got {text:?}")
    })?;
    match unit {
        "d" => Ok(time::Duration::days(amount)),
        "h" => Ok(time::Duration::hours(amount)),
        _ => Err(format!(
            "expected a number of days or hours such as 7d or 24h, got {text:?}"
        )),
    }
}

/// Runs `subflow usage`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    if !args.all && (args.since.is_some() || args.by.is_some()) {
        return Err(super::UsageError(
            "--since and --by go with --all; a thread's usage covers all of its runs".to_owned(),
        )
        .into());
    }
    let client = Client::new(&args.client)?;
    let Some(thread) = &args.thread else {
        let from = time::OffsetDateTime::now_utc() - args.since.unwrap_or(time::Duration::days(30));
        let from = from
            .format(&time::format_description::well_known::Rfc3339)
            .map_err(|error| anyhow::anyhow!("--since reaches too far back: {error}"))?;
        let by = args.by.as_deref().unwrap_or("day");
        let path = format!("/api/usage?from={}&group_by={by}", encode(&from));
        let body = client.get_text(&path).await?;
        if args.json {
            outln!("{body}")?;
        } else {
            out!("{}", across(&serde_json::from_str(&body)?))?;
        }
        return Ok(());
    };
    super::client::thread_arg(thread)?;
    // `/token-usage` reads an unknown thread as empty; a thread the user names must exist.
    client.thread(thread).await?;
    let path = format!("/api/threads/{}/token-usage", encode(thread));
    let body = client.get_text(&path).await?;
    if args.json {
        outln!("{body}")?;
        return Ok(());
    }
    let usage: Value = serde_json::from_str(&body)?;
    out!("{}", report(&usage))?;
    Ok(())
}

/// A count with thousands separators.
fn count(value: &Value) -> String {
    let digits = value.as_u64().unwrap_or(0).to_string();
    let mut grouped = String::new();
    for (position, digit) in digits.chars().enumerate() {
        if position > 0 && (digits.len() - position).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

fn money(amount: &Value) -> String {
    amount
        .as_f64()
        .map_or_else(|| "—".to_owned(), |amount| format!("{amount:.6}"))
}

/// The human-readable report of a `/token-usage` response.
fn report(usage: &Value) -> String {
    let mut out = String::new();
    let cost = usage.get("cost").filter(|cost| cost.is_object());
    let currency = cost
        .and_then(|cost| cost.get("currency"))
        .and_then(Value::as_str)
        .unwrap_or("");
    // Writing to a String cannot fail.
    let runs = usage["total_runs"].as_u64().unwrap_or(0);
    let _ = writeln!(
        out,
        "Thread {}: {} counted {}",
        usage["thread_id"].as_str().unwrap_or("?"),
        count(&usage["total_runs"]),
        if runs == 1 { "run" } else { "runs" }
    );
    let _ = writeln!(
        out,
        "Tokens    {} total · {} input · {} output",
        count(&usage["total_tokens"]),
        count(&usage["total_input_tokens"]),
        count(&usage["total_output_tokens"])
    );
    let by_caller = &usage["by_caller"];
    let _ = writeln!(
        out,
        "By caller lead_agent {} · subagent {} · middleware {}",
        count(&by_caller["lead_agent"]),
        count(&by_caller["subagent"]),
        count(&by_caller["middleware"])
    );
    let models = usage["by_model"].as_object().cloned().unwrap_or_default();
    let cost_header = if currency.is_empty() {
        "cost".to_owned()
    } else {
        format!("cost ({currency})")
    };
    let name_width = models
        .keys()
        .map(|name| name.chars().count())
        .max()
        .unwrap_or(0)
        .max(5);
    let _ = writeln!(out, "By model");
    let _ = writeln!(
        out,
        "  {:<name_width$}  {:>12}  {:>6}  {:>14}",
        "model", "tokens", "runs", cost_header
    );
    for (name, bucket) in &models {
        let amount = cost
            .and_then(|cost| {
                cost.pointer(&format!(
                    "/by_model/{}",
                    name.replace('~', "~0").replace('/', "~1")
                ))
            })
            .map_or_else(|| "—".to_owned(), money);
        let _ = writeln!(
            out,
            "  {name:<name_width$}  {:>12}  {:>6}  {amount:>14}",
            count(&bucket["tokens"]),
            count(&bucket["runs"])
        );
    }
    let _ = match cost {
        Some(cost) => writeln!(out, "Cost      {} {currency}", money(&cost["total"])),
        // Nothing counted has nothing to price; stopped runs and batches say their own.
        None if runs == 0 => writeln!(out, "Cost      — (no counted runs)"),
        None => writeln!(
            out,
            "Cost      — (no prices configured, or mixed currencies)"
        ),
    };
    if let Some(line) = stopped_runs_line(&usage["stopped_runs"]) {
        let _ = writeln!(out, "{line}");
    }
    // Batch items stay out of every total above (docs/batches.md#observability); their spend is beside them.
    if let Some(batches) = usage
        .get("batches")
        .filter(|b| b["items"].as_u64() > Some(0))
    {
        let cost = section_cost(batches);
        let _ = writeln!(
            out,
            "Batches   {} items · {} tokens · {cost} (not in the totals)",
            count(&batches["items"]),
            count(&batches["total_tokens"])
        );
    }
    match usage.get("context_usage").filter(|c| c.is_object()) {
        Some(context) => {
            let tokens = count(&context["token_count"]);
            let _ = match (
                context["max_context_tokens"].as_u64(),
                context["percentage"].as_f64(),
            ) {
                (Some(max), Some(percentage)) => writeln!(
                    out,
                    "Context   {tokens} of {} tokens ({percentage}%)",
                    count(&Value::from(max))
                ),
                _ => writeln!(
                    out,
                    "Context   {tokens} tokens (no context window configured)"
                ),
            };
        }
        None => {
            let _ = writeln!(out, "Context   unknown");
        }
    }
    out
}

/// A section's cost as `0.001234 USD`, or `—`.
fn section_cost(section: &Value) -> String {
    section["cost"].as_object().map_or_else(
        || "—".to_owned(),
        |cost| {
            format!(
                "{} {}",
                money(&cost["total"]),
                cost["currency"].as_str().unwrap_or("")
            )
        },
    )
}

/// The human-readable report of a `/api/usage` response: one line per group (counted
/// runs, their tokens and cost, then what stopped runs and batch items spent), then the
/// sections' totals.
fn across(report: &Value) -> String {
    let mut out = String::new();
    let by = report["group_by"].as_str().unwrap_or("day");
    let whose = report["user_id"]
        .as_str()
        .map_or_else(|| "every user".to_owned(), |user| format!("user {user}"));
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "Usage of {whose} from {} to {}, by {by}",
        report["from"].as_str().unwrap_or("?"),
        report["to"].as_str().unwrap_or("?")
    );
    let groups = report["groups"].as_array().cloned().unwrap_or_default();
    let width = groups
        .iter()
        .filter_map(|g| g["key"].as_str())
        .map(|key| key.chars().count())
        .max()
        .unwrap_or(0)
        .max(by.len());
    let _ = writeln!(
        out,
        "  {by:<width$}  {:>6}  {:>12}  {:>18}  {:>12}  {:>12}",
        "runs", "tokens", "cost", "stopped", "batches"
    );
    for group in &groups {
        let _ = writeln!(
            out,
            "  {:<width$}  {:>6}  {:>12}  {:>18}  {:>12}  {:>12}",
            group["key"].as_str().unwrap_or("?"),
            count(&group["counted"]["runs"]),
            count(&group["counted"]["total_tokens"]),
            section_cost(&group["counted"]),
            count(&group["stopped_runs"]["total_tokens"]),
            count(&group["batches"]["total_tokens"]),
        );
    }
    if report["truncated"] == Value::Bool(true) {
        let _ = writeln!(out, "  (only the first 1,000 groups are listed)");
    }
    let counted = &report["counted"];
    let _ = writeln!(
        out,
        "Counted   {} runs · {} tokens · {}",
        count(&counted["runs"]),
        count(&counted["total_tokens"]),
        section_cost(counted)
    );
    let stopped = &report["stopped_runs"];
    let _ = writeln!(
        out,
        "Stopped   {} runs · {} tokens · {}",
        count(&stopped["runs"]),
        count(&stopped["total_tokens"]),
        section_cost(stopped)
    );
    let batches = &report["batches"];
    let _ = writeln!(
        out,
        "Batches   {} items · {} tokens · {}",
        count(&batches["items"]),
        count(&batches["total_tokens"]),
        section_cost(batches)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn since_reads_days_and_hours_only() {
        assert_eq!(since("7d"), Ok(time::Duration::days(7)));
        assert_eq!(since("24h"), Ok(time::Duration::hours(24)));
        for bad in ["0d", "7", "d", "-1d", "2w", ""] {
            assert!(since(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_report_across_threads_lists_groups_then_the_three_sections() {
        let cost = json!({"currency": "USD", "total": 0.0044, "by_model": {"m": 0.0044}});
        let runs = |runs: u64, tokens: u64, cost: &Value| {
            json!({"runs": runs, "total_tokens": tokens, "total_input_tokens": tokens,
                   "total_output_tokens": 0, "cost": cost})
        };
        let report = json!({"from": "2026-11-03T00:00:00.000000Z", "to": "2026-12-03T00:00:00.000000Z",
            "group_by": "day", "user_id": null, "truncated": false,
            "groups": [{"key": "2026-12-01", "counted": runs(2, 2200, &cost), "stopped_runs": runs(0, 0, &Value::Null),
                        "batches": {"items": 3, "total_tokens": 300, "cost": null}}],
            "counted": runs(2, 2200, &cost), "stopped_runs": runs(0, 0, &Value::Null),
            "batches": {"items": 3, "total_tokens": 300, "cost": null}});
        let expected = "\
Usage of every user from 2026-11-03T00:00:00.000000Z to 2026-12-03T00:00:00.000000Z, by day
  day           runs        tokens                cost       stopped       batches
  2026-12-01       2         2,200        0.004400 USD             0           300
Counted   2 runs · 2,200 tokens · 0.004400 USD
Stopped   0 runs · 0 tokens · —
Batches   3 items · 300 tokens · —
";
        assert_eq!(across(&report), expected);
    }

    #[test]
    fn the_report_lists_totals_callers_models_with_cost_and_context() {
        let usage = json!({"thread_id": "t1", "total_tokens": 1200, "total_input_tokens": 900, "total_output_tokens": 300,
            "total_runs": 2, "by_model": {"gpt-4o": {"tokens": 1000, "runs": 2}, "claude-x": {"tokens": 200, "runs": 1}},
            "by_caller": {"lead_agent": 1000, "subagent": 200, "middleware": 0},
            "context_usage": {"token_count": 5400, "max_context_tokens": 128000, "percentage": 4.2},
            "cost": {"currency": "USD", "total": 0.0123, "by_model": {"gpt-4o": 0.011, "claude-x": 0.0013}}});
        let expected = "\
Thread t1: 2 counted runs
Tokens    1,200 total · 900 input · 300 output
By caller lead_agent 1,000 · subagent 200 · middleware 0
By model
  model           tokens    runs      cost (USD)
  gpt-4o           1,000       2        0.011000
  claude-x           200       1        0.001300
Cost      0.012300 USD
Context   5,400 of 128,000 tokens (4.2%)
";
        assert_eq!(report(&usage), expected);
    }

    #[test]
    fn unpriced_usage_and_an_unknown_window_say_so() {
        let usage = json!({"thread_id": "demo", "total_tokens": 2804, "total_input_tokens": 1858, "total_output_tokens": 946,
            "total_runs": 1, "by_model": {"scripted-1": {"tokens": 2804, "runs": 1}},
            "by_caller": {"lead_agent": 1049, "subagent": 1755, "middleware": 0}, "cost": null,
            "context_usage": {"token_count": 530, "max_context_tokens": null, "percentage": null}});
        let text = report(&usage);
        assert!(
            text.contains("  scripted-1         2,804       1               —\n"),
            "{text}"
        );
        assert!(text.contains("Cost      — (no prices configured, or mixed currencies)\n"));
        assert!(text.contains("Context   530 tokens (no context window configured)\n"));
        assert!(
            !text.contains("Batches"),
            "no batch line without batch items"
        );
        assert!(!text.contains("stopped"), "no run stopped: {text}");
    }

    #[test]
    fn a_thread_with_only_a_stopped_run_does_not_blame_the_prices() {
        let usage = json!({"thread_id": "t", "total_tokens": 0, "total_input_tokens": 0, "total_output_tokens": 0,
            "total_runs": 0, "by_model": {}, "by_caller": {"lead_agent": 0, "subagent": 0, "middleware": 0},
            "cost": null, "context_usage": null,
            "stopped_runs": {"runs": 1, "total_tokens": 1993, "total_input_tokens": 1500, "total_output_tokens": 493,
                "by_caller": {"lead_agent": 600, "subagent": 1393, "middleware": 0},
                "cost": {"currency": "USD", "total": 0.003986, "by_model": {}}}});
        let text = report(&usage);
        assert!(text.contains("Cost      — (no counted runs)\n"), "{text}");
        assert!(!text.contains("no prices configured"), "{text}");
        assert!(
            text.contains("+ 1,993 tokens, $0.004 in 1 stopped run"),
            "{text}"
        );
    }

    #[test]
    fn stopped_runs_are_shown_beside_the_totals() {
        let stopped = json!({"runs": 1, "total_tokens": 1993, "total_input_tokens": 1500, "total_output_tokens": 493,
            "by_caller": {"lead_agent": 600, "subagent": 1393, "middleware": 0}, "cost": {"currency": "USD", "total": 0.003986, "by_model": {}}});
        assert_eq!(
            stopped_runs_line(&stopped).as_deref(),
            Some("+ 1,993 tokens, $0.004 in 1 stopped run")
        );
        let unpriced = json!({"runs": 2, "total_tokens": 12, "cost": null});
        assert_eq!(
            stopped_runs_line(&unpriced).as_deref(),
            Some("+ 12 tokens in 2 stopped runs")
        );
        assert_eq!(
            stopped_runs_line(&json!({"runs": 0, "total_tokens": 0})),
            None
        );
        assert_eq!(stopped_runs_line(&Value::Null), None);
    }

    #[test]
    fn batch_spend_shows_beside_the_totals() {
        let usage = json!({"thread_id": "t", "total_tokens": 0, "total_input_tokens": 0, "total_output_tokens": 0,
            "total_runs": 0, "by_model": {}, "by_caller": {}, "cost": null, "context_usage": null,
            "batches": {"items": 1204, "total_tokens": 250000, "cost": {"currency": "USD", "total": 3.12, "by_model": {}}}});
        assert!(
            report(&usage).contains(
                "Batches   1,204 items · 250,000 tokens · 3.120000 USD (not in the totals)\n"
            ),
            "{}",
            report(&usage)
        );
    }
}
