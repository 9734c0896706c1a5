// The web workspace in headless chromium against a real `subflow serve`: live task
// cards, reload, stop, token labels, reconnects, gap recovery, token mode, narrow and
// dark layouts, and a perf measurement (printed, not asserted).

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  api,
  cards,
  docsScreenshot,
  openBrowser,
  ready,
  runEnded,
  screenshot,
  scriptedModel,
  send,
  startProxy,
  startServer,
  subflowCli,
} from "./harness.mjs";

/** Records every distinct (status, step count, token label) each card shows, and the announcements. */
async function record(page) {
  await page.evaluate(() => {
    window.__samples = {};
    window.__announcements = [];
    const sample = () => {
      for (const card of document.querySelectorAll(".task-card")) {
        const label = card.querySelector(".token-label");
        const now = {
          status: card.dataset.status,
          steps: Number.parseInt(card.querySelector(".step-count").textContent, 10),
          header: card.querySelector(".card-header-text").textContent,
          tokens: label.hidden ? null : label.textContent,
        };
        const list = (window.__samples[card.dataset.taskId] ??= []);
        const last = list[list.length - 1];
        if (last === undefined || JSON.stringify(last) !== JSON.stringify(now)) list.push(now);
      }
    };
    const options = { subtree: true, childList: true, characterData: true, attributes: true };
    new MutationObserver(sample).observe(document.getElementById("messages"), options);
    const announcer = document.getElementById("announcer");
    new MutationObserver(() => window.__announcements.push(announcer.textContent)).observe(announcer, options);
  });
}

const samples = (page) => page.evaluate(() => window.__samples);

/** The step rows of every card, expanding each; keyed by task id. */
async function expandedSteps(page) {
  const result = {};
  for (const card of await cards(page)) {
    const selector = `.task-card[data-task-id="${card.id}"]`;
    if ((await page.getAttribute(`${selector} .card-toggle`, "aria-expanded")) !== "true") {
      await page.click(`${selector} .card-toggle`);
    }
    await page.waitForFunction(
      (s) => {
        const body = document.querySelector(`${s} .card-body`);
        const count = document.querySelector(`${s} .step-count`).textContent;
        return !body.hidden && body.querySelector(".card-note").hidden && !count.startsWith("0 ");
      },
      selector,
    );
    result[card.id] = await page.$$eval(`${selector} .step`, (rows) => rows.map((row) => row.textContent));
  }
  return result;
}

describe("the demo run", () => {
  let server;
  before(async () => {
    server = await startServer({ config: scriptedModel({ delayMs: 100 }) });
  });
  after(() => server.stop());

  test("three cards grow live, end completed with token labels, and a reload restores them", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      await record(page);
      await send(page, "Compare two queues");
      await page.waitForFunction(() => document.querySelectorAll('.task-card[data-status="completed"]').length === 3, null, {
        timeout: 60000,
      });
      await runEnded(page);
      await screenshot(page, "demo-completed");
      await docsScreenshot(page, "workspace");

      assert.equal(await page.textContent(".card-group-header"), "Executing 3 subtasks in parallel");
      const seen = await samples(page);
      assert.equal(Object.keys(seen).length, 3);
      for (const [id, list] of Object.entries(seen)) {
        const running = list.filter((s) => s.status === "in_progress").map((s) => s.steps);
        assert.ok(new Set(running).size >= 2, `${id}: the step count grew while running: ${running}`);
        assert.ok(running.some((n) => n > 0), `${id}: steps arrived live`);
        const counts = list.filter((s) => s.status === "in_progress").map((s) => s.steps);
        assert.deepEqual(counts, [...counts].sort((a, b) => a - b), `${id}: step counts never shrink while it runs`);
        const last = list[list.length - 1];
        assert.equal(last.status, "completed");
        assert.equal(last.steps, 2, "the steps it lists: its answer became the result");
        assert.equal(last.header, "Subtask completed");
        assert.match(last.tokens, /^\d[\d,]* Tokens$/);
        assert.ok(list.some((s) => s.status === "in_progress" && s.header === "Running subtask"));
      }
      const announced = await page.evaluate(() => window.__announcements);
      assert.equal(announced.filter((text) => text.startsWith("Subtask completed: ")).length, 3, announced.join(" | "));
      assert.ok(announced.includes("Run finished"), announced.join(" | "));

      const before = await cards(page);
      const liveSteps = await expandedSteps(page);
      for (const rows of Object.values(liveSteps)) {
        assert.equal(rows.length, 2, "the two tool steps; the answer is the result");
      }

      await page.reload();
      await ready(page);
      // Finding 1: after a reload the collapsed cards already show their counts (from /tasks).
      const reloaded = await cards(page);
      assert.deepEqual(reloaded, before);
      assert.deepEqual(
        reloaded.map((c) => c.steps),
        ["2 steps", "2 steps", "2 steps"],
        "counts before any card is expanded",
      );
      // Steps come back from the /events backfill when a card is expanded.
      assert.deepEqual(await expandedSteps(page), liveSteps);
      assert.deepEqual(
        (await cards(page)).map((c) => c.steps),
        ["2 steps", "2 steps", "2 steps"],
      );
      await screenshot(page, "demo-reloaded-expanded");
      // Only the message list scrolls: expanded cards never make the page itself taller.
      const pageHeight = await page.evaluate(() => [document.documentElement.scrollHeight, window.innerHeight]);
      assert.equal(pageHeight[0], pageHeight[1], "the page does not scroll");
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
    }
  });
});

describe("stopping", () => {
  let server;
  before(async () => {
    // Slow text: the subagents' answers take seconds, so a stop lands mid-task.
    server = await startServer({ config: scriptedModel({ delayMs: 300 }) });
  });
  after(() => server.stop());

  test("a run stopped mid-task shows Subtask failed once the turn ends, also after a reload", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      await record(page);
      await send(page, "Compare two queues");
      await page.waitForFunction(
        () => {
          const running = [...document.querySelectorAll('.task-card[data-status="in_progress"]')];
          return running.length === 3 && running.every((card) => !card.querySelector(".step-count").textContent.startsWith("0 "));
        },
        null,
        { timeout: 30000 },
      );
      assert.deepEqual(
        (await cards(page)).map((c) => c.header),
        ["Running subtask", "Running subtask", "Running subtask"],
      );
      await page.click("#stop");
      await runEnded(page);
      const stopped = await cards(page);
      assert.deepEqual(
        stopped.map((c) => [c.status, c.header]),
        Array(3).fill(["failed", "Subtask failed"]),
      );
      assert.equal(await page.locator(".spinner").count(), 0);
      await screenshot(page, "stopped-mid-task");

      await page.reload();
      await ready(page);
      const headers = async () => (await cards(page)).map((c) => c.header);
      assert.deepEqual(await headers(), Array(3).fill("Subtask failed"));
      await expandedSteps(page);
      assert.deepEqual(await headers(), Array(3).fill("Subtask failed"));
      assert.equal(await page.locator(".spinner").count(), 0);
      assert.equal(await page.getByText("Running subtask").count(), 0);
      await screenshot(page, "stopped-reloaded");
    } finally {
      await browser.close();
    }
  });

  test("the stop control on one running card stops only that card, confirmed in place", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      await send(page, "Compare two queues");
      await page.waitForFunction(
        () => {
          const running = [...document.querySelectorAll('.task-card[data-status="in_progress"]')];
          return (
            running.length === 3 &&
            running.every(
              (card) =>
                !card.querySelector(".card-stop-box").hidden &&
                !card.querySelector(".step-count").textContent.startsWith("0 "),
            )
          );
        },
        null,
        { timeout: 30000 },
      );
      const second = page.locator(".task-card").nth(1);
      const id = await second.getAttribute("data-task-id");
      // Asked in place; "Keep running" takes the question back.
      await second.locator(".card-stop").click();
      assert.ok(await second.locator(".card-stop-question").isVisible());
      assert.ok(!(await second.locator(".card-stop").isVisible()));
      await second.locator(".card-stop-keep").click();
      assert.ok(await second.locator(".card-stop").isVisible());
      assert.equal(await second.getAttribute("data-status"), "in_progress");
      await second.locator(".card-stop").click();
      await second.locator(".card-stop-confirm").click();
      await page.waitForFunction(
        (taskId) => document.querySelector(`.task-card[data-task-id="${taskId}"]`).dataset.status === "failed",
        id,
        { timeout: 30000 },
      );
      await screenshot(page, "one-task-stopped");
      await runEnded(page);
      const ended = await cards(page);
      assert.deepEqual(
        ended.map((c) => [c.id === id, c.status]),
        [
          [false, "completed"],
          [true, "failed"],
          [false, "completed"],
        ],
      );
      assert.match(ended[1].tokens, /^\d[\d,]* Tokens$/, "the stopped card keeps its usage");
      assert.equal(await page.locator(".card-stop-box:not([hidden])").count(), 0);
      // Its body says it was stopped, and the run's answer went on without it.
      await second.locator(".card-toggle").click();
      assert.equal(await second.locator(".card-error").textContent(), "Task cancelled by user.");
      assert.ok(await page.getByText("Task cancelled by user.", { exact: false }).count() >= 1);
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
    }
  });

  test("a Stop while the answer streams leaves no spinner", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      await send(page, "Compare two queues");
      await page.waitForFunction(() => (document.querySelector(".message-ai.streaming")?.textContent.length ?? 0) > 0);
      await page.click("#stop");
      await runEnded(page);
      assert.equal(await page.locator(".spinner").count(), 0);
      assert.equal(await page.locator('[aria-busy="true"]').count(), 0);
      assert.equal(await page.locator('.task-card[data-status="in_progress"]').count(), 0);
      assert.equal(await page.isVisible("#send"), true);
      await screenshot(page, "stopped-while-streaming");
    } finally {
      await browser.close();
    }
  });
});

describe("thread search", () => {
  let server;
  before(async () => {
    server = await startServer({ config: scriptedModel({ delayMs: 0 }) });
  });
  after(() => server.stop());

  test("the search box finds a word of a later message, which only the server can see", async () => {
    const wait = (thread, text) =>
      api(server, `/api/threads/${thread}/runs/wait`, {
        method: "POST",
        body: { input: { messages: [{ type: "human", content: text }] } },
      });
    await wait("search-a", "/echo first words");
    await wait("search-a", "/echo a zeppelin later on");
    await wait("search-b", "/echo something else");
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      const listed = () => page.$$eval("#thread-list li button", (buttons) => buttons.map((b) => b.dataset.threadId));
      await page.waitForFunction(() => document.querySelectorAll("#thread-list li").length === 2);
      await page.fill("#thread-search", "zeppelin");
      await page.waitForFunction(() => {
        const ids = [...document.querySelectorAll("#thread-list li button")].map((b) => b.dataset.threadId);
        return ids.length === 1 && ids[0] === "search-a";
      });
      assert.deepEqual(await listed(), ["search-a"], "its title is the first message; the word is in the second");
      await page.fill("#thread-search", "no such word");
      await page.waitForFunction(() => !document.getElementById("thread-list-note").hidden);
      assert.equal(await page.textContent("#thread-list-note"), "No thread matches.");
      await page.fill("#thread-search", "");
      await page.waitForFunction(() => document.querySelectorAll("#thread-list li").length === 2);
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
    }
  });
});

describe("every run and batch", () => {
  let server;
  before(async () => {
    server = await startServer({ config: scriptedModel({ delayMs: 0 }) });
  });
  after(() => server.stop());

  test("the activity panel lists every run and batch across threads and opens a row's thread", async () => {
    for (const thread of ["act-1", "act-2"]) {
      await api(server, `/api/threads/${thread}/runs/wait`, {
        method: "POST",
        body: { input: { messages: [{ type: "human", content: `/echo ${thread}` }] } },
      });
    }
    await api(server, "/api/threads/act-3/subagent-batches", {
      method: "POST",
      body: {
        submission_key: "activity",
        title: "Activity batch",
        subagent_type: "general-purpose",
        items: [{ key: "a", prompt: "p" }],
      },
    });
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      await page.click("#activity-toggle");
      await page.waitForFunction(() => document.querySelectorAll("#activity .activity-row").length === 3);
      const rows = await page.$$eval("#activity .activity-row", (buttons) =>
        buttons.map((b) => [b.closest("section").className, b.dataset.threadId]),
      );
      assert.deepEqual(rows, [
        ["activity-section activity-runs", "act-2"],
        ["activity-section activity-runs", "act-1"],
        ["activity-section activity-batches", "act-3"],
      ]);
      assert.match(await page.textContent("#activity .activity-batches .activity-row"), /Activity batch/);
      assert.match(await page.textContent("#activity .activity-runs .activity-row"), /Succeeded/);
      await page.click('#activity .activity-runs .activity-row[data-thread-id="act-1"]');
      await page.waitForFunction(() => location.pathname.endsWith("/act-1") && document.getElementById("activity").hidden);
      await page.waitForFunction(() => document.getElementById("thread-title").textContent === "/echo act-1");
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
    }
  });
});

describe("token_usage.enabled = false", () => {
  let server;
  before(async () => {
    server = await startServer({ config: scriptedModel({ delayMs: 20 }), env: { SUBFLOW__TOKEN_USAGE__ENABLED: "false" } });
  });
  after(() => server.stop());

  test("no token label appears, live or after a reload", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await ready(page);
      assert.equal(await page.getAttribute("html", "data-token-usage"), "false");
      await record(page);
      await send(page, "Compare two queues");
      await page.waitForFunction(() => document.querySelectorAll('.task-card[data-status="completed"]').length === 3, null, {
        timeout: 60000,
      });
      await runEnded(page);
      const seen = await samples(page);
      assert.equal(Object.keys(seen).length, 3);
      for (const list of Object.values(seen)) assert.ok(list.every((s) => s.tokens === null), JSON.stringify(list));
      await page.reload();
      await ready(page);
      assert.ok((await cards(page)).every((c) => c.tokens === null));
      assert.equal(await page.getByText(/Tokens$|Collecting tokens|No usage returned/).count(), 0);
      await screenshot(page, "token-usage-disabled");
    } finally {
      await browser.close();
    }
  });
});

describe("a broken stream", () => {
  let server;
  let proxy;
  before(async () => {
    server = await startServer({ config: scriptedModel({ delayMs: 100 }) });
    proxy = await startProxy(server);
  });
  after(async () => {
    await proxy.close();
    await server.stop();
  });

  async function cutMidTask(page) {
    await page.goto(`${proxy.base}/`);
    await ready(page);
    await send(page, "Compare two queues");
    await page.waitForFunction(
      () => document.querySelectorAll('.task-card[data-status="in_progress"]').length === 3 &&
        [...document.querySelectorAll(".step-count")].some((s) => !s.textContent.startsWith("0 ")),
      null,
      { timeout: 30000 },
    );
    proxy.cut();
  }

  async function assertFinished(page) {
    await page.waitForFunction(() => document.querySelectorAll('.task-card[data-status="completed"]').length === 3, null, {
      timeout: 60000,
    });
    await runEnded(page);
    assert.deepEqual(
      (await cards(page)).map((c) => c.steps),
      ["2 steps", "2 steps", "2 steps"],
    );
    // Nothing was shown twice: one lead introduction, one summary.
    assert.equal(await page.locator(".message-ai", { hasText: "from three angles in parallel" }).count(), 1);
  }

  test("the workspace rejoins with Last-Event-ID and the run finishes once", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await cutMidTask(page);
      await assertFinished(page);
      const rejoins = proxy.requests.filter((head) => /^GET \/api\/threads\/[^/]+\/runs\/[^/]+\/stream\?/.test(head));
      assert.ok(rejoins.length >= 1, proxy.requests.join("\n---\n"));
      assert.match(rejoins[0], /\r\nlast-event-id: \d+/i);
      await screenshot(page, "reconnected");
    } finally {
      await browser.close();
    }
  });

  test("a gap reloads the state, backfills every card and rejoins from the latest id", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      const backfills = [];
      page.on("request", (request) => {
        if (request.url().includes("/events?event_types=subagent.step&task_id=")) backfills.push(request.url());
      });
      const rejoinHeaders = [];
      let gapped = null;
      await page.route(/\/runs\/[^/]+\/stream\?/, async (route) => {
        const headers = route.request().headers();
        rejoinHeaders.push(headers["last-event-id"] ?? null);
        if (gapped !== null) return route.continue();
        const runId = /\/runs\/([^/]+)\/stream/.exec(route.request().url())[1];
        gapped = headers["last-event-id"];
        const gap = {
          code: "stream_replay_gap",
          run_id: runId,
          requested_event_id: Number(gapped),
          earliest_available_event_id: Number(gapped) + 1,
          latest_available_event_id: Number(gapped),
          recovery: "reload_durable_state",
        };
        await route.fulfill({
          status: 200,
          headers: { "Content-Type": "text/event-stream" },
          body: `event: gap\ndata: ${JSON.stringify(gap)}\n\n`,
        });
      });
      await cutMidTask(page);
      await assertFinished(page);
      assert.ok(gapped !== null, "the rejoin got the gap");
      assert.ok(rejoinHeaders.length >= 2);
      assert.equal(rejoinHeaders[1], gapped, "rejoined from latest_available_event_id");
      const tasks = new Set(backfills.map((url) => new URL(url).searchParams.get("task_id")));
      assert.equal(tasks.size, 3, backfills.join("\n"));
      await screenshot(page, "gap-recovered");
    } finally {
      await browser.close();
    }
  });
});

describe("token mode", () => {
  let server;
  let token;
  before(async () => {
    const config = `[auth]\nmode = "token"\n\n${scriptedModel({ delayMs: 10 })}`;
    server = await startServer({
      config,
      prepare: (dir) => {
        const file = join(dir, "subflow.toml");
        subflowCli(dir, ["migrate", "--config", file]);
        subflowCli(dir, ["users", "add", "alice", "--config", file]);
        token = /sf_[A-Za-z0-9_-]{43}/.exec(subflowCli(dir, ["tokens", "create", "--user", "alice", "--perm", "admin", "--config", file]))[0];
      },
    });
  });
  after(() => server.stop());

  test("the workspace asks for a token, asks again after a 401, and keeps it for the session", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await page.waitForSelector("#token-dialog[open]");
      // Enter submits the token (it used to press the form's first button, Cancel).
      await page.fill("#token-input", `sf_${"A".repeat(43)}`);
      await page.press("#token-input", "Enter");
      await page.waitForFunction(() => document.getElementById("token-message").textContent.includes("refused"));
      assert.equal(await page.isVisible("#token-dialog"), true);
      await page.fill("#token-input", token);
      await page.press("#token-input", "Enter");
      await ready(page);
      assert.equal(await page.evaluate(() => sessionStorage.getItem("subflow.token")), token);
      assert.equal(await page.textContent("#connection"), "", "the models loaded with the token");
      assert.match(await page.getAttribute("#composer-input", "placeholder"), /^Message /);
      await send(page, "Compare two queues");
      await page.waitForFunction(() => document.querySelectorAll('.task-card[data-status="completed"]').length === 3, null, {
        timeout: 60000,
      });
      await runEnded(page);
      await page.reload();
      await ready(page);
      assert.equal(await page.isVisible("#token-dialog"), false);
      assert.equal((await cards(page)).length, 3);
    } finally {
      await browser.close();
    }
  });
});

describe("token mode, prompt dismissed first", () => {
  let server;
  let token;
  before(async () => {
    const config = `[auth]\nmode = "token"\n\n${scriptedModel({ delayMs: 10 })}`;
    server = await startServer({
      config,
      prepare: (dir) => {
        const file = join(dir, "subflow.toml");
        subflowCli(dir, ["migrate", "--config", file]);
        subflowCli(dir, ["users", "add", "bob", "--config", file]);
        token = /sf_[A-Za-z0-9_-]{43}/.exec(subflowCli(dir, ["tokens", "create", "--user", "bob", "--perm", "admin", "--config", file]))[0];
      },
    });
  });
  after(() => server.stop());

  test("a token entered after a dismissed prompt loads the models the first request could not", async () => {
    const browser = await openBrowser();
    const { page } = browser;
    try {
      await page.goto(`${server.base}/`);
      await page.waitForSelector("#token-dialog[open]");
      await page.click("#token-cancel");
      await page.waitForFunction(() => document.getElementById("connection").textContent.startsWith("Models unavailable"));
      // The thread list asks again; this time the token is given.
      await page.waitForSelector("#token-dialog[open]");
      await page.fill("#token-input", token);
      await page.press("#token-input", "Enter");
      await ready(page);
      await page.waitForFunction(() => document.getElementById("connection").textContent === "");
      assert.match(await page.getAttribute("#composer-input", "placeholder"), /^Message /);
      assert.deepEqual(browser.errors, []);
    } finally {
      await browser.close();
    }
  });
});

describe("narrow screens, dark theme and the keyboard", () => {
  let server;
  before(async () => {
    server = await startServer({ config: scriptedModel({ delayMs: 10 }) });
  });
  after(() => server.stop());

  for (const colorScheme of ["light", "dark"]) {
    test(`at 360 px in the ${colorScheme} theme nothing overflows and cards work from the keyboard`, async () => {
      const browser = await openBrowser({ viewport: { width: 360, height: 740 }, colorScheme });
      const { page } = browser;
      try {
        await page.goto(`${server.base}/`);
        await ready(page);
        await page.focus("#composer-input");
        await page.keyboard.type("Compare two queues");
        await page.keyboard.press("Enter");
        await page.waitForFunction(() => document.querySelectorAll('.task-card[data-status="completed"]').length === 3, null, {
          timeout: 60000,
        });
        await runEnded(page);
        const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
        assert.ok(overflow <= 0, `the page is ${overflow} px wider than the screen`);
        const background = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
        assert.equal(background, colorScheme === "dark" ? "rgb(15, 18, 23)" : "rgb(255, 255, 255)");

        const toggle = page.locator(".task-card .card-toggle").first();
        await toggle.focus();
        await page.keyboard.press("Enter");
        assert.equal(await toggle.getAttribute("aria-expanded"), "true");
        await page.waitForSelector(".task-card .card-body:not([hidden]) .step");
        await screenshot(page, `narrow-${colorScheme}`);
        await page.keyboard.press("Space");
        assert.equal(await toggle.getAttribute("aria-expanded"), "false");

        // The thread list folds behind a button that opens it and Escape closes it.
        assert.equal(await page.isVisible("#thread-list"), false);
        await page.click("#threads-toggle");
        assert.equal(await page.isVisible("#thread-list"), true);
        await page.keyboard.press("Escape");
        assert.equal(await page.isVisible("#thread-list"), false);
      } finally {
        await browser.close();
      }
    });
  }
});

describe("performance (measured, not asserted)", () => {
  let server;
  let threadId;
  const STEPS_PER_TASK = 500;
  // The rows a completed card lists: its tool steps (its AI steps carry no text).
  const TOOL_STEPS = 99 * 4 + 3;
  before(async () => {
    // A script: the lead delegates three tasks; each subagent makes 99 turns of four tool
    // calls, one of three, then answers: 99·5 + 4 + 1 = 500 steps per task.
    const tools = (turn, count) =>
      Array.from({ length: count }, (_, i) => ({ name: "ls", args: { path: `.`, note: `${turn}-${i}` } }));
    const turns = Array.from({ length: 99 }, (_, t) => ({ tool_calls: tools(t, 4) }));
    turns.push({ tool_calls: tools(99, 3) }, { text: "Done with the long task." });
    const script = {
      rules: [
        {
          agent: "lead_agent",
          contains: "[perf]",
          turns: [
            {
              tool_calls: [1, 2, 3].map((n) => ({
                name: "task",
                args: { description: `Long task ${n}`, prompt: `[perf] long task ${n}`, subagent_type: "general-purpose" },
              })),
            },
            { text: "All three long tasks are done." },
          ],
        },
        { agent: "subagent:general-purpose", contains: "[perf]", turns },
      ],
    };
    server = await startServer({
      config: `[loop_detection]\nenabled = false\n\n${scriptedModel({ script: "perf-script.json" })}`,
      prepare: (dir) => writeFileSync(join(dir, "perf-script.json"), JSON.stringify(script)),
    });
    threadId = "perf-thread";
    await api(server, `/api/threads/${threadId}/runs/wait`, {
      method: "POST",
      body: { input: { messages: [{ role: "user", content: "[perf] three long tasks" }] } },
    });
  });
  after(() => server.stop());

  test("3 tasks × 500 steps: counts on first paint, /tasks against an /events page, one card's backfill", async () => {
    const runs = await api(server, `/api/threads/${threadId}/runs`);
    const runId = runs[0].run_id;
    const steps = await api(server, `/api/threads/${threadId}/runs/${runId}/events?event_types=subagent.step&limit=2000`);
    assert.equal(steps.length, 3 * STEPS_PER_TASK, "the seeded thread has 3 × 500 steps");

    const browser = await openBrowser();
    const { page } = browser;
    try {
      const loadStart = Date.now();
      await page.goto(`${server.base}/threads/${threadId}`);
      // What the page showed before task summaries: three collapsed, completed cards...
      await page.waitForFunction(() => document.querySelectorAll('.task-card[data-status="completed"]').length === 3);
      const collapsedMs = Date.now() - loadStart;
      // ...and now also their right counts, before any card is expanded.
      await page.waitForFunction(
        (label) => [...document.querySelectorAll(".task-card .step-count")].filter((c) => c.textContent === label).length === 3,
        `${TOOL_STEPS} steps`,
      );
      const countedMs = Date.now() - loadStart;
      assert.equal(await page.locator(".task-card .step").count(), 0, "no step was loaded to count them");

      // The /tasks call against one /events page of the same run, each timed in the page.
      const timings = await page.evaluate(
        async ({ thread, run, task }) => {
          const time = async (path) => {
            const started = performance.now();
            const response = await fetch(path);
            await response.json();
            return performance.now() - started;
          };
          const median = (xs) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
          const tasks = [];
          const page = [];
          for (let i = 0; i < 7; i += 1) {
            tasks.push(await time(`/api/threads/${thread}/runs/${run}/tasks`));
            page.push(await time(`/api/threads/${thread}/runs/${run}/events?event_types=subagent.step&task_id=${task}&limit=500`));
          }
          return { tasks: median(tasks), page: median(page) };
        },
        { thread: threadId, run: runId, task: steps[0].metadata.task_id },
      );

      const expandStart = Date.now();
      await page.click(".task-card .card-toggle");
      await page.waitForFunction(
        (n) => document.querySelectorAll(".task-card .card-body:not([hidden]) .step").length >= n,
        TOOL_STEPS,
        { timeout: 30000 },
      );
      const expandMs = Date.now() - expandStart;
      const rows = await page.locator(".task-card .card-body:not([hidden]) .step").count();
      assert.equal(rows, TOOL_STEPS);
      assert.equal(await page.textContent(".task-card .step-count"), `${TOOL_STEPS} steps`, "the count is what the card lists");
      await screenshot(page, "perf-expanded");
      console.log(
        `perf: 3 tasks x ${STEPS_PER_TASK} steps: collapsed cards painted in ${collapsedMs} ms, with their right counts ` +
          `(${TOOL_STEPS} steps each, from /tasks) in ${countedMs} ms; GET /tasks took ${timings.tasks.toFixed(1)} ms ` +
          `against ${timings.page.toFixed(1)} ms for one /events page of 500 steps (medians of 7); ` +
          `expanding one card (${rows} step rows from ${STEPS_PER_TASK} backfilled steps) took ${expandMs} ms`,
      );
    } finally {
      await browser.close();
    }
  });
});
