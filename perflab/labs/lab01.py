"""Lab 1 — Measure first: the contract between the notebook, its tests and the grader.

The student writes these functions in `labs/lab01_measure/lab01_measure.ipynb`. What is asked is
stated once, here. The visible tests call the `check_*` functions below (`check_preprocess_fixed`,
`check_trace`) with the student's function; the hidden ones, and the reference answers they compare
against, live in the grader-only `perflab/labs/hidden/lab01.py`.

Timing
    time_callable(fn, warmup=3, repeats=20, clock=time.perf_counter, sync=None) -> dict
        Call `fn()` `warmup` times untimed, call `sync()` once (if given) so no warm-up work is
        still queued, then time `repeats` calls one by one: read `clock()`, call `fn()`, call
        `sync()` (if given), read `clock()` again. Returns {"samples": [seconds per call, in call
        order], "median", "p95", "p99": numpy.percentile of the samples (linear interpolation),
        "spread": (p75 - p25) / median}. `warmup < 0` or `repeats < 1` raise ValueError.

Counting (FlopCounterMode's convention: a multiply-add is 2 FLOPs; bias adds are not counted)
    conv2d_flops(conv: nn.Conv2d, input_shape: (N, C, H, W)) -> int      forward FLOPs
    linear_flops(linear: nn.Linear, input_shape: (..., in_features)) -> int
    conv2d_params(conv) -> int;  linear_params(linear) -> int             weights plus bias
    model_forward_flops(model, input_shape) -> int
        The sum of the closed forms over every Conv2d and Linear call of `model` at `input_shape`
        (`layer_calls` below gives each call's module and input shape).
    Convolutions may have any kernel, stride, padding and dilation given as ints or pairs, and
    groups; padding strings ("same") are not used.

Memory budget of one training step, in bytes
    training_memory_budget(model, optimizer, input_shape) -> {"parameters", "gradients",
        "optimizer", "activations"}
        parameters: every parameter's bytes; gradients: those of trainable parameters;
        optimizer: the state `optimizer` keeps ("sgd": none, "sgd-momentum": one buffer per
        trainable parameter, "adam": two; Adam's scalar step counters may be counted or not);
        activations: the storages saved for backward (torch.autograd.graph.saved_tensors_hooks)
        by one forward pass of `model` (in train mode) on a random batch of `input_shape`, each
        storage counted once at its full size, parameters left out.

Profilers
    top_by_cumulative(stats: pstats.Stats, n) -> list[FunctionRow]
        The `n` functions with the most cumulative time, most first (fewer if the profile has
        fewer), with pstats' own numbers for them (calls = total calls, not primitive ones).
    slowest_line(stats: line_profiler.LineStats, func) -> LineTiming
        The line of `func` with the most total time, from `stats.timings[key]` where key is
        (func.__code__.co_filename, func.__code__.co_firstlineno, func.__name__); seconds are
        time * stats.unit; share is that line's time over all lines of `func`.
    find_leak(fn, make_input, calls=50) -> (filename, lineno)
        The source line whose allocations grow most while `fn(make_input())` runs `calls` times,
        by tracemalloc snapshots taken before and after (compared by "lineno").
    preprocess_fixed(batch) -> torch.Tensor
        What `preprocess_leaky` returns, without keeping anything alive between calls.
    profile_training(config, active_steps, trace_path) -> torch.profiler.profile
        Profile the training loop of `config` under torch.profiler with
        schedule(wait=1, warmup=1, active=active_steps), each step's phases labelled with
        record_function ("data", "h2d", "forward", "backward", "optimizer"), and export the
        recorded steps as a Chrome/Perfetto trace to `trace_path`.

Roofline
    conv2d_bytes(conv, input_shape, bytes_per_element=4) -> int
        Minimum traffic: input, weights (and bias) and output, each element once.
    roofline_verdict(flops, bytes_moved, peak_flops, peak_bandwidth) -> (verdict, attainable)
        verdict is "compute-bound" when flops / bytes_moved >= peak_flops / peak_bandwidth,
        else "memory-bound"; attainable = min(peak_flops, peak_bandwidth * flops / bytes_moved).

Bottleneck
    bottleneck_verdict(phase_seconds, layers, peak_flops, peak_bandwidth) -> {"stage", "bound"}
        stage is "data" when the data phase takes at least DATA_SHARE of the step or the h2d
        phase at least COPY_SHARE, else "model". bound is "memory" when the memory-bound layers
        (by roofline_verdict) hold at least MEMORY_TIME_SHARE of the model's roofline time
        (each layer's flops / attainable), else "compute". `layers` are {"flops", "bytes"}.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from perflab import diagnose

LAB = "lab01_measure"

# The thresholds of the bottleneck verdict are perflab.diagnose's, so the lab and `perflab
# profile` never disagree (their reasons are written there).
DATA_SHARE = diagnose.DATA_BOUND_SHARE
COPY_SHARE = diagnose.COPY_BOUND_SHARE
MEMORY_TIME_SHARE = diagnose.MEMORY_BOUND_TIME_SHARE
# A fixed preprocessing step may keep a few small objects (caches of constants): less than this
# share of one batch's float copy per call is "not growing".
LEAK_GROWTH_PER_CALL = 0.05
# Resident-set growth allowed over the RSS check's calls; a leak of the float copies grows by
# about 80 MB there, allocator noise stays under a few MB.
LEAK_RSS_BYTES = 24 * 2**20
PHASE_LABELS = ("data", "h2d", "forward", "backward", "optimizer")

# What this lab can and cannot promise on each kind of device (printed by common.hardware_statement).
HARDWARE_NOTES = {
    "cuda": "GPU work is asynchronous: every timing here ends with a device sync, and the roofline "
            "uses this GPU's measured peaks.",
    "mps": "MPS work is asynchronous: timings end with torch.mps.synchronize(); there are no CUDA "
           "events, so host clocks are used.",
    "cpu": "everything runs on the CPU cores above; other programs on this machine add noise to "
           "timings, which is why the lab reports medians and spreads, not single runs.",
}
REQUIRED_LABELS = ("data", "forward", "backward", "optimizer")


# ---------------------------------------------------------------------------------------------
# Types the student's functions return


@dataclass(frozen=True)
class FunctionRow:
    """One function of a cProfile profile: pstats' key (filename, line, name) and its numbers."""

    function: tuple[str, int, str]
    calls: int
    tottime: float
    cumtime: float


@dataclass(frozen=True)
class LineTiming:
    """One line of a line_profiler profile."""

    lineno: int
    hits: int
    seconds: float
    share: float


# ---------------------------------------------------------------------------------------------
# Helpers the notebook gives the student


def lab_config(mode: str | None = None) -> Any:
    """The TrainConfig this lab measures in `mode` (default: the mode in force), on the best device."""
    from perflab import env, workload

    sizes = env.mode_sizes(mode)
    return workload.TrainConfig(data=sizes.data, batch_size=sizes.batch_size, image_size=sizes.image_size,
                                device=str(env.pick_device()))


class FakeDevice:
    """A fake clock and an asynchronous 'device', to test a timer exactly.

    `work(durations)` gives a function whose k-th call spends `launch` seconds on the host and
    queues `durations[k]` seconds of device work; `clock()` reads host time; `sync()` waits for
    the queued work (advances the clock by it). A timer that forgets to sync measures launches only.
    """

    def __init__(self, launch: float = 0.0) -> None:
        self.now = 0.0
        self.pending = 0.0
        self.launch = launch
        self.calls = 0
        self.syncs = 0

    def clock(self) -> float:
        return self.now

    def sync(self) -> None:
        self.now += self.pending
        self.pending = 0.0
        self.syncs += 1

    def work(self, durations: Sequence[float]) -> Callable[[], None]:
        queue = list(durations)

        def fn() -> None:
            if self.calls >= len(queue):
                raise AssertionError(f"fn was called more than the {len(queue)} times asked for")
            self.now += self.launch
            self.pending += queue[self.calls]
            self.calls += 1

        return fn


@dataclass(frozen=True)
class LayerCall:
    """One call of a Conv2d or Linear layer inside a model: its name, module and input shape."""

    name: str
    module: nn.Module
    input_shape: tuple[int, ...]


def layer_calls(model: nn.Module, input_shape: Sequence[int]) -> list[LayerCall]:
    """Every Conv2d and Linear call of `model` on zeros of `input_shape`, in call order (eval mode,
    no grad; the model's mode is restored)."""
    calls: list[LayerCall] = []
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            def hook(mod: nn.Module, args: tuple[Any, ...], _name: str = name) -> None:
                calls.append(LayerCall(_name, mod, tuple(args[0].shape)))
            handles.append(module.register_forward_pre_hook(hook))
    modes = {m: m.training for m in model.modules()}
    param = next(model.parameters(), None)
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(tuple(input_shape), device=param.device if param is not None else "cpu"))
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.train(training)
    return calls


# The preprocessing step that leaks. Its history list was meant for a debugging dump that nobody
# calls; every float copy of every batch stays alive.
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
_CONSTANTS: dict[str, tuple[np.ndarray, np.ndarray]] = {}
_HISTORY: list[np.ndarray] = []


def preprocess_leaky(batch: np.ndarray) -> torch.Tensor:
    """uint8 images (N, H, W, 3) -> normalised float32 tensor (N, 3, H, W)."""
    if batch.dtype != np.uint8 or batch.ndim != 4 or batch.shape[-1] != 3:
        raise ValueError(f"batch: expected uint8 (N, H, W, 3), got {batch.dtype} {batch.shape}")
    mean, std = _CONSTANTS.setdefault("rgb", (MEAN.reshape(1, 1, 1, 3), STD.reshape(1, 1, 1, 3)))
    scaled = batch.astype(np.float32) / 255.0
    _HISTORY.append(scaled)
    normalised = (scaled - mean) / std
    return torch.from_numpy(np.ascontiguousarray(normalised.transpose(0, 3, 1, 2)))


def reset_leak() -> int:
    """Free what `preprocess_leaky` kept; returns how many batches it held."""
    held = len(_HISTORY)
    _HISTORY.clear()
    return held


def random_batch(seed: int = 0, n: int = 16, size: int = 64) -> np.ndarray:
    """A uint8 batch of random images (N, H, W, 3)."""
    return np.random.default_rng(seed).integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)


# ---------------------------------------------------------------------------------------------
# Checks the visible tests call with the student's functions (the hidden tests' checks live in
# perflab/labs/hidden/lab01.py)


def check_preprocess_fixed(preprocess_fixed: Callable[[np.ndarray], torch.Tensor], seed: int = 0,
                           calls: int = 30) -> None:
    """Same output as `preprocess_leaky`; memory (tracemalloc and resident set) does not grow over calls."""
    import psutil

    for i in range(3):
        batch = random_batch(seed + i, n=int(2 + i), size=int(8 + 4 * i))
        want = preprocess_leaky(batch)
        reset_leak()
        got = preprocess_fixed(batch)
        assert isinstance(got, torch.Tensor), f"preprocess_fixed returned {type(got).__name__}, not a tensor"
        assert got.shape == want.shape and got.dtype == want.dtype, \
            f"shape/dtype {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}"
        assert torch.allclose(got, want, atol=1e-6), "preprocess_fixed gives different values from preprocess_leaky"
    batch = random_batch(seed, n=16, size=64)
    one_copy = batch.size * 4
    preprocess_fixed(batch)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(calls):
            preprocess_fixed(batch)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown <= LEAK_GROWTH_PER_CALL * one_copy * calls, (
        f"traced memory grew by {grown / 2**20:.1f} MiB over {calls} calls: something is still kept")
    process = psutil.Process()
    rss = process.memory_info().rss
    for _ in range(100):
        preprocess_fixed(batch)
    grown = process.memory_info().rss - rss
    assert grown <= LEAK_RSS_BYTES, (
        f"the process grew by {grown / 2**20:.0f} MiB over 100 calls: something tracemalloc cannot see "
        "(tensor storage?) is still kept")


def _trace_events(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AssertionError(f"no trace at {path}: export it with prof.export_chrome_trace(path)") from None
    except json.JSONDecodeError as exc:
        raise AssertionError(f"{path} is not a JSON trace ({exc.msg})") from None
    return data.get("traceEvents", []) if isinstance(data, dict) else data


def check_trace(trace_path: str | Path, active_steps: int) -> dict[str, int]:
    """A Chrome trace holds `active_steps` profiler steps and the phase labels; returns label counts."""
    events = _trace_events(Path(trace_path))
    names = [e.get("name", "") for e in events if isinstance(e, dict)]
    steps = {n for n in names if n.startswith("ProfilerStep#")}
    assert len(steps) == active_steps, (
        f"the trace holds {len(steps)} profiler steps, the schedule records {active_steps} "
        "(schedule(wait=1, warmup=1, active=...) and prof.step() once per step)")
    counts = {label: names.count(label) for label in PHASE_LABELS}
    missing = [label for label in REQUIRED_LABELS if counts[label] < active_steps]
    assert not missing, f"labels missing from some recorded steps: {missing} (wrap each phase in record_function)"
    assert any("conv" in n for n in names), "the trace holds no convolution ops: was the model run inside the profiler?"
    return counts


