// The subflow workspace: threads, messages with task cards, live runs, usage and cost.
// It uses only the public API. Card rules live in cards.mjs; this module owns state,
// the network and the DOM.

import { ApiError, apiFetch, apiJson, onTokenNeeded, paths } from "./api.mjs";
import {
  backfillNext,
  backfillPath,
  backfillSteps,
  cardView,
  flattenContent,
  groupHeader,
  mergeCard,
  messageCardUpdates,
  newCard,
  shouldBackfill,
  taskEventUpdate,
} from "./cards.mjs";
import { BatchPanel } from "./batchpanel.mjs";
import { CardElement } from "./cardui.mjs";
import { append, h, setText } from "./dom.mjs";
import { threadItems, threadTitle, usageParts } from "./panels.mjs";
import { readFrames } from "./sse.mjs";

const STREAM_MODES = ["values", "messages-tuple", "custom"];
/** Consecutive `gap` recoveries before giving up (SPEC §14.1). */
const MAX_GAPS = 5;
/** Consecutive failed reconnects before giving up. */
const MAX_RECONNECTS = 5;
/** How long a stopped run may take to end its stream before the page stops waiting. */
const STOP_GRACE_MS = 15000;

const $ = (id) => document.getElementById(id);
const els = {
  sidebar: $("sidebar"),
  threadsToggle: $("threads-toggle"),
  newThread: $("new-thread"),
  search: $("thread-search"),
  threadList: $("thread-list"),
  threadListNote: $("thread-list-note"),
  title: $("thread-title"),
  messages: $("messages"),
  composer: $("composer"),
  input: $("composer-input"),
  send: $("send"),
  stop: $("stop"),
  usage: $("usage"),
  batches: $("batches"),
  announcer: $("announcer"),
  connection: $("connection"),
  tokenDialog: $("token-dialog"),
  tokenForm: $("token-form"),
  tokenInput: $("token-input"),
  tokenMessage: $("token-message"),
};

const state = {
  models: [],
  tokenUsageEnabled: false,
  threads: [],
  threadId: null,
  /** Bumped on every thread switch, so late answers for another thread are dropped. */
  generation: 0,
  messages: [],
  /** The AI message being streamed: `{id, text}`. */
  streaming: null,
  /** ToolMessages streamed before a `values` frame included them, by tool_call_id. */
  streamedTools: new Map(),
  cards: new Map(),
  cardElements: new Map(),
  cardTurn: new Map(),
  cardRun: new Map(),
  turnRun: new Map(),
  turns: 0,
  expanded: new Set(),
  backfill: new Map(),
  /** Cards whose terminal transition is shown after the current render. */
  afterRender: new Set(),
  /** The run this page follows: `{threadId, runId, lastEventId, controller, stopping}`. */
  run: null,
  runError: null,
  runNote: null,
  runsCache: null,
};

// ---------------------------------------------------------------------------- utilities

function announce(text) {
  els.announcer.textContent = "";
  // A fresh node after a tick makes screen readers read repeated messages too.
  setTimeout(() => {
    els.announcer.textContent = text;
  }, 50);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function showError(error) {
  state.runError = error instanceof Error ? error.message : String(error);
  renderMessages();
}

// ---------------------------------------------------------------------------- token prompt

onTokenNeeded(
  (rejected) =>
    new Promise((resolve) => {
      setText(
        els.tokenMessage,
        rejected
          ? "The gateway refused that token. Enter another one."
          : "This gateway needs an access token (subflow tokens create).",
      );
      els.tokenInput.value = "";
      const done = () => {
        els.tokenDialog.removeEventListener("close", done);
        resolve(els.tokenDialog.returnValue === "save" ? els.tokenInput.value : null);
      };
      els.tokenDialog.addEventListener("close", done);
      els.tokenDialog.showModal();
      els.tokenInput.focus();
    }),
);

// ---------------------------------------------------------------------------- cards

function turnLoading(id) {
  return state.run !== null && state.run.threadId === state.threadId && state.cardTurn.get(id) === state.turns;
}

function cardElement(id) {
  let element = state.cardElements.get(id);
  if (element === undefined) {
    element = new CardElement(id, toggleCard);
    state.cardElements.set(id, element);
  }
  return element;
}

function renderCard(id) {
  const card = state.cards.get(id);
  if (card === undefined) return;
  const view = cardView(card, {
    turnLoading: turnLoading(id),
    tokenUsageEnabled: state.tokenUsageEnabled,
    models: state.models,
  });
  cardElement(id).update(view, card.prompt, state.expanded.has(id), state.backfill.get(id) ?? "idle");
}

function renderAllCards() {
  for (const id of state.cards.keys()) renderCard(id);
}

/** Merges an update into a card and publishes it as the merge says. */
function updateCard(id, update) {
  const merged = mergeCard(state.cards.get(id) ?? newCard(id), update);
  state.cards.set(id, merged.card);
  if (merged.publish === "now") renderCard(id);
  else if (merged.publish === "after_render") state.afterRender.add(id);
}

/** Shows terminal transitions collected during a render, once it is on screen. */
function publishAfterRender() {
  const ids = [...state.afterRender];
  state.afterRender.clear();
  for (const id of ids) {
    renderCard(id);
    const card = state.cards.get(id);
    const word = card.status === "completed" ? "Subtask completed" : "Subtask failed";
    announce(`${word}: ${card.description ?? id}`);
  }
}

function allMessages() {
  const messages = [...state.messages];
  const present = new Set(messages.filter((m) => m?.type === "tool").map((m) => m.tool_call_id));
  for (const [callId, message] of state.streamedTools) if (!present.has(callId)) messages.push(message);
  return messages;
}

/** Opens and answers cards from the thread's messages (calls and ToolMessages). */
function syncCards() {
  const { turns, updates } = messageCardUpdates(allMessages());
  state.turns = turns;
  for (const { id, turn, update } of updates) {
    state.cardTurn.set(id, turn);
    if (state.run?.runId && turn === turns && state.run.threadId === state.threadId) {
      state.cardRun.set(id, state.run.runId);
      state.turnRun.set(turn, state.run.runId);
    }
    updateCard(id, update);
  }
}

async function toggleCard(id, expanded) {
  if (expanded) state.expanded.add(id);
  else state.expanded.delete(id);
  renderCard(id);
  if (expanded) await backfillCard(id);
}

/** The run a task ran in: known live, else found by its `subagent.start` event. */
async function runOfTask(id) {
  const known = state.cardRun.get(id) ?? state.turnRun.get(state.cardTurn.get(id));
  if (known !== undefined) return known;
  const threadId = state.threadId;
  state.runsCache ??= apiJson(paths.runs(threadId, "?limit=100")).catch((error) => {
    state.runsCache = null;
    throw error;
  });
  const runs = await state.runsCache;
  for (const run of runs) {
    const query = `event_types=subagent.start&task_id=${encodeURIComponent(id)}&limit=1`;
    const found = await apiJson(paths.events(threadId, run.run_id, query));
    if (Array.isArray(found) && found.length > 0) {
      state.cardRun.set(id, run.run_id);
      state.turnRun.set(state.cardTurn.get(id), run.run_id);
      return run.run_id;
    }
  }
  return null;
}

/** Every step of a task from `/events`, paged by `after_seq`; throws on a non-2xx page. */
async function fetchSteps(threadId, runId, id) {
  let steps = [];
  let afterSeq = null;
  for (let pages = 1; ; pages += 1) {
    const records = await apiJson(backfillPath(threadId, runId, id, afterSeq));
    steps = steps.concat(backfillSteps(records, id));
    const next = backfillNext(records, pages);
    if (next.done) return steps;
    afterSeq = next.afterSeq;
  }
}

/** Fills an expanded card's steps from the backfill (SPEC §14.1); a failure retries on the next expand. */
async function backfillCard(id) {
  if (state.backfill.get(id) === "loading") return;
  const generation = state.generation;
  const threadId = state.threadId;
  try {
    const runId = await runOfTask(id);
    const card = state.cards.get(id);
    if (generation !== state.generation || card === undefined) return;
    if (!shouldBackfill(card, { expanded: state.expanded.has(id), threadId, runId })) return;
    state.backfill.set(id, "loading");
    renderCard(id);
    const steps = await fetchSteps(threadId, runId, id);
    if (generation !== state.generation) return;
    state.backfill.set(id, "idle");
    updateCard(id, { steps });
    renderCard(id);
  } catch (error) {
    if (generation !== state.generation) return;
    state.backfill.set(id, "failed");
    renderCard(id);
    if (!(error instanceof ApiError)) console.warn("backfill failed", error);
  }
}

// ---------------------------------------------------------------------------- messages

function messageText(message) {
  return flattenContent(message?.content);
}

function renderCardGroup(calls) {
  const group = h("div", { class: "card-group" }, h("p", { class: "card-group-header" }, groupHeader(calls.length)));
  for (const call of calls) {
    const element = cardElement(call.id);
    if (!state.cards.has(call.id)) state.cards.set(call.id, newCard(call.id));
    renderCard(call.id);
    group.append(element.root);
  }
  return group;
}

function renderMessage(message, taskIds) {
  if (message.type === "human") {
    return h("div", { class: "message message-human" }, messageText(message));
  }
  if (message.type === "ai") {
    const parts = [];
    const text = messageText(message);
    if (text.trim() !== "") parts.push(h("div", { class: "message message-ai" }, text));
    const calls = (Array.isArray(message.tool_calls) ? message.tool_calls : []).filter(
      (call) => call?.name === "task" && typeof call.id === "string" && call.id.trim() !== "",
    );
    if (calls.length > 0) parts.push(renderCardGroup(calls));
    if (message.additional_kwargs?.deerflow_error_fallback === true) {
      parts.push(h("p", { class: "message message-error", role: "alert" }, message.additional_kwargs.error_detail ?? "The model failed."));
    }
    return parts;
  }
  if (message.type === "tool") {
    if (taskIds.has(message.tool_call_id)) return null;
    return h(
      "details",
      { class: "tool-result" },
      h("summary", {}, `Tool result · ${message.name ?? "tool"}${message.status === "error" ? " (error)" : ""}`),
      h("pre", {}, messageText(message)),
    );
  }
  return null;
}

function renderMessages() {
  const container = els.messages;
  const atBottom = container.scrollHeight - container.scrollTop - container.clientHeight < 80;
  const messages = allMessages();
  const taskIds = new Set(
    messages.flatMap((m) => (m?.type === "ai" && Array.isArray(m.tool_calls) ? m.tool_calls : []))
      .filter((c) => c?.name === "task")
      .map((c) => c.id),
  );
  const nodes = [];
  for (const message of messages) {
    if (message === null || typeof message !== "object") continue;
    const rendered = renderMessage(message, taskIds);
    if (rendered !== null) nodes.push(rendered);
  }
  const streaming = state.streaming;
  if (streaming !== null && !messages.some((m) => m?.id === streaming.id)) {
    state.streamingNode = h("div", { class: "message message-ai streaming", "aria-busy": "true" }, streaming.text);
    nodes.push(state.streamingNode);
  } else {
    state.streamingNode = null;
  }
  if (state.run !== null && state.run.threadId === state.threadId && state.streamingNode === null) {
    nodes.push(
      h(
        "p",
        { class: "thinking" },
        h("span", { class: "spinner", "aria-hidden": "true" }),
        state.run.stopping ? "Stopping…" : "Working…",
      ),
    );
  }
  if (state.runNote !== null) nodes.push(h("p", { class: "message message-note" }, state.runNote));
  if (state.runError !== null) nodes.push(h("p", { class: "message message-error", role: "alert" }, state.runError));
  if (messages.length === 0 && state.run === null) {
    nodes.push(h("p", { class: "message message-note" }, "Send a message to start. Any prompt runs the demo plan."));
  }
  // Cards are kept and moved, so a focused card button gets its focus back.
  const focused = container.contains(document.activeElement) ? document.activeElement : null;
  container.replaceChildren();
  append(container, nodes);
  if (focused !== null && focused.isConnected) focused.focus({ preventScroll: true });
  if (atBottom) container.scrollTop = container.scrollHeight;
  publishAfterRender();
}

function renderControls() {
  const running = state.run !== null && state.run.threadId === state.threadId;
  els.stop.hidden = !running;
  els.stop.disabled = running && state.run.stopping;
  els.send.disabled = running;
}

// ---------------------------------------------------------------------------- live runs

function applyValues(values) {
  if (!Array.isArray(values?.messages)) return;
  state.messages = values.messages;
  if (state.streaming !== null && state.messages.some((m) => m?.id === state.streaming.id)) state.streaming = null;
  const present = new Set(state.messages.filter((m) => m?.type === "tool").map((m) => m.tool_call_id));
  for (const callId of [...state.streamedTools.keys()]) if (present.has(callId)) state.streamedTools.delete(callId);
  syncCards();
  renderMessages();
}

function applyMessageFrame(data) {
  const chunk = Array.isArray(data) ? data[0] : null;
  if (chunk === null || typeof chunk !== "object") return;
  if (chunk.type === "AIMessageChunk" || chunk.type === "ai") {
    if (state.messages.some((m) => m?.id === chunk.id && chunk.id != null)) return;
    if (state.streaming === null || state.streaming.id !== chunk.id) state.streaming = { id: chunk.id, text: "" };
    state.streaming.text += flattenContent(chunk.content);
    if (state.streamingNode) setText(state.streamingNode, state.streaming.text);
    else renderMessages();
  } else if (chunk.type === "tool" && typeof chunk.tool_call_id === "string") {
    state.streamedTools.set(chunk.tool_call_id, chunk);
    syncCards();
    renderMessages();
  }
}

function applyTaskEvent(event) {
  const update = taskEventUpdate(event);
  const id = event?.task_id;
  if (update === null || typeof id !== "string") return;
  if (!state.cardTurn.has(id)) state.cardTurn.set(id, state.turns);
  if (state.run?.runId) state.cardRun.set(id, state.run.runId);
  updateCard(id, update);
  publishAfterRender();
}

/** Reads one response of the run's stream: "end", "gap" or "closed". */
async function consume(run, response) {
  let outcome = "closed";
  await readFrames(response, ({ event, data, id }) => {
    if (run !== state.run) return;
    if (id !== null) run.lastEventId = id;
    if (event !== "gap") run.gaps = 0;
    if (event === "metadata") {
      run.runId = data?.run_id ?? run.runId;
      if (run.stopRequested) stopRun();
    } else if (event === "values") applyValues(data);
    else if (event === "messages") applyMessageFrame(data);
    else if (event === "custom") applyTaskEvent(data);
    else if (event === "error") state.runError = data?.message || "The run failed.";
    else if (event === "end") outcome = "end";
    else if (event === "gap") {
      outcome = "gap";
      run.gap = data;
    }
  });
  return outcome;
}

/** SPEC §14.1 gap recovery: live task state is cleared, the state reloaded and backfilled. */
async function recoverFromGap(run) {
  for (const [id, turn] of state.cardTurn) {
    if (turn === state.turns) {
      state.cards.set(id, newCard(id));
      state.backfill.delete(id);
    }
  }
  state.streaming = null;
  state.streamedTools.clear();
  const threadState = await apiJson(paths.state(run.threadId));
  applyValues(threadState?.values ?? { messages: [] });
  const ids = [...state.cardTurn].filter(([, turn]) => turn === state.turns).map(([id]) => id);
  await Promise.all(
    ids.map(async (id) => {
      const steps = await fetchSteps(run.threadId, run.runId, id);
      updateCard(id, { steps });
      renderCard(id);
    }),
  );
}

function rejoin(run) {
  const headers = run.lastEventId === null ? {} : { "Last-Event-ID": run.lastEventId };
  return apiFetch(paths.rejoin(run.threadId, run.runId, STREAM_MODES), { headers, signal: run.controller.signal });
}

/** Follows a run's stream to its end, reconnecting with Last-Event-ID and recovering from gaps. */
async function follow(run, firstResponse) {
  let response = firstResponse;
  let failures = 0;
  for (;;) {
    let outcome;
    if (response.ok) {
      try {
        outcome = await consume(run, response);
      } catch (error) {
        if (run.controller.signal.aborted) return "detached";
        outcome = "broken";
      }
    } else if (response.status === 404 || response.status === 405) {
      return "unavailable";
    } else {
      outcome = "broken";
    }
    if (run.controller.signal.aborted) return "detached";
    if (outcome === "end") return "ended";
    if (run.runId === null) throw new Error("The run's stream closed before it began.");
    if (outcome === "gap") {
      run.gaps = (run.gaps ?? 0) + 1;
      if (run.gaps > MAX_GAPS) throw new Error("The run's stream keeps losing frames; reload the page.");
      await recoverFromGap(run);
      run.lastEventId = String(run.gap?.latest_available_event_id ?? run.lastEventId);
      failures = 0;
    } else {
      failures += 1;
      if (failures > MAX_RECONNECTS) throw new Error("Lost the connection to the run.");
      setText(els.connection, "Reconnecting…");
      await sleep(Math.min(250 * 2 ** failures, 4000));
    }
    try {
      response = await rejoin(run);
      setText(els.connection, "");
    } catch (error) {
      if (run.controller.signal.aborted) return "detached";
      response = { ok: false, status: 0 };
    }
  }
}

/** Without a rejoin route the page waits for the run's record to leave running. */
async function waitForRun(run) {
  for (;;) {
    if (run.controller.signal.aborted) return;
    const record = await apiJson(paths.run(run.threadId, run.runId));
    if (record.status !== "running" && record.status !== "pending") return;
    await sleep(1000);
  }
}

async function finishRun(run, how) {
  if (state.run !== run) return;
  clearTimeout(run.stopTimer);
  state.run = null;
  if (how === "detached") return;
  state.streaming = null;
  const generation = state.generation;
  try {
    const threadState = await apiJson(paths.state(run.threadId));
    if (generation === state.generation) {
      state.streamedTools.clear();
      applyValues(threadState?.values ?? { messages: [] });
    }
  } catch (error) {
    if (generation === state.generation) state.runError ??= error.message;
  }
  if (generation !== state.generation) return;
  if (run.stopping) state.runNote = "The run was stopped.";
  renderAllCards();
  renderMessages();
  renderControls();
  announce(run.stopping ? "Run stopped" : state.runError ? "Run failed" : "Run finished");
  refreshUsage();
  refreshThreads();
  // A run may have submitted a batch (`batch_task`).
  batchPanel.refresh({ features: true });
}

/** Follows `run` from `response` (a started stream or a rejoin), then settles the page. */
async function drive(run, response) {
  let how = "ended";
  try {
    how = await follow(run, response);
    if (how === "unavailable") {
      await waitForRun(run);
      how = run.controller.signal.aborted ? "detached" : "ended";
    }
  } catch (error) {
    if (run.controller.signal.aborted) how = "detached";
    else state.runError = error.message;
  }
  await finishRun(run, how);
}

function beginRun(threadId, runId) {
  const run = { threadId, runId, lastEventId: null, controller: new AbortController(), stopping: false, gaps: 0 };
  state.run = run;
  state.runError = null;
  state.runNote = null;
  renderControls();
  return run;
}

async function sendPrompt(text) {
  if (state.run !== null || text.trim() === "") return;
  let threadId = state.threadId;
  if (threadId === null) {
    threadId = crypto.randomUUID();
    try {
      await apiJson(paths.threads(), { method: "POST", body: { thread_id: threadId, metadata: {} } });
    } catch (error) {
      showError(error);
      return;
    }
    await openThread(threadId, { push: true, fresh: true });
    refreshThreads();
  }
  els.input.value = "";
  state.messages = [...state.messages, { type: "human", content: text, id: null }];
  if (state.messages.length === 1) setText(els.title, threadTitle({ thread_id: threadId, values: { messages: state.messages } }));
  state.turns += 1;
  const run = beginRun(threadId, null);
  renderMessages();
  announce("Run started");
  let response;
  try {
    response = await apiFetch(paths.stream(threadId), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        input: { messages: [{ role: "user", content: text }] },
        stream_mode: STREAM_MODES,
        on_disconnect: "continue",
      }),
      signal: run.controller.signal,
    });
  } catch (error) {
    state.runError = error.message;
    await finishRun(run, "failed");
    return;
  }
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    state.runError = body?.detail || `The run could not start (HTTP ${response.status}).`;
    await finishRun(run, "failed");
    return;
  }
  await drive(run, response);
}

async function stopRun() {
  const run = state.run;
  if (run === null) return;
  run.stopping = true;
  renderControls();
  renderMessages();
  if (run.runId === null) {
    run.stopRequested = true;
    return;
  }
  // The stream ends by itself once the run has stopped; if it does not, stop waiting.
  run.stopTimer = setTimeout(() => run.controller.abort(), STOP_GRACE_MS);
  try {
    await apiJson(paths.cancel(run.threadId, run.runId), { method: "POST" });
    announce("Stopping the run");
  } catch (error) {
    state.runError = error.message;
    renderMessages();
  }
}

// ---------------------------------------------------------------------------- threads

function renderThreads() {
  const items = threadItems(state.threads, {
    filter: els.search.value,
    current: state.threadId,
    onOpen: (threadId) => {
      closeSidebar();
      openThread(threadId, { push: true });
    },
  });
  els.threadList.replaceChildren(...items);
  els.threadListNote.hidden = items.length > 0;
  setText(els.threadListNote, state.threads.length === 0 ? "No threads yet." : "No thread matches.");
}

async function refreshThreads() {
  try {
    const threads = await apiJson(paths.searchThreads(), { method: "POST", body: { limit: 100 } });
    state.threads = Array.isArray(threads) ? threads : [];
    renderThreads();
  } catch (error) {
    setText(els.threadListNote, `Threads could not be loaded: ${error.message}`);
    els.threadListNote.hidden = false;
  }
}

async function refreshUsage() {
  const threadId = state.threadId;
  if (threadId === null) {
    els.usage.replaceChildren();
    return;
  }
  try {
    const [usage, runs] = await Promise.all([
      apiJson(paths.tokenUsage(threadId)),
      apiJson(paths.runs(threadId, "?limit=1")),
    ]);
    if (threadId !== state.threadId) return;
    els.usage.replaceChildren(...usageParts(usage, Array.isArray(runs) ? runs[0] : undefined));
  } catch (error) {
    els.usage.replaceChildren(h("span", {}, `Usage unavailable: ${error.message}`));
  }
}

// Durable batches of the open thread (SPEC §14.2); their progress moves the footer's spend.
const batchPanel = new BatchPanel(els.batches, { onChange: () => refreshUsage() });

function resetThreadState() {
  state.generation += 1;
  if (state.run !== null) state.run.controller.abort();
  state.run = null;
  state.messages = [];
  state.streaming = null;
  state.streamedTools.clear();
  state.cards.clear();
  state.cardElements.clear();
  state.cardTurn.clear();
  state.cardRun.clear();
  state.turnRun.clear();
  state.expanded.clear();
  state.backfill.clear();
  state.afterRender.clear();
  state.turns = 0;
  state.runError = null;
  state.runNote = null;
  state.runsCache = null;
}

function threadPath(threadId) {
  return threadId === null ? "/" : `/threads/${encodeURIComponent(threadId)}`;
}

/** Follows a run that was already active when the thread opened, replaying its stream. */
async function rejoinActive(run) {
  let response;
  try {
    response = await rejoin(run);
  } catch (error) {
    if (run.controller.signal.aborted) return;
    response = { ok: false, status: 0 };
  }
  await drive(run, response);
}

/** Shows a thread: its messages and cards, and follows its active run in the background. */
async function openThread(threadId, { push = false, fresh = false } = {}) {
  resetThreadState();
  state.threadId = threadId;
  if (push && location.pathname !== threadPath(threadId)) history.pushState({}, "", threadPath(threadId));
  renderThreads();
  renderControls();
  setText(els.title, threadId === null ? "New thread" : "Loading…");
  renderMessages();
  batchPanel.setThread(threadId);
  if (threadId === null) {
    els.usage.replaceChildren();
    return;
  }
  const generation = state.generation;
  if (fresh) {
    setText(els.title, "New thread");
    return;
  }
  try {
    const [thread, threadState, active] = await Promise.all([
      apiJson(paths.thread(threadId)),
      apiJson(paths.state(threadId)),
      apiJson(paths.runs(threadId, "?limit=5")),
    ]);
    if (generation !== state.generation) return;
    setText(els.title, threadTitle(thread));
    const running = (Array.isArray(active) ? active : []).find((r) => r.status === "running" || r.status === "pending");
    if (running !== undefined) beginRun(threadId, running.run_id);
    applyValues(threadState?.values ?? { messages: [] });
    renderAllCards();
    renderControls();
    refreshUsage();
    if (running !== undefined) rejoinActive(state.run);
  } catch (error) {
    if (generation !== state.generation) return;
    setText(els.title, error instanceof ApiError && error.status === 404 ? "Thread not found" : "The thread could not be loaded");
    showError(error);
  }
}

function threadFromPath() {
  const match = /^\/threads\/([^/]+)\/?$/.exec(location.pathname);
  return match ? decodeURIComponent(match[1]) : null;
}

function closeSidebar() {
  els.sidebar.classList.remove("open");
  els.threadsToggle.setAttribute("aria-expanded", "false");
}

// ---------------------------------------------------------------------------- wiring

els.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  sendPrompt(els.input.value);
});
els.input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    sendPrompt(els.input.value);
  }
});
els.stop.addEventListener("click", () => stopRun());
els.newThread.addEventListener("click", () => {
  closeSidebar();
  openThread(null, { push: true });
  els.input.focus();
});
els.search.addEventListener("input", renderThreads);
els.threadsToggle.addEventListener("click", () => {
  const open = !els.sidebar.classList.contains("open");
  els.sidebar.classList.toggle("open", open);
  els.threadsToggle.setAttribute("aria-expanded", String(open));
  if (open) els.search.focus();
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && els.sidebar.classList.contains("open")) {
    closeSidebar();
    els.threadsToggle.focus();
  }
});
window.addEventListener("popstate", () => openThread(threadFromPath()));

async function start() {
  try {
    const models = await apiJson(paths.models());
    state.models = Array.isArray(models?.models) ? models.models : [];
    state.tokenUsageEnabled = models?.token_usage?.enabled === true;
  } catch (error) {
    setText(els.connection, `Models unavailable: ${error.message}`);
  }
  document.documentElement.dataset.tokenUsage = String(state.tokenUsageEnabled);
  await Promise.all([refreshThreads(), openThread(threadFromPath())]);
  document.documentElement.dataset.ready = "true";
}

start();
