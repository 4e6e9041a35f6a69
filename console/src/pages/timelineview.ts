// An action's timeline as a picture: a row per attempt, a bar per phase.

import { s } from "../dom";
import { phaseLabel, phaseName } from "../format";
import { Scale, duration, type Bar, type Timeline } from "../timeline";

const width = 960;
const labelWidth = 96;
const rowHeight = 30;
const barHeight = 20;
const axisHeight = 22;

const kindLabels = { phase: "", backoff: " (backoff before a retry)", "cache-wait": " (waiting on a cache reservation)" };

export function timelineView(t: Timeline): SVGElement {
  const plot = width - labelWidth - 8;
  const scale = new Scale(t.start, t.end, plot);
  const height = axisHeight + t.attempts.length * rowHeight + 4;
  const svg = s("svg", { id: "timeline", class: "timeline", viewBox: `0 0 ${width} ${height}`, width, height, role: "img" });
  svg.append(s("title", {}, `Phases of ${t.attempts.length} attempt(s) over ${duration(t.end - t.start)}`));
  for (const tick of scale.ticks(4)) {
    const x = labelWidth + scale.x(tick);
    svg.append(
      s("line", { class: "tick", x1: x, x2: x, y1: axisHeight - 4, y2: height }),
      s("text", { class: "axis", x: Math.min(x + 3, width - 60), y: axisHeight - 8 }, `+${duration(tick - t.start)}`),
    );
  }
  t.attempts.forEach((row, i) => {
    const y = axisHeight + i * rowHeight;
    const g = s("g", { class: "attempt", "data-attempt": row.attempt });
    g.append(s("text", { class: "label", x: 4, y: y + barHeight - 5 }, `attempt ${row.attempt}`));
    // A phase of an instant still shows: the next bar starts after it.
    let right = 0;
    for (const bar of row.bars) {
      const view = barView(bar, scale, y, t.start, right);
      right = view.right;
      g.append(view.el);
    }
    svg.append(g);
  });
  return svg;
}

function barView(bar: Bar, scale: Scale, y: number, origin: number, after: number): { el: SVGElement; right: number } {
  const e = scale.extent(bar.start, bar.end);
  const x = Math.min(Math.max(e.x, after), scale.width - scale.minWidth);
  const w = Math.max(e.x + e.width - x, scale.minWidth);
  const name = phaseName(bar.phase);
  const label = phaseLabel(bar.phase) + kindLabels[bar.kind];
  const took = bar.end > bar.start ? ` for ${duration(bar.end - bar.start)}${bar.open ? " so far" : ""}` : "";
  const g = s("g", {
    class: `bar phase-${name} kind-${bar.kind}${bar.open ? " open" : ""}`,
    "data-attempt": bar.attempt,
    "data-phase": name,
    "data-kind": bar.kind,
    "data-start": bar.start - origin,
    "data-end": bar.end - origin,
  });
  g.append(
    s("title", {}, `attempt ${bar.attempt}: ${label}${took}${bar.reason ? ` — ${bar.reason}` : ""}`),
    s("rect", { x: labelWidth + x, y, width: w, height: barHeight, rx: 2 }),
  );
  if (w > 70) {
    g.append(s("text", { class: "in-bar", x: labelWidth + x + 4, y: y + barHeight - 6 }, bar.kind === "phase" ? phaseLabel(bar.phase) : bar.kind));
  }
  return { el: g, right: x + w };
}

/** legend names the bars' colours and patterns. */
export function legend(): SVGElement {
  const items: [string, string][] = [
    ["phase-queued", "queued"],
    ["phase-waiting", "waiting"],
    ["phase-initializing", "initializing"],
    ["phase-running", "running"],
    ["phase-succeeded", "succeeded"],
    ["phase-failed", "failed"],
    ["kind-backoff", "backoff"],
    ["kind-cache-wait", "cache reservation"],
  ];
  const svg = s("svg", { class: "legend", viewBox: `0 0 ${width} 20`, width, height: 20 });
  items.forEach(([cls, text], i) => {
    const g = s("g", { class: `bar ${cls}` });
    g.append(s("rect", { x: i * 118, y: 4, width: 14, height: 12 }), s("text", { class: "axis", x: i * 118 + 18, y: 15 }, text));
    svg.append(g);
  });
  return svg;
}
