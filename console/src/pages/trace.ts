// An action's trace as a waterfall of spans, from the events service's Jaeger lookup.

import type { Span, Trace } from "../api";
import { externalLink, h, s } from "../dom";
import { duration } from "../timeline";

const width = 960;
const nameWidth = 380;
const rowHeight = 18;
const maxSpans = 400;

/** ordered puts each span after its parent, children by start; depth is the nesting. */
function ordered(spans: Span[]): { span: Span; depth: number }[] {
  const ids = new Set(spans.map((x) => x.spanId));
  const children = new Map<string, Span[]>();
  const roots: Span[] = [];
  for (const sp of spans) {
    if (sp.parentId && ids.has(sp.parentId)) {
      const list = children.get(sp.parentId) ?? [];
      list.push(sp);
      children.set(sp.parentId, list);
    } else {
      roots.push(sp);
    }
  }
  const out: { span: Span; depth: number }[] = [];
  const visit = (sp: Span, depth: number) => {
    out.push({ span: sp, depth });
    for (const c of (children.get(sp.spanId) ?? []).sort((a, b) => a.start - b.start)) visit(c, depth + 1);
  };
  for (const r of roots.sort((a, b) => a.start - b.start)) visit(r, 0);
  return out;
}

export function traceView(t: Trace): HTMLElement {
  const rows = ordered(t.spans);
  const shown = rows.slice(0, maxSpans);
  // The events service sends the first spans of a large trace, and how many it has.
  const total = Math.max(t.spanCount ?? 0, t.spans.length);
  const start = Math.min(...t.spans.map((x) => x.start));
  const end = Math.max(...t.spans.map((x) => x.start + x.duration));
  const plot = width - nameWidth - 8;
  const at = (us: number) => nameWidth + (end > start ? ((us - start) / (end - start)) * plot : 0);
  const height = shown.length * rowHeight + 4;
  const svg = s("svg", { class: "waterfall", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "data-trace": t.traceId });
  shown.forEach(({ span, depth }, i) => {
    const y = i * rowHeight;
    const x = at(span.start);
    const w = Math.max(at(span.start + span.duration) - x, 2);
    const g = s("g", { class: `span${span.error ? " error" : ""}`, "data-span": span.spanId });
    g.append(
      s("title", {}, `${span.service}: ${span.name} — ${duration(span.duration / 1000)}${span.error ? " (error)" : ""}`),
      s("text", { class: "span-name", x: 4 + Math.min(depth, 12) * 12, y: y + rowHeight - 5 }, `${span.service}: ${span.name}`),
      s("rect", { x, y: y + 3, width: w, height: rowHeight - 6, rx: 1 }),
      s("text", { class: "axis", x: Math.min(x + w + 3, width - 50), y: y + rowHeight - 5 }, duration(span.duration / 1000)),
    );
    svg.append(g);
  });
  return h(
    "div",
    { class: "trace" },
    h(
      "p",
      {},
      `Trace ${t.traceId}: ${total} spans over ${duration((end - start) / 1000)}`,
      t.uiUrl ? " · " : null,
      t.uiUrl ? externalLink("open in Jaeger", t.uiUrl) : null,
    ),
    svg,
    total > shown.length ? h("p", { class: "note" }, `The first ${shown.length} spans are drawn.`) : null,
  );
}
