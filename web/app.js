// The latency race: one reply sent to every lane at the same instant, each lane its own WebRTC
// session (lane.js) with its own engine and streaming strategy. Perceived TTFA is measured in
// this page on the received audio; the server's TTFA and pre-roll come from its events.
//
// URL parameters: ?lanes=piper,piper-whole picks the lanes in the race (?engine=NAME, one lane,
// also works); ?voice=NAME asks every lane for that voice.

import { ROOM_LANE, ROOM_LANE_INFO, RoomLane, roomLaneAvailable } from "./room-lane.js";
import { Lane, audioContext, SAMPLE_RATE } from "./lane.js";
import { summary } from "./stats.js";
import { tokenChunks } from "./tokens.js";

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"),
  statusText: $("status-text"),
  text: $("text"),
  rate: $("rate"),
  listen: $("listen"),
  race: $("race"),
  stop: $("stop"),
  raceStatus: $("race-status"),
  ruler: $("ruler"),
  lanes: $("lanes"),
  template: $("lane-template"),
  history: $("history").tBodies[0],
  historyEmpty: $("history-empty"),
  historySummary: $("history-summary"),
  exportButton: $("export"),
  clearButton: $("clear"),
};

const HEALTH_EVERY_MS = 2000;
const RECONNECT_EVERY_MS = 2500;
const RACE_TIMEOUT_MS = 90_000;
const HISTORY_KEY = "myna.race.history.v1";
const HISTORY_MAX = 500;
const LEVEL_FRAMES = 512; // the tap reports a level every 512 frames (onset-worklet.js)

/** Lanes the page knows how to describe; other engines the worker lists get a plain lane. */
const KNOWN = {
  dsm: { title: "DSM", desc: "word by word (delayed streams)", color: "#d4900f", hint: "needs a DSM checkpoint: myna serve --engine dsm,…" },
  piper: { title: "Piper · clause", desc: "embedded voice, streamed by clause", color: "#2f6fd6" },
  "piper-sentence": { title: "Piper · sentence", desc: "embedded voice, streamed by sentence", color: "#8b46d9" },
  "piper-whole": { title: "Piper · whole reply", desc: "embedded voice, synthesised once the reply is complete", color: "#0f8a7e" },
};
const FALLBACK_COLORS = ["#c2410c", "#4d7c0f", "#be185d", "#475569"];

const PRESETS = {
  short: "Thanks for calling! Your table for four is booked at seven tonight.",
  long:
    "Sure, I can help with that. I found three flights that leave tomorrow morning: the first departs at six fifteen, " +
    "the second at eight, and the third just before ten. The eight o'clock flight is the cheapest, and it still gets " +
    "you there in time for lunch. Would you like me to hold a seat on it while you decide?",
  numbers:
    "Your order 4521 ships on March 3rd, 2026 and should arrive by Friday the 6th; the total is $149.99, " +
    "or 3 payments of $50 at 0% interest.",
};

const params = new URLSearchParams(location.search);
const voice = params.get("voice") || null;
const requested = (params.get("lanes") || params.get("engine") || "")
  .split(",")
  .map((s) => s.trim())
  .filter(Boolean);

const health = { state: "checking", engines: [] };
let roomLane = false; // the worker offers the "via LiveKit room" lane (room-lane.js)
/** @type {Map<string, object>} name → lane entry (see addLane) */
const entries = new Map();
let race = null; // the race in progress (or the last one)
let raceCount = 0;
let history = loadHistory();

// -- lanes ---------------------------------------------------------------------------------
function addLane(name) {
  if (entries.has(name)) return entries.get(name);
  const info = KNOWN[name] || (name === ROOM_LANE && ROOM_LANE_INFO) || { title: name, desc: "engine", color: FALLBACK_COLORS[entries.size % FALLBACK_COLORS.length] };
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
      transport: li.querySelector(".transport"),
      audio: li.querySelector(".audio-ms"),
      state: li.querySelector(".lane-state"),
      rank: li.querySelector(".rank"),
      wave: li.querySelector(".wave"),
      captions: li.querySelector(".captions"),
    },
    enabled: requested.length ? requested.includes(name) : true,
    lane: name === ROOM_LANE ? new RoomLane({ voice, label: name, muted: true }) : new Lane({ engine: name, voice, label: name, muted: true }),
    available: null, // true / false once the worker's engine list is known
    lastConnect: -Infinity,
    turn: null, // this lane's turn in the current race
    levels: [], // [ms since send, peak] of the current race
    rank: null,
  };
  toggle.addEventListener("click", () => {
    if (entry.available === false || race?.running) return;
    entry.enabled = !entry.enabled;
    renderLane(entry);
    renderControls();
  });
  const { lane } = entry;
  lane.addEventListener("state", () => {
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

function laneState(entry) {
  if (health.state === "down") return "offline";
  if (entry.available === false || entry.lane.state === "engine-missing") return "missing";
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
  missing: "not loaded",
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
  li.dataset.state = state;
  li.classList.toggle("disabled", !entry.enabled || state === "missing" || state === "offline");
  toggle.setAttribute("aria-checked", String(entry.enabled && state !== "missing"));
  toggle.disabled = state === "missing" || state === "offline";
  let text = STATE_TEXT[state];
  if (state === "missing") text = entry.info.hint || "not loaded on this worker";
  if (state === "error" && entry.turn?.error) text = `error: ${entry.turn.error.message || entry.turn.error.code}`;
  if (state === "done" && entry.rank > 1 && race?.landed[0]?.turn) {
    text += ` · ${(entry.turn.perceivedTtfaMs - race.landed[0].turn.perceivedTtfaMs).toFixed(0)} ms behind ${race.landed[0].info.title}`;
  } else if (state === "done" && entry.rank === 1 && race?.landed.length > 1) {
    text += " · first to speak";
  }
  el.state.textContent = text;
  if (entry.listenOption) entry.listenOption.disabled = state === "missing";
  el.state.title = state === "missing" ? `The worker did not load the engine "${entry.name}"` : "";
  const turn = entry.turn;
  const live = !!(turn && race?.running && !turn.final && turn.status !== "error");
  setNumber(el.ttfa, turn?.perceivedTtfaMs, live);
  setFact(el.server, turn?.serverTtfaMs, live);
  setFact(el.preroll, turn?.preRollMs, live);
  const transport = turn && turn.perceivedTtfaMs !== null && turn.serverTtfaMs !== null ? turn.perceivedTtfaMs - turn.serverTtfaMs : null;
  setFact(el.transport, transport, live);
  setFact(el.audio, turn?.audioMs, live);
  const rank = entry.rank;
  el.rank.textContent = rank ? `#${rank}` : "";
  li.dataset.rank = rank ? String(rank) : "";
  li.classList.toggle("winner", rank === 1 && !!race && !race.running);
  li.classList.toggle("leader", rank === 1);
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

function onWord(entry, { turn, word, start_ms }) {
  if (!race || turn !== entry.turn) return;
  const span = document.createElement("span");
  span.className = "word";
  span.textContent = word;
  span.dataset.start = String(start_ms ?? 0);
  entry.el.captions.append(span, " ");
  entry.captionsDirty = true;
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
  race = { id: `r${Date.now().toString(36)}${raceCount}`, text, rate, entries: lanes, landed: [], running: true, startedAt: new Date(), endedAt: null };
  for (const entry of entries.values()) {
    entry.turn = null;
    entry.rank = null;
    entry.levels = [];
    entry.el.captions.replaceChildren();
    renderLane(entry);
  }
  applyListening();
  // Every lane gets its first chunk in this same task: Lane.speak() sends it synchronously when
  // the lane is idle, so the lanes start within microseconds of each other.
  const speaking = lanes.map((entry) => {
    const p = entry.lane.speak(text, rate);
    p.then((turn) => {
      entry.turn = turn;
      renderLane(entry);
    }).catch((err) => {
      entry.turn = { status: "error", error: { code: "not_started", message: err.message }, final: true, perceivedTtfaMs: null };
      renderLane(entry);
    });
    return p;
  });
  announce(`Racing ${lanes.length} lane${lanes.length > 1 ? "s" : ""}…`);
  renderControls();
  wavesDirty = true;
  await Promise.allSettled(speaking);
  race.timer = setTimeout(() => race?.running && finishRace(true), RACE_TIMEOUT_MS);
  if (race.entries.every((e) => isFinal(e.turn))) finishRace();
}

function stopRace() {
  if (!race?.running) return;
  for (const entry of race.entries) entry.lane.interrupt();
  announce("Stopped.");
}

function finishRace(timedOut = false) {
  if (!race?.running) return;
  race.running = false;
  race.endedAt = performance.now();
  clearTimeout(race.timer);
  const results = {};
  for (const entry of race.entries) {
    const t = entry.turn || {};
    results[entry.name] = {
      status: timedOut && !isFinal(t) ? "timeout" : t.status || "error",
      perceived_ttfa_ms: round1(t.perceivedTtfaMs),
      server_ttfa_ms: round1(t.serverTtfaMs),
      pre_roll_ms: round1(t.preRollMs),
      audio_ms: round1(t.audioMs),
      underruns: t.underruns ?? null,
      words: t.words ? t.words.length : 0,
    };
  }
  const winner = race.landed[0]?.name ?? null;
  const sent = race.entries.map((e) => e.turn?.sentAt).filter((t) => typeof t === "number");
  race.startSpreadMs = sent.length ? Math.max(...sent) - Math.min(...sent) : null;
  const complete = Object.values(results).some((r) => r.status === "done");
  if (complete) {
    history.push({
      id: race.id, at: race.startedAt.toISOString(), text: race.text, token_rate: race.rate, winner,
      start_spread_ms: round1(race.startSpreadMs), // first chunks of all lanes sent within this
      lanes: results,
    });
    if (history.length > HISTORY_MAX) history = history.slice(-HISTORY_MAX);
    saveHistory();
    renderHistory();
  }
  for (const entry of entries.values()) renderLane(entry);
  if (winner) {
    const first = race.landed[0].turn.perceivedTtfaMs;
    const second = race.landed[1]?.turn.perceivedTtfaMs;
    const margin = second !== undefined ? `, ${(second - first).toFixed(0)} ms ahead of ${race.landed[1].info.title}` : "";
    announce(`${race.landed[0].info.title} wins: ${first.toFixed(0)} ms${margin}.`);
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
    if (run.winner && lanes[run.winner]) lanes[run.winner].wins += 1;
  }
  const out = {};
  for (const [name, s] of Object.entries(lanes)) {
    const p = summary(s.perceived);
    const sv = summary(s.server);
    out[name] = {
      n: p.n,
      races: s.races,
      perceived_ttfa_ms: { p50: round1(p.p50), p25: round1(p.p25), p75: round1(p.p75), iqr: p.n ? round1(p.p75 - p.p25) : null, p95: round1(p.p95) },
      server_ttfa_ms_p50: round1(sv.p50),
      wins: s.wins,
    };
  }
  return out;
}

function renderHistory() {
  const stats = historySummary();
  const names = Object.keys(stats).sort((a, b) => (stats[a].perceived_ttfa_ms.p50 ?? Infinity) - (stats[b].perceived_ttfa_ms.p50 ?? Infinity));
  const best = names.length ? stats[names[0]].perceived_ttfa_ms.p50 : null;
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
      cells.slice(1).forEach((text, i) => {
        const td = document.createElement("td");
        td.className = i === 4 ? "num wide" : "num";
        if (Array.isArray(text)) td.append(...text);
        else td.textContent = text;
        row.append(td);
      });
      if (p.p50 !== null && p.p50 === best && names.length > 1) row.classList.add("best");
      return row;
    }),
  );
  ui.historyEmpty.hidden = names.length > 0;
  ui.exportButton.disabled = ui.clearButton.disabled = history.length === 0;
  ui.historySummary.textContent = history.length ? `${history.length} race${history.length > 1 ? "s" : ""} · perceived TTFA in ms` : "";
}

function exportJSON() {
  return {
    generated_at: new Date().toISOString(),
    definition:
      "perceived_ttfa_ms: first text chunk sent by this page -> first audible sample it received " +
      "(first 10 ms window, 1 ms hop, mean removed, RMS > 0.01 of full scale); server_ttfa_ms: from the worker's first_audio event",
    user_agent: navigator.userAgent,
    summary: historySummary(),
    runs: history,
  };
}

ui.exportButton.addEventListener("click", () => {
  const blob = new Blob([JSON.stringify(exportJSON(), null, 2)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `myna-race-${new Date().toISOString().replace(/[:.]/g, "-")}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
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
  let state;
  let text;
  if (health.state === "down") [state, text] = ["down", "Server down · retrying"];
  else if (health.state === "starting") [state, text] = ["connecting", "Server loading engines…"];
  else if (!wanted.length && health.state === "ready")
    [state, text] = ["missing", missing.length ? `Engine missing: ${missing.map((e) => e.name).join(", ")}` : "No lane selected"];
  else if (enabled.length && enabled.length === wanted.length)
    [state, text] = ["connected", `Connected · ${enabled.length} lane${enabled.length > 1 ? "s" : ""}`];
  else if (enabled.length) [state, text] = ["connecting", `Connecting · ${enabled.length}/${wanted.length} lanes`];
  else [state, text] = ["connecting", "Connecting…"];
  ui.status.dataset.state = state;
  ui.statusText.textContent = text;
  const running = !!race?.running;
  ui.race.disabled = !enabled.length || health.state === "down";
  ui.race.textContent = running ? "Race again" : enabled.length === 1 ? "Speak" : enabled.length ? `Race ${enabled.length} lanes` : "Race";
  ui.stop.disabled = !running;
  for (const e of entries.values()) e.toggle.disabled = e.toggle.disabled || running;
}

async function pollHealth() {
  try {
    const res = await fetch("/healthz", { cache: "no-store" });
    const body = await res.json().catch(() => ({}));
    health.state = res.ok ? "ready" : "starting";
    health.engines = Array.isArray(body.engines) ? body.engines : [];
  } catch {
    health.state = "down";
  }
  for (const name of health.engines) addLane(name);
  for (const entry of entries.values()) {
    if (health.engines.length) entry.available = entry.name === ROOM_LANE ? roomLane : health.engines.includes(entry.name);
    if (health.state === "down") {
      if (entry.lane.state === "connected" || entry.lane.state === "connecting") {
        entry.lane.close(true);
        entry.lane.state = "failed";
      }
    } else if (health.state === "ready" && entry.available && ["idle", "failed", "closed"].includes(entry.lane.state)) {
      connectLane(entry);
    }
    renderLane(entry);
  }
  renderControls();
}

function connectLane(entry) {
  const now = performance.now();
  if (now - entry.lastConnect < RECONNECT_EVERY_MS) return;
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
  const barMs = (LEVEL_FRAMES / SAMPLE_RATE) * 1000;
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
}
window.addEventListener("resize", () => (wavesDirty = true));

// -- controls -------------------------------------------------------------------------------
function choosePreset(name) {
  ui.text.value = PRESETS[name];
  for (const b of document.querySelectorAll("[data-preset]")) b.setAttribute("aria-pressed", String(b.dataset.preset === name));
  ui.text.focus();
}
for (const b of document.querySelectorAll("[data-preset]")) b.addEventListener("click", () => choosePreset(b.dataset.preset));
ui.text.addEventListener("input", () => {
  const match = Object.entries(PRESETS).find(([, text]) => text === ui.text.value.trim());
  for (const b of document.querySelectorAll("[data-preset]")) b.setAttribute("aria-pressed", String(!!match && b.dataset.preset === match[0]));
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
window.myna = { entries, health, get race() { return race; }, history: () => history, exportJSON, historySummary };

for (const name of requested) addLane(name);
if (!requested.length) for (const name of Object.keys(KNOWN)) addLane(name);
renderHistory();
renderControls();
roomLaneAvailable().then((ok) => {
  roomLane = ok;
  if (ok && (!requested.length || requested.includes(ROOM_LANE))) addLane(ROOM_LANE);
});
pollHealth();
setInterval(pollHealth, HEALTH_EVERY_MS);
requestAnimationFrame(frame);
