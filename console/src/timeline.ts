// The arithmetic of an action's timeline, apart from the DOM: which bars an action's
// events make, where each begins and ends, and how times map to a drawing's width. The
// browser tests (events/console) check these rules through the bars' data attributes.

// Phase numbers, as flyte.core.v1.ActionPhase numbers them.
export const QUEUED = 1;
export const SUCCEEDED = 5;

/** A phase at or past SUCCEEDED ends an attempt. */
export function isTerminal(phase: number): boolean {
  return phase >= SUCCEEDED;
}

/** The executor's reasons the timeline shows apart (executor/api/v1). */
export const RETRYING = "Retrying";
export const WAITING_FOR_CACHE = "WaitingForCache";

/** One recorded event, reduced to what the timeline needs; at is in milliseconds. */
export interface Point {
  attempt: number;
  phase: number;
  version: number;
  at: number;
  reason: string;
}

/**
 * What a bar stands for: a phase, the backoff wait before a retried attempt starts (its
 * first phase, queued with reason Retrying), or a wait on another action's cache
 * reservation.
 */
export type BarKind = "phase" | "backoff" | "cache-wait";

/** One phase of one attempt, from its first event to the next phase's. */
export interface Bar {
  attempt: number;
  phase: number;
  kind: BarKind;
  start: number;
  /** end equals start for a terminal phase, which is an instant. */
  end: number;
  /** open is true for the phase the action is in now: it ends at now. */
  open: boolean;
  /** reason is the reason of the phase's newest event. */
  reason: string;
}

export interface Attempt {
  attempt: number;
  bars: Bar[];
}

export interface Timeline {
  start: number;
  end: number;
  attempts: Attempt[];
}

function byOccurrence(a: Point, b: Point): number {
  return a.attempt - b.attempt || a.at - b.at || a.phase - b.phase || a.version - b.version;
}

/**
 * build draws the bars of an action's events, as of now (milliseconds):
 * - each attempt is a row, in attempt order; events of one phase in a row (new versions
 *   of it) make one bar, which starts at the phase's first event;
 * - a bar ends where the next phase of its attempt starts; the last phase of an attempt
 *   that a later attempt replaced ends where that attempt starts; a terminal phase is an
 *   instant; the last phase of the last attempt, when not terminal, is open and ends now;
 * - a retried attempt's first phase, queued with reason Retrying, is its backoff wait;
 *   a phase with an event of reason WaitingForCache waits on a cache reservation.
 */
export function build(points: readonly Point[], now: number): Timeline {
  const sorted = [...points].sort(byOccurrence);
  const attempts: Attempt[] = [];
  for (const p of sorted) {
    let row = attempts[attempts.length - 1];
    if (!row || row.attempt !== p.attempt) {
      row = { attempt: p.attempt, bars: [] };
      attempts.push(row);
    }
    const last = row.bars[row.bars.length - 1];
    if (last && last.phase === p.phase) {
      last.reason = p.reason;
      if (p.reason === WAITING_FOR_CACHE) last.kind = "cache-wait";
      continue;
    }
    if (last) last.end = p.at;
    row.bars.push({
      attempt: p.attempt,
      phase: p.phase,
      kind: kindOf(p),
      start: p.at,
      end: p.at,
      open: false,
      reason: p.reason,
    });
  }
  attempts.forEach((row, i) => {
    const last = row.bars[row.bars.length - 1];
    if (isTerminal(last.phase)) return;
    const next = attempts[i + 1];
    if (next) {
      last.end = next.bars[0].start;
    } else {
      last.end = Math.max(now, last.start);
      last.open = true;
    }
  });
  const bars = attempts.flatMap((a) => a.bars);
  const start = bars.length ? Math.min(...bars.map((b) => b.start)) : now;
  const end = bars.length ? Math.max(...bars.map((b) => b.end)) : now;
  return { start, end, attempts };
}

/** isOpen reports whether the timeline has a bar that ends now: the action is not done. */
export function isOpen(t: Timeline): boolean {
  return t.attempts.some((a) => a.bars.some((b) => b.open));
}

function kindOf(p: Point): BarKind {
  if (p.phase === QUEUED && p.reason === RETRYING && p.attempt > 1) return "backoff";
  if (p.reason === WAITING_FOR_CACHE) return "cache-wait";
  return "phase";
}

/**
 * Scale maps times to x positions on a drawing width wide, keeping instants visible: every
 * bar is at least minWidth wide.
 */
export class Scale {
  constructor(
    readonly start: number,
    readonly end: number,
    readonly width: number,
    readonly minWidth = 3,
  ) {}

  x(t: number): number {
    const span = this.end - this.start;
    if (span <= 0) return 0;
    return ((t - this.start) / span) * this.width;
  }

  /** extent is a bar's x and width, the width at least minWidth and within the drawing. */
  extent(start: number, end: number): { x: number; width: number } {
    const x = Math.min(this.x(start), this.width - this.minWidth);
    const width = Math.max(this.x(end) - this.x(start), this.minWidth);
    return { x: Math.max(x, 0), width };
  }

  /** ticks are count + 1 evenly spaced times from start to end. */
  ticks(count: number): number[] {
    return Array.from({ length: count + 1 }, (_, i) => this.start + ((this.end - this.start) * i) / count);
  }
}

/** Where a bar is drawn: its x and width on a scale. */
export interface Extent {
  x: number;
  width: number;
}

/**
 * place lays one attempt's bars out on a scale: each where its times put it, at least
 * minWidth wide and within the drawing, and none before the end of the bar before it, so
 * a phase of an instant still shows and the next bar starts after it.
 */
export function place(bars: readonly Bar[], scale: Scale): Extent[] {
  let right = 0;
  return bars.map((bar) => {
    const e = scale.extent(bar.start, bar.end);
    const x = Math.min(Math.max(e.x, right), scale.width - scale.minWidth);
    const width = Math.max(e.x + e.width - x, scale.minWidth);
    right = x + width;
    return { x, width };
  });
}

/** duration says how long ms milliseconds are, to a person. */
export function duration(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} m ${String(Math.floor(s % 60)).padStart(2, "0")} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, "0")} m`;
}
