// The console's calls: the events service's read RPCs through connect-es (the Connect
// protocol with JSON, server streaming for WatchActions), on the console's own origin,
// with the viewer's token when the service wants one.

import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { EventsService } from "./gen/flyte/events/v1/events_pb";

/** The console's prefix; the API lives under it, on the same origin. */
export const base = "/console/";

const tokenKey = "flyte-console-token";

/** token is the bearer token kept for this browser session, if any. */
export function token(): string {
  return sessionStorage.getItem(tokenKey) ?? "";
}

export function setToken(t: string): void {
  if (t) sessionStorage.setItem(tokenKey, t);
  else sessionStorage.removeItem(tokenKey);
}

/**
 * takeTokenFromFragment takes a token handed over in the URL's fragment (make run prints
 * such a URL; a fragment never reaches a server or its logs) and removes it from the
 * address bar and the history. A tab holding no token, or this one, keeps it. A tab
 * holding another gets it back instead, for the page to ask before using it: a link
 * someone else sent must not silently sign the tab in as them.
 */
export function takeTokenFromFragment(): string {
  const t = new URLSearchParams(location.hash.slice(1)).get("token");
  if (!t) return "";
  history.replaceState(null, "", location.pathname + location.search);
  const held = token();
  if (held && held !== t) return t;
  setToken(t);
  return "";
}

const bearer: Interceptor = (next) => async (req) => {
  const t = token();
  if (t) req.header.set("Authorization", `Bearer ${t}`);
  return next(req);
};

const transport = createConnectTransport({
  baseUrl: new URL(base + "api", location.origin).href,
  interceptors: [bearer],
});

export const events = createClient(EventsService, transport);

/** What went wrong with a call, in the terms the pages show. */
export type Failure =
  | { kind: "token"; message: string } // no token, or one refused
  | { kind: "forbidden"; message: string }
  | { kind: "other"; message: string };

export function failure(err: unknown): Failure {
  const ce = ConnectError.from(err);
  switch (ce.code) {
    case Code.Unauthenticated:
      return {
        kind: "token",
        message: token()
          ? `The events service refused this token (${ce.rawMessage}). Paste another viewer's token.`
          : "The events service wants a token to show anything. Paste a viewer's token.",
      };
    case Code.PermissionDenied:
      return { kind: "forbidden", message: `This token may not read this: ${ce.rawMessage}` };
    default:
      return { kind: "other", message: `${Code[ce.code]}: ${ce.rawMessage}` };
  }
}

/** isAbort reports whether err only says that the caller stopped the call. */
export function isAbort(err: unknown): boolean {
  return ConnectError.from(err).code === Code.Canceled;
}

/** A span of a trace, as the events service's trace lookup gives it. */
export interface Span {
  spanId: string;
  parentId?: string;
  service: string;
  name: string;
  /** start and duration are in microseconds. */
  start: number;
  duration: number;
  error?: boolean;
  attributes?: Record<string, string>;
}

export interface Trace {
  traceId: string;
  /** spans are the first the page draws, of spanCount. */
  spans: Span[];
  spanCount?: number;
  /** uiUrl opens the trace in Jaeger's UI, where one is configured. */
  uiUrl?: string;
}

/** The traces of one action, or why there are none; busy is the seconds to wait before asking again. */
export type Traces = { traces: Trace[] } | { unavailable: string } | { busy: number } | { failed: Failure };

/**
 * actionTraces asks the events service for the action's traces, which it looks up in
 * Jaeger by the action's names once it has checked that the token may read the action.
 */
export async function actionTraces(
  id: { project: string; domain: string; run: string; action: string },
  cluster: string | undefined,
  signal: AbortSignal,
): Promise<Traces> {
  const q = new URLSearchParams(id);
  if (cluster !== undefined) q.set("cluster", cluster);
  const headers: Record<string, string> = {};
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  const resp = await fetch(`${base}api/traces?${q}`, { headers, signal });
  const body = (await resp.json().catch(() => ({}))) as { traces?: Trace[]; code?: string; message?: string };
  if (resp.ok) return { traces: body.traces ?? [] };
  const message = body.message ?? resp.statusText;
  switch (resp.status) {
    case 401:
      return { failed: failure(new ConnectError(message, Code.Unauthenticated)) };
    case 403:
      return { failed: failure(new ConnectError(message, Code.PermissionDenied)) };
    case 429:
      return { busy: retryAfter(resp.headers.get("Retry-After")) };
    case 404:
    case 502:
    case 503:
    case 504:
      return { unavailable: message };
    default:
      return { failed: { kind: "other", message: `${resp.status}: ${message}` } };
  }
}

/** retryAfter reads a Retry-After of seconds, kept between 1 and 30. */
function retryAfter(header: string | null): number {
  const seconds = Number(header);
  return Number.isFinite(seconds) ? Math.min(Math.max(seconds, 1), 30) : 2;
}
