// The side panels of the workspace: the thread list with its search filter and the
// usage-and-cost footer (docs/usage-and-cost.md#thread-token-usage, docs/usage-and-cost.md#cost). Rendering only; app.mjs fetches the data.

import { batchSpendText, budgetText } from "./batches.mjs";
import {
  cardCost,
  flattenContent,
  formatCost,
  hasPrices,
  priceOf,
  stopReasonLabel,
  stoppedRunsLine,
} from "./cards.mjs";
import { h } from "./dom.mjs";
import { parseTime } from "./timeline.mjs";

/** A thread's title: its `title` value, else its first human message, else its id. */
export function threadTitle(thread) {
  const values = thread?.values ?? {};
  if (typeof values.title === "string" && values.title.trim() !== "") return values.title;
  const first = (values.messages ?? []).find((m) => m?.type === "human");
  const text = first ? flattenContent(first.content).trim() : "";
  if (text !== "") return text.length > 60 ? `${text.slice(0, 60)}…` : text;
  return thread?.thread_id ?? "New thread";
}

/** How long ago `then` was, from `now` (epoch milliseconds): "just now", "5 min ago", "3 h ago", "2 d ago", else the date. */
export function relativeDate(then, now) {
  if (!Number.isFinite(then)) return "";
  const minutes = Math.floor(Math.max(0, now - then) / 60000);
  if (minutes < 1) return "just now";
  if (minutes < 60) return `${minutes} min ago`;
  if (minutes < 24 * 60) return `${Math.floor(minutes / 60)} h ago`;
  if (minutes < 7 * 24 * 60) return `${Math.floor(minutes / (24 * 60))} d ago`;
  return new Date(then).toLocaleDateString(undefined, { year: "numeric", month: "short", day: "numeric" });
}

/** The thread list items matching `filter` (case-insensitive, on title and id), each with when it last changed. */
export function threadItems(threads, { filter, current, onOpen, now = Date.now() }) {
  const wanted = filter.trim().toLowerCase();
  // Threads that share a title also show the start of their id, so they can be told apart.
  const titles = new Map();
  for (const thread of threads) titles.set(threadTitle(thread), (titles.get(threadTitle(thread)) ?? 0) + 1);
  const when = (thread) => {
    const date = relativeDate(parseTime(thread.updated_at ?? thread.created_at), now);
    return titles.get(threadTitle(thread)) > 1 ? `${date} · ${thread.thread_id.slice(0, 8)}` : date;
  };
  return threads
    .filter(
      (t) => wanted === "" || threadTitle(t).toLowerCase().includes(wanted) || t.thread_id.toLowerCase().includes(wanted),
    )
    .map((thread) =>
      h(
        "li",
        {},
        h(
          "button",
          {
            type: "button",
            title: thread.thread_id,
            "aria-current": thread.thread_id === current ? "page" : null,
            dataset: { threadId: thread.thread_id },
            onclick: () => onOpen(thread.thread_id),
          },
          h("span", { class: "thread-name" }, threadTitle(thread)),
          h(
            "time",
            { class: "thread-date", datetime: thread.updated_at ?? thread.created_at ?? null },
            when(thread),
          ),
          thread.status === "busy" ? h("span", { class: "badge" }, "running") : null,
        ),
      ),
    );
}

function formatCount(n) {
  return typeof n === "number" ? n.toLocaleString("en-US") : "0";
}

const count = (value) => (typeof value === "number" && Number.isFinite(value) && value > 0 ? value : 0);

/**
 * What the run being streamed has spent so far, from the stream alone (the gateway stores
 * a running run's usage only every few seconds): the lead's own model calls — the
 * `usage_metadata` of this turn's AI messages, less the subagent usage attributed to them
 * (docs/events.md#attribution) — and its task cards' cumulative usage, priced at the run's model and at
 * each card's model. Middleware calls are counted once the run has ended.
 */
export function liveRunUsage({ messages, cards, runModel, models }) {
  const list = Array.isArray(messages) ? messages : [];
  let turnStart = 0;
  list.forEach((m, i) => {
    if (m?.type === "human") turnStart = i;
  });
  const lead = { inputTokens: 0, outputTokens: 0, totalTokens: 0 };
  for (const message of list.slice(turnStart)) {
    const sign = message?.type === "ai" ? 1 : message?.type === "tool" && message.additional_kwargs?.subagent_token_usage_attributed === true ? -1 : 0;
    const usage = message?.type === "ai" ? message.usage_metadata : message?.additional_kwargs?.subagent_token_usage;
    if (sign === 0 || usage === null || typeof usage !== "object") continue;
    lead.inputTokens += sign * count(usage.input_tokens);
    lead.outputTokens += sign * count(usage.output_tokens);
    lead.totalTokens += sign * count(usage.total_tokens);
  }
  for (const key of Object.keys(lead)) lead[key] = Math.max(0, lead[key]);
  let subagent = 0;
  const costs = [];
  const leadCost = cardCost(lead, runModel, models);
  if (leadCost !== null && lead.totalTokens > 0) costs.push(leadCost);
  for (const card of cards) {
    if (card.usage === null || typeof card.usage !== "object") continue;
    subagent += card.usage.totalTokens;
    const cost = cardCost(card.usage, card.modelName, models);
    if (cost !== null) costs.push(cost);
  }
  return { tokens: lead.totalTokens + subagent, lead: lead.totalTokens, subagent, costs };
}

/** The currency of the first priced model. */
function firstCurrency(models) {
  for (const model of models) {
    const found = priceOf(model?.name, models);
    if (found !== null) return found.currency;
  }
  return "USD";
}

/** A sum of amounts in one currency, or null when there are none or currencies mix. */
function sumCosts(costs) {
  const currencies = new Set(costs.map((c) => c.currency));
  if (currencies.size !== 1) return null;
  return { currency: [...currencies][0], total: costs.reduce((sum, c) => sum + c.amount, 0) };
}

/**
 * The footer's parts from a `/token-usage` answer, the thread's latest run, `/api/models`'
 * models and, while a run streams, what it has spent so far (`liveRunUsage`).
 */
export function usageParts(usage, { lastRun, models, live = null }) {
  const callers = usage.by_caller ?? {};
  const plus = (value, extra) => count(value) + (live === null ? 0 : extra);
  const parts = [
    h(
      "span",
      { class: "usage-tokens" },
      `${formatCount(plus(usage.total_tokens, live?.tokens))} tokens`,
      live === null ? null : h("span", { class: "usage-live" }, " · this run so far"),
    ),
    h(
      "span",
      {},
      `lead ${formatCount(plus(callers.lead_agent, live?.lead))} · subagents ${formatCount(plus(callers.subagent, live?.subagent))} · middleware ${formatCount(callers.middleware)}`,
    ),
  ];
  const settled = usage.cost ? [{ amount: usage.cost.total, currency: usage.cost.currency }] : [];
  const cost = sumCosts([...settled, ...(live?.costs ?? [])]);
  let costText;
  if (cost !== null) costText = `cost ${formatCost(cost.total, cost.currency)}`;
  else if (!hasPrices(models)) costText = "cost: no prices configured";
  else if (settled.length === 0 && (live?.costs ?? []).length === 0) costText = `cost ${formatCost(0, firstCurrency(models))}`;
  else costText = "cost: mixed currencies";
  parts.push(h("span", { class: "usage-cost" }, costText));
  const stopped = stoppedRunsLine(usage.stopped_runs);
  if (stopped !== null) parts.push(h("span", { class: "usage-stopped" }, stopped));
  const batchSpend = batchSpendText(usage.batches);
  if (batchSpend !== null) parts.push(h("span", { class: "usage-batches" }, batchSpend));
  for (const budget of usage.budgets ?? []) {
    const text = budgetText(budget);
    if (text !== null) {
      const over = budget.spent >= budget.limit ? " over" : "";
      parts.push(h("span", { class: `usage-budget${over}`, "data-scope": budget.scope }, text));
    }
  }
  const context = usage.context_usage;
  if (context) {
    const of = context.max_context_tokens ? ` of ${formatCount(context.max_context_tokens)} (${context.percentage}%)` : "";
    parts.push(h("span", {}, `context ${formatCount(context.token_count)}${of}`));
  }
  const reason = stopReasonLabel(lastRun?.stop_reason);
  if (reason !== null) parts.push(h("span", { class: "usage-stop" }, `last run capped: ${reason}`));
  return parts;
}
