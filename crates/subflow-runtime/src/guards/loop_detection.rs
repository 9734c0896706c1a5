//! Loop detection (docs/events.md): spot a model that keeps calling the same tools,
//! warn it once, then force a final answer.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use subflow_contracts::messages::{AiMessage, ToolCall};

/// Lines per `read_file` bucket: re-reading nearby ranges of a file counts as the same call.
const READ_FILE_BUCKET_LINES: i64 = 200;

/// Argument fields that identify what a generic tool call acts on.
const SALIENT_FIELDS: [&str; 7] = ["path", "url", "query", "command", "pattern", "glob", "cmd"];

const IDENTICAL_WARNING: &str = "[LOOP DETECTED] You are repeating the same tool calls. Stop calling tools and produce your final answer now. If you cannot complete the task, summarize what you accomplished so far.";
const IDENTICAL_STOP: &str = "[FORCED STOP] Repeated tool calls exceeded the safety limit. Producing final answer with results collected so far.";

/// `loop_detection.*` (docs/events.md#loop-detection).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoopDetectionConfig {
    /// Whether a detector is attached to the lead and every subagent execution.
    pub enabled: bool,
    /// Identical call sets in the window that trigger a warning.
    pub warn_threshold: usize,
    /// Identical call sets in the window that force a stop.
    pub hard_limit: usize,
    /// Responses remembered for identical-call-set counting.
    pub window_size: usize,
    /// Threads whose state is kept (least recently used evicted first).
    pub max_tracked_threads: usize,
    /// Calls of one tool in the window that trigger a warning.
    pub tool_freq_warn: usize,
    /// Calls of one tool in the window that force a stop.
    pub tool_freq_hard_limit: usize,
    /// Per-tool thresholds replacing `tool_freq_warn` and `tool_freq_hard_limit`.
    pub tool_freq_overrides: BTreeMap<String, ToolFreqOverride>,
}

/// Tool-frequency thresholds for one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFreqOverride {
    /// Calls that trigger a warning.
    pub warn: usize,
    /// Calls that force a stop.
    pub hard_limit: usize,
}

impl Default for LoopDetectionConfig {
    fn default() -> Self {
        LoopDetectionConfig {
            enabled: true,
            warn_threshold: 3,
            hard_limit: 5,
            window_size: 20,
            max_tracked_threads: 100,
            tool_freq_warn: 30,
            tool_freq_hard_limit: 50,
            tool_freq_overrides: BTreeMap::new(),
        }
    }
}

impl LoopDetectionConfig {
    /// Checks the rules of docs/configuration.md#ranges-and-rules; the error names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        let key = |name: &str| format!("loop_detection.{name}");
        for (name, value) in [
            ("warn_threshold", self.warn_threshold),
            ("hard_limit", self.hard_limit),
            ("window_size", self.window_size),
            ("max_tracked_threads", self.max_tracked_threads),
            ("tool_freq_warn", self.tool_freq_warn),
            ("tool_freq_hard_limit", self.tool_freq_hard_limit),
        ] {
            at_least_one(&key(name), value)?;
        }
        not_below(
            (&key("hard_limit"), self.hard_limit),
            (&key("warn_threshold"), self.warn_threshold),
        )?;
        not_below(
            (&key("tool_freq_hard_limit"), self.tool_freq_hard_limit),
            (&key("tool_freq_warn"), self.tool_freq_warn),
        )?;
        for (tool, thresholds) in &self.tool_freq_overrides {
            let key = |name: &str| format!("loop_detection.tool_freq_overrides.{tool}.{name}");
            at_least_one(&key("warn"), thresholds.warn)?;
            at_least_one(&key("hard_limit"), thresholds.hard_limit)?;
            not_below(
                (&key("hard_limit"), thresholds.hard_limit),
                (&key("warn"), thresholds.warn),
            )?;
        }
        Ok(())
    }

    /// The (warn, hard) frequency thresholds in force for `tool`.
    fn frequency_thresholds(&self, tool: &str) -> (usize, usize) {
        self.tool_freq_overrides
            .get(tool)
            .map_or((self.tool_freq_warn, self.tool_freq_hard_limit), |o| {
                (o.warn, o.hard_limit)
            })
    }

    /// Calls remembered for tool-frequency counting: enough to reach every hard limit.
    fn frequency_window(&self) -> usize {
        let largest_override = self
            .tool_freq_overrides
            .values()
            .map(|o| o.hard_limit)
            .max()
            .unwrap_or(0);
        self.window_size
            .max(self.tool_freq_hard_limit)
            .max(largest_override)
    }
}

fn at_least_one(key: &str, value: usize) -> Result<(), String> {
    if value >= 1 {
        Ok(())
    } else {
        Err(format!("{key} ({value}) must be >= 1"))
    }
}

fn not_below((key, value): (&str, usize), (floor_key, floor): (&str, usize)) -> Result<(), String> {
    if value >= floor {
        Ok(())
    } else {
        Err(format!("{key} ({value}) must be >= {floor_key} ({floor})"))
    }
}

/// Which layer detected a loop (`changes.detection_layer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DetectionLayer {
    /// Layer 1: the same set of calls repeated.
    IdenticalCallSet,
    /// Layer 2: one tool called too often.
    ToolFrequency,
}

impl DetectionLayer {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            DetectionLayer::IdenticalCallSet => "identical_call_set",
            DetectionLayer::ToolFrequency => "tool_frequency",
        }
    }
}

/// The outcome of checking one model response.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detection {
    /// Nothing to do.
    None,
    /// Queue `message` for the next model call and record a `warn` event.
    Warn {
        /// The layer that fired.
        layer: DetectionLayer,
        /// The tools involved, sorted and distinct.
        tool_names: Vec<String>,
        /// Occurrences in the window, this response included.
        count: usize,
        /// The effective warn threshold.
        threshold: usize,
        /// The warning text.
        message: String,
    },
    /// Replace the response with [`super::hard_stop`] and stop with `loop_capped`.
    HardStop {
        /// The layer that fired.
        layer: DetectionLayer,
        /// The tools involved, sorted and distinct.
        tool_names: Vec<String>,
        /// Occurrences in the window, this response included.
        count: usize,
        /// The effective hard limit.
        threshold: usize,
        /// The text appended to the final answer.
        stop_text: String,
    },
}

impl Detection {
    /// Whether this is a hard stop.
    pub fn is_hard_stop(&self) -> bool {
        matches!(self, Detection::HardStop { .. })
    }
}

/// The `middleware:loop_detection` event content (docs/events.md#the-loop-detection-event); `None` for [`Detection::None`].
pub fn loop_event_content(
    detection: &Detection,
    is_subagent: bool,
    agent_id: Option<&str>,
) -> Option<Value> {
    // Only names and counts leave: never arguments, content or argument-derived hashes.
    let (action, layer, tool_names, count, threshold) = match detection {
        Detection::None => return None,
        Detection::Warn {
            layer,
            tool_names,
            count,
            threshold,
            ..
        } => ("warn", layer, tool_names, count, threshold),
        Detection::HardStop {
            layer,
            tool_names,
            count,
            threshold,
            ..
        } => ("hard_stop", layer, tool_names, count, threshold),
    };
    Some(json!({
        "name": "LoopDetectionMiddleware",
        "hook": "after_model",
        "action": action,
        "changes": {
            "is_subagent": is_subagent,
            "agent_id": agent_id,
            "detection_layer": layer.as_str(),
            "tool_names": tool_names,
            "count": count,
            "threshold": threshold,
        },
    }))
}

/// Loop state of one thread.
#[derive(Debug, Default)]
struct ThreadState {
    /// LRU stamp.
    last_used: u64,
    /// Call-set hashes of the last `window_size` responses, oldest first.
    call_sets: VecDeque<u64>,
    /// Hashes already warned about while still in the window.
    warned_sets: HashSet<u64>,
    /// Tool names of the last calls, oldest first.
    calls: VecDeque<String>,
    /// Occurrences of each name in `calls`.
    call_counts: HashMap<String, usize>,
    /// Tools warned about whose count has not yet fallen below their warn threshold.
    warned_tools: HashSet<String>,
}

/// Loop state per thread key, the least recently used key evicted past
/// `max_tracked_threads`. The runtime keeps one detector for every lead run of the process
/// (keyed by thread) and a fresh one per subagent execution (keyed by execution).
#[derive(Debug)]
pub struct LoopDetector {
    config: LoopDetectionConfig,
    frequency_window: usize,
    threads: HashMap<String, ThreadState>,
    clock: u64,
}

impl LoopDetector {
    /// A detector with no history; `config` should have passed [`LoopDetectionConfig::validate`].
    pub fn new(config: LoopDetectionConfig) -> Self {
        LoopDetector {
            frequency_window: config.frequency_window(),
            config,
            threads: HashMap::new(),
            clock: 0,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &LoopDetectionConfig {
        &self.config
    }

    /// Threads currently tracked.
    pub fn tracked_threads(&self) -> usize {
        self.threads.len()
    }

    /// Forgets a thread's history.
    pub fn reset_thread(&mut self, thread_key: &str) {
        self.threads.remove(thread_key);
    }

    /// Checks one model response; responses without tool calls are ignored.
    pub fn after_model(&mut self, thread_key: &str, message: &AiMessage) -> Detection {
        if !self.config.enabled || message.tool_calls.is_empty() {
            return Detection::None;
        }
        let config = &self.config;
        let frequency_window = self.frequency_window;
        let state = touch(
            &mut self.threads,
            &mut self.clock,
            config.max_tracked_threads,
            thread_key,
        );
        let layer1 = identical_call_set(config, state, &message.tool_calls);
        if !matches!(layer1, Detection::None) {
            return layer1;
        }
        tool_frequency(config, frequency_window, state, &message.tool_calls)
    }
}

/// The state of `thread_key`, created if new, marked most recently used; evicts the
/// least recently used thread beyond `max_threads`.
fn touch<'a>(
    threads: &'a mut HashMap<String, ThreadState>,
    clock: &mut u64,
    max_threads: usize,
    thread_key: &str,
) -> &'a mut ThreadState {
    *clock += 1;
    if !threads.contains_key(thread_key) {
        // A linear scan is fine: max_tracked_threads is small (100 by default).
        while threads.len() >= max_threads.max(1) {
            let Some(oldest) = threads
                .iter()
                .min_by_key(|(_, state)| state.last_used)
                .map(|(key, _)| key.clone())
            else {
                break;
            };
            threads.remove(&oldest);
        }
    }
    let state = threads.entry(thread_key.to_owned()).or_default();
    state.last_used = *clock;
    state
}

/// Layer 1: count this response's call set among the last `window_size` responses.
fn identical_call_set(
    config: &LoopDetectionConfig,
    state: &mut ThreadState,
    calls: &[ToolCall],
) -> Detection {
    let hash = call_set_hash(calls);
    state.call_sets.push_back(hash);
    while state.call_sets.len() > config.window_size {
        state.call_sets.pop_front();
    }
    // A hash that left the window starts a fresh episode; this also bounds the set.
    let window = &state.call_sets;
    state.warned_sets.retain(|warned| window.contains(warned));
    let count = window.iter().filter(|&&h| h == hash).count();
    let tool_names = || {
        let mut names: Vec<String> = calls.iter().map(|call| call.name.clone()).collect();
        names.sort();
        names.dedup();
        names
    };
    if count >= config.hard_limit {
        return Detection::HardStop {
            layer: DetectionLayer::IdenticalCallSet,
            tool_names: tool_names(),
            count,
            threshold: config.hard_limit,
            stop_text: IDENTICAL_STOP.to_owned(),
        };
    }
    if count >= config.warn_threshold && state.warned_sets.insert(hash) {
        return Detection::Warn {
            layer: DetectionLayer::IdenticalCallSet,
            tool_names: tool_names(),
            count,
            threshold: config.warn_threshold,
            message: IDENTICAL_WARNING.to_owned(),
        };
    }
    Detection::None
}

/// Layer 2: count each tool name over the last `window` calls.
///
/// Like the reference, calls of a response Layer 1 fired on are not counted here.
fn tool_frequency(
    config: &LoopDetectionConfig,
    window: usize,
    state: &mut ThreadState,
    calls: &[ToolCall],
) -> Detection {
    for call in calls.iter().filter(|call| !call.name.is_empty()) {
        state.calls.push_back(call.name.clone());
        *state.call_counts.entry(call.name.clone()).or_default() += 1;
    }
    while state.calls.len() > window {
        let Some(oldest) = state.calls.pop_front() else {
            break;
        };
        if let Some(count) = state.call_counts.get_mut(&oldest) {
            *count -= 1;
            if *count == 0 {
                state.call_counts.remove(&oldest);
            }
        }
    }
    let counts = &state.call_counts;
    let count_of = |tool: &str| counts.get(tool).copied().unwrap_or(0);
    // Falling back below the warn threshold re-arms the warning.
    state
        .warned_tools
        .retain(|tool| count_of(tool) >= config.frequency_thresholds(tool).0);

    let mut names: Vec<&str> = Vec::new();
    for call in calls {
        if !call.name.is_empty() && !names.contains(&call.name.as_str()) {
            names.push(&call.name);
        }
    }
    for &tool in &names {
        let (_, hard) = config.frequency_thresholds(tool);
        let count = count_of(tool);
        if count >= hard {
            return Detection::HardStop {
                layer: DetectionLayer::ToolFrequency,
                tool_names: vec![tool.to_owned()],
                count,
                threshold: hard,
                stop_text: format!(
                    "[FORCED STOP] Tool {tool} called {count} times — exceeded the per-tool safety limit. Producing final answer with results collected so far."
                ),
            };
        }
    }
    for &tool in &names {
        let (warn, _) = config.frequency_thresholds(tool);
        let count = count_of(tool);
        if count >= warn && state.warned_tools.insert(tool.to_owned()) {
            return Detection::Warn {
                layer: DetectionLayer::ToolFrequency,
                tool_names: vec![tool.to_owned()],
                count,
                threshold: warn,
                message: format!(
                    "[LOOP DETECTED] You have called {tool} {count} times without producing a final answer. Stop calling tools and produce your final answer now. If you cannot complete the task, summarize what you accomplished so far."
                ),
            };
        }
    }
    Detection::None
}

/// An order-independent hash of a response's calls. It never leaves the process, so
/// std's SipHash with its fixed default keys is enough.
fn call_set_hash(calls: &[ToolCall]) -> u64 {
    let mut keys: Vec<String> = calls
        .iter()
        .map(|call| format!("{}:{}", call.name, stable_key(&call.name, &call.args)))
        .collect();
    keys.sort();
    let mut hasher = DefaultHasher::new();
    keys.hash(&mut hasher);
    hasher.finish()
}

/// The part of a call's arguments that says what it acts on (docs/events.md#loop-detection).
fn stable_key(name: &str, args: &Value) -> String {
    // Some providers send the arguments as a JSON string.
    let parsed;
    let args = match args {
        Value::String(raw) => match serde_json::from_str::<Value>(raw) {
            Ok(value @ Value::Object(_)) => {
                parsed = value;
                &parsed
            }
            Ok(other) => return canonical_json(&other),
            Err(_) => return raw.clone(),
        },
        other => other,
    };
    let Value::Object(fields) = args else {
        return canonical_json(args);
    };
    match name {
        "read_file" => {
            let path = match fields.get("path") {
                Some(Value::String(path)) => path.clone(),
                None | Some(Value::Null) => String::new(),
                Some(other) => canonical_json(other),
            };
            let start = line_number(fields.get("start_line")).unwrap_or(1);
            let end = line_number(fields.get("end_line")).unwrap_or(start);
            let bucket = |line: i64| (line.max(1) - 1) / READ_FILE_BUCKET_LINES;
            format!(
                "{path}:{}-{}",
                bucket(start.min(end)),
                bucket(start.max(end))
            )
        }
        // Content-sensitive: successive edits of one file are progress, not a loop.
        "write_file" | "str_replace" => canonical_json(args),
        _ => {
            let salient: serde_json::Map<String, Value> = SALIENT_FIELDS
                .iter()
                .filter_map(|&field| {
                    fields
                        .get(field)
                        .filter(|value| !value.is_null())
                        .map(|value| (field.to_owned(), value.clone()))
                })
                .collect();
            if salient.is_empty() {
                canonical_json(args)
            } else {
                canonical_json(&Value::Object(salient))
            }
        }
    }
}

/// A line number given as an integer, a float or a numeric string.
fn line_number(value: Option<&Value>) -> Option<i64> {
    match value? {
        Value::Number(number) => number
            .as_i64()
            .or_else(|| number.as_f64().map(|f| f as i64)),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

/// JSON with object keys sorted at every level, so key order does not change the key.
fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(fields) => {
            let mut entries: Vec<(&String, &Value)> = fields.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (index, (key, value)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(value, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(calls: &[(&str, Value)]) -> AiMessage {
        AiMessage {
            content: json!(""),
            tool_calls: calls
                .iter()
                .enumerate()
                .map(|(i, (name, args))| ToolCall::new(format!("c{i}"), *name, args.clone()))
                .collect(),
            ..AiMessage::default()
        }
    }

    fn config(edit: impl FnOnce(&mut LoopDetectionConfig)) -> LoopDetectionConfig {
        let mut config = LoopDetectionConfig::default();
        edit(&mut config);
        config
    }

    /// What a detection boils down to in the tables below: layer, tool names joined
    /// by commas, count and threshold.
    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Nothing,
        Warn(DetectionLayer, String, usize, usize),
        Stop(DetectionLayer, String, usize, usize),
    }
    use DetectionLayer::{IdenticalCallSet as L1, ToolFrequency as L2};
    use Seen::Nothing;

    fn warn(layer: DetectionLayer, names: &str, count: usize, threshold: usize) -> Seen {
        Seen::Warn(layer, names.to_owned(), count, threshold)
    }

    fn stop(layer: DetectionLayer, names: &str, count: usize, threshold: usize) -> Seen {
        Seen::Stop(layer, names.to_owned(), count, threshold)
    }

    fn seen(detection: &Detection) -> Seen {
        match detection {
            Detection::None => Nothing,
            Detection::Warn {
                layer,
                tool_names,
                count,
                threshold,
                ..
            } => Seen::Warn(*layer, tool_names.join(","), *count, *threshold),
            Detection::HardStop {
                layer,
                tool_names,
                count,
                threshold,
                ..
            } => Seen::Stop(*layer, tool_names.join(","), *count, *threshold),
        }
    }

    /// Feeds `steps` (one response each) to a fresh detector on one thread and checks
    /// every outcome.
    fn check(config: LoopDetectionConfig, steps: &[(AiMessage, Seen)]) {
        let mut detector = LoopDetector::new(config);
        for (index, (message, expected)) in steps.iter().enumerate() {
            let got = detector.after_model("t1", message);
            assert_eq!(seen(&got), *expected, "step {index}: {got:?}");
        }
    }

    fn bash(command: &str) -> AiMessage {
        response(&[("bash", json!({"command": command}))])
    }

    #[test]
    fn defaults_match_the_spec() {
        let parsed: LoopDetectionConfig = serde_json::from_value(json!({})).unwrap();
        assert_eq!(parsed, LoopDetectionConfig::default());
        let d = parsed;
        assert!(d.enabled);
        assert_eq!(
            (
                d.warn_threshold,
                d.hard_limit,
                d.window_size,
                d.max_tracked_threads
            ),
            (3, 5, 20, 100)
        );
        assert_eq!((d.tool_freq_warn, d.tool_freq_hard_limit), (30, 50));
        assert!(d.tool_freq_overrides.is_empty());
        assert_eq!(d.validate(), Ok(()));
        let partial: LoopDetectionConfig = serde_json::from_value(
            json!({"hard_limit": 7, "tool_freq_overrides": {"web_search": {"warn": 6, "hard_limit": 10}}}),
        )
        .unwrap();
        assert_eq!((partial.warn_threshold, partial.hard_limit), (3, 7));
        assert_eq!(
            partial.tool_freq_overrides["web_search"],
            ToolFreqOverride {
                warn: 6,
                hard_limit: 10
            }
        );
    }

    #[test]
    fn validation_names_the_key() {
        let check = |config: LoopDetectionConfig, expected: &str| {
            assert_eq!(config.validate(), Err(expected.to_owned()));
        };
        check(
            config(|c| c.hard_limit = 2),
            "loop_detection.hard_limit (2) must be >= loop_detection.warn_threshold (3)",
        );
        check(
            config(|c| c.warn_threshold = 0),
            "loop_detection.warn_threshold (0) must be >= 1",
        );
        check(
            config(|c| c.window_size = 0),
            "loop_detection.window_size (0) must be >= 1",
        );
        check(
            config(|c| c.max_tracked_threads = 0),
            "loop_detection.max_tracked_threads (0) must be >= 1",
        );
        check(
            config(|c| c.tool_freq_warn = 0),
            "loop_detection.tool_freq_warn (0) must be >= 1",
        );
        check(
            config(|c| c.tool_freq_hard_limit = 29),
            "loop_detection.tool_freq_hard_limit (29) must be >= loop_detection.tool_freq_warn (30)",
        );
        let with_override = |warn, hard_limit| {
            config(|c| {
                c.tool_freq_overrides
                    .insert("bash".into(), ToolFreqOverride { warn, hard_limit });
            })
        };
        check(
            with_override(5, 4),
            "loop_detection.tool_freq_overrides.bash.hard_limit (4) must be >= loop_detection.tool_freq_overrides.bash.warn (5)",
        );
        check(
            with_override(0, 4),
            "loop_detection.tool_freq_overrides.bash.warn (0) must be >= 1",
        );
        assert_eq!(with_override(5, 5).validate(), Ok(()));
        assert!(serde_json::from_value::<LoopDetectionConfig>(json!({"hard_limit": -1})).is_err());
    }

    #[test]
    fn call_sets_hash_the_same_in_any_order() {
        let a = ("web_search", json!({"query": "rust", "max_results": 5}));
        let b = ("read_file", json!({"path": "a.md"}));
        assert_eq!(
            call_set_hash(&response(&[a.clone(), b.clone()]).tool_calls),
            call_set_hash(&response(&[b.clone(), a.clone()]).tool_calls)
        );
        assert_ne!(
            call_set_hash(&response(&[a.clone(), b.clone()]).tool_calls),
            call_set_hash(&response(&[a.clone(), a.clone()]).tool_calls),
        );
        check(
            LoopDetectionConfig::default(),
            &[
                (response(&[a.clone(), b.clone()]), Nothing),
                (response(&[b.clone(), a.clone()]), Nothing),
                (response(&[a, b]), warn(L1, "read_file,web_search", 3, 3)),
            ],
        );
    }

    #[test]
    fn stable_keys_follow_the_per_tool_rules() {
        let same = |name: &str, x: Value, y: Value, expected: bool| {
            assert_eq!(
                stable_key(name, &x) == stable_key(name, &y),
                expected,
                "{name}: {x} vs {y}"
            );
        };
        // read_file: path plus the line range bucketed by 200 lines.
        same(
            "read_file",
            json!({"path": "a", "start_line": 1, "end_line": 50}),
            json!({"path": "a", "start_line": 150, "end_line": 200}),
            true,
        );
        same(
            "read_file",
            json!({"path": "a", "start_line": 1, "end_line": 200}),
            json!({"path": "a", "start_line": 1, "end_line": 201}),
            false,
        );
        same(
            "read_file",
            json!({"path": "a"}),
            json!({"path": "a", "start_line": "1", "end_line": 10}),
            true,
        );
        same(
            "read_file",
            json!({"path": "a", "start_line": 250}),
            json!({"path": "a", "start_line": 399, "end_line": 201}),
            true,
        );
        same(
            "read_file",
            json!({"path": "a"}),
            json!({"path": "b"}),
            false,
        );
        // write_file and str_replace: the full args.
        same(
            "write_file",
            json!({"path": "a", "content": "1"}),
            json!({"path": "a", "content": "2"}),
            false,
        );
        same(
            "str_replace",
            json!({"path": "a", "old": "x", "new": "y"}),
            json!({"new": "y", "old": "x", "path": "a"}),
            true,
        );
        // Others: the salient fields only, else the full args.
        same(
            "web_search",
            json!({"query": "q", "max_results": 5}),
            json!({"query": "q", "max_results": 9}),
            true,
        );
        same(
            "bash",
            json!({"command": "ls", "timeout": 1}),
            json!({"command": "pwd", "timeout": 1}),
            false,
        );
        same(
            "custom",
            json!({"a": 1, "b": {"y": 2, "x": 1}}),
            json!({"b": {"x": 1, "y": 2}, "a": 1}),
            true,
        );
        same("custom", json!({"a": 1}), json!({"a": 2}), false);
        same(
            "custom",
            json!({"query": null, "a": 1}),
            json!({"query": null, "a": 2}),
            false,
        );
        // Arguments sent as a JSON string.
        same(
            "bash",
            json!("{\"command\": \"ls\"}"),
            json!({"command": "ls"}),
            true,
        );
        same("bash", json!("not json"), json!("not json"), true);
    }

    #[test]
    fn identical_sets_warn_once_then_hard_stop() {
        let ls = || bash("ls");
        check(
            LoopDetectionConfig::default(),
            &[
                (ls(), Nothing),
                (ls(), Nothing),
                (ls(), warn(L1, "bash", 3, 3)),
                (ls(), Nothing),
                (ls(), stop(L1, "bash", 5, 5)),
            ],
        );
        // Each hash warns on its own.
        check(
            config(|c| c.warn_threshold = 2),
            &[
                (bash("ls"), Nothing),
                (bash("pwd"), Nothing),
                (bash("ls"), warn(L1, "bash", 2, 2)),
                (bash("pwd"), warn(L1, "bash", 2, 2)),
                (bash("ls"), Nothing),
            ],
        );
    }

    #[test]
    fn texts_match_the_spec() {
        let mut detector = LoopDetector::new(config(|c| {
            c.warn_threshold = 1;
            c.hard_limit = 2;
        }));
        let Detection::Warn { message, .. } = detector.after_model("t", &bash("ls")) else {
            panic!("warn")
        };
        assert_eq!(
            message,
            "[LOOP DETECTED] You are repeating the same tool calls. Stop calling tools and produce your final answer now. If you cannot complete the task, summarize what you accomplished so far."
        );
        let Detection::HardStop { stop_text, .. } = detector.after_model("t", &bash("ls")) else {
            panic!("stop")
        };
        assert_eq!(
            stop_text,
            "[FORCED STOP] Repeated tool calls exceeded the safety limit. Producing final answer with results collected so far."
        );

        let mut detector = LoopDetector::new(config(|c| {
            c.tool_freq_warn = 1;
            c.tool_freq_hard_limit = 2;
        }));
        let Detection::Warn { message, .. } = detector.after_model("t", &bash("a")) else {
            panic!("warn")
        };
        assert_eq!(
            message,
            "[LOOP DETECTED] You have called bash 1 times without producing a final answer. Stop calling tools and produce your final answer now. If you cannot complete the task, summarize what you accomplished so far."
        );
        let Detection::HardStop { stop_text, .. } = detector.after_model("t", &bash("b")) else {
            panic!("stop")
        };
        assert_eq!(
            stop_text,
            "[FORCED STOP] Tool bash called 2 times — exceeded the per-tool safety limit. Producing final answer with results collected so far."
        );
    }

    #[test]
    fn repeats_outside_the_window_are_forgotten() {
        let c = config(|c| c.window_size = 3);
        let ls = || bash("ls");
        let other = |n: &str| bash(n);
        check(
            c.clone(),
            &[
                (ls(), Nothing),
                (ls(), Nothing),
                (other("a"), Nothing),
                (other("b"), Nothing), // window [ls, a, b]
                (ls(), Nothing),       // [a, b, ls]: the first two have left
                (ls(), Nothing),       // [b, ls, ls]
                (ls(), warn(L1, "bash", 3, 3)),
            ],
        );
        // Once a warned hash has left the window entirely, a new episode warns again.
        check(
            c,
            &[
                (ls(), Nothing),
                (ls(), Nothing),
                (ls(), warn(L1, "bash", 3, 3)),
                (other("a"), Nothing),
                (other("b"), Nothing),
                (other("c"), Nothing),
                (ls(), Nothing),
                (ls(), Nothing),
                (ls(), warn(L1, "bash", 3, 3)),
            ],
        );
    }

    #[test]
    fn responses_without_tool_calls_and_disabled_detectors_do_nothing() {
        let text_only = AiMessage {
            content: json!("done"),
            ..AiMessage::default()
        };
        let mut detector = LoopDetector::new(config(|c| c.warn_threshold = 1));
        assert_eq!(detector.after_model("t", &text_only), Detection::None);
        assert_eq!(detector.tracked_threads(), 0);
        let mut disabled = LoopDetector::new(config(|c| {
            c.enabled = false;
            c.warn_threshold = 1;
            c.hard_limit = 1;
        }));
        for _ in 0..10 {
            assert_eq!(disabled.after_model("t", &bash("ls")), Detection::None);
        }
    }

    #[test]
    fn threads_are_tracked_apart_with_an_lru() {
        let mut detector = LoopDetector::new(config(|c| {
            c.max_tracked_threads = 2;
            c.warn_threshold = 2;
            c.hard_limit = 9;
        }));
        assert_eq!(detector.after_model("a", &bash("ls")), Detection::None);
        assert_eq!(
            detector.after_model("b", &bash("ls")),
            Detection::None,
            "threads do not share counts"
        );
        assert_eq!(
            seen(&detector.after_model("a", &bash("ls"))),
            warn(L1, "bash", 2, 2)
        );
        // a was used last, so adding c evicts b.
        assert_eq!(detector.after_model("c", &bash("ls")), Detection::None);
        assert_eq!(detector.tracked_threads(), 2);
        assert_eq!(
            detector.after_model("b", &bash("ls")),
            Detection::None,
            "b was evicted and starts over"
        );
        assert_eq!(detector.tracked_threads(), 2);
        detector.reset_thread("b");
        assert_eq!(detector.tracked_threads(), 1);
    }

    #[test]
    fn tool_frequency_warns_decays_and_rewarns() {
        // Window = max(window_size 4, hard 6) = 6 calls.
        let c = config(|c| {
            c.window_size = 4;
            c.tool_freq_warn = 3;
            c.tool_freq_hard_limit = 6;
        });
        let read = |n: u32| response(&[("read_file", json!({"path": format!("f{n}")}))]);
        let ls = |n: u32| response(&[("ls", json!({"path": format!("d{n}")}))]);
        check(
            c,
            &[
                (read(1), Nothing),
                (read(2), Nothing),
                (read(3), warn(L2, "read_file", 3, 3)),
                (read(4), Nothing), // warned once while at or above 3
                (ls(1), Nothing),
                (ls(2), Nothing),
                // window: r2 r3 r4 ls1 ls2 ls3 -> read_file 3, ls 3
                (ls(3), warn(L2, "ls", 3, 3)),
                (ls(4), Nothing),   // r3 r4 ls1..ls4 -> read_file 2: re-armed
                (read(5), Nothing), // r4 ls1..ls4 r5 -> 2
                (read(6), Nothing), // ls1..ls4 r5 r6 -> 2
                (read(7), warn(L2, "read_file", 3, 3)),
            ],
        );
    }

    #[test]
    fn tool_frequency_stops_bursts() {
        let c = config(|c| {
            c.tool_freq_warn = 3;
            c.tool_freq_hard_limit = 5;
        });
        let reads = |from: u32, n: u32| {
            let calls: Vec<(&str, Value)> = (from..from + n)
                .map(|i| ("read_file", json!({"path": format!("f{i}")})))
                .collect();
            response(&calls)
        };
        check(
            c.clone(),
            &[
                (reads(0, 2), Nothing),
                (reads(10, 4), stop(L2, "read_file", 6, 5)),
            ],
        );
        // A single burst past the hard limit stops straight away.
        check(c, &[(reads(0, 5), stop(L2, "read_file", 5, 5))]);
    }

    #[test]
    fn tool_frequency_overrides_replace_thresholds_and_widen_the_window() {
        let c = config(|c| {
            c.window_size = 2;
            c.tool_freq_warn = 2;
            c.tool_freq_hard_limit = 3;
            c.tool_freq_overrides.insert(
                "web_search".into(),
                ToolFreqOverride {
                    warn: 4,
                    hard_limit: 6,
                },
            );
        });
        assert_eq!(c.frequency_window(), 6);
        let search = |n: u32| response(&[("web_search", json!({"query": format!("q{n}")}))]);
        check(
            c,
            &[
                (search(1), Nothing),
                (search(2), Nothing),
                (search(3), Nothing), // the default hard limit 3 does not apply
                (search(4), warn(L2, "web_search", 4, 4)),
                (search(5), Nothing),
                (search(6), stop(L2, "web_search", 6, 6)),
            ],
        );
    }

    #[test]
    fn layer_two_is_skipped_when_layer_one_fires() {
        let c = config(|c| {
            c.warn_threshold = 2;
            c.hard_limit = 4;
            c.tool_freq_warn = 2;
            c.tool_freq_hard_limit = 10;
        });
        check(
            c,
            &[
                (bash("ls"), Nothing),
                // Both layers would fire; only Layer 1 does, and its calls are not counted.
                (bash("ls"), warn(L1, "bash", 2, 2)),
                (bash("pwd"), warn(L2, "bash", 2, 2)),
                (bash("ls"), Nothing),
                (bash("ls"), stop(L1, "bash", 4, 4)),
            ],
        );
    }

    #[test]
    fn events_carry_counts_and_names_only() {
        let secret_args = json!({"command": "cat /etc/SECRET-ARG", "token": "SECRET-TOKEN"});
        let message = response(&[("bash", secret_args)]);
        let hash = call_set_hash(&message.tool_calls);
        let mut detector = LoopDetector::new(config(|c| {
            c.warn_threshold = 1;
            c.hard_limit = 2;
        }));
        let warn = detector.after_model("t", &message);
        let stop = detector.after_model("t", &message);

        assert_eq!(loop_event_content(&Detection::None, false, None), None);
        let lead = loop_event_content(&warn, false, None).unwrap();
        assert_eq!(
            lead,
            json!({"name": "LoopDetectionMiddleware", "hook": "after_model", "action": "warn",
                   "changes": {"is_subagent": false, "agent_id": null,
                               "detection_layer": "identical_call_set", "tool_names": ["bash"],
                               "count": 1, "threshold": 1}})
        );
        let sub = loop_event_content(&stop, true, Some("general-purpose")).unwrap();
        assert_eq!(sub["action"], json!("hard_stop"));
        assert_eq!(sub["changes"]["is_subagent"], json!(true));
        assert_eq!(sub["changes"]["agent_id"], json!("general-purpose"));
        assert_eq!(sub["changes"]["count"], json!(2));
        assert_eq!(sub["changes"]["threshold"], json!(2));

        for event in [lead, sub] {
            let text = event.to_string();
            for forbidden in [
                "SECRET",
                "cat ",
                "/etc",
                "[LOOP",
                "[FORCED",
                &hash.to_string(),
                &format!("{hash:x}"),
            ] {
                assert!(!text.contains(forbidden), "{forbidden} in {text}");
            }
        }
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        assert_eq!(
            canonical_json(&json!({"b": [{"z": 1, "a": "é"}], "a": null})),
            r#"{"a":null,"b":[{"a":"é","z":1}]}"#
        );
    }
}
