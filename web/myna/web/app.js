// The latency race: one reply sent to every lane at the same instant, each lane its own WebRTC
// session (lane.js) with its own engine and streaming strategy. Perceived TTFA is measured in
// this page on the received audio; the server's TTFA and pre-roll come from its events.
//
// URL parameters: ?lanes=piper,piper-whole picks the lanes in the race (?engine=NAME, one lane,
// also works); ?voice=NAME asks every lane for that voice.

import { ROOM_LANE, ROOM_LANE_INFO, RoomLane } from "./room-lane.js";
import { Lane, audioContext, SAMPLE_RATE } from "./lane.js";
import { SpeechLane } from "./speech-lane.js";
import { longSilences, placeGaps, LONG_SILENCE_MS } from "./gaps.js";
import { summary, winnerOf, MIN_SAMPLES } from "./stats.js";
import { tokenChunks } from "./tokens.js";
import { ttfaChart } from "./chart.js";
import { askForToken, authHeaders, hasToken } from "./auth.js";

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"),
  statusText: $("status-text"),
  text: $("text"),
  rate: $("rate"),
  voice: $("voice"),
  speed: $("speed"),
  listen: $("listen"),
  phraseCache: $("phrase-cache"),
  race: $("race"),
  stop: $("stop"),
  raceStatus: $("race-status"),
  raceTitle: $("race-title"),
  ruler: $("ruler"),
  lanes: $("lanes"),
  template: $("lane-template"),
  history: $("history").tBodies[0],
  historyEmpty: $("history-empty"),
  historySummary: $("history-summary"),
  exportButton: $("export"),
  chartButton: $("export-chart"),
  linkButton: $("copy-link"),
  speechForm: $("speech-form"),
  speechUrl: $("speech-url"),
  speechKey: $("speech-key"),
  speechModel: $("speech-model"),
  speechVoice: $("speech-voice"),
  speechWhere: $("speech-where"),
  clearButton: $("clear"),
};

const HEALTH_EVERY_MS = 2000;
const RECONNECT_EVERY_MS = 2500;
const SPEECH_RETRY_EVERY_MS = 10_000;
const RACE_TIMEOUT_MS = 90_000;
const HISTORY_KEY = "myna.race.history.v1";
const HISTORY_MAX = 500;
const LEVEL_FRAMES = 512; // the tap reports a level every 512 frames (onset-worklet.js)
const LEVEL_MS = (LEVEL_FRAMES / SAMPLE_RATE) * 1000;
const NARROW = window.matchMedia("(max-width: 640px)"); // a phone: the lanes scroll into view on a race

/** Lanes the page knows how to describe; other engines the worker lists get a plain lane.
 * kind: "engine" (a Myna engine over WebRTC, available when the worker loaded it), "pipecat"
 * (Pipecat's own pipeline, GET /api/pipecat), "room" (room-lane.js, GET /api/room) or "speech"
 * (any OpenAI-compatible /v1/audio/speech, speech-lane.js). `engine`: a Pipecat lane's text
 * aggregation; `needs`: what a missing engine lane needs, in words; `absent`: the state text of a
 * lane this worker cannot run; `setup`/`flags`: the command that adds it. */
const KNOWN = {
  dsm: {
    kind: "engine", title: "DSM", desc: "word by word (delayed streams)", color: "#d4900f",
    needs: "needs PyTorch and Kyutai's released TTS weights (kyutai/tts-1.6b-en_fr and a voice from kyutai/tts-voices, " +
      "about 4 GB downloaded from Hugging Face on first start); real time needs a GPU",
    setup: "bash scripts/setup.sh dsm hub",
    flags: "--dsm-checkpoint kyutai/tts-1.6b-en_fr --voice hf://kyutai/tts-voices/expresso/ex03-ex01_happy_001_channel1_334s.wav.1e68beda@240.safetensors",
  },
  piper: { kind: "engine", title: "Piper · clause", desc: "embedded voice, streamed by clause", color: "#2f6fd6" },
  "piper-sentence": { kind: "engine", title: "Piper · sentence", desc: "embedded voice, streamed by sentence", color: "#8b46d9" },
  "piper-whole": { kind: "engine", title: "Piper · whole reply", desc: "embedded voice, synthesised once the reply is complete", color: "#0f8a7e" },
  pipecat: {
    kind: "pipecat", engine: "sentence", title: "Pipecat · default", color: "#be185d",
    desc: "Pipecat's SmallWebRTC + PiperTTSService, same voice, its default sentence aggregation",
    absent: "not installed on this worker", setup: "bash scripts/setup.sh race",
  },
  "pipecat-token": {
    kind: "pipecat", engine: "token", title: "Pipecat · token", color: "#9d174d",
    desc: "Pipecat's SmallWebRTC + PiperTTSService, same voice, token aggregation",
    absent: "not installed on this worker", setup: "bash scripts/setup.sh race",
  },
  openai: { kind: "speech", title: "OpenAI API", desc: "POST /v1/audio/speech, a request per sentence", color: "#4d7c0f" },
};
const FALLBACK_COLORS = ["#c2410c", "#4d7c0f", "#be185d", "#475569"];

const PRESETS = {
  // The first clause is not a common opening, so what clause streaming buys shows in the first race.
  short: "Your table for four is booked at seven tonight, and I've added a note about the birthday cake.",
  long:
    "Sure, I can help with that. I found three flights that leave tomorrow morning: the first departs at six fifteen, " +
    "the second at eight, and the third just before ten. The eight o'clock flight is the cheapest, and it still gets " +
    "you there in time for lunch. Would you like me to hold a seat on it while you decide?",
  numbers:
    "Your order 4521 ships on March 3rd, 2026 and should arrive by Friday the 6th; the total is $149.99, " +
    "or 3 payments of $50 at 0% interest.",
  // A common opening: the phrase cache's case (tick "Phrase cache" to hear it answered from memory).
  opening: "Thanks for calling! Your table for four is booked at seven tonight.",
};

const params = new URLSearchParams(location.search);
const voice = params.get("voice") || null;
const requested = (params.get("lanes") || params.get("engine") || "")
  .split(",")
  .map((s) => s.trim())
  .filter(Boolean);

const health = { state: "checking", engines: [], voices: null }; // voices: GET /v1/voices, once ready
/** What the worker's lane routes said: kind → {available, error?} (null until asked). */
const offered = { pipecat: null, room: null };
/** @type {Map<string, object>} name → lane entry (see addLane) */
const entries = new Map();
let race = null; // the race in progress (or the last one)
let raceCount = 0;
let history = loadHistory();

// -- the OpenAI-compatible lane's server ------------------------------------------------------
const SPEECH_KEY = "myna.race.speech-key"; // sessionStorage (this tab only): {origin, key}
const OWN_SPEECH = `${location.origin}/v1`;

const originOf = (url) => {
  try {
    return new URL(url, location.href).origin;
  } catch {
    return null;
  }
};

/** The key typed for `url`'s origin in this tab ("" for any other origin: a link that names a
 * server never gets a key typed for another one). */
function storedKey(url) {
  try {
    const stored = JSON.parse(sessionStorage.getItem(SPEECH_KEY) || "null");
    return stored && stored.origin === originOf(url) ? String(stored.key || "") : "";
  } catch {
    return ""; // storage off, or not ours
  }
}

/** Where the OpenAI-compatible lane sends: the link's ?openai_url / _model / _voice, else this
 * worker's /v1; the key typed for that server's origin (never from or into a link). */
function speechSettings() {
  const baseUrl = (ui.speechUrl.value || params.get("openai_url") || OWN_SPEECH).replace(/\/+$/, "");
  const own = baseUrl === OWN_SPEECH;
  return {
    baseUrl,
    // This worker's own endpoint takes Myna's phrase_cache field and this page's token; another
    // server gets OpenAI's fields only.
    extra: own ? { phrase_cache: ui.phraseCache.checked } : {},
    headers: own ? authHeaders() : {},
    apiKey: storedKey(baseUrl),
    model: ui.speechModel.value || params.get("openai_model") || "tts-1",
    voice: ui.speechVoice.value || params.get("openai_voice") || "alloy",
  };
}

function showSpeechSettings() {
  const settings = speechSettings();
  ui.speechUrl.value = settings.baseUrl;
  ui.speechKey.value = settings.apiKey;
  ui.speechModel.value = settings.model;
  ui.speechVoice.value = settings.voice;
  const where = settings.baseUrl === OWN_SPEECH ? "this worker's /v1" : settings.baseUrl;
  ui.speechWhere.textContent = where;
  const entry = entries.get("openai");
  if (entry) {
    entry.li.querySelector(".lane-desc").textContent = `${where}: POST /audio/speech, a request per sentence`;
  }
}

ui.speechForm.addEventListener("submit", (e) => {
  e.preventDefault();
  if (race?.running) return; // (the button is disabled meanwhile)
  try {
    const origin = originOf(ui.speechUrl.value);
    if (ui.speechKey.value && origin) sessionStorage.setItem(SPEECH_KEY, JSON.stringify({ origin, key: ui.speechKey.value }));
    else sessionStorage.removeItem(SPEECH_KEY);
  } catch {
    /* storage off: the key lives for this connection only */
  }
  const entry = entries.get("openai") || addLane("openai");
  entry.enabled = true; // the user chose a server: it races (also on a ?lanes= page without it)
  entry.lane.configure({ ...speechSettings(), apiKey: ui.speechKey.value });
  showSpeechSettings();
  reconnectLane(entry);
  renderControls();
});

// -- the phrase cache: off unless ticked (?cache=1), so a repeated race synthesises afresh ------
ui.phraseCache.checked = params.get("cache") === "1";
ui.phraseCache.addEventListener("change", () => {
  for (const entry of entries.values()) {
    if (entry.info.kind === "engine" || entry.info.kind === "room") entry.lane.session.phrase_cache = ui.phraseCache.checked;
    else if (entry.info.kind === "speech") entry.lane.configure(speechSettings());
    else continue;
    if (entry.lane.state === "connected") reconnectLane(entry);
  }
  renderControls();
});

// -- lanes ---------------------------------------------------------------------------------
function addLane(name) {
  if (entries.has(name)) return entries.get(name);
  const info = KNOWN[name] || (name === ROOM_LANE && { kind: "room", ...ROOM_LANE_INFO }) ||
    { kind: "engine", title: name, desc: "engine", color: FALLBACK_COLORS[entries.size % FALLBACK_COLORS.length] };
  const li = ui.template.content.firstElementChild.cloneNode(true);
  li.dataset.lane = name;
  li.style.setProperty("--lane", info.color);
  li.querySelector(".lane-name").textContent = info.title;
  li.querySelector(".lane-desc").textContent = info.desc;
  li.querySelector(".wave").setAttribute("aria-label", `Received audio of ${info.title}`);
  const toggle = li.querySelector(".lane-toggle");
  toggle.setAttribute("aria-label", `${info.title}: in the race`);
  const entry = {
    name,
    info,
    li,
    toggle,
    el: {
      ttfa: li.querySelector(".ttfa"),
      server: li.querySelector(".server"),
      preroll: li.querySelector(".preroll"),
      gaps: li.querySelector(".gaps"),
      gapsFact: li.querySelector(".gaps-fact"),
      underruns: li.querySelector(".underruns"),
      how: li.querySelector(".lane-how"),
      delivery: li.querySelector(".delivery"),
      deliveryFact: li.querySelector(".delivery-fact"),
      audio: li.querySelector(".audio-ms"),
      state: li.querySelector(".lane-state"),
      rank: li.querySelector(".rank"),
      wave: li.querySelector(".wave"),
      captions: li.querySelector(".captions"),
    },
    enabled: requested.length ? requested.includes(name) : true,
    lane: makeLane(name, info),
    available: null, // true / false once the worker's engine list (or the lane's own route) has said
    why: null, // why an unavailable lane cannot run here, in words (from its route)
    settled: false, // has connected or failed at least once: the race no longer waits for it
    lastConnect: -Infinity,
    turn: null, // this lane's turn in the current race
    levels: [], // [ms since send, peak] of the current race
    rank: null,
  };
  entry.el.how.querySelector("code").textContent = startCommand(entry);
  if (info.kind === "speech") {
    li.querySelector(".server-fact").title = "The first sentence's request → the first byte of its response (the endpoint reports nothing else)";
  }
  toggle.addEventListener("click", () => {
    if (entry.available === false || race?.running) return;
    entry.enabled = !entry.enabled;
    renderLane(entry);
    renderControls();
  });
  const { lane } = entry;
  lane.addEventListener("state", () => {
    if (["connected", "failed", "engine-missing"].includes(lane.state)) entry.settled = true;
    onLaneState(entry);
    renderLane(entry);
    renderControls();
  });
  lane.addEventListener("turn", (e) => onTurn(entry, e.detail.turn));
  lane.addEventListener("word", (e) => onWord(entry, e.detail));
  lane.addEventListener("level", (e) => onLevel(entry, e.detail));
  lane.addEventListener("error", (e) => console.warn(`myna ${name}: ${e.detail.code}: ${e.detail.message}`));
  entries.set(name, entry);
  insertSorted(li);
  addListenOption(entry);
  renderLane(entry);
  return entry;
}

/** The lane object of a kind (see KNOWN): each speaks the same events to this page. */
function makeLane(name, info) {
  if (info.kind === "room") return new RoomLane({ voice, label: name, muted: true, session: { phrase_cache: ui.phraseCache.checked } });
  if (info.kind === "speech") return new SpeechLane({ ...speechSettings(), label: name, muted: true });
  if (info.kind === "pipecat") {
    // Pipecat's turn_done comes when its TTS stops, with seconds of audio still queued in its
    // transport: wait longer for the onset and for the tail to play out.
    return new Lane({ engine: info.engine, label: name, muted: true, offerPath: "/api/pipecat/offer",
                      noOnsetGraceMs: 10_000, quietAfterMs: 600, tailLimitMs: 30_000 });
  }
  return new Lane({ engine: name, voice, label: name, muted: true, session: { phrase_cache: ui.phraseCache.checked } });
}

function insertSorted(li) {
  // Known lanes in their catalogue order, others after them.
  const order = (n) => {
    const i = Object.keys(KNOWN).indexOf(n);
    return i < 0 ? 100 : i;
  };
  const after = [...ui.lanes.children].find((c) => order(c.dataset.lane) > order(li.dataset.lane));
  ui.lanes.insertBefore(li, after || null);
}

function addListenOption(entry) {
  entry.listenOption = new Option(entry.info.title, `lane:${entry.name}`);
  ui.listen.append(entry.listenOption);
}

/** The one command that adds this lane: its set-up, then a worker with its engine (or flags)
 * beside the engines loaded now. A room lane needs only its set-up (the worker keeps its flags). */
function startCommand(entry) {
  const { kind, setup, flags } = entry.info;
  if (kind === "room") return ROOM_LANE_INFO.setup;
  const loaded = health.engines.length ? health.engines : ["piper", "piper-sentence", "piper-whole"];
  const engines = kind === "engine" ? [...new Set([...loaded, entry.name])] : loaded;
  const serve = `.venv/bin/myna serve --engine ${engines.join(",")}${flags ? ` ${flags}` : ""}`;
  return setup ? `${setup} && ${serve}` : serve;
}

function laneState(entry) {
  if (health.state === "down") return "offline";
  // A lane asked for in the URL that the worker lacks is a problem; one of the page's own
  // catalogue that this worker did not load is just not part of this race.
  if (entry.lane.state === "engine-missing" || (entry.available === false && requested.includes(entry.name))) return "missing";
  if (entry.available === false) return "unavailable";
  const turn = entry.turn;
  if (race && race.entries.includes(entry) && turn) {
    if (turn.status === "error") return "error";
    if (turn.status === "interrupted") return "stopped";
    if (turn.status === "done" && turn.final) return "done";
    if (turn.perceivedTtfaMs !== null) return "speaking";
    return "waiting";
  }
  if (entry.lane.state === "connected") return entry.enabled ? "ready" : "off";
  if (entry.lane.state === "failed") return "retrying";
  return "connecting";
}

const STATE_TEXT = {
  offline: "server down",
  missing: "not loaded on this worker",
  unavailable: "not loaded on this worker",
  error: "error",
  stopped: "stopped",
  done: "done",
  speaking: "speaking",
  waiting: "waiting for audio…",
  ready: "ready",
  off: "not racing",
  retrying: "reconnecting…",
  connecting: "connecting…",
};

function renderLane(entry) {
  const state = laneState(entry);
  const { li, el, toggle } = entry;
  const absent = state === "missing" || state === "unavailable";
  li.dataset.state = state;
  li.classList.toggle("disabled", !entry.enabled || absent || state === "offline");
  toggle.setAttribute("aria-checked", String(entry.enabled && !absent));
  toggle.disabled = absent || state === "offline";
  let text = state === "unavailable" && entry.info.absent ? entry.info.absent : STATE_TEXT[state];
  if (state === "error" && entry.turn?.error) text = `error: ${entry.turn.error.message || entry.turn.error.code}`;
  if (state === "retrying" && entry.lane.message) text = `${entry.lane.message} · retrying`;
  const winner = race && !race.running ? race.winner : null;
  if (state === "done" && entry.rank > 1 && winner?.turn && race.landed[0] === winner) {
    text += ` · ${msText(entry.turn.perceivedTtfaMs - winner.turn.perceivedTtfaMs)} ms behind ${winner.info.title}`;
  } else if (state === "done" && winner === entry) {
    text += " · first to speak";
  }
  el.state.textContent = text;
  el.how.hidden = !absent;
  el.how.querySelector(".lane-needs").textContent = entry.why ? `${entry.why.replace(/\.$/, "")}. ` : "";
  el.how.querySelector("code").textContent = startCommand(entry);
  if (entry.listenOption) entry.listenOption.disabled = absent;
  el.state.title = absent ? entry.why || `The worker did not load the engine "${entry.name}"` : entry.lane.message || "";
  const turn = entry.turn;
  const live = !!(turn && race?.running && !turn.final && turn.status !== "error");
  setNumber(el.ttfa, turn?.perceivedTtfaMs, live);
  setFact(el.server, turn?.serverTtfaMs, live);
  setFact(el.preroll, turn?.preRollMs, live);
  renderGaps(entry, live);
  setCount(el.underruns, turn?.underruns, live);
  renderDelivery(entry, live);
  setFact(el.audio, turn?.audioMs, live);
  const rank = entry.rank;
  el.rank.textContent = rank ? `#${rank}` : "";
  li.dataset.rank = rank ? String(rank) : "";
  li.classList.toggle("winner", !!winner && winner === entry);
  li.classList.toggle("leader", rank === 1);
}

/** Where this lane's audio paused mid-turn: the worker's word (turn_done.gap_ms, gaps) when it
 * gives it, else the long silences this page measured in the received audio. */
function turnGaps(entry) {
  const turn = entry.turn;
  if (!turn || turn.perceivedTtfaMs === null) return null;
  const measured = longSilences(entry.levels, { fromMs: turn.perceivedTtfaMs, windowMs: LEVEL_MS });
  const reported = turn.gaps ? placeGaps(turn.gaps, turn.perceivedTtfaMs) : null;
  // Long silences the worker did not report (a stall after it sent the audio) are marked too.
  const overlaps = ([a, da]) => (reported || []).some(([b, db]) => a < b + db + LEVEL_MS && b < a + da + LEVEL_MS);
  const extra = measured.filter((g) => !overlaps(g));
  return { reported, measured, marks: [...(reported || []), ...extra], summary: turn.gapMs };
}

/** Delivery: perceived minus server TTFA, what happened between the worker's first audio frame
 * and this page's first audible sample; with the jitter buffer's share where the browser says. */
function renderDelivery(entry, live) {
  const turn = entry.turn;
  const { delivery: dd, deliveryFact } = entry.el;
  const value = turn && turn.perceivedTtfaMs !== null && turn.serverTtfaMs !== null ? turn.perceivedTtfaMs - turn.serverTtfaMs : null;
  setFact(dd, value, live);
  const jb = turn?.jitterBufferMs;
  if (value !== null && jb !== null && jb !== undefined) dd.textContent = `${msText(value)} ms · JB ${msText(jb)}`;
  dd.dataset.jitterBuffer = jb === null || jb === undefined ? "" : String(round1(jb));
  deliveryFact.title = entry.info.kind === "speech"
    ? "Perceived TTFA minus the first response's time to its first byte: the wait for the first sentence to be written, and playback"
    : "Perceived minus server TTFA: the network, the browser's jitter buffer (JB: the mean wait of this turn's samples, " +
      "from getStats), decoding and this page's audio thread. On one machine it grows when the CPU is busy (many lanes, " +
      "a busy browser); across a network, with its delay and jitter.";
}

function renderGaps(entry, live) {
  const { gaps: dd, gapsFact } = entry.el;
  const g = turnGaps(entry);
  const done = !!entry.turn?.final || entry.turn?.status === "done" || entry.turn?.status === "interrupted";
  let text;
  let title;
  let value = "";
  if (g?.summary) {
    const { count = 0, total = 0, longest = 0 } = g.summary;
    text = count ? `${count} · ${msText(total)} ms` : "0";
    value = String(count);
    title = `Pauses at word or clause boundaries while the next audio was not ready, from the worker: ${count}, ${msText(total)} ms in all, longest ${msText(longest)} ms`;
  } else if (g && (done || g.measured.length)) {
    const total = g.measured.reduce((sum, [, d]) => sum + d, 0);
    text = g.measured.length ? `${g.measured.length} · ${msText(total)} ms` : "0";
    value = String(g.measured.length);
    title = `Measured in this page: silences over ${LONG_SILENCE_MS / 1000} s mid-turn in the received audio (the worker reported no gaps)`;
  } else {
    text = live ? "…" : "—";
    title = "Pauses mid-turn while the next audio was not ready";
  }
  dd.textContent = text;
  dd.dataset.value = value;
  dd.dataset.source = g?.summary ? "worker" : g ? "page" : "";
  gapsFact.title = title;
}

function setCount(dd, value, pending) {
  const has = value !== null && value !== undefined;
  dd.dataset.value = has ? String(value) : "";
  dd.textContent = has ? String(value) : pending ? "…" : "—";
}

function setNumber(out, value, pending) {
  const has = value !== null && value !== undefined;
  out.dataset.value = has ? String(round1(value)) : "";
  out.textContent = has ? msText(value) : pending ? "…" : "—";
  out.classList.toggle("pending", !has && !!pending);
  out.classList.toggle("empty", !has && !pending);
}

function setFact(dd, value, pending) {
  const has = value !== null && value !== undefined;
  dd.dataset.value = has ? String(round1(value)) : "";
  dd.textContent = has ? `${msText(value)} ms` : pending ? "…" : "—";
}

// -- turn events ---------------------------------------------------------------------------
function onTurn(entry, turn) {
  if (!race || turn !== entry.turn) return;
  wavesDirty = true; // gaps arrive with turn_done
  if (turn.perceivedTtfaMs !== null && !race.landed.includes(entry)) {
    race.landed.push(entry);
    race.landed.sort((a, b) => a.turn.perceivedTtfaMs - b.turn.perceivedTtfaMs);
    race.landed.forEach((e, i) => {
      e.rank = i + 1;
      renderLane(e);
    });
    if (race.landed.length === 1) {
      announce(`${entry.info.title} spoke first: ${turn.perceivedTtfaMs.toFixed(0)} ms.`);
      applyListening();
    }
  }
  renderLane(entry);
  if (race.running && race.entries.every((e) => isFinal(e.turn))) finishRace();
}

function isFinal(turn) {
  return !!turn && (turn.final || turn.status === "error");
}

/** A lane's session came up or went away: a new session starts clean, and a turn whose session
 * died ends as an error instead of "speaking" forever. */
function onLaneState(entry) {
  const state = entry.lane.state;
  const inRace = !!race?.running && race.entries.includes(entry);
  if (state === "connected" && !inRace) {
    entry.turn = null;
    entry.rank = null;
    entry.levels = [];
    entry.el.captions.replaceChildren();
    wavesDirty = true;
  } else if ((state === "failed" || state === "closed") && entry.turn && !isFinal(entry.turn)) {
    entry.turn.status = "error";
    entry.turn.error = { code: "connection_lost", message: "connection lost" };
    entry.turn.final = true;
    if (inRace) onTurn(entry, entry.turn);
  }
}

function onWord(entry, { turn, word, start_ms }) {
  if (!race || turn !== entry.turn) return;
  const span = document.createElement("span");
  span.className = "word";
  span.textContent = asWritten(entry, word);
  span.dataset.start = String(start_ms ?? 0);
  entry.el.captions.append(span, " ");
  entry.captionsDirty = true;
}

const bare = (w) => w.toLowerCase().replace(/[^\p{L}\p{N}]/gu, "");
const CAPTION_LOOKAHEAD = 4; // written words a spoken word may skip (a number said in several words)

/** A spoken word (the worker's `word` event: normalised, no punctuation) as the reply wrote it,
 * punctuation kept: matched to the next written words of the race's text in order; a word
 * the text does not have as written ("four" of "4521") is shown as spoken. */
function asWritten(entry, word) {
  const written = race.words || (race.words = race.text.split(/\s+/).filter(Boolean));
  const at = entry.captionAt || 0;
  const key = bare(word);
  for (let i = at; key && i < Math.min(written.length, at + CAPTION_LOOKAHEAD); i++) {
    if (bare(written[i]) === key) {
      entry.captionAt = i + 1;
      return written[i];
    }
  }
  return word;
}

function onLevel(entry, { frame, peak }) {
  const turn = entry.turn;
  if (!race || !turn || turn.sendFrame === null) return;
  const mid = frame - LEVEL_FRAMES / 2;
  if (mid < turn.sendFrame) return;
  if (isFinal(turn)) return;
  entry.levels.push([((mid - turn.sendFrame) / SAMPLE_RATE) * 1000, peak]);
  if (entry.levels.length > 12_000) entry.levels.shift();
  wavesDirty = true;
}

// -- listening -----------------------------------------------------------------------------
function applyListening() {
  const mode = ui.listen.value;
  for (const entry of entries.values()) {
    let audible = false;
    if (mode.startsWith("lane:")) audible = mode === `lane:${entry.name}`;
    else if (mode === "winner") audible = !!race && race.landed[0] === entry;
    entry.lane.setMuted(!audible);
  }
}
ui.listen.addEventListener("change", applyListening);

// -- the race ------------------------------------------------------------------------------
function racers() {
  return [...entries.values()].filter((e) => e.enabled && e.available !== false && e.lane.state === "connected");
}

async function startRace() {
  const text = ui.text.value.trim();
  const lanes = racers();
  if (!text || !lanes.length || ui.race.disabled) return;
  const ctx = audioContext();
  ctx.resume().catch(() => {});
  if (race?.running) stopRace();
  if (lanes.some((e) => e.lane.busy)) {
    lanes.forEach((e) => e.lane.interrupt());
    await new Promise((r) => setTimeout(r, 200)); // let audio in flight drain
  }
  const rate = Number(ui.rate.value) || 0;
  raceCount += 1;
  race = {
    id: `r${Date.now().toString(36)}${raceCount}`, text, rate, entries: lanes, landed: [], running: true,
    stopped: false, winner: null, startedAt: new Date(), endedAt: null,
  };
  for (const entry of entries.values()) {
    entry.turn = null;
    entry.rank = null;
    entry.levels = [];
    entry.captionAt = 0;
    entry.el.captions.replaceChildren();
    renderLane(entry);
  }
  applyListening();
  // Every lane gets its first chunk in this same task: Lane.speak() sends it synchronously when
  // the lane is idle, so the lanes start within microseconds of each other.
  const speaking = lanes.map((entry) => {
    const p = entry.lane.speak(text, rate, turnOptions(entry));
    p.then((turn) => {
      entry.turn = turn;
      renderLane(entry);
    }).catch((err) => {
      entry.turn = { status: "error", error: { code: "not_started", message: err.message }, final: true, perceivedTtfaMs: null };
      renderLane(entry);
    });
    return p;
  });
  announce(lanes.length > 1 ? `Racing ${lanes.length} lanes…` : "Speaking…");
  renderControls();
  if (NARROW.matches) ui.raceTitle.scrollIntoView({ block: "start", behavior: "smooth" }); // the lanes are the result
  wavesDirty = true;
  await Promise.allSettled(speaking);
  race.timer = setTimeout(() => race?.running && finishRace(true), RACE_TIMEOUT_MS);
  if (race.entries.every((e) => isFinal(e.turn))) finishRace();
}

function stopRace() {
  if (!race?.running) return;
  race.stopped = true; // a stopped race has no winner, whatever landed before the stop
  for (const entry of race.entries) entry.lane.interrupt();
  announce("Stopped.");
}

/** The server went away mid-race: end the race now, record nothing. */
function abandonRace() {
  if (!race?.running) return;
  race.running = false;
  race.stopped = true;
  clearTimeout(race.timer);
  announce("Server down: the race was abandoned.");
}

function finishRace(timedOut = false) {
  if (!race?.running) return;
  race.running = false;
  race.endedAt = performance.now();
  clearTimeout(race.timer);
  const results = {};
  for (const entry of race.entries) {
    const t = entry.turn || {};
    const gaps = turnGaps(entry);
    results[entry.name] = {
      status: timedOut && !isFinal(t) ? "timeout" : t.status || "error",
      perceived_ttfa_ms: round1(t.perceivedTtfaMs),
      server_ttfa_ms: round1(t.serverTtfaMs),
      pre_roll_ms: round1(t.preRollMs),
      audio_ms: round1(t.audioMs),
      jitter_buffer_ms: round1(t.jitterBufferMs), // the browser's (getStats), WebRTC lanes
      ...(entry.info.kind === "speech" ? { endpoint: entry.lane.speechBase, model: entry.lane.model } : {}),
      underruns: t.underruns ?? null,
      gap_ms: t.gapMs ?? null, // the worker's, when it reports gaps
      long_silences_ms: gaps ? gaps.measured.map(([at, d]) => [round1(at), round1(d)]) : [], // measured here
      words: t.words ? t.words.length : 0,
    };
  }
  const run = { stopped: race.stopped, lanes: results };
  const winnerName = winnerOf(run);
  race.winner = winnerName ? entries.get(winnerName) : null;
  const sent = race.entries.map((e) => e.turn?.sentAt).filter((t) => typeof t === "number");
  race.startSpreadMs = sent.length ? Math.max(...sent) - Math.min(...sent) : null;
  const complete = Object.values(results).some((r) => r.status === "done");
  if (complete) {
    history.push({
      id: race.id, at: race.startedAt.toISOString(), text: race.text, token_rate: race.rate, winner: winnerName,
      stopped: race.stopped,
      start_spread_ms: round1(race.startSpreadMs), // first chunks of all lanes sent within this
      lanes: results,
    });
    if (history.length > HISTORY_MAX) history = history.slice(-HISTORY_MAX);
    saveHistory();
    renderHistory();
  }
  for (const entry of entries.values()) renderLane(entry);
  const first = race.landed[0];
  if (race.stopped) {
    announce(first ? `Stopped: no winner. ${first.info.title} had spoken first, after ${msText(first.turn.perceivedTtfaMs)} ms.` : "Stopped.");
  } else if (race.winner) {
    const best = race.winner.turn.perceivedTtfaMs;
    const second = race.landed.find((e) => e !== race.winner && results[e.name]?.status === "done");
    const margin = second ? `, ${msText(second.turn.perceivedTtfaMs - best)} ms ahead of ${second.info.title}` : "";
    announce(`${race.winner.info.title} wins: ${msText(best)} ms${margin}.`);
  } else if (first) {
    announce(`${first.info.title} spoke after ${msText(first.turn.perceivedTtfaMs)} ms${race.entries.length > 1 ? " (no other lane finished: no winner)" : ""}.`);
  } else {
    announce(timedOut ? "No lane spoke within the time limit." : "No lane produced audible audio.");
  }
  renderControls();
}

const round1 = (v) => (v === null || v === undefined ? null : Math.round(v * 10) / 10);
// Whole milliseconds as shown everywhere: from the 0.1 ms value the history stores, so a lane and
// its history row never round the same measurement differently (484.46 → 484.5 → "485" in both).
const msText = (v) => round1(v).toFixed(0);

function announce(text) {
  ui.raceStatus.textContent = text;
}

// -- history -------------------------------------------------------------------------------
function loadHistory() {
  try {
    const stored = JSON.parse(localStorage.getItem(HISTORY_KEY) || "[]");
    return Array.isArray(stored) ? stored : [];
  } catch {
    return [];
  }
}

function saveHistory() {
  try {
    localStorage.setItem(HISTORY_KEY, JSON.stringify(history));
  } catch {
    /* private mode or full: the history lives for this page only */
  }
}

function historySummary() {
  const lanes = {};
  for (const run of history) {
    for (const [name, r] of Object.entries(run.lanes)) {
      const s = (lanes[name] ||= { perceived: [], server: [], wins: 0, races: 0 });
      s.races += 1;
      if (r.perceived_ttfa_ms !== null) s.perceived.push(r.perceived_ttfa_ms);
      if (r.server_ttfa_ms !== null) s.server.push(r.server_ttfa_ms);
    }
    const winner = winnerOf(run);
    if (winner && lanes[winner]) lanes[winner].wins += 1;
  }
  const out = {};
  for (const [name, s] of Object.entries(lanes)) {
    const p = summary(s.perceived);
    const sv = summary(s.server);
    out[name] = {
      n: p.n,
      races: s.races,
      perceived_ttfa_ms: { p50: round1(p.p50), p25: round1(p.p25), p75: round1(p.p75), iqr: p.p25 === null ? null : round1(p.p75 - p.p25), p95: round1(p.p95) },
      server_ttfa_ms_p50: round1(sv.p50),
      wins: s.wins,
    };
  }
  return out;
}

function renderHistory() {
  const stats = historySummary();
  const names = Object.keys(stats).sort((a, b) => (stats[a].perceived_ttfa_ms.p50 ?? Infinity) - (stats[b].perceived_ttfa_ms.p50 ?? Infinity));
  // "Best" compares medians of lanes with enough races to have an IQR, and only two or more of them.
  const settled = names.filter((name) => stats[name].n >= MIN_SAMPLES.iqr);
  const best = settled.length > 1 ? settled[0] : null;
  ui.history.replaceChildren(
    ...names.map((name) => {
      const s = stats[name];
      const p = s.perceived_ttfa_ms;
      const row = document.createElement("tr");
      row.dataset.lane = name;
      const info = entries.get(name)?.info || KNOWN[name] || { title: name, color: "#888" };
      const f = (v) => (v === null || v === undefined ? "—" : msText(v));
      const cells = [
        null,
        f(p.p50),
        p.p25 === null ? "—" : [f(p.iqr), Object.assign(document.createElement("span"), { className: "iqr-range", textContent: ` (${f(p.p25)}–${f(p.p75)})` })],
        f(p.p95),
        String(s.n),
        f(s.server_ttfa_ms_p50),
        String(s.wins),
      ];
      const th = document.createElement("th");
      th.scope = "row";
      const sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.setProperty("--lane", info.color);
      th.append(sw, info.title);
      row.append(th);
      const needs = [null, MIN_SAMPLES.iqr, MIN_SAMPLES.p95];
      cells.slice(1).forEach((text, i) => {
        const td = document.createElement("td");
        td.className = i === 4 ? "num wide" : "num";
        if (Array.isArray(text)) td.append(...text);
        else td.textContent = text;
        if (text === "—" && needs[i]) td.title = `needs ${needs[i]} or more races of this lane`;
        row.append(td);
      });
      if (name === best) row.classList.add("best");
      return row;
    }),
  );
  ui.historyEmpty.hidden = names.length > 0;
  ui.exportButton.disabled = ui.clearButton.disabled = ui.chartButton.disabled = history.length === 0;
  ui.historySummary.textContent = history.length ? `${history.length} race${history.length > 1 ? "s" : ""} · perceived TTFA in ms` : "";
}

function exportJSON() {
  return {
    generated_at: new Date().toISOString(),
    definition:
      "perceived_ttfa_ms: first text chunk sent by this page -> first audible sample it received " +
      "(first 10 ms window, 1 ms hop, mean removed, RMS > 0.01 of full scale); server_ttfa_ms: from the worker's first_audio event " +
      "(the openai lane: its first request's time to the response's first byte; `endpoint` and `model` name the server it raced)",
    user_agent: navigator.userAgent,
    summary: historySummary(),
    runs: history,
  };
}

ui.exportButton.addEventListener("click", () => {
  download(new Blob([JSON.stringify(exportJSON(), null, 2)], { type: "application/json" }), "json");
});
/** The history's chart (chart.js): TTFA median and IQR per lane, as an SVG document. */
function chartSVG() {
  const stats = historySummary();
  const lanes = Object.entries(stats).map(([name, st]) => {
    const info = entries.get(name)?.info || KNOWN[name] || { title: name, color: "#888" };
    const p = st.perceived_ttfa_ms;
    return { title: info.title, color: info.color, n: st.n, p50: p.p50, p25: p.p25, p75: p.p75 };
  });
  const last = history[history.length - 1];
  const note = `median (bar) and p25–p75 (whisker) over ${history.length} race${history.length === 1 ? "" : "s"}, ms` +
    (last ? ` · ${last.token_rate ? `${last.token_rate} tokens/s` : "sent whole"} · ${navigator.userAgent.match(/Chrom\w+\/\d+/)?.[0] || "browser"}` : "");
  return ttfaChart(lanes, { note });
}

/** Save `blob` as myna-race-<time>.<extension>. */
function download(blob, extension) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `myna-race-${new Date().toISOString().replace(/[:.]/g, "-")}.${extension}`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
}

ui.chartButton.addEventListener("click", () => {
  download(new Blob([chartSVG()], { type: "image/svg+xml" }), "svg");
});
ui.clearButton.addEventListener("click", () => {
  if (!history.length) return;
  history = [];
  saveHistory();
  renderHistory();
  announce("History cleared.");
});

// -- status and connections -----------------------------------------------------------------
function renderControls() {
  const wanted = [...entries.values()].filter((e) => e.enabled && e.available !== false);
  const missing = [...entries.values()].filter((e) => e.enabled && (e.available === false || e.lane.state === "engine-missing"));
  const enabled = racers();
  // The race waits for every wanted lane's first connection (a Pipecat lane starts its peer on
  // the first offer: seconds); a lane that has failed since races no more until it is back.
  const waiting = health.state === "ready" ? wanted.filter((e) => !e.settled && e.available !== null) : [];
  let state;
  let text;
  if (health.state === "down") [state, text] = ["down", "Server down · retrying"];
  else if (health.state === "starting") [state, text] = ["connecting", "Server loading engines…"];
  else if (!wanted.length && health.state === "ready")
    [state, text] = ["missing", missing.length ? `Engine missing: ${missing.map((e) => e.name).join(", ")}` : "No lane selected"];
  else if (enabled.length && enabled.length === wanted.length)
    [state, text] = ["connected", `Connected · ${enabled.length} lane${enabled.length > 1 ? "s" : ""}`];
  else if (enabled.length && !waiting.length) {
    const down = wanted.filter((e) => !enabled.includes(e)).map((e) => e.info.title);
    [state, text] = ["partial", `Connected · ${enabled.length} lane${enabled.length > 1 ? "s" : ""} · not reachable: ${down.join(", ")}`];
  } else if (enabled.length) [state, text] = ["connecting", `Connecting · ${enabled.length}/${wanted.length} lanes`];
  else [state, text] = ["connecting", "Connecting…"];
  ui.status.dataset.state = state;
  ui.statusText.textContent = text;
  const running = !!race?.running;
  ui.race.disabled = !enabled.length || waiting.length > 0 || health.state === "down";
  if (running) ui.race.textContent = "Race again";
  else if (waiting.length) ui.race.textContent = `Waiting for ${waiting.map((e) => e.info.title).join(", ")}…`;
  else ui.race.textContent = enabled.length === 1 ? "Speak" : enabled.length ? `Race ${enabled.length} lanes` : "Race";
  ui.stop.disabled = !running || health.state === "down";
  ui.phraseCache.disabled = running;
  ui.speechForm.querySelector("button[type=submit]").disabled = running;
  for (const e of entries.values()) e.toggle.disabled = e.toggle.disabled || running;
}

/** Fill the voice picker from GET /v1/voices (name, engine, language), once the worker is ready. */
async function loadVoices() {
  health.voices = [];
  try {
    const res = await fetch("/v1/voices", { cache: "no-store", headers: authHeaders() });
    if (!res.ok) throw new Error(`GET /v1/voices: ${res.status}`);
    const body = await res.json();
    health.voices = Array.isArray(body.voices) ? body.voices : [];
  } catch {
    health.voices = null; // try again at the next health poll
    return;
  }
  const chosen = ui.voice.value || voice || "";
  const byName = new Map();
  for (const v of health.voices) {
    if (!byName.has(v.name)) byName.set(v.name, { language: v.language, engines: [] });
    byName.get(v.name).engines.push(v.engine);
  }
  ui.voice.replaceChildren(new Option("Each engine's default", ""));
  for (const [name, v] of byName) ui.voice.append(new Option(v.language ? `${name} (${v.language})` : name, name));
  ui.voice.value = byName.has(chosen) ? chosen : "";
}

/**
 * The options a lane's turn carries: the picked voice where the lane's engine has it (GET
 * /v1/voices), and the speed when it is not 1×.
 */
function turnOptions(entry) {
  const options = {};
  const picked = ui.voice.value;
  if (picked && (health.voices || []).some((v) => v.name === picked && v.engine === entry.name)) options.voice = picked;
  const speed = Number(ui.speed.value);
  if (speed && speed !== 1) options.speed = speed;
  return options;
}

async function pollHealth() {
  try {
    const res = await fetch("/healthz", { cache: "no-store" });
    const body = await res.json().catch(() => ({}));
    health.state = res.ok ? "ready" : "starting";
    health.engines = Array.isArray(body.engines) ? body.engines : [];
    if (body.auth && !hasToken()) askForToken();
  } catch {
    health.state = "down";
  }
  for (const name of health.engines) addLane(name);
  if (health.state === "ready" && health.voices === null) loadVoices();
  if (health.state === "down") abandonRace();
  for (const entry of entries.values()) {
    updateAvailability(entry);
    if (health.state === "down") {
      if (entry.lane.state === "connected" || entry.lane.state === "connecting") {
        entry.lane.close(true);
        entry.lane.state = "failed";
      }
      onLaneState(entry); // a turn cut off by the server going away ends here
    } else if (health.state === "ready" && entry.available && ["idle", "failed", "closed"].includes(entry.lane.state)) {
      connectLane(entry);
    }
    renderLane(entry);
  }
  renderControls();
}

/** Ask a lane route (GET /api/pipecat, GET /api/room) whether its lanes can run here. */
async function askOffered(kind, path) {
  let answer;
  try {
    const res = await fetch(path, { cache: "no-store" });
    answer = res.ok ? await res.json() : { available: false, error: { code: `http_${res.status}`, message: `this worker does not offer it (${path}: ${res.status})` } };
  } catch {
    answer = { available: false, error: { code: "unreachable", message: "the worker did not answer" } };
  }
  offered[kind] = answer;
  for (const entry of entries.values()) {
    if (entry.info.kind === kind) {
      updateAvailability(entry);
      renderLane(entry);
    }
  }
  renderControls();
  return answer;
}

/** Whether a lane can run on this worker (null: not known yet), and why not. */
function updateAvailability(entry) {
  const { kind } = entry.info;
  if (kind === "engine") {
    if (health.engines.length) entry.available = health.engines.includes(entry.name);
    entry.why = entry.info.needs || null;
  } else if (kind === "speech") {
    entry.available = true; // its own connect says whether its server answers
  } else if (offered[kind]) {
    entry.available = offered[kind].available === true;
    entry.why = offered[kind].error?.message || null;
  }
}

/** Connect a lane again now, with new settings; the race waits for it again. */
function reconnectLane(entry) {
  entry.lastConnect = -Infinity;
  connectLane(entry);
  entry.settled = false; // (after the old connection's last state event)
}

function connectLane(entry) {
  const now = performance.now();
  // A server of someone else's that did not answer is asked less often (each try is a failed request).
  const every = entry.info.kind === "speech" && entry.lane.state === "failed" ? SPEECH_RETRY_EVERY_MS : RECONNECT_EVERY_MS;
  if (now - entry.lastConnect < every) return;
  entry.lastConnect = now;
  entry.lane.connect().catch(() => {
    renderLane(entry);
    renderControls();
  });
}

// -- drawing --------------------------------------------------------------------------------
let wavesDirty = true;
let axisMs = 3000;

function niceAxis(ms) {
  const steps = [2000, 3000, 4000, 5000, 6000, 8000, 10000, 12000, 15000, 20000, 30000, 45000, 60000];
  return steps.find((s) => s >= ms * 1.05) || Math.ceil(ms / 10000) * 10000;
}

function tickStep(axis) {
  return axis <= 3000 ? 250 : axis <= 6000 ? 500 : axis <= 15000 ? 1000 : axis <= 30000 ? 2500 : 5000;
}

function fitCanvas(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const width = Math.max(1, Math.round(canvas.clientWidth * dpr));
  const height = Math.max(1, Math.round(canvas.clientHeight * dpr));
  if (canvas.width !== width || canvas.height !== height) Object.assign(canvas, { width, height });
  return { g: canvas.getContext("2d"), width, height, dpr };
}

function cssVar(el, name, fallback) {
  return getComputedStyle(el).getPropertyValue(name).trim() || fallback;
}

function drawRuler() {
  const { g, width, height, dpr } = fitCanvas(ui.ruler);
  g.clearRect(0, 0, width, height);
  const ink = cssVar(ui.ruler, "--muted", "#5d636b");
  g.fillStyle = ink;
  g.strokeStyle = cssVar(ui.ruler, "--line", "#ddd");
  g.font = `${11 * dpr}px system-ui, sans-serif`;
  g.textBaseline = "middle";
  const step = tickStep(axisMs);
  for (let t = 0; t <= axisMs + 1; t += step) {
    const x = Math.round((t / axisMs) * (width - 1));
    const major = t % (step * 2) === 0;
    g.fillRect(x, height - (major ? 7 : 4) * dpr, dpr, (major ? 7 : 4) * dpr);
    if (major) {
      const label = t === 0 ? "0" : t >= 1000 ? `${(t / 1000).toFixed(t % 1000 ? 1 : 0)} s` : `${t} ms`;
      g.textAlign = t === 0 ? "left" : x > width - 30 * dpr ? "right" : "center";
      g.fillText(label, x, (height - 8 * dpr) / 2);
    }
  }
  // When the last token was sent (the reply fully written), as a marker on the ruler.
  if (race && race.rate) {
    const t = ((tokenChunks(race.text).length - 1) / race.rate) * 1000;
    if (t > 0 && t <= axisMs) {
      const x = Math.round((t / axisMs) * (width - 1));
      g.fillStyle = cssVar(ui.ruler, "--accent", "#e3a21a");
      g.beginPath();
      g.moveTo(x - 5 * dpr, height - 9 * dpr);
      g.lineTo(x + 5 * dpr, height - 9 * dpr);
      g.lineTo(x, height - 2 * dpr);
      g.fill();
    }
  }
}

function drawWave(entry) {
  const canvas = entry.el.wave;
  const { g, width, height, dpr } = fitCanvas(canvas);
  g.clearRect(0, 0, width, height);
  const color = entry.info.color;
  const mid = height / 2;
  // Grid: the ruler's major ticks.
  g.fillStyle = cssVar(canvas, "--grid", "#ececea");
  const step = tickStep(axisMs) * 2;
  for (let t = step; t < axisMs; t += step) g.fillRect(Math.round((t / axisMs) * (width - 1)), 0, dpr, height);
  g.fillStyle = cssVar(canvas, "--meter-base", "#dcdcd6");
  g.fillRect(0, mid - dpr / 2, width, dpr);
  const turn = entry.turn;
  const onset = turn?.perceivedTtfaMs ?? null;
  const barMs = LEVEL_MS;
  // Gaps first, under the bars: a tinted band over each pause, a bar along its top.
  const gaps = turnGaps(entry)?.marks || [];
  for (const [start, duration] of gaps) {
    const x0 = (start / axisMs) * width;
    const w = Math.max(2 * dpr, (duration / axisMs) * width);
    g.fillStyle = cssVar(canvas, "--gap-soft", "#fbe6e3");
    g.fillRect(x0, 0, w, height);
    g.fillStyle = cssVar(canvas, "--gap", "#b42318");
    g.fillRect(x0, 0, w, 3 * dpr);
  }
  entry.el.wave.dataset.gaps = String(gaps.length);
  const barW = Math.max(dpr, (barMs / axisMs) * width);
  for (const [t, peak] of entry.levels) {
    if (t > axisMs) break;
    if (peak < 0.003) continue; // silence: leave the baseline
    const x = (t / axisMs) * width;
    const h = Math.max(dpr, Math.min(1, Math.sqrt(peak)) * (height - 4 * dpr));
    g.fillStyle = onset !== null && t >= onset - barMs ? color : cssVar(canvas, "--dim", "#c9ccd1");
    g.fillRect(x - barW / 2, mid - h / 2, Math.max(dpr, barW - 0.5 * dpr), h);
  }
  if (onset !== null) {
    const x = Math.round((onset / axisMs) * (width - 1));
    g.fillStyle = cssVar(canvas, "--ink", "#17191c");
    g.fillRect(x, 0, 2 * dpr, height);
  }
}

function updateCaptions(entry) {
  const turn = entry.turn;
  if (!turn || turn.onsetFrame === undefined || turn.onsetFrame === null) return;
  const now = audioContext().currentTime * SAMPLE_RATE;
  const elapsedMs = ((now - turn.onsetFrame) / SAMPLE_RATE) * 1000;
  let current = null;
  for (const span of entry.el.captions.children) {
    const spoken = Number(span.dataset.start) <= elapsedMs;
    span.classList.toggle("spoken", spoken);
    if (spoken) current = span;
  }
  for (const span of entry.el.captions.querySelectorAll(".current")) if (span !== current) span.classList.remove("current");
  if (current && !(turn.final && turn.status === "done")) current.classList.add("current");
  else if (current) current.classList.remove("current");
}

function frame() {
  requestAnimationFrame(frame);
  let latest = 0;
  for (const entry of entries.values()) if (entry.levels.length) latest = Math.max(latest, entry.levels[entry.levels.length - 1][0]);
  const axis = niceAxis(Math.max(latest, 1800));
  const resized = ui.ruler.width !== Math.round(ui.ruler.clientWidth * (window.devicePixelRatio || 1));
  if (axis !== axisMs || resized) {
    axisMs = axis;
    wavesDirty = true;
  }
  if (wavesDirty) {
    wavesDirty = false;
    drawRuler();
    for (const entry of entries.values()) drawWave(entry);
  }
  if (race) for (const entry of race.entries) updateCaptions(entry);
  if (race?.running) for (const entry of race.entries) renderGaps(entry, !isFinal(entry.turn)); // silences measured as audio arrives
}
window.addEventListener("resize", () => (wavesDirty = true));
// Leaving or reloading the page closes every lane's connection, so the workers (Myna's and the
// Pipecat lanes' peer) free its sessions now rather than when their connection checks time out.
window.addEventListener("pagehide", () => entries.forEach((entry) => entry.lane && entry.lane.close(true)));

// -- controls -------------------------------------------------------------------------------
function choosePreset(name, focus = true) {
  ui.text.value = PRESETS[name];
  for (const b of document.querySelectorAll("[data-preset]")) b.setAttribute("aria-pressed", String(b.dataset.preset === name));
  if (focus) ui.text.focus();
}
for (const b of document.querySelectorAll("[data-preset]")) b.addEventListener("click", () => choosePreset(b.dataset.preset));
/** The preset whose text the box holds, or undefined. */
const presetInBox = () => Object.keys(PRESETS).find((name) => PRESETS[name] === ui.text.value.trim());
ui.text.addEventListener("input", () => {
  const match = presetInBox();
  for (const b of document.querySelectorAll("[data-preset]")) b.setAttribute("aria-pressed", String(b.dataset.preset === match));
});
/** The race's settings as a link: the lanes in the race, the text (a preset by name), the
 * rate, voice, speed, phrase cache and the OpenAI-compatible lane's server (never its key). */
function permalink() {
  const link = new URL(location.pathname, location.origin);
  const q = link.searchParams;
  const lanes = [...entries.values()].filter((e) => e.enabled && e.available !== false).map((e) => e.name);
  if (lanes.length) q.set("lanes", lanes.join(","));
  const preset = presetInBox();
  if (preset) q.set("preset", preset);
  else q.set("text", ui.text.value.trim());
  q.set("rate", ui.rate.value);
  if (ui.voice.value) q.set("voice", ui.voice.value);
  if (ui.speed.value !== "1") q.set("speed", ui.speed.value);
  if (ui.phraseCache.checked) q.set("cache", "1");
  if (entries.has("openai")) {
    const speech = speechSettings();
    if (speech.baseUrl !== OWN_SPEECH) q.set("openai_url", speech.baseUrl);
    if (speech.model !== "tts-1") q.set("openai_model", speech.model);
    if (speech.voice !== "alloy") q.set("openai_voice", speech.voice);
  }
  return link.toString();
}

/** The settings a link carries (see permalink), applied once at load. */
function applyLinkSettings() {
  const preset = params.get("preset");
  if (preset && PRESETS[preset]) choosePreset(preset, false);
  else if (params.get("text")) {
    ui.text.value = params.get("text");
    ui.text.dispatchEvent(new Event("input"));
  }
  const pick = (select, value) => {
    if (value !== null && [...select.options].some((o) => o.value === value)) select.value = value;
  };
  pick(ui.rate, params.get("rate"));
  pick(ui.speed, params.get("speed"));
}

ui.linkButton.addEventListener("click", async () => {
  const link = permalink();
  try {
    await navigator.clipboard.writeText(link);
    announce("Link to these race settings copied.");
  } catch {
    window.prompt("Link to these race settings:", link); // no clipboard access (http, or denied)
  }
});

ui.race.addEventListener("click", startRace);
ui.stop.addEventListener("click", stopRace);
ui.text.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    startRace();
  }
});
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && race?.running) {
    e.preventDefault();
    stopRace();
  }
});
// A first gesture anywhere unlocks audio where autoplay is restricted.
document.addEventListener("pointerdown", () => entries.forEach((e) => e.lane.resumeAudio()), { once: true });

// Exposed for tests and the console.
window.myna = { entries, health, get race() { return race; }, history: () => history, exportJSON, historySummary, permalink, chartSVG };

for (const name of requested) addLane(name);
// The default race: every lane but the OpenAI-compatible one, which races once a server is
// chosen (its settings, or ?openai_url=): by default it would race this worker against itself.
if (!requested.length) for (const name of Object.keys(KNOWN)) if (name !== "openai" || params.get("openai_url")) addLane(name);
showSpeechSettings();
applyLinkSettings();
renderHistory();
renderControls();
askOffered("pipecat", "/api/pipecat");
askOffered("room", "/api/room").then((room) => {
  // The room lane is an option of the worker (--livekit-url): shown when it is on, or asked for.
  if (requested.includes(ROOM_LANE) || (!requested.length && room.error?.code !== "no_livekit")) addLane(ROOM_LANE);
});
pollHealth();
setInterval(pollHealth, HEALTH_EVERY_MS);
requestAnimationFrame(frame);
