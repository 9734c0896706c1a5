// The usage page in headless chromium against a real `subflow serve` with priced models:
// a chart of cost per day by model, totals equal to `GET /api/usage`, and the threads
// that cost most, each opening its thread.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { formatCost } from "../../assets/cards.mjs";
import { api, openBrowser, ready, scriptedModel, startServer } from "./harness.mjs";

/** 2 per million input, 0.5 read from the cache, 8 per million output. */
const PRICING =
  '[models.pricing]\ncurrency = "USD"\ninput_per_million = 2.0\noutput_per_million = 8.0\ninput_cache_hit_per_million = 0.5\n';

describe("the usage page", () => {
  let server;
  before(async () => {
    server = await startServer({ config: `${scriptedModel({ delayMs: 0 })}${PRICING}` });
  });
  after(() => server.stop());

  test("charts cost per day by model, totals as the API counts them, and threads by cost", async () => {
    await api(server, "/api/threads/cheap/runs/wait", {
      method: "POST",
      body: { input: { messages: [{ type: "human", content: "/echo hi" }] } },
    });
    await api(server, "/api/threads/dear/runs/wait", {
      method: "POST",
      body: { input: { messages: [{ type: "human", content: "Compare two queues" }] } },
    });
    const report = await api(server, "/api/usage?group_by=day");
    assert.equal(report.counted.runs, 2);
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      await page.click("#usage-toggle");
      await page.waitForFunction(() => document.querySelectorAll("#usage-page .usage-thread").length === 2);
      // One bar per model and day with spend: today, on the scripted model.
      const bars = await page.$$eval("#usage-page .usage-bar", (rects) => rects.map((r) => [r.dataset.day, r.dataset.model]));
      const today = report.groups.at(-1).key;
      assert.deepEqual(bars, [[today, "scripted-1"]]);
      assert.equal(await page.getAttribute("#usage-page svg", "aria-label"), "Cost per day by model, USD");
      assert.deepEqual(await page.$$eval("#usage-page .usage-legend li", (items) => items.map((i) => i.textContent)), ["scripted-1"]);
      const counted = await page.textContent('#usage-page [data-section="counted-runs"]');
      const tokens = report.counted.total_tokens.toLocaleString("en-US");
      assert.equal(counted, `Counted runs: 2 runs · ${tokens} tokens · ${formatCost(report.counted.cost.total, "USD")}`);
      assert.match(await page.textContent('#usage-page [data-section="stopped-runs"]'), /^Stopped runs: 0 runs · 0 tokens/);
      // The demo plan costs more than an echo: it comes first.
      const threads = await page.$$eval("#usage-page .usage-thread", (rows) => rows.map((r) => r.dataset.threadId));
      assert.deepEqual(threads, ["dear", "cheap"]);
      await page.click('#usage-page .usage-thread[data-thread-id="cheap"]');
      await page.waitForFunction(() => location.pathname.endsWith("/cheap") && document.getElementById("usage-page").hidden);
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
    }
  });
});
