// The thread's task cards: their state (merged by the rules of cards.mjs), their elements,
// the task summaries that paint finished and reloaded cards (`…/runs/{run_id}/tasks`) and
// the `/events` backfill of an expanded card's steps.

import { ApiError, apiJson, paths } from "./api.mjs";
import {
  backfillNext,
  backfillPath,
  backfillSteps,
  cardView,
  groupHeader,
  mergeCard,
  messageCardUpdates,
  newCard,
  shouldBackfill,
  summaryUpdate,
} from "./cards.mjs";
import { CardElement } from "./cardui.mjs";
import { h } from "./dom.mjs";
import { announce, state } from "./state.mjs";

/** Runs whose task summaries are fetched at once. */
const SUMMARY_CONCURRENCY = 4;

function turnLoading(id) {
  return state.run !== null && state.run.threadId === state.threadId && state.cardTurn.get(id) === state.turns;
}

function cardElement(id) {
  let element = state.cardElements.get(id);
  if (element === undefined) {
    element = new CardElement(id, toggleCard, stopTask);
    state.cardElements.set(id, element);
  }
  return element;
}

/** Shows a card as its state stands. */
export function renderCard(id) {
  const card = state.cards.get(id);
  if (card === undefined) return;
  const view = cardView(card, {
    turnLoading: turnLoading(id),
    tokenUsageEnabled: state.tokenUsageEnabled,
    models: state.models,
  });
  cardElement(id).update(view, card.prompt, state.expanded.has(id), state.backfill.get(id) ?? "idle", liveRunOf(id) !== null);
}

/** The live run a card's task runs in, while that run is not being stopped; else null. */
function liveRunOf(id) {
  const run = state.run;
  if (run === null || run.stopping || run.runId === null || run.threadId !== state.threadId) return null;
  const runId = state.cardRun.get(id) ?? state.turnRun.get(state.cardTurn.get(id));
  return runId === run.runId ? runId : null;
}

/** Stops one task of the live run (`…/tasks/{task_id}/cancel`); the run goes on. */
export async function stopTask(id) {
  const runId = liveRunOf(id);
  const element = cardElement(id);
  if (runId === null) return;
  element.setStop("stopping");
  try {
    await apiJson(paths.cancelTask(state.run.threadId, runId, id), { method: "POST" });
    announce(`Stopping subtask: ${state.cards.get(id)?.description ?? id}`);
  } catch (error) {
    element.setStop("failed", error.message);
  }
}

export function renderAllCards() {
  for (const id of state.cards.keys()) renderCard(id);
}

/** Merges an update into a card and publishes it as the merge says. */
export function updateCard(id, update) {
  const merged = mergeCard(state.cards.get(id) ?? newCard(id), update);
  state.cards.set(id, merged.card);
  if (merged.publish === "now") renderCard(id);
  else if (merged.publish === "after_render") state.afterRender.add(id);
}

/** Shows terminal transitions collected during a render, once it is on screen. */
export function publishAfterRender() {
  const ids = [...state.afterRender];
  state.afterRender.clear();
  for (const id of ids) {
    renderCard(id);
    const card = state.cards.get(id);
    const word = card.status === "completed" ? "Subtask completed" : "Subtask failed";
    announce(`${word}: ${card.description ?? id}`);
  }
}

/** The thread's messages with ToolMessages streamed ahead of the next `values` frame. */
export function allMessages() {
  const messages = [...state.messages];
  const present = new Set(messages.filter((m) => m?.type === "tool").map((m) => m.tool_call_id));
  for (const [callId, message] of state.streamedTools) if (!present.has(callId)) messages.push(message);
  return messages;
}

/** Opens and answers cards from the thread's messages (calls and ToolMessages). */
export function syncCards() {
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

/** A group of task cards, in call order. */
export function renderCardGroup(calls) {
  const group = h("div", { class: "card-group" }, h("p", { class: "card-group-header" }, groupHeader(calls.length)));
  for (const call of calls) {
    const element = cardElement(call.id);
    if (!state.cards.has(call.id)) state.cards.set(call.id, newCard(call.id));
    renderCard(call.id);
    group.append(element.root);
  }
  return group;
}

/** Expands or collapses a card; expanding one without steps backfills them. */
export async function toggleCard(id, expanded) {
  if (expanded) state.expanded.add(id);
  else state.expanded.delete(id);
  renderCard(id);
  if (expanded) await backfillCard(id);
}

/** Paints the cards of one run from its task summaries, and remembers which run each ran in. */
export function applySummaries(runId, summaries) {
  state.summaries.set(runId, summaries);
  for (const summary of summaries) {
    const id = summary?.task_id;
    const update = summaryUpdate(summary);
    if (typeof id !== "string" || update === null) continue;
    state.cardRun.set(id, runId);
    if (state.cardTurn.has(id)) state.turnRun.set(state.cardTurn.get(id), runId);
    updateCard(id, update);
  }
}

/** Fetches and applies one run's task summaries. */
export async function loadSummaries(threadId, runId) {
  const generation = state.generation;
  const summaries = await apiJson(paths.tasks(threadId, runId));
  if (generation !== state.generation || !Array.isArray(summaries)) return;
  applySummaries(runId, summaries);
  publishAfterRender();
}

/**
 * Paints every card of the thread from its runs' task summaries, newest run first, a few
 * runs at a time; a run whose summaries fail to load keeps its cards as they are.
 */
export async function loadAllSummaries(threadId, runs) {
  const queue = runs.filter((run) => !state.summaries.has(run.run_id));
  const worker = async () => {
    for (let run = queue.shift(); run !== undefined; run = queue.shift()) {
      try {
        await loadSummaries(threadId, run.run_id);
      } catch (error) {
        if (!(error instanceof ApiError)) console.warn("task summaries failed", error);
      }
    }
  };
  await Promise.all(Array.from({ length: SUMMARY_CONCURRENCY }, worker));
}

/** The run a task ran in: known live or from the summaries, else searched in the runs' summaries. */
async function runOfTask(id) {
  const known = state.cardRun.get(id) ?? state.turnRun.get(state.cardTurn.get(id));
  if (known !== undefined) return known;
  const threadId = state.threadId;
  if (state.runs === null) state.runs = await apiJson(paths.runs(threadId, "?limit=100"));
  await loadAllSummaries(threadId, Array.isArray(state.runs) ? state.runs : []);
  return state.cardRun.get(id) ?? null;
}

/** Every step of a task from `/events`, paged by `after_seq`; throws on a non-2xx page. */
export async function fetchSteps(threadId, runId, id) {
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

/** Fills an expanded card's steps from the backfill (docs/workspace.md#task-card); a failure retries on the next expand. */
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

/** Opens a card from elsewhere (the run view): expands it and brings it into view. */
export async function revealCard(id) {
  const element = state.cardElements.get(id);
  if (element === undefined) return false;
  element.root.scrollIntoView({ block: "center" });
  element.toggle.focus({ preventScroll: true });
  if (!state.expanded.has(id)) await toggleCard(id, true);
  return true;
}
