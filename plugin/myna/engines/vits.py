"""A Piper voice (VITS) as a frame producer: text → latent once per unit, latent → waveform in chunks.

A Piper voice is one ONNX graph: phonemes → text encoder and duration predictor → a latent of
frames (one per ``hop_length`` samples, 256 at 22.05 kHz: 11.6 ms) → a normalising flow →
the HiFi-GAN decoder → samples. Measured here (one onnxruntime thread, ``en_US-joe-medium``,
a 24-word sentence): the encoder and durations take ~15 % of the compute, the flow ~15 %, the
decoder ~70 %, and the flow and the decoder are convolutions along the frames. So
:class:`SplitVoice` cuts the shipped graph (``onnx.utils.Extractor``, for any Piper voice) at the
flow's input and at the decoder's input into three graphs:

- :meth:`SplitVoice.encode`: phoneme ids → the unit's latent (``z_p``, its mask) and each
  phoneme id's frames (the alignments that time the words). The whole unit at once: the
  encoder attends over all of it, and the prosody is the sentence's.
- :meth:`SplitVoice.render`: frames ``[start, end)`` of that latent → their samples. The flow
  runs over what the first chunk needs, then over windows ahead of what is needed (:data:`FLOW_STEP` frames, with
  :data:`FLOW_CONTEXT` frames of context each side; its output is kept for the chunks after),
  the decoder over the chunk with :data:`DECODER_CONTEXT` frames each side; only the chunk's
  own samples are kept. A chunked unit matches the unit decoded whole to better than −50 dB
  (``tests/engines/test_vits.py`` measures it), so no join is heard.

The split is checked when the voice loads: with the noise scales at 0 the three graphs and the
whole graph must give the same samples. A voice whose graph does not split that way (another
export) is served whole: :meth:`encode` synthesises the unit and :meth:`render` slices it.

Every method blocks: call them on the engine's synthesis threads.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

#: Decoder context each side of a chunk (frames, 11.6 ms each at 22.05 kHz): −55 to −64 dB
#: against the whole decode for chunks of 8 to 48 frames; 4 frames gave −26 dB.
DECODER_CONTEXT = 8
#: Flow context each side of a window (frames): the flow's four coupling layers see ±32 frames;
#: 16 gave −44 dB, 24 −85 dB, 32 −120 dB.
FLOW_CONTEXT = 32
#: Frames the flow runs over at a time after the first window (its output is kept for later
#: chunks): larger windows share the context's cost among more frames (256: +25 % on the
#: flow's ~15 % of the compute), smaller ones keep each job short.
FLOW_STEP = 256
#: A sentence asked for at another pace lasts ``1 / speed`` of its own length to within this
#: fraction (:meth:`SplitVoice._length_scale`) ...
PACE_TOLERANCE = 0.02
#: ... after at most this many corrections of its length scale (each one encoder run).
PACE_STEPS = 3
#: Samples above this (of full scale, 1.0) count as sound for the loudness measure.
_PEAK_FLOOR = 1e-3


#: Noise drawn per phoneme id for each of a seeded graph's noise inputs (:func:`_noise_inputs`):
#: enough for a latent of 192 channels at 10 frames per phoneme id (the voice makes 2–6;
#: half speed doubles it). A latent that needs more reuses the draw from its start.
NOISE_PER_ID = 2048


def _noise_inputs(model) -> list[str]:
    """Replace each random node of ``model`` (``RandomNormalLike``) by a graph input of noise:
    the node's output is the input's first values, reshaped like the node's input (the input
    repeated if short), times the node's scale, plus its mean. Returns the new inputs' names.

    onnxruntime seeds a random node's generator once per session and draws on from there, so
    what a seeded voice says would depend on everything it said before it (and on guesses
    dropped: :class:`myna.engines.piper.PiperStream`); with noise fed per unit
    (:meth:`SplitVoice._noise`), a text's take depends only on the text and the seed.

    Raises:
        ValueError: a random node that is not ``RandomNormalLike`` (``RandomUniform``…).
    """
    from onnx import TensorProto, helper, numpy_helper

    graph, names, nodes = model.graph, [], []
    graph.initializer.extend([numpy_helper.from_array(np.array([0], np.int64), "/noise/zero"),
                              numpy_helper.from_array(np.array([1], np.int64), "/noise/one")])
    for node in graph.node:
        if not node.op_type.startswith("Random"):
            nodes.append(node)
            continue
        if node.op_type != "RandomNormalLike":
            raise ValueError(f"random node {node.name} is {node.op_type}: only RandomNormalLike is fed")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        k = len(names)
        pool, p = f"noise_{k}", f"/noise_{k}/"
        names.append(pool)
        graph.input.append(helper.make_tensor_value_info(pool, TensorProto.FLOAT, [f"noise_{k}_length"]))
        x, y = node.input[0], node.output[0]
        scaled = attrs.get("scale", 1.0) != 1.0 or attrs.get("mean", 0.0) != 0.0
        nodes += [
            helper.make_node("Shape", [x], [p + "shape"]),
            helper.make_node("ReduceProd", [p + "shape"], [p + "n"], keepdims=1),
            helper.make_node("Shape", [pool], [p + "length"]),
            helper.make_node("Div", [p + "n", p + "length"], [p + "whole"]),
            helper.make_node("Add", [p + "whole", "/noise/one"], [p + "repeats"]),
            helper.make_node("Tile", [pool, p + "repeats"], [p + "tiled"]),
            helper.make_node("Slice", [p + "tiled", "/noise/zero", p + "n"], [p + "flat"]),
            helper.make_node("Reshape", [p + "flat", p + "shape"], [p + "normal" if scaled else y]),
        ]
        if scaled:
            graph.initializer.extend([
                numpy_helper.from_array(np.array(attrs.get("scale", 1.0), np.float32), p + "scale"),
                numpy_helper.from_array(np.array(attrs.get("mean", 0.0), np.float32), p + "mean")])
            nodes += [helper.make_node("Mul", [p + "normal", p + "scale"], [p + "scaled"]),
                      helper.make_node("Add", [p + "scaled", p + "mean"], [y])]
    del graph.node[:]
    graph.node.extend(nodes)
    return names


@dataclass
class Latent:
    """One unit's latent, as :meth:`SplitVoice.encode` made it (fields are the voice's).

    Attributes:
        frames: frames of audio the unit has (``samples = frames × hop``).
        word_starts: the start of each spoken word (samples from the unit's start).
        z_p: the flow's input, float32 ``[1, C, frames]`` (None when the voice is served whole).
        mask: its frame mask, float32 ``[1, 1, frames]``.
        audio: the whole unit's samples when the voice is served whole (else None).
    """

    frames: int
    word_starts: list[int]
    z_p: np.ndarray | None = None
    mask: np.ndarray | None = None
    audio: np.ndarray | None = None
    z: np.ndarray | None = field(default=None, repr=False)  # the flow's output for frames [0, z_end)
    z_end: int = 0
    #: Held while the flow extends ``z``: a unit's chunks may be rendered on two threads at once.
    flow_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


class SplitVoice:
    """A Piper voice in three stages (see the module docstring).

    Args:
        model_path: the voice's ``.onnx`` file.
        config_path: its ``.onnx.json``.
        threads: onnxruntime intra-op threads per stage (1: leave the other cores to the pacer
            and to other jobs).
        seed: the voice's noise is drawn from this seed and each sentence's phoneme ids
            (:func:`_noise_inputs`): a text then renders the same way whatever was said
            before it and in every process (tests, A/B listening). None: onnxruntime's own
            draw, fresh on every run, as Piper does.

    Attributes:
        sample_rate: Hz.
        hop: samples per latent frame.
        split: the graph was split (False: units are synthesised whole).
        gain: the loudness every unit is scaled by (measured at :meth:`calibrate`): a chunk
            cannot be normalised by its unit's peak, which is not known yet.
    """

    def __init__(self, model_path: str | Path, config_path: str | Path, threads: int = 1, seed: int | None = None):
        import onnx
        import onnxruntime as ort
        from piper.config import PiperConfig
        from piper.patch_voice_with_alignment import add_alignment_output
        from piper.voice import PiperVoice

        if seed is not None and seed < 0:
            raise ValueError(f"seed {seed} is negative (a seed is 0 or more)")
        model = onnx.load(str(model_path))
        self.seed = seed
        self._noise_names = _noise_inputs(model) if seed is not None else []
        self._noise_of: tuple[tuple, list[np.ndarray]] | None = None  # the last sentence's noise
        self._durations = add_alignment_output(model)  # frames per phoneme id (the Ceil of the durations)
        with open(config_path, encoding="utf-8") as f:
            self.config = PiperConfig.from_dict(json.load(f))
        self.sample_rate = self.config.sample_rate
        self.hop = self.config.hop_length
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1

        def session(graph) -> ort.InferenceSession:
            return ort.InferenceSession(graph.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])

        self._whole = session(model)
        self._voice = PiperVoice(session=self._whole, config=self.config)  # phonemes and ids, as Piper makes them
        self._inputs = [i.name for i in model.graph.input]
        self.split = False
        self.gain = 1.0
        self.sid = 0  # the speaker of a multi-speaker model (speaker())
        try:
            flow_in, dec_in = _cuts(model)
            extractor = onnx.utils.Extractor(model)
            self._encoder = session(extractor.extract_model(self._inputs, [*flow_in, self._durations]))
            self._flow = session(extractor.extract_model(flow_in, dec_in))
            self._decoder = session(extractor.extract_model(dec_in, [model.graph.output[0].name]))
            self._flow_in, self._dec_in = flow_in, dec_in
            self.split = self._matches_whole()
        except Exception as exc:  # another export: serve units whole
            log.warning("piper voice %s: not split into stages (%s); units are synthesised whole", model_path, exc)
        if not self.split:
            log.warning("piper voice %s: its stages do not reproduce the whole graph; units are synthesised whole",
                        model_path)

    # -- text → latent --------------------------------------------------------------------
    def phonemes(self, text: str) -> list[list[str]]:
        """The text's phonemes, one list per sentence as espeak-ng reads it (empty ones left out)."""
        return [p for p in self._voice.phonemize(text) if p]

    def encode(self, phonemes: list[str], noise: bool = True, speed: float = 1.0) -> Latent:
        """One sentence's phonemes → its :class:`Latent` (the whole unit at once).

        Args:
            noise: the voice's noise scales (False: 0, deterministic; the load check).
            speed: pace against the voice's own (1.0): the sentence lasts ``1 / speed`` as long
                (:meth:`_length_scale`; the pitch is the voice's).
        """
        ids = self._voice.phonemes_to_ids(phonemes)
        feed = self._feed(ids, noise, self._length_scale(ids, noise, speed) if speed != 1.0 else None)
        if not self.split:
            audio, samples = self._whole.run(None, feed)
            per_id = (np.asarray(samples).reshape(-1) * self.hop).astype(np.int64)
            audio = np.asarray(audio, np.float32).reshape(-1) * self.gain
            return Latent(frames=len(audio) // self.hop + 1, word_starts=_word_starts(phonemes, ids, per_id, self.config),
                          audio=np.clip(audio, -1.0, 1.0))
        *z_p, frames = self._encoder.run(None, feed)
        per_id = (np.asarray(frames).reshape(-1) * self.hop).astype(np.int64)
        return Latent(frames=int(z_p[0].shape[-1]), word_starts=_word_starts(phonemes, ids, per_id, self.config),
                      z_p=z_p[0], mask=z_p[1])

    # -- latent → waveform ----------------------------------------------------------------
    def render(self, latent: Latent, start: int, end: int, after: int | None = None) -> np.ndarray:
        """The samples of frames ``[start, end)`` of ``latent``: float32 ``[(end - start) × hop]``
        (the unit's last chunk: what is left), scaled by :attr:`gain`, in [-1, 1].

        The flow's output is kept on the latent for the next chunk, computed in windows that
        depend on the chunks asked for, so chunks are rendered in order of ``start``. Two may
        run at once on two threads: ``after`` is the end of the chunk before this one when that
        one may not have run yet (every chunk before it has); its share of the flow is run first,
        as it would have been, so the samples are the same whichever thread comes first (the
        flow runs under the latent's ``flow_lock``; each chunk's decoder runs on its own)."""
        end = min(end, latent.frames)
        if latent.audio is not None:
            return latent.audio[start * self.hop : end * self.hop]
        lo, hi = max(0, start - DECODER_CONTEXT), min(latent.frames, end + DECODER_CONTEXT)
        with latent.flow_lock:
            if after is not None:
                self._flow_until(latent, min(latent.frames, after + DECODER_CONTEXT))
            self._flow_until(latent, hi)
            z = latent.z[..., lo:hi]
        audio = self._decoder.run(None, {self._dec_in[0]: z})[0].reshape(-1)
        out = audio[(start - lo) * self.hop : (end - lo) * self.hop] * self.gain
        return np.clip(out, -1.0, 1.0).astype(np.float32, copy=False)

    def _flow_until(self, latent: Latent, frame: int) -> None:
        """Run the flow so that its output covers frames ``[0, frame)``."""
        while latent.z_end < frame:
            a = latent.z_end
            # The first window is only what the first chunk needs (it is what a listener waits
            # for); later ones run ahead by FLOW_STEP frames, sharing the context's cost.
            b = min(latent.frames, frame if a == 0 else max(frame, a + FLOW_STEP))
            lo, hi = max(0, a - FLOW_CONTEXT), min(latent.frames, b + FLOW_CONTEXT)
            z = self._flow.run(None, {self._flow_in[0]: latent.z_p[..., lo:hi], self._flow_in[1]: latent.mask[..., lo:hi]})[0]
            part = z[..., a - lo : b - lo]
            latent.z = part if latent.z is None else np.concatenate([latent.z, part], axis=-1)
            latent.z_end = b

    # -- whole units ----------------------------------------------------------------------
    def synthesize(self, text: str, noise: bool = True) -> tuple[np.ndarray, list[int]]:
        """A text whole: its samples (float32, scaled by :attr:`gain`) and each spoken word's
        start (samples); every sentence of it one after another."""
        pieces, starts, offset = [], [], 0
        for phonemes in self.phonemes(text):
            latent = self.encode(phonemes, noise)
            pcm = self.render(latent, 0, latent.frames)
            starts += [offset + s for s in latent.word_starts]
            pieces.append(pcm)
            offset += len(pcm)
        return (np.concatenate(pieces) if pieces else np.zeros(0, np.float32)), starts

    def calibrate(self, texts: list[str]) -> float:
        """Set :attr:`gain` so the loudest of ``texts`` peaks at full scale (Piper scales each
        sentence to its own peak; a chunk cannot know its sentence's); returns it. Measured
        with the noise off, so the gain is the same on every start."""
        self.gain = 1.0
        peak = max((float(np.abs(self.synthesize(t, noise=False)[0]).max(initial=0.0)) for t in texts), default=0.0)
        self.gain = 1.0 / peak if peak > _PEAK_FLOOR else 1.0
        return self.gain

    def _length_scale(self, ids: list[int], noise: bool, speed: float) -> float:
        """The length scale that makes this sentence last ``1 / speed`` as long as the voice's
        own (to :data:`PACE_TOLERANCE`).

        Piper rounds each phoneme's duration up to whole frames, so the voice's length scale
        divided by ``speed`` overshoots: a phoneme of 1 frame stays 1 frame (at 1.5, 0.73 of
        the length instead of 0.67). The encoder is run again (it is ~15 % of a sentence's
        compute), with the scale corrected by the frames it gave, at most :data:`PACE_STEPS`
        times."""
        base = self.config.length_scale

        def frames(scale: float) -> int:
            if self.split:  # (the encoder's last output: frames per phoneme id)
                return int(np.asarray(self._encoder.run(None, self._feed(ids, noise, scale))[-1]).sum())
            return np.asarray(self._whole.run(None, self._feed(ids, noise, scale))[0]).size // self.hop

        target = frames(base) / speed
        scale = base / speed
        for _ in range(PACE_STEPS):
            got = frames(scale)
            if abs(got - target) <= PACE_TOLERANCE * target or got == 0:
                break
            scale *= target / got
        return scale

    def _feed(self, ids: list[int], noise: bool, length: float | None = None) -> dict:
        c = self.config
        length = c.length_scale if length is None else length
        scales = [c.noise_scale, length, c.noise_w_scale] if noise else [0.0, length, 0.0]
        feed = {"input": np.array([ids], np.int64), "input_lengths": np.array([len(ids)], np.int64),
                "scales": np.array(scales, np.float32)}
        if "sid" in self._inputs:
            feed["sid"] = np.array([self.sid], np.int64)  # a multi-speaker model: this view's speaker
        if self._noise_names:
            feed.update(zip(self._noise_names, self._noise(ids)))
        return feed

    def _noise(self, ids: list[int]) -> list[np.ndarray]:
        """A seeded voice's noise for a sentence: float32 ``[NOISE_PER_ID × len(ids)]`` per noise
        input, drawn from the seed, the speaker and the ids (kept for the pace's encoder runs)."""
        key, kept = (self.sid, *ids), self._noise_of  # (one read: synthesis threads share the voice)
        if kept is not None and kept[0] == key:
            return kept[1]
        digest = zlib.crc32(np.asarray(ids, np.int64).tobytes())
        rng = np.random.default_rng([self.seed, self.sid, digest, len(ids)])
        noise = [rng.standard_normal(NOISE_PER_ID * max(1, len(ids)), dtype=np.float32) for _ in self._noise_names]
        self._noise_of = key, noise
        return noise

    def speaker(self, sid: int) -> "SplitVoice":
        """This multi-speaker model as speaker ``sid`` (its own gain; the model's sessions are
        shared, nothing is loaded again)."""
        import copy

        view = copy.copy(self)
        view.sid = sid
        return view

    def _matches_whole(self) -> bool:
        """The stages, in chunks, give what the whole graph gives (noise off: deterministic)."""
        phonemes = self.phonemes("The voice is loaded and ready to speak to you now.")[0]
        ids = self._voice.phonemes_to_ids(phonemes)
        whole = np.asarray(self._whole.run(None, self._feed(ids, noise=False))[0], np.float32).reshape(-1)
        latent = self.encode(phonemes, noise=False)
        chunks = [self.render(latent, a, a + 24) for a in range(0, latent.frames, 24)]
        staged = np.concatenate(chunks)
        n = min(len(staged), len(whole))
        if abs(len(staged) - len(whole)) > self.hop or n == 0:
            return False
        error = float(np.mean((staged[:n] - whole[:n]) ** 2) / max(np.mean(whole[:n] ** 2), 1e-12))
        log.debug("piper stages against the whole graph: %.1f dB", 10 * np.log10(max(error, 1e-30)))
        return error < 1e-5  # −50 dB


def _cuts(model) -> tuple[list[str], list[str]]:
    """The tensors where the graph is cut: the flow's inputs (the latent and its mask) and the
    decoder's (the flow's output).

    Raises:
        ValueError: the graph has no ``/flow/`` and ``/dec/`` parts fed by one latent (not a Piper export).
    """
    nodes = model.graph.node
    produced = {out: node for node in nodes for out in node.output}
    initializers = {i.name for i in model.graph.initializer}

    def inputs_of(prefix: str) -> list[str]:
        inner = {out for n in nodes if n.name.startswith(prefix) for out in n.output}
        found = []
        for n in nodes:
            if n.name.startswith(prefix):
                for name in n.input:
                    source = produced.get(name)
                    outside = source is not None and source.name.startswith("/") and not source.name.startswith(prefix)
                    if name and name not in inner and name not in initializers and outside and name not in found:
                        found.append(name)
        return found

    flow_in, dec_in = inputs_of("/flow/"), inputs_of("/dec/")
    if len(flow_in) != 2 or len(dec_in) != 1:
        raise ValueError(f"unexpected cut: flow {flow_in}, decoder {dec_in}")
    rank = {n: i for i, n in enumerate(flow_in)}
    z_p = max(flow_in, key=lambda n: ("Cast" not in produced[n].op_type, rank[n]))  # the mask is a Cast
    return [z_p, next(n for n in flow_in if n != z_p)], dec_in


def _word_starts(phonemes: list[str], ids: list[int], per_id: np.ndarray, config) -> list[int]:
    """Each spoken word's start (samples): the phoneme after ``^`` and after each space, with the
    ids Piper gives every phoneme (its own, then a pad; ``$`` has no pad)."""
    from piper.const import BOS, EOS, PAD

    pad = config.phoneme_id_map.get(PAD, [])
    starts, position, index, at_start = [], 0, 0, False
    if len(per_id) != len(ids):
        return []
    for phoneme in itertools.chain([BOS], phonemes, [EOS]):
        width = len(config.phoneme_id_map.get(phoneme, [])) + (len(pad) if phoneme != EOS else 0)
        if phoneme in (BOS, " "):
            at_start = True
        elif at_start and phoneme != EOS:
            starts.append(position)
            at_start = False
        position += int(per_id[index : index + width].sum())
        index += width
    return starts
