"""``POST /v1/audio/speech`` and ``GET /v1/models`` of a worker in this process (tone engine),
driven by the official ``openai`` client and, for HTTP/1.0, a raw socket; G.711 on the WebSocket.
Loopback only.

What the voice says is checked against the real voice in tests/e2e/test_speech_openai.py;
here the tone engine's known durations tell whether every format carries all the audio.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import io
import json

import aiohttp
import av
import numpy as np
import openai
import pytest

from g711 import alaw_to_s16, ulaw_to_s16
from inprocess import ToneEngine
from myna.audio.encode import FORMATS, StreamEncoder
from myna.bench.soak import serve_in_process
from myna.limits import Limits
from myna.server.app import Worker
from myna.server.auth import Authenticator, mint_token

pytestmark = pytest.mark.network

KEY, SECRET = "myna-test-key", "a-test-secret-that-is-long-enough-for-hs256"
HOUR = datetime.timedelta(hours=1)
WORD_MS = 120.0  # the tone engine's word


def worker(**limits) -> Worker:
    return Worker(engines={"tone": ToneEngine(), "tone2": ToneEngine("tone2")}, limits=Limits.off() if not limits else
                  Limits(**{"max_sessions_per_client": None, "offer_rate": None, "message_rate": None, **limits}))


_clients: list[openai.AsyncOpenAI] = []


def client(url: str, token: str = "unused") -> openai.AsyncOpenAI:
    """The real ``openai`` client for ``url``, closed when the test ends (left open, it is
    closed when collected, after its loop is gone, and asyncio logs that in a later test)."""
    _clients.append(openai.AsyncOpenAI(base_url=url + "/v1", api_key=token, max_retries=0))
    return _clients[-1]


@pytest.fixture(autouse=True)
async def _close_clients():
    yield
    while _clients:
        await _clients.pop().close()


def decoded_seconds(data: bytes) -> tuple[float, int]:
    """Duration and rate of an encoded file, decoded by PyAV."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return samples / stream.rate, stream.rate


def test_g711_reference_decoders_agree_with_audioop_and_ffmpeg_encodes_g711():
    """The textbook decoders above are right (audioop, Python ≤ 3.12's own G.711), so they can
    check FFmpeg's encoders: a 1 kHz tone comes back within G.711's quantisation."""
    audioop = pytest.importorskip("audioop")
    every_byte = bytes(range(256))
    assert np.array_equal(ulaw_to_s16(every_byte), np.frombuffer(audioop.ulaw2lin(every_byte, 2), np.int16))
    assert np.array_equal(alaw_to_s16(every_byte), np.frombuffer(audioop.alaw2lin(every_byte, 2), np.int16))
    x = (0.5 * 32767 * np.sin(2 * np.pi * 1000 * np.arange(8000) / 8000)).astype(np.int16)
    for name, decode in (("pcm_mulaw", ulaw_to_s16), ("pcm_alaw", alaw_to_s16)):
        encoder = StreamEncoder(FORMATS[name])
        data = encoder.encode(x[:3000].tobytes()) + encoder.encode(x[3000:].tobytes()) + encoder.finish()
        assert len(data) == len(x)  # one byte a sample, nothing held back
        error = decode(data).astype(np.int32) - x
        assert np.abs(error).max() <= 0.04 * 32767 and np.sqrt(np.mean(error**2.0)) < 0.01 * 32767, name


def check_tone_audio(fmt: str, data: bytes, words: int) -> None:
    """``data`` is ``words`` of the tone engine's words in ``fmt``, all of them, decoded."""
    expected_s = words * WORD_MS / 1000
    if fmt == "pcm":  # OpenAI's pcm: s16le mono at 24 kHz, no header
        seconds, rate = len(data) / 2 / 24_000, 24_000
        assert np.abs(np.frombuffer(data, np.int16)).max() > 0.3 * 32767
    elif fmt in ("pcm_mulaw", "pcm_alaw"):  # raw G.711, 8 kHz, one byte a sample
        seconds, rate = len(data) / 8000, 8000
        pcm = (ulaw_to_s16 if fmt == "pcm_mulaw" else alaw_to_s16)(data)
        assert 0.3 * 32767 < np.abs(pcm).max() < 0.5 * 32767  # the tone's 0.4 of full scale
    else:
        seconds, rate = decoded_seconds(data)
    # (encoders with a frame size pad the last frame; Opus decodes at 48 kHz)
    assert expected_s - 0.005 <= seconds <= expected_s + 0.1, (fmt, seconds)
    assert rate == {"opus": 48_000, "pcm_mulaw": 8000, "pcm_alaw": 8000}.get(fmt, 24_000)


@pytest.mark.parametrize("fmt", list(FORMATS))
async def test_every_response_format_carries_all_the_audio(fmt):
    async with serve_in_process(worker()) as url:
        speech = await client(url).audio.speech.create(model="tts-1", voice="alloy", input="one two three four five",
                                                        response_format=fmt)
        data = speech.content
        assert speech.response.headers["Content-Type"] == FORMATS[fmt].content_type
        assert speech.response.headers["Transfer-Encoding"] == "chunked"
        assert "X-Myna-Nothing-To-Speak" not in speech.response.headers
    check_tone_audio(fmt, data, 5)


async def test_streamed_response_comes_in_pieces_as_synthesised():
    async with serve_in_process(worker()) as url:
        async with client(url).audio.speech.with_streaming_response.create(
                model="tone", voice="alloy", input=" ".join(["word"] * 40), response_format="pcm") as response:
            chunks = [chunk async for chunk in response.iter_bytes()]
    assert len(chunks) > 1 and len(b"".join(chunks)) == 40 * 24 * int(WORD_MS) * 2


@pytest.mark.parametrize("fmt", ["pcm", "mp3"])
async def test_sse_stream_carries_the_audio_in_speech_audio_delta_events(fmt):
    """``stream_format: "sse"`` (OpenAI's events, which LiveKit Agents' OpenAI plug-in asks for):
    base64 pieces of the encoded audio in ``speech.audio.delta`` events, then ``speech.audio.done``."""
    async with serve_in_process(worker()) as url:
        async with client(url).audio.speech.with_streaming_response.create(
                model="gpt-4o-mini-tts", voice="ash", input="one two three four five", response_format=fmt,
                stream_format="sse") as response:
            assert response.headers["Content-Type"] == "text/event-stream"
            assert response.request_id  # X-Request-Id, as OpenAI's
            lines = [line async for line in response.iter_lines() if line]
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert all(line.startswith("data: ") for line in lines)
    assert [e["type"] for e in events] == ["speech.audio.delta"] * (len(events) - 1) + ["speech.audio.done"]
    assert len(events) > 2  # streamed in pieces, not one event
    data = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    seconds = len(data) / 2 / 24_000 if fmt == "pcm" else decoded_seconds(data)[0]
    assert abs(seconds - 5 * WORD_MS / 1000) < 0.06


async def test_models_list_the_engines_and_a_token_sees_its_own():
    w = worker()
    w.auth = Authenticator(KEY, SECRET)
    async with serve_in_process(w) as url:
        page = await client(url, mint_token(KEY, SECRET, "alice", HOUR)).models.list()
        assert [m.id for m in page.data] == ["tone", "tone2"] and page.data[0].owned_by == "myna"
        only = client(url, mint_token(KEY, SECRET, "alice", HOUR, engines=["tone2"]))
        assert [m.id for m in (await only.models.list()).data] == ["tone2"]
        assert (await only.models.retrieve("tone2")).id == "tone2"
        with pytest.raises(openai.NotFoundError):
            await only.models.retrieve("tone")
        with pytest.raises(openai.AuthenticationError) as refused:
            await client(url, "not-a-token").models.list()
        assert refused.value.body["code"] == "bad_token"


async def test_tokens_and_the_engine_a_token_may_use():
    w = worker()
    w.auth = Authenticator(KEY, SECRET)
    async with serve_in_process(w) as url:
        expired = mint_token(KEY, SECRET, "bob", -datetime.timedelta(minutes=10))
        for token, error, code in (("garbage", openai.AuthenticationError, "bad_token"),
                                   (expired, openai.AuthenticationError, "token_expired")):
            with pytest.raises(error) as refused:
                await client(url, token).audio.speech.create(model="tone", voice="alloy", input="hello")
            assert refused.value.body["code"] == code and refused.value.body["type"] == "authentication_error"
        async with aiohttp.ClientSession() as http:  # OpenAI's client always sends a key: try none at all
            async with http.post(f"{url}/v1/audio/speech", json={"model": "tone", "input": "hi", "voice": "a"}) as resp:
                assert resp.status == 401 and (await resp.json())["error"]["code"] == "token_required"
        tone2_only = client(url, mint_token(KEY, SECRET, "bob", HOUR, engines=["tone2"]))
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await tone2_only.audio.speech.create(model="tts-1", voice="alloy", input="hello")  # tts-1: the default, tone
        assert refused.value.body == {"message": "this token may not use engine 'tone'", "type": "permission_error",
                                      "param": "model", "code": "forbidden"}
        speech = await tone2_only.audio.speech.create(model="tone2", voice="alloy", input="hello", response_format="pcm")
        assert len(speech.content) == 24 * int(WORD_MS) * 2


async def test_bad_requests_get_openai_errors_naming_the_field():
    async with serve_in_process(worker(max_turn_chars=50)) as url:
        c = client(url)
        cases = [
            # (the tone engine speaks at its own pace, as DSM does: the engine refuses any speed but 1.0)
            (dict(model="tone", voice="alloy", input="hi", speed=1.5), 400, "speed", "unsupported_speed"),
            (dict(model="tone", voice="alloy", input="hi", speed=3.0), 400, "speed", "unsupported_speed"),
            (dict(model="tone", voice="alloy", input="hi", speed=0.25), 400, "speed", "unsupported_speed"),
            (dict(model="tone", voice="alloy", input="hi", speed=9.0), 400, "speed", "bad_request"),
            (dict(model="tone", voice="alloy", input="hi", response_format="ogg"), 400, "response_format",
             "unsupported_format"),
            (dict(model="whisper-1", voice="alloy", input="hi"), 404, "model", "model_not_found"),
            (dict(model="tone", voice="no-such-voice", input="hi"), 400, "voice", "unknown_voice"),
            (dict(model="tone", voice="alloy", input=""), 400, "input", "bad_request"),
            (dict(model="tone", voice="alloy", input=" \n\t "), 400, "input", "bad_request"),
            (dict(model="tone", voice="alloy", input="x" * 51), 400, "input", "turn_too_long"),
            (dict(model="tone", voice="alloy", input="Привет мир"), 400, "input", "unsupported_language"),
            (dict(model="tone", voice="alloy", input="hi", extra_body={"stream_format": "chunks"}), 400,
             "stream_format", "unsupported_stream_format"),
            (dict(model="tone", voice="alloy", input="hi", extra_body={"normalise": "no"}), 400,
             "normalise", "bad_request"),
        ]
        for kwargs, status, param, code in cases:
            with pytest.raises(openai.APIStatusError) as refused:
                await c.audio.speech.create(**kwargs)
            error = refused.value.body
            assert refused.value.status_code == status and (error["param"], error["code"]) == (param, code), kwargs
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
        async with aiohttp.ClientSession() as http:
            for body in (b"{not json", b"[1, 2]"):
                async with http.post(f"{url}/v1/audio/speech", data=body) as resp:
                    error = (await resp.json())["error"]
                    assert resp.status == 400 and error["type"] == "invalid_request_error", error
        # instructions are accepted (and cannot be honoured: documented), and the worker still speaks
        speech = await c.audio.speech.create(model="tone", voice="alloy", input="still here", response_format="pcm",
                                             instructions="Speak cheerfully.")
        assert len(speech.content) == 2 * 24 * int(WORD_MS) * 2
        # normalise (Myna's field): the tone engine says one tone a word, so "555-0199" is one
        # word as written and seven (five five five, zero one nine nine) normalised
        plain = await c.audio.speech.create(model="tone", voice="alloy", input="call 555-0199", response_format="pcm",
                                            extra_body={"normalise": False})
        said = await c.audio.speech.create(model="tone", voice="alloy", input="call 555-0199", response_format="pcm")
        assert len(plain.content) == 2 * len(speech.content) // 2 and len(said.content) == 8 * len(speech.content) // 2


async def test_limits_apply_full_per_client_and_rate():
    w = worker(max_sessions_per_client=1)
    async with serve_in_process(w) as url:
        c = client(url)
        # 4 minutes of audio, unread: the response (and its session) stays open on a full socket
        async with c.audio.speech.with_streaming_response.create(
                model="tone", voice="alloy", input=" ".join(["word"] * 2000), response_format="pcm"):
            with pytest.raises(openai.RateLimitError) as refused:  # the same client's second request at once
                await c.audio.speech.create(model="tone", voice="alloy", input="hi")
            assert refused.value.body["code"] == "too_many_sessions"
            assert int(refused.value.response.headers["Retry-After"]) >= 1
        for _ in range(100):  # the first client went away: its slot is freed
            if w.sessions.admission.total == 0:
                break
            await asyncio.sleep(0.05)
        assert len((await c.audio.speech.create(model="tone", voice="alloy", input="hi", response_format="pcm")).content)
    w = worker(offer_rate=0.001, offer_burst=1)
    async with serve_in_process(w) as url:
        await client(url).audio.speech.create(model="tone", voice="alloy", input="hi")
        with pytest.raises(openai.RateLimitError) as refused:
            await client(url).audio.speech.create(model="tone", voice="alloy", input="hi")
        assert refused.value.body["code"] == "rate_limited" and refused.value.body["type"] == "rate_limit_error"


async def test_a_draining_worker_refuses_speech_with_503():
    w = worker()
    async with serve_in_process(w) as url:
        await w.drain(0)
        with pytest.raises(openai.InternalServerError) as refused:
            await client(url).audio.speech.create(model="tone", voice="alloy", input="hi")
        assert refused.value.status_code == 503 and refused.value.body["code"] == "draining"


async def test_a_client_that_goes_away_mid_stream_frees_its_session():
    w = worker()
    async with serve_in_process(w) as url:
        async with aiohttp.ClientSession() as http:
            body = {"model": "tone", "voice": "alloy", "input": " ".join(["word"] * 200), "response_format": "pcm"}
            async with http.post(f"{url}/v1/audio/speech", json=body) as resp:
                await resp.content.readexactly(1000)
        for _ in range(100):
            if not w.sessions.all():
                break
            await asyncio.sleep(0.05)
        assert not w.sessions.all() and w.sessions.admission.total == 0
        speech = await client(url).audio.speech.create(model="tone", voice="alloy", input="hi", response_format="pcm")
        assert len(speech.content) == 24 * int(WORD_MS) * 2


# -- whole files: synthesised ahead of real time ---------------------------------------------------
#: Agent prose, ~20 s of Piper's audio.
LONG_REPLY = ("Thanks for waiting. I have checked your booking, and everything is in order: the flight leaves "
              "at nine fifteen from terminal two, and you have a window seat near the front. Your hotel is "
              "confirmed for three nights, breakfast included, and the shuttle runs every half hour from the "
              "arrivals hall. If anything changes before you travel, I will send you a message straight away, "
              "so you do not need to check again yourself.")


@pytest.fixture(scope="module")
def piper_worker():
    """A worker with the real Piper engine (two synthesis threads, the synthesis horizon on)."""
    from myna.engines.piper import PiperEngine

    return lambda: Worker(engines={"piper": PiperEngine(workers=2)}, limits=Limits.off())


@pytest.mark.serial  # synthesis speed: on a shared CPU the file arrives late
async def test_a_whole_file_arrives_well_ahead_of_its_audio(piper_worker):
    """Nobody listens through the speech endpoint: the request is synthesised ahead of real
    time (background work beyond the horizon), so ~20 s of mp3 arrives in far less than 20 s
    (``myna bench speech --file`` measures by how much)."""
    w = piper_worker()
    async with serve_in_process(w) as url:
        piper, loop = w.engines["piper"], asyncio.get_running_loop()
        busy, t0 = piper.compute_stats()["busy_s"], loop.time()
        speech = await client(url).audio.speech.create(model="piper", voice="alloy", input=LONG_REPLY,
                                                        response_format="mp3")
        elapsed, busy = loop.time() - t0, piper.compute_stats()["busy_s"] - busy
        seconds, _ = decoded_seconds(speech.content)
        assert seconds >= 15.0
        # Held to real time by the horizon, it took at least seconds - 3 (~18 s here, where Piper's
        # RTF is ~0.4: synthesis itself takes ~8 s); ahead, about its synthesis time.
        assert elapsed < 0.7 * seconds, (elapsed, seconds)
        assert elapsed < 1.5 * busy + 1.0, (elapsed, busy)  # it never waited for the clock
        assert piper.scheduler.background_runs > 0


@pytest.mark.slow
async def test_a_download_closed_early_stops_its_synthesis(piper_worker):
    """A client that closes a long download after its first bytes: the session closes and its
    queued synthesis is dropped, though the request was running ahead of real time."""
    w = piper_worker()
    piper = w.engines["piper"]
    async with serve_in_process(w) as url:
        async with aiohttp.ClientSession() as http:
            body = {"model": "piper", "voice": "alloy", "input": " ".join([LONG_REPLY] * 6), "response_format": "pcm"}
            async with http.post(f"{url}/v1/audio/speech", json=body) as resp:
                await resp.content.readexactly(48_000)
        async with asyncio.timeout(30):
            while w.sessions.all():
                await asyncio.sleep(0.01)
        made = piper.compute_stats()["audio_s"]
        assert piper.scheduler.queued == 0
        assert made < 60.0  # of the ~2 min the whole text would have made
        speech = await client(url).audio.speech.create(model="piper", voice="alloy", input="Hi.", response_format="pcm")
        assert len(speech.content) > 0


# -- HTTP/1.0: no chunked encoding, the body ends with the connection ------------------------------
async def http10(url: str, body: dict | bytes, keep_alive: bool = False) -> tuple[int, dict[str, str], bytes]:
    """POST ``body`` to the speech endpoint as an HTTP/1.0 client does (nginx's default
    ``proxy_http_version 1.0``), on a raw socket: the status, the headers (names in lower
    case) and every byte that came before the server closed the connection."""
    host, port = url.removeprefix("http://").split(":")
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = ["POST /v1/audio/speech HTTP/1.0", f"Host: {host}:{port}", "Content-Type: application/json",
                f"Content-Length: {len(raw)}", *(["Connection: keep-alive"] if keep_alive else [])]
        writer.write("".join(line + "\r\n" for line in head).encode() + b"\r\n" + raw)
        await writer.drain()
        async with asyncio.timeout(30):  # the body ends only when the server closes the connection
            response = await reader.read()
    finally:
        writer.close()
    head, _, data = response.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    assert status_line.split()[0] in ("HTTP/1.0", "HTTP/1.1"), status_line
    return int(status_line.split()[1]), headers, data


@pytest.mark.parametrize("fmt", list(FORMATS))
async def test_http_1_0_gets_every_format_in_a_body_the_closed_connection_ends(fmt):
    """HTTP/1.0 has no chunked encoding (aiohttp refuses to send it: it was a 500): the audio
    streams with neither ``Transfer-Encoding`` nor ``Content-Length``, and ``Connection: close``."""
    async with serve_in_process(worker()) as url:
        status, headers, data = await http10(url, {"model": "tone", "voice": "alloy", "input": "one two three four five",
                                                   "response_format": fmt})
    assert status == 200, data[:300]
    assert "transfer-encoding" not in headers and "content-length" not in headers
    assert headers["connection"] == "close" and headers["content-type"] == FORMATS[fmt].content_type
    assert headers["x-request-id"]
    check_tone_audio(fmt, data, 5)


@pytest.mark.parametrize("fmt", ["pcm", "mp3"])
async def test_http_1_0_sse_stream_and_a_client_asking_to_keep_alive(fmt):
    """``stream_format: "sse"`` over HTTP/1.0 ends with the connection too, and so does a
    response to an HTTP/1.0 client that asked to keep the connection alive: without a length
    it has no other end."""
    async with serve_in_process(worker()) as url:
        status, headers, data = await http10(url, {"model": "gpt-4o-mini-tts", "voice": "ash", "input": "one two three",
                                                   "response_format": fmt, "stream_format": "sse"}, keep_alive=True)
    assert status == 200 and headers["content-type"] == "text/event-stream" and headers["connection"] == "close"
    assert "transfer-encoding" not in headers and "content-length" not in headers
    events = [json.loads(line.removeprefix(b"data: ")) for line in data.split(b"\n\n") if line]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * (len(events) - 1) + ["speech.audio.done"]
    check_tone_audio(fmt, b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), 3)


async def test_http_1_0_refusals_and_nothing_to_speak_are_whole_responses():
    w = worker()
    async with serve_in_process(w) as url:
        status, headers, data = await http10(url, {"model": "tone", "voice": "nobody", "input": "hi"})
        assert status == 400 and json.loads(data)["error"]["code"] == "unknown_voice"
        assert int(headers["content-length"]) == len(data)
        status, headers, data = await http10(url, b"{not json")
        assert status == 400 and json.loads(data)["error"]["code"] == "bad_json"
        status, headers, data = await http10(url, {"model": "tone", "voice": "alloy", "input": "\U0001F44D",
                                                   "response_format": "wav"}, keep_alive=True)
        assert status == 200 and headers["x-myna-nothing-to-speak"] == "1" and headers["connection"] == "close"
        assert decoded_seconds(data) == (0.01, 24_000)
        assert not w.sessions.all()


# -- input with nothing to speak: 200 and a moment of silence; no input at all: 400 --------------
SILENT_MS = 10


def decoded_pcm(fmt: str, data: bytes) -> tuple[np.ndarray, int]:
    """The samples (s16) and rate of ``data`` in ``fmt``."""
    if fmt == "pcm":
        return np.frombuffer(data, np.int16), 24_000
    if fmt in ("pcm_mulaw", "pcm_alaw"):
        return (ulaw_to_s16 if fmt == "pcm_mulaw" else alaw_to_s16)(data), 8000
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [f.to_ndarray().astype(np.float32).reshape(-1) for f in container.decode(stream)]
        pcm = np.concatenate(frames)
        if np.abs(pcm).max(initial=0) <= 1.0:  # a float format: scale to s16
            pcm = pcm * 32767
        return pcm.astype(np.int16), stream.rate


@pytest.mark.parametrize("text", ["\U0001F44D", "\u2026", "...", ":)", "** —"])
@pytest.mark.parametrize("fmt", list(FORMATS))
async def test_input_with_nothing_to_speak_is_200_with_a_moment_of_silence(fmt, text):
    """Pipecat's and LiveKit's OpenAI services send a reply's trailing emoji or a lone ellipsis
    as a request of its own: it is answered, not refused, so no framework reports an error. The
    body is 10 ms of digital silence in the asked format (LiveKit's TTS raises when a text gets
    no audio at all); ``X-Myna-Nothing-To-Speak: 1`` says why."""
    w = worker()
    async with serve_in_process(w) as url:
        speech = await client(url).audio.speech.create(model="tts-1", voice="alloy", input=text, response_format=fmt)
        assert speech.response.status_code == 200
        assert speech.response.headers["X-Myna-Nothing-To-Speak"] == "1"
        assert speech.response.headers["Content-Type"] == FORMATS[fmt].content_type
        assert speech.response.headers["X-Request-Id"]
        assert not w.sessions.all()  # (its session closed)
    pcm, rate = decoded_pcm(fmt, speech.content)
    assert rate == {"opus": 48_000, "pcm_mulaw": 8000, "pcm_alaw": 8000}.get(fmt, 24_000)
    # (an encoder with a frame size pads it: MP3 decodes to 3 frames, AAC to 2)
    assert SILENT_MS / 1000 <= len(pcm) / rate <= SILENT_MS / 1000 + 0.1, (fmt, len(pcm) / rate)
    assert np.abs(pcm.astype(np.int32)).max() <= 8, fmt  # silence (G.711's zero is ±8)


async def test_input_with_nothing_to_speak_over_sse_is_one_silent_delta_then_done():
    async with serve_in_process(worker()) as url:
        async with client(url).audio.speech.with_streaming_response.create(
                model="gpt-4o-mini-tts", voice="ash", input="\U0001F44D", response_format="pcm",
                stream_format="sse") as response:
            assert response.headers["X-Myna-Nothing-To-Speak"] == "1"
            events = [json.loads(line.removeprefix("data: ")) async for line in response.iter_lines() if line]
    assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.done"]
    assert base64.b64decode(events[0]["audio"]) == bytes(2 * 24 * SILENT_MS)


async def test_empty_input_is_still_a_400_and_the_worker_speaks_on():
    """A client that sends no text at all learns it: 400 ``bad_request`` naming ``input``
    (missing, not a string, empty or only whitespace), as before."""
    async with serve_in_process(worker()) as url:
        c = client(url)
        for text in ("", " ", "\n\t \u00a0"):
            with pytest.raises(openai.BadRequestError) as refused:
                await c.audio.speech.create(model="tone", voice="alloy", input=text)
            assert (refused.value.body["param"], refused.value.body["code"]) == ("input", "bad_request"), repr(text)
        async with aiohttp.ClientSession() as http:
            for body in ({"model": "tone", "voice": "alloy"}, {"model": "tone", "voice": "alloy", "input": None},
                         {"model": "tone", "voice": "alloy", "input": ["hi"]}):
                async with http.post(f"{url}/v1/audio/speech", json=body) as resp:
                    assert resp.status == 400 and (await resp.json())["error"]["param"] == "input", body
        speech = await c.audio.speech.create(model="tone", voice="alloy", input="hi", response_format="pcm")
        assert "X-Myna-Nothing-To-Speak" not in speech.response.headers
        assert len(speech.content) == 24 * int(WORD_MS) * 2


# -- G.711 on the WebSocket ---------------------------------------------------------------------
@pytest.mark.parametrize("fmt, decode", [("pcm_mulaw", ulaw_to_s16), ("pcm_alaw", alaw_to_s16)])
async def test_websocket_g711_format(fmt, decode):
    async with serve_in_process(worker()) as url, aiohttp.ClientSession() as http:
        async with http.ws_connect(url.replace("http", "ws", 1) + "/v1/tts/stream") as ws:
            assert (await ws.receive_json())["format"] == "pcm_s16le"
            await ws.send_json({"type": "config", "format": fmt, "sample_rate": 16000})
            assert (await ws.receive_json())["code"] == "bad_config"  # G.711 is 8 kHz only
            await ws.send_json({"type": "config", "format": "speex"})
            assert (await ws.receive_json())["code"] == "bad_config"
            await ws.send_json({"type": "config", "format": fmt})
            ready = await ws.receive_json()
            assert (ready["format"], ready["sample_rate"]) == (fmt, 8000)
            await ws.send_json({"type": "text", "turn_id": "a", "text": "one two three"})
            await ws.send_json({"type": "end_turn", "turn_id": "a"})
            audio = bytearray()
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    audio += msg.data
                elif json.loads(msg.data)["type"] == "turn_done":
                    break
    assert len(audio) == 3 * 8 * int(WORD_MS)  # one byte a sample at 8 kHz
    pcm = decode(bytes(audio)).astype(np.float32) / 32768
    spectrum = np.abs(np.fft.rfft(pcm))
    assert abs(np.argmax(spectrum) * 8000 / len(pcm) - 440) < 5  # the tone engine's 440 Hz, decoded
    assert 0.3 < np.abs(pcm).max() < 0.5  # at its 0.4 of full scale
