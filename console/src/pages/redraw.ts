// Redrawing a page at most once a frame however many updates arrive, and every few
// seconds besides, so that the durations of what runs move on.

export function redrawer(draw: () => void): () => void {
  let pending = false;
  const schedule = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      draw();
    });
  };
  setInterval(schedule, 5000);
  return schedule;
}
