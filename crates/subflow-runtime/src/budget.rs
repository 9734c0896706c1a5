//! Money budgets (docs/usage-and-cost.md#budgets): limits on what a run, a thread, a
//! user's day and a batch may spend, in the pricing currency.
//!
//! Every priced model call of a run (the lead's and its subagents') adds its cost to the
//! run's [`Spend`], which holds one running total per limited scope: the run's own
//! spend, and the thread's and the user's day's, each started from what was spent before
//! the run began. Crossing a warn fraction yields one `warn` [`BudgetEvent`] per scope and
//! fraction; reaching a limit yields one `hard_stop` and stops every execution of the run
//! at its next priced call, as a token-budget hard stop does. A batch item checks its
//! batch's limit the same way, from the batch's spend when the item started.

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use subflow_contracts::cost::{ModelFacts, cost, price_of, round6};
use subflow_contracts::messages::UsageMetadata;

/// `budgets.*` (docs/usage-and-cost.md#budgets).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetsConfig {
    /// Most one run (lead and subagents) may spend.
    pub run_max_cost: Option<f64>,
    /// Most one thread's runs and batches may spend, all told.
    pub thread_max_cost: Option<f64>,
    /// Most one user's runs and batches created in one UTC day may spend.
    pub user_daily_max_cost: Option<f64>,
    /// Most one batch's items may spend.
    pub batch_max_cost: Option<f64>,
    /// Fractions of a limit that warn, ascending, each in (0, 1).
    pub warn_fractions: Vec<f64>,
}

impl Default for BudgetsConfig {
    fn default() -> Self {
        BudgetsConfig {
            run_max_cost: None,
            thread_max_cost: None,
            user_daily_max_cost: None,
            batch_max_cost: None,
            warn_fractions: vec![0.8, 0.95],
        }
    }
}

impl BudgetsConfig {
    /// Checks the rules of docs/usage-and-cost.md#budgets; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        for scope in BudgetScope::ALL {
            if let Some(limit) = self.limit(scope)
                && !(limit.is_finite() && limit > 0.0)
            {
                return Err(format!("budgets.{} ({limit}) must be > 0", scope.key()));
            }
        }
        let mut previous = 0.0;
        for &fraction in &self.warn_fractions {
            if !(fraction.is_finite() && fraction > previous && fraction < 1.0) {
                return Err(format!(
                    "budgets.warn_fractions ({:?}) must ascend, each above 0 and below 1",
                    self.warn_fractions
                ));
            }
            previous = fraction;
        }
        Ok(())
    }

    /// The limit of `scope`, if one is set.
    pub fn limit(&self, scope: BudgetScope) -> Option<f64> {
        match scope {
            BudgetScope::Run => self.run_max_cost,
            BudgetScope::Thread => self.thread_max_cost,
            BudgetScope::UserDaily => self.user_daily_max_cost,
            BudgetScope::Batch => self.batch_max_cost,
        }
    }

    /// How far `spent` went against `scope`'s limit: the warn fractions it crossed, plus
    /// one once it reached the limit; 0 without a limit.
    pub fn level(&self, scope: BudgetScope, spent: f64) -> u32 {
        let Some(limit) = self.limit(scope) else {
            return 0;
        };
        let warned = self
            .warn_fractions
            .iter()
            .filter(|&&f| spent >= f * limit)
            .count();
        (warned + usize::from(spent >= limit)) as u32
    }

    /// The crossings between levels `from` (exclusive) and `to` (inclusive) of
    /// `scope` at `spent`, in order: warns, then the hard stop.
    pub fn crossings(
        &self,
        scope: BudgetScope,
        spent: f64,
        from: u32,
        to: u32,
    ) -> Vec<BudgetEvent> {
        let Some(limit) = self.limit(scope) else {
            return Vec::new();
        };
        (from..to)
            .map(|level| {
                let warn = self.warn_fractions.get(level as usize);
                BudgetEvent {
                    action: if warn.is_some() {
                        BudgetAction::Warn
                    } else {
                        BudgetAction::HardStop
                    },
                    scope,
                    limit,
                    spent: round6(spent),
                    fraction: warn.copied().unwrap_or(1.0),
                }
            })
            .collect()
    }

    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        BudgetScope::ALL
            .iter()
            .any(|&scope| self.limit(scope).is_some())
    }
}

/// What a budget limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetScope {
    /// One run, its subagents included.
    Run,
    /// One thread's runs and batches.
    Thread,
    /// One user's runs and batches created in one UTC day.
    UserDaily,
    /// One batch's items.
    Batch,
}

impl BudgetScope {
    /// Every scope, in the order they are reported.
    pub const ALL: [BudgetScope; 4] = [
        BudgetScope::Run,
        BudgetScope::Thread,
        BudgetScope::UserDaily,
        BudgetScope::Batch,
    ];

    /// `run`, `thread`, `user_daily` or `batch`: the `scope` of events and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            BudgetScope::Run => "run",
            BudgetScope::Thread => "thread",
            BudgetScope::UserDaily => "user_daily",
            BudgetScope::Batch => "batch",
        }
    }

    /// The `budgets.*` key of its limit.
    pub const fn key(self) -> &'static str {
        match self {
            BudgetScope::Run => "run_max_cost",
            BudgetScope::Thread => "thread_max_cost",
            BudgetScope::UserDaily => "user_daily_max_cost",
            BudgetScope::Batch => "batch_max_cost",
        }
    }
}

/// What a budget event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetAction {
    /// Spend crossed a warn fraction.
    Warn,
    /// Spend reached the limit.
    HardStop,
}

impl BudgetAction {
    /// `warn` or `hard_stop`.
    pub const fn as_str(self) -> &'static str {
        match self {
            BudgetAction::Warn => "warn",
            BudgetAction::HardStop => "hard_stop",
        }
    }
}

/// One crossing: the content of a `middleware:budget` event and of a `budget` webhook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetEvent {
    /// `warn` or `hard_stop`.
    pub action: BudgetAction,
    /// The scope whose limit it is.
    pub scope: BudgetScope,
    /// The limit.
    pub limit: f64,
    /// The scope's spend when it crossed, rounded to 6 places.
    pub spent: f64,
    /// The warn fraction crossed; 1 for a hard stop.
    pub fraction: f64,
}

impl BudgetEvent {
    /// The event's `content`.
    pub fn content(&self) -> Value {
        json!(self)
    }

    /// The text that replaces the stopped model response.
    pub fn stop_text(&self, currency: &str) -> String {
        format!(
            "[COST BUDGET EXCEEDED] The {} spend ({} {currency}) has reached its limit ({} {currency}). Producing final answer with results collected so far.",
            self.scope.as_str(),
            self.spent,
            self.limit,
        )
    }
}

/// One limited scope's running total.
#[derive(Debug, Clone, PartialEq)]
struct ScopeSpend {
    scope: BudgetScope,
    limit: f64,
    spent: f64,
    /// How many warn fractions have been reported.
    warned: usize,
    /// Whether the hard stop has been reported.
    stopped: bool,
}

/// The spend of one run or batch item against its budgets, as its calls are priced.
#[derive(Debug, Clone, PartialEq)]
pub struct Spend {
    fractions: Vec<f64>,
    scopes: Vec<ScopeSpend>,
}

impl Spend {
    /// A spend over the limited scopes among `started`, each from what it had spent
    /// before (0 for a run). Fractions the earlier spend already crossed were reported by
    /// whatever crossed them and are not reported again.
    pub fn new(config: &BudgetsConfig, started: &[(BudgetScope, f64)]) -> Self {
        let fractions = config.warn_fractions.clone();
        let scopes = started
            .iter()
            .filter_map(|&(scope, spent)| {
                let limit = config.limit(scope)?;
                Some(ScopeSpend {
                    scope,
                    limit,
                    spent,
                    warned: fractions.iter().filter(|&&f| spent >= f * limit).count(),
                    stopped: false,
                })
            })
            .collect();
        Spend { fractions, scopes }
    }

    /// Whether no scope is limited (nothing to check).
    pub fn is_empty(&self) -> bool {
        self.scopes.is_empty()
    }

    /// Adds one call's cost. Returns the crossings to report (warns first, in fraction
    /// order, then any hard stop) and whether some limit is reached, which stops the
    /// execution whether or not its hard stop was reported before.
    pub fn add(&mut self, cost: f64) -> (Vec<BudgetEvent>, bool) {
        let mut events = Vec::new();
        let mut over = false;
        for scope in &mut self.scopes {
            scope.spent += cost.max(0.0);
            let spent = round6(scope.spent);
            while scope.warned < self.fractions.len()
                && scope.spent >= self.fractions[scope.warned] * scope.limit
            {
                events.push(BudgetEvent {
                    action: BudgetAction::Warn,
                    scope: scope.scope,
                    limit: scope.limit,
                    spent,
                    fraction: self.fractions[scope.warned],
                });
                scope.warned += 1;
            }
            if scope.spent >= scope.limit {
                over = true;
                if !scope.stopped {
                    scope.stopped = true;
                    events.push(BudgetEvent {
                        action: BudgetAction::HardStop,
                        scope: scope.scope,
                        limit: scope.limit,
                        spent,
                        fraction: 1.0,
                    });
                }
            }
        }
        (events, over)
    }

    /// Each limited scope's (scope, limit, spent so far).
    pub fn totals(&self) -> Vec<(BudgetScope, f64, f64)> {
        self.scopes
            .iter()
            .map(|s| (s.scope, s.limit, s.spent))
            .collect()
    }
}

/// What was spent before a run began, from the store (docs/usage-and-cost.md#budgets).
#[async_trait]
pub trait SpendHistory: Send + Sync + fmt::Debug {
    /// What `thread_id`'s runs and batches have spent, and what `user_id`'s runs and
    /// batches created since the start of today (UTC) have spent, `run_id` left out.
    async fn spent_before(
        &self,
        user_id: &str,
        thread_id: &str,
        run_id: &str,
    ) -> Result<(f64, f64), String>;

    /// The mean cost of one item that reported usage in `user_id`'s earlier batches of
    /// `subagent_type`, or `None` when none did: what a new batch's projection is made of.
    async fn item_cost(&self, user_id: &str, subagent_type: &str) -> Result<Option<f64>, String>;
}

/// The budgets a runtime enforces: the limits, the prices calls are charged at, and
/// where earlier spend is read from.
#[derive(Debug, Clone)]
pub struct Budgets {
    /// `budgets.*`.
    pub config: BudgetsConfig,
    /// The configured models' prices.
    pub models: Arc<[ModelFacts]>,
    /// Earlier spend.
    pub history: Arc<dyn SpendHistory>,
}

impl Budgets {
    /// The currency amounts are in: the first priced model's, upper-case.
    pub fn currency(&self) -> String {
        self.models
            .iter()
            .find_map(|m| m.pricing.as_ref().filter(|p| p.is_priced()))
            .map_or_else(|| "USD".to_owned(), |p| p.currency.to_uppercase())
    }

    /// What one call with `usage` at `model` costs; 0 when the model has no price.
    pub fn charge(&self, model: Option<&str>, usage: &UsageMetadata) -> f64 {
        model
            .and_then(|model| price_of(&self.models, model))
            .map_or(0.0, |price| cost(&usage.tokens(), price))
    }

    /// The spend of a new run of `user_id` in `thread_id`: its own limit, and the
    /// thread's and the user's day's from what they spent before. A history that cannot
    /// be read counts as nothing spent (logged).
    pub async fn for_run(&self, user_id: &str, thread_id: &str, run_id: &str) -> Spend {
        let mut started = vec![(BudgetScope::Run, 0.0)];
        let wanted = |scope| self.config.limit(scope).is_some();
        if wanted(BudgetScope::Thread) || wanted(BudgetScope::UserDaily) {
            match self.history.spent_before(user_id, thread_id, run_id).await {
                Ok((thread, day)) => {
                    started.push((BudgetScope::Thread, thread));
                    started.push((BudgetScope::UserDaily, day));
                }
                Err(error) => {
                    tracing::warn!(%error, run_id, "reading earlier spend failed; the budgets start from 0");
                    started.push((BudgetScope::Thread, 0.0));
                    started.push((BudgetScope::UserDaily, 0.0));
                }
            }
        }
        Spend::new(&self.config, &started)
    }
}

/// A run's (or a batch item's) spend, shared by its executions.
#[derive(Debug)]
pub(crate) struct SharedSpend {
    budgets: Arc<Budgets>,
    spend: Mutex<Spend>,
}

/// What one priced call did to the budgets.
#[derive(Debug, Default)]
pub(crate) struct Charged {
    /// Crossings to report.
    pub events: Vec<BudgetEvent>,
    /// The text a stopped response gets, when some limit is reached.
    pub stop: Option<String>,
    /// Each limited scope's spent / limit after the call.
    pub ratios: Vec<(BudgetScope, f64)>,
}

impl SharedSpend {
    /// `spend` charged at `budgets`' prices; `None` when it limits nothing.
    pub fn new(budgets: Arc<Budgets>, spend: Spend) -> Option<Arc<Self>> {
        (!spend.is_empty()).then(|| {
            Arc::new(SharedSpend {
                budgets,
                spend: Mutex::new(spend),
            })
        })
    }

    /// Charges one call with `usage` at `model`.
    pub fn charge(&self, model: Option<&str>, usage: &UsageMetadata) -> Charged {
        let cost = self.budgets.charge(model, usage);
        let mut spend = self.spend.lock().unwrap_or_else(|p| p.into_inner());
        let (events, over) = spend.add(cost);
        let ratios = spend
            .totals()
            .into_iter()
            .map(|(scope, limit, spent)| (scope, spent / limit))
            .collect();
        let stop = over.then(|| {
            let currency = self.budgets.currency();
            // The fullest scope speaks for the stop.
            let totals = spend.totals();
            let (scope, limit, spent) = totals
                .iter()
                .copied()
                .filter(|(_, limit, spent)| spent >= limit)
                .max_by(|a, b| (a.2 / a.1).total_cmp(&(b.2 / b.1)))
                .expect("over means some scope reached its limit");
            BudgetEvent {
                action: BudgetAction::HardStop,
                scope,
                limit,
                spent: round6(spent),
                fraction: 1.0,
            }
            .stop_text(&currency)
        });
        Charged {
            events,
            stop,
            ratios,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BudgetsConfig {
        BudgetsConfig {
            run_max_cost: Some(1.0),
            thread_max_cost: Some(10.0),
            ..BudgetsConfig::default()
        }
    }

    fn actions(events: &[BudgetEvent]) -> Vec<(&'static str, &'static str, f64)> {
        events
            .iter()
            .map(|e| (e.scope.as_str(), e.action.as_str(), e.fraction))
            .collect()
    }

    #[test]
    fn defaults_and_validation() {
        let parsed: BudgetsConfig = serde_json::from_value(json!({})).unwrap();
        assert_eq!(parsed, BudgetsConfig::default());
        assert_eq!(parsed.warn_fractions, vec![0.8, 0.95]);
        assert!(!parsed.any());
        assert_eq!(parsed.validate(), Ok(()));
        let bad = BudgetsConfig {
            batch_max_cost: Some(0.0),
            ..BudgetsConfig::default()
        };
        assert_eq!(
            bad.validate(),
            Err("budgets.batch_max_cost (0) must be > 0".to_owned())
        );
        let unsorted = BudgetsConfig {
            warn_fractions: vec![0.9, 0.5],
            ..BudgetsConfig::default()
        };
        assert!(unsorted.validate().unwrap_err().contains("must ascend"));
        let whole = BudgetsConfig {
            warn_fractions: vec![1.0],
            ..BudgetsConfig::default()
        };
        assert!(whole.validate().is_err());
        assert!(serde_json::from_value::<BudgetsConfig>(json!({"run_max": 1})).is_err());
    }

    #[test]
    fn each_fraction_warns_once_then_the_limit_stops_every_call() {
        let mut spend = Spend::new(&config(), &[(BudgetScope::Run, 0.0)]);
        assert_eq!(spend.add(0.5), (vec![], false));
        let (events, over) = spend.add(0.35);
        assert_eq!(actions(&events), vec![("run", "warn", 0.8)]);
        assert_eq!((events[0].spent, over), (0.85, false));
        assert_eq!(spend.add(0.01), (vec![], false));
        let (events, over) = spend.add(0.2);
        assert_eq!(
            actions(&events),
            vec![("run", "warn", 0.95), ("run", "hard_stop", 1.0)]
        );
        assert!(over);
        assert_eq!(events[1].spent, 1.06);
        assert_eq!(spend.add(0.0), (vec![], true), "reported once, still over");
    }

    #[test]
    fn earlier_spend_starts_a_scope_and_its_crossed_fractions_stay_quiet() {
        let mut spend = Spend::new(
            &config(),
            &[
                (BudgetScope::Run, 0.0),
                (BudgetScope::Thread, 8.75),
                (BudgetScope::UserDaily, 100.0),
            ],
        );
        assert_eq!(spend.totals().len(), 2, "user_daily has no limit");
        let (events, over) = spend.add(0.9);
        assert_eq!(
            actions(&events),
            vec![("run", "warn", 0.8), ("thread", "warn", 0.95)]
        );
        assert!(!over);
        let (events, over) = spend.add(0.6);
        assert_eq!(
            actions(&events),
            vec![
                ("run", "warn", 0.95),
                ("run", "hard_stop", 1.0),
                ("thread", "hard_stop", 1.0)
            ]
        );
        assert!(over);
    }

    #[test]
    fn a_batch_reports_the_levels_it_passed() {
        let config = BudgetsConfig {
            batch_max_cost: Some(2.0),
            ..BudgetsConfig::default()
        };
        assert_eq!(config.level(BudgetScope::Batch, 1.5), 0);
        assert_eq!(config.level(BudgetScope::Batch, 1.6), 1);
        assert_eq!(config.level(BudgetScope::Batch, 1.9), 2);
        assert_eq!(config.level(BudgetScope::Batch, 2.5), 3);
        assert_eq!(config.level(BudgetScope::Run, 100.0), 0, "no run limit");
        let passed = config.crossings(BudgetScope::Batch, 2.5, 1, 3);
        assert_eq!(
            actions(&passed),
            vec![("batch", "warn", 0.95), ("batch", "hard_stop", 1.0)]
        );
        assert_eq!(passed[1].spent, 2.5);
    }

    #[test]
    fn a_stop_text_names_the_scope_and_amounts() {
        let event = BudgetEvent {
            action: BudgetAction::HardStop,
            scope: BudgetScope::UserDaily,
            limit: 2.0,
            spent: 2.000_1,
            fraction: 1.0,
        };
        assert_eq!(
            event.stop_text("USD"),
            "[COST BUDGET EXCEEDED] The user_daily spend (2.0001 USD) has reached its limit (2 USD). Producing final answer with results collected so far."
        );
        assert_eq!(
            event.content(),
            json!({"action": "hard_stop", "scope": "user_daily", "limit": 2.0, "spent": 2.0001, "fraction": 1.0})
        );
    }
}
