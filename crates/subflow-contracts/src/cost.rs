//! The one price function (docs/usage-and-cost.md#cost): every surface that shows money
//! (task cards in Rust and, mirrored line for line, in `cards.mjs`; `/tasks`; batches and
//! their projections; `/token-usage`; `subflow usage`; `subflow_cost_total`) prices the
//! same usage buckets with [`cost`], so they agree to the micro-unit.
//!
//! Input counts include cache reads and cache writes, as providers report them once
//! normalised: cache reads are priced at the cache-hit price, cache writes at the
//! cache-write price, the rest of the input at the input price.

use serde::{Deserialize, Serialize};

/// A model's prices per million tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Price {
    /// Upper-case currency code.
    pub currency: String,
    /// Uncached input.
    pub input_per_million: f64,
    /// Output.
    pub output_per_million: f64,
    /// Input read from the provider's cache; the input price when absent.
    #[serde(default)]
    pub input_cache_hit_per_million: Option<f64>,
    /// Input written to the provider's cache; the input price when absent.
    #[serde(default)]
    pub input_cache_write_per_million: Option<f64>,
}

impl Price {
    /// Whether it prices anything: an input or output price above 0. Entries whose two
    /// prices are both ≤ 0 count as unpriced.
    pub fn is_priced(&self) -> bool {
        self.input_per_million > 0.0 || self.output_per_million > 0.0
    }
}

/// The token counts one cost is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tokens {
    /// Input, cache reads and writes included.
    pub input: u64,
    /// Output.
    pub output: u64,
    /// Input read from the cache.
    pub cache_read: u64,
    /// Input written to the cache.
    pub cache_write: u64,
}

impl Tokens {
    /// Counts from signed store columns: negatives count as 0.
    pub fn of_signed(input: i64, output: i64, cache_read: i64, cache_write: i64) -> Tokens {
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Tokens {
            input: count(input),
            output: count(output),
            cache_read: count(cache_read),
            cache_write: count(cache_write),
        }
    }
}

/// What pricing needs to know about a configured model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelFacts {
    /// Configured name.
    pub name: String,
    /// Provider model id.
    pub model: String,
    /// `context_window`.
    pub context_window: Option<u64>,
    /// `pricing`, if any.
    pub pricing: Option<Price>,
}

/// The price of a model name: by configured name, by provider model, then lowercase forms.
/// Entries whose input and output prices are both ≤ 0 count as unpriced.
pub fn price_of<'a>(models: &'a [ModelFacts], name: &str) -> Option<&'a Price> {
    let lower = name.to_lowercase();
    let matches = |m: &&ModelFacts| {
        m.name == name
            || m.model == name
            || m.name.to_lowercase() == lower
            || m.model.to_lowercase() == lower
    };
    models
        .iter()
        .filter(matches)
        .filter_map(|m| m.pricing.as_ref())
        .find(|p| p.is_priced())
}

/// One priced amount of `tokens` at `model`'s price, by the one price function; `None`
/// when the model has no price or nothing was used.
pub fn priced(models: &[ModelFacts], model: &str, tokens: &Tokens) -> Option<RunCost> {
    if tokens.input == 0 && tokens.output == 0 {
        return None;
    }
    let price = price_of(models, model)?;
    Some((
        model.to_owned(),
        price.currency.to_uppercase(),
        cost(tokens, price),
    ))
}

/// One priced amount of a run: (model, upper-case currency, unrounded cost).
pub type RunCost = (String, String, f64);

/// What `tokens` cost at `price`, unrounded: cache reads are clamped to the input and
/// cache writes to what input is left, so a cost is never negative and never above the
/// same usage all uncached at the higher of the prices.
///
/// `uncached/1e6·input + cache_read/1e6·hit + cache_write/1e6·write + output/1e6·output`
pub fn cost(tokens: &Tokens, price: &Price) -> f64 {
    let cache_read = tokens.cache_read.min(tokens.input);
    let cache_write = tokens.cache_write.min(tokens.input - cache_read);
    let uncached = tokens.input - cache_read - cache_write;
    let hit = price
        .input_cache_hit_per_million
        .unwrap_or(price.input_per_million);
    let write = price
        .input_cache_write_per_million
        .unwrap_or(price.input_per_million);
    uncached as f64 / 1e6 * price.input_per_million
        + cache_read as f64 / 1e6 * hit
        + cache_write as f64 / 1e6 * write
        + tokens.output as f64 / 1e6 * price.output_per_million
}

/// `value` rounded to 6 decimals (the micro-unit), as every amount is reported.
pub fn round6(value: f64) -> f64 {
    (value * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn costs_are_never_negative_and_caching_never_costs_more_than_the_dearer_price(
            input in 0u64..10_000_000, output in 0u64..10_000_000,
            read in 0u64..20_000_000, written in 0u64..20_000_000,
            hit in 0.0f64..5.0, write in 0.0f64..10.0,
        ) {
            let price = Price { input_cache_hit_per_million: Some(hit), input_cache_write_per_million: Some(write), ..price() };
            let cached = Tokens { input, output, cache_read: read, cache_write: written };
            let plain = Tokens { input, output, ..Tokens::default() };
            let at_dearest = Price { input_per_million: price.input_per_million.max(hit).max(write), ..price.clone() };
            let amount = cost(&cached, &price);
            prop_assert!(amount >= 0.0);
            prop_assert!(amount <= cost(&plain, &at_dearest) + 1e-9);
        }
    }

    fn price() -> Price {
        Price {
            currency: "USD".into(),
            input_per_million: 3.0,
            output_per_million: 15.0,
            input_cache_hit_per_million: Some(0.3),
            input_cache_write_per_million: Some(3.75),
        }
    }

    #[test]
    fn each_kind_of_input_is_priced_at_its_own_price() {
        let tokens = Tokens {
            input: 10_000,
            output: 1_000,
            cache_read: 6_000,
            cache_write: 2_000,
        };
        // 2,000 uncached at 3, 6,000 read at 0.3, 2,000 written at 3.75, 1,000 out at 15.
        let expected = 0.006 + 0.0018 + 0.0075 + 0.015;
        assert!((cost(&tokens, &price()) - expected).abs() < 1e-12);
        assert_eq!(round6(cost(&tokens, &price())), 0.0303);
    }

    #[test]
    fn absent_cache_prices_are_the_input_price_and_cache_counts_are_clamped() {
        let plain = Price {
            input_cache_hit_per_million: None,
            input_cache_write_per_million: None,
            ..price()
        };
        let cached = Tokens {
            input: 1_000,
            output: 0,
            cache_read: 700,
            cache_write: 300,
        };
        let uncached = Tokens {
            input: 1_000,
            ..Tokens::default()
        };
        assert_eq!(cost(&cached, &plain), cost(&uncached, &plain));
        let over = Tokens {
            input: 100,
            output: 0,
            cache_read: 80,
            cache_write: 500,
        };
        // 80 read, 20 written, nothing uncached.
        let expected = 80.0 / 1e6 * 0.3 + 20.0 / 1e6 * 3.75;
        assert!((cost(&over, &price()) - expected).abs() < 1e-15);
        assert_eq!(Tokens::of_signed(-5, 3, -1, 2).input, 0);
    }
}
