// The batch panel of docs/workspace.md#batch-panel on screen: the thread's durable batches polled from the
// public API, one card per batch (kept across polls so focus and open item lists
// survive), Pause / Resume / Cancel / Export JSONL / View items, and item rows with
// Retry. The rules are batches.mjs's; every text is set as text.

import { ApiError, apiFetch, apiJson } from "./api.mjs";
import {
  ITEMS_PAGE,
  READ_ONLY_TEXT,
  attemptText,
  badgeText,
  controls,
  itemsInterval,
  budgetText,
  limitsText,
  listInterval,
  panelVisible,
  percent,
  retryControl,
  summary,
} from "./batches.mjs";
import { h, setText } from "./dom.mjs";

const enc = encodeURIComponent;
/** The item statuses the list can be narrowed to. */
const ITEM_STATUSES = ["pending", "queued", "leased", "running", "succeeded", "failed", "cancelled"];
const batchPaths = {
  features: () => "/api/features",
  list: (t) => `/api/threads/${enc(t)}/subagent-batches?limit=20`,
  items: (t, b, offset, status) =>
    `/api/threads/${enc(t)}/subagent-batches/${enc(b)}/items?offset=${offset}&limit=${ITEMS_PAGE}` +
    (status ? `&status=${enc(status)}` : ""),
  control: (t, b, action) => `/api/threads/${enc(t)}/subagent-batches/${enc(b)}/${action}`,
  retry: (t, b, i) => `/api/threads/${enc(t)}/subagent-batches/${enc(b)}/items/${enc(i)}/retry`,
  results: (t, b) => `/api/threads/${enc(t)}/subagent-batches/${enc(b)}/results.jsonl`,
};

function button(label, onclick, extra = {}) {
  return h("button", { type: "button", onclick, ...extra }, label);
}

/** Shows or hides a control and sets whether it is enabled. */
function applyControl(element, { shown, enabled }) {
  element.hidden = !shown;
  element.disabled = !enabled;
}

/** One item row, updated in place. */
class ItemRow {
  constructor(onRetry) {
    this.key = h("span", { class: "batch-item-key" });
    this.status = h("span", { class: "batch-item-status" });
    this.attempt = h("span", { class: "batch-item-attempt" });
    this.preview = h("p", { class: "batch-item-preview" });
    this.error = h("p", { class: "batch-item-error" });
    this.retry = button("Retry", () => onRetry(this.item), { class: "batch-retry" });
    this.element = h(
      "li",
      { class: "batch-item" },
      h("div", { class: "batch-item-head" }, this.key, this.status, this.attempt, this.retry),
      this.preview,
      this.error,
    );
  }

  update(item, readOnly) {
    this.item = item;
    this.element.dataset.itemId = item.id;
    this.element.dataset.status = item.status;
    setText(this.key, item.item_key);
    setText(this.status, item.status);
    setText(this.attempt, `attempt ${attemptText(item)}`);
    setText(this.preview, item.result_preview ?? "");
    this.preview.hidden = !item.result_preview;
    setText(this.error, item.error ?? "");
    this.error.hidden = !item.error;
    this.retry.setAttribute("aria-label", `Retry ${item.item_key}`);
    applyControl(this.retry, retryControl(item, readOnly));
  }
}

/** One batch card, updated in place; its item list is loaded on "View items". */
class BatchCard {
  constructor(panel, id) {
    this.panel = panel;
    this.id = id;
    this.items = { open: false, rows: new Map(), list: [], pagesLoaded: 0, timer: null, more: false, error: null };
    this.title = h("h3", { class: "batch-title" });
    this.status = h("span", { class: "batch-status" });
    this.meta = h("p", { class: "batch-meta" });
    this.progress = h("progress", { class: "batch-progress", max: "100" });
    this.summary = h("p", { class: "batch-summary" });
    this.budget = h("p", { class: "batch-budget", hidden: true });
    const act = (action) => () => panel.control(this, action);
    this.pause = button("Pause", act("pause"));
    this.resume = button("Resume", act("resume"));
    this.cancel = button("Cancel", act("cancel"), { class: "danger" });
    this.export = button("Export JSONL", () => panel.exportResults(this));
    this.view = button("View items", () => this.toggleItems(), { "aria-expanded": "false" });
    this.itemList = h("ol", { class: "batch-items", "aria-label": "Items" });
    this.itemNote = h("p", { class: "note batch-items-note", hidden: true });
    this.loadMore = button("Load more", () => this.loadNextPage(), { class: "batch-load-more", hidden: true });
    // Which items the list shows: all, or those of one status (the API filters).
    this.statusFilter = h(
      "select",
      { class: "batch-items-filter", "aria-label": "Show items", onchange: () => this.filterItems() },
      h("option", { value: "" }, "All items"),
      ...ITEM_STATUSES.map((status) => h("option", { value: status }, status)),
    );
    this.itemsBox = h(
      "div",
      { class: "batch-items-box", hidden: true },
      this.statusFilter,
      this.itemList,
      this.itemNote,
      this.loadMore,
    );
    this.element = h(
      "article",
      { class: "batch-card" },
      h("div", { class: "batch-head" }, this.title, this.status),
      this.meta,
      this.progress,
      this.summary,
      this.budget,
      h("div", { class: "batch-actions" }, this.pause, this.resume, this.cancel, this.export, this.view),
      this.itemsBox,
    );
  }

  update(batch) {
    this.batch = batch;
    const readOnly = this.panel.readOnly();
    this.element.dataset.batchId = batch.id;
    this.element.dataset.status = batch.status;
    setText(this.title, batch.title);
    setText(this.status, batch.status);
    setText(this.meta, `${batch.subagent_type} · limits ${limitsText(batch)}`);
    const done = percent(batch);
    this.progress.value = done;
    this.progress.setAttribute("aria-label", `${batch.title}: ${done}% done`);
    setText(this.summary, summary(batch));
    const budget = budgetText(batch.budget, batch.pause_reason);
    this.budget.hidden = budget === null;
    setText(this.budget, budget ?? "");
    const shown = controls(batch, readOnly);
    applyControl(this.pause, shown.pause);
    applyControl(this.resume, shown.resume);
    applyControl(this.cancel, shown.cancel);
    applyControl(this.export, shown.export);
    for (const row of this.items.rows.values()) row.update(row.item, readOnly);
  }

  async toggleItems() {
    this.items.open = !this.items.open;
    this.view.setAttribute("aria-expanded", String(this.items.open));
    setText(this.view, this.items.open ? "Hide items" : "View items");
    this.itemsBox.hidden = !this.items.open;
    if (this.items.open) await this.refreshItems();
    else this.stopItems();
  }

  stopItems() {
    clearTimeout(this.items.timer);
    this.items.timer = null;
    this.itemsBox.dataset.nextPoll = "off";
  }

  /** Re-reads the first page (only while no further page was loaded), then reschedules. */
  async refreshItems() {
    this.stopItems();
    if (!this.items.open) return;
    if (this.items.pagesLoaded <= 1) await this.loadPage(0);
    this.scheduleItems();
  }

  scheduleItems() {
    this.stopItems();
    const wait = itemsInterval({
      pagesLoaded: this.items.pagesLoaded,
      workerRunning: !this.panel.readOnly(),
      hidden: document.hidden,
    });
    if (this.items.open && wait !== null) this.items.timer = setTimeout(() => this.refreshItems(), wait);
    this.itemsBox.dataset.nextPoll = this.items.open && wait !== null ? String(wait) : "off";
  }

  /** Starts the item list again with the chosen status. */
  async filterItems() {
    this.stopItems();
    this.items.list = [];
    this.items.rows.clear();
    this.items.pagesLoaded = 0;
    await this.refreshItems();
  }

  async loadNextPage() {
    this.stopItems();
    await this.loadPage(this.items.list.length);
  }

  async loadPage(offset) {
    const panel = this.panel;
    const threadId = panel.threadId;
    try {
      const status = this.statusFilter.value;
      const page = await apiJson(batchPaths.items(threadId, this.id, offset, status));
      if (threadId !== panel.threadId || status !== this.statusFilter.value) return;
      const list = Array.isArray(page) ? page : [];
      this.items.list = offset === 0 && this.items.pagesLoaded <= 1 ? list : this.items.list.concat(list);
      this.items.pagesLoaded = offset === 0 && this.items.pagesLoaded <= 1 ? 1 : this.items.pagesLoaded + 1;
      this.items.more = list.length === ITEMS_PAGE;
      this.items.error = null;
    } catch (error) {
      this.items.error = `Items could not be loaded: ${error.message}`;
    }
    this.renderItems();
  }

  renderItems() {
    const readOnly = this.panel.readOnly();
    const keep = new Set();
    const rows = this.items.list.map((item) => {
      keep.add(item.id);
      let row = this.items.rows.get(item.id);
      if (row === undefined) {
        row = new ItemRow((target) => this.panel.retry(this, target));
        this.items.rows.set(item.id, row);
      }
      row.update(item, readOnly);
      return row.element;
    });
    for (const id of [...this.items.rows.keys()]) if (!keep.has(id)) this.items.rows.delete(id);
    // Only reorder when the rows changed, so a focused Retry button keeps its focus.
    const current = [...this.itemList.children];
    if (current.length !== rows.length || current.some((el, i) => el !== rows[i])) this.itemList.replaceChildren(...rows);
    const note =
      this.items.error ??
      (this.items.list.length === 0 ? (this.statusFilter.value ? `No ${this.statusFilter.value} items.` : "No items.") : null);
    setText(this.itemNote, note ?? "");
    this.itemNote.hidden = note === null;
    this.loadMore.hidden = !this.items.more;
  }
}

/** The panel: mount it on an element and tell it which thread is open. */
export class BatchPanel {
  /** `onChange()` is called when a batch's progress changed (the footer refreshes its spend). */
  constructor(element, { onChange = () => {} } = {}) {
    this.element = element;
    this.onChange = onChange;
    this.threadId = null;
    this.features = null;
    this.batches = [];
    this.loading = false;
    this.failed = null;
    /** The last control, retry or export that failed, until the next one. */
    this.actionError = null;
    this.timer = null;
    this.cards = new Map();
    this.signature = "";
    this.badge = h("span", { class: "badge batch-badge", hidden: true, "aria-label": "Active batches" });
    this.banner = h("p", { class: "batch-banner", role: "status", hidden: true }, READ_ONLY_TEXT);
    this.note = h("p", { class: "note batch-note", hidden: true });
    this.list = h("div", { class: "batch-list" });
    element.replaceChildren(h("h2", { class: "batch-heading" }, "Batches ", this.badge), this.banner, this.note, this.list);
    element.hidden = true;
    document.addEventListener("visibilitychange", () => {
      if (document.hidden) this.stop();
      else if (this.threadId !== null) {
        this.refresh();
        for (const card of this.cards.values()) if (card.items.open) card.refreshItems();
      }
    });
  }

  readOnly() {
    return this.features?.subagent_batches?.worker_running !== true;
  }

  stop() {
    clearTimeout(this.timer);
    this.timer = null;
    this.element.dataset.nextPoll = "off";
    for (const card of this.cards.values()) card.stopItems();
  }

  /**
   * Shows `threadId`'s batches (null: none). `load: false` only records the thread (a
   * thread being created has none yet; the run's end refreshes the panel).
   */
  async setThread(threadId, { load = true } = {}) {
    this.stop();
    this.threadId = threadId;
    this.batches = [];
    this.failed = null;
    this.actionError = null;
    this.cards.clear();
    this.list.replaceChildren();
    this.signature = "";
    if (threadId === null || !load) {
      this.render();
      return;
    }
    await this.refresh({ features: true });
  }

  /** Reads the list now (and the capability when asked), then schedules the next poll. */
  async refresh({ features = false } = {}) {
    const threadId = this.threadId;
    if (threadId === null) return;
    // Only the list's timer: open item lists keep their own cadence.
    clearTimeout(this.timer);
    this.timer = null;
    this.loading = this.batches.length === 0;
    this.render();
    try {
      if (features || this.features === null) this.features = await apiJson(batchPaths.features());
      const batches = await apiJson(batchPaths.list(threadId));
      if (threadId !== this.threadId) return;
      this.batches = Array.isArray(batches) ? batches : [];
      this.failed = null;
    } catch (error) {
      if (threadId !== this.threadId) return;
      this.failed = `Batches could not be loaded: ${error.message}`;
    }
    this.loading = false;
    this.render();
    this.schedule();
  }

  schedule() {
    clearTimeout(this.timer);
    this.timer = null;
    const wait = listInterval({ batches: this.batches, workerRunning: !this.readOnly(), hidden: document.hidden });
    if (wait !== null) this.timer = setTimeout(() => this.refresh(), wait);
    // What the next poll is and how many reads were scheduled: for tests and debugging.
    this.element.dataset.nextPoll = wait === null ? "off" : String(wait);
    this.element.dataset.polls = String(Number(this.element.dataset.polls ?? 0) + 1);
  }

  render() {
    const visible = panelVisible({
      features: this.features,
      loading: this.loading,
      failed: this.failed !== null,
      batches: this.batches,
    });
    this.element.hidden = this.threadId === null || !visible;
    const badge = badgeText(this.batches);
    setText(this.badge, badge ?? "");
    this.badge.hidden = badge === null;
    this.banner.hidden = this.features === null || !this.readOnly();
    const note = this.failed ?? this.actionError ?? (this.loading ? "Loading batches…" : this.batches.length === 0 ? "No batches in this thread yet." : null);
    setText(this.note, note ?? "");
    this.note.hidden = note === null;
    const keep = new Set();
    const elements = this.batches.map((batch) => {
      keep.add(batch.id);
      let card = this.cards.get(batch.id);
      if (card === undefined) {
        card = new BatchCard(this, batch.id);
        this.cards.set(batch.id, card);
      }
      card.update(batch);
      return card.element;
    });
    for (const [id, card] of [...this.cards]) {
      if (!keep.has(id)) {
        card.stopItems();
        this.cards.delete(id);
      }
    }
    const current = [...this.list.children];
    if (current.length !== elements.length || current.some((el, i) => el !== elements[i])) this.list.replaceChildren(...elements);
    const signature = this.batches.map((b) => `${b.id}:${b.updated_at}`).join(",");
    if (signature !== this.signature) {
      this.signature = signature;
      if (signature !== "") this.onChange();
    }
  }

  async control(card, action) {
    this.actionError = null;
    try {
      await apiJson(batchPaths.control(this.threadId, card.id, action), { method: "POST" });
    } catch (error) {
      this.actionError = `${action[0].toUpperCase()}${action.slice(1)} failed: ${error.message}`;
    }
    await this.refresh();
  }

  async retry(card, item) {
    try {
      await apiJson(batchPaths.retry(this.threadId, card.id, item.id), { method: "POST" });
    } catch (error) {
      this.actionError = `Retry failed: ${error.message}`;
    }
    await Promise.all([this.refresh(), card.refreshItems()]);
  }

  /** Downloads `results.jsonl` through the API (so token mode's bearer token is sent). */
  async exportResults(card) {
    try {
      const response = await apiFetch(batchPaths.results(this.threadId, card.id));
      if (!response.ok) throw new ApiError(response.status, `HTTP ${response.status}`);
      const url = URL.createObjectURL(await response.blob());
      const link = h("a", { href: url, download: `${card.id}-results.jsonl`, hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (error) {
      this.actionError = `Export failed: ${error.message}`;
      this.render();
    }
  }
}
