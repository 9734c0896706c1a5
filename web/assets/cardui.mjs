// The task card on screen: one element per task, kept across re-renders, updated from a
// `cardView` (cards.mjs). Every text it shows is set as text.

import { h, setText } from "./dom.mjs";

const STATUS_WORDS = { in_progress: "In progress", completed: "Completed", failed: "Failed" };
let serial = 0;

function stepRow(step) {
  if (step.kind === "tool") {
    return h(
      "li",
      { class: "step step-tool", dataset: { index: step.messageIndex } },
      h("span", { class: "step-kind" }, step.toolName ?? "tool"),
      step.text.trim() === "" ? null : h("span", { class: "step-text" }, step.text),
      step.truncated ? h("span", { class: "step-note" }, " (truncated)") : null,
    );
  }
  const calls = step.toolCalls.map((call) => call.name).filter(Boolean);
  return h(
    "li",
    { class: "step step-ai", dataset: { index: step.messageIndex } },
    h("span", { class: "step-text" }, step.text),
    calls.length > 0 ? h("span", { class: "step-note" }, ` → ${calls.join(", ")}`) : null,
    step.truncated ? h("span", { class: "step-note" }, " (truncated)") : null,
  );
}

/**
 * One task card. `onToggle(id, expanded)` is called when its header is activated, and
 * `onStop(id)` when the user confirms stopping the task.
 */
export class CardElement {
  constructor(id, onToggle, onStop) {
    this.id = id;
    this.expanded = false;
    this.renderedSteps = [];
    // The stop control: "idle" (a Stop button), "confirm" (asked in place), "stopping"
    // (the request went out), or "failed" (it was refused; the reason is shown).
    this.stop = "idle";
    this.stopError = "";
    const bodyId = `card-body-${++serial}`;
    this.icon = h("span", { class: "status-icon", "aria-hidden": "true" });
    this.statusWord = h("span", { class: "visually-hidden" });
    this.description = h("span", { class: "card-description" });
    this.type = h("span", { class: "card-type" });
    this.model = h("span", { class: "model-label" });
    this.tokens = h("span", { class: "token-label" });
    this.cost = h("span", { class: "cost-label" });
    this.latest = h("span", { class: "card-latest" });
    this.stepCount = h("span", { class: "step-count" });
    this.header = h("span", { class: "card-header-text" });
    this.capped = h("span", { class: "card-capped" });
    this.toggle = h(
      "button",
      {
        type: "button",
        class: "card-toggle",
        "aria-expanded": "false",
        "aria-controls": bodyId,
        onclick: () => onToggle(this.id, !this.expanded),
      },
      this.icon,
      this.statusWord,
      h("span", { class: "card-title" }, this.description, h("span", { class: "card-meta" }, this.type, this.model, this.tokens, this.cost, this.stepCount, this.capped)),
      this.header,
      this.latest,
    );
    this.prompt = h("p", { class: "card-prompt" });
    this.steps = h("ol", { class: "steps", "aria-label": "Steps" });
    this.loading = h("p", { class: "card-note", hidden: true });
    this.result = h("p", { class: "card-result", hidden: true });
    this.error = h("p", { class: "card-error", hidden: true });
    this.body = h("div", { class: "card-body", id: bodyId, hidden: true }, this.prompt, this.loading, this.steps, this.result, this.error);
    const description = () => this.description.textContent || id;
    this.stopButton = h("button", { type: "button", class: "card-stop", onclick: () => this.setStop("confirm") }, "Stop task");
    this.stopQuestion = h("span", { class: "card-stop-question" }, "Stop this task? The run goes on without it.");
    this.stopConfirm = h("button", { type: "button", class: "card-stop-confirm", onclick: () => onStop(this.id) }, "Stop");
    this.stopKeep = h("button", { type: "button", class: "card-stop-keep", onclick: () => this.setStop("idle") }, "Keep running");
    this.stopNote = h("span", { class: "card-stop-note", role: "status" });
    this.stopBox = h(
      "div",
      { class: "card-stop-box", hidden: true },
      this.stopButton,
      this.stopQuestion,
      this.stopConfirm,
      this.stopKeep,
      this.stopNote,
    );
    this.stopButton.setAttribute("aria-label", `Stop task: ${description()}`);
    this.root = h("article", { class: "task-card", dataset: { taskId: id } }, this.toggle, this.stopBox, this.body);
  }

  /** Moves the stop control to `stop` and shows it. */
  setStop(stop, error = "") {
    this.stop = stop;
    this.stopError = error;
    this.renderStop(true);
    if (stop === "confirm") this.stopConfirm.focus();
  }

  /** Shows the stop control while the task can be stopped, and what became of a stop. */
  renderStop(stoppable) {
    const asked = this.stop !== "idle";
    this.stopBox.hidden = !stoppable && this.stop !== "failed";
    this.stopButton.hidden = asked;
    this.stopButton.setAttribute("aria-label", `Stop task: ${this.description.textContent || this.id}`);
    this.stopQuestion.hidden = this.stop !== "confirm";
    this.stopConfirm.hidden = this.stop !== "confirm";
    this.stopKeep.hidden = this.stop !== "confirm";
    this.stopNote.hidden = this.stop !== "stopping" && this.stop !== "failed";
    setText(this.stopNote, this.stop === "stopping" ? "Stopping…" : `The task could not be stopped: ${this.stopError}`);
  }

  /**
   * Shows `view`; `backfill` is "idle", "loading" or "failed"; `stoppable` says whether
   * the task runs in the live run, so that it can be stopped alone.
   */
  update(view, prompt, expanded, backfill, stoppable = false) {
    this.expanded = expanded;
    if (view.status !== "in_progress" && this.stop !== "failed") this.stop = "idle";
    this.root.dataset.status = view.status;
    this.icon.className = `status-icon ${view.status === "in_progress" ? "spinner" : view.status}`;
    setText(this.statusWord, `${STATUS_WORDS[view.status]}: `);
    setText(this.description, view.description ?? view.id);
    setText(this.type, view.subagentType ?? "");
    setText(this.model, view.modelLabel ?? "");
    setText(this.tokens, view.tokenLabel ?? "");
    this.tokens.hidden = view.tokenLabel === null;
    setText(this.cost, view.costLabel ?? "");
    this.cost.hidden = view.costLabel === null;
    setText(this.latest, view.latestStep === null ? "" : `Latest: ${view.latestStep}`);
    this.latest.hidden = view.latestStep === null || expanded;
    setText(this.stepCount, `${view.stepCount} ${view.stepCount === 1 ? "step" : "steps"}`);
    setText(this.capped, view.stopReason === null ? "" : `capped: ${view.stopReason}`);
    this.capped.hidden = view.stopReason === null;
    setText(this.header, view.header);
    this.toggle.setAttribute("aria-expanded", String(expanded));
    this.renderStop(stoppable && view.status === "in_progress");
    this.body.hidden = !expanded;
    if (!expanded) return;

    setText(this.prompt, prompt ?? "");
    this.prompt.hidden = !prompt;
    this.loading.hidden = backfill === "idle";
    setText(
      this.loading,
      backfill === "loading" ? "Loading steps…" : "The steps could not be loaded. Collapse and expand the card to try again.",
    );
    this.renderSteps(view.steps);
    this.result.hidden = view.result === null;
    setText(this.result, view.result ?? "");
    this.error.hidden = view.status !== "failed";
    setText(this.error, view.error ?? "Subtask failed");
  }

  /** Appends new steps when the list only grew; rebuilds it otherwise. */
  renderSteps(steps) {
    const previous = this.renderedSteps;
    const grew = steps.length >= previous.length && previous.every((step, i) => steps[i] === step);
    const fragment = document.createDocumentFragment();
    if (!grew) this.steps.replaceChildren();
    for (const step of grew ? steps.slice(previous.length) : steps) fragment.append(stepRow(step));
    this.steps.append(fragment);
    this.renderedSteps = steps;
  }
}
