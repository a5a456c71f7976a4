// Summary statistics of recorded races: TTFA p50, IQR, p95 and n, and who won.

/** Fewest samples each statistic needs to mean something: a quartile needs a sample in each
 * quarter, a 95th percentile at least one sample above it. Below that it is null (shown "—"). */
export const MIN_SAMPLES = { p50: 1, iqr: 4, p95: 20 };

/** Linear-interpolated quantile (q in [0, 1]) of numbers; null for none. */
export function quantile(values, q) {
  const xs = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
  if (!xs.length) return null;
  const pos = (xs.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo);
}

/** {n, p25, p50, p75, p95} of the finite values; a statistic with too few samples is null. */
export function summary(values) {
  const xs = values.filter((v) => Number.isFinite(v));
  const n = xs.length;
  const iqr = n >= MIN_SAMPLES.iqr;
  return {
    n,
    p25: iqr ? quantile(xs, 0.25) : null,
    p50: quantile(xs, 0.5),
    p75: iqr ? quantile(xs, 0.75) : null,
    p95: n >= MIN_SAMPLES.p95 ? quantile(xs, 0.95) : null,
  };
}

/**
 * The winner of a recorded race: the lane with the lowest perceived TTFA among those that
 * finished, only when two or more finished and nobody stopped the race. A lone lane wins nothing.
 * @param {{stopped?: boolean, lanes: Object<string, {status: string, perceived_ttfa_ms: ?number}>}} run
 * @returns {?string} the lane's name
 */
export function winnerOf(run) {
  const lanes = Object.values(run.lanes);
  // Older records have no `stopped`: a lane interrupted mid-turn means the race was stopped.
  if (run.stopped || lanes.some((r) => r.status === "interrupted")) return null;
  const finished = Object.entries(run.lanes).filter(([, r]) => r.status === "done" && r.perceived_ttfa_ms !== null);
  if (finished.length < 2) return null;
  finished.sort((a, b) => a[1].perceived_ttfa_ms - b[1].perceived_ttfa_ms);
  return finished[0][0];
}

