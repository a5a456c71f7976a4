// The Myna page: one lane (see lane.js), its controls, metrics, captions and turn log.
// The latency race (issue 6) adds lanes; everything session-specific is already in Lane.

import { Lane, audioContext } from "./lane.js";
import { summary } from "./stats.js";

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"),
  statusText: $("status-text"),
  text: $("text"),
  engine: $("engine"),
  rate: $("rate"),
  speak: $("speak"),
  interrupt: $("interrupt"),
  perceived: $("perceived"),
  server: $("server"),
  transport: $("transport"),
  preroll: $("preroll"),
  audioMs: $("audio-ms"),
  underruns: $("underruns"),
  meter: $("meter"),
  captions: $("captions"),
  turns: $("turns").tBodies[0],
  turnsEmpty: $("turns-empty"),
  summary: $("summary"),
};

const HEALTH_EVERY_MS = 2000;
const RECONNECT_EVERY_MS = 2000;

const params = new URLSearchParams(location.search);
const lane = new Lane({ engine: params.get("engine") || null, voice: params.get("voice") || null, label: "main" });
const health = { state: "checking", engines: [] };
const rows = new Map(); // turn id → {row, index}
let shownTurn = null;
let lastConnectAttempt = -Infinity;

// -- status ------------------------------------------------------------------------------
function renderStatus() {
  let state;
  let text;
  if (health.state === "down") [state, text] = ["down", "Server down"];
  else if (health.state === "starting") [state, text] = ["connecting", "Server starting…"];
  else if (lane.state === "engine-missing") [state, text] = ["missing", `Engine missing: ${lane.engine}`];
  else if (lane.state === "connected") [state, text] = ["connected", `Connected · ${lane.engine}`];
  else if (lane.state === "failed") [state, text] = ["connecting", "Reconnecting…"];
  else [state, text] = ["connecting", "Connecting…"];
  ui.status.dataset.state = state;
  ui.statusText.textContent = text;
  const connected = lane.state === "connected" && health.state !== "down";
  ui.speak.disabled = !connected;
  ui.interrupt.disabled = !connected || !lane.busy;
  ui.engine.disabled = ui.engine.options.length < 2 && lane.state !== "engine-missing";
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
  if (health.engines.length) fillEngines(health.engines, lane.engine || health.engines[0]);
  if (health.state === "ready" && lane.engine && health.engines.length && !health.engines.includes(lane.engine)) {
    if (lane.state !== "engine-missing") {
      lane.close(true);
      lane.state = "engine-missing";
    }
  } else if (health.state === "ready" && ["idle", "failed", "closed"].includes(lane.state)) {
    maybeConnect();
  } else if (health.state === "down" && lane.state === "connected") {
    lane.close(true);
    lane.state = "failed";
  }
  renderStatus();
}

function maybeConnect() {
  const now = performance.now();
  if (now - lastConnectAttempt < RECONNECT_EVERY_MS) return;
  lastConnectAttempt = now;
  lane.connect().catch(() => renderStatus());
}

function fillEngines(engines, selected) {
  const current = [...ui.engine.options].map((o) => o.value);
  const wanted = [...new Set([...engines, ...(selected ? [selected] : [])])];
  if (current.join("\n") !== wanted.join("\n")) {
    ui.engine.replaceChildren(
      ...wanted.map((name) => {
        const option = new Option(engines.includes(name) ? name : `${name} (not loaded)`, name);
        return option;
      }),
    );
  }
  if (selected) ui.engine.value = selected;
}

// -- lane events -------------------------------------------------------------------------
lane.addEventListener("state", renderStatus);
lane.addEventListener("ready", (e) => {
  fillEngines(e.detail.engines || [], e.detail.engine || lane.engine);
  renderStatus();
});
lane.addEventListener("turn", (e) => {
  const { turn } = e.detail;
  renderRow(turn);
  if (turn === shownTurn) renderMetrics(turn);
  renderStatus();
});
lane.addEventListener("word", (e) => {
  if (e.detail.turn !== shownTurn) return;
  ui.captions.querySelector(".current")?.classList.remove("current");
  const span = document.createElement("span");
  span.className = "word current";
  span.textContent = e.detail.word;
  ui.captions.append(span, " ");
});
lane.addEventListener("error", (e) => {
  const { code, message } = e.detail;
  console.warn(`myna: ${code}: ${message}`);
});

// -- metrics -----------------------------------------------------------------------------
const ms = (v, digits = 0) => (v === null || v === undefined ? "—" : `${v.toFixed(digits)}`);

function setMetric(el, value, pending) {
  el.dataset.value = value === null || value === undefined ? "" : String(Math.round(value * 10) / 10);
  el.textContent = value === null || value === undefined ? (pending ? "…" : "—") : value.toFixed(0);
  el.classList.toggle("pending", !!pending && (value === null || value === undefined));
  el.classList.toggle("empty", !pending && (value === null || value === undefined));
}

function renderMetrics(turn) {
  const live = turn.status === "sending" || turn.status === "speaking";
  setMetric(ui.perceived, turn.perceivedTtfaMs, live || !turn.final);
  setMetric(ui.server, turn.serverTtfaMs, live);
  const transport = turn.perceivedTtfaMs !== null && turn.serverTtfaMs !== null ? turn.perceivedTtfaMs - turn.serverTtfaMs : null;
  ui.transport.textContent = transport === null ? "—" : `${ms(transport)} ms`;
  ui.preroll.textContent = turn.preRollMs === null ? "—" : `${ms(turn.preRollMs)} ms`;
  ui.audioMs.textContent = turn.audioMs === null ? "—" : `${ms(turn.audioMs)} ms`;
  ui.underruns.textContent = turn.underruns === null ? "—" : String(turn.underruns);
}

function renderRow(turn) {
  let entry = rows.get(turn.id);
  if (!entry) {
    const row = ui.turns.insertRow(0);
    row.dataset.turn = turn.id;
    for (let i = 0; i < 7; i++) row.insertCell();
    row.cells[1].className = "text-col";
    for (const i of [2, 3, 4, 5]) row.cells[i].className = "num";
    entry = { row, index: rows.size + 1 };
    rows.set(turn.id, entry);
    ui.turnsEmpty.hidden = true;
  }
  const c = entry.row.cells;
  c[0].textContent = String(entry.index);
  c[1].textContent = turn.text;
  c[1].title = turn.text;
  c[2].textContent = turn.perceivedTtfaMs === null ? "—" : `${ms(turn.perceivedTtfaMs)} ms`;
  c[3].textContent = turn.serverTtfaMs === null ? "—" : `${ms(turn.serverTtfaMs)} ms`;
  c[4].textContent = turn.audioMs === null ? "—" : `${ms(turn.audioMs)} ms`;
  c[5].textContent = turn.underruns === null ? "—" : String(turn.underruns);
  const label = { sending: "streaming", speaking: "speaking", done: "done", interrupted: "interrupted", error: "error" }[turn.status];
  c[6].replaceChildren(Object.assign(document.createElement("span"), { className: `badge ${turn.status}`, textContent: label }));
  if (turn.error) c[6].title = `${turn.error.code}: ${turn.error.message}`;
  entry.row.dataset.status = turn.status;
  renderSummary();
}

function renderSummary() {
  const s = summary([...lane.turns.values()].map((t) => t.perceivedTtfaMs ?? NaN));
  ui.summary.textContent = s.n ? `perceived p50\u00a0${ms(s.p50)}\u00a0ms · IQR\u00a0${ms(s.p25)}–${ms(s.p75)}\u00a0ms · n\u00a0=\u00a0${s.n}` : "";
}

// -- level meter -------------------------------------------------------------------------
const levels = new Float32Array(240); // the last ~2.6 s of 512-frame peaks
let levelHead = 0;
let meterDirty = true;
lane.addEventListener("level", (e) => {
  levels[levelHead] = e.detail.peak;
  levelHead = (levelHead + 1) % levels.length;
  meterDirty = true;
});

function drawMeter() {
  requestAnimationFrame(drawMeter);
  if (!meterDirty) return;
  meterDirty = false;
  const canvas = ui.meter;
  const dpr = window.devicePixelRatio || 1;
  const width = Math.round(canvas.clientWidth * dpr);
  const height = Math.round(canvas.clientHeight * dpr);
  if (canvas.width !== width || canvas.height !== height) Object.assign(canvas, { width, height });
  const g = canvas.getContext("2d");
  g.clearRect(0, 0, width, height);
  const style = getComputedStyle(canvas);
  const mid = height / 2;
  g.fillStyle = style.getPropertyValue("--meter-base").trim() || "#ddd";
  g.fillRect(0, mid - dpr / 2, width, dpr);
  g.fillStyle = style.getPropertyValue("--meter-ink").trim() || "#333";
  const bars = levels.length;
  const w = width / bars;
  for (let i = 0; i < bars; i++) {
    const v = levels[(levelHead + i) % bars];
    const h = Math.max(dpr, Math.min(1, Math.sqrt(v)) * (height - 2 * dpr));
    g.fillRect(i * w, mid - h / 2, Math.max(dpr, w - dpr), h);
  }
}
requestAnimationFrame(drawMeter);

// -- actions -----------------------------------------------------------------------------
async function speak() {
  const text = ui.text.value.trim();
  if (!text || ui.speak.disabled) return;
  audioContext().resume().catch(() => {});
  const rate = Number(ui.rate.value) || 0;
  ui.captions.replaceChildren();
  try {
    const turnPromise = lane.speak(text, rate);
    const turn = await turnPromise;
    shownTurn = turn;
    ui.captions.replaceChildren(...turn.words.flatMap((w) => [Object.assign(document.createElement("span"), { className: "word", textContent: w.word }), " "]));
    renderMetrics(turn);
    renderRow(turn);
  } catch (err) {
    console.warn(`myna: ${err.message}`);
  }
  renderStatus();
}

function interrupt() {
  if (!lane.busy) return;
  lane.interrupt();
}

ui.speak.addEventListener("click", speak);
ui.interrupt.addEventListener("click", interrupt);
ui.text.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    speak();
  }
});
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && lane.busy) {
    e.preventDefault();
    interrupt();
  }
});
ui.engine.addEventListener("change", () => {
  const engine = ui.engine.value;
  if (!engine || engine === lane.engine) return;
  lane.engine = engine;
  const url = new URL(location.href);
  url.searchParams.set("engine", engine);
  history.replaceState(null, "", url);
  lastConnectAttempt = -Infinity;
  maybeConnect();
});
// A first gesture anywhere unlocks audio where autoplay is restricted.
document.addEventListener("pointerdown", () => lane.resumeAudio(), { once: true });

// Exposed for tests and the console.
window.myna = { lane, health };

renderStatus();
pollHealth();
setInterval(pollHealth, HEALTH_EVERY_MS);
