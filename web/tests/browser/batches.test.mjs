// The batch panel (docs/workspace.md#batch-panel) in headless chromium against a real `subflow serve`: a
// `/batch` run shows the panel, the badge and a card that progresses to completed;
// the controls change what the API reports; the polling cadence on the page's fake
// clock; the read-only banner with the worker stopped, Export, and a 5,000-item batch
// (first paint and one poll's time and bytes printed, not asserted).

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { api, docsScreenshot, openBrowser, ready, runEnded, screenshot, scriptedModel, send, startServer } from "./harness.mjs";

/** Subagents take `delayMs` per item, fail on "Fail", and take a minute on "Slow". */
function batchConfig(delayMs) {
  const dir = mkdtempSync(join(tmpdir(), "subflow-batch-script-"));
  const script = join(dir, "script.json");
  writeFileSync(
    script,
    JSON.stringify({
      rules: [
        { agent: "subagent:general-purpose", contains: "Fail", turns: [{ error: "boom" }] },
        { agent: "subagent:general-purpose", contains: "Slow", turns: [{ text: "late", delay_ms: 60000 }] },
        { agent: "subagent:general-purpose", turns: [{ text: "Summary of the chapter.\nSecond line.\nThird.\nFourth.", delay_ms: delayMs }] },
      ],
    }),
  );
  const config = `${scriptedModel({ delayMs: 0, script })}
[models.pricing]
currency = "USD"
input_per_million = 2.0
output_per_million = 8.0

[subagent_batches]
poll_interval_seconds = 0.1
# Cancelled slow items free their slots at the next renewal, a third of the lease.
lease_seconds = 10
`;
  return { config, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

const batchPrompt = (prompts) => `/batch general-purpose\n${prompts.join("\n")}`;

/** Runs `/batch` over `prompts` on `thread` through the API; returns the batch. */
async function submit(server, thread, prompts) {
  await api(server, `/api/threads/${thread}/runs/wait`, {
    method: "POST",
    body: { input: { messages: [{ role: "user", content: batchPrompt(prompts) }] } },
  });
  return (await api(server, `/api/threads/${thread}/subagent-batches`))[0];
}

const batchOf = (server, id) => api(server, `/api/subagent-batches/${id}`);

/** Polls the API (not the page) until `check(batch)` holds. */
async function until(server, id, check, what) {
  for (let i = 0; i < 600; i++) {
    const batch = await batchOf(server, id);
    if (check(batch)) return batch;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`${what}: never happened`);
}

const card = (id) => `.batch-card[data-batch-id="${id}"]`;

describe("batches with a worker", () => {
  let server;
  let cleanup;
  before(async () => {
    const made = batchConfig(2500);
    cleanup = made.cleanup;
    server = await startServer({ config: made.config });
  });
  after(async () => {
    await server.stop();
    cleanup();
  });

  test("a /batch run shows the panel, the badge and a card that progresses to completed", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      await send(page, batchPrompt(["Chapter 1", "Chapter 2", "Chapter 3", "Chapter 4", "Chapter 5", "Chapter 6"]));
      await runEnded(page);
      await page.waitForSelector(".batch-card", { state: "visible" });
      await page.evaluate(() => {
        window.__seen = [];
        const panel = document.getElementById("batches");
        const sample = () => {
          const el = panel.querySelector(".batch-card");
          if (!el) return;
          const now = {
            status: el.dataset.status,
            progress: el.querySelector("progress").value,
            summary: el.querySelector(".batch-summary").textContent,
            badge: panel.querySelector(".batch-badge").hidden ? null : panel.querySelector(".batch-badge").textContent,
          };
          const last = window.__seen[window.__seen.length - 1];
          if (JSON.stringify(last) !== JSON.stringify(now)) window.__seen.push(now);
        };
        sample();
        new MutationObserver(sample).observe(panel, { subtree: true, childList: true, characterData: true, attributes: true });
      });
      // While it runs: the rate, the ETA and the spend so far, with its items open.
      await page.waitForFunction(() => / left · /.test(document.querySelector(".batch-summary")?.textContent ?? ""), null, {
        timeout: 60000,
      });
      await page.click(".batch-card button:has-text('View items')");
      await page.waitForSelector(".batch-item", { state: "visible" });
      await docsScreenshot(page, "batches");
      await page.waitForSelector('.batch-card[data-status="completed"]', { timeout: 60000 });
      const seen = await page.evaluate(() => window.__seen);
      assert.equal(seen[0].badge, "1", JSON.stringify(seen));
      assert.ok(seen.some((s) => s.progress > 0 && s.progress < 100), `it progressed: ${JSON.stringify(seen)}`);
      const last = seen[seen.length - 1];
      assert.equal(last.status, "completed");
      assert.equal(last.progress, 100);
      assert.equal(last.badge, null, "no active batch, no badge");
      assert.match(last.summary, /^6 of 6 · .*\$0\.\d+ in all$/);
      assert.equal(await page.textContent(".batch-card .batch-meta"), "general-purpose · limits 100 live · 3 running · 3 attempts");
      // Item rows: key, status, attempt and a preview clamped to three lines.
      const rows = await page.$$eval(".batch-item", (items) =>
        items.map((i) => [i.querySelector(".batch-item-key").textContent, i.dataset.status, getComputedStyle(i.querySelector(".batch-item-preview")).webkitLineClamp]),
      );
      assert.equal(rows.length, 6);
      assert.deepEqual(rows[0], ["item-1", "succeeded", "3"]);
      // The status filter asks the API for one status's items.
      await page.selectOption(".batch-items-filter", "failed");
      await page.waitForFunction(() => document.querySelector(".batch-items-note")?.textContent === "No failed items.");
      assert.equal(await page.locator(".batch-item").count(), 0);
      await page.selectOption(".batch-items-filter", "succeeded");
      await page.waitForFunction(() => document.querySelectorAll('.batch-item[data-status="succeeded"]').length === 6);
      await page.selectOption(".batch-items-filter", "");
      await page.waitForFunction(() => document.querySelectorAll(".batch-item").length === 6);
      // The footer shows the batch spend beside, not inside, the totals.
      await page.waitForFunction(() => document.querySelector(".usage-batches")?.textContent.startsWith("batches 6 items"));
      await screenshot(page, "batch-completed");
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
    }
  });

  test("pause, resume, cancel and retry from the panel change what the API reports", async () => {
    const slow = await submit(server, "t-controls", ["Slow 1", "Slow 2", "Slow 3", "Slow 4"]);
    const failing = await submit(server, "t-retry", ["Fail 1"]);
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/threads/t-controls`);
      await ready(page);
      await until(server, slow.id, (b) => b.status === "running", "running");
      await page.click(`${card(slow.id)} button:has-text("Pause")`);
      await page.waitForSelector(`${card(slow.id)}[data-status="paused"]`);
      assert.equal((await batchOf(server, slow.id)).status, "paused");
      await page.click(`${card(slow.id)} button:has-text("Resume")`);
      await page.waitForSelector(`${card(slow.id)}:not([data-status="paused"])`);
      assert.ok(["queued", "running"].includes((await batchOf(server, slow.id)).status));
      await page.click(`${card(slow.id)} button:has-text("Cancel")`);
      await page.waitForSelector(`${card(slow.id)}[data-status="cancelled"]`);
      const cancelled = await batchOf(server, slow.id);
      assert.equal(cancelled.status, "cancelled");
      assert.equal(cancelled.counts.cancelled, 4);
      assert.equal(await page.isHidden(`${card(slow.id)} button:has-text("Cancel")`), true, "nothing to cancel any more");

      const failed = await until(server, failing.id, (b) => b.status === "failed", "failed");
      const [before] = await api(server, `/api/threads/t-retry/subagent-batches/${failed.id}/items`);
      await page.goto(`${server.base}/threads/t-retry`);
      await ready(page);
      await page.click(`${card(failed.id)} button:has-text("View items")`);
      await page.waitForSelector(`${card(failed.id)} .batch-item[data-status="failed"] .batch-item-error:has-text("boom")`);
      const retried = page.waitForResponse((r) => r.url().endsWith("/retry") && r.request().method() === "POST");
      await page.click(`${card(failed.id)} button:has-text("Retry")`);
      const answer = await retried;
      assert.equal(answer.status(), 200);
      assert.equal((await answer.json()).status, "pending");
      // The item ran again: it failed anew, with a new completion time.
      const [after] = await (async () => {
        for (;;) {
          const items = await api(server, `/api/threads/t-retry/subagent-batches/${failed.id}/items`);
          if (items[0].status === "failed" && items[0].completed_at !== before.completed_at) return items;
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
      })();
      assert.equal(after.error, before.error);
      assert.deepEqual([before.retries, after.retries], [0, 1], "the retry is counted");
      // The row says the item ran before: its attempt restarted, the retry shows.
      await page.waitForSelector(
        `${card(failed.id)} .batch-item[data-status="failed"] .batch-item-attempt:has-text("attempt ${after.attempt} · retried once")`,
      );
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
    }
  });

  test("the list polls every 2 s while a batch is active, 15 s when none is, never in a hidden tab", async () => {
    // The idle thread's batch first: the slow one then holds the worker's slots.
    const idle = await submit(server, "t-idle", ["Chapter 1"]);
    await until(server, idle.id, (b) => b.status === "completed", "completed");
    const prompts = Array.from({ length: 150 }, (_, i) => `Slow ${i + 1}`);
    const active = await submit(server, "t-poll", prompts);
    const browser = await openBrowser();
    const { page } = browser;
    const reads = () =>
      page.evaluate(() => ({
        list: window.__reads.filter((u) => u.includes("/subagent-batches?limit=20")).length,
        items: window.__reads.filter((u) => u.includes("/items?")).length,
      }));
    const polls = () => page.evaluate(() => Number(document.getElementById("batches").dataset.polls));
    // Waits on the page from here: its own timers are frozen with its clock.
    const eventually = async (check, what) => {
      for (let i = 0; i < 500; i++) {
        if (await page.evaluate(check)) return;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      throw new Error(`${what}: never happened`);
    };
    const settled = (n) => eventually(`Number(document.getElementById("batches").dataset.polls) >= ${n}`, `poll ${n} scheduled`);
    const setHidden = (hidden) =>
      page.evaluate((value) => {
        Object.defineProperty(document, "hidden", { configurable: true, get: () => value });
        Object.defineProperty(document, "visibilityState", { configurable: true, get: () => (value ? "hidden" : "visible") });
        document.dispatchEvent(new Event("visibilitychange"));
      }, hidden);
    try {
      await page.addInitScript(() => {
        window.__reads = [];
        const original = window.fetch;
        window.fetch = (input, init) => {
          window.__reads.push(String(input));
          return original(input, init);
        };
      });
      await page.clock.install();
      await page.goto(`${server.base}/threads/t-poll`);
      await ready(page);
      await page.waitForSelector(card(active.id));
      await settled(1);
      assert.equal(await page.getAttribute("#batches", "data-next-poll"), "2000");
      // Freeze the page's time, then make the panel read now: its next read is due 2 s later.
      await page.clock.pauseAt((await page.evaluate(() => Date.now())) + 100);
      let count = await polls();
      await setHidden(false);
      await settled(count + 1);
      let before = await reads();
      await page.clock.runFor(1999);
      assert.equal((await reads()).list, before.list, "not before 2 s");
      count = await polls();
      await page.clock.runFor(1);
      assert.equal((await reads()).list, before.list + 1, "at 2 s");
      await settled(count + 1);

      // Items: the first page polls every 3 s until Load more fetched another page.
      await page.click(`${card(active.id)} button:has-text("View items")`);
      await eventually(() => document.querySelectorAll(".batch-item").length === 100, "the first 100 items");
      await eventually(
        `document.querySelector('${card(active.id)} .batch-items-box').dataset.nextPoll === "3000"`,
        "items polling",
      );
      before = await reads();
      await page.clock.runFor(3000);
      assert.ok((await reads()).items >= before.items + 1, "the first page again at 3 s");
      await page.click(`${card(active.id)} button:has-text("Load more")`);
      await eventually(() => document.querySelectorAll(".batch-item").length === 150, "150 items");
      assert.equal(await page.isHidden(`${card(active.id)} button:has-text("Load more")`), true);
      before = await reads();
      await page.clock.runFor(10000);
      assert.equal((await reads()).items, before.items, "no item polls once more pages are loaded");

      // A hidden tab reads nothing; showing it again reads at once.
      await setHidden(true);
      assert.equal(await page.getAttribute("#batches", "data-next-poll"), "off");
      before = await reads();
      await page.clock.runFor(60000);
      assert.equal((await reads()).list, before.list, "nothing while hidden");
      count = await polls();
      await setHidden(false);
      assert.equal((await reads()).list, before.list + 1, "visible again: read at once");
      await settled(count + 1);

      // A thread whose batches all ended polls every 15 s.
      await page.goto(`${server.base}/threads/t-idle`);
      await ready(page);
      await page.waitForSelector(card(idle.id));
      await settled(1);
      assert.equal(await page.getAttribute("#batches", "data-next-poll"), "15000");
      await page.clock.pauseAt((await page.evaluate(() => Date.now())) + 100);
      count = await polls();
      await setHidden(false);
      await settled(count + 1);
      before = await reads();
      await page.clock.runFor(14999);
      assert.equal((await reads()).list, before.list, "not before 15 s");
      await page.clock.runFor(1);
      assert.equal((await reads()).list, before.list + 1, "at 15 s");
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
      await api(server, `/api/threads/t-poll/subagent-batches/${active.id}/cancel`, { method: "POST" });
    }
  });
});

describe("batches with the worker stopped", () => {
  let server;
  let cleanup;
  before(async () => {
    const made = batchConfig(0);
    cleanup = made.cleanup;
    server = await startServer({ config: made.config, args: ["--no-worker"] });
  });
  after(async () => {
    await server.stop();
    cleanup();
  });

  test("a 5,000-item batch is read-only with the banner, exports its JSONL, and stays responsive", async () => {
    const prompts = Array.from({ length: 5000 }, (_, i) => `Chapter ${i + 1}`);
    const big = await submit(server, "t-big", prompts);
    assert.equal(big.total_items, 5000);
    const browser = await openBrowser();
    const { page } = browser;
    try {
      const started = Date.now();
      await page.goto(`${server.base}/threads/t-big`);
      await page.waitForSelector(`${card(big.id)} .batch-summary`, { state: "visible" });
      const firstPaint = Date.now() - started;
      await ready(page);
      assert.equal(
        await page.textContent(".batch-banner"),
        "The batch worker is not running. Historical batches are read-only.",
      );
      assert.equal(await page.isVisible(".batch-banner"), true);
      assert.equal(await page.getAttribute("#batches", "data-next-poll"), "off", "no polling without a worker");
      assert.equal(await page.isDisabled(`${card(big.id)} button:has-text("Pause")`), true);
      assert.equal(await page.isDisabled(`${card(big.id)} button:has-text("Cancel")`), true);
      assert.equal(await page.textContent(`${card(big.id)} .batch-summary`), "0 of 5,000");

      const download = page.waitForEvent("download");
      await page.click(`${card(big.id)} button:has-text("Export JSONL")`);
      const file = await download;
      assert.equal(file.suggestedFilename(), `${big.id}-results.jsonl`);
      const saved = readFileSync(await file.path(), "utf8");
      const direct = await (await fetch(`${server.base}/api/threads/t-big/subagent-batches/${big.id}/results.jsonl`)).text();
      assert.equal(saved, direct, "the download is results.jsonl");
      assert.equal(saved.trim().split("\n").length, 5000);

      // Keyboard: View items from the keyboard; the first page of 100.
      await page.focus(`${card(big.id)} button:has-text("View items")`);
      const itemsStarted = Date.now();
      await page.keyboard.press("Enter");
      await page.waitForFunction(() => document.querySelectorAll(".batch-item").length === 100);
      const itemsPaint = Date.now() - itemsStarted;
      const timing = await page.evaluate(() => {
        const of = (part) => performance.getEntriesByType("resource").filter((e) => e.name.includes(part)).pop();
        const list = of("/subagent-batches?limit=20");
        const items = of("/items?offset=0");
        return {
          list: { ms: Math.round(list.duration), bytes: list.encodedBodySize },
          items: { ms: Math.round(items.duration), bytes: items.encodedBodySize },
        };
      });
      console.log(
        `5,000-item batch: first paint ${firstPaint} ms; one list poll ${timing.list.ms} ms, ${timing.list.bytes} bytes; ` +
          `first items page ${timing.items.ms} ms, ${timing.items.bytes} bytes, shown in ${itemsPaint} ms`,
      );

      // 360 px wide: nothing overflows sideways, in the light and the dark scheme.
      for (const colorScheme of ["light", "dark"]) {
        await page.emulateMedia({ colorScheme });
        await page.setViewportSize({ width: 360, height: 740 });
        const widths = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
        assert.ok(widths[0] <= widths[1], `no sideways scroll at 360 px: ${widths}`);
        await screenshot(page, `batches-narrow-${colorScheme}`);
      }
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
    }
  });
});
