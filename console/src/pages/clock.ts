// The durations of what still runs, moved on once a second between draws (events come
// when a phase changes, not as time passes). An element made by elapsedView shows how
// long it has been since its data-since; a page moves more (the timeline's bars) in a
// step of its own. One interval per page, running only while the page shows something
// that runs: a page of finished things does nothing between events.

import { h, setText } from "../dom";
import { elapsed } from "../format";

const every = 1000;

/**
 * elapsedView shows elapsed(start, end, now); while end is not known the page's clock
 * moves it on.
 */
export function elapsedView(start: number, end: number | undefined, now: number): HTMLElement {
  const running = !(end !== undefined && Number.isFinite(end)) && Number.isFinite(start);
  return h("span", { class: "elapsed", "data-since": running ? String(start) : undefined }, elapsed(start, end, now));
}

export class Clock {
  private timer: ReturnType<typeof setInterval> | undefined;

  /**
   * root holds what the clock moves on; step moves the page's own drawings to now and
   * reports whether any of them still runs.
   */
  constructor(
    private readonly root: Element,
    private readonly step: (now: number) => boolean = () => false,
  ) {}

  /** drawn is told after each draw: the clock runs while what is drawn runs. */
  drawn(): void {
    if (this.tick()) {
      this.timer ??= setInterval(() => {
        if (!this.tick()) this.stop();
      }, every);
    } else {
      this.stop();
    }
  }

  private stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /** tick moves everything shown on to now, and reports whether anything shown still runs. */
  private tick(): boolean {
    // What the page no longer shows (it failed, or went elsewhere) runs no more.
    if (!this.root.isConnected) return false;
    const now = Date.now();
    const shown = this.root.querySelectorAll<HTMLElement>("[data-since]");
    for (const el of shown) setText(el, elapsed(Number(el.dataset.since), undefined, now));
    const stepped = this.step(now);
    return shown.length > 0 || stepped;
  }
}
