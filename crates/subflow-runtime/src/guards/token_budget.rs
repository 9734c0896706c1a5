//! The token budget (docs/events.md#other-guards): warn as a run or subagent execution nears its token
//! limits, and force a final answer once it reaches them.

use serde::{Deserialize, Serialize};

/// `token_budget.*` (docs/events.md#other-guards).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TokenBudgetConfig {
    /// Whether the budget is enforced.
    pub enabled: bool,
    /// Limit on input plus output tokens.
    pub max_tokens: u64,
    /// Optional limit on input tokens.
    pub max_input_tokens: Option<u64>,
    /// Optional limit on output tokens.
    pub max_output_tokens: Option<u64>,
    /// Fraction of a limit that queues a warning.
    pub warn_threshold: f64,
    /// Fraction of a limit that forces a stop.
    pub hard_stop_threshold: f64,
}

impl Default for TokenBudgetConfig {
    fn default() -> Self {
        TokenBudgetConfig {
            enabled: false,
            max_tokens: 200_000,
            max_input_tokens: None,
            max_output_tokens: None,
            warn_threshold: 0.8,
            hard_stop_threshold: 1.0,
        }
    }
}

/// Smallest `token_budget.max_tokens` accepted.
const MIN_MAX_TOKENS: u64 = 1000;

impl TokenBudgetConfig {
    /// Checks the rules of docs/configuration.md#ranges-and-rules; the error names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_tokens < MIN_MAX_TOKENS {
            return Err(format!(
                "token_budget.max_tokens ({}) must be >= {MIN_MAX_TOKENS}",
                self.max_tokens
            ));
        }
        for (key, limit) in [
            ("max_input_tokens", self.max_input_tokens),
            ("max_output_tokens", self.max_output_tokens),
        ] {
            if limit == Some(0) {
                return Err(format!("token_budget.{key} (0) must be >= 1"));
            }
        }
        let warn = self.warn_threshold;
        if !(warn.is_finite() && warn > 0.0) {
            return Err(format!("token_budget.warn_threshold ({warn}) must be > 0"));
        }
        let hard = self.hard_stop_threshold;
        if !(hard.is_finite() && hard >= warn) {
            return Err(format!(
                "token_budget.hard_stop_threshold ({hard}) must be >= token_budget.warn_threshold ({warn})"
            ));
        }
        Ok(())
    }
}

/// Which limit a budget message is about (`{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetReason {
    /// `max_tokens`, on input plus output.
    Total,
    /// `max_input_tokens`.
    Input,
    /// `max_output_tokens`.
    Output,
}

impl BudgetReason {
    /// The word used in the texts.
    pub const fn as_str(self) -> &'static str {
        match self {
            BudgetReason::Total => "total",
            BudgetReason::Input => "input",
            BudgetReason::Output => "output",
        }
    }

    const fn index(self) -> usize {
        match self {
            BudgetReason::Total => 0,
            BudgetReason::Input => 1,
            BudgetReason::Output => 2,
        }
    }
}

/// The outcome of observing one model call's usage.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetCheck {
    /// Within budget.
    None,
    /// Queue this warning for the next model call.
    Warn(String),
    /// Replace the response with [`super::hard_stop`] using this text; stop with `token_capped`.
    HardStop(String),
}

impl BudgetCheck {
    /// Whether this is a hard stop.
    pub fn is_hard_stop(&self) -> bool {
        matches!(self, BudgetCheck::HardStop(_))
    }
}

/// Cumulative usage of one run or one subagent execution against its budget.
#[derive(Debug, Clone)]
pub struct TokenBudget {
    config: TokenBudgetConfig,
    input: u64,
    output: u64,
    warned: [bool; 3],
}

impl TokenBudget {
    /// A budget with nothing used; `config` should have passed [`TokenBudgetConfig::validate`].
    pub fn new(config: TokenBudgetConfig) -> Self {
        TokenBudget {
            config,
            input: 0,
            output: 0,
            warned: [false; 3],
        }
    }

    /// Input and output tokens observed so far.
    pub fn used(&self) -> (u64, u64) {
        (self.input, self.output)
    }

    /// Adds one model call's usage and checks every configured limit.
    pub fn observe(&mut self, input: u64, output: u64) -> BudgetCheck {
        // When several limits trip at once, the message is about the one used the most
        // (highest fraction; ties go to total, then input, then output), as the
        // reference does. A hard stop wins over a warning; each limit warns at most once,
        // and a limit not reported this time is reported at the next call.
        if !self.config.enabled {
            return BudgetCheck::None;
        }
        self.input = self.input.saturating_add(input);
        self.output = self.output.saturating_add(output);
        let limits = self.limits();

        let hard = self.config.hard_stop_threshold;
        if let Some((reason, used, budget, _)) = most_used(&limits, |_, f| f >= hard) {
            return BudgetCheck::HardStop(format!(
                "[TOKEN BUDGET EXCEEDED] The {} token usage ({}) has exceeded the safety limit ({}). Producing final answer with results collected so far.",
                reason.as_str(),
                grouped(used),
                grouped(budget),
            ));
        }

        let warn = self.config.warn_threshold;
        let warned = self.warned;
        if let Some((reason, used, budget, fraction)) =
            most_used(&limits, |reason, f| f >= warn && !warned[reason.index()])
        {
            self.warned[reason.index()] = true;
            return BudgetCheck::Warn(format!(
                "[TOKEN BUDGET WARNING] You have used {} of your {} {} token budget ({:.0}%). Wrap up your current work and produce a final answer. Avoid starting new tool calls unless absolutely necessary.",
                grouped(used),
                grouped(budget),
                reason.as_str(),
                fraction * 100.0,
            ));
        }
        BudgetCheck::None
    }

    /// (reason, used, limit) for every configured limit, total first.
    fn limits(&self) -> Vec<(BudgetReason, u64, u64)> {
        let mut limits = vec![(
            BudgetReason::Total,
            self.input.saturating_add(self.output),
            self.config.max_tokens,
        )];
        // Zero is rejected by validation; treating it as unset avoids dividing by it.
        if let Some(limit) = self.config.max_input_tokens.filter(|&l| l > 0) {
            limits.push((BudgetReason::Input, self.input, limit));
        }
        if let Some(limit) = self.config.max_output_tokens.filter(|&l| l > 0) {
            limits.push((BudgetReason::Output, self.output, limit));
        }
        limits
    }
}

/// The limit with the highest used fraction among those `eligible`, earliest on ties.
fn most_used(
    limits: &[(BudgetReason, u64, u64)],
    eligible: impl Fn(BudgetReason, f64) -> bool,
) -> Option<(BudgetReason, u64, u64, f64)> {
    let mut best: Option<(BudgetReason, u64, u64, f64)> = None;
    for &(reason, used, limit) in limits {
        let fraction = used as f64 / limit.max(1) as f64;
        if eligible(reason, fraction) && best.is_none_or(|(.., top)| fraction > top) {
            best = Some((reason, used, limit, fraction));
        }
    }
    best
}

/// `n` with thousands separators, as the reference formats these numbers (`{:,}`).
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn enabled(edit: impl FnOnce(&mut TokenBudgetConfig)) -> TokenBudgetConfig {
        let mut config = TokenBudgetConfig {
            enabled: true,
            ..TokenBudgetConfig::default()
        };
        edit(&mut config);
        config
    }

    fn warning(used: &str, budget: &str, reason: &str, percent: u32) -> BudgetCheck {
        BudgetCheck::Warn(format!(
            "[TOKEN BUDGET WARNING] You have used {used} of your {budget} {reason} token budget ({percent}%). Wrap up your current work and produce a final answer. Avoid starting new tool calls unless absolutely necessary."
        ))
    }

    fn exceeded(reason: &str, used: &str, budget: &str) -> BudgetCheck {
        BudgetCheck::HardStop(format!(
            "[TOKEN BUDGET EXCEEDED] The {reason} token usage ({used}) has exceeded the safety limit ({budget}). Producing final answer with results collected so far."
        ))
    }

    /// Feeds (input, output) usages to a fresh budget and checks every outcome.
    fn check(config: TokenBudgetConfig, steps: &[((u64, u64), BudgetCheck)]) {
        let mut budget = TokenBudget::new(config);
        for (index, ((input, output), expected)) in steps.iter().enumerate() {
            assert_eq!(budget.observe(*input, *output), *expected, "step {index}");
        }
    }

    #[test]
    fn defaults_match_the_spec() {
        let parsed: TokenBudgetConfig = serde_json::from_value(json!({})).unwrap();
        assert_eq!(parsed, TokenBudgetConfig::default());
        assert!(!parsed.enabled);
        assert_eq!(parsed.max_tokens, 200_000);
        assert_eq!(
            (parsed.max_input_tokens, parsed.max_output_tokens),
            (None, None)
        );
        assert_eq!(
            (parsed.warn_threshold, parsed.hard_stop_threshold),
            (0.8, 1.0)
        );
        assert_eq!(parsed.validate(), Ok(()));
        let partial: TokenBudgetConfig =
            serde_json::from_value(json!({"enabled": true, "max_input_tokens": 5000})).unwrap();
        assert_eq!(partial.max_input_tokens, Some(5000));
        assert_eq!(partial.max_tokens, 200_000);
    }

    #[test]
    fn validation_names_the_key() {
        let check = |config: TokenBudgetConfig, expected: &str| {
            assert_eq!(config.validate(), Err(expected.to_owned()));
        };
        check(
            enabled(|c| c.max_tokens = 999),
            "token_budget.max_tokens (999) must be >= 1000",
        );
        check(
            enabled(|c| c.max_input_tokens = Some(0)),
            "token_budget.max_input_tokens (0) must be >= 1",
        );
        check(
            enabled(|c| c.max_output_tokens = Some(0)),
            "token_budget.max_output_tokens (0) must be >= 1",
        );
        check(
            enabled(|c| c.warn_threshold = 0.0),
            "token_budget.warn_threshold (0) must be > 0",
        );
        check(
            enabled(|c| c.hard_stop_threshold = 0.5),
            "token_budget.hard_stop_threshold (0.5) must be >= token_budget.warn_threshold (0.8)",
        );
        assert_eq!(enabled(|c| c.max_tokens = 1000).validate(), Ok(()));
        assert_eq!(
            enabled(|c| c.hard_stop_threshold = 0.8).validate(),
            Ok(()),
            "hard may equal warn"
        );
    }

    #[test]
    fn a_disabled_budget_never_fires() {
        let mut budget = TokenBudget::new(TokenBudgetConfig::default());
        assert_eq!(budget.observe(10_000_000, 10_000_000), BudgetCheck::None);
    }

    #[test]
    fn the_total_limit_warns_once_then_stops() {
        check(
            enabled(|_| {}),
            &[
                ((100_000, 50_000), BudgetCheck::None),
                ((9_000, 1_000), warning("160,000", "200,000", "total", 80)),
                ((10_000, 0), BudgetCheck::None),
                ((29_000, 999), BudgetCheck::None),
                ((1, 0), exceeded("total", "200,000", "200,000")),
                ((1, 0), exceeded("total", "200,001", "200,000")),
            ],
        );
    }

    #[test]
    fn the_input_and_output_limits_trip_on_their_own() {
        let config = enabled(|c| {
            c.max_tokens = 1_000_000;
            c.max_input_tokens = Some(10_000);
            c.max_output_tokens = Some(2_000);
        });
        check(
            config.clone(),
            &[
                ((8_500, 100), warning("8,500", "10,000", "input", 85)),
                ((1_000, 100), BudgetCheck::None),
                ((500, 0), exceeded("input", "10,000", "10,000")),
            ],
        );
        check(
            config.clone(),
            &[
                ((100, 1_700), warning("1,700", "2,000", "output", 85)),
                ((100, 400), exceeded("output", "2,100", "2,000")),
            ],
        );
        // Both near their limits at once: the fuller one speaks first, the other next.
        check(
            config,
            &[
                ((8_000, 1_800), warning("1,800", "2,000", "output", 90)),
                ((0, 0), warning("8,000", "10,000", "input", 80)),
                ((0, 0), BudgetCheck::None),
            ],
        );
    }

    #[test]
    fn a_hard_stop_wins_over_a_pending_warning() {
        check(
            enabled(|c| {
                c.max_tokens = 10_000;
                c.max_output_tokens = Some(1_000);
            }),
            &[((7_900, 1_000), exceeded("output", "1,000", "1,000"))],
        );
        check(
            enabled(|c| {
                c.warn_threshold = 0.5;
                c.hard_stop_threshold = 0.9;
                c.max_tokens = 1_000;
            }),
            &[
                ((499, 0), BudgetCheck::None),
                ((1, 0), warning("500", "1,000", "total", 50)),
                ((400, 0), exceeded("total", "900", "1,000")),
            ],
        );
    }

    #[test]
    fn usage_is_cumulative() {
        let mut budget = TokenBudget::new(enabled(|_| {}));
        assert_eq!(budget.observe(3, 4), BudgetCheck::None);
        assert_eq!(budget.observe(5, 6), BudgetCheck::None);
        assert_eq!(budget.used(), (8, 10));
        assert!(!budget.observe(0, 0).is_hard_stop());
        assert!(budget.observe(u64::MAX, u64::MAX).is_hard_stop());
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        for (n, text) in [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (123_456, "123,456"),
            (1_234_567, "1,234,567"),
        ] {
            assert_eq!(grouped(n), text);
        }
    }
}
