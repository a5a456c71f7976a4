"""``myna bench playout``: pre-roll strategies × producers, Opus settings, sessions per core.

Three parts, one JSON:

1. **Strategies × producers** on a virtual clock (:mod:`myna.bench.simulate`): five synthetic
   producers (fast steady 80 ms / 10 ms; bursty by sentence, its chunks ending at word
   boundaries; real-time factor 0.9 ± 50 % jitter; real-time factor 1.2; real time with gaps
   of 40 and 120 ms in turn) × four strategies (ours = jitter-aware pre-roll; fixed 0 ms (one
   frame, the v1 rule); fixed 200 ms; a writer that sleeps each chunk's duration, as common
   frameworks do); the playout strategies start within the 100 ms budget of the start rule.
   Each cell streams ``--minutes`` of audio as turns of 6–10 s. Timer error is drawn from this
   machine's measured ``asyncio.sleep`` overshoot. Reported: added latency per turn (beyond
   frame quantisation), underruns, gaps (pauses at a word boundary: count, silence per minute
   of audio), frame-deadline deviation p50/p99
   (|send − anchor − pts/48 kHz|), drift (deviation of the last frame; for the writer from one
   continuous ``--minutes`` turn), and the CPU our playout path takes per session.
2. **Opus**: one speech recording encoded with aiortc's encoder and with mono settings: bit rate,
   encode CPU per frame, SNR after decoding, and the idle cost per frame.
3. **Capacity**: sessions streaming continuously from this process to real aiortc peers (in a
   child process, loopback only: ICE candidates are 127.0.0.1) while p99 deadline deviation
   stays ≤ ``--max-p99-ms``; per output mode (aiortc-encoded frames; our Opus packets), speaking
   and idle. Sessions per core = 1 / (worker CPU per session).

Absolute numbers on a shared machine are noisy: compare columns measured in the same run.
Run network parts inside ``unshare -n sh -c 'ip link set lo up; …'``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time

import numpy as np

from myna.audio.preroll import FixedPreRoll, JitterAwarePreRoll
from myna.bench.processes import process_cpu_s
from myna.bench.simulate import PRODUCERS, percentile, simulate_paced, simulate_sleep_writer

STRATEGIES = ["ours", "fixed_0ms", "fixed_200ms", "sleep_writer"]


def add_parser(subparsers) -> None:
    """Register ``playout`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("playout", help="pre-roll strategies × producers, Opus settings, sessions per core",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="audio per simulated cell, minutes (default: %(default)s)")
    p.add_argument("--capacity-seconds", type=float, default=60.0, help="time budget of the capacity part (default: %(default)s; 0 skips it)")
    p.add_argument("--max-p99-ms", type=float, default=5.0, help="capacity limit on p99 deadline deviation (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = {"machine": {"cpus": os.cpu_count(), "note": "shared machine: compare ratios within this run"}}
    overshoot_ms = measure_timer_overshoot()
    out["timer_overshoot_ms"] = {"p50": percentile(overshoot_ms, 50), "p99": percentile(overshoot_ms, 99), "n": len(overshoot_ms)}
    print(f"asyncio.sleep(20 ms) overshoot here: p50 {out['timer_overshoot_ms']['p50']:.2f} ms, p99 {out['timer_overshoot_ms']['p99']:.2f} ms")
    out["strategies"] = strategy_table(args.minutes, args.seed, [x / 1000.0 for x in overshoot_ms])
    print_strategy_table(out["strategies"])
    out["opus"] = opus_table()
    print_opus_table(out["opus"])
    out["send_path"] = sender_cost()
    print_sender_cost(out["send_path"])
    if args.capacity_seconds > 0:
        out["capacity"] = asyncio.run(capacity(args.capacity_seconds, args.max_p99_ms))
        print_capacity(out["capacity"], args.max_p99_ms)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
    return 0


# -- 1. strategies × producers ----------------------------------------------------------------
def measure_timer_overshoot(n: int = 150) -> list[float]:
    """``asyncio.sleep(0.02)`` wake-up lateness on this machine, ms."""
    return asyncio.run(_overshoot(n))


async def _overshoot(n: int) -> list[float]:
    late = []
    for _ in range(n):
        t0 = time.monotonic()
        await asyncio.sleep(0.02)
        late.append(1000.0 * (time.monotonic() - t0 - 0.02))
    return late


def strategy_table(minutes: float, seed: int, overshoot_s: list[float]) -> list[dict]:
    """One row per producer × strategy (see the module docstring)."""
    draw = (lambda rng: rng.choice(overshoot_s)) if overshoot_s else None
    turns = max(1, round(minutes * 60 / 8.0))  # turns average 8 s of audio
    rows = []
    for producer_name, producer in PRODUCERS.items():
        for strategy in STRATEGIES:
            if strategy == "sleep_writer":
                r = simulate_sleep_writer(producer, turns=turns, seed=seed, overshoot=draw)
                drift = simulate_sleep_writer(producer, turns=1, turn_s=(minutes * 60, minutes * 60), seed=seed, overshoot=draw)
                drift_ms = drift.drift_ms
            else:
                rule = {"ours": JitterAwarePreRoll, "fixed_0ms": lambda: FixedPreRoll(0.0),
                        "fixed_200ms": lambda: FixedPreRoll(0.2)}[strategy]()
                r = simulate_paced(producer, rule, turns=turns, seed=seed, overshoot=draw)
                drift_ms = r.drift_ms
            dev = [abs(x) for x in r.deviation_ms]
            rows.append({
                "producer": producer_name,
                "strategy": strategy,
                "turns": len(r.underruns),
                "audio_s": round(r.audio_s, 1),
                "added_latency_ms_p50": round(percentile(r.added_latency_ms, 50), 1),
                "added_latency_ms_max": round(max(r.added_latency_ms), 1),
                "underruns": int(sum(r.underruns)),
                "underruns_per_min": round(60 * sum(r.underruns) / max(r.audio_s, 1e-9), 2),
                "gaps": int(sum(r.gaps)),
                "gap_ms_per_min": round(60 * sum(r.gap_ms) / max(r.audio_s, 1e-9), 1),
                "deviation_ms_p50": round(percentile(dev, 50), 2),
                "deviation_ms_p99": round(percentile(dev, 99), 2),
                "drift_ms_after_minutes": round(drift_ms, 2),
                "cpu_ms_per_s": round(1000.0 * r.cpu_s / max(r.stream_s, 1e-9), 3),
            })
    return rows


def print_strategy_table(rows: list[dict]) -> None:
    print()
    print("Strategies × producers (virtual clock; latency = added beyond frame quantisation)")
    head = (f"{'producer':18} {'strategy':13} {'lat p50':>8} {'lat max':>8} {'underruns':>9} {'/min':>6} {'gaps':>5} "
            f"{'gap ms/min':>10} {'dev p50':>8} {'dev p99':>8} {'drift':>9} {'cpu ms/s':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['producer']:18} {r['strategy']:13} {r['added_latency_ms_p50']:8.0f} {r['added_latency_ms_max']:8.0f} "
              f"{r['underruns']:9d} {r['underruns_per_min']:6.1f} {r['gaps']:5d} {r['gap_ms_per_min']:10.0f} "
              f"{r['deviation_ms_p50']:8.2f} {r['deviation_ms_p99']:8.2f} "
              f"{r['drift_ms_after_minutes']:9.1f} {r['cpu_ms_per_s']:8.2f}")


# -- 2. Opus ---------------------------------------------------------------------------------
def speech_48k(seconds: float = 12.0) -> tuple[np.ndarray, str]:
    """int16 mono speech at 48 kHz: the bundled Piper voice if it loads, else a synthetic vowel train."""
    import soxr

    try:
        from myna.engines.piper import PiperEngine

        engine = PiperEngine(workers=1)
        engine._load()
        text = ("Sure, I can help with that: your table for four is booked at seven tonight. "
                "Would you like me to send a reminder an hour before, or add a note for the kitchen?")
        pcm, _ = engine.synthesize_unit(text)
        x = soxr.resample(pcm.astype(np.float32), engine.sample_rate, 48_000)
        source = f"piper {engine.voice_name}"
    except Exception:  # the voice is optional here
        t = np.arange(int(seconds * 48_000)) / 48_000
        f0 = 120 + 20 * np.sin(2 * np.pi * 0.5 * t)
        phase = 2 * np.pi * np.cumsum(f0) / 48_000
        x = sum(np.sin(k * phase) / k for k in range(1, 30)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) * 0.1
        source = "synthetic vowels"
    x = np.asarray(x, dtype=np.float64)
    x = x[: len(x) // 960 * 960]
    return (np.clip(x, -1, 1) * 32767).astype(np.int16), source


def _decode(payloads: list[bytes]) -> np.ndarray:
    """Decode Opus payloads with libopus to stereo, as a browser plays them; the left channel, int16.

    (A mono down-mix would penalise stereo packets: libopus's intensity stereo may invert phase.)
    """
    import av

    ctx = av.CodecContext.create("libopus", "r")
    ctx.format = "s16"
    ctx.layout = "stereo"
    ctx.sample_rate = 48_000
    out = []
    for p in payloads:
        for frame in ctx.decode(av.Packet(p)):
            a = frame.to_ndarray().reshape(-1)[0::2]  # packed s16 stereo: L R L R …
            out.append(a)
    return np.concatenate(out) if out else np.zeros(0, np.int16)


def _snr_db(ref: np.ndarray, dec: np.ndarray) -> float:
    """(SNR dB, delay samples, level change dB) of ``dec`` against ``ref``: delay found by
    cross-correlation, SNR after a least-squares gain match (the level change is reported apart)."""
    x = ref.astype(np.float64)
    y = dec.astype(np.float64)
    n = min(len(x), len(y))
    best, lag = -1.0, 0
    for d in range(0, 3000):
        if d >= n:
            break
        c = float(np.dot(x[: min(48_000, n - d)], y[d : d + min(48_000, n - d)]))
        if c > best:
            best, lag = c, d
    m = min(len(x), len(y) - lag)
    x, y = x[:m], y[lag : lag + m]
    gain = float(np.dot(x, y) / np.dot(y, y))  # level difference is reported apart from SNR
    noise = float(np.sum((x - gain * y) ** 2))
    snr = 10 * math.log10(float(np.sum(x * x)) / noise) if noise > 0 else math.inf
    return snr, lag, -20 * math.log10(gain)


def _spectral_snr_db(ref: np.ndarray, dec: np.ndarray, lag: int, level_db: float) -> float:
    """SNR (dB) of STFT magnitudes (20 ms Hann frames, 10 ms hop): blind to the phase changes a
    parametric speech codec makes, so closer to what is heard than the waveform SNR."""
    x = ref.astype(np.float64)
    y = dec.astype(np.float64)[lag:] * 10 ** (-level_db / 20)
    m = min(len(x), len(y))
    win = np.hanning(960)
    starts = range(0, m - 960, 480)
    fx = np.abs(np.fft.rfft(np.stack([x[s : s + 960] * win for s in starts]), axis=1))
    fy = np.abs(np.fft.rfft(np.stack([y[s : s + 960] * win for s in starts]), axis=1))
    return 10 * math.log10(float(np.sum(fx**2)) / float(np.sum((fx - fy) ** 2)))


def opus_table() -> dict:
    """Encode the same speech with aiortc's encoder and with mono settings."""
    import av
    from aiortc import rtp
    from aiortc.codecs.opus import OpusEncoder

    from myna.audio.opus import OpusSettings, VoiceOpusEncoder
    from myna.audio.playout import IDLE_FRAME

    pcm, source = speech_48k()
    frames = pcm.reshape(-1, 960)
    seconds = len(pcm) / 48_000

    def av_frame(block: np.ndarray, i: int):
        f = av.AudioFrame.from_ndarray(block.reshape(1, -1), format="s16", layout="mono")
        f.sample_rate = 48_000
        f.pts = i * 960
        return f

    rows = []
    # aiortc's own path: per frame, the sender computes the audio level, then encodes.
    # CPU figures are the best of three passes (the machine is shared).
    cpu = math.inf
    for _ in range(3):
        enc = OpusEncoder()
        payloads, spent = [], 0.0
        for i, block in enumerate(frames):
            f = av_frame(block, i)
            c0 = time.process_time()
            rtp.compute_audio_level_dbov(f)
            ps, _ = enc.encode(f)
            spent += time.process_time() - c0
            payloads += ps
        cpu = min(cpu, spent)
    idle_us = math.inf
    for _ in range(3):
        idle_enc = OpusEncoder()
        c0 = time.process_time()
        for i in range(200):
            f = av_frame(np.asarray(IDLE_FRAME), i)
            rtp.compute_audio_level_dbov(f)
            idle_enc.encode(f)
        idle_us = min(idle_us, 1e6 * (time.process_time() - c0) / 200)
    idle_bytes = sum(len(p) for p in idle_enc.encode(av_frame(np.asarray(IDLE_FRAME), 201))[0])
    rows.append(_opus_row("aiortc default (stereo 96k, audio level in Python)", payloads, cpu, len(frames), seconds, pcm, idle_us, idle_bytes))
    for settings in [OpusSettings(), OpusSettings(fec=False, packet_loss=0), OpusSettings(bitrate=24_000),
                     OpusSettings(bitrate=48_000), OpusSettings(bitrate=64_000), OpusSettings(complexity=5)]:
        cpu, idle_us = math.inf, math.inf
        for _ in range(3):
            enc = VoiceOpusEncoder(settings)
            payloads, spent = [], 0.0
            for i, block in enumerate(frames):
                c0 = time.process_time()
                p = enc.encode(block, i * 960)
                spent += time.process_time() - c0
                payloads.append(bytes(p))
            cpu = min(cpu, spent)
            for i in range(10):
                enc.encode(IDLE_FRAME, i * 960, silent=True)
            c0 = time.process_time()
            for i in range(200):
                p = enc.encode(IDLE_FRAME, i * 960, silent=True)
            idle_us = min(idle_us, 1e6 * (time.process_time() - c0) / 200)
        label = (f"ours mono {settings.bitrate // 1000}k" + (" FEC" if settings.fec else "")
                 + (f" complexity {settings.complexity}" if settings.complexity != 10 else ""))
        rows.append(_opus_row(label, payloads, cpu, len(frames), seconds, pcm, idle_us, len(bytes(p))))
    return {"source": source, "seconds": round(seconds, 2), "rows": rows}


def _opus_row(label, payloads, cpu, n_frames, seconds, pcm, idle_us, idle_bytes) -> dict:
    dec = _decode(payloads)
    snr, lag, level_db = _snr_db(pcm, dec)
    return {
        "encoder": label,
        "kbit_s": round(8 * sum(len(p) for p in payloads) / seconds / 1000, 1),
        "encode_us_per_frame": round(1e6 * cpu / n_frames, 1),
        "snr_db": round(snr, 1),
        "spectral_snr_db": round(_spectral_snr_db(pcm, dec, lag, level_db), 1),
        "level_db": round(level_db, 1),
        "idle_us_per_frame": round(idle_us, 1),
        "idle_bytes_per_packet": idle_bytes,
    }


def print_opus_table(opus: dict) -> None:
    print()
    print(f"Opus ({opus['source']}, {opus['seconds']} s of speech; SNR after decoding: waveform, and of STFT magnitudes)")
    head = f"{'encoder':52} {'kbit/s':>7} {'µs/frame':>9} {'SNR dB':>7} {'spec dB':>7} {'level':>6} {'idle µs':>8} {'idle B':>7}"
    print(head)
    print("-" * len(head))
    for r in opus["rows"]:
        print(f"{r['encoder']:52} {r['kbit_s']:7.1f} {r['encode_us_per_frame']:9.1f} {r['snr_db']:7.1f} {r['spectral_snr_db']:7.1f} {r['level_db']:6.1f} "
              f"{r['idle_us_per_frame']:8.1f} {r['idle_bytes_per_packet']:7d}")


# -- 2b. sender CPU per frame ----------------------------------------------------------------
def sender_cost(frames: int = 1000) -> list[dict]:
    """CPU per 20 ms frame of one session's whole send path, without a network: the track's
    ``recv`` (playout, frame or packet) plus what aiortc's sender does with it (audio level and
    encoding in the executor for frames, nothing for packets), RTP serialisation and SRTP.
    Best of five interleaved passes; sessions per core = 1 / (CPU per frame × 50)."""
    import soxr
    from aiortc.codecs.opus import OpusEncoder
    from aiortc.rtp import HeaderExtensionsMap, RtpPacket, compute_audio_level_dbov
    from pylibsrtp import Policy, Session

    from myna.audio.opus import OpusSettings
    from myna.audio.playout import Playout
    from myna.rtc.track import PacedAudioTrack

    pcm48, _ = speech_48k()
    pcm24 = soxr.resample(pcm48.astype(np.float32) / 32768, 48_000, 24_000).astype(np.float32)

    async def one(mode: str, speaking: bool) -> float:
        loop = asyncio.get_running_loop()
        t = [0.0]

        async def no_sleep(seconds: float) -> None:
            t[0] += seconds

        playout = Playout(lambda e: None, clock=lambda: t[0])
        track = PacedAudioTrack(playout, clock=lambda: t[0], sleep=no_sleep,
                                opus=OpusSettings() if mode == "packets" else None)
        encoder = OpusEncoder()
        srtp = Session(Policy(key=bytes(range(30)), ssrc_type=Policy.SSRC_ANY_OUTBOUND))
        extensions = HeaderExtensionsMap()
        pos, seq = 0, 0
        await track.recv()
        c0 = time.process_time()
        for i in range(frames):
            if speaking and i % 4 == 0:  # a DSM-like producer: 80 ms at 24 kHz
                if i % 500 == 0:
                    playout.begin_turn(f"t{i}", t[0])
                if pos + 1920 > len(pcm24):
                    pos = 0
                playout.push_audio(f"t{i - i % 500}", pcm24[pos : pos + 1920], 24_000)
                pos += 1920
            data = await track.recv()
            if mode == "frames":
                level = compute_audio_level_dbov(data)
                payloads, timestamp = await loop.run_in_executor(None, encoder.encode, data, False)
            else:
                level, payloads, timestamp = None, [bytes(data)], data.pts
            for payload in payloads:
                packet = RtpPacket(payload_type=111, sequence_number=seq & 0xFFFF, timestamp=(timestamp or 0) & 0xFFFFFFFF)
                packet.ssrc = 1234
                packet.payload = payload
                if level is not None:
                    packet.extensions.audio_level = (False, -level)
                srtp.protect(packet.serialize(extensions))
                seq += 1
        return (time.process_time() - c0) / frames

    best: dict[tuple[str, bool], float] = {}
    for _ in range(5):  # passes interleaved, so both modes see the same machine load
        for speaking in (True, False):
            for mode in ("frames", "packets"):
                cost = asyncio.run(one(mode, speaking))
                best[mode, speaking] = min(best.get((mode, speaking), math.inf), cost)
    rows = []
    for speaking in (True, False):
        for mode in ("frames", "packets"):
            per_frame = best[mode, speaking]
            rows.append({
                "mode": mode,
                "load": "speaking" if speaking else "idle",
                "us_per_frame": round(1e6 * per_frame, 1),
                "cpu_ms_per_session_s": round(1e3 * per_frame * 50, 2),
                "sessions_per_core": round(1.0 / (per_frame * 50), 1),
            })
    return rows


def print_sender_cost(rows: list[dict]) -> None:
    print()
    print("Send path CPU per session (no network: track + aiortc's per-frame work + RTP + SRTP; best of 5)")
    head = f"{'mode':8} {'load':9} {'µs/frame':>9} {'cpu ms/s':>9} {'sessions/core':>13}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['mode']:8} {r['load']:9} {r['us_per_frame']:9.1f} {r['cpu_ms_per_session_s']:9.2f} {r['sessions_per_core']:13.1f}")
    print("frames = aiortc encodes (stereo 96 kbit/s, audio level in Python); packets = our mono 32 kbit/s FEC packets")


# -- 3. capacity -----------------------------------------------------------------------------
LEVELS = [1, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]
IDLE_LEVELS = [4, 16]


def _loopback_only() -> None:
    """ICE host candidates: 127.0.0.1 and nothing else."""
    import aioice.ice

    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]


class _Feeder:
    """A continuous speaker: a DSM-like producer (80 ms at 24 kHz every 80 ms), 10 s turns."""

    def __init__(self, playout, pcm24: np.ndarray):
        self.playout = playout
        self.pcm24 = pcm24
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        k, pos = 0, 0
        step = 1920  # 80 ms at 24 kHz
        while True:
            turn = f"t{k}"
            self.playout.begin_turn(turn, time.monotonic())
            for _ in range(125):  # 10 s
                if pos + step > len(self.pcm24):
                    pos = 0
                self.playout.push_audio(turn, self.pcm24[pos : pos + step], 24_000)
                pos += step
                await asyncio.sleep(0.08)
            self.playout.end_turn(turn)
            k += 1


async def capacity(budget_s: float, max_p99_ms: float, step_s: float = 3.0) -> dict:
    """Sessions per worker process before p99 deadline deviation passes the limit.

    The limit is ``max_p99_ms`` above this process's own timer p99 with no session (the
    machine is shared: other work already delays wake-ups). Speaking sessions are added in
    steps (:data:`LEVELS`) for each output mode; then idle sessions are measured at the last
    4 and 16 idle sessions. Worker CPU per session is the least-squares slope of process CPU
    against sessions over the steps (fixed per-process costs drop out).
    """
    import soxr

    _loopback_only()
    pcm48, _ = speech_48k()
    pcm24 = soxr.resample(pcm48.astype(np.float32) / 32768, 48_000, 24_000).astype(np.float32)
    base = await _overshoot(100)
    baseline_p99 = percentile(base, 99)
    limit = baseline_p99 + max_p99_ms
    t_end = time.monotonic() + budget_s
    modes = []
    for k, mode in enumerate(("frames", "packets")):  # speaking: 30 % of the budget each
        until = min(t_end, time.monotonic() + (t_end - time.monotonic()) * (0.3 if k == 0 else 0.43))
        modes.append(await _ramp(mode, True, pcm24, LEVELS, until, step_s, limit))
    for k, mode in enumerate(("frames", "packets")):  # idle: the rest
        until = time.monotonic() + max((t_end - time.monotonic()) / (2 - k), 2 * step_s + 6)
        modes.append(await _ramp(mode, False, pcm24, IDLE_LEVELS, until, step_s, limit))
    return {"max_p99_ms": max_p99_ms, "baseline_p99_ms": round(baseline_p99, 2), "limit_p99_ms": round(limit, 2),
            "step_s": step_s, "modes": modes,
            "note": "peers run in a child process with Opus decoding stubbed out (they receive, decrypt "
                    "and jitter-buffer), so the worker's own cost is measured; the machine's 2 cores are shared"}


async def _ramp(mode: str, speaking: bool, pcm24: np.ndarray, levels: list[int], until: float, step_s: float, limit: float) -> dict:
    from aiortc import RTCPeerConnection, RTCSessionDescription

    from myna.audio.opus import OpusSettings
    from myna.audio.playout import Playout
    from myna.rtc.ice import rtc_configuration
    from myna.rtc.track import PacedAudioTrack

    opus = OpusSettings() if mode == "packets" else None
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from myna.bench.playout import _peer_farm; _peer_farm()",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    pcs, tracks, feeders, rows = [], [], [], []
    late_ms: list[float] = []  # each frame's wake-up lateness in this step, all sessions (ms)
    try:
        for level in levels:
            if rows and time.monotonic() + step_s + 1.5 > until:
                break
            while len(pcs) < level:  # connect the new sessions
                pc = RTCPeerConnection(rtc_configuration())
                playout = Playout(lambda e: None)
                track = PacedAudioTrack(playout, opus=opus, on_frame=lambda s: late_ms.append(1000.0 * s))
                pc.addTrack(track)
                await pc.setLocalDescription(await pc.createOffer())
                proc.stdin.write((json.dumps({"sdp": pc.localDescription.sdp}) + "\n").encode())
                await proc.stdin.drain()
                answer = json.loads(await proc.stdout.readline())
                await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))
                pcs.append(pc)
                tracks.append(track)
                if speaking:
                    feeders.append(_Feeder(playout, pcm24))
            t_wait = time.monotonic() + 5
            while any(pc.connectionState != "connected" for pc in pcs) and time.monotonic() < t_wait:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # let DTLS and the first frames settle
            late_ms.clear()
            slips = sum(t.stats().slips for t in tracks)
            c0, w0, p0 = time.process_time(), time.monotonic(), (process_cpu_s(proc.pid) or 0.0)
            await asyncio.sleep(step_s)
            wall = time.monotonic() - w0
            cpu = (time.process_time() - c0) / wall
            peers_cpu = ((process_cpu_s(proc.pid) or 0.0) - p0) / wall
            late = list(late_ms)
            rows.append({
                "sessions": level,
                "connected": sum(pc.connectionState == "connected" for pc in pcs),
                "frames": len(late),
                "p50_ms": round(percentile(late, 50), 2),
                "p99_ms": round(percentile(late, 99), 2),
                "slips": sum(t.stats().slips for t in tracks) - slips,
                "worker_cpu_cores": round(cpu, 3),
                "peers_cpu_cores": round(peers_cpu, 3),
                "machine_load_1min": round(os.getloadavg()[0], 2),
            })
            if rows[-1]["p99_ms"] > limit:
                break
    finally:
        for f in feeders:
            f.task.cancel()
        await asyncio.gather(*(pc.close() for pc in pcs), return_exceptions=True)
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except asyncio.TimeoutError:
            proc.kill()
    ok = [r for r in rows if r["p99_ms"] <= limit]
    if len(rows) >= 2:  # marginal CPU per session: least-squares slope of worker CPU on sessions
        n = np.array([r["sessions"] for r in rows], dtype=np.float64)
        c = np.array([r["worker_cpu_cores"] for r in rows], dtype=np.float64)
        per_session = float(np.polyfit(n, c, 1)[0])
    else:
        per_session = rows[0]["worker_cpu_cores"] / rows[0]["sessions"] if rows else math.nan
    return {
        "mode": mode,
        "load": "speaking" if speaking else "idle",
        "steps": rows,
        "max_sessions_within_limit": ok[-1]["sessions"] if ok else 0,
        "limit_reached": bool(rows and rows[-1]["p99_ms"] > limit),
        "cpu_ms_per_session_s": round(1000 * per_session, 2),
        "sessions_per_core": round(1.0 / per_session, 1) if per_session and per_session > 0 else None,
    }


def print_capacity(cap: dict, max_p99_ms: float) -> None:
    print()
    print(f"Capacity: sessions from one worker process to aiortc peers on loopback; limit p99 deadline deviation "
          f"{cap['limit_p99_ms']} ms = {max_p99_ms} ms above this machine's no-session timer p99 ({cap['baseline_p99_ms']} ms)")
    head = f"{'mode':8} {'load':9} {'max sessions':>12} {'limit hit':>9} {'cpu ms/session/s':>16} {'sessions/core':>13}   steps (sessions:p99 ms:worker/peers cores)"
    print(head)
    print("-" * len(head))
    for m in cap["modes"]:
        steps = " ".join(f"{s['sessions']}:{s['p99_ms']}:{s['worker_cpu_cores']}/{s['peers_cpu_cores']}" for s in m["steps"])
        print(f"{m['mode']:8} {m['load']:9} {m['max_sessions_within_limit']:12d} {str(m['limit_reached']):>9} "
              f"{m['cpu_ms_per_session_s']:16.2f} {str(m['sessions_per_core']):>13}   {steps}")
    print(cap["note"])


def _peer_farm() -> None:
    """Child process: answer offers read from stdin (one JSON line each) with receive-only peers."""
    import aiortc.rtcrtpreceiver as receiver
    from aiortc import RTCPeerConnection, RTCSessionDescription
    from aiortc.codecs.base import Decoder

    from myna.rtc.ice import rtc_configuration

    class _NoDecode(Decoder):
        def decode(self, encoded_frame):
            return []

    receiver.get_decoder = lambda codec: _NoDecode()
    _loopback_only()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        pcs = []
        while True:
            line = await reader.readline()
            if not line:
                break
            offer = json.loads(line)
            pc = RTCPeerConnection(rtc_configuration())
            pcs.append(pc)
            await pc.setRemoteDescription(RTCSessionDescription(offer["sdp"], "offer"))
            await pc.setLocalDescription(await pc.createAnswer())
            sys.stdout.write(json.dumps({"sdp": pc.localDescription.sdp}) + "\n")
            sys.stdout.flush()
        await asyncio.gather(*(pc.close() for pc in pcs), return_exceptions=True)

    asyncio.run(main())
