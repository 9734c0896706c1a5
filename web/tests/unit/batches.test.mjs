// The batch panel's rules: the shared summary table (web/batches.cases.json, which
// `subflow batches` runs too) and the visibility, badge, polling and control rules of
// docs/workspace.md#batch-panel.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import * as batches from "../../assets/batches.mjs";

const root = new URL("../../../", import.meta.url);
const table = JSON.parse(readFileSync(new URL("web/batches.cases.json", root), "utf8"));

for (const { name, batch, percent, summary } of table.cases) {
  test(`summary: ${name}`, () => {
    assert.equal(batches.summary(batch), summary);
    assert.ok(Math.abs(batches.percent(batch) - percent) < 1e-9, `${batches.percent(batch)} vs ${percent}`);
  });
}

for (const { name, item, text } of table.attempts) {
  test(`attempt: ${name}`, () => assert.equal(batches.attemptText(item), text));
}

const of = (...statuses) => statuses.map((status) => ({ status }));

test("the badge counts active batches and says 9+ above nine", () => {
  assert.equal(batches.badgeText([]), null);
  assert.equal(batches.badgeText(of("completed", "failed", "cancelled")), null);
  assert.equal(batches.badgeText(of("queued", "running", "paused", "completed")), "3");
  assert.equal(batches.badgeText(of(...Array(9).fill("running"))), "9");
  assert.equal(batches.badgeText(of(...Array(10).fill("queued"))), "9+");
});

test("the panel shows with a running worker, while loading, on failure, or with batches", () => {
  const working = { subagent_batches: { repository_available: true, worker_running: true } };
  const stopped = { subagent_batches: { repository_available: true, worker_running: false } };
  assert.equal(batches.panelVisible({ features: working, batches: [] }), true);
  assert.equal(batches.panelVisible({ features: stopped, batches: [] }), false);
  assert.equal(batches.panelVisible({ features: null, batches: [] }), false);
  assert.equal(batches.panelVisible({ features: stopped, loading: true, batches: [] }), true);
  assert.equal(batches.panelVisible({ features: stopped, failed: true, batches: [] }), true);
  assert.equal(batches.panelVisible({ features: stopped, batches: of("completed") }), true);
});

test("the list polls every 2 s while a batch is active, 15 s otherwise, never hidden or without a worker", () => {
  const poll = (list, workerRunning = true, hidden = false) => batches.listInterval({ batches: list, workerRunning, hidden });
  assert.equal(poll(of("paused", "completed")), 2000);
  assert.equal(poll(of("running")), 2000);
  assert.equal(poll(of("completed", "cancelled")), 15000);
  assert.equal(poll([]), 15000);
  assert.equal(poll(of("running"), false), null);
  assert.equal(poll(of("running"), true, true), null);
});

test("only a first page of items polls, every 3 s", () => {
  assert.equal(batches.itemsInterval({ pagesLoaded: 1, workerRunning: true, hidden: false }), 3000);
  assert.equal(batches.itemsInterval({ pagesLoaded: 2, workerRunning: true, hidden: false }), null);
  assert.equal(batches.itemsInterval({ pagesLoaded: 1, workerRunning: false, hidden: false }), null);
  assert.equal(batches.itemsInterval({ pagesLoaded: 1, workerRunning: true, hidden: true }), null);
});

test("controls follow the status, and read-only mode disables all but Export", () => {
  const shown = (status, readOnly = false) => {
    const c = batches.controls({ status }, readOnly);
    return Object.fromEntries(Object.entries(c).map(([k, v]) => [k, `${v.shown ? "shown" : "-"}${v.enabled ? "+on" : ""}`]));
  };
  assert.deepEqual(shown("queued"), { pause: "shown+on", resume: "-", cancel: "shown+on", export: "shown+on" });
  assert.deepEqual(shown("running"), { pause: "shown+on", resume: "-", cancel: "shown+on", export: "shown+on" });
  assert.deepEqual(shown("paused"), { pause: "-", resume: "shown+on", cancel: "shown+on", export: "shown+on" });
  assert.deepEqual(shown("completed"), { pause: "-", resume: "-", cancel: "-", export: "shown+on" });
  assert.deepEqual(shown("running", true), { pause: "shown", resume: "-", cancel: "shown", export: "shown+on" });
  assert.deepEqual(batches.retryControl({ status: "failed" }, false), { shown: true, enabled: true });
  assert.deepEqual(batches.retryControl({ status: "failed" }, true), { shown: true, enabled: false });
  assert.deepEqual(batches.retryControl({ status: "succeeded" }, false), { shown: false, enabled: false });
});

test("a money budget reads as spend of limit, and says when it paused a batch", () => {
  assert.equal(batches.budgetText(null), null);
  assert.equal(
    batches.budgetText({ scope: "thread", limit: 5, spent: 0.42, currency: "USD" }),
    "thread budget $0.42 of $5.00 (8%)",
  );
  assert.equal(
    batches.budgetText({ scope: "user_daily", limit: 20, spent: 19.5, currency: "EUR" }),
    "today's budget €19.50 of €20.00 (97%)",
  );
  assert.equal(
    batches.budgetText({ scope: "batch", limit: 0.001, spent: 0.0012, currency: "USD" }, "budget"),
    "batch budget $0.0012 of $0.001 (120%) · paused at its budget",
  );
  assert.equal(
    batches.budgetText({ scope: "batch", limit: 1, spent: 0.5, currency: "USD" }, null),
    "batch budget $0.50 of $1.00 (50%)",
  );
});

test("the footer's batch spend stays apart from the totals", () => {
  assert.equal(batches.batchSpendText({ items: 0, total_tokens: 0, cost: null }), null);
  assert.equal(batches.batchSpendText(undefined), null);
  assert.equal(
    batches.batchSpendText({ items: 1204, total_tokens: 250000, cost: { currency: "USD", total: 3.12 } }),
    "batches 1,204 items · 250,000 tokens · $3.12 (not in the totals)",
  );
  assert.equal(batches.limitsText({ max_live_items: 100, max_running_items: 3, max_attempts: 3 }), "100 live · 3 running · 3 attempts");
});
