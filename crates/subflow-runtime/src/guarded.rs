//! The guards as one agent loop uses them: warnings injected at the next model call,
//! hard stops that rewrite the response, and the loop-detection audit event.

use std::sync::{Arc, Mutex};

use serde_json::Value;
use subflow_contracts::messages::{AiMessage, Message};

use crate::budget::{BudgetEvent, SharedSpend};
use crate::guards::{
    BUDGET_WARNING_NAME, BudgetCheck, Detection, LoopDetectionConfig, LoopDetector, TokenBudget,
    TokenBudgetConfig, WarningQueue, hard_stop, loop_event_content,
};
use crate::metrics::RuntimeMetrics;

/// Which guard ended an agent loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GuardStop {
    /// Loop detection hard stop (`loop_capped`).
    Loop,
    /// Token budget hard stop (`token_capped`).
    Token,
    /// Money budget hard stop (`token_capped`, `budget_kind: "cost"`).
    Cost,
}

/// The loop detector a [`Guards`] checks with.
#[derive(Debug)]
enum Detector {
    /// A subagent execution's fresh detector.
    Own(LoopDetector),
    /// The process's lead detector, whose per-thread state outlives a run and is
    /// bounded by its LRU (`loop_detection.max_tracked_threads`).
    Shared(Arc<Mutex<LoopDetector>>),
}

impl Detector {
    fn after_model(&mut self, thread_key: &str, ai: &AiMessage) -> Detection {
        match self {
            Detector::Own(detector) => detector.after_model(thread_key, ai),
            Detector::Shared(detector) => detector
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .after_model(thread_key, ai),
        }
    }
}

/// The guard state of one agent execution (the lead's run, or one subagent).
#[derive(Debug)]
pub(crate) struct Guards {
    detector: Option<Detector>,
    budget: Option<TokenBudget>,
    money: Option<Arc<SharedSpend>>,
    loop_warnings: WarningQueue,
    budget_warnings: WarningQueue,
    is_subagent: bool,
    agent_id: Option<String>,
    metrics: Arc<dyn RuntimeMetrics>,
}

impl Guards {
    /// Fresh guards of the subagent `agent_id` (its definition name), with a fresh loop
    /// detector. Loop detections are counted in `metrics`.
    pub fn new(
        loops: &LoopDetectionConfig,
        budget: &TokenBudgetConfig,
        agent_id: &str,
        metrics: Arc<dyn RuntimeMetrics>,
    ) -> Self {
        let detector = loops
            .enabled
            .then(|| Detector::Own(LoopDetector::new(loops.clone())));
        Guards::with_detector(detector, budget, Some(agent_id), metrics)
    }

    /// Guards of one lead run, checking loops with the process's lead detector
    /// (`None` when loop detection is off); warnings and the budget are the run's own.
    pub fn for_lead(
        detector: Option<Arc<Mutex<LoopDetector>>>,
        budget: &TokenBudgetConfig,
        metrics: Arc<dyn RuntimeMetrics>,
    ) -> Self {
        Guards::with_detector(detector.map(Detector::Shared), budget, None, metrics)
    }

    fn with_detector(
        detector: Option<Detector>,
        budget: &TokenBudgetConfig,
        agent_id: Option<&str>,
        metrics: Arc<dyn RuntimeMetrics>,
    ) -> Self {
        Guards {
            detector,
            budget: budget.enabled.then(|| TokenBudget::new(budget.clone())),
            money: None,
            loop_warnings: WarningQueue::loop_warnings(),
            budget_warnings: WarningQueue::new(BUDGET_WARNING_NAME),
            is_subagent: agent_id.is_some(),
            agent_id: agent_id.map(str::to_owned),
            metrics,
        }
    }

    /// Charges every priced call to `money` (a run's, or a batch item's, spend).
    pub fn with_money(mut self, money: Option<Arc<SharedSpend>>) -> Self {
        self.money = money;
        self
    }

    /// Warnings queued since the last model call, as trailing human messages.
    pub fn injections(&mut self) -> Vec<Message> {
        [
            self.loop_warnings.take_injection(),
            self.budget_warnings.take_injection(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Checks one model response. Returns the response to keep (rewritten on a hard
    /// stop) and which guard stopped the loop, if one did. Loop-detection transitions are
    /// handed to `record` as `middleware:loop_detection` content, money budget crossings
    /// to `crossed`.
    pub fn after_model(
        &mut self,
        thread_key: &str,
        ai: AiMessage,
        record: impl Fn(Value),
        crossed: impl FnOnce(Vec<BudgetEvent>),
    ) -> (AiMessage, Option<GuardStop>) {
        let mut money_stop = None;
        if let (Some(money), Some(usage)) = (&self.money, &ai.usage_metadata) {
            let model = ai
                .response_metadata
                .get("model_name")
                .and_then(Value::as_str);
            let charged = money.charge(model, usage);
            for (scope, ratio) in &charged.ratios {
                self.metrics.budget_spent(scope.as_str(), *ratio);
            }
            if !charged.events.is_empty() {
                crossed(charged.events);
            }
            money_stop = charged.stop;
        }
        if let (Some(budget), Some(usage)) = (self.budget.as_mut(), ai.usage_metadata) {
            match budget.observe(usage.input_tokens, usage.output_tokens) {
                BudgetCheck::None => {}
                BudgetCheck::Warn(text) => self.budget_warnings.push(text),
                BudgetCheck::HardStop(text) => {
                    return (hard_stop(&ai, &text), Some(GuardStop::Token));
                }
            }
        }
        if let Some(text) = money_stop {
            return (hard_stop(&ai, &text), Some(GuardStop::Cost));
        }
        let Some(detector) = self.detector.as_mut().filter(|_| !ai.tool_calls.is_empty()) else {
            return (ai, None);
        };
        let detection = detector.after_model(thread_key, &ai);
        if let Some(content) =
            loop_event_content(&detection, self.is_subagent, self.agent_id.as_deref())
        {
            let action = content["action"].as_str().unwrap_or_default();
            let layer = content["changes"]["detection_layer"]
                .as_str()
                .unwrap_or_default();
            self.metrics.loop_detection(layer, action, self.is_subagent);
            record(content);
        }
        match detection {
            Detection::None => (ai, None),
            Detection::Warn { message, .. } => {
                self.loop_warnings.push(message);
                (ai, None)
            }
            Detection::HardStop { stop_text, .. } => {
                (hard_stop(&ai, &stop_text), Some(GuardStop::Loop))
            }
        }
    }
}
