// The "via LiveKit room" lane: the page joins a LiveKit room that Myna is in, with livekit-client,
// and is measured exactly like a direct lane (lane.js: same audio tap, same onset rule, same
// turn records). Available when the worker runs with `myna serve --livekit-url URL`.
//
// Transport (docs/contract.md, "LiveKit rooms"): the worker's POST /api/room opens a room with Myna in it and
// returns a join token; the lane sends the data-channel JSON messages as reliable data packets on
// topic "myna" to Myna, reads Myna's events from packets on topic "myna.events", and plays Myna's
// audio track. livekit-client is served by the worker from the set-up's npm install
// (/vendor/livekit-client.mjs), never committed.

import { Lane } from "./lane.js";
import { askForToken, authHeaders } from "./auth.js";

export const ROOM_LANE = "livekit";
export const ROOM_LANE_INFO = {
  title: "Via LiveKit room",
  desc: "embedded voice through a LiveKit room (livekit-client)",
  color: "#c2410c",
  absent: "not available on this worker",
  setup: "bash scripts/setup_livekit.sh dev", // installs livekit-client, which the lane loads
};

export class RoomLane extends Lane {
  constructor(options = {}) {
    super({ ...options, engine: null });
    this.room = null;
  }

  /** Join a fresh room with Myna in it. Resolves once Myna's ready event has arrived. */
  async connect() {
    this.close(true);
    this._setState("connecting");
    let lk, res;
    try {
      lk = await import("/vendor/livekit-client.mjs");
      res = await fetch(`${this.baseUrl}/api/room`, {
        method: "POST", headers: { "Content-Type": "application/json", ...authHeaders() }, body: JSON.stringify(this.session),
      });
    } catch (err) {
      this._fail("server unreachable");
      throw err;
    }
    const body = await res.json().catch(() => ({}));
    if (!res.ok) {
      const error = body.error || { code: `http_${res.status}`, message: res.statusText };
      if (res.status === 401 || res.status === 403) askForToken(error.message);
      this._fail(error.message);
      throw Object.assign(new Error(error.message), { code: error.code });
    }
    const room = new lk.Room({ adaptiveStream: false, dynacast: false });
    this.room = room;
    const decoder = new TextDecoder();
    const encoder = new TextEncoder();
    room.on(lk.RoomEvent.DataReceived, (payload, participant, kind, topic) => {
      if (this.room === room && topic === "myna.events") this._onMessage(decoder.decode(payload));
    });
    room.on(lk.RoomEvent.TrackSubscribed, (track, publication, participant) => {
      if (this.room === room && track.kind === "audio" && participant.identity === body.identity) {
        this._attach(new MediaStream([track.mediaStreamTrack]));
      }
    });
    room.on(lk.RoomEvent.Disconnected, () => {
      if (this.room === room && this.state === "connected") this._setState("failed", "left the room");
    });
    // lane.js speaks through `dc`: the same JSON messages, as data packets to Myna.
    this.dc = {
      get readyState() {
        return room.state === "connected" ? "open" : "closed";
      },
      send: (text) =>
        room.localParticipant
          .publishData(encoder.encode(text), { reliable: true, topic: "myna", destinationIdentities: [body.identity] })
          .catch((err) => this._emit("error", { code: "send_failed", message: err.message })),
      close: () => {},
    };
    const readyPromise = new Promise((resolve) => (this._resolveReady = resolve));
    try {
      await room.connect(body.url, body.token, { autoSubscribe: true });
    } catch (err) {
      this._fail(`could not join the room: ${err.message}`);
      throw err;
    }
    await readyPromise;
    if (this.room === room) this._setState("connected");
  }

  /** Leave the room (quietly: no state event when `quiet`). */
  close(quiet = false) {
    const room = this.room;
    this.room = null;
    super.close(quiet);
    if (room) room.disconnect();
  }
}
