// Money budgets in the workspace (docs/usage-and-cost.md#budgets), in headless chromium
// against a real `subflow serve`: the footer shows the thread's spend against its budget,
// and the batch panel shows a batch's spend against its own and that the budget paused it.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { budgetText } from "../../assets/batches.mjs";
import { api, openBrowser, ready, scriptedModel, startServer } from "./harness.mjs";

describe("budgets in the workspace", () => {
  let server;
  let scripts;
  before(async () => {
    scripts = mkdtempSync(join(tmpdir(), "subflow-budget-script-"));
    const script = join(scripts, "script.json");
    // Each chapter costs 1,000 input tokens at 2 per million: 0.002.
    writeFileSync(
      script,
      JSON.stringify({
        rules: [{ agent: "subagent:general-purpose", contains: "Chapter", turns: [{ text: "done", usage: { input: 1000, output: 0 } }] }],
      }),
    );
    server = await startServer({
      config: `${scriptedModel({ delayMs: 0, script })}
[models.pricing]
currency = "USD"
input_per_million = 2.0
output_per_million = 8.0

[budgets]
thread_max_cost = 1.0
batch_max_cost = 0.003

[subagent_batches]
poll_interval_seconds = 0.1
`,
    });
  });
  after(async () => {
    await server.stop();
    rmSync(scripts, { recursive: true, force: true });
  });

  test("the footer and the batch panel show spend against budget", async () => {
    await api(server, "/api/threads/t-budget/runs/wait", {
      method: "POST",
      body: { input: { messages: [{ type: "human", content: "/echo hi" }] } },
    });
    const items = Array.from({ length: 6 }, (_, i) => ({ key: `c${i}`, prompt: `Chapter ${i}` }));
    const submitted = await api(server, "/api/threads/t-budget/subagent-batches", {
      method: "POST",
      body: { submission_key: "budgeted", subagent_type: "general-purpose", items, max_live_items: 1, max_running_items: 1 },
    });
    let batch = submitted;
    for (let tries = 0; batch.status !== "paused" && tries < 300; tries += 1) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      batch = await api(server, `/api/subagent-batches/${submitted.id}`);
    }
    assert.equal(batch.status, "paused");
    assert.equal(batch.pause_reason, "budget");
    const usage = await api(server, "/api/threads/t-budget/token-usage");
    assert.equal(usage.budgets[0].scope, "thread");

    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/threads/t-budget`);
      await ready(page);
      await page.waitForSelector('.usage-budget[data-scope="thread"]');
      assert.equal(await page.textContent('.usage-budget[data-scope="thread"]'), budgetText(usage.budgets[0]));
      const card = `.batch-card[data-batch-id="${batch.id}"]`;
      await page.waitForSelector(`${card}[data-status="paused"] .batch-budget:not([hidden])`);
      const shown = await page.textContent(`${card} .batch-budget`);
      assert.equal(shown, budgetText(batch.budget, "budget"));
      assert.match(shown, /^batch budget \$0\.00\d+ of \$0\.003 \(\d+%\) · paused at its budget$/);
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
    }
  });
});
