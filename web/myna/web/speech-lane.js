// The OpenAI-compatible lane: any `POST /v1/audio/speech` server (Myna's own /v1, Kokoro-FastAPI,
// speaches, a hosted API), raced from this page with the same clock and onset rule as the
// WebRTC lanes (lane.js).
//
// How it speaks. The speech endpoint takes a whole `input`, so the lane does what agent
// frameworks do with such a service: the reply's tokens arrive at the race's rate, and each
// sentence is sent as its own request the moment it is complete (the last one at the end of
// the reply). Responses are asked for as `pcm` (raw s16le mono at 24 kHz, OpenAI's definition)
// and read as they stream in; each piece is scheduled on the shared AudioContext right after the
// previous one, sentences in order.
//
// How it is measured. The scheduled audio runs through the same AudioWorklet tap as a WebRTC
// lane's (onset-worklet.js), so perceived TTFA is first text chunk "written" → first audible
// sample rendered, including the wait for the first sentence, the request, the server's time to
// its first bytes and the fetch stream; there is no jitter buffer. Server TTFA is not known
// (the endpoint sends no events): the lane shows the response's time to its first byte instead.
//
// Where it sends. Only to the base URL typed into the page (default: this worker's own /v1,
// same-origin); the key is sent as `Authorization: Bearer` to that URL only and kept in this
// tab's sessionStorage. Another origin must allow this page's origin (CORS): OpenAI's API,
// Kokoro-FastAPI and speaches do; a server that does not is reported on the lane, in words.

import { Lane, audioContext, loadWorklet, newTurn, newTurnId } from "./lane.js";
import { tokenChunks } from "./tokens.js";

export const PCM_RATE = 24000; // OpenAI's `pcm`: s16le mono at 24 kHz
const PROBE_TIMEOUT_MS = 4000; // a dead URL is reported within this
const FIRST_BYTE_TIMEOUT_MS = 15000;
const STALL_MS = 15000; // a response body that sends nothing this long has failed
const SENTENCE_END = /[.!?…](["'”’)\]]*)$/;
// Answers that are not raw PCM: a container or text (a server that ignored response_format).
const NOT_PCM = /^(audio\/(mpeg|mp3|wav|wave|x-wav|ogg|opus|aac|flac|webm|mp4)|text\/|application\/json)/;
const CONTAINER = /^(RIFF|ID3|OggS|fLaC)/;

/** The reply's sentences as the race writes it: [{text, lastChunk}] where lastChunk is the index
 * of the token chunk that completes it (tokens.js), so a sentence is sent when that chunk is. */
export function sentencesOf(chunks) {
  const out = [];
  let text = "";
  chunks.forEach((chunk, i) => {
    text += chunk;
    const next = chunks[i + 1];
    const wordEnds = next === undefined || /^\s/.test(next);
    if ((wordEnds && SENTENCE_END.test(text.trimEnd())) || next === undefined) {
      if (text.trim()) out.push({ text: text.trim(), lastChunk: i });
      text = "";
    }
  });
  return out;
}

/** Why a fetch failed, in words a user can act on. */
function fetchFailure(err, url) {
  if (err.name === "AbortError") return null; // our own abort (interrupt, close)
  if (err.name === "TimeoutError") return `no answer from ${url} within the time limit`;
  return `cannot reach ${url}: the server is down, or its CORS settings do not allow this page (${location.origin})`;
}

export class SpeechLane extends Lane {
  /**
   * @param {{baseUrl: string, apiKey?: string, model?: string, voice?: string, extra?: object,
   *          label?: string, muted?: boolean}} options  baseUrl: the API's base, e.g.
   *   "https://api.openai.com/v1" or this worker's "/v1"; model and voice: sent as given
   *   (defaults "tts-1", "alloy"); extra: more fields of every request's body.
   */
  constructor(options = {}) {
    super({ label: options.label, muted: options.muted, quietAfterMs: 250 });
    this.configure(options);
    this.requests = new Set(); // AbortControllers of the turn's requests
    this.pending = new Set(); // rejectors of sentences not yet requested (a stop settles them)
    this.sources = new Set();
    this.out = null; // GainNode to the speakers (0 when muted)
    this.connects = 0; // a newer connect() supersedes an older one still waiting
  }

  /** Change where the lane sends (takes effect at the next connect). */
  configure({ baseUrl, apiKey = "", model = "tts-1", voice = "alloy", extra = {}, headers = {} }) {
    this.extra = extra; // more body fields (this worker's own endpoint: Myna's phrase_cache)
    this.authHeaders = headers; // this worker's own token, when the URL is this worker's
    this.speechBase = String(baseUrl || "").replace(/\/+$/, "");
    this.apiKey = apiKey;
    this.model = model;
    this.speechVoice = voice;
  }

  _headers() {
    const auth = this.apiKey ? { Authorization: `Bearer ${this.apiKey}` } : this.authHeaders;
    return { "Content-Type": "application/json", ...auth };
  }

  setMuted(muted) {
    this.muted = !!muted;
    if (this.out) this.out.gain.value = this.muted ? 0 : 1;
  }

  /** Check the server answers (GET {base}/models, any HTTP status but 401/403), then set up the tap. */
  async connect() {
    this.close(true);
    const attempt = ++this.connects;
    this._setState("connecting");
    if (!this.speechBase) return this._fail("no base URL");
    let res;
    try {
      res = await fetch(`${this.speechBase}/models`, { headers: this._headers(), signal: AbortSignal.timeout(PROBE_TIMEOUT_MS) });
    } catch (err) {
      if (attempt === this.connects) this._fail(fetchFailure(err, this.speechBase));
      throw err;
    }
    if (attempt !== this.connects) return;
    if (res.status === 401 || res.status === 403) {
      const message = `${res.status}: the server refused the key${this.apiKey ? "" : " (none given)"}`;
      this._fail(message);
      throw new Error(message);
    }
    const ctx = audioContext();
    try {
      await loadWorklet(ctx);
    } catch (err) {
      this._fail(`no in-page audio tap (${err.message}): the page needs a secure context (https or localhost)`);
      throw err;
    }
    if (attempt !== this.connects) return;
    this.bus = ctx.createGain();
    this.out = ctx.createGain();
    this.out.gain.value = this.muted ? 0 : 1;
    this.tap = this._newTap(ctx);
    this.bus.connect(this.tap).connect(ctx.destination);
    this.bus.connect(this.out).connect(ctx.destination);
    this.calibrateLead();
    this._setState("connected");
  }

  /** Speak `text` at `tokensPerSecond` (0: all at once): one request per sentence, as each is written. */
  async speak(text, tokensPerSecond = 30, options = {}) {
    if (this.state !== "connected") throw new Error("not connected");
    if (this.current) this.interrupt();
    this.resumeAudio();
    const turn = newTurn(newTurnId(), text);
    this.turns.set(turn.id, turn);
    this.current = turn;
    const chunks = tokenChunks(text);
    const sentences = sentencesOf(chunks);
    turn.sentAt = performance.now();
    turn.sendFrame = this._sendFrame(turn.sentAt);
    if (this.tap && turn.sendFrame !== null) this.tap.port.postMessage({ type: "arm", id: turn.id, fromFrame: turn.sendFrame });
    turn.status = "speaking";
    this._emit("turn", { turn });
    const step = tokensPerSecond ? 1000 / tokensPerSecond : 0;
    // Each sentence's request starts when its last token is written; playback takes them in order.
    const responses = sentences.map((s) => new Promise((resolve, reject) => {
      this.pending.add(reject);
      const at = Math.max(0, turn.sentAt + s.lastChunk * step - performance.now());
      this.timers.push(setTimeout(() => {
        this.pending.delete(reject);
        resolve(this._request(turn, s.text, options));
      }, at));
    }));
    responses.forEach((p) => p.catch(() => {})); // a request cut short by a stop is not an error to report
    this._play(turn, responses);
    return turn;
  }

  _request(turn, input, options) {
    const abort = new AbortController();
    this.requests.add(abort);
    const timer = setTimeout(() => abort.abort(new DOMException("first byte", "TimeoutError")), FIRST_BYTE_TIMEOUT_MS);
    const body = { model: this.model, input, voice: this.speechVoice, response_format: "pcm", ...this.extra };
    if (options.speed) body.speed = options.speed;
    const sentAt = performance.now();
    return fetch(`${this.speechBase}/audio/speech`, { method: "POST", headers: this._headers(), body: JSON.stringify(body), signal: abort.signal })
      .then(async (res) => {
        clearTimeout(timer);
        if (turn.serverTtfaMs === null) turn.serverTtfaMs = performance.now() - sentAt;
        if (!res.ok) {
          const err = await res.json().catch(() => ({}));
          const message = err.error?.message || err.detail?.message || (typeof err.detail === "string" ? err.detail : res.statusText);
          throw Object.assign(new Error(`${res.status}: ${message || "refused"}`), { code: err.error?.code || `http_${res.status}` });
        }
        const type = (res.headers.get("Content-Type") || "").split(";")[0].trim().toLowerCase();
        if (NOT_PCM.test(type)) {
          throw Object.assign(new Error(`the server answered ${type}, not raw PCM (response_format "pcm")`), { code: "not_pcm" });
        }
        return { reader: res.body.getReader(), abort };
      })
      .catch((err) => {
        clearTimeout(timer);
        const reason = abort.signal.reason?.name === "TimeoutError" ? `no audio from ${this.speechBase} within ${FIRST_BYTE_TIMEOUT_MS / 1000} s` : null;
        throw Object.assign(new Error(reason || (err.code ? err.message : fetchFailure(err, this.speechBase)) || "stopped"), {
          code: err.code || (err.name === "AbortError" && !reason ? "aborted" : "unreachable"),
        });
      });
  }

  /** The next piece of a response body, or an error once it has stalled STALL_MS. */
  _read(reader) {
    let timer;
    const stalled = new Promise((_, reject) => {
      timer = setTimeout(() => reject(Object.assign(new Error(`the response stalled: no bytes for ${STALL_MS / 1000} s`), { code: "stalled" })), STALL_MS);
    });
    return Promise.race([reader.read(), stalled]).finally(() => clearTimeout(timer));
  }

  async _play(turn, responses) {
    const ctx = audioContext();
    let next = 0; // context time the next piece starts at
    let samples = 0;
    let carry = null; // an odd byte left over from the previous read
    let reader = null;
    try {
      for (const pending of responses) {
        ({ reader } = await pending);
        let first = true;
        for (;;) {
          const { value, done } = await this._read(reader);
          if (done || this.current !== turn) break;
          if (first && value.length >= 4 && CONTAINER.test(String.fromCharCode(...value.subarray(0, 4)))) {
            throw Object.assign(new Error("the server answered an audio file, not raw PCM (response_format \"pcm\")"), { code: "not_pcm" });
          }
          first = false;
          let bytes = value;
          if (carry !== null) {
            bytes = new Uint8Array(value.length + 1);
            bytes[0] = carry;
            bytes.set(value, 1);
            carry = null;
          }
          if (bytes.length % 2) {
            carry = bytes[bytes.length - 1];
            bytes = bytes.subarray(0, bytes.length - 1);
          }
          if (!bytes.length) continue;
          const pcm = new Int16Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
          const buffer = ctx.createBuffer(1, pcm.length, PCM_RATE);
          const channel = buffer.getChannelData(0);
          for (let i = 0; i < pcm.length; i++) channel[i] = pcm[i] / 32768;
          const source = ctx.createBufferSource();
          source.buffer = buffer;
          source.connect(this.bus);
          next = Math.max(next, ctx.currentTime);
          source.start(next);
          next += buffer.duration;
          samples += pcm.length;
          this.sources.add(source);
          source.onended = () => this.sources.delete(source);
        }
        reader = null;
        if (this.current !== turn) return;
      }
      if (!samples) throw Object.assign(new Error("the server answered 200 with no audio"), { code: "no_audio" });
      turn.audioMs = (samples / PCM_RATE) * 1000;
      turn.status = "done";
    } catch (err) {
      if (this.current !== turn) return;
      turn.status = "error";
      turn.error = { code: err.code || "error", message: err.message };
      this._emit("error", turn.error);
      this._stopRequests(); // the sentences after it are not asked for, those asked are cut off
      if (reader) reader.cancel().catch(() => {});
    }
    // Final once what was scheduled has played (lane.js: quiet after the end).
    const left = Math.max(0, (next - ctx.currentTime) * 1000);
    this.timers.push(setTimeout(() => this._finish(turn), left));
  }

  /** Cancel the turn's timers, its requests in flight and its sentences not yet asked for. */
  _stopRequests() {
    this._clearTimers();
    for (const abort of this.requests) abort.abort();
    this.requests.clear();
    const stopped = Object.assign(new Error("stopped"), { name: "AbortError", code: "aborted" });
    for (const reject of this.pending) reject(stopped);
    this.pending.clear();
  }

  interrupt() {
    const turn = this.current;
    this._stopRequests();
    for (const source of this.sources) source.stop();
    this.sources.clear();
    if (turn) {
      this.current = null;
      if (turn.status === "speaking" || turn.status === "sending") turn.status = "interrupted";
      this._finish(turn);
    }
  }

  close(quiet = false) {
    if (this.current) this.interrupt();
    if (this.bus) this.bus.disconnect();
    if (this.out) this.out.disconnect();
    this.bus = this.out = null;
    super.close(quiet); // the tap, the lead calibration, the state
  }
}
