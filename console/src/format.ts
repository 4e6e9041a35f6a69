// Words and times as the pages show them.

import { timestampMs, type Timestamp } from "@bufbuild/protobuf/wkt";
import { CacheStatus } from "./gen/flyte/core/v1/cache_status_pb";
import { ExecutionError_Kind, type ExecutionError } from "./gen/flyte/core/v1/error_pb";
import { ActionPhase } from "./gen/flyte/core/v1/phase_pb";
import { duration } from "./timeline";

/** The phases in their order, with the short names URLs and CSS classes use. */
export const phases: readonly { phase: ActionPhase; name: string; label: string }[] = [
  { phase: ActionPhase.QUEUED, name: "queued", label: "queued" },
  { phase: ActionPhase.WAITING_FOR_RESOURCES, name: "waiting", label: "waiting for resources" },
  { phase: ActionPhase.INITIALIZING, name: "initializing", label: "initializing" },
  { phase: ActionPhase.RUNNING, name: "running", label: "running" },
  { phase: ActionPhase.SUCCEEDED, name: "succeeded", label: "succeeded" },
  { phase: ActionPhase.FAILED, name: "failed", label: "failed" },
  { phase: ActionPhase.ABORTED, name: "aborted", label: "aborted" },
  { phase: ActionPhase.TIMED_OUT, name: "timed-out", label: "timed out" },
];

export function phaseName(p: ActionPhase): string {
  return phases.find((x) => x.phase === p)?.name ?? "unknown";
}

export function phaseLabel(p: ActionPhase): string {
  return phases.find((x) => x.phase === p)?.label ?? "unknown";
}

/** phaseByName reads a phase filter from a URL; 0 when there is none. */
export function phaseByName(name: string | null): ActionPhase {
  return phases.find((x) => x.name === name)?.phase ?? ActionPhase.UNSPECIFIED;
}

const cacheLabels: Record<CacheStatus, string> = {
  [CacheStatus.UNSPECIFIED]: "",
  [CacheStatus.DISABLED]: "off",
  [CacheStatus.MISS]: "miss",
  [CacheStatus.HIT]: "hit",
  [CacheStatus.POPULATED]: "populated",
  [CacheStatus.PUT_FAILURE]: "put failed",
  [CacheStatus.SKIPPED]: "skipped",
};

export function cacheLabel(c: CacheStatus): string {
  return cacheLabels[c] ?? "";
}

export function errorKind(e: ExecutionError): string {
  switch (e.kind) {
    case ExecutionError_Kind.USER:
      return "user error";
    case ExecutionError_Kind.SYSTEM:
      return "system error";
    default:
      return "error";
  }
}

export function ms(t: Timestamp | undefined): number {
  return t ? timestampMs(t) : NaN;
}

/** when shows a time in the browser's zone as 2006-01-02 15:04:05. */
export function when(t: Timestamp | number | undefined): string {
  const v = typeof t === "number" ? t : ms(t);
  if (!Number.isFinite(v)) return "";
  const d = new Date(v);
  const two = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}

/** elapsed is how long from start to end, or to now while end is not known. */
export function elapsed(start: number, end: number | undefined, now: number): string {
  if (!Number.isFinite(start)) return "";
  return duration((end !== undefined && Number.isFinite(end) ? end : now) - start);
}
