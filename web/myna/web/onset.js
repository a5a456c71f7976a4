// Audible-onset detection (the Coval/Gradium convention).
//
// "Audible" is the first 10 ms window, moved in 1 ms hops, whose mean-removed RMS exceeds 0.01
// of full scale. That window locates the onset to within its 10 ms (a loud sound starting at
// sample k already makes the window that begins ~9 ms before k audible). To report the first
// audible *sample*, we then take the first sample inside that window that deviates by more than
// the threshold from the quiet baseline, the mean of the window one hop earlier (which was not
// audible; for the very first window, its own mean). The result always lies inside the detected
// window; for a signal that starts abruptly it lands within a few samples of the true start
// (tested: within 1 ms), where the window start alone would read up to 10 ms early.
//
// Pure code, no DOM and no Web Audio: the same module runs on the page, in the AudioWorklet
// (web/onset-worklet.js) and in tests (`await import("/static/onset.js")` in page.evaluate).

export const WINDOW_MS = 10;
export const HOP_MS = 1;
export const THRESHOLD = 0.01;

/**
 * Streaming detector: feed blocks of mono float samples (full scale = 1.0) in order; the
 * first push that completes an audible window returns the onset's sample index, counted from
 * the first sample ever pushed. Windows start at multiples of the hop from that first sample.
 */
export class OnsetDetector {
  /**
   * @param {number} sampleRate Hz
   * @param {{threshold?: number, windowMs?: number, hopMs?: number}} [options]
   */
  constructor(sampleRate, options = {}) {
    this.sampleRate = sampleRate;
    this.threshold = options.threshold ?? THRESHOLD;
    this.win = Math.max(1, Math.round((sampleRate * (options.windowMs ?? WINDOW_MS)) / 1000));
    this.hop = Math.max(1, Math.round((sampleRate * (options.hopMs ?? HOP_MS)) / 1000));
    this.reset();
  }

  reset() {
    this.buf = new Float32Array(Math.max(4 * this.win, 4096));
    this.base = 0; // stream index of buf[0]
    this.len = 0; // valid samples in buf
    this.next = 0; // stream index where the next window starts
    this.onset = null; // stream index of the onset once found
    this.baseline = null; // mean of the last quiet window
  }

  /** Samples pushed so far. */
  get pushed() {
    return this.base + this.len;
  }

  /**
   * @param {ArrayLike<number>} block
   * @returns {number|null} the onset's stream index (also on later calls), or null
   */
  push(block) {
    if (this.onset !== null) return this.onset;
    this._append(block);
    const { win, hop, threshold } = this;
    const limit = threshold * threshold;
    const buf = this.buf;
    while (this.next + win <= this.base + this.len) {
      const s = this.next - this.base;
      let sum = 0;
      let sumSq = 0;
      for (let i = s; i < s + win; i++) {
        const v = buf[i];
        sum += v;
        sumSq += v * v;
      }
      const mean = sum / win;
      const power = sumSq / win - mean * mean; // mean-removed mean square
      if (power > limit) {
        const baseline = this.baseline ?? mean;
        let at = s;
        for (let i = s; i < s + win; i++) {
          if (Math.abs(buf[i] - baseline) > threshold) {
            at = i;
            break;
          }
        }
        this.onset = this.base + at;
        return this.onset;
      }
      this.baseline = mean;
      this.next += hop;
    }
    this._compact();
    return null;
  }

  _append(block) {
    const n = block.length;
    if (this.len + n > this.buf.length) {
      const grown = new Float32Array(Math.max(this.buf.length * 2, this.len + n));
      grown.set(this.buf.subarray(0, this.len));
      this.buf = grown;
    }
    this.buf.set(block, this.len);
    this.len += n;
  }

  _compact() {
    // Keep only what a future window needs (from the next window start on).
    const drop = this.next - this.base;
    if (drop > this.buf.length / 2) {
      this.buf.copyWithin(0, drop, this.len);
      this.len -= drop;
      this.base += drop;
    }
  }
}

/**
 * Index of the first audible sample of `samples`, or null when nothing is audible.
 *
 * @param {ArrayLike<number>} samples mono, full scale = 1.0
 * @param {number} sampleRate Hz
 * @param {number} [threshold] RMS threshold as a fraction of full scale
 * @returns {number|null}
 */
export function firstAudibleSample(samples, sampleRate, threshold = THRESHOLD) {
  return new OnsetDetector(sampleRate, { threshold }).push(samples);
}
