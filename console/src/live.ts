// Actions kept live: listed once, then updated from WatchActions as events are recorded,
// watched again (and listed again) whenever the stream ends, the way docs/events.md asks
// clients to resume.

import type { Action } from "./gen/flyte/events/v1/events_pb";
import { events, failure, isAbort, type Failure } from "./api";
import { isTerminal } from "./timeline";
import { ms } from "./format";

export interface Scope {
  project: string;
  domain: string;
  run?: string;
  /** cluster, when set, keeps only that cluster's actions (the watch carries every cluster's). */
  cluster?: string;
}

export type Status = "connecting" | "live" | "reconnecting";

export interface Listener {
  /** changed is called after actions changed, with the key of the action that did (none after a listing). */
  changed(key?: string): void;
  status(s: Status, detail?: string): void;
  /** failed is called when the token cannot read the scope; the actions stop. */
  failed(f: Failure): void;
}

/** The most actions listed; the page says when there are more. */
const maxListed = 5000;
const pageSize = 1000;

/** key names an action: two clusters' actions of one name are two actions. */
export function key(a: Action): string {
  return JSON.stringify([a.cluster, a.id?.run, a.id?.action]);
}

/** newer reports whether a is a later state of its action than b, as the service folds them. */
function newer(a: Action, b: Action): boolean {
  const rank = (x: Action) => (isTerminal(x.phase) ? 100 : x.phase);
  const ka = [a.attempt, rank(a), a.version, ms(a.updatedAt)];
  const kb = [b.attempt, rank(b), b.version, ms(b.updatedAt)];
  for (let i = 0; i < ka.length; i++) if (ka[i] !== kb[i]) return ka[i] > kb[i];
  return false;
}

/**
 * open holds the streams of this page. A page left for another may stay in the browser's
 * back-forward cache with its streams open; over HTTP/1.1 (the console's plain HTTP on
 * the loopback) six such pages would hold every connection the browser allows the
 * origin, and the next page would wait for one forever. So the streams end when the page
 * is hidden, and a page shown again from that cache starts over.
 */
const open = new Set<LiveActions>();
addEventListener("pagehide", () => {
  for (const l of open) l.close();
});
addEventListener("pageshow", (e) => {
  if ((e as PageTransitionEvent).persisted) location.reload();
});

export class LiveActions {
  readonly actions = new Map<string, Action>();
  /** truncated is set when the listing stopped at maxListed actions. */
  truncated = false;
  private readonly stop = new AbortController();

  constructor(
    private readonly scope: Scope,
    private readonly listener: Listener,
  ) {
    open.add(this);
  }

  close(): void {
    open.delete(this);
    this.stop.abort();
  }

  private put(a: Action): boolean {
    if (this.scope.cluster !== undefined && a.cluster !== this.scope.cluster) return false;
    const k = key(a);
    const old = this.actions.get(k);
    if (old && !newer(a, old)) return false;
    this.actions.set(k, a);
    return true;
  }

  /** run watches, lists once the watch is established, and starts over when it ends. */
  async run(): Promise<void> {
    let delay = 500;
    while (!this.stop.signal.aborted) {
      const attempt = new AbortController();
      const onStop = () => attempt.abort();
      this.stop.signal.addEventListener("abort", onStop);
      try {
        await this.watchAndList(attempt.signal);
        delay = 500;
        this.listener.status("reconnecting", "the watch ended");
      } catch (err) {
        if (this.stop.signal.aborted || isAbort(err)) return;
        const f = failure(err);
        if (f.kind !== "other") {
          this.listener.failed(f);
          return;
        }
        this.listener.status("reconnecting", f.message);
      } finally {
        attempt.abort();
        this.stop.signal.removeEventListener("abort", onStop);
      }
      await sleep(delay, this.stop.signal);
      delay = Math.min(delay * 2, 15000);
    }
  }

  private async watchAndList(signal: AbortSignal): Promise<void> {
    let established!: () => void;
    const watching = new Promise<void>((resolve) => (established = resolve));
    const stream = events.watchActions(
      { project: this.scope.project, domain: this.scope.domain, run: this.scope.run ?? "" },
      { signal, onHeader: () => established() },
    );
    const iterator = stream[Symbol.asyncIterator]();
    // The first next() sends the request; its headers say the watch is in place, so a
    // listing after them misses nothing.
    const first = iterator.next();
    await Promise.race([watching, first.then(() => undefined)]);
    await this.list(signal);
    this.listener.status("live");
    for (let r = await first; !r.done; r = await iterator.next()) {
      const a = r.value.action;
      if (a && this.put(a)) this.listener.changed(key(a));
    }
  }

  private async list(signal: AbortSignal): Promise<void> {
    let pageToken = "";
    let listed = 0;
    do {
      const resp = await events.listActions(
        { project: this.scope.project, domain: this.scope.domain, run: this.scope.run ?? "", cluster: this.scope.cluster, pageSize, pageToken },
        { signal },
      );
      for (const a of resp.actions) this.put(a);
      listed += resp.actions.length;
      pageToken = resp.nextPageToken;
    } while (pageToken && listed < maxListed);
    this.truncated = pageToken !== "";
    this.listener.changed();
  }
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      resolve();
    });
  });
}
