// The official LangGraph JS SDK (@langchain/langgraph-sdk, pinned in package-lock.json)
// against a real `subflow serve`, used the way DeerFlow's web client uses it: runs
// streamed with messages-tuple + updates + custom and no values, the SDK's own stream
// and message managers (its `ui` module, headless) building the message list, background
// runs followed with joinStream and resumed with Last-Event-ID, and the thread reads.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";

import { Client } from "@langchain/langgraph-sdk";
import { MessageTupleManager, StreamManager } from "@langchain/langgraph-sdk/ui";

import { scriptedModel, startServer } from "../browser/harness.mjs";

const DEERFLOW_MODES = ["messages-tuple", "updates", "custom"];
const PROMPT = "Compare Rust and Go for a CLI";

let server;
let client;

before(async () => {
  server = await startServer({ config: scriptedModel({ delayMs: 20 }) });
  client = new Client({ apiUrl: `${server.base}/api` });
});

after(async () => {
  await server?.stop();
});

/** Every part of an SDK stream, recorded as it passes. */
async function* recording(parts, into) {
  for await (const part of parts) {
    into.push(part);
    yield part;
  }
}

/** A human message with an id of the client's, as the web client sends its input. */
function humanInput(text) {
  return { type: "human", content: text, id: randomUUID() };
}

const ids = (messages) => messages.map((m) => m.id);

test("the SDK's message manager rebuilds the thread state from messages-tuple, updates and custom", async () => {
  const thread = await client.threads.create();
  const human = humanInput(PROMPT);
  const manager = new StreamManager(new MessageTupleManager(), { throttle: false });
  const parts = [];
  const updates = [];
  const custom = [];
  let failure;
  await manager.start(
    async (signal) =>
      recording(
        client.runs.stream(thread.thread_id, "lead_agent", {
          input: { messages: [human] },
          streamMode: DEERFLOW_MODES,
          signal,
        }),
        parts,
      ),
    {
      getMessages: (values) => values.messages ?? [],
      setMessages: (values, messages) => ({ ...values, messages }),
      initialValues: { messages: [human] },
      callbacks: {
        onUpdateEvent: (data) => updates.push(data),
        onCustomEvent: (data) => custom.push(data),
      },
      onSuccess: () => undefined,
      onError: (error) => {
        failure = error;
      },
    },
  );
  assert.equal(failure, undefined);
  assert.equal(parts[0].event, "metadata");
  assert.equal(parts.at(-1).event, "end");
  assert.ok(!parts.some((p) => p.event === "values"), "no values were asked for");

  // The rebuilt list equals the thread state, id by id and type by type.
  const state = await client.threads.getState(thread.thread_id);
  const stateMessages = state.values.messages;
  const rebuilt = manager.values.messages;
  assert.deepEqual(ids(rebuilt), ids(stateMessages));
  assert.deepEqual(
    rebuilt.map((m) => m.type),
    stateMessages.map((m) => m.type),
  );
  assert.equal(stateMessages[0].id, human.id, "the client's id is kept");
  for (const [index, message] of stateMessages.entries()) {
    const live = rebuilt[index];
    if (message.type === "ai") {
      assert.equal(live.content, message.content, "the chunks spell the answer");
      assert.deepEqual(
        live.tool_calls.map((c) => [c.id, c.name, c.args]),
        message.tool_calls.map((c) => [c.id, c.name, c.args]),
      );
    }
  }

  // All three task results, live, with their status contract.
  const tasks = rebuilt.filter((m) => m.type === "tool" && m.name === "task");
  assert.equal(tasks.length, 3);
  for (const task of tasks) {
    assert.equal(task.additional_kwargs.subagent_status, "completed");
    const stored = stateMessages.find((m) => m.id === task.id);
    assert.equal(task.tool_call_id, stored.tool_call_id);
    assert.equal(task.additional_kwargs.subagent_result_sha256, stored.additional_kwargs.subagent_result_sha256);
  }
  // The SDK's subagent tracker saw each task start and finish.
  const subagents = [...manager.getSubagents().values()];
  assert.equal(subagents.length, 3);
  assert.ok(subagents.every((s) => s.status === "complete"), JSON.stringify(subagents.map((s) => s.status)));

  // One update per lead step, and every task event.
  assert.deepEqual(
    updates.map((u) => Object.keys(u)),
    [["model"], ["tools"], ["model"]],
  );
  const kinds = custom.map((e) => e.type);
  assert.equal(kinds.filter((k) => k === "task_started").length, 3);
  assert.equal(kinds.filter((k) => k === "task_completed").length, 3);
});

/** Every part of a joinStream, until `stopAfter` parts (then the connection is cut) or its end. */
async function join(threadId, runId, options, stopAfter = Infinity) {
  const controller = new AbortController();
  const parts = [];
  for await (const part of client.runs.joinStream(threadId, runId, {
    streamMode: DEERFLOW_MODES,
    ...options,
    signal: controller.signal,
  })) {
    parts.push({ event: part.event, data: part.data, id: part.id });
    if (parts.length >= stopAfter) {
      controller.abort();
      break;
    }
  }
  return parts;
}

test("a background run followed with joinStream, cut and resumed with the last id, equals its -1 replay", async () => {
  const thread = await client.threads.create({ metadata: { suite: "sdk" } });
  const run = await client.runs.create(thread.thread_id, "lead_agent", {
    input: { messages: [humanInput("Compare three message brokers")] },
    streamMode: DEERFLOW_MODES,
  });
  assert.equal(run.status, "pending");

  const first = await join(thread.thread_id, run.run_id, {}, 5);
  assert.equal(first.length, 5);
  const live = await client.runs.get(thread.thread_id, run.run_id);
  assert.ok(["pending", "running"].includes(live.status), "the cut came mid-run and cancelled nothing");
  const rest = await join(thread.thread_id, run.run_id, { lastEventId: first.at(-1).id });
  assert.equal(rest.at(-1).event, "end");

  const replay = await join(thread.thread_id, run.run_id, { lastEventId: "-1" });
  const resumed = [...first, ...rest];
  assert.deepEqual(resumed, replay, "every frame once, in order");
  assert.deepEqual(
    replay.map((p) => Number(p.id)),
    replay.map((_, index) => index + 1),
  );
  assert.ok(replay.some((p) => p.event === "updates") && replay.some((p) => p.event === "custom"));

  // The run's end and the thread, read back through the SDK.
  const joined = await client.runs.join(thread.thread_id, run.run_id);
  const state = await client.threads.getState(thread.thread_id);
  assert.deepEqual(ids(joined.messages), ids(state.values.messages));
  assert.equal(state.values.messages.filter((m) => m.name === "task").length, 3);
  const runs = await client.runs.list(thread.thread_id);
  assert.deepEqual(
    runs.map((r) => [r.run_id, r.status]),
    [[run.run_id, "success"]],
  );
  const found = await client.threads.search({ metadata: { suite: "sdk" }, limit: 10 });
  assert.deepEqual(
    found.map((t) => t.thread_id),
    [thread.thread_id],
  );
});

test("the SDK reads the server's info, the assistant and its graph and schemas", async () => {
  const assistant = await client.assistants.get("lead_agent");
  assert.equal(assistant.graph_id, "lead_agent");
  const graph = await client.assistants.getGraph("lead_agent");
  assert.deepEqual(
    graph.nodes.map((n) => n.id),
    ["__start__", "model", "tools", "__end__"],
  );
  const schemas = await client.assistants.getSchemas("lead_agent");
  assert.equal(schemas.graph_id, "lead_agent");
  assert.deepEqual(schemas.state_schema.required, ["messages"]);
  const info = await (await fetch(`${server.base}/api/info`)).json();
  assert.equal(info.flags.assistants, true);
  assert.equal(info.flags.resumable_streams, true);
});

/** The bytes of the demo run's event stream with `modes`, read raw. */
async function streamBytes(modes) {
  const response = await fetch(`${server.base}/api/threads/${randomUUID()}/runs/stream`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ input: { messages: [{ role: "user", content: PROMPT }] }, stream_mode: modes }),
  });
  assert.equal(response.status, 200);
  const text = await response.text();
  assert.ok(text.includes("event: end"));
  return Buffer.byteLength(text);
}

test("measures the demo run's SSE bytes without values against with values", async (t) => {
  const deerflow = await streamBytes(DEERFLOW_MODES);
  const withValues = await streamBytes(["values", "messages-tuple", "custom"]);
  t.diagnostic(
    `demo run SSE bytes: ${JSON.stringify(DEERFLOW_MODES)} ${deerflow}, ` +
      `["values","messages-tuple","custom"] ${withValues}, ratio ${(deerflow / withValues).toFixed(3)}`,
  );
});

// What the reference's web app does with the SDK beyond streaming: the run and thread ids
// of a new stream from Content-Location (onRunCreated), the rejoin after a reload, the
// sidebar's sorted and selected search, renames, and Stop.

test("onRunCreated gets the ids from Content-Location, and a reload rejoins the run with them", async () => {
  const thread = await client.threads.create();
  let created;
  const controller = new AbortController();
  const first = [];
  for await (const part of client.runs.stream(thread.thread_id, "lead_agent", {
    input: { messages: [humanInput(PROMPT)] },
    streamMode: DEERFLOW_MODES,
    onDisconnect: "continue",
    onRunCreated: (meta) => {
      created = meta;
    },
    signal: controller.signal,
  })) {
    first.push(part);
    if (first.length >= 4) {
      controller.abort();
      break;
    }
  }
  assert.equal(created?.thread_id, thread.thread_id);
  const runs = await client.runs.list(thread.thread_id);
  assert.deepEqual(
    runs.map((r) => r.run_id),
    [created.run_id],
  );
  // The reload: the stored run id, joined from the start.
  const replay = await join(thread.thread_id, created.run_id, { lastEventId: "-1" });
  assert.equal(replay.at(-1).event, "end");
  assert.deepEqual(
    replay.slice(0, first.length).map((p) => [p.event, p.data]),
    first.map((p) => [p.event, p.data]),
  );
  const ended = await client.runs.get(thread.thread_id, created.run_id);
  assert.equal(ended.status, "success");
});

test("threads.search sorts and selects, and threads.update and updateState rename a thread", async () => {
  const suite = randomUUID();
  const made = [];
  for (const name of ["b", "c", "a"]) {
    made.push(await client.threads.create({ metadata: { suite, name } }));
  }
  const names = (found) => found.map((t) => t.metadata.name);
  const oldestFirst = await client.threads.search({
    metadata: { suite },
    sortBy: "created_at",
    sortOrder: "asc",
    select: ["thread_id", "metadata"],
  });
  assert.deepEqual(names(oldestFirst), ["b", "c", "a"]);
  assert.deepEqual(Object.keys(oldestFirst[0]).sort(), ["metadata", "thread_id"]);

  // PATCH merges metadata and makes the thread the most recently updated.
  const updated = await client.threads.update(made[0].thread_id, { metadata: { agent_name: "writer" } });
  assert.deepEqual(updated.metadata, { suite, name: "b", agent_name: "writer" });
  const recent = await client.threads.search({
    metadata: { suite },
    sortBy: "updated_at",
    sortOrder: "desc",
    select: ["thread_id", "updated_at", "values", "metadata"],
  });
  assert.deepEqual(names(recent), ["b", "a", "c"]);

  // A rename is a state update; the title shows in the state and in search.
  await client.threads.updateState(made[1].thread_id, { values: { title: "Renamed chat" } });
  const state = await client.threads.getState(made[1].thread_id);
  assert.equal(state.values.title, "Renamed chat");
  const titled = await client.threads.search({
    metadata: { suite },
    values: { title: "Renamed chat" },
    select: ["thread_id", "values"],
  });
  assert.deepEqual(
    titled.map((t) => [t.thread_id, t.values.title]),
    [[made[1].thread_id, "Renamed chat"]],
  );
});

test("runs.cancel with wait false and the interrupt action, or wait true, ends the run interrupted", async () => {
  for (const wait of [false, true]) {
    const thread = await client.threads.create();
    const run = await client.runs.create(thread.thread_id, "lead_agent", {
      input: { messages: [humanInput("Compare three message brokers")] },
    });
    await client.runs.cancel(thread.thread_id, run.run_id, wait, "interrupt");
    if (!wait) {
      await client.runs.join(thread.thread_id, run.run_id);
    }
    const ended = await client.runs.get(thread.thread_id, run.run_id);
    assert.equal(ended.status, "interrupted", `wait=${wait}`);
  }
});
