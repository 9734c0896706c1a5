// Every run and batch of the user's, across threads (`GET /api/runs`, `GET
// /api/subagent-batches`), newest first, a page at a time: status, thread, when, and for
// a batch its summary line. Picking a row opens its thread.

import { apiJson } from "./api.mjs";
import { summary as batchSummary } from "./batches.mjs";
import { h, setText } from "./dom.mjs";
import { relativeDate } from "./panels.mjs";
import { RUN_STATUS_WORDS } from "./runview.mjs";
import { parseTime } from "./timeline.mjs";

/** Rows read per page of each list. */
const PAGE = 20;

const lists = {
  runs: {
    title: "Runs",
    path: (offset) => `/api/runs?limit=${PAGE}&offset=${offset}`,
    row: (run) => [
      h("span", { class: `run-status run-status-${run.status}` }, RUN_STATUS_WORDS[run.status] ?? run.status),
      h("span", { class: "activity-thread" }, run.thread_id),
      h("span", { class: "activity-id" }, run.run_id),
    ],
    when: (run) => run.created_at,
  },
  batches: {
    title: "Batches",
    path: (offset) => `/api/subagent-batches?limit=${PAGE}&offset=${offset}`,
    row: (batch) => [
      h("span", { class: "batch-status", dataset: { status: batch.status } }, batch.status),
      h("span", { class: "activity-title" }, batch.title),
      h("span", { class: "activity-thread" }, batch.thread_id),
      h("span", { class: "activity-summary" }, batchSummary(batch)),
    ],
    when: (batch) => batch.created_at,
  },
};

/** The activity panel in `root`; `onOpen(threadId)` opens a row's thread. */
export class ActivityView {
  constructor(root, onOpen) {
    this.root = root;
    this.onOpen = onOpen;
    this.open = false;
    this.generation = 0;
    this.sections = {};
    for (const [name, list] of Object.entries(lists)) {
      const items = h("ul", { class: "activity-list", "aria-label": list.title });
      const note = h("p", { class: "note", hidden: true });
      const more = h("button", { type: "button", class: "activity-more", hidden: true, onclick: () => this.load(name) }, "Load more");
      this.sections[name] = { rows: [], items, note, more, done: false };
      root.append(h("section", { class: `activity-section activity-${name}` }, h("h3", { class: "runs-title" }, list.title), items, note, more));
    }
  }

  /** Shows the panel, read afresh. */
  async show() {
    this.open = true;
    this.root.hidden = false;
    this.generation += 1;
    for (const [name, section] of Object.entries(this.sections)) {
      section.rows = [];
      section.done = false;
      section.items.replaceChildren();
      await this.load(name);
    }
  }

  hide() {
    this.open = false;
    this.root.hidden = true;
    this.generation += 1;
  }

  /** Reads the next page of one list. */
  async load(name) {
    const section = this.sections[name];
    const generation = this.generation;
    try {
      const page = await apiJson(lists[name].path(section.rows.length));
      if (generation !== this.generation || !Array.isArray(page)) return;
      section.rows = section.rows.concat(page);
      section.done = page.length < PAGE;
      section.items.append(...page.map((entry) => this.row(name, entry)));
      setText(section.note, section.rows.length === 0 ? `No ${name} yet.` : "");
    } catch (error) {
      if (generation !== this.generation) return;
      setText(section.note, `The ${name} could not be loaded: ${error.message}`);
    }
    section.note.hidden = section.note.textContent === "";
    section.more.hidden = section.done;
  }

  row(name, entry) {
    const list = lists[name];
    const at = parseTime(list.when(entry));
    return h(
      "li",
      {},
      h(
        "button",
        {
          type: "button",
          class: "activity-row",
          dataset: { threadId: entry.thread_id },
          onclick: () => this.onOpen(entry.thread_id),
        },
        ...list.row(entry),
        h("time", { class: "activity-when", datetime: list.when(entry) ?? null }, at === null ? "" : relativeDate(at, Date.now())),
      ),
    );
  }
}
