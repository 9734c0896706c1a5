// The run timeline's layout (timeline.mjs) and the footer's and thread list's pure helpers
// (panels.mjs), which the browser tests only see drawn.

import assert from "node:assert/strict";
import { test } from "node:test";

import { liveRunUsage, relativeDate } from "../../assets/panels.mjs";
import { axisPercent, formatDuration, parseTime, timelineModel } from "../../assets/timeline.mjs";

const at = (seconds) => new Date(Date.UTC(2026, 0, 1, 0, 0, 0) + seconds * 1000).toISOString().replace("Z", "123Z");

test("times keep their microseconds and durations read as people say them", () => {
  const fraction = parseTime("2026-01-01T00:00:00.123456Z") - parseTime("2026-01-01T00:00:00Z");
  assert.ok(Math.abs(fraction - 123.456) < 0.001, `${fraction}`);
  assert.equal(parseTime("2026-01-01T01:00:00+01:00"), parseTime("2026-01-01T00:00:00Z"));
  assert.equal(parseTime("yesterday"), null);
  assert.deepEqual([850, 4200, 185000, -1].map(formatDuration), ["850 ms", "4.2 s", "3 min 5 s", "—"]);
});

test("lead turns end at their response and began latency_ms before; tasks run from start to end", () => {
  const run = { status: "success", created_at: at(0), updated_at: at(10) };
  const events = [
    { event_type: "run.start", created_at: at(0), metadata: {} },
    { event_type: "llm.ai.response", created_at: at(2), metadata: { caller: "lead_agent", latency_ms: 1500, usage: { total_tokens: 40 } } },
    { event_type: "subagent.step", created_at: at(4), metadata: { task_id: "b" } },
    { event_type: "subagent.step", created_at: at(3), metadata: { task_id: "a" } },
    { event_type: "llm.ai.response", created_at: at(9), metadata: { caller: "lead_agent", latency_ms: null } },
    { event_type: "llm.ai.response", created_at: at(9), metadata: { caller: "middleware:title" } },
  ];
  const tasks = [
    { task_id: "b", description: "B", status: "cancelled", started_at: at(3), ended_at: at(6), usage: null, cost: null },
    { task_id: "a", description: "A", status: "completed", started_at: at(2.5), ended_at: at(8), usage: { total_tokens: 9 } },
    { task_id: "c", description: "C", status: "running", started_at: null },
  ];
  const model = timelineModel({ run, events, tasks, now: 0 });
  assert.deepEqual(
    model.lead.map((t) => [t.end - t.start, t.index, t.tokens]),
    [
      [1500, 1, 40],
      [7000, 2, null],
    ],
    "without a latency a turn starts at the lead's previous event",
  );
  assert.deepEqual(model.tasks.map((t) => t.id), ["a", "b"], "by start; a task that never started has no bar");
  assert.deepEqual(model.tasks.map((t) => t.status), ["completed", "failed"]);
  assert.equal(model.tasks[1].ticks.length, 1);
  assert.equal(model.end - model.start, 10000);
  assert.equal(axisPercent(parseTime(at(2.5)), model), 25);
  assert.equal(axisPercent(parseTime(at(99)), model), 100);
});

test("a running run's tasks without an end reach now", () => {
  const now = parseTime(at(20));
  const model = timelineModel({
    run: { status: "running", created_at: at(0), updated_at: at(1) },
    events: [],
    tasks: [{ task_id: "a", status: "running", started_at: at(5), ended_at: null }],
    now,
  });
  assert.equal(model.tasks[0].end, now);
  assert.equal(model.end, now);
});

test("relative dates", () => {
  const now = Date.UTC(2026, 5, 10, 12, 0, 0);
  assert.equal(relativeDate(now - 20_000, now), "just now");
  assert.equal(relativeDate(now - 5 * 60_000, now), "5 min ago");
  assert.equal(relativeDate(now - 3 * 3600_000, now), "3 h ago");
  assert.equal(relativeDate(now - 2 * 86400_000, now), "2 d ago");
  assert.match(relativeDate(now - 30 * 86400_000, now), /2026/);
  assert.equal(relativeDate(Number.NaN, now), "");
});

test("a live run's usage: the lead's own calls and its cards, priced at their models", () => {
  const models = [
    { name: "lead", model: "lead-1", pricing: { currency: "USD", input_per_million: 1, output_per_million: 2 } },
    { name: "sub", model: "sub-1", pricing: { currency: "USD", input_per_million: 10, output_per_million: 20 } },
  ];
  const messages = [
    { type: "human", content: "earlier" },
    { type: "ai", usage_metadata: { input_tokens: 999, output_tokens: 1, total_tokens: 1000 } },
    { type: "human", content: "now" },
    // The lead's message carries the attributed subagent usage too (docs/events.md#attribution).
    { type: "ai", usage_metadata: { input_tokens: 1100, output_tokens: 200, total_tokens: 1300 } },
    {
      type: "tool",
      additional_kwargs: {
        subagent_token_usage_attributed: true,
        subagent_token_usage: { input_tokens: 100, output_tokens: 100, total_tokens: 200 },
      },
    },
  ];
  const cards = [
    { usage: { inputTokens: 100, outputTokens: 100, totalTokens: 200 }, modelName: "sub" },
    { usage: null, modelName: "sub" },
  ];
  const live = liveRunUsage({ messages, cards, runModel: "lead", models });
  assert.deepEqual([live.tokens, live.lead, live.subagent], [1300, 1100, 200]);
  assert.deepEqual(live.costs, [
    { amount: 0.0012, currency: "USD" },
    { amount: 0.003, currency: "USD" },
  ]);
});
