// A run's timeline as data: the lead's model turns and one bar per task on one time
// axis, from the events' `created_at` (the time each event happened, docs/events.md#envelope) and the
// run's task summaries. Pure functions: runview.mjs draws what they return.

const TIME = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:\d{2})$/;

/** Milliseconds since the epoch of an RFC 3339 time (any number of fraction digits), or null. */
export function parseTime(text) {
  if (typeof text !== "string") return null;
  const match = TIME.exec(text);
  if (match === null) return null;
  const millis = Date.parse(`${match[1]}${match[3]}`);
  if (Number.isNaN(millis)) return null;
  const fraction = match[2] === undefined ? 0 : Number(`0.${match[2]}`) * 1000;
  return millis + fraction;
}

/** A duration in words: "850 ms", "4.2 s", "3 min 5 s". */
export function formatDuration(ms) {
  if (!Number.isFinite(ms) || ms < 0) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  const seconds = Math.round(ms / 1000);
  return `${Math.floor(seconds / 60)} min ${seconds % 60} s`;
}

const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);

/** How a task bar is coloured: "completed", "failed" (failed, cancelled, timed out) or "running". */
export function barStatus(status) {
  if (status === "completed") return "completed";
  if (status === "running") return "running";
  return "failed";
}

/**
 * The timeline of one run: `{start, end, lead: [{start, end, index, tokens}], tasks: [{id,
 * description, subagentType, model, status, start, end, ticks: [time], usage, cost}]}`,
 * times in epoch milliseconds, tasks ordered by their start. A lead turn ends at its
 * `llm.ai.response` and began `latency_ms` earlier (else at the previous lead event); a
 * task runs from its start record to its end record, or to `now` while it runs; each
 * `subagent.step` is a tick on its task's bar.
 */
export function timelineModel({ run, events, tasks, now }) {
  const runStart = parseTime(run?.created_at);
  const active = run?.status === "pending" || run?.status === "running";
  const runEnd = active ? now : (parseTime(run?.updated_at) ?? now);
  const records = (Array.isArray(events) ? events : []).filter(isObject);
  const lead = [];
  let previous = runStart;
  for (const record of records) {
    const at = parseTime(record.created_at);
    if (at === null) continue;
    if (record.event_type === "llm.human.input" || record.event_type === "run.start") previous = at;
    if (record.event_type !== "llm.ai.response" || record.metadata?.caller !== "lead_agent") continue;
    const latency = record.metadata?.latency_ms;
    const start = typeof latency === "number" && latency >= 0 ? at - latency : (previous ?? at);
    const usage = record.metadata?.usage;
    lead.push({
      start,
      end: at,
      index: lead.length + 1,
      tokens: isObject(usage) && typeof usage.total_tokens === "number" ? usage.total_tokens : null,
    });
    previous = at;
  }
  const ticks = new Map();
  for (const record of records) {
    if (record.event_type !== "subagent.step") continue;
    const id = record.metadata?.task_id;
    const at = parseTime(record.created_at);
    if (typeof id !== "string" || at === null) continue;
    if (!ticks.has(id)) ticks.set(id, []);
    ticks.get(id).push(at);
  }
  const bars = (Array.isArray(tasks) ? tasks : [])
    .filter((task) => isObject(task) && parseTime(task.started_at) !== null)
    .map((task) => {
      const start = parseTime(task.started_at);
      const ended = parseTime(task.ended_at);
      return {
        id: task.task_id,
        description: task.description ?? task.task_id,
        subagentType: task.subagent_type ?? null,
        model: task.model_name ?? null,
        status: barStatus(task.status),
        start,
        end: ended ?? (active ? now : runEnd),
        ticks: (ticks.get(task.task_id) ?? []).sort((a, b) => a - b),
        usage: isObject(task.usage) ? task.usage : null,
        cost: isObject(task.cost) ? task.cost : null,
      };
    })
    .sort((a, b) => a.start - b.start);
  const times = [runStart, runEnd, ...lead.flatMap((t) => [t.start, t.end]), ...bars.flatMap((b) => [b.start, b.end])].filter(
    (t) => typeof t === "number" && Number.isFinite(t),
  );
  const start = times.length > 0 ? Math.min(...times) : 0;
  const end = times.length > 0 ? Math.max(...times) : 0;
  return { start, end, lead, tasks: bars };
}

/** Where `time` falls on the axis, from 0 to 100 (percent). */
export function axisPercent(time, model) {
  const span = model.end - model.start;
  if (span <= 0) return 0;
  return Math.min(100, Math.max(0, ((time - model.start) / span) * 100));
}
