// Small summary statistics for TTFA samples (DESIGN.md §4 reports p50, IQR, p95 and n).

/** Linear-interpolated quantile (q in [0, 1]) of numbers; null for none. */
export function quantile(values, q) {
  const xs = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
  if (!xs.length) return null;
  const pos = (xs.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo);
}

/** {n, p25, p50, p75, p95} of the finite values. */
export function summary(values) {
  const xs = values.filter((v) => Number.isFinite(v));
  return { n: xs.length, p25: quantile(xs, 0.25), p50: quantile(xs, 0.5), p75: quantile(xs, 0.75), p95: quantile(xs, 0.95) };
}
