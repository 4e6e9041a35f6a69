// One run: its actions with their phase, attempts, duration, cache status and error; live,
// and the durations of the actions that run move on between events.

import type { Action } from "../gen/flyte/events/v1/events_pb";
import { ActionPhase } from "../gen/flyte/core/v1/phase_pb";
import { h, link, replace } from "../dom";
import { cacheLabel, errorKind, ms, phaseByName, phaseLabel, phaseName, phases, when } from "../format";
import { LiveActions } from "../live";
import { isTerminal } from "../timeline";
import { Clock, elapsedView } from "./clock";
import { clusterFilter, frame, phaseBadge } from "./frame";
import { redrawer } from "./redraw";

export function runPage(root: HTMLElement, project: string, domain: string, run: string, phaseFilter: string | null, cluster?: string): void {
  const f = frame(root, { project, domain, run });
  const filter = phaseByName(phaseFilter);
  let live: LiveActions;
  const draw = redrawer(() => {
    const now = Date.now();
    const all = [...live.actions.values()].sort((a, b) => ms(a.createdAt) - ms(b.createdAt) || (a.id?.action ?? "").localeCompare(b.id?.action ?? ""));
    const shown = filter ? all.filter((a) => a.phase === filter) : all;
    const filters = h(
      "p",
      { class: "filters" },
      "Phase: ",
      link(`all (${all.length})`, { project, domain, run, cluster }, filter ? {} : { class: "current" }),
      ...phases.flatMap((p) => {
        const n = all.filter((a) => a.phase === p.phase).length;
        return n || filter === p.phase
          ? [" · ", link(`${p.label} (${n})`, { project, domain, run, cluster, phase: p.name }, filter === p.phase ? { class: "current" } : {})]
          : [];
      }),
    );
    const clusters = new Set(all.map((a) => a.cluster));
    const columns = ["action", "phase", "attempts", "started", "duration", "cache", "task type", "reason or error"];
    replace(
      f.main,
      h("h1", {}, cluster ? `Run ${run} in ${cluster}` : `Run ${run}`),
      clusterFilter(clusters, cluster, { project, domain, run, phase: phaseFilter ?? undefined }),
      filters,
      shown.length
        ? h(
            "table",
            { id: "actions" },
            h(
              "thead",
              {},
              h("tr", {}, ...(clusters.size > 1 ? [...columns, "cluster"] : columns).map((c) => h("th", {}, c))),
            ),
            h("tbody", {}, ...shown.map((a) => actionRow(a, project, domain, run, now, clusters.size > 1))),
          )
        : h("p", { class: "empty" }, all.length ? "No action of this run is in this phase." : "No actions recorded for this run yet."),
    );
  }, new Clock(f.main));
  live = new LiveActions({ project, domain, run, cluster }, { changed: draw, status: f.status, failed: f.fail });
  draw();
  void live.run();
}

/** actionRow is one action's row; its link names the action's cluster, as another cluster may have one of its name. */
function actionRow(a: Action, project: string, domain: string, run: string, now: number, showCluster: boolean): HTMLElement {
  const action = a.id?.action ?? "";
  const done = isTerminal(a.phase);
  return h(
    "tr",
    { "data-action": action, "data-phase": phaseName(a.phase), "data-cluster": a.cluster },
    h("td", {}, link(action, { project, domain, run, action, cluster: a.cluster || undefined })),
    h("td", {}, phaseBadge(phaseName(a.phase), phaseLabel(a.phase))),
    h("td", { class: "num" }, a.attempt),
    h("td", {}, when(a.createdAt)),
    h("td", { class: "num" }, elapsedView(ms(a.createdAt), done ? ms(a.updatedAt) : undefined, now)),
    h("td", {}, cacheLabel(a.cacheStatus)),
    h("td", {}, a.taskType),
    h("td", { class: "why" }, ...why(a)),
    showCluster ? h("td", {}, a.cluster) : null,
  );
}

/** why is the action's error when it has one, else its reason. */
function why(a: Action): (Node | string)[] {
  const e = a.error;
  if (e && (e.code || e.message) && a.phase !== ActionPhase.SUCCEEDED) {
    return [h("span", { class: "error-kind" }, errorKind(e)), " ", h("code", {}, e.code), " ", clip(e.message, 200)];
  }
  return [a.reason];
}

export function clip(s: string, n: number): string {
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
}
