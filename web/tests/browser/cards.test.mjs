// Issue 14's findings in headless chromium against a real `subflow serve`: stopped runs
// after a reload, counts equal to the listed steps, cost on cards and in the footer
// while a run streams, the run list and timeline, the composer's model, thread dates and
// scrolling. (Finished reloads are in workspace.test.mjs's demo test; `tail` in the
// binary's tests.)

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { api, cards, openBrowser, ready, runEnded, screenshot, scriptedModel, send, startServer } from "./harness.mjs";

/** `[models.pricing]` for the model table above it: 2 and 8 per million tokens. */
const PRICING = '[models.pricing]\ncurrency = "USD"\ninput_per_million = 2.0\noutput_per_million = 8.0\n';
const priced = (delayMs) => `${scriptedModel({ delayMs })}${PRICING}`;

const grouped = (n) => n.toLocaleString("en-US");

/** Expands every card and returns, per card, its step count label and its listed rows. */
async function countsAndRows(page) {
  const result = [];
  for (const card of await cards(page)) {
    const selector = `.task-card[data-task-id="${card.id}"]`;
    if ((await page.getAttribute(`${selector} .card-toggle`, "aria-expanded")) !== "true") {
      await page.click(`${selector} .card-toggle`);
    }
    await page.waitForFunction(
      (s) => !document.querySelector(`${s} .card-body`).hidden && document.querySelector(`${s} .card-note`).hidden,
      selector,
    );
    const rows = await page.locator(`${selector} .step`).count();
    result.push({ count: (await cards(page)).find((c) => c.id === card.id).steps, rows });
  }
  return result;
}

const label = (n) => `${n} ${n === 1 ? "step" : "steps"}`;

describe("a stopped run", () => {
  let server;
  before(async () => {
    server = await startServer({ config: priced(300) });
  });
  after(() => server.stop());

  test("keeps its cards' usage and steps after a reload, and its spend shows beside the totals", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      await send(page, "Compare two queues");
      await page.waitForFunction(
        () => {
          const running = [...document.querySelectorAll('.task-card[data-status="in_progress"]')];
          return running.length === 3 && running.every((c) => !c.querySelector(".step-count").textContent.startsWith("0 "));
        },
        null,
        { timeout: 30000 },
      );
      await page.click("#stop");
      await runEnded(page);
      const threadId = decodeURIComponent(new URL(page.url()).pathname.split("/").pop());
      const [run] = await api(server, `/api/threads/${threadId}/runs`);
      assert.equal(run.status, "interrupted");
      // Finding 5: the stopped run's tokens show beside the (empty) counted totals.
      await page.waitForFunction(() => document.querySelector(".usage-stopped") !== null);
      assert.match(await page.textContent(".usage-stopped"), new RegExp(`^\\+ ${grouped(run.total_tokens)} tokens, \\$[0-9.]+ in 1 stopped run$`));
      const live = await cards(page);

      // Finding 2: after a reload the cards keep the usage their end records carry and
      // their steps, and each count is what the card lists.
      await page.reload();
      await ready(page);
      const tasks = await api(server, `/api/threads/${threadId}/runs/${run.run_id}/tasks`);
      const reloaded = await cards(page);
      assert.equal(reloaded.length, 3);
      for (const card of reloaded) {
        const task = tasks.find((t) => t.task_id === card.id);
        assert.equal(card.status, "failed");
        assert.equal(card.tokens, `${grouped(task.usage.total_tokens)} Tokens`, "the end record's usage");
        assert.notEqual(card.steps, "0 steps");
        const before = live.find((c) => c.id === card.id);
        assert.ok(Number.parseInt(card.tokens.replace(/,/g, ""), 10) >= Number.parseInt(before.tokens.replace(/,/g, ""), 10));
      }
      assert.equal(await page.getByText("No usage returned").count(), 0);
      assert.match(await page.textContent(".usage-stopped"), /in 1 stopped run$/);
      for (const { count, rows } of await countsAndRows(page)) assert.equal(count, label(rows));
      await screenshot(page, "stopped-reloaded-usage");
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
    }
  });
});

describe("a run that streams", () => {
  let server;
  before(async () => {
    server = await startServer({ config: priced(120) });
  });
  after(() => server.stop());

  test("counts equal the listed steps, cards show cost and the footer counts the run live", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      await send(page, "Compare two queues");
      await page.waitForSelector(".task-card", { timeout: 30000 });
      // Finding 4: an expanded live card's count always equals the rows it lists.
      await page.click(".task-card .card-toggle");
      await page.evaluate(() => {
        window.__pairs = [];
        const card = document.querySelector(".task-card");
        const sample = () => {
          const count = Number.parseInt(card.querySelector(".step-count").textContent, 10);
          window.__pairs.push([card.dataset.status, count, card.querySelectorAll(".step").length]);
        };
        new MutationObserver(sample).observe(card, { subtree: true, childList: true, characterData: true, attributes: true });
      });
      // Finding 6: while the run streams, the footer counts it and prices it, and cards cost.
      await page.waitForFunction(
        () =>
          !document.getElementById("stop").hidden &&
          document.querySelector(".usage-live") !== null &&
          /cost \$[0-9.]+/.test(document.querySelector(".usage-cost").textContent) &&
          document.querySelector(".task-card .cost-label:not([hidden])") !== null,
        null,
        { timeout: 30000 },
      );
      const during = await page.textContent("#usage");
      assert.doesNotMatch(during, /no prices configured/);
      assert.match(await page.textContent(".task-card .cost-label"), /^\$[0-9.]+$/);
      await runEnded(page);
      const pairs = await page.evaluate(() => window.__pairs);
      assert.ok(pairs.some(([status, count]) => status === "in_progress" && count > 0), JSON.stringify(pairs));
      for (const [status, count, rows] of pairs) assert.equal(count, rows, `${status}: ${JSON.stringify(pairs)}`);
      for (const { count, rows } of await countsAndRows(page)) assert.equal(count, label(rows));
      assert.equal(await page.locator(".usage-live").count(), 0, "settled once the run ended");
      const threadId = decodeURIComponent(new URL(page.url()).pathname.split("/").pop());
      const usage = await api(server, `/api/threads/${threadId}/token-usage`);
      assert.match(await page.textContent(".usage-tokens"), new RegExp(`^${grouped(usage.total_tokens)} tokens`));
      assert.equal(await page.locator(".task-card .cost-label:not([hidden])").count(), 3);
      await screenshot(page, "live-costs");
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
    }
  });
});

describe("a gateway without prices", () => {
  let server;
  before(async () => {
    server = await startServer({ config: scriptedModel({ delayMs: 10 }) });
  });
  after(() => server.stop());

  test("says no prices are configured and puts no cost on cards", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      await send(page, "Compare two queues");
      await runEnded(page);
      await page.waitForFunction(() => /no prices configured/.test(document.getElementById("usage").textContent));
      assert.equal(await page.locator(".task-card .cost-label:not([hidden])").count(), 0);
    } finally {
      await browser.close();
    }
  });
});

describe("the run view", () => {
  let server;
  let threadId;
  before(async () => {
    server = await startServer({ config: priced(30) });
    threadId = "runs-thread";
    for (const content of ["/echo first", "Compare two queues"]) {
      await api(server, `/api/threads/${threadId}/runs/wait`, { method: "POST", body: { input: { messages: [{ role: "user", content }] } } });
    }
  });
  after(() => server.stop());

  for (const [width, colorScheme] of [
    [1280, "light"],
    [360, "dark"],
  ]) {
    test(`lists the runs newest first and draws a timeline by the events' times (${width} px, ${colorScheme})`, async () => {
      const browser = await openBrowser({ viewport: { width, height: 800 }, colorScheme });
      const { page, context } = browser;
      try {
        await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: server.base });
        await page.goto(`${server.base}/threads/${threadId}`);
        await ready(page);
        const runs = await api(server, `/api/threads/${threadId}/runs`);
        await page.click("#runs-toggle");
        await page.waitForSelector(".run-row");
        // Before a run is picked the panel holds the list and nothing else.
        assert.doesNotMatch(await page.textContent("#runs-panel"), /null|undefined/);
        const rows = await page.$$eval(".run-row", (list) =>
          list.map((row) => ({
            id: row.dataset.runId,
            shownId: row.querySelector(".run-id code")?.textContent,
            status: row.querySelector(".run-status").textContent,
            tokens: row.querySelector(".run-tokens").textContent,
            cost: row.querySelector(".run-cost").textContent,
            trace: row.querySelector(".run-trace code")?.textContent,
            duration: row.querySelector(".run-duration").textContent,
          })),
        );
        assert.deepEqual(rows.map((r) => r.id), runs.map((r) => r.run_id), "newest first");
        for (const [row, run] of rows.map((r, i) => [r, runs[i]])) {
          assert.equal(row.status, "Succeeded");
          assert.equal(row.trace, run.trace_id);
          assert.equal(row.shownId, run.run_id, "the run id `subflow tail --run` takes");
          assert.match(row.cost, /^\$[0-9.]+$/);
          assert.match(row.duration, /\d( ms| s|)/);
        }
        await page.click('.run-row:first-child .copy-trace');
        await page.waitForFunction(() => document.querySelector(".run-row .copy-trace").textContent === "Copied");
        assert.equal(await page.evaluate(() => navigator.clipboard.readText()), runs[0].trace_id);
        await page.click('.run-row:first-child .copy-id');
        await page.waitForFunction(() => document.querySelector(".run-row .copy-id").textContent === "Copied");
        assert.equal(await page.evaluate(() => navigator.clipboard.readText()), runs[0].run_id);

        // The demo run's timeline: lead turns and one bar per task, placed by the events' times.
        await page.click(".run-row:first-child .run-select");
        await page.waitForSelector(".timeline .bar-completed");
        const tasks = await api(server, `/api/threads/${threadId}/runs/${runs[0].run_id}/tasks`);
        const bars = await page.$$eval(".timeline .bar", (list) =>
          list.map((bar) => ({
            task: bar.dataset.taskId ?? null,
            kind: bar.className,
            left: Number.parseFloat(bar.style.left),
            width: Number.parseFloat(bar.style.width),
            ticks: bar.querySelectorAll(".tick").length,
          })),
        );
        const taskBars = bars.filter((b) => b.task !== null);
        assert.ok(bars.some((b) => b.kind.includes("bar-lead")), "the lead's turns");
        assert.equal(taskBars.length, tasks.length);
        const ms = (t) => Date.parse(t.replace(/(\.\d{3})\d+/, "$1"));
        const byStart = [...tasks].sort((a, b) => ms(a.started_at) - ms(b.started_at)).map((t) => t.task_id);
        assert.deepEqual(taskBars.map((b) => b.task), byStart, "bars in start order");
        for (let i = 1; i < taskBars.length; i += 1) assert.ok(taskBars[i].left >= taskBars[i - 1].left);
        // Widths are proportional to each task's start-to-end time.
        const first = tasks.find((t) => t.task_id === taskBars[0].task);
        for (const bar of taskBars) {
          const task = tasks.find((t) => t.task_id === bar.task);
          const expected = (bar.width / taskBars[0].width) * (ms(first.ended_at) - ms(first.started_at));
          assert.ok(Math.abs(expected - (ms(task.ended_at) - ms(task.started_at))) <= 2, `${bar.task}: ${JSON.stringify(bars)}`);
          assert.ok(bar.ticks >= 1, "its steps are ticks");
        }
        // Details on focus; a click opens the task's card.
        const focused = page.locator(`.timeline .bar[data-task-id="${taskBars[1].task}"]`);
        await focused.focus();
        const detail = await page.textContent(".timeline-detail");
        const task = tasks.find((t) => t.task_id === taskBars[1].task);
        assert.ok(detail.includes(task.description) && detail.includes(`${grouped(task.usage.total_tokens)} tokens`), detail);
        assert.match(detail, /\$[0-9.]+/);
        const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
        assert.ok(overflow <= 0, `the page is ${overflow} px wider than the screen`);
        await screenshot(page, `run-view-${width}-${colorScheme}`);
        await focused.click();
        await page.waitForFunction(
          (id) => document.querySelector(`.task-card[data-task-id="${id}"] .card-toggle`).getAttribute("aria-expanded") === "true",
          taskBars[1].task,
        );
        assert.equal(await page.isVisible("#runs-panel"), false);
        assert.deepEqual(browser.errors, []);
      } finally {
        await browser.close();
      }
    });
  }
});

describe("models, titles and scrolling", () => {
  let server;
  before(async () => {
    const second = '[[models]]\nname = "second"\nprovider = "scripted"\nmodel = "scripted-2"\ndisplay_name = "Second"\ndemo_delay_ms = 30\n';
    server = await startServer({ config: `${scriptedModel({ delayMs: 30 })}display_name = "Scripted demo"\n\n${second}` });
  });
  after(() => server.stop());

  test("the placeholder names the default model, and the picker runs another", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      assert.equal(await page.getAttribute("#composer-input", "placeholder"), "Message Scripted demo — any prompt runs the demo plan");
      assert.deepEqual(await page.$$eval("#composer-model option", (o) => o.map((x) => x.textContent)), ["Scripted demo", "Second"]);
      await page.selectOption("#composer-model", "second");
      assert.equal(await page.getAttribute("#composer-input", "placeholder"), "Message Second — any prompt runs the demo plan");
      await send(page, "/echo which model");
      // The new thread is in the address once the page created it; the run follows.
      await page.waitForURL(/\/threads\/[^/]+$/);
      const threadId = decodeURIComponent(new URL(page.url()).pathname.split("/").pop());
      let run;
      for (let i = 0; i < 300 && !(run?.status === "success"); i++) {
        [run] = await api(server, `/api/threads/${threadId}/runs`);
        if (run?.status !== "success") await new Promise((resolve) => setTimeout(resolve, 100));
      }
      await runEnded(page);
      assert.equal(run.model_name, "second");
    } finally {
      await browser.close();
    }
  });

  test("threads with one title are told apart by date and id", async () => {
    for (let i = 0; i < 5; i += 1) {
      await api(server, `/api/threads/same-${i}/runs/wait`, { method: "POST", body: { input: { messages: [{ role: "user", content: "/echo Same title" }] } } });
    }
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      const items = await page.$$eval("#thread-list button", (list) =>
        list.map((b) => ({ name: b.querySelector(".thread-name").textContent, date: b.querySelector(".thread-date").textContent })),
      );
      const same = items.filter((i) => i.name === "/echo Same title");
      assert.equal(same.length, 5);
      assert.equal(new Set(same.map((i) => i.date)).size, 5, JSON.stringify(same));
      for (const item of same) assert.match(item.date, /^just now · same-\d$/);
    } finally {
      await browser.close();
    }
  });

  test("new messages scroll into view unless the reader scrolled up", async () => {
    const threadId = "long-thread";
    for (let i = 0; i < 12; i += 1) {
      await api(server, `/api/threads/${threadId}/runs/wait`, { method: "POST", body: { input: { messages: [{ role: "user", content: `/echo line ${i}\n\nwith\n\nseveral\n\nlines` }] } } });
    }
    const browser = await openBrowser({ viewport: { width: 800, height: 600 } });
    const { page } = browser;
    const atBottom = () =>
      page.evaluate(() => {
        const m = document.getElementById("messages");
        return m.scrollHeight - m.scrollTop - m.clientHeight < 4;
      });
    try {
      await page.goto(`${server.base}/threads/${threadId}`);
      await ready(page);
      assert.ok(await page.evaluate(() => document.getElementById("messages").scrollHeight > 2 * document.getElementById("messages").clientHeight));
      assert.equal(await atBottom(), true, "a thread opens at its newest message");
      await send(page, "/echo the newest");
      await runEnded(page);
      await page.waitForFunction(() => document.getElementById("messages").textContent.includes("echo: the newest"));
      assert.equal(await atBottom(), true, "the answer came into view");
      // Scrolled up to read: a new run's messages do not pull the reader down.
      await send(page, "Compare two queues");
      await page.waitForSelector(".task-card", { timeout: 30000 });
      await page.evaluate(() => {
        const m = document.getElementById("messages");
        m.scrollTop = 0;
        m.dispatchEvent(new Event("scroll"));
      });
      await runEnded(page);
      assert.equal(await page.evaluate(() => document.getElementById("messages").scrollTop), 0);
    } finally {
      await browser.close();
    }
  });
});

describe("a real model", () => {
  let server;
  before(async () => {
    const config = '[[models]]\nname = "real"\nprovider = "openai"\nmodel = "gpt-4o-mini"\nbase_url = "http://127.0.0.1:9/v1"\ndisplay_name = "Real model"\n';
    server = await startServer({ config });
  });
  after(() => server.stop());

  test("the composer never promises the demo plan", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      assert.equal(await page.getAttribute("#composer-input", "placeholder"), "Message Real model");
      assert.equal(await page.isVisible("#composer-model"), false, "one model: no picker");
      assert.equal(await page.getByText(/demo plan/).count(), 0);
    } finally {
      await browser.close();
    }
  });
});
