// What the history view picks from its rows (pure, so it is tested without a browser).

// The runs the comparison of two runs' curves starts on, out of ``candidates`` (newest first): the
// newest that reported metrics, so it opens on curves, then the newest of the others.
export function firstCompared(candidates) {
  const reported = candidates.filter((r) => Object.keys(r.metrics ?? {}).length > 0);
  return [...reported, ...candidates.filter((r) => !reported.includes(r))].slice(0, 2);
}
