// The task card rules of docs/workspace.md#task-card as pure functions: no DOM, no network, no clock.
//
// The browser imports this very file, `node --test` runs the shared case table
// `web/cards.cases.json` against it, and `subflow tail` carries a Rust port
// (`subflow_contracts::task_card`) that runs the same table. A rule changes here, in
// the port and in the table together.
//
// Shapes (JSON, camelCase):
//   Usage  {inputTokens, outputTokens, totalTokens}
//   Step   {messageIndex, kind: "ai"|"tool", text, truncated,
//           toolCalls: [{name, args, argsTruncated}], toolName}
//   Brief  {kind: "ai"|"tool", text, toolName}: a step as a task summary gives it
//   Summary {stepCount, latestStep: Brief|null, resultStep: Brief|null}: from `/tasks`
//   Card   {id, subagentType, description, prompt, status: "in_progress"|"completed"|"failed",
//           toolMessage, result, error, stopReason, modelName, usage, latestMessage, steps,
//           summary: Summary|null}
//   Update a Card without `id`, every key optional: a shallow overlay.

/** `valid_status_values` of contracts/subagent_status_contract.json. */
export const SUBAGENT_STATUSES = Object.freeze([
  "completed",
  "failed",
  "cancelled",
  "timed_out",
  "polling_timed_out",
]);

/** `valid_stop_reason_values` of contracts/subagent_status_contract.json. */
export const SUBAGENT_STOP_REASONS = Object.freeze(["token_capped", "turn_capped", "loop_capped"]);

/** The pre-v2 status readers still accept (docs/events.md#reading-the-contract). */
export const LEGACY_MAX_TURNS_REACHED = "max_turns_reached";

/** How a card shows a task. */
export const CARD_STATUSES = Object.freeze(["in_progress", "completed", "failed"]);

/** Backfill page size and page cap (docs/workspace.md#task-card). */
export const BACKFILL_LIMIT = 500;
export const BACKFILL_MAX_PAGES = 100;

const UPDATE_KEYS = Object.freeze([
  "subagentType",
  "description",
  "prompt",
  "status",
  "toolMessage",
  "result",
  "error",
  "stopReason",
  "modelName",
  "usage",
  "latestMessage",
  "steps",
  "summary",
]);

const STOP_REASON_LABELS = Object.freeze({
  token_capped: "token budget",
  turn_capped: "turn budget",
  loop_capped: "repeated tool-call loop",
  safety_capped: "safety limit",
  subagent_limit_capped: "subagent delegation limit",
  model_length_capped: "model output length limit",
  orphan_recovered: "its process stopped",
});

const LEGACY_FAILURE_PREFIXES = Object.freeze([
  "Task timed out",
  "Task cancelled by user.",
  "Task polling timed out",
]);

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);
const nonBlank = (value) => typeof value === "string" && value.trim() !== "";
const isCount = (value) =>
  typeof value === "number" && Number.isInteger(value) && value >= 0 && value < 2 ** 64;
const isTerminal = (status) => status === "completed" || status === "failed";

/** A message `content` as text: a string as is; a list's strings and `text` fields joined by "\n", empties skipped. */
export function flattenContent(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  const parts = [];
  for (const item of content) {
    const text = typeof item === "string" ? item : isObject(item) ? item.text : undefined;
    if (typeof text === "string" && text !== "") parts.push(text);
  }
  return parts.join("\n");
}

/** A wire usage `{input_tokens, output_tokens, total_tokens}` whose three counts are whole and non-negative, else null. */
export function readUsage(value) {
  if (!isObject(value)) return null;
  const { input_tokens: input, output_tokens: output, total_tokens: total } = value;
  if (!isCount(input) || !isCount(output) || !isCount(total)) return null;
  const usage = { inputTokens: input, outputTokens: output, totalTokens: total };
  // The cache split, present only when > 0, prices the input exactly.
  if (isCount(value.cache_read_tokens) && value.cache_read_tokens > 0) usage.cacheReadTokens = value.cache_read_tokens;
  if (isCount(value.cache_write_tokens) && value.cache_write_tokens > 0) usage.cacheWriteTokens = value.cache_write_tokens;
  return usage;
}

/** `/^Error\b/i` with ASCII word characters. */
function startsWithErrorWord(text) {
  return /^error(?![A-Za-z0-9_])/i.test(text);
}

function readLegacyText(text) {
  const trimmed = text.trim();
  const rest = (prefix) => trimmed.slice(prefix.length).trim();
  const update = { status: "in_progress", toolMessage: true };
  if (trimmed.startsWith("Task Succeeded. Result:")) {
    update.status = "completed";
    const result = rest("Task Succeeded. Result:");
    if (result !== "") update.result = result;
  } else if (trimmed.startsWith("Task failed.")) {
    update.status = "failed";
    const error = rest("Task failed.");
    if (error !== "") update.error = error;
  } else if (
    LEGACY_FAILURE_PREFIXES.some((prefix) => trimmed.startsWith(prefix)) ||
    startsWithErrorWord(trimmed)
  ) {
    update.status = "failed";
    update.error = trimmed;
  }
  return update;
}

/**
 * The card update a terminal `task` ToolMessage gives (docs/events.md#reading-the-contract, docs/workspace.md#task-card). Structured
 * keys (`subagent_*`) decide; a structured message without a valid status is in
 * progress; only a message without any such key is read by its legacy text prefix.
 */
export function readToolMessage(message) {
  const kwargs = isObject(message) && isObject(message.additional_kwargs) ? message.additional_kwargs : {};
  const structured = Object.keys(kwargs).some((key) => key.startsWith("subagent_"));
  if (!structured) return readLegacyText(flattenContent(isObject(message) ? message.content : undefined));

  const wire = kwargs.subagent_status;
  const legacy = wire === LEGACY_MAX_TURNS_REACHED;
  if (!legacy && !SUBAGENT_STATUSES.includes(wire)) return { status: "in_progress", toolMessage: true };

  const text = (key) => (nonBlank(kwargs[key]) ? kwargs[key] : undefined);
  const brief = text("subagent_result_brief")?.trim();
  let stopReason = SUBAGENT_STOP_REASONS.includes(text("subagent_stop_reason"))
    ? kwargs.subagent_stop_reason
    : undefined;
  let status;
  if (legacy) {
    stopReason ??= "turn_capped";
    status = brief !== undefined ? "completed" : "failed";
  } else {
    status = wire === "completed" ? "completed" : "failed";
  }

  const update = { status, toolMessage: true };
  if (status === "completed" && brief !== undefined) update.result = brief;
  if (status === "failed" && text("subagent_error") !== undefined) update.error = kwargs.subagent_error;
  if (stopReason !== undefined) update.stopReason = stopReason;
  if (text("subagent_model_name") !== undefined) update.modelName = kwargs.subagent_model_name.trim();
  const usage = readUsage(kwargs.subagent_token_usage);
  if (usage !== null) update.usage = usage;
  return update;
}

/** A card that knows only its task id: in progress, nothing else known. */
export function newCard(id) {
  return {
    id,
    subagentType: null,
    description: null,
    prompt: null,
    status: "in_progress",
    toolMessage: false,
    result: null,
    error: null,
    stopReason: null,
    modelName: null,
    usage: null,
    latestMessage: null,
    steps: [],
    summary: null,
  };
}

/** The update a `task` tool call gives: its string `subagent_type`, `description` and `prompt`. */
export function toolCallUpdate(toolCall) {
  const args = isObject(toolCall) && isObject(toolCall.args) ? toolCall.args : {};
  const update = {};
  if (typeof args.subagent_type === "string") update.subagentType = args.subagent_type;
  if (typeof args.description === "string") update.description = args.description;
  if (typeof args.prompt === "string") update.prompt = args.prompt;
  return update;
}

/** A step from a live subagent message (a `task_running` event); its text is untruncated. */
export function stepFromMessage(message, messageIndex) {
  const kind = message.type === "tool" ? "tool" : "ai";
  const calls = kind === "ai" && Array.isArray(message.tool_calls) ? message.tool_calls : [];
  return {
    messageIndex,
    kind,
    text: flattenContent(message.content),
    truncated: false,
    toolCalls: calls.filter(isObject).map((call) => ({
      name: typeof call.name === "string" ? call.name : null,
      args: call.args === undefined ? null : call.args,
      argsTruncated: false,
    })),
    toolName: kind === "tool" && typeof message.name === "string" ? message.name : null,
  };
}

/** A step from a persisted `subagent.step` record, or null when its content is malformed. */
export function stepFromRecord(record) {
  const content = isObject(record) ? record.content : undefined;
  if (!isObject(content) || !isCount(content.message_index)) return null;
  const kind = content.kind === "tool" ? "tool" : "ai";
  const calls = kind === "ai" && Array.isArray(content.tool_calls) ? content.tool_calls : [];
  return {
    messageIndex: content.message_index,
    kind,
    text: typeof content.text === "string" ? content.text : "",
    truncated: content.truncated === true,
    toolCalls: calls.filter(isObject).map((call) => ({
      name: typeof call.name === "string" ? call.name : null,
      args: call.args === undefined ? null : call.args,
      argsTruncated: call.args_truncated === true,
    })),
    toolName: kind === "tool" && typeof content.tool_name === "string" ? content.tool_name : null,
  };
}

/**
 * The update a live task event gives, or null for events that give none. `task_started`
 * gives the model; `task_running` the model, the cumulative usage, the latest message and
 * one step. Terminal events are not used: status comes from the ToolMessage.
 */
export function taskEventUpdate(event) {
  if (!isObject(event)) return null;
  if (event.type !== "task_started" && event.type !== "task_running") return null;
  const update = {};
  if (nonBlank(event.model_name)) update.modelName = event.model_name.trim();
  if (event.type === "task_started") return update;
  const usage = readUsage(event.usage);
  if (usage !== null) update.usage = usage;
  if (isObject(event.message)) {
    update.latestMessage = event.message;
    if (isCount(event.message_index)) update.steps = [stepFromMessage(event.message, event.message_index)];
  }
  return update;
}

/** Steps merged by `messageIndex`, the incoming step winning, sorted ascending. */
export function mergeSteps(existing, incoming) {
  const byIndex = new Map();
  for (const step of existing) byIndex.set(step.messageIndex, step);
  for (const step of incoming) byIndex.set(step.messageIndex, step);
  return [...byIndex.values()].sort((a, b) => a.messageIndex - b.messageIndex);
}

function deepEqual(a, b) {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const keysA = Object.keys(a);
  if (keysA.length !== Object.keys(b).length) return false;
  return keysA.every((key) => Object.hasOwn(b, key) && deepEqual(a[key], b[key]));
}

/**
 * Applies an update to a card (docs/workspace.md#task-card "Merge"): a shallow overlay in which a terminal
 * status never reverts to in progress, steps merge by `messageIndex`, and a usage with a lower
 * `totalTokens` is ignored. `publish` says when to tell the UI: terminal transitions after
 * the render (`after_render`), other changes at once (`now`), identical re-parses never
 * (`none`).
 */
export function mergeCard(card, update) {
  const next = { ...card };
  for (const key of UPDATE_KEYS) {
    // Absent and null keys leave the card as it is: an update only ever adds knowledge.
    if (Object.hasOwn(update, key) && update[key] !== undefined && update[key] !== null) {
      next[key] = update[key];
    }
  }
  if (isTerminal(card.status) && !isTerminal(next.status)) next.status = card.status;
  if (Array.isArray(update.steps)) next.steps = mergeSteps(card.steps, update.steps);
  if (isObject(update.usage) && card.usage !== null && update.usage.totalTokens < card.usage.totalTokens) {
    next.usage = card.usage;
  }
  const changed = !deepEqual(card, next);
  const becameTerminal = isTerminal(next.status) && next.status !== card.status;
  const publish = becameTerminal ? "after_render" : changed ? "now" : "none";
  return { card: next, changed, becameTerminal, publish };
}

/**
 * The pending rule: a card without a ToolMessage is in progress while its turn is loading
 * and failed once the turn has ended; a ToolMessage always decides.
 */
export function displayStatus(card, turnLoading) {
  if (card.toolMessage) return card.status;
  return turnLoading ? "in_progress" : "failed";
}

/**
 * The steps a card lists: tool steps, and AI steps with non-blank text, by `messageIndex`;
 * a completed card drops a trailing AI step without tool calls, which is its result.
 */
export function displaySteps(steps, status) {
  const visible = steps
    .filter((step) => step.kind === "tool" || step.text.trim() !== "")
    .sort((a, b) => a.messageIndex - b.messageIndex);
  const last = visible[visible.length - 1];
  if (status === "completed" && last !== undefined && last.kind === "ai" && last.toolCalls.length === 0) {
    return visible.slice(0, -1);
  }
  return visible;
}

/** A `/tasks` step `{kind, text, tool_name}` as a Brief, or null. */
function readBrief(value) {
  if (!isObject(value)) return null;
  return {
    kind: value.kind === "tool" ? "tool" : "ai",
    text: typeof value.text === "string" ? value.text : "",
    toolName: typeof value.tool_name === "string" ? value.tool_name : null,
  };
}

/**
 * The update a task summary of `GET …/runs/{run_id}/tasks` gives (docs/api.md#task-summaries): what the
 * card shows before its steps are loaded — type, description, model, usage, stop reason,
 * error or brief, and the summary's step count and latest step. Status still comes from
 * the ToolMessage (or the pending rule).
 */
export function summaryUpdate(summary) {
  if (!isObject(summary)) return null;
  const update = {};
  if (typeof summary.subagent_type === "string") update.subagentType = summary.subagent_type;
  if (typeof summary.description === "string") update.description = summary.description;
  if (nonBlank(summary.model_name)) update.modelName = summary.model_name.trim();
  const usage = readUsage(summary.usage);
  if (usage !== null) update.usage = usage;
  if (SUBAGENT_STOP_REASONS.includes(summary.stop_reason)) update.stopReason = summary.stop_reason;
  if (nonBlank(summary.result_brief)) update.result = summary.result_brief.trim();
  if (nonBlank(summary.error)) update.error = summary.error;
  if (isCount(summary.step_count)) {
    update.summary = {
      stepCount: summary.step_count,
      latestStep: readBrief(summary.latest_step),
      resultStep: readBrief(summary.result_step),
    };
  }
  return update;
}

/** A step as a Brief. */
function briefOf(step) {
  return { kind: step.kind, text: step.text, toolName: step.toolName };
}

/**
 * How many steps the card lists and the last of them: from its steps once any are known,
 * else from its task summary, whose count leaves out a completed task's answer — which a
 * card not shown completed lists. So the count always equals what the expanded card lists.
 */
export function listedSteps(card, status) {
  if (card.steps.length > 0 || !isObject(card.summary)) {
    const listed = displaySteps(card.steps, status);
    const last = listed[listed.length - 1];
    return { count: listed.length, latest: last === undefined ? null : briefOf(last) };
  }
  const { stepCount, latestStep, resultStep } = card.summary;
  if (status !== "completed" && resultStep !== null) return { count: stepCount + 1, latest: resultStep };
  return { count: stepCount, latest: latestStep };
}

/** A step in one line: a tool step as "tool: first line", an AI step as its first line. */
export function stepLine(step) {
  if (!isObject(step)) return null;
  const first = (typeof step.text === "string" ? step.text.trim() : "").split("\n")[0].trim();
  if (step.kind !== "tool") return first === "" ? null : first;
  const name = nonBlank(step.toolName) ? step.toolName : "tool";
  return first === "" ? name : `${name}: ${first}`;
}

/** A token count: grouped digits below 10,000, else thousands with one decimal and "K". */
export function formatTokenCount(count) {
  if (count < 10000) return count.toLocaleString("en-US");
  return `${(count / 1000).toFixed(1)}K`;
}

/** The token label, or null when `token_usage.enabled` is not true. */
export function tokenLabel(usage, status, tokenUsageEnabled) {
  if (tokenUsageEnabled !== true) return null;
  if (isObject(usage)) return `${formatTokenCount(usage.totalTokens)} Tokens`;
  return status === "in_progress" ? "Collecting tokens" : "No usage returned";
}

const price = (value) => (typeof value === "number" && Number.isFinite(value) ? value : 0);

/** A `/api/models` entry's `pricing` as a card uses it, or null when unpriced (both prices ≤ 0). */
function priceOfEntry(model) {
  const pricing = isObject(model) && isObject(model.pricing) ? model.pricing : null;
  if (pricing === null) return null;
  const input = price(pricing.input_per_million);
  const output = price(pricing.output_per_million);
  if (input <= 0 && output <= 0) return null;
  const currency = nonBlank(pricing.currency) ? pricing.currency.toUpperCase() : "USD";
  const optional = (value) => (typeof value === "number" && Number.isFinite(value) ? value : null);
  return {
    currency,
    inputPerMillion: input,
    outputPerMillion: output,
    inputCacheHitPerMillion: optional(pricing.input_cache_hit_per_million),
    inputCacheWritePerMillion: optional(pricing.input_cache_write_per_million),
  };
}

/**
 * The price of a model among `/api/models`' `models` (docs/usage-and-cost.md#cost): by configured `name`, by
 * provider `model`, then by their lowercase forms; null when none is priced.
 */
export function priceOf(modelName, models) {
  if (typeof modelName !== "string" || !Array.isArray(models)) return null;
  const lower = modelName.toLowerCase();
  for (const model of models) {
    if (!isObject(model)) continue;
    const own = typeof model.name === "string" ? model.name : "";
    const provider = typeof model.model === "string" ? model.model : "";
    const named =
      own === modelName || provider === modelName || own.toLowerCase() === lower || provider.toLowerCase() === lower;
    if (named) {
      const found = priceOfEntry(model);
      if (found !== null) return found;
    }
  }
  return null;
}

/** Whether any configured model has a price. */
export function hasPrices(models) {
  return Array.isArray(models) && models.some((model) => priceOfEntry(model) !== null);
}

/**
 * What a usage costs at a price, rounded to 6 decimals (docs/usage-and-cost.md#cost): cache reads
 * at the hit price and cache writes at the write price (each the input price when unset),
 * clamped to the input; the same function, term for term, as the gateway's.
 */
export function usageCost(usage, unitPrice) {
  const input = usage.inputTokens;
  const cacheRead = Math.min(usage.cacheReadTokens ?? 0, input);
  const cacheWrite = Math.min(usage.cacheWriteTokens ?? 0, input - cacheRead);
  const uncached = input - cacheRead - cacheWrite;
  const hit = unitPrice.inputCacheHitPerMillion ?? unitPrice.inputPerMillion;
  const write = unitPrice.inputCacheWritePerMillion ?? unitPrice.inputPerMillion;
  const amount =
    (uncached / 1e6) * unitPrice.inputPerMillion +
    (cacheRead / 1e6) * hit +
    (cacheWrite / 1e6) * write +
    (usage.outputTokens / 1e6) * unitPrice.outputPerMillion;
  return Math.round(amount * 1e6) / 1e6;
}

/** A card's cost `{amount, currency}`: its usage at its model's price, once both are known. */
export function cardCost(usage, modelName, models) {
  if (!isObject(usage)) return null;
  const found = priceOf(modelName, models);
  if (found === null) return null;
  return { amount: usageCost(usage, found), currency: found.currency };
}

function groupDigits(count) {
  return String(count).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

/**
 * An amount as people read it: "$" before US dollars, the code after other currencies;
 * from 1 up two decimals with grouped digits, below 1 two significant digits. Written from
 * whole micro-units with integer steps, exactly as the Rust port writes it.
 */
export function formatCost(amount, currency) {
  const micros = typeof amount === "number" && Number.isFinite(amount) && amount > 0 ? Math.round(amount * 1e6) : 0;
  const unit = 10 ** Math.max(0, String(micros).length - 2);
  const rounded = micros < 1e6 ? Math.floor((micros + Math.floor(unit / 2)) / unit) * unit : micros;
  let number;
  if (rounded === 0) number = "0";
  else if (rounded >= 1e6) {
    const cents = Math.floor((rounded + 5000) / 10000);
    number = `${groupDigits(Math.floor(cents / 100))}.${String(cents % 100).padStart(2, "0")}`;
  } else number = `0.${String(rounded).padStart(6, "0").replace(/0+$/, "")}`;
  const code = String(currency).toUpperCase();
  return code === "USD" ? `$${number}` : `${number} ${code}`;
}

/**
 * What stopped runs spent (`/token-usage`'s `stopped_runs`, docs/usage-and-cost.md#thread-token-usage), which the totals
 * leave out: "+ 1,993 tokens, $0.004 in 1 stopped run"; null when no run stopped.
 */
export function stoppedRunsLine(stopped) {
  if (!isObject(stopped) || !isCount(stopped.runs) || stopped.runs === 0) return null;
  const tokens = isCount(stopped.total_tokens) ? stopped.total_tokens : 0;
  const cost = isObject(stopped.cost) ? stopped.cost : null;
  const money =
    cost !== null && typeof cost.total === "number" && typeof cost.currency === "string"
      ? `, ${formatCost(cost.total, cost.currency)}`
      : "";
  return `+ ${groupDigits(tokens)} tokens${money} in ${stopped.runs} stopped ${stopped.runs === 1 ? "run" : "runs"}`;
}

/** A card's cost label, or null until its usage and its model's price are known. */
export function costLabel(usage, modelName, models) {
  const cost = cardCost(usage, modelName, models);
  return cost === null ? null : formatCost(cost.amount, cost.currency);
}

/** The model label: the configured `display_name`, else the raw name; null without a model. */
export function modelLabel(modelName, models) {
  if (!nonBlank(modelName)) return null;
  const model = Array.isArray(models) ? models.find((m) => isObject(m) && m.name === modelName) : undefined;
  return model !== undefined && nonBlank(model.display_name) ? model.display_name : modelName;
}

/** The collapsed header: the last tool call's description while in progress, else the status text. */
export function headerText(card, status) {
  const calls = isObject(card.latestMessage) ? card.latestMessage.tool_calls : undefined;
  if (status === "in_progress" && Array.isArray(calls) && calls.length > 0) {
    const last = calls[calls.length - 1];
    const description = isObject(last) && isObject(last.args) ? last.args.description : undefined;
    if (nonBlank(description)) return description;
  }
  if (status === "completed") return "Subtask completed";
  if (status === "failed") return "Subtask failed";
  return "Running subtask";
}

/** The header of a group of task cards. */
export function groupHeader(count) {
  return count === 1 ? "Executing subtask" : `Executing ${count} subtasks in parallel`;
}

/** Words for a task or run stop reason, or null for an unknown one. */
export function stopReasonLabel(reason) {
  return typeof reason === "string" && Object.hasOwn(STOP_REASON_LABELS, reason)
    ? STOP_REASON_LABELS[reason]
    : null;
}

/** Everything a card shows, from the card, whether its turn is loading, and `/api/models`. */
export function cardView(card, { turnLoading, tokenUsageEnabled, models }) {
  const status = displayStatus(card, turnLoading);
  const listed = listedSteps(card, status);
  return {
    id: card.id,
    status,
    header: headerText(card, status),
    description: card.description,
    subagentType: card.subagentType,
    modelLabel: modelLabel(card.modelName, models),
    tokenLabel: tokenLabel(card.usage, status, tokenUsageEnabled),
    stopReason: stopReasonLabel(card.stopReason),
    result: status === "completed" ? card.result : null,
    error: status === "failed" ? card.error : null,
    costLabel: tokenUsageEnabled === true ? costLabel(card.usage, card.modelName, models) : null,
    stepCount: listed.count,
    latestStep: stepLine(listed.latest),
    steps: displaySteps(card.steps, status),
  };
}

/**
 * The card updates a thread's messages give, in order: a `task` tool call opens its card
 * with its arguments, and a later ToolMessage answering it gives its status. `turn` is the
 * number of human messages up to the tool call (0 before the first); `turns` is their
 * total, so a card belongs to the current turn when `turn === turns`.
 */
export function messageCardUpdates(messages) {
  const updates = [];
  const turnOfTask = new Map();
  let turn = 0;
  for (const message of Array.isArray(messages) ? messages : []) {
    if (!isObject(message)) continue;
    if (message.type === "human") {
      turn += 1;
    } else if (message.type === "ai" && Array.isArray(message.tool_calls)) {
      for (const call of message.tool_calls) {
        if (!isObject(call) || call.name !== "task" || !nonBlank(call.id)) continue;
        if (!turnOfTask.has(call.id)) turnOfTask.set(call.id, turn);
        updates.push({ id: call.id, turn: turnOfTask.get(call.id), update: toolCallUpdate(call) });
      }
    } else if (message.type === "tool" && turnOfTask.has(message.tool_call_id)) {
      const id = message.tool_call_id;
      updates.push({ id, turn: turnOfTask.get(id), update: readToolMessage(message) });
    }
  }
  return { turns: turn, updates };
}

/** Whether expanding the card should fetch its steps from `/events`. */
export function shouldBackfill(card, { expanded, threadId, runId }) {
  return expanded === true && card.steps.length === 0 && nonBlank(threadId) && nonBlank(runId);
}

/** The path of one backfill page. */
export function backfillPath(threadId, runId, taskId, afterSeq) {
  const e = encodeURIComponent;
  const path =
    `/api/threads/${e(threadId)}/runs/${e(runId)}/events` +
    `?event_types=subagent.step&task_id=${e(taskId)}&limit=${BACKFILL_LIMIT}`;
  return afterSeq === null || afterSeq === undefined ? path : `${path}&after_seq=${afterSeq}`;
}

/** The steps of one task in a page of `/events` records. */
export function backfillSteps(records, taskId) {
  const steps = [];
  for (const record of Array.isArray(records) ? records : []) {
    if (!isObject(record) || record.event_type !== "subagent.step") continue;
    const content = isObject(record.content) ? record.content : {};
    const metadata = isObject(record.metadata) ? record.metadata : {};
    if (content.task_id !== taskId && metadata.task_id !== taskId) continue;
    const step = stepFromRecord(record);
    if (step !== null) steps.push(step);
  }
  return mergeSteps([], steps);
}

/**
 * Where backfill paging goes after a page of at most `limit` records: done on a short
 * page, a record without `seq`, or after `BACKFILL_MAX_PAGES` pages; else on from the
 * page's last `seq`.
 */
export function backfillNext(records, pagesFetched, limit = BACKFILL_LIMIT) {
  const page = Array.isArray(records) ? records : [];
  const seqs = page.map((record) => (isObject(record) && isCount(record.seq) ? record.seq : null));
  if (page.length < limit || seqs.includes(null) || pagesFetched >= BACKFILL_MAX_PAGES) {
    return { done: true, afterSeq: null };
  }
  return { done: false, afterSeq: seqs[seqs.length - 1] };
}
