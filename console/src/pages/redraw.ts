// Redrawing a page at most once a frame however many updates arrive; between draws the
// page's clock moves on the durations of what runs.

import type { Clock } from "./clock";

export function redrawer(draw: () => void, clock: Clock): () => void {
  let pending = false;
  return () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      draw();
      clock.drawn();
    });
  };
}
