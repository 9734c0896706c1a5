//! The one-line summary of a batch's progress and spend ("1,204 of 5,000 · 38/min ·
//! about 1 h 40 min left · $3.12 so far, about $12.90 in all") and its progress
//! percentage (docs/workspace.md#batch-panel), read from the public batch. The workspace's `batches.mjs`
//! applies the same rules; both run the case table `web/batches.cases.json`. Nothing is
//! computed here that the gateway already computed: the rate, ETA and costs are shown
//! as the API gives them.

use serde_json::Value;

fn number(batch: &Value, pointer: &str) -> u64 {
    batch.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

/// Items that ended (succeeded, failed or cancelled).
pub fn done(batch: &Value) -> u64 {
    ["succeeded", "failed", "cancelled"]
        .iter()
        .map(|status| number(batch, &format!("/counts/{status}")))
        .sum()
}

/// (succeeded + failed + cancelled) / `total_items` in percent, clamped to 0–100 and
/// rounded to 2 decimals; 0 when the total is 0.
pub fn percent(batch: &Value) -> f64 {
    let total = number(batch, "/total_items");
    if total == 0 {
        return 0.0;
    }
    let raw = (done(batch) as f64 / total as f64 * 100.0).clamp(0.0, 100.0);
    (raw * 100.0).round() / 100.0
}

/// An item's attempt, and whether it was retried by hand (`1 · retried once`): a retry
/// resets the attempt, so the retry count is what shows the item ran before.
pub fn attempt_text(item: &Value) -> String {
    let attempt = number(item, "/attempt");
    match number(item, "/retries") {
        0 => attempt.to_string(),
        1 => format!("{attempt} · retried once"),
        retries => format!("{attempt} · retried {retries} times"),
    }
}

/// Whether the batch has ended.
pub fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}

/// A count with thousands separators, as `toLocaleString("en-US")` writes it.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (position, digit) in digits.chars().enumerate() {
        if position > 0 && (digits.len() - position).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Items per minute: whole numbers from 10 up, else one decimal without a trailing `.0`.
fn rate(per_minute: f64) -> String {
    if per_minute >= 10.0 {
        format!("{}", per_minute.round() as u64)
    } else {
        let text = format!("{per_minute:.1}");
        text.strip_suffix(".0").map_or(text.clone(), str::to_owned)
    }
}

/// How long `seconds` is, coarsely: minutes rounded up below an hour, then hours and
/// minutes, then days and hours.
pub fn duration(seconds: u64) -> String {
    match seconds {
        0..60 => "less than a minute".to_owned(),
        60..3600 => format!("{} min", seconds.div_ceil(60)),
        3600..86_400 => match (seconds / 3600, seconds % 3600 / 60) {
            (hours, 0) => format!("{hours} h"),
            (hours, minutes) => format!("{hours} h {minutes} min"),
        },
        _ => match (seconds / 86_400, seconds % 86_400 / 3600) {
            (days, 0) => format!("{days} d"),
            (days, hours) => format!("{days} d {hours} h"),
        },
    }
}

/// An amount in `currency`: a symbol for USD, EUR and GBP, else the code after it; two
/// decimals with grouped thousands, or up to six significant places below a cent.
pub fn money(amount: f64, currency: &str) -> String {
    let digits = if amount != 0.0 && amount.abs() < 0.01 {
        let text = format!("{amount:.6}");
        text.trim_end_matches('0').to_owned()
    } else {
        let cents = format!("{amount:.2}");
        let (whole, fraction) = cents.split_once('.').unwrap_or((&cents, "00"));
        let whole: u64 = whole.parse().unwrap_or(0);
        format!("{}.{fraction}", grouped(whole))
    };
    match currency.to_uppercase().as_str() {
        "USD" => format!("${digits}"),
        "EUR" => format!("€{digits}"),
        "GBP" => format!("£{digits}"),
        other => format!("{digits} {other}"),
    }
}

/// The summary line of a public batch.
pub fn summary(batch: &Value) -> String {
    let mut parts = vec![format!(
        "{} of {}",
        grouped(done(batch)),
        grouped(number(batch, "/total_items"))
    )];
    let running = number(batch, "/counts/running");
    if running > 0 {
        parts.push(format!("{} running", grouped(running)));
    }
    for status in ["failed", "cancelled"] {
        let count = number(batch, &format!("/counts/{status}"));
        if count > 0 {
            parts.push(format!("{} {status}", grouped(count)));
        }
    }
    let per_minute = batch["items_per_minute"].as_f64().unwrap_or(0.0);
    if per_minute > 0.0 {
        parts.push(format!("{}/min", rate(per_minute)));
    }
    match batch["eta_seconds"].as_u64() {
        Some(seconds) if seconds < 60 => parts.push(format!("{} left", duration(seconds))),
        Some(seconds) => parts.push(format!("about {} left", duration(seconds))),
        None => {}
    }
    let cost = &batch["cost"];
    if let (Some(total), Some(currency)) = (cost["total"].as_f64(), cost["currency"].as_str()) {
        let status = batch["status"].as_str().unwrap_or("");
        let spend = if is_terminal(status) {
            format!("{} in all", money(total, currency))
        } else {
            let so_far = format!("{} so far", money(total, currency));
            match batch["projected_cost"].as_f64() {
                Some(projected) => format!("{so_far}, about {} in all", money(projected, currency)),
                None => so_far,
            }
        };
        parts.push(spend);
    }
    parts.join(" · ")
}

/// The summary in at most `width` characters, for a terminal line: words go before
/// numbers ("1,204/5,000 · 3 run · 4 fail · 38/min · ~1 h 40 min · $3.12/$12.90"), then
/// whole parts from the end, so the counts stay.
pub fn fitted(batch: &Value, width: usize) -> String {
    let full = summary(batch);
    if full.chars().count() <= width {
        return full;
    }
    let mut parts = vec![format!(
        "{}/{}",
        grouped(done(batch)),
        grouped(number(batch, "/total_items"))
    )];
    for (status, word) in [("running", "run"), ("failed", "fail"), ("cancelled", "cxl")] {
        let count = number(batch, &format!("/counts/{status}"));
        if count > 0 {
            parts.push(format!("{} {word}", grouped(count)));
        }
    }
    let per_minute = batch["items_per_minute"].as_f64().unwrap_or(0.0);
    if per_minute > 0.0 {
        parts.push(format!("{}/min", rate(per_minute)));
    }
    if let Some(seconds) = batch["eta_seconds"].as_u64() {
        parts.push(format!("~{}", duration(seconds.max(60))));
    }
    let cost = &batch["cost"];
    if let (Some(total), Some(currency)) = (cost["total"].as_f64(), cost["currency"].as_str()) {
        let spent = money(total, currency);
        let status = batch["status"].as_str().unwrap_or("");
        parts.push(match batch["projected_cost"].as_f64() {
            Some(projected) if !is_terminal(status) => {
                format!("{spent}/{}", money(projected, currency))
            }
            _ => spent,
        });
    }
    loop {
        let line = parts.join(" · ");
        if line.chars().count() <= width || parts.len() == 1 {
            return line;
        }
        parts.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_case_table_holds_for_the_cli() {
        let table: Value =
            serde_json::from_str(include_str!("../../../../../web/batches.cases.json")).unwrap();
        let cases = table["cases"].as_array().unwrap();
        assert!(cases.len() >= 8);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            assert_eq!(summary(&case["batch"]), case["summary"], "{name}");
            let expected = case["percent"].as_f64().unwrap();
            assert!((percent(&case["batch"]) - expected).abs() < 1e-9, "{name}");
        }
    }

    #[test]
    fn the_shared_attempt_cases_hold_for_the_cli() {
        let table: Value =
            serde_json::from_str(include_str!("../../../../../web/batches.cases.json")).unwrap();
        let cases = table["attempts"].as_array().unwrap();
        assert!(cases.len() >= 5);
        for case in cases {
            assert_eq!(
                attempt_text(&case["item"]),
                case["text"],
                "{}",
                case["name"]
            );
        }
    }

    #[test]
    fn a_narrow_line_drops_words_before_numbers_and_then_the_last_parts() {
        let table: Value =
            serde_json::from_str(include_str!("../../../../../web/batches.cases.json")).unwrap();
        let example = table["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|case| {
                case["name"]
                    .as_str()
                    .unwrap()
                    .starts_with("the issue's example")
            })
            .unwrap();
        let batch = &example["batch"];
        let full = summary(batch);
        assert_eq!(fitted(batch, 200), full);
        let compact = "1,204/5,000 · 3 run · 4 fail · 38/min · ~1 h 40 min · $3.12/$12.90";
        assert_eq!(fitted(batch, full.chars().count() - 1), compact);
        assert_eq!(fitted(batch, compact.len()), compact);
        assert_eq!(fitted(batch, 40), "1,204/5,000 · 3 run · 4 fail · 38/min");
        assert_eq!(fitted(batch, 5), "1,204/5,000");
    }

    #[test]
    fn durations_read_coarsely() {
        assert_eq!(duration(59), "less than a minute");
        assert_eq!(duration(60), "1 min");
        assert_eq!(duration(61), "2 min");
        assert_eq!(duration(3600), "1 h");
        assert_eq!(duration(86_400 * 2), "2 d");
    }
}
