// One lane: a WebRTC session with the worker (one engine), its audio tap, and its turns.
//
// The latency race (app.js) starts several lanes at the same instant; everything per-session
// lives here and the page only renders what lanes report. Lanes share
// one AudioContext (and so one clock), which keeps their perceived TTFAs comparable.
//
// Events (CustomEvent, payload in `detail`):
//   "state"  {state, message?}   state: idle | connecting | connected | engine-missing | failed | closed
//   "ready"  {engines, engine, sample_rate}
//   "turn"   {turn}              a turn changed (see newTurn() for its fields)
//   "word"   {turn, word, start_ms}
//   "level"  {peak, rms}         about every 10 ms while connected
//   "error"  {code, message, turn_id?}
//
// How perceived TTFA is measured
// ---------------------------------------------
// The received MediaStream plays through an <audio> element (Chromium decodes only what it
// plays) and also feeds an AudioWorklet tap (onset-worklet.js) on one shared 48 kHz
// AudioContext. Every sample the tap sees has an exact index on the context's frame counter.
//   1. Send: t_send = performance.now() as the first text chunk is handed to the data channel.
//      It is placed on the context's render clock:
//        send_frame = sr * (ts.contextTime + (t_send − ts.performanceTime) / 1000 + lead)
//      ts = ctx.getOutputTimestamp() maps the output clock to performance.now(); `lead` is how far
//      rendering runs ahead of the output, measured at connect by calibrateLead(): pings posted
//      to the tap at a known performance.now() come back with the frame the tap renders next
//      (the frame a WebRTC sample arriving at that instant gets), the minimum over 16 pings.
//      Without a calibration it falls back to ctx.baseLatency + ctx.outputLatency.
//   2. The tap is armed at send_frame (it keeps 2 s of history, so the late arm message loses
//      nothing) and runs OnsetDetector (onset.js) from there: first 10 ms window, 1 ms hop, mean
//      removed, RMS > 0.01 of full scale, refined to the first sample of that window deviating
//      from the quiet baseline by more than 0.01.
//   3. perceived_ttfa_ms = (onset_frame − send_frame) / sr × 1000.
// Error bound: the onset's place in the stream is exact to a sample (0.02 ms; the detector is
// within 1 ms of a sharp onset). A sample arriving from WebRTC waits for the next audio callback
// to be rendered, so the reading is late by 0 to one callback period (10 ms in Chromium on Linux,
// 480 frames; the minimum-of-pings calibration removes that wait from the send side), plus
// ~±1 ms of getOutputTimestamp jitter: true ≤ reading ≤ true + 10 ms (+1 ms). The reading
// includes everything up to the page's audio graph (network, Chromium's jitter buffer, Opus
// decode, the WebRTC→Web Audio FIFO); the output device's latency after the graph is excluded.
// Cross-check on loopback: onsets read 25–42 ms after the RTP receiver's own
// getSynchronizationSources() audioLevel rose, the range measured for an analyser.

import { tokenChunks } from "./tokens.js";
import { askForToken, authHeaders } from "./auth.js";
import { THRESHOLD } from "./onset.js";

export const SAMPLE_RATE = 48000;
const GATHER_TIMEOUT_MS = 3000;
const NO_ONSET_GRACE_MS = 1500;
// A heard turn is over once its lane has been quiet this long after turn_done: the event comes
// when the worker hands out the last frame, while that audio is still in the network and the
// jitter buffer (longer on a busy host). A race started before then would hear the old tail
// as the new turn's onset.
const QUIET_AFTER_MS = 250;
const TAIL_LIMIT_MS = 5000; // ...or this long after turn_done, whatever the tap hears

let workletModules = new WeakMap(); // AudioContext → Promise of addModule

/** The AudioContext all lanes share (created on first use; resume it from a user gesture). */
let sharedContext = null;
export function audioContext() {
  if (!sharedContext) sharedContext = new AudioContext({ sampleRate: SAMPLE_RATE, latencyHint: "interactive" });
  return sharedContext;
}

/** Load the onset tap's worklet module into `ctx` once (a Promise). */
export function loadWorklet(ctx) {
  if (!ctx.audioWorklet) return Promise.reject(new Error("AudioWorklet unavailable"));
  if (!workletModules.has(ctx)) workletModules.set(ctx, ctx.audioWorklet.addModule(new URL("./onset-worklet.js", import.meta.url)));
  return workletModules.get(ctx);
}

let turnCounter = 0;
export function newTurnId() {
  turnCounter += 1;
  return `t${Date.now().toString(36)}${turnCounter}`;
}

export function newTurn(id, text) {
  return {
    id,
    text,
    status: "sending", // sending | speaking | done | interrupted | error
    sentAt: null, // performance.now() of the first chunk
    sendFrame: null,
    serverTtfaMs: null,
    preRollMs: null,
    perceivedTtfaMs: null,
    audioMs: null,
    underruns: null, // starvation inside a chunk (a cut word), from turn_done
    gapMs: null, // {count, total, longest}: pauses at word or clause boundaries, from turn_done (newer workers)
    gaps: null, // [[audio position ms, duration ms], ...] of those pauses (newer workers)
    jitterBufferMs: null, // mean time this turn's samples waited in the browser's jitter buffer (WebRTC lanes)
    words: [],
    error: null,
  };
}

export class Lane extends EventTarget {
  /**
   * @param {{engine?: string, voice?: string, label?: string, baseUrl?: string, offerPath?: string,
   *          session?: object, muted?: boolean, noOnsetGraceMs?: number, quietAfterMs?: number,
   *          tailLimitMs?: number}} [options]
   *   session: more session defaults for the offer's request_data (e.g. {phrase_cache: false}).
   *   offerPath: where the offer goes under baseUrl (default "/api/offer"; the Pipecat lane's is
   *   "/api/pipecat/offer"). noOnsetGraceMs: how long after turn_done a turn with nothing heard
   *   yet still waits for its onset (default 1500 ms); quietAfterMs and tailLimitMs: a heard turn
   *   is final once the lane has been quiet quietAfterMs after turn_done, or tailLimitMs after it
   *   (defaults 250 and 5000 ms). A peer that reports its end before its transport has sent the
   *   audio (Pipecat's turn_done comes when its TTS stops, with seconds of audio still queued)
   *   needs all three longer.
   */
  constructor(options = {}) {
    super();
    this.engine = options.engine || null;
    this.voice = options.voice || null;
    this.label = options.label || "lane";
    this.baseUrl = options.baseUrl || "";
    this.state = "idle";
    this.pc = null;
    this.dc = null;
    this.audio = null;
    this.tap = null;
    this.source = null;
    this.lead = null; // seconds rendering runs ahead of output, see calibrateLead
    this.turns = new Map();
    this.current = null; // the turn being sent or spoken
    this.timers = [];
    this.ready = null;
    this.muted = !!options.muted; // a race plays one lane aloud; the others still decode (muted)
    this.offerPath = options.offerPath || "/api/offer";
    this.session = options.session || {};
    this.noOnsetGraceMs = options.noOnsetGraceMs ?? NO_ONSET_GRACE_MS;
    this.quietAfterMs = options.quietAfterMs ?? QUIET_AFTER_MS;
    this.tailLimitMs = options.tailLimitMs ?? TAIL_LIMIT_MS;
    this.message = null; // why the lane last failed, in words (state "failed" / "engine-missing")
  }

  /** Mute or unmute this lane's playback. A muted lane is still decoded and measured. */
  setMuted(muted) {
    this.muted = !!muted;
    if (this.audio) this.audio.muted = this.muted;
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  _setState(state, message) {
    this.state = state;
    if (state === "connected") this.message = null;
    else if (message) this.message = message;
    this._emit("state", { state, message });
  }

  /** Connect (or reconnect) to the worker. Resolves once the data channel reports ready. */
  async connect() {
    this.close(true);
    this._setState("connecting");
    const pc = new RTCPeerConnection({ iceServers: [] });
    this.pc = pc;
    pc.addTransceiver("audio", { direction: "recvonly" });
    const dc = pc.createDataChannel("myna");
    this.dc = dc;
    dc.onmessage = (e) => this._onMessage(e.data);
    dc.onclose = () => {
      if (this.pc === pc && this.state === "connected") this._setState("failed", "data channel closed");
    };
    pc.ontrack = (e) => this._attach(e.streams[0] || new MediaStream([e.track]));
    pc.onconnectionstatechange = () => {
      if (this.pc !== pc) return;
      if (pc.connectionState === "failed" || pc.connectionState === "closed") this._setState("failed", `connection ${pc.connectionState}`);
    };

    const readyPromise = new Promise((resolve) => (this._resolveReady = resolve));
    await pc.setLocalDescription(await pc.createOffer());
    await waitForGathering(pc, GATHER_TIMEOUT_MS);
    if (this.pc !== pc) return;
    const requestData = { ...this.session };
    if (this.engine) requestData.engine = this.engine;
    if (this.voice) requestData.voice = this.voice;
    let res;
    try {
      res = await fetch(`${this.baseUrl}${this.offerPath}`, {
        method: "POST",
        headers: { "Content-Type": "application/json", ...authHeaders() },
        body: JSON.stringify({ sdp: pc.localDescription.sdp, type: "offer", request_data: requestData }),
      });
    } catch (err) {
      this._fail("server unreachable");
      throw err;
    }
    const body = await res.json().catch(() => ({}));
    if (this.pc !== pc) return;
    if (!res.ok) {
      const error = body.error || { code: `http_${res.status}`, message: res.statusText };
      if (res.status === 401 || res.status === 403) askForToken(error.message);
      if (error.code === "unknown_engine") {
        this.close(true);
        this._setState("engine-missing", error.message);
      } else {
        this._fail(error.message);
      }
      throw Object.assign(new Error(error.message), { code: error.code });
    }
    this.pcId = body.pc_id;
    await pc.setRemoteDescription({ type: body.type, sdp: body.sdp });
    await readyPromise;
    if (this.pc === pc) this._setState("connected");
  }

  _fail(message) {
    this.close(true);
    this._setState("failed", message);
  }

  async _attach(stream) {
    // Chromium decodes remote audio only while it plays: the element is the speaker, the tap
    // only listens (it outputs silence).
    const audio = document.createElement("audio");
    audio.autoplay = true;
    audio.muted = this.muted;
    audio.srcObject = stream;
    audio.dataset.lane = this.label;
    audio.hidden = true;
    document.body.appendChild(audio);
    this.audio = audio;
    audio.play().catch(() => {}); // autoplay may need a gesture; resumeAudio() retries
    const ctx = audioContext();
    try {
      await loadWorklet(ctx);
      if (!this.audio || this.audio !== audio) return;
      this.source = ctx.createMediaStreamSource(stream);
      this.tap = this._newTap(ctx);
      this.source.connect(this.tap).connect(ctx.destination);
      this.calibrateLead();
    } catch (err) {
      this._emit("error", { code: "audio_tap", message: `no in-page audio tap (${err.message}); perceived TTFA unavailable` });
    }
  }

  /** The onset tap (onset-worklet.js) on `ctx`, its messages handled by this lane. */
  _newTap(ctx) {
    const tap = new AudioWorkletNode(ctx, "myna-onset-tap", { numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1] });
    tap.port.onmessage = (e) => this._onTap(e.data);
    return tap;
  }

  /** A new MediaStreamSource into the tap before each turn. Chromium's WebRTC → WebAudio FIFO
   * of a source node grows when the render thread glitches (a busy host) and never shrinks, so
   * on a long-lived lane the tap would hear every turn later than the <audio> element plays it;
   * a fresh node starts with an empty FIFO. (The tap, its ring and the lead calibration stay.) */
  _freshSource() {
    if (!this.source || !this.tap || !this.audio?.srcObject) return;
    this.source.disconnect();
    this.source = audioContext().createMediaStreamSource(this.audio.srcObject);
    this.source.connect(this.tap);
  }

  /** Retry playback after a user gesture (autoplay policies). */
  resumeAudio() {
    const ctx = audioContext();
    if (ctx.state !== "running") ctx.resume().catch(() => {});
    if (this.audio && this.audio.paused) this.audio.play().catch(() => {});
  }

  /**
   * Measure how far the render clock runs ahead of getOutputTimestamp(): post pings stamped
   * with performance.now(); the tap answers with the frame it renders when each arrives. Message
   * delay and waiting for the next callback only add, so the minimum over pings is the estimate.
   */
  calibrateLead(pings = 16) {
    if (!this.tap) return;
    const ctx = audioContext();
    let left = pings;
    const leads = [];
    this._onPong = (msg) => {
      const at = ctxTimeAt(ctx, msg.t);
      if (at !== null && msg.frame !== null) leads.push(msg.frame / ctx.sampleRate - at);
      if (--left > 0) setTimeout(() => this.tap && this.tap.port.postMessage({ type: "ping", t: performance.now() }), 37);
      else if (leads.length) {
        this.lead = Math.min(...leads);
        this.leadSamples = leads;
      }
    };
    this.tap.port.postMessage({ type: "ping", t: performance.now() });
  }

  _onTap(msg) {
    if (msg.type === "level") {
      if (msg.peak > THRESHOLD) this.loudAt = performance.now();
      this._emit("level", msg);
    }
    else if (msg.type === "pong") this._onPong && this._onPong(msg);
    else if (msg.type === "onset") {
      const turn = this.turns.get(msg.id);
      if (!turn || turn.perceivedTtfaMs !== null || turn.sendFrame === null) return;
      turn.perceivedTtfaMs = ((msg.frame - turn.sendFrame) / audioContext().sampleRate) * 1000;
      turn.onsetFrame = msg.frame;
      this._emit("turn", { turn });
    }
  }

  _sendFrame(t) {
    const ctx = audioContext();
    const at = ctxTimeAt(ctx, t);
    if (at === null) return null;
    const lead = this.lead ?? (ctx.baseLatency || 0) + (ctx.outputLatency || 0);
    return (at + lead) * ctx.sampleRate;
  }

  _onMessage(data) {
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      return;
    }
    const turn = msg.turn_id ? this.turns.get(msg.turn_id) : null;
    switch (msg.type) {
      case "ready":
        this.ready = msg;
        if (msg.engine) this.engine = msg.engine;
        this._emit("ready", msg);
        if (this._resolveReady) this._resolveReady(msg);
        break;
      case "turn_started":
        if (turn && turn.status === "sending") turn.status = "speaking";
        if (turn) this._emit("turn", { turn });
        break;
      case "first_audio":
        if (!turn) break;
        turn.serverTtfaMs = msg.server_ttfa_ms ?? null;
        turn.preRollMs = msg.pre_roll_ms ?? null;
        this._emit("turn", { turn });
        break;
      case "word":
        if (!turn) break;
        turn.words.push({ word: msg.word, start_ms: msg.start_ms });
        this._emit("word", { turn, word: msg.word, start_ms: msg.start_ms });
        break;
      case "turn_done":
        if (!turn) break;
        turn.audioMs = msg.audio_ms ?? null;
        turn.underruns = msg.underruns ?? null;
        turn.gapMs = msg.gap_ms && typeof msg.gap_ms === "object" ? msg.gap_ms : null;
        turn.gaps = Array.isArray(msg.gaps) ? msg.gaps.filter((g) => Array.isArray(g) && g.length === 2) : null;
        if (turn.status !== "error") turn.status = msg.interrupted ? "interrupted" : "done";
        this._finish(turn);
        break;
      case "error":
        if (turn) {
          turn.error = msg;
          turn.status = "error";
          this._emit("turn", { turn });
        }
        this._emit("error", msg);
        break;
      default:
        break;
    }
  }

  _finish(turn) {
    if (this.current === turn) {
      this._clearTimers();
      this.current = null;
    }
    this._jitterBuffer(turn);
    this._emit("turn", { turn });
    // The onset is detected as audio plays; turn_done may arrive before the tail has played,
    // and a turn with no audible audio never reports one: stop waiting after a grace period.
    // A heard turn is final once the lane has gone quiet (QUIET_AFTER_MS).
    const doneAt = performance.now();
    const settle = () => {
      if (turn.perceivedTtfaMs === null) {
        if (performance.now() - doneAt < this.noOnsetGraceMs) return setTimeout(settle, 50);
        if (this.tap) this.tap.port.postMessage({ type: "disarm", id: turn.id });
      } else {
        const now = performance.now();
        if (now - (this.loudAt ?? 0) < this.quietAfterMs && now - doneAt < this.tailLimitMs) return setTimeout(settle, 50);
      }
      turn.final = true;
      this._emit("turn", { turn });
    };
    settle();
  }

  /** Chromium's cumulative jitter-buffer counters of the received audio (inbound-rtp
   * jitterBufferDelay s, jitterBufferEmittedCount samples; W3C webrtc-stats), or null. */
  async _jitterStats() {
    if (!this.pc) return null;
    try {
      for (const s of (await this.pc.getStats()).values()) {
        if (s.type === "inbound-rtp" && s.kind === "audio") return { delay: s.jitterBufferDelay, count: s.jitterBufferEmittedCount };
      }
    } catch {
      /* closed meanwhile */
    }
    return null;
  }

  /** turn.jitterBufferMs: the mean time a sample of this turn waited in the jitter buffer, ms. */
  async _jitterBuffer(turn) {
    const start = turn.jitterStart;
    const end = await this._jitterStats();
    if (start && end && end.count > start.count) {
      turn.jitterBufferMs = ((end.delay - start.delay) / (end.count - start.count)) * 1000;
      this._emit("turn", { turn });
    }
  }

  _clearTimers() {
    for (const t of this.timers) clearTimeout(t);
    this.timers = [];
  }

  get busy() {
    return this.current !== null;
  }

  /**
   * Speak `text`: stream it as LLM-like token chunks at `tokensPerSecond` (null or 0 = all at
   * once), then end the turn. If a turn is still playing it is interrupted first. `options`
   * (`voice`, `speed`) go with the turn's first chunk, the contract's per-turn options.
   * @returns {Promise<object>} the turn record (updated in place as events arrive)
   */
  async speak(text, tokensPerSecond = 30, options = {}) {
    if (this.state !== "connected" || !this.dc || this.dc.readyState !== "open") throw new Error("not connected");
    if (this.current) {
      const previous = this.current;
      this.interrupt();
      await waitFor(() => previous.status !== "sending" && previous.status !== "speaking", 1000);
      await sleep(150); // let audio already in flight drain so it is not taken for the new onset
    }
    this.resumeAudio();
    // After this task: a race's lanes send their first chunks within microseconds of each other.
    queueMicrotask(() => this._freshSource());
    const turn = newTurn(newTurnId(), text);
    this.turns.set(turn.id, turn);
    this.current = turn;
    const chunks = tokenChunks(text);
    const dc = this.dc;
    let first = true;
    const send = (chunk) => {
      if (dc.readyState !== "open") return false;
      dc.send(JSON.stringify({ type: "text", turn_id: turn.id, text: chunk, ...(first ? options : {}) }));
      first = false;
      return true;
    };
    const end = () => dc.readyState === "open" && dc.send(JSON.stringify({ type: "end_turn", turn_id: turn.id }));

    if (chunks.length) {
      send(chunks[0]);
      turn.sentAt = performance.now();
      turn.sendFrame = this._sendFrame(turn.sentAt);
      this._jitterStats().then((at) => (turn.jitterStart = at)); // (after the send: it waits on nothing)
      if (this.tap && turn.sendFrame !== null) this.tap.port.postMessage({ type: "arm", id: turn.id, fromFrame: turn.sendFrame });
    } else {
      turn.sentAt = performance.now();
    }
    this._emit("turn", { turn });
    if (!tokensPerSecond) {
      chunks.slice(1).forEach(send);
      end();
    } else {
      const t0 = turn.sentAt;
      const step = 1000 / tokensPerSecond;
      const schedule = (i) => {
        if (this.current !== turn) return;
        if (i < chunks.length) send(chunks[i]);
        else return end();
        const delay = Math.max(0, t0 + (i + 1) * step - performance.now());
        this.timers.push(setTimeout(() => schedule(i + 1), delay));
      };
      this.timers.push(setTimeout(() => schedule(1), Math.max(0, t0 + step - performance.now())));
    }
    return turn;
  }

  /** Barge in: drop the current turn now. */
  interrupt() {
    this._clearTimers();
    if (this.dc && this.dc.readyState === "open") this.dc.send(JSON.stringify({ type: "interrupt" }));
  }

  /** Close the session (quietly: no state event when `quiet`). */
  close(quiet = false) {
    this._clearTimers();
    this.current = null;
    if (this.tap) {
      this.tap.port.onmessage = null;
      this.tap.disconnect();
    }
    if (this.source) this.source.disconnect();
    if (this.audio) {
      this.audio.srcObject = null;
      this.audio.remove();
    }
    if (this.dc) this.dc.close();
    if (this.pc) this.pc.close();
    this.pc = this.dc = this.audio = this.tap = this.source = null;
    this.lead = null;
    if (!quiet) this._setState("closed");
  }
}

/** The context time the output device plays at performance time `t` (null before it runs). */
function ctxTimeAt(ctx, t) {
  const ts = ctx.getOutputTimestamp ? ctx.getOutputTimestamp() : null;
  if (!ts || !ts.performanceTime) return null;
  return ts.contextTime + (t - ts.performanceTime) / 1000;
}

function waitForGathering(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      pc.removeEventListener("icegatheringstatechange", check);
      clearTimeout(timer);
      resolve();
    };
    const check = () => pc.iceGatheringState === "complete" && done();
    const timer = setTimeout(done, timeoutMs);
    pc.addEventListener("icegatheringstatechange", check);
  });
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

function waitFor(predicate, timeoutMs) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const poll = () => (predicate() || performance.now() - t0 > timeoutMs ? resolve() : setTimeout(poll, 10));
    poll();
  });
}
