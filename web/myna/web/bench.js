// The automation hook of `myna bench ttfa --client chromium` (bench.html loads it).
//
// A benchmark drives real Chromium through Playwright and measures TTFA the way the race page
// does, with the page's own code: each session is a Lane (lane.js) on the one shared
// AudioContext, and TTFA is the Lane's perceived TTFA, first text chunk sent → first audible
// sample rendered by WebAudio (the AudioWorklet onset tap, onset-worklet.js / onset.js; the
// error bound is in lane.js). Nothing here measures anything itself.
//
// window.mynaBench (all return Promises; ids are small integers):
//   open(baseUrl, engine, noOnsetGraceMs)    → id, once the session is ready and its render
//                                              clock is calibrated (Lane.calibrateLead);
//                                              noOnsetGraceMs: Lane's option (null: its default)
//   speak(id, text, tokensPerSecond, quietMs, timeoutMs)
//                                            → the turn, once final (lane.js: quiet after
//                                              turn_done) and the lane has been quiet quietMs:
//        {status, render_ttfa_ms, server_ttfa_ms, pre_roll_ms, audio_ms, underruns, gap_ms,
//         error, lead_calibrated}  (render_ttfa_ms null: nothing audible was rendered)
//   close(id)
//   lane(id)                                 → the Lane itself (for debugging)
// `baseUrl` is where the session's POST /api/offer goes (the benchmark's signaling relay, so
// every server is same-origin to the page); media and data channel go straight to the server.

import { Lane, audioContext } from "./lane.js";

const lanes = new Map();
let nextId = 0;

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

async function until(predicate, timeoutMs) {
  const t0 = performance.now();
  while (!predicate()) {
    if (performance.now() - t0 > timeoutMs) return false;
    await sleep(10);
  }
  return true;
}

async function open(baseUrl, engine, noOnsetGraceMs = null) {
  const ctx = audioContext();
  if (ctx.state !== "running") await ctx.resume();
  nextId += 1;
  const id = nextId;
  // Muted: a headless benchmark has no listener; a muted lane is still decoded and measured.
  const lane = new Lane({ baseUrl, engine: engine || null, label: `bench-${id}`, muted: true,
                         noOnsetGraceMs: noOnsetGraceMs ?? undefined });
  lanes.set(id, lane);
  await lane.connect();
  if (lane.state !== "connected") throw new Error(`session not connected: ${lane.state}`);
  // The tap attaches once the track arrives, then calibrates the render clock (16 pings).
  await until(() => lane.tap && lane.lead !== null, 5000);
  return id;
}

async function speak(id, text, tokensPerSecond, quietMs = 250, timeoutMs = 120000) {
  const lane = lanes.get(id);
  if (!lane) throw new Error(`no session ${id}`);
  const turn = await lane.speak(text, tokensPerSecond || null);
  const final = await until(() => turn.final || turn.status === "error", timeoutMs);
  // A peer's turn_done comes before its transport has played the audio out: keep listening
  // until the lane has been quiet quietMs, so the next turn cannot hear this one's tail.
  await until(() => performance.now() - (lane.loudAt ?? 0) >= quietMs, 5000);
  return {
    status: final ? turn.status : "timeout",
    render_ttfa_ms: turn.perceivedTtfaMs,
    server_ttfa_ms: turn.serverTtfaMs,
    pre_roll_ms: turn.preRollMs,
    audio_ms: turn.audioMs,
    underruns: turn.underruns,
    gap_ms: turn.gapMs,
    error: turn.error,
    lead_calibrated: lane.lead !== null,
  };
}

function close(id) {
  const lane = lanes.get(id);
  if (lane) lane.close(true);
  lanes.delete(id);
}

window.mynaBench = { open, speak, close, lane: (id) => lanes.get(id) };
