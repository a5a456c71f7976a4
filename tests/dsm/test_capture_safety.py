"""Capture safety of the frame loop's phases, checked on the CPU.

On CUDA each phase of each bucket is captured once as a graph and replayed. A graph replays the
kernels it recorded, so a phase must not synchronise with the host (``.item()``, ``.tolist()``,
``bool(tensor)``), draw random numbers (the generator state would be baked in), have shapes that
depend on tensor values (``nonzero``, boolean-mask indexing), build tensors from Python data, or
copy across devices; and it must run the same kernels on the same shapes whatever the state.
Here every phase of every bucket, greedy and sampled, runs under a dispatch-mode checker that
reports any of these, and two runs from different states must give the same op/shape trace.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from myna.dsm.loop import FrameLoop

aten = torch.ops.aten

#: Python-level tensor methods that read values on the host or move data to it.
HOST_METHODS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy, torch.Tensor.__bool__,
                torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.cpu,
                torch.Tensor.cuda, torch.Tensor.pin_memory}


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for x in tree:
            yield from _tensors(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from _tensors(x)


def _signature(tree):
    """Shapes and dtypes of the tensors in args (values of other arguments as they are)."""
    if isinstance(tree, torch.Tensor):
        return ("T", tuple(tree.shape), str(tree.dtype), str(tree.device))
    if isinstance(tree, (list, tuple)):
        return tuple(_signature(x) for x in tree)
    if isinstance(tree, dict):
        return tuple((k, _signature(v)) for k, v in sorted(tree.items()))
    return repr(tree)


def _dropout(func, args, kwargs) -> float | None:
    """The ``dropout_p`` an attention op is called with (its only use of random numbers), or None."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "dropout_p":
            if arg.name in kwargs:
                return kwargs[arg.name]
            return args[i] if i < len(args) else arg.default_value
    return None


def capture_problem(func, args, kwargs) -> str | None:
    """Why ``func`` (an aten overload) with these arguments cannot be in a CUDA graph, or None."""
    tags = set(func.tags)
    if torch.Tag.nondeterministic_seeded in tags and _dropout(func, args, kwargs) != 0.0:
        return "random numbers"
    if torch.Tag.data_dependent_output in tags or func in (aten._local_scalar_dense.default,):
        return "host synchronisation (a value read on the host)"
    if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._unsafe_index.Tensor):
        if any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1])):
            return "boolean-mask indexing (a data-dependent shape)"
    elif torch.Tag.dynamic_output_shape in tags:
        return "a data-dependent shape"
    if func is aten.lift_fresh.default:
        return "a tensor built from Python data"
    if func is aten._to_copy.default and "device" in kwargs and kwargs["device"] != args[0].device:
        return "a copy to another device"
    devices = {t.device for t in _tensors((args, kwargs))}
    if len(devices) > 1 and not all(t.dim() == 0 for t in _tensors((args, kwargs)) if t.device.type == "cpu"):
        return f"tensors on several devices {sorted(map(str, devices))}"
    return None


class CaptureChecker(TorchDispatchMode):
    """Records every aten op a block runs (with argument shapes) and what graph capture forbids."""

    def __init__(self):
        super().__init__()
        self.trace: list[tuple] = []
        self.problems: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        problem = capture_problem(func, args, kwargs)
        if problem:
            self.problems.append(f"{func}: {problem}")
        self.trace.append((str(func), _signature(args), _signature(kwargs)))
        return func(*args, **kwargs)


class HostReadChecker(TorchFunctionMode):
    """Reports Python-level reads of tensor values (``.tolist()`` does not dispatch on the CPU)."""

    def __init__(self, problems: list[str]):
        super().__init__()
        self.problems = problems

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_METHODS:
            self.problems.append(f"Tensor.{func.__name__}: host synchronisation")
        if func is torch.Tensor.to and any(isinstance(a, (torch.device, str)) for a in (*args[1:], *(kwargs or {}).values())):
            self.problems.append("Tensor.to(device): a copy to another device")
        return func(*args, **(kwargs or {}))


def checked(fn):
    """Run fn under both checkers: (its result, the op trace, the problems found)."""
    dispatch = CaptureChecker()
    with torch.no_grad(), HostReadChecker(dispatch.problems), dispatch:
        out = fn()
    return out, dispatch.trace, dispatch.problems


def test_the_checker_reports_what_capture_forbids():
    x = torch.randn(8)
    bad = {
        "item": lambda: x[0].item(),
        "tolist": lambda: x.tolist(),
        "bool": lambda: bool(x[0] > 0),
        "rng": lambda: torch.empty(3).exponential_(),
        "nonzero": lambda: x.nonzero(),
        "bool index": lambda: x[x > 0],
        "python data": lambda: torch.tensor([1, 2]),
        "to device": lambda: x.to("cpu"),
    }
    for name, fn in bad.items():
        assert checked(fn)[2], name
    good = [lambda: x[2], lambda: torch.full((2,), 3.0) + x[:2],
            lambda: x.gather(0, torch.zeros(3, dtype=torch.long)), lambda: torch.where(x > 0, x, 0.0)]
    for fn in good:
        assert checked(fn)[2] == []


def _vary_state(loop: FrameLoop, steps: int) -> None:
    """Move the loop's state somewhere else: slots at different steps and frozen in a pattern,
    random inputs, past the depformer start and the ring wrap of the tiny model."""
    gen = torch.Generator().manual_seed(1)
    n = loop.max_batch
    phases = loop.phases[n]
    with torch.no_grad():
        for t in range(steps):
            run = torch.tensor([t % (i + 1) == 0 for i in range(n)])
            loop.fs.exec_mask.copy_(run)
            loop.ms.exec_mask.copy_(run & (loop.fs.offset >= 3))
            loop.step.text_noise.exponential_(generator=gen)
            loop.step.audio_noise.exponential_(generator=gen)
            phases["text"]()
            loop.step.text_in.copy_(torch.randint(0, 4 * loop.cfg.text_in_card, (n,), generator=gen))
            phases["audio" if t % 3 else "commit"]()
    assert len(set(loop.fs.offset.tolist())) > 2 and loop.fs.offset.max() > loop.cfg.context


def _traces(loop: FrameLoop) -> dict:
    """Each phase of each bucket under the checkers, text first (audio reads its output)."""
    out = {}
    for n, phases in loop.phases.items():
        for name in ("text", "audio", "commit"):
            if name == "commit":  # its own step: after "text", in place of "audio"
                checked(phases["text"])
            _, trace, problems = checked(phases[name])
            assert problems == [], (n, name, problems[:5])
            out[n, name] = trace
    return out


@pytest.mark.parametrize("greedy, padding_bonus", [(True, 0.0), (False, 1.5)])
def test_every_phase_of_every_bucket_is_capture_safe(ours, greedy, padding_bonus):
    saved = ours.padding_bonus
    ours.padding_bonus = padding_bonus
    try:
        loop = FrameLoop(ours, max_batch=4, max_ahead_s=math.inf, greedy=greedy, cuda_graphs=False)
    finally:
        ours.padding_bonus = saved
    assert loop.buckets == (1, 2, 4)
    loop.start(thread=False)  # its warm-up, which comes before any capture (made once: the RoPE frequencies)
    first = _traces(loop)
    _vary_state(loop, 60)
    second = _traces(loop)
    for key, trace in first.items():
        assert trace == second[key], f"{key}: the op/shape trace depends on the state"
    text_ops = [op for op, *_ in first[1, "text"]]
    assert ("aten.add_.Tensor" in text_ops) == bool(padding_bonus)  # the padding bonus is in the step
