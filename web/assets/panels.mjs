// The side panels of the workspace: the thread list with its search filter and the
// usage-and-cost footer (SPEC §7.3, §7.4). Rendering only; app.mjs fetches the data.

import { batchSpendText } from "./batches.mjs";
import { flattenContent, stopReasonLabel } from "./cards.mjs";
import { h } from "./dom.mjs";

/** A thread's title: its `title` value, else its first human message, else its id. */
export function threadTitle(thread) {
  const values = thread?.values ?? {};
  if (typeof values.title === "string" && values.title.trim() !== "") return values.title;
  const first = (values.messages ?? []).find((m) => m?.type === "human");
  const text = first ? flattenContent(first.content).trim() : "";
  if (text !== "") return text.length > 60 ? `${text.slice(0, 60)}…` : text;
  return thread?.thread_id ?? "New thread";
}

/** The thread list items matching `filter` (case-insensitive, on title and id). */
export function threadItems(threads, { filter, current, onOpen }) {
  const wanted = filter.trim().toLowerCase();
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
          threadTitle(thread),
          thread.status === "busy" ? h("span", { class: "badge" }, "running") : null,
        ),
      ),
    );
}

function formatCount(n) {
  return typeof n === "number" ? n.toLocaleString() : "0";
}

/** The footer's parts from a `/token-usage` answer and the thread's latest run. */
export function usageParts(usage, lastRun) {
  const callers = usage.by_caller ?? {};
  const parts = [
    h("span", { class: "usage-tokens" }, `${formatCount(usage.total_tokens)} tokens`),
    h(
      "span",
      {},
      `lead ${formatCount(callers.lead_agent)} · subagents ${formatCount(callers.subagent)} · middleware ${formatCount(callers.middleware)}`,
    ),
  ];
  const cost = usage.cost;
  parts.push(
    h(
      "span",
      { class: "usage-cost" },
      cost
        ? `cost ${cost.total.toLocaleString(undefined, { maximumFractionDigits: 6 })} ${cost.currency}`
        : "cost: no prices configured",
    ),
  );
  const batchSpend = batchSpendText(usage.batches);
  if (batchSpend !== null) parts.push(h("span", { class: "usage-batches" }, batchSpend));
  const context = usage.context_usage;
  if (context) {
    const of = context.max_context_tokens ? ` of ${formatCount(context.max_context_tokens)} (${context.percentage}%)` : "";
    parts.push(h("span", {}, `context ${formatCount(context.token_count)}${of}`));
  }
  const reason = stopReasonLabel(lastRun?.stop_reason);
  if (reason !== null) parts.push(h("span", { class: "usage-stop" }, `last run capped: ${reason}`));
  return parts;
}
