// The run view: the thread's runs, newest first (status, start, duration, tokens, cost,
// trace id with a copy button), and one run's timeline — the lead's turns and a bar per
// task on one time axis, step ticks, status colours, details on hover or focus, and a
// click that opens the task's card. Plain DOM from public APIs only.

import { apiJson, paths } from "./api.mjs";
import { loadSummaries, revealCard } from "./board.mjs";
import { formatCost, formatTokenCount, modelLabel } from "./cards.mjs";
import { append, h, setText } from "./dom.mjs";
import { els, state } from "./state.mjs";
import { axisPercent, formatDuration, parseTime, timelineModel } from "./timeline.mjs";

/** Events a timeline reads per page, and the pages it reads at most. */
const EVENT_PAGE = 2000;
const MAX_EVENT_PAGES = 10;
const TIMELINE_EVENTS = "run.start,llm.human.input,llm.ai.response,subagent.step";

const view = { open: false, selected: null, timeline: null, generation: 0 };

/** A run status in words. */
export const RUN_STATUS_WORDS = {
  pending: "Pending",
  running: "Running",
  success: "Succeeded",
  error: "Failed",
  timeout: "Timed out",
  interrupted: "Stopped",
};

function runDuration(run) {
  const start = parseTime(run.created_at);
  const active = run.status === "pending" || run.status === "running";
  const end = active ? Date.now() : parseTime(run.updated_at);
  return start === null || end === null ? null : end - start;
}

function costText(cost) {
  return cost && typeof cost.total === "number" ? formatCost(cost.total, cost.currency) : "—";
}

/** Copies `text`, through the clipboard API when the page may, else a selected field. */
async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const field = h("textarea", { class: "visually-hidden", readonly: true });
    field.value = text;
    document.body.append(field);
    field.select();
    const copied = document.execCommand("copy");
    field.remove();
    return copied;
  }
}

/** An id with a Copy button: "Run 1f0e… Copy" (what `subflow tail --run` takes). */
function copyableId(kind, label, id) {
  const copy = h(
    "button",
    {
      type: "button",
      class: `copy-button copy-${kind}`,
      "aria-label": `Copy ${label.toLowerCase()} id ${id}`,
      onclick: async () => {
        const copied = await copyText(id);
        setText(copy, copied ? "Copied" : "Copy failed");
      },
    },
    "Copy",
  );
  return h("span", { class: `run-id-line run-${kind}` }, h("span", { class: "run-id-label" }, label), h("code", {}, id), copy);
}

function runRow(run) {
  const duration = runDuration(run);
  const started = parseTime(run.created_at);
  return h(
    "li",
    { class: "run-row", dataset: { runId: run.run_id, status: run.status } },
    h(
      "button",
      {
        type: "button",
        class: "run-select",
        "aria-pressed": String(view.selected === run.run_id),
        onclick: () => selectRun(run.run_id),
      },
      h("span", { class: `run-status run-status-${run.status}` }, RUN_STATUS_WORDS[run.status] ?? run.status),
      h("span", { class: "run-start" }, started === null ? "—" : new Date(started).toLocaleString()),
      h("span", { class: "run-duration" }, duration === null ? "—" : formatDuration(duration)),
      h("span", { class: "run-tokens" }, `${formatTokenCount(run.total_tokens ?? 0)} tokens`),
      h("span", { class: "run-cost" }, costText(run.cost)),
    ),
    copyableId("id", "Run", run.run_id),
    run.trace_id ? copyableId("trace", "Trace", run.trace_id) : null,
  );
}

function details(bar) {
  const tokens = bar.usage ? `${formatTokenCount(bar.usage.total_tokens)} tokens` : "no usage";
  const model = bar.model === null ? "no model" : modelLabel(bar.model, state.models);
  const steps = `${bar.ticks.length} ${bar.ticks.length === 1 ? "step" : "steps"}`;
  return `${bar.description} · ${bar.status} · ${model} · ${tokens} · ${costText(bar.cost)} · ${formatDuration(bar.end - bar.start)} · ${steps}`;
}

function place(element, start, end, model) {
  const left = axisPercent(start, model);
  element.style.left = `${left}%`;
  element.style.width = `${Math.max(0, axisPercent(end, model) - left)}%`;
}

function drawTimeline(run, model) {
  const detail = h("p", { class: "timeline-detail", "aria-live": "polite" }, "Hover or focus a bar for its details.");
  const show = (text) => () => setText(detail, text);
  const leadTrack = h("div", { class: "track" });
  for (const turn of model.lead) {
    const text = `Lead turn ${turn.index} · ${formatDuration(turn.end - turn.start)}${turn.tokens === null ? "" : ` · ${formatTokenCount(turn.tokens)} tokens`}`;
    const bar = h("span", { class: "bar bar-lead", tabindex: "0", title: text, onmouseenter: show(text), onfocus: show(text) });
    place(bar, turn.start, turn.end, model);
    leadTrack.append(bar);
  }
  const lanes = [h("li", { class: "lane lane-lead" }, h("span", { class: "lane-label" }, "Lead"), leadTrack)];
  for (const task of model.tasks) {
    const text = details(task);
    const bar = h("button", {
      type: "button",
      class: `bar bar-${task.status}`,
      title: text,
      "aria-label": text,
      dataset: { taskId: task.id },
      onmouseenter: show(text),
      onfocus: show(text),
      onclick: () => {
        closeRunView();
        revealCard(task.id);
      },
    });
    place(bar, task.start, task.end, model);
    for (const at of task.ticks) {
      const tick = h("span", { class: "tick", "aria-hidden": "true" });
      const span = task.end - task.start;
      tick.style.left = `${span <= 0 ? 0 : Math.min(100, Math.max(0, ((at - task.start) / span) * 100))}%`;
      bar.append(tick);
    }
    const track = h("div", { class: "track" }, bar);
    lanes.push(h("li", { class: "lane" }, h("span", { class: "lane-label" }, task.description), track));
  }
  return h(
    "div",
    { class: "timeline", role: "group", "aria-label": `Timeline of run ${run.run_id}`, dataset: { runId: run.run_id } },
    h(
      "div",
      { class: "timeline-axis", "aria-hidden": "true" },
      h("span", {}, "0 s"),
      h("span", {}, formatDuration(model.end - model.start)),
    ),
    h("ol", { class: "timeline-lanes" }, ...lanes),
    detail,
  );
}

async function fetchTimelineEvents(threadId, runId) {
  let events = [];
  let after = "";
  for (let page = 0; page < MAX_EVENT_PAGES; page += 1) {
    const query = `event_types=${TIMELINE_EVENTS}&limit=${EVENT_PAGE}${after}`;
    const records = await apiJson(paths.events(threadId, runId, query));
    events = events.concat(records);
    if (!Array.isArray(records) || records.length < EVENT_PAGE) break;
    after = `&after_seq=${records[records.length - 1].seq}`;
  }
  return events;
}

/** Shows one run's timeline under the list. */
async function selectRun(runId) {
  view.selected = runId;
  view.timeline = h("p", { class: "note" }, "Loading the timeline…");
  renderRunView();
  const generation = ++view.generation;
  const threadId = state.threadId;
  try {
    if (!state.summaries.has(runId)) await loadSummaries(threadId, runId);
    const events = await fetchTimelineEvents(threadId, runId);
    const run = (state.runs ?? []).find((r) => r.run_id === runId);
    if (generation !== view.generation || run === undefined) return;
    const model = timelineModel({ run, events, tasks: state.summaries.get(runId) ?? [], now: Date.now() });
    view.timeline = drawTimeline(run, model);
  } catch (error) {
    if (generation !== view.generation) return;
    view.timeline = h("p", { class: "note" }, `The timeline could not be loaded: ${error.message}`);
  }
  renderRunView();
}

/** Draws the run view as the thread's runs stand (and the Runs button). */
export function renderRunView() {
  const runs = Array.isArray(state.runs) ? state.runs : [];
  els.runsToggle.hidden = state.threadId === null;
  els.runsToggle.setAttribute("aria-expanded", String(view.open));
  els.runsPanel.hidden = !view.open;
  if (!view.open) return;
  const list =
    runs.length === 0
      ? h("p", { class: "note" }, state.runs === null ? "Loading runs…" : "No runs yet.")
      : h("ol", { class: "run-list", "aria-label": "Runs, newest first" }, ...runs.map(runRow));
  // No timeline until a run is picked: append skips it (replaceChildren would write "null").
  els.runsPanel.replaceChildren();
  append(els.runsPanel, [h("h3", { class: "runs-title" }, "Runs"), list, view.timeline]);
}

export function closeRunView() {
  view.open = false;
  view.selected = null;
  view.timeline = null;
  view.generation += 1;
  renderRunView();
}

/** Opens or closes the run view; opening loads the thread's runs when they are not known. */
export async function toggleRunView() {
  if (view.open) {
    closeRunView();
    return;
  }
  view.open = true;
  renderRunView();
  const threadId = state.threadId;
  if (threadId === null) return;
  if (state.runs === null) {
    const runs = await apiJson(paths.runs(threadId, "?limit=100")).catch(() => []);
    if (threadId !== state.threadId) return;
    state.runs = Array.isArray(runs) ? runs : [];
  }
  renderRunView();
}
