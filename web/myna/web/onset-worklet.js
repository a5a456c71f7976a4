// AudioWorklet tap on a received WebRTC stream: sample-accurate onset detection and levels.
//
// The processor keeps the last two seconds of input in a ring indexed by the AudioContext's
// frame counter (`currentFrame`), so the page can arm detection at a frame that has already
// been rendered by the time the "arm" message arrives. Messages:
//   page → tap: {type: "arm", id, fromFrame}   start detecting at context frame fromFrame
//               {type: "disarm", id?}
//               {type: "ping", t}                  clock calibration (answered with "pong")
//   tap → page: {type: "onset", id, frame}     context frame of the first audible sample
//               {type: "level", frame, peak, rms}   about every 10 ms, for meters
//               {type: "pong", t, frame}           the frame rendered next when a ping arrived
// The tap writes nothing to its output (silence); the page plays the stream via <audio>.

import { OnsetDetector } from "./onset.js";

const RING_SECONDS = 2;
const LEVEL_FRAMES = 512;

class OnsetTap extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ring = new Float32Array(Math.round(sampleRate * RING_SECONDS));
    this.started = false; // process() has run at least once
    this.end = 0; // context frame just after the newest sample in the ring
    this.armed = null; // {id, from, detector}
    this.levelPeak = 0;
    this.levelSq = 0;
    this.levelN = 0;
    this.port.onmessage = (e) => this.onMessage(e.data);
  }

  onMessage(msg) {
    if (msg.type === "arm") {
      const detector = new OnsetDetector(sampleRate);
      this.armed = { id: msg.id, from: Math.round(msg.fromFrame), detector };
      // Feed what the ring already holds from `from` on (the arm message comes a little late).
      const oldest = this.end - Math.min(this.end, this.ring.length);
      if (this.armed.from < oldest) this.armed.from = oldest;
      if (this.armed.from < this.end) this.feed(this.readRing(this.armed.from, this.end));
    } else if (msg.type === "disarm") {
      if (!this.armed || msg.id === undefined || msg.id === this.armed.id) this.armed = null;
    } else if (msg.type === "ping") {
      // The next sample to arrive from WebRTC is rendered at frame `end` (see lane.js).
      this.port.postMessage({ type: "pong", t: msg.t, frame: this.started ? this.end : null });
    }
  }

  readRing(from, to) {
    const n = to - from;
    const out = new Float32Array(n);
    const len = this.ring.length;
    for (let i = 0; i < n; i++) out[i] = this.ring[(from + i) % len];
    return out;
  }

  feed(block) {
    const a = this.armed;
    const onset = a.detector.push(block);
    if (onset !== null) {
      this.port.postMessage({ type: "onset", id: a.id, frame: a.from + onset });
      this.armed = null;
    }
  }

  process(inputs) {
    const input = inputs[0];
    const channel = input && input.length ? input[0] : null;
    const n = channel ? channel.length : 128;
    const start = currentFrame;
    // Keep the ring continuous even if a render quantum was skipped.
    if (start !== this.end) this.end = start;
    const len = this.ring.length;
    for (let i = 0; i < n; i++) {
      const v = channel ? channel[i] : 0;
      this.ring[(start + i) % len] = v;
      const a = v < 0 ? -v : v;
      if (a > this.levelPeak) this.levelPeak = a;
      this.levelSq += v * v;
    }
    this.end = start + n;
    this.started = true;
    this.levelN += n;
    if (this.armed && this.armed.from < this.end) {
      const from = Math.max(this.armed.from, start);
      this.feed(channel ? channel.subarray(from - start) : new Float32Array(this.end - from));
    }
    if (this.levelN >= LEVEL_FRAMES) {
      this.port.postMessage({ type: "level", frame: this.end, peak: this.levelPeak, rms: Math.sqrt(this.levelSq / this.levelN) });
      this.levelPeak = 0;
      this.levelSq = 0;
      this.levelN = 0;
    }
    return true;
  }
}

registerProcessor("myna-onset-tap", OnsetTap);
