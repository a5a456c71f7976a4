// Gaps: where a lane's audio paused mid-turn. The worker reports the pauses it made at word or
// clause boundaries while waiting for synthesis (turn_done.gaps, [audio position ms, duration ms]
// each); this page also finds long silences in the audio it received, so a pause shows even when
// the worker does not say (an older worker, or a stall after it sent the audio).

/** Silences shorter than this are speech: Piper's own pauses between clauses and sentences were
 * at most 0.37 s on the page's presets (measured on whole-reply synthesis). */
export const LONG_SILENCE_MS = 500;

/**
 * Long silences between audible stretches of received audio.
 * @param {Array<[number, number]>} levels [ms since the turn's first chunk was sent, peak 0..1]
 *   per level window, in time order
 * @param {{fromMs: number, windowMs: number, quiet?: number, minMs?: number}} options
 *   fromMs: ignore audio before this (the perceived onset); windowMs: one level window's length;
 *   quiet: peaks below it are silence; minMs: shortest silence reported
 * @returns {Array<[number, number]>} [start ms, duration ms] of each silence, on the same clock
 */
export function longSilences(levels, { fromMs, windowMs, quiet = 0.003, minMs = LONG_SILENCE_MS }) {
  const out = [];
  let lastLoud = null; // end of the last audible window
  for (const [t, peak] of levels) {
    if (t < fromMs || peak < quiet) continue;
    const start = t - windowMs / 2;
    if (lastLoud !== null && start - lastLoud >= minMs) out.push([lastLoud, start - lastLoud]);
    lastLoud = t + windowMs / 2;
  }
  return out;
}

/**
 * The worker's gaps placed on the received timeline: each gap starts at its audio position plus
 * the gaps before it, counted from the turn's first audible sample.
 * @param {Array<[number, number]>} gaps turn_done.gaps: [audio position ms, duration ms]
 * @param {number} onsetMs the turn's perceived TTFA (ms since the first chunk was sent)
 * @returns {Array<[number, number]>} [start ms, duration ms] since the first chunk was sent
 */
export function placeGaps(gaps, onsetMs) {
  let before = 0;
  return gaps.map(([at, duration]) => {
    const placed = [onsetMs + at + before, duration];
    before += duration;
    return placed;
  });
}
