// The workspace's shared state and the elements it drives: one object each, imported by
// the modules that render parts of the page (app.mjs, board.mjs, runview.mjs).

const $ = (id) => document.getElementById(id);
export const els = {
  sidebar: $("sidebar"),
  threadsToggle: $("threads-toggle"),
  newThread: $("new-thread"),
  search: $("thread-search"),
  activity: $("activity"),
  activityToggle: $("activity-toggle"),
  usagePage: $("usage-page"),
  usageToggle: $("usage-toggle"),
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
  tokenCancel: $("token-cancel"),
  tokenInput: $("token-input"),
  tokenMessage: $("token-message"),
  model: $("composer-model"),
  runsToggle: $("runs-toggle"),
  runsPanel: $("runs-panel"),
};

export const state = {
  models: [],
  tokenUsageEnabled: false,
  modelsFailed: false,
  threads: [],
  /** The server's answer to the search box's words, or null while it holds none. */
  searchResults: null,
  /** Counts searches, so an older answer never replaces a newer one. */
  searchGeneration: 0,
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
  /** The thread's runs, newest first (`GET …/runs`), once loaded. */
  runs: null,
  /** Task summaries by run id (`GET …/runs/{run_id}/tasks`). */
  summaries: new Map(),
  /** The footer's settled usage: `{usage, lastRun}` from `/token-usage` and `/runs`. */
  usage: null,
  /** Whether new messages scroll into view: false once the user scrolled up. */
  stickToBottom: true,
};

/** Tells screen readers `text` through the live region. */
export function announce(text) {
  els.announcer.textContent = "";
  // A fresh node after a tick makes screen readers read repeated messages too.
  setTimeout(() => {
    els.announcer.textContent = text;
  }, 50);
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
