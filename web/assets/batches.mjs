// The batch panel's rules (docs/workspace.md#batch-panel) as pure functions: no DOM, no network, no clock.
// The summary line and the progress percentage follow the case table web/batches.cases.json,
// which `subflow batches` (crates/subflow/src/commands/batches/summary.rs) runs too. The
// rate, ETA and costs are the gateway's; these functions only display them.

/** Items per page of a batch's item list. */
export const ITEMS_PAGE = 100;
/** How often the list is polled while a batch is active, and otherwise. */
export const LIST_ACTIVE_MS = 2000;
export const LIST_IDLE_MS = 15000;
/** How often an open item list's first page is polled. */
export const ITEMS_MS = 3000;
/** The read-only banner. */
export const READ_ONLY_TEXT = "The batch worker is not running. Historical batches are read-only.";

const ACTIVE = new Set(["queued", "running", "paused"]);
const TERMINAL = new Set(["completed", "failed", "cancelled"]);

/** Whether a batch status is active (queued, running, paused). */
export function isActive(status) {
  return ACTIVE.has(status);
}

const count = (batch, status) => {
  const value = batch?.counts?.[status];
  return typeof value === "number" && value > 0 ? value : 0;
};

/** Items that ended: succeeded + failed + cancelled. */
export function doneCount(batch) {
  return count(batch, "succeeded") + count(batch, "failed") + count(batch, "cancelled");
}

/** Progress in percent: done / total_items, clamped to 0–100, 2 decimals; 0 for no total. */
export function percent(batch) {
  const total = batch?.total_items;
  if (typeof total !== "number" || total <= 0) return 0;
  const raw = Math.min(100, Math.max(0, (doneCount(batch) / total) * 100));
  return Math.round(raw * 100) / 100;
}

/** The badge: how many batches are active, "9+" above 9, null for none. */
export function badgeText(batches) {
  const active = (batches ?? []).filter((b) => isActive(b.status)).length;
  if (active === 0) return null;
  return active > 9 ? "9+" : String(active);
}

/**
 * Whether the panel shows: the repository is available and a worker runs, the list is
 * loading, the list failed, or batches exist.
 */
export function panelVisible({ features, loading, failed, batches }) {
  const batchFeatures = features?.subagent_batches;
  const working = batchFeatures?.repository_available === true && batchFeatures?.worker_running === true;
  return working || loading === true || failed === true || (batches ?? []).length > 0;
}

/** Milliseconds until the next list poll, or null when polling is off (no worker, hidden tab). */
export function listInterval({ batches, workerRunning, hidden }) {
  if (!workerRunning || hidden) return null;
  return (batches ?? []).some((b) => isActive(b.status)) ? LIST_ACTIVE_MS : LIST_IDLE_MS;
}

/** Milliseconds until an open item list polls its first page, or null when it does not. */
export function itemsInterval({ pagesLoaded, workerRunning, hidden }) {
  if (!workerRunning || hidden || pagesLoaded > 1) return null;
  return ITEMS_MS;
}

/** Which controls a batch card shows and which are enabled (read-only disables all but Export). */
export function controls(batch, readOnly) {
  const status = batch?.status;
  const show = {
    pause: status === "queued" || status === "running",
    resume: status === "paused",
    cancel: isActive(status),
  };
  return {
    pause: { shown: show.pause, enabled: show.pause && !readOnly },
    resume: { shown: show.resume, enabled: show.resume && !readOnly },
    cancel: { shown: show.cancel, enabled: show.cancel && !readOnly },
    export: { shown: true, enabled: true },
  };
}

/** Whether an item row offers Retry, and whether it is enabled. */
export function retryControl(item, readOnly) {
  const shown = item?.status === "failed";
  return { shown, enabled: shown && !readOnly };
}

/**
 * An item's attempt, and whether it was retried by hand ("1 · retried once"): a retry
 * resets the attempt, so the retry count is what shows the item ran before.
 */
export function attemptText(item) {
  const retries = item?.retries ?? 0;
  const attempt = `${item?.attempt ?? 0}`;
  if (retries === 0) return attempt;
  return `${attempt} · retried ${retries === 1 ? "once" : `${retries} times`}`;
}

/** The limits of a card: "100 live · 3 running · 3 attempts". */
export function limitsText(batch) {
  return `${batch.max_live_items} live · ${batch.max_running_items} running · ${batch.max_attempts} attempts`;
}

const grouped = (n) => Math.trunc(n).toLocaleString("en-US");

function rateText(perMinute) {
  if (perMinute >= 10) return String(Math.round(perMinute));
  return perMinute.toFixed(1).replace(/\.0$/, "");
}

/** A duration, coarsely: minutes rounded up below an hour, then hours and minutes, days and hours. */
export function durationText(seconds) {
  if (seconds < 60) return "less than a minute";
  if (seconds < 3600) return `${Math.ceil(seconds / 60)} min`;
  if (seconds < 86400) {
    const [hours, minutes] = [Math.floor(seconds / 3600), Math.floor((seconds % 3600) / 60)];
    return minutes === 0 ? `${hours} h` : `${hours} h ${minutes} min`;
  }
  const [days, hours] = [Math.floor(seconds / 86400), Math.floor((seconds % 86400) / 3600)];
  return hours === 0 ? `${days} d` : `${days} d ${hours} h`;
}

const SYMBOLS = { USD: "$", EUR: "€", GBP: "£" };

/** An amount: a symbol for USD, EUR and GBP, else the code after it; 2 decimals, or up to 6 below a cent. */
export function moneyText(amount, currency) {
  let digits;
  if (amount !== 0 && Math.abs(amount) < 0.01) {
    digits = amount.toFixed(6).replace(/0+$/, "");
  } else {
    const [whole, fraction] = amount.toFixed(2).split(".");
    digits = `${grouped(Number(whole))}.${fraction}`;
  }
  const code = String(currency).toUpperCase();
  return code in SYMBOLS ? `${SYMBOLS[code]}${digits}` : `${digits} ${code}`;
}

/** The summary line: "1,204 of 5,000 · 3 running · 38/min · about 1 h 40 min left · $3.12 so far, about $12.90 in all". */
export function summary(batch) {
  const parts = [`${grouped(doneCount(batch))} of ${grouped(batch?.total_items ?? 0)}`];
  const running = count(batch, "running");
  if (running > 0) parts.push(`${grouped(running)} running`);
  const failed = count(batch, "failed");
  if (failed > 0) parts.push(`${grouped(failed)} failed`);
  const cancelled = count(batch, "cancelled");
  if (cancelled > 0) parts.push(`${grouped(cancelled)} cancelled`);
  const perMinute = typeof batch?.items_per_minute === "number" ? batch.items_per_minute : 0;
  if (perMinute > 0) parts.push(`${rateText(perMinute)}/min`);
  const eta = batch?.eta_seconds;
  if (typeof eta === "number") parts.push(eta < 60 ? `${durationText(eta)} left` : `about ${durationText(eta)} left`);
  const cost = batch?.cost;
  if (cost && typeof cost.total === "number" && typeof cost.currency === "string") {
    const total = moneyText(cost.total, cost.currency);
    if (TERMINAL.has(batch.status)) parts.push(`${total} in all`);
    else if (typeof batch.projected_cost === "number")
      parts.push(`${total} so far, about ${moneyText(batch.projected_cost, cost.currency)} in all`);
    else parts.push(`${total} so far`);
  }
  return parts.join(" · ");
}

/** Scope words of a money budget (docs/usage-and-cost.md#budgets). */
const BUDGET_SCOPES = { run: "run", thread: "thread", user_daily: "today's", batch: "batch" };

/**
 * A money budget and its spend, `{scope, limit, spent, currency}` as `/token-usage`,
 * `/api/usage` and batches give it: "thread budget $0.42 of $5.00 (8%)", with
 * " · paused at its budget" for a batch its budget paused; null without one.
 */
export function budgetText(budget, pauseReason = null) {
  if (!budget || typeof budget.limit !== "number" || typeof budget.spent !== "number") return null;
  const scope = BUDGET_SCOPES[budget.scope] ?? String(budget.scope);
  const used = budget.limit > 0 ? Math.floor((budget.spent / budget.limit) * 100) : 0;
  const text = `${scope} budget ${moneyText(budget.spent, budget.currency)} of ${moneyText(budget.limit, budget.currency)} (${used}%)`;
  return pauseReason === "budget" ? `${text} · paused at its budget` : text;
}

/** The footer's batch spend from `/token-usage`'s `batches`, or null when no item reported usage. */
export function batchSpendText(section) {
  if (!section || !(section.items > 0)) return null;
  const cost = section.cost ? ` · ${moneyText(section.cost.total, section.cost.currency)}` : "";
  return `batches ${grouped(section.items)} items · ${grouped(section.total_tokens ?? 0)} tokens${cost} (not in the totals)`;
}
