// The runs of a project and domain, newest first, with how many of each run's actions are
// in each phase; live, and the durations of the runs that run move on between events.

import type { Action } from "../gen/flyte/events/v1/events_pb";
import { ActionPhase } from "../gen/flyte/core/v1/phase_pb";
import { h, link, replace } from "../dom";
import { ms, phaseByName, phases, when } from "../format";
import { LiveActions } from "../live";
import { isTerminal } from "../timeline";
import { Clock, elapsedView } from "./clock";
import { clusterFilter, frame, phaseBadge } from "./frame";
import { redrawer } from "./redraw";

interface Run {
  run: string;
  actions: Action[];
  created: number;
  updated: number;
  counts: Map<ActionPhase, number>;
}

function runsOf(actions: Iterable<Action>): Run[] {
  const runs = new Map<string, Run>();
  for (const a of actions) {
    const name = a.id?.run ?? "";
    let r = runs.get(name);
    if (!r) {
      r = { run: name, actions: [], created: Infinity, updated: -Infinity, counts: new Map() };
      runs.set(name, r);
    }
    r.actions.push(a);
    r.created = Math.min(r.created, ms(a.createdAt));
    r.updated = Math.max(r.updated, ms(a.updatedAt));
    r.counts.set(a.phase, (r.counts.get(a.phase) ?? 0) + 1);
  }
  return [...runs.values()].sort((a, b) => b.created - a.created || a.run.localeCompare(b.run));
}

export function runsPage(root: HTMLElement, project: string, domain: string, phaseFilter: string | null, cluster?: string): void {
  const f = frame(root, { project, domain });
  const filter = phaseByName(phaseFilter);
  let live: LiveActions;
  const draw = redrawer(() => {
    const now = Date.now();
    const all = runsOf(live.actions.values());
    const shown = filter ? all.filter((r) => r.counts.has(filter)) : all;
    const filters = h(
      "p",
      { class: "filters" },
      "Phase: ",
      link(`all (${all.length})`, { project, domain, cluster }, filter ? {} : { class: "current" }),
      ...phases.flatMap((p) => {
        const n = all.filter((r) => r.counts.has(p.phase)).length;
        return [" · ", link(`${p.label} (${n})`, { project, domain, cluster, phase: p.name }, filter === p.phase ? { class: "current" } : {})];
      }),
    );
    const rows = shown.map((r) => {
      const done = r.actions.every((a) => isTerminal(a.phase));
      return h(
        "tr",
        { "data-run": r.run },
        h("td", {}, link(r.run, { project, domain, cluster, run: r.run })),
        h("td", {}, when(r.created)),
        h("td", { class: "counts" }, ...phaseCounts(r.counts)),
        h("td", { class: "num" }, r.actions.length),
        h("td", { class: "num" }, elapsedView(r.created, done ? r.updated : undefined, now)),
        h("td", {}, when(r.updated)),
      );
    });
    replace(
      f.main,
      h("h1", {}, cluster ? `Runs of ${project} · ${domain} in ${cluster}` : `Runs of ${project} · ${domain}`),
      clusterFilter(
        [...live.actions.values()].map((a) => a.cluster),
        cluster,
        { project, domain, phase: phaseFilter ?? undefined },
      ),
      filters,
      rows.length
        ? h(
            "table",
            { id: "runs" },
            h("thead", {}, h("tr", {}, ...["run", "started", "actions by phase", "actions", "duration", "last change"].map((c) => h("th", {}, c)))),
            h("tbody", {}, ...rows),
          )
        : h("p", { class: "empty" }, live.actions.size ? "No run has an action in this phase." : "No runs yet: they appear here as the executor reports them."),
      live.truncated ? h("p", { class: "note" }, "Only the newest actions are listed; older runs may be missing.") : null,
    );
  }, new Clock(f.main));
  live = new LiveActions({ project, domain, cluster }, { changed: draw, status: f.status, failed: f.fail });
  draw();
  void live.run();
}

/** phaseCounts are a badge per phase present, in the phases' order. */
export function phaseCounts(counts: Map<ActionPhase, number>): HTMLElement[] {
  return phases.filter((p) => counts.get(p.phase)).map((p) => phaseBadge(p.name, `${counts.get(p.phase)} ${p.label}`));
}
