// An action's timeline as a picture: a row per attempt, a bar per phase; while the action
// runs, moved on in place (retime) as time passes.

import { s, setAttrs, setText } from "../dom";
import { phaseLabel, phaseName } from "../format";
import { Scale, duration, place, type Bar, type Extent, type Timeline } from "../timeline";

const width = 960;
const labelWidth = 96;
const rowHeight = 30;
const barHeight = 20;
const axisHeight = 22;
const tickCount = 4;

const kindLabels = { phase: "", backoff: " (backoff before a retry)", "cache-wait": " (waiting on a cache reservation)" };

/** A drawn timeline, which can be moved on to a later now without being drawn again. */
export interface TimelineView {
  el: SVGElement;
  /**
   * retime moves the drawing to t, built from the same events at another now: the bars
   * stay the same elements and take their new places, widths and texts.
   */
  retime(t: Timeline): void;
}

interface BarElements {
  g: SVGElement;
  title: SVGElement;
  rect: SVGElement;
  text: SVGElement;
}

export function timelineView(t: Timeline): TimelineView {
  const plot = width - labelWidth - 8;
  const height = axisHeight + t.attempts.length * rowHeight + 4;
  const svg = s("svg", { id: "timeline", class: "timeline", viewBox: `0 0 ${width} ${height}`, width, height, role: "img" });
  const title = s("title");
  svg.append(title);
  const ticks = Array.from({ length: tickCount + 1 }, () => ({
    line: s("line", { class: "tick", y1: axisHeight - 4, y2: height }),
    label: s("text", { class: "axis", y: axisHeight - 8 }),
  }));
  for (const tick of ticks) svg.append(tick.line, tick.label);
  const bars: BarElements[] = [];
  t.attempts.forEach((row, i) => {
    const y = axisHeight + i * rowHeight;
    const g = s("g", { class: "attempt", "data-attempt": row.attempt });
    g.append(s("text", { class: "label", x: 4, y: y + barHeight - 5 }, `attempt ${row.attempt}`));
    for (let j = 0; j < row.bars.length; j++) {
      const b: BarElements = {
        g: s("g"),
        title: s("title"),
        rect: s("rect", { y, height: barHeight, rx: 2 }),
        text: s("text", { class: "in-bar", y: y + barHeight - 6 }),
      };
      b.g.append(b.title, b.rect, b.text);
      g.append(b.g);
      bars.push(b);
    }
    svg.append(g);
  });

  const retime = (t: Timeline) => {
    const scale = new Scale(t.start, t.end, plot);
    setText(title, `Phases of ${t.attempts.length} attempt(s) over ${duration(t.end - t.start)}`);
    scale.ticks(tickCount).forEach((time, i) => {
      const x = labelWidth + scale.x(time);
      setAttrs(ticks[i].line, { x1: x, x2: x });
      setAttrs(ticks[i].label, { x: Math.min(x + 3, width - 60) });
      setText(ticks[i].label, `+${duration(time - t.start)}`);
    });
    let i = 0;
    for (const row of t.attempts) {
      place(row.bars, scale).forEach((extent, j) => drawBar(bars[i++], row.bars[j], extent, t.start));
    }
  };
  retime(t);
  return { el: svg, retime };
}

function drawBar(b: BarElements, bar: Bar, e: Extent, origin: number): void {
  const name = phaseName(bar.phase);
  const label = phaseLabel(bar.phase) + kindLabels[bar.kind];
  const took = bar.end > bar.start ? ` for ${duration(bar.end - bar.start)}${bar.open ? " so far" : ""}` : "";
  setAttrs(b.g, {
    class: `bar phase-${name} kind-${bar.kind}${bar.open ? " open" : ""}`,
    "data-attempt": bar.attempt,
    "data-phase": name,
    "data-kind": bar.kind,
    "data-start": bar.start - origin,
    "data-end": bar.end - origin,
  });
  setText(b.title, `attempt ${bar.attempt}: ${label}${took}${bar.reason ? ` — ${bar.reason}` : ""}`);
  setAttrs(b.rect, { x: labelWidth + e.x, width: e.width });
  // A bar too narrow for its name shows none.
  setAttrs(b.text, { x: labelWidth + e.x + 4, display: e.width > 70 ? "inline" : "none" });
  setText(b.text, bar.kind === "phase" ? phaseLabel(bar.phase) : bar.kind);
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
