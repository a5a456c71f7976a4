// The race history as a picture to share: perceived TTFA per lane, the median as a bar and the
// interquartile range (p25–p75) as a whisker, one row per lane, fastest first. Pure SVG text,
// so it needs no canvas and opens anywhere.

const ROW = 34; // px per lane
const LABEL = 190; // px for the lane names
const PLOT = 460; // px for the bars
const VALUE = 130; // px for the figures
const TOP = 54;
const BOTTOM = 40;

const escape = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

/** A tick step for an axis up to `max` ms: about five ticks of 1, 2 or 5 × 10^k. */
function tickStep(max) {
  const raw = max / 5;
  const mag = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
}

/**
 * @param {Array<{title: string, color: string, n: number, p50: number|null, p25: number|null,
 *   p75: number|null}>} lanes  one per lane (ms); lanes without a median are left out
 * @param {{title?: string, note?: string}} [labels]
 * @returns {string} an SVG document
 */
export function ttfaChart(lanes, labels = {}) {
  const rows = lanes.filter((l) => Number.isFinite(l.p50)).sort((a, b) => a.p50 - b.p50);
  const width = LABEL + PLOT + VALUE;
  const height = TOP + Math.max(1, rows.length) * ROW + BOTTOM;
  const max = Math.max(100, ...rows.map((l) => (Number.isFinite(l.p75) ? l.p75 : l.p50))) * 1.05;
  const step = tickStep(max);
  const x = (ms) => LABEL + (ms / max) * PLOT;
  const out = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, sans-serif" font-size="13">`,
    `<rect width="100%" height="100%" fill="#ffffff"/>`,
    `<text x="16" y="24" font-size="16" font-weight="600" fill="#17191c">${escape(labels.title || "Perceived time to first audio")}</text>`,
    `<text x="16" y="42" fill="#5d636b">${escape(labels.note || "median (bar) and p25–p75 (whisker) over the races, ms")}</text>`,
  ];
  for (let t = 0; t <= max; t += step) {
    out.push(`<line x1="${x(t)}" x2="${x(t)}" y1="${TOP - 4}" y2="${height - BOTTOM}" stroke="#ececea"/>`);
    out.push(`<text x="${x(t)}" y="${height - BOTTOM + 16}" text-anchor="middle" fill="#5d636b">${t}</text>`);
  }
  rows.forEach((l, i) => {
    const y = TOP + i * ROW;
    const mid = y + ROW / 2;
    out.push(`<text x="${LABEL - 10}" y="${mid + 4}" text-anchor="end" fill="#17191c">${escape(l.title)}</text>`);
    out.push(`<rect x="${LABEL}" y="${y + 8}" width="${Math.max(1, x(l.p50) - LABEL)}" height="${ROW - 16}" rx="3" fill="${escape(l.color)}" opacity="0.85"/>`);
    if (Number.isFinite(l.p25) && Number.isFinite(l.p75)) {
      out.push(`<line x1="${x(l.p25)}" x2="${x(l.p75)}" y1="${mid}" y2="${mid}" stroke="#17191c" stroke-width="2"/>`);
      for (const v of [l.p25, l.p75]) out.push(`<line x1="${x(v)}" x2="${x(v)}" y1="${mid - 6}" y2="${mid + 6}" stroke="#17191c" stroke-width="2"/>`);
    }
    const iqr = Number.isFinite(l.p25) ? ` (${Math.round(l.p25)}–${Math.round(l.p75)})` : "";
    out.push(`<text x="${LABEL + PLOT + 10}" y="${mid + 4}" fill="#17191c"><tspan font-weight="600">${Math.round(l.p50)} ms</tspan>${escape(iqr)} n=${l.n}</text>`);
  });
  out.push("</svg>");
  return out.join("\n");
}
