//! Money on cards (docs/usage-and-cost.md#cost prices, as `/api/models` lists them under `pricing`): the
//! price of a model, the cost of a task's usage (by [`crate::cost::cost`], the one price
//! function) and how an amount is written. Ported from `cards.mjs` like the rest of the
//! card rules, on the same case table.
//!
//! Amounts are written from whole micro-units (the 6 decimals costs are rounded to) with
//! integer arithmetic, so JavaScript and Rust write every amount alike.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::CardUsage;

pub use crate::cost::Price;
use crate::cost::{cost, round6};

/// An amount of money.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// Rounded to 6 decimals.
    pub amount: f64,
    /// Upper-case currency code.
    pub currency: String,
}

fn number(value: Option<&Value>) -> f64 {
    value
        .and_then(Value::as_f64)
        .filter(|n| n.is_finite())
        .unwrap_or(0.0)
}

fn optional_number(value: Option<&Value>) -> Option<f64> {
    value.and_then(Value::as_f64).filter(|n| n.is_finite())
}

fn price_of_entry(model: &Value) -> Option<Price> {
    let pricing = model.get("pricing").filter(|p| p.is_object())?;
    let input = number(pricing.get("input_per_million"));
    let output = number(pricing.get("output_per_million"));
    if input <= 0.0 && output <= 0.0 {
        return None;
    }
    let currency = pricing
        .get("currency")
        .and_then(Value::as_str)
        .filter(|c| !c.trim().is_empty())
        .unwrap_or("USD")
        .to_uppercase();
    Some(Price {
        currency,
        input_per_million: input,
        output_per_million: output,
        input_cache_hit_per_million: optional_number(pricing.get("input_cache_hit_per_million")),
        input_cache_write_per_million: optional_number(
            pricing.get("input_cache_write_per_million"),
        ),
    })
}

/// The price of `model_name` among `/api/models`' `models`: looked up by configured
/// `name`, by provider `model`, then by their lowercase forms; entries whose prices are
/// both ≤ 0 count as unpriced.
pub fn price_of(model_name: Option<&str>, models: &Value) -> Option<Price> {
    let name = model_name?;
    let lower = name.to_lowercase();
    let field = |model: &Value, key: &str| {
        model
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_default()
    };
    models.as_array()?.iter().find_map(|model| {
        let (own, provider) = (field(model, "name"), field(model, "model"));
        let named = own == name
            || provider == name
            || own.to_lowercase() == lower
            || provider.to_lowercase() == lower;
        named.then(|| price_of_entry(model)).flatten()
    })
}

/// Whether any configured model has a price.
pub fn has_prices(models: &Value) -> bool {
    models
        .as_array()
        .is_some_and(|models| models.iter().any(|m| price_of_entry(m).is_some()))
}

/// What `usage` costs at `price`, rounded to 6 decimals: cache reads and writes at their
/// own prices.
pub fn usage_cost(usage: &CardUsage, price: &Price) -> f64 {
    let tokens = crate::cost::Tokens {
        input: usage.input_tokens,
        output: usage.output_tokens,
        cache_read: usage.cache_read_tokens,
        cache_write: usage.cache_write_tokens,
    };
    round6(cost(&tokens, price))
}

/// A card's cost: its usage at its model's price, once both are known.
pub fn card_cost(
    usage: Option<&CardUsage>,
    model_name: Option<&str>,
    models: &Value,
) -> Option<Cost> {
    let usage = usage?;
    let price = price_of(model_name, models)?;
    Some(Cost {
        amount: usage_cost(usage, &price),
        currency: price.currency,
    })
}

fn grouped(digits: u64) -> String {
    let text = digits.to_string();
    let mut out = String::with_capacity(text.len() + text.len() / 3);
    for (position, digit) in text.chars().enumerate() {
        if position > 0 && (text.len() - position).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// An amount as people read it: `$` before US dollars, the code after other currencies;
/// from 1 up two decimals with grouped digits, below 1 two significant digits.
pub fn format_cost(amount: f64, currency: &str) -> String {
    let micros = if amount.is_finite() && amount > 0.0 {
        (amount * 1e6).round() as u64
    } else {
        0
    };
    let digits = micros.to_string().len() as u32;
    let unit = 10u64.pow(digits.saturating_sub(2));
    let rounded = if micros < 1_000_000 {
        (micros + unit / 2) / unit * unit
    } else {
        micros
    };
    let number = if rounded == 0 {
        "0".to_owned()
    } else if rounded >= 1_000_000 {
        let cents = (rounded + 5_000) / 10_000;
        format!("{}.{:02}", grouped(cents / 100), cents % 100)
    } else {
        let fraction = format!("{rounded:06}");
        format!("0.{}", fraction.trim_end_matches('0'))
    };
    let currency = currency.to_uppercase();
    if currency == "USD" {
        format!("${number}")
    } else {
        format!("{number} {currency}")
    }
}

/// A card's cost label, or `None` until its usage and its model's price are known.
pub fn cost_label(
    usage: Option<&CardUsage>,
    model_name: Option<&str>,
    models: &Value,
) -> Option<String> {
    card_cost(usage, model_name, models).map(|cost| format_cost(cost.amount, &cost.currency))
}

/// What stopped runs spent (`/token-usage`'s `stopped_runs`, docs/usage-and-cost.md#thread-token-usage), which the totals
/// leave out: `+ 1,993 tokens, $0.004 in 1 stopped run`; `None` when no run stopped.
pub fn stopped_runs_line(stopped: &Value) -> Option<String> {
    let runs = stopped
        .get("runs")
        .and_then(crate::task_result::non_negative_integer)
        .filter(|runs| *runs > 0)?;
    let tokens = stopped
        .get("total_tokens")
        .and_then(crate::task_result::non_negative_integer)
        .unwrap_or(0);
    let cost = stopped.get("cost").filter(|c| c.is_object());
    let money = cost
        .and_then(|cost| {
            let amount = cost.get("total")?.as_f64()?;
            Some(format!(
                ", {}",
                format_cost(amount, cost.get("currency")?.as_str()?)
            ))
        })
        .unwrap_or_default();
    let noun = if runs == 1 { "run" } else { "runs" };
    Some(format!(
        "+ {} tokens{money} in {runs} stopped {noun}",
        grouped(tokens)
    ))
}
