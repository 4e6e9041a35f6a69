// One action: its state, its error, its timeline, its attempts' errors and logs, its
// cluster events, every event, and its trace; live, and while it runs its timeline and
// durations move on between events.

import type { Action, ActionEvent } from "../gen/flyte/events/v1/events_pb";
import type { ExecutionError } from "../gen/flyte/core/v1/error_pb";
import { actionTraces, events, failure, isAbort, type Traces } from "../api";
import { externalLink, h, replace, type Child } from "../dom";
import { cacheLabel, errorKind, ms, phaseLabel, phaseName, when } from "../format";
import { LiveActions } from "../live";
import { build, isOpen, isTerminal, RETRYING, type Point } from "../timeline";
import { Clock, elapsedView } from "./clock";
import { frame, phaseBadge, type Frame } from "./frame";
import { legend, timelineView, type TimelineView } from "./timelineview";
import { traceView } from "./trace";

interface Id {
  project: string;
  domain: string;
  run: string;
  action: string;
}

/** actionPage shows the action of that name of cluster, or of the one cluster that has one when cluster is unset. */
export function actionPage(root: HTMLElement, id: Id, cluster?: string): void {
  const f = frame(root, id);
  const top = h("div", { id: "action" }, h("p", { class: "empty" }, "loading"));
  const traceBox = h("section", { id: "trace" }, h("h2", {}, "Trace"), h("p", { class: "empty" }, "looking for the action's trace"));
  replace(f.main, top, traceBox);

  // The timeline drawn last and its events, which the clock moves on while it is open.
  let drawn: Drawn | undefined;
  const clock = new Clock(top, (now) => {
    if (!drawn) return false;
    const t = build(drawn.points, now);
    if (!isOpen(t)) return false;
    drawn.timeline.retime(t);
    return true;
  });
  let loading = false;
  let again = false;
  const load = async () => {
    if (loading) {
      again = true;
      return;
    }
    loading = true;
    try {
      do {
        again = false;
        const [action, evs] = await Promise.all([getAction(id, cluster), listEvents(id, cluster)]);
        const v = view(id, action, evs);
        replace(top, ...v.children);
        drawn = v.drawn;
        clock.drawn();
      } while (again);
    } catch (err) {
      if (!isAbort(err)) f.fail(failure(err));
    } finally {
      loading = false;
    }
  };
  const live = new LiveActions(
    { project: id.project, domain: id.domain, run: id.run, cluster },
    {
      changed: (key) => {
        if (key === undefined || isSelf(key)) void load();
      },
      status: f.status,
      failed: f.fail,
    },
  );
  void live.run();
  void loadTrace(id, cluster, traceBox, f);

  /** isSelf reports whether a changed action's key (live.ts) names this page's action. */
  function isSelf(key: string): boolean {
    const [c, run, action] = JSON.parse(key) as [string, string, string];
    return run === id.run && action === id.action && (cluster === undefined || c === cluster);
  }
}

async function getAction(id: Id, cluster?: string): Promise<Action | undefined> {
  const resp = await events.getAction({ id, cluster });
  return resp.action;
}

async function listEvents(id: Id, cluster?: string): Promise<ActionEvent[]> {
  const out: ActionEvent[] = [];
  let pageToken = "";
  do {
    const resp = await events.listActionEvents({ id, cluster, pageSize: 1000, pageToken });
    out.push(...resp.events);
    pageToken = resp.nextPageToken;
  } while (pageToken && out.length < 20000);
  return out;
}

interface Drawn {
  timeline: TimelineView;
  points: Point[];
}

function view(id: Id, a: Action | undefined, evs: ActionEvent[]): { children: Child[]; drawn?: Drawn } {
  if (!a) return { children: [h("p", { class: "empty" }, "No events recorded for this action.")] };
  const now = Date.now();
  const done = isTerminal(a.phase);
  const points = evs.map((e) => ({ attempt: e.attempt, phase: e.phase, version: e.version, at: ms(e.occurredAt), reason: e.reason }));
  const timeline = timelineView(build(points, now));
  const created = ms(a.createdAt);
  const facts: [string, Node | string][] = [
    ["phase", phaseBadge(phaseName(a.phase), phaseLabel(a.phase))],
    ["attempts", String(a.attempt)],
    ["task type", a.taskType],
    ["cluster", a.cluster],
    ["cache", cacheLabel(a.cacheStatus)],
    ["started", when(a.createdAt)],
    [done ? "took" : "running for", Number.isFinite(created) ? elapsedView(created, done ? ms(a.updatedAt) : undefined, now) : ""],
    ["reason", a.reason],
    ["message", a.message],
    ["outputs", a.outputsUri],
  ];
  const children = [
    h("h1", {}, `Action ${id.action}`),
    h("dl", { class: "facts" }, ...facts.filter(([, v]) => v !== "").flatMap(([k, v]) => [h("dt", {}, k), h("dd", { "data-fact": k }, v)])),
    a.error && (a.error.code || a.error.message) ? errorBox(a.error, done ? "The action failed" : "The last attempt failed") : null,
    h("section", {}, h("h2", {}, "Timeline"), timeline.el, legend()),
    h("section", { id: "attempts" }, h("h2", {}, "Attempts"), attemptsView(evs, now)),
    clusterEventsView(evs),
    eventsView(evs),
  ];
  return { children, drawn: { timeline, points } };
}

function errorBox(e: ExecutionError, title: string): HTMLElement {
  return h(
    "section",
    { id: "error", class: "error-box", role: "alert" },
    h("h2", {}, title),
    h("p", {}, h("span", { class: "error-kind", "data-kind": errorKind(e) }, errorKind(e)), " ", h("code", { class: "error-code" }, e.code)),
    h("pre", { class: "error-message" }, e.message),
  );
}

/** Each attempt's phases, how it ended (its error, from its own last event or from the retry that replaced it) and its logs. */
function attemptsView(evs: ActionEvent[], now: number): HTMLElement {
  const byAttempt = new Map<number, ActionEvent[]>();
  for (const e of evs) byAttempt.set(e.attempt, [...(byAttempt.get(e.attempt) ?? []), e]);
  const attempts = [...byAttempt.keys()].sort((x, y) => x - y);
  const rows = attempts.map((n, i) => {
    const own = byAttempt.get(n) ?? [];
    const last = own[own.length - 1];
    const next = byAttempt.get(attempts[i + 1] ?? -1)?.[0];
    const ended = isTerminal(last.phase) ? last : next?.reason === RETRYING ? next : undefined;
    const err = (isTerminal(last.phase) ? last.error : next?.reason === RETRYING ? next.error : undefined) ?? undefined;
    const start = ms(own[0].occurredAt);
    const end = ended ? ms(ended.occurredAt) : undefined;
    const links = new Map<string, string>();
    for (const e of own) for (const l of e.logLinks) links.set(l.uri, l.name);
    return h(
      "li",
      { "data-attempt": String(n) },
      h("strong", {}, `attempt ${n}`),
      ` — ${ended ? (isTerminal(last.phase) ? phaseLabel(last.phase) : "retried") : phaseLabel(last.phase)} after `,
      elapsedView(start, end, now),
      err && (err.code || err.message)
        ? h("span", { class: "attempt-error" }, ": ", h("span", { class: "error-kind" }, errorKind(err)), " ", h("code", {}, err.code), " ", err.message)
        : null,
      links.size ? h("span", { class: "logs" }, " · logs: ", ...[...links].flatMap(([uri, name], j) => [j ? ", " : "", externalLink(name, uri)])) : null,
    );
  });
  return h("ol", { class: "attempts" }, ...rows);
}

function clusterEventsView(evs: ActionEvent[]): HTMLElement | null {
  const rows = evs
    .flatMap((e) => e.clusterEvents.map((c) => ({ attempt: e.attempt, c })))
    .sort((x, y) => ms(x.c.occurredAt) - ms(y.c.occurredAt));
  if (!rows.length) return null;
  return h(
    "section",
    { id: "cluster-events" },
    h("h2", {}, "Cluster events"),
    h(
      "table",
      {},
      h("thead", {}, h("tr", {}, ...["time", "attempt", "object", "source", "type", "reason", "message", "count"].map((c) => h("th", {}, c)))),
      h(
        "tbody",
        {},
        ...rows.map(({ attempt, c }) =>
          h(
            "tr",
            { class: c.type === "Warning" ? "warning" : "" },
            h("td", {}, when(c.occurredAt)),
            h("td", { class: "num" }, attempt),
            h("td", {}, c.object),
            h("td", {}, c.source),
            h("td", {}, c.type),
            h("td", {}, c.reason),
            h("td", {}, c.message),
            h("td", { class: "num" }, c.count),
          ),
        ),
      ),
    ),
  );
}

function eventsView(evs: ActionEvent[]): HTMLElement {
  return h(
    "section",
    { id: "events" },
    h("h2", {}, "Events"),
    h(
      "table",
      {},
      h("thead", {}, h("tr", {}, ...["time", "attempt", "phase", "version", "cache", "reason", "message"].map((c) => h("th", {}, c)))),
      h(
        "tbody",
        {},
        ...evs.map((e) =>
          h(
            "tr",
            {},
            h("td", {}, when(e.occurredAt)),
            h("td", { class: "num" }, e.attempt),
            h("td", {}, phaseBadge(phaseName(e.phase), phaseLabel(e.phase))),
            h("td", { class: "num" }, e.version),
            h("td", {}, cacheLabel(e.cacheStatus)),
            h("td", {}, e.reason),
            h("td", { class: "message" }, e.message),
          ),
        ),
      ),
    ),
  );
}

/** How many times the trace is asked for while the service is busy with other lookups. */
const traceTries = 5;

/** askForTraces asks for the action's traces, and again after the wait a busy service names. */
async function askForTraces(id: Id, cluster: string | undefined, signal: AbortSignal, box: HTMLElement): Promise<Traces> {
  for (let tries = 1; ; tries++) {
    const result = await actionTraces(id, cluster, signal);
    if (!("busy" in result) || tries === traceTries) return result;
    replace(box, h("h2", {}, "Trace"), h("p", { class: "empty" }, "The events service is busy looking up other traces: asking again shortly."));
    await new Promise((resolve) => setTimeout(resolve, result.busy * 1000));
  }
}

async function loadTrace(id: Id, cluster: string | undefined, box: HTMLElement, f: Frame): Promise<void> {
  const stop = new AbortController();
  let result;
  try {
    result = await askForTraces(id, cluster, stop.signal, box);
  } catch (err) {
    replace(box, h("h2", {}, "Trace"), h("p", { class: "empty" }, `The trace could not be read: ${String(err)}`));
    return;
  }
  if ("failed" in result) {
    if (result.failed.kind === "token") f.fail(result.failed);
    replace(box, h("h2", {}, "Trace"), h("p", { class: "empty" }, result.failed.message));
    return;
  }
  if ("unavailable" in result) {
    replace(box, h("h2", {}, "Trace"), h("p", { class: "empty" }, result.unavailable));
    return;
  }
  if ("busy" in result) {
    replace(box, h("h2", {}, "Trace"), h("p", { class: "empty" }, "The events service is busy looking up other traces: reload the page to ask again."));
    return;
  }
  replace(
    box,
    h("h2", {}, "Trace"),
    ...(result.traces.length
      ? result.traces.map(traceView)
      : [h("p", { class: "empty" }, "Jaeger has no trace of this action (yet: spans arrive in batches).")]),
  );
}
