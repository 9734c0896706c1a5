// The subflow workspace: threads, messages with task cards, live runs, usage and cost.
// It uses only the public API. Card rules live in cards.mjs, the cards' state in
// board.mjs, the run view in runview.mjs; this module owns the messages, live runs,
// threads and the wiring.

import { ApiError, apiFetch, apiJson, onTokenAccepted, onTokenNeeded, paths } from "./api.mjs";
import {
  allMessages,
  fetchSteps,
  loadAllSummaries,
  loadSummaries,
  publishAfterRender,
  renderAllCards,
  renderCard,
  renderCardGroup,
  syncCards,
  updateCard,
} from "./board.mjs";
import { flattenContent, modelLabel, newCard, taskEventUpdate } from "./cards.mjs";
import { ActivityView } from "./activity.mjs";
import { UsagePage } from "./usagepage.mjs";
import { BatchPanel } from "./batchpanel.mjs";
import { append, h, setText } from "./dom.mjs";
import { liveRunUsage, threadItems, threadTitle, usageParts } from "./panels.mjs";
import { closeRunView, renderRunView, toggleRunView } from "./runview.mjs";
import { readFrames } from "./sse.mjs";
import { announce, els, sleep, state } from "./state.mjs";

const STREAM_MODES = ["values", "messages-tuple", "custom"];
/** Consecutive `gap` recoveries before giving up (docs/workspace.md#task-card). */
const MAX_GAPS = 5;
/** Consecutive failed reconnects before giving up. */
const MAX_RECONNECTS = 5;
/** How long a stopped run may take to end its stream before the page stops waiting. */
const STOP_GRACE_MS = 15000;

/** Messages closer than this to the bottom count as read to the end. */
const BOTTOM_SLACK_PX = 80;

/** New messages, and cards that grow, come into view unless the reader scrolled up. */
function followBottom() {
  if (state.stickToBottom) els.messages.scrollTop = els.messages.scrollHeight;
}

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
      els.tokenDialog.returnValue = "";
      els.tokenDialog.showModal();
      els.tokenInput.focus();
    }),
);

// ---------------------------------------------------------------------------- messages

function messageText(message) {
  return flattenContent(message?.content);
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
    nodes.push(h("p", { class: "message message-note" }, `Send a message to start. ${modelSentence()}`));
  }
  // Cards are kept and moved, so a focused card button gets its focus back.
  const focused = container.contains(document.activeElement) ? document.activeElement : null;
  container.replaceChildren();
  append(container, nodes);
  if (focused !== null && focused.isConnected) focused.focus({ preventScroll: true });
  followBottom();
  publishAfterRender();
  renderUsage();
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
  renderUsage();
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

/** docs/workspace.md#task-card gap recovery: live task state is cleared, the state reloaded and backfilled. */
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
  // The ended run's summaries hold its tasks' final usage, stopped ones included.
  if (run.runId !== null) await loadSummaries(run.threadId, run.runId).catch(() => {});
  if (generation !== state.generation) return;
  state.runs = await apiJson(paths.runs(run.threadId, "?limit=100")).catch(() => null);
  if (generation !== state.generation) return;
  renderAllCards();
  renderMessages();
  renderControls();
  announce(run.stopping ? "Run stopped" : state.runError ? "Run failed" : "Run finished");
  refreshUsage();
  refreshThreads();
  renderRunView();
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

function beginRun(threadId, runId, modelName = defaultModelName()) {
  const run = { threadId, runId, modelName, lastEventId: null, controller: new AbortController(), stopping: false, gaps: 0 };
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
  const run = beginRun(threadId, null, pickedModelName());
  state.stickToBottom = true;
  renderMessages();
  announce("Run started");
  refreshUsage();
  const body = {
    input: { messages: [{ role: "user", content: text }] },
    stream_mode: STREAM_MODES,
    on_disconnect: "continue",
  };
  // The model picker names the run's model (docs/api.md#run-request `config.configurable.model_name`).
  if (state.models.length > 1) body.config = { configurable: { model_name: run.modelName } };
  let response;
  try {
    response = await apiFetch(paths.stream(threadId), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
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

/** How long the search box waits for more typing before it asks the server. */
const SEARCH_DELAY_MS = 200;
let searchTimer = null;

/**
 * The search box: the loaded threads are filtered by title and id at once; then the
 * server searches every thread's title and message text (`query`) and its answer is shown.
 */
function searchInput() {
  state.searchResults = null;
  renderThreads();
  clearTimeout(searchTimer);
  searchTimer = setTimeout(searchThreads, SEARCH_DELAY_MS);
}

async function searchThreads() {
  const query = els.search.value.trim();
  const generation = ++state.searchGeneration;
  if (query === "") return;
  try {
    const threads = await apiJson(paths.searchThreads(), { method: "POST", body: { query, limit: 100 } });
    if (generation !== state.searchGeneration || !Array.isArray(threads)) return;
    state.searchResults = threads;
    renderThreads();
  } catch (error) {
    if (generation !== state.searchGeneration) return;
    setText(els.threadListNote, `The search failed: ${error.message}`);
    els.threadListNote.hidden = false;
  }
}

function renderThreads() {
  const searched = state.searchResults !== null && els.search.value.trim() !== "";
  const items = threadItems(searched ? state.searchResults : state.threads, {
    filter: searched ? "" : els.search.value,
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

/** Fetches the thread's settled usage (counted and stopped runs) and shows the footer. */
async function refreshUsage() {
  const threadId = state.threadId;
  if (threadId === null) {
    state.usage = null;
    els.usage.replaceChildren();
    return;
  }
  try {
    const [usage, runs] = await Promise.all([
      apiJson(paths.tokenUsage(threadId)),
      apiJson(paths.runs(threadId, "?limit=1")),
    ]);
    if (threadId !== state.threadId) return;
    state.usage = { usage, lastRun: Array.isArray(runs) ? runs[0] : undefined };
    renderUsage();
  } catch (error) {
    els.usage.replaceChildren(h("span", {}, `Usage unavailable: ${error.message}`));
  }
}

/** The footer: the settled usage, plus what the run being streamed has spent so far. */
function renderUsage() {
  if (state.usage === null || state.threadId === null) return;
  const run = state.run !== null && state.run.threadId === state.threadId ? state.run : null;
  const live =
    run === null
      ? null
      : liveRunUsage({
          messages: allMessages(),
          cards: [...state.cards.entries()].filter(([id]) => state.cardTurn.get(id) === state.turns).map(([, card]) => card),
          runModel: run.modelName,
          models: state.models,
        });
  els.usage.replaceChildren(...usageParts(state.usage.usage, { lastRun: state.usage.lastRun, models: state.models, live }));
}

// Durable batches of the open thread (docs/workspace.md#batch-panel); their progress moves the footer's spend.
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
  state.runs = null;
  state.summaries.clear();
  state.usage = null;
  state.stickToBottom = true;
  closeRunView();
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

// ---------------------------------------------------------------------------- activity

const activity = new ActivityView(els.activity, (threadId) => {
  closeActivity();
  closeSidebar();
  openThread(threadId, { push: true });
});

function closeActivity() {
  activity.hide();
  els.activityToggle.setAttribute("aria-expanded", "false");
}

async function toggleActivity() {
  if (activity.open) {
    closeActivity();
    return;
  }
  closeUsage();
  els.activityToggle.setAttribute("aria-expanded", "true");
  closeSidebar();
  await activity.show();
}

// ---------------------------------------------------------------------------- usage page

const usagePage = new UsagePage(els.usagePage, (threadId) => {
  closeUsage();
  closeSidebar();
  openThread(threadId, { push: true });
});

function closeUsage() {
  usagePage.hide();
  els.usageToggle.setAttribute("aria-expanded", "false");
}

async function toggleUsage() {
  if (usagePage.open) {
    closeUsage();
    return;
  }
  closeActivity();
  els.usageToggle.setAttribute("aria-expanded", "true");
  closeSidebar();
  await usagePage.show();
}

/** Shows a thread: its messages and cards, and follows its active run in the background. */
async function openThread(threadId, { push = false, fresh = false } = {}) {
  if (activity.open) closeActivity();
  if (usagePage.open) closeUsage();
  resetThreadState();
  state.threadId = threadId;
  if (push && location.pathname !== threadPath(threadId)) history.pushState({}, "", threadPath(threadId));
  renderThreads();
  renderControls();
  setText(els.title, threadId === null ? "New thread" : "Loading…");
  renderMessages();
  batchPanel.setThread(threadId, { load: !fresh });
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
    const [thread, threadState, runs] = await Promise.all([
      apiJson(paths.thread(threadId)),
      apiJson(paths.state(threadId)),
      apiJson(paths.runs(threadId, "?limit=100")),
    ]);
    if (generation !== state.generation) return;
    state.runs = Array.isArray(runs) ? runs : [];
    setText(els.title, threadTitle(thread));
    const running = state.runs.find((r) => r.status === "running" || r.status === "pending");
    if (running !== undefined) beginRun(threadId, running.run_id, running.model_name ?? defaultModelName());
    applyValues(threadState?.values ?? { messages: [] });
    renderAllCards();
    renderControls();
    refreshUsage();
    if (running !== undefined) rejoinActive(state.run);
    // Finished and reloaded cards get their counts, usage, cost and latest step from the
    // runs' task summaries before any card is expanded.
    await loadAllSummaries(threadId, state.runs);
    if (generation !== state.generation) return;
    renderAllCards();
    renderRunView();
  } catch (error) {
    if (generation !== state.generation) return;
    setText(els.title, error instanceof ApiError && error.status === 404 ? "Thread not found" : "The thread could not be loaded");
    showError(error);
  }
}

/** The default model: the first configured one. */
function defaultModelName() {
  return state.models[0]?.name ?? null;
}

/** The model the picker names, else the default. */
function pickedModelName() {
  const picked = els.model.value;
  return state.models.some((m) => m?.name === picked) ? picked : defaultModelName();
}

/** Whether a model is the built-in scripted one, which runs the demo plan for any prompt. */
function isScripted(name) {
  const model = state.models.find((m) => m?.name === name);
  return typeof model?.model === "string" && model.model.startsWith("scripted");
}

/** Which model a prompt runs on, in words; only the scripted model promises the demo plan. */
function modelSentence() {
  const name = pickedModelName();
  if (name === null) return "";
  const label = modelLabel(name, state.models);
  return isScripted(name) ? `${label} (the built-in scripted model) runs the demo plan for any prompt.` : `${label} answers.`;
}

/** The composer's placeholder names the model, and a picker appears when there are several. */
function renderModels() {
  const models = state.models.filter((m) => typeof m?.name === "string");
  const picked = els.model.value;
  if (els.model.options.length !== models.length) {
    els.model.replaceChildren(...models.map((m) => h("option", { value: m.name }, modelLabel(m.name, state.models))));
    if (models.some((m) => m.name === picked)) els.model.value = picked;
  }
  els.model.hidden = models.length < 2;
  els.model.closest("label")?.toggleAttribute("hidden", models.length < 2);
  const name = pickedModelName();
  const demo = name !== null && isScripted(name) ? " — any prompt runs the demo plan" : "";
  els.input.placeholder = name === null ? "Ask something" : `Message ${modelLabel(name, state.models)}${demo}`;
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
els.runsToggle.addEventListener("click", () => toggleRunView());
els.model.addEventListener("change", () => {
  renderModels();
  renderMessages();
});
// Cards change in place (steps, summaries), outside renderMessages: follow them too.
new MutationObserver(followBottom).observe(els.messages, { childList: true, subtree: true, characterData: true });
// ...and the list itself shrinking when the footer or the run view takes room.
new ResizeObserver(followBottom).observe(els.messages);
els.messages.addEventListener("scroll", () => {
  const container = els.messages;
  state.stickToBottom = container.scrollHeight - container.scrollTop - container.clientHeight < BOTTOM_SLACK_PX;
});
els.newThread.addEventListener("click", () => {
  closeSidebar();
  openThread(null, { push: true });
  els.input.focus();
});
els.search.addEventListener("input", searchInput);
els.activityToggle.addEventListener("click", () => toggleActivity());
els.usageToggle.addEventListener("click", () => toggleUsage());
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

/** Reads the configured models; a failure says so in the header until a later read works. */
async function loadModels() {
  try {
    const models = await apiJson(paths.models());
    state.models = Array.isArray(models?.models) ? models.models : [];
    state.tokenUsageEnabled = models?.token_usage?.enabled === true;
    state.modelsFailed = false;
    if (els.connection.textContent.startsWith("Models unavailable")) setText(els.connection, "");
  } catch (error) {
    state.modelsFailed = true;
    setText(els.connection, `Models unavailable: ${error.message}`);
  }
  document.documentElement.dataset.tokenUsage = String(state.tokenUsageEnabled);
  renderModels();
}

// A token entered after the models failed (the first prompt was dismissed): read them again.
onTokenAccepted(() => {
  if (state.modelsFailed) loadModels();
});
els.tokenCancel.addEventListener("click", () => els.tokenDialog.close("cancel"));

async function start() {
  await loadModels();
  await Promise.all([refreshThreads(), openThread(threadFromPath())]);
  document.documentElement.dataset.ready = "true";
}

start();
