// The usage page: what the user's runs and batches cost across threads over the last 30
// days (`GET /api/usage`), as a chart of cost per day by model, the totals of counted runs,
// stopped runs and batch items as the API gives them, and the threads that cost most.
// The chart is SVG drawn here; the page loads nothing from elsewhere.

import { apiJson } from "./api.mjs";
import { formatCost } from "./cards.mjs";
import { h, setText } from "./dom.mjs";

/** The days the page covers. */
const DAYS = 30;

/** Threads listed by cost. */
const TOP_THREADS = 10;

const SVG = "http://www.w3.org/2000/svg";

/** The cost of each model on each day of a `group_by=day` report: counted runs, stopped
 * runs and batch items together, in the report's one currency (null when it has none). */
export function costByDayAndModel(report) {
  const days = [];
  const models = new Set();
  let currency = null;
  for (const group of Array.isArray(report?.groups) ? report.groups : []) {
    const amounts = {};
    for (const section of [group.counted, group.stopped_runs, group.batches]) {
      const cost = section?.cost;
      if (cost === null || typeof cost !== "object") continue;
      currency ??= cost.currency;
      for (const [model, amount] of Object.entries(cost.by_model ?? {})) {
        amounts[model] = (amounts[model] ?? 0) + amount;
        models.add(model);
      }
    }
    days.push({ day: group.key, amounts });
  }
  return { days, models: [...models].sort(), currency };
}

function svg(tag, attributes = {}, ...children) {
  const element = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  for (const child of children) element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return element;
}

/** A stacked bar per day, one colour per model, with a legend and a text alternative. */
export function costChart({ days, models, currency }) {
  const width = 640;
  const height = 200;
  const top = 10;
  const bottom = 24;
  const slot = days.length === 0 ? width : width / days.length;
  const totals = days.map(({ amounts }) => Object.values(amounts).reduce((sum, amount) => sum + amount, 0));
  const highest = Math.max(0, ...totals);
  const scale = highest > 0 ? (height - top - bottom) / highest : 0;
  const label = currency === null ? "No priced usage in these days" : `Cost per day by model, ${currency}`;
  const chart = svg("svg", { class: "usage-chart", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label });
  chart.append(svg("title", {}, label));
  days.forEach(({ day, amounts }, index) => {
    let y = height - bottom;
    for (const [position, model] of models.entries()) {
      const amount = amounts[model] ?? 0;
      if (amount <= 0) continue;
      const tall = amount * scale;
      y -= tall;
      const bar = svg("rect", {
        class: `usage-bar usage-model-${position % 6}`,
        x: (index * slot + slot * 0.15).toFixed(2),
        y: y.toFixed(2),
        width: (slot * 0.7).toFixed(2),
        height: tall.toFixed(2),
        "data-day": day,
        "data-model": model,
      });
      bar.append(svg("title", {}, `${day} · ${model}: ${formatCost(amount, currency ?? "USD")}`));
      chart.append(bar);
    }
    chart.append(svg("text", { class: "usage-day", x: (index * slot + slot / 2).toFixed(2), y: height - 6 }, day.slice(5)));
  });
  const legend = h(
    "ul",
    { class: "usage-legend", "aria-label": "Models" },
    models.map((model, position) => h("li", {}, h("span", { class: `usage-swatch usage-model-${position % 6}` }), model)),
  );
  return h("figure", { class: "usage-figure" }, chart, legend);
}

/** `runs · tokens · cost` of one section of the report. */
function sectionLine(title, section, noun) {
  const count = noun === "items" ? section?.items : section?.runs;
  const tokens = (section?.total_tokens ?? 0).toLocaleString("en-US");
  const cost = section?.cost ? formatCost(section.cost.total, section.cost.currency) : "no cost";
  return h("li", { class: "usage-total", dataset: { section: title.toLowerCase().replace(" ", "-") } }, `${title}: ${count ?? 0} ${noun} · ${tokens} tokens · ${cost}`);
}

/** The usage page in `root`; `onOpen(threadId)` opens a listed thread. */
export class UsagePage {
  constructor(root, onOpen) {
    this.root = root;
    this.onOpen = onOpen;
    this.open = false;
    this.generation = 0;
  }

  /** Shows the page, read afresh. */
  async show() {
    this.open = true;
    this.root.hidden = false;
    this.generation += 1;
    const generation = this.generation;
    const note = h("p", { class: "note" }, "Loading…");
    this.root.replaceChildren(h("h3", { class: "runs-title" }, `Usage and cost, last ${DAYS} days`), note);
    const from = new Date(Date.now() - DAYS * 86_400_000).toISOString();
    try {
      const [byDay, byThread] = await Promise.all([
        apiJson(`/api/usage?group_by=day&from=${encodeURIComponent(from)}`),
        apiJson(`/api/usage?group_by=thread&from=${encodeURIComponent(from)}`),
      ]);
      if (generation !== this.generation) return;
      note.remove();
      this.render(byDay, byThread);
    } catch (error) {
      if (generation !== this.generation) return;
      setText(note, `Usage could not be loaded: ${error.message}`);
    }
  }

  hide() {
    this.open = false;
    this.root.hidden = true;
    this.generation += 1;
  }

  render(byDay, byThread) {
    const totals = h(
      "ul",
      { class: "usage-totals" },
      sectionLine("Counted runs", byDay.counted, "runs"),
      sectionLine("Stopped runs", byDay.stopped_runs, "runs"),
      sectionLine("Batch items", byDay.batches, "items"),
    );
    const threads = (byThread.groups ?? []).slice(0, TOP_THREADS).map((group) => {
      const costs = [group.counted, group.stopped_runs, group.batches].map((s) => s?.cost).filter((c) => c);
      const total = costs.reduce((sum, cost) => sum + cost.total, 0);
      const money = costs.length === 0 ? "no cost" : formatCost(total, costs[0].currency);
      return h(
        "li",
        {},
        h(
          "button",
          { type: "button", class: "activity-row usage-thread", dataset: { threadId: group.key }, onclick: () => this.onOpen(group.key) },
          h("span", { class: "activity-thread" }, group.key),
          h("span", { class: "usage-thread-cost" }, money),
        ),
      );
    });
    this.root.append(
      costChart(costByDayAndModel(byDay)),
      totals,
      h("h3", { class: "runs-title" }, "Threads by cost"),
      threads.length === 0 ? h("p", { class: "note" }, "No usage in these days.") : h("ol", { class: "activity-list usage-threads" }, threads),
    );
  }
}
