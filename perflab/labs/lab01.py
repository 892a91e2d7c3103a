"""Lab 1 — Measure first: the contract between the notebook, its tests and the grader.

The student writes these functions in `labs/lab01_measure/lab01_measure.ipynb`. Their tests
(visible in the notebook, hidden ones when graded) call the `check_*` functions below with the
student's function, so what is asked and what is checked are stated once, here.

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

import contextlib
import cProfile
import json
import math
import pstats
import tempfile
import tracemalloc
import warnings
from collections.abc import Callable, Iterator, Sequence
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
# A grading machine whose own measurement lands this close to a threshold cannot tell the two
# answers apart from one run (step-time shares move by a few points between runs), so both count.
SHARE_MARGIN = 0.05
MEMORY_SHARE_MARGIN = 0.10
# Relative tolerance on activation bytes: storages saved for backward can be counted with or
# without the input batch's own storage pinned by a view; 2% covers that, a wrong method misses by far more.
ACTIVATION_TOLERANCE = 0.02
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
# Checks (the tests call these with the student's functions)


def _close(a: float, b: float, rel: float = 1e-9, abs_: float = 1e-12) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=abs_)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Library warnings in a check must not reach stderr (nbgrader scores a cell that writes stderr 0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def check_time_callable(time_callable: Callable[..., dict[str, Any]], seed: int = 0, cases: int = 5) -> None:
    """Randomised checks of a student's `time_callable` against a `FakeDevice`."""
    rng = np.random.default_rng(seed)
    for case in range(cases):
        warmup, repeats = int(rng.integers(0, 6)), int(rng.integers(5, 41))
        launch = float(rng.uniform(0, 2e-5))
        durations = rng.lognormal(mean=-7, sigma=0.6, size=warmup + repeats).tolist()
        dev = FakeDevice(launch)
        result = time_callable(dev.work(durations), warmup=warmup, repeats=repeats,
                               clock=dev.clock, sync=dev.sync)
        where = f"case {case} (warmup={warmup}, repeats={repeats})"
        assert dev.calls == warmup + repeats, f"{where}: fn was called {dev.calls} times, expected {warmup + repeats}"
        samples = list(result["samples"])
        assert len(samples) == repeats, f"{where}: {len(samples)} samples, expected one per timed call"
        expected = [launch + d for d in durations[warmup:]]
        for i, (got, want) in enumerate(zip(samples, expected, strict=True)):
            assert _close(got, want), (
                f"{where}: sample {i} is {got:.3e} s, the call took {want:.3e} s "
                "(did you sync before reading the clock, and after the warm-up?)")
        want_stats = {"median": np.percentile(expected, 50), "p95": np.percentile(expected, 95),
                      "p99": np.percentile(expected, 99)}
        p25, p75 = np.percentile(expected, [25, 75])
        want_stats["spread"] = (p75 - p25) / want_stats["median"]
        for key, want in want_stats.items():
            assert key in result, f"{where}: the result has no {key!r}"
            assert _close(result[key], want), f"{where}: {key} is {result[key]!r}, expected {want!r}"
    for bad in ({"warmup": -1, "repeats": 3}, {"warmup": 0, "repeats": 0}):
        try:
            time_callable(lambda: None, **bad)
        except ValueError:
            continue
        raise AssertionError(f"time_callable({bad}) should raise ValueError")
    plain = time_callable(lambda: sum(range(100)), warmup=1, repeats=3)
    assert len(plain["samples"]) == 3 and all(s >= 0 for s in plain["samples"]), \
        "with the default clock and no sync, time_callable should still time 3 calls"


def _flop_counter(module: nn.Module, x: torch.Tensor) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with _quiet(), FlopCounterMode(display=False) as counter, torch.no_grad():
        module(x)
    return int(counter.get_total_flops())


def _random_conv(rng: np.random.Generator) -> tuple[nn.Conv2d, tuple[int, int, int, int]]:
    groups = int(rng.choice([1, 1, 1, 2, 4]))
    c_in = groups * int(rng.integers(1, 9))
    c_out = groups * int(rng.integers(1, 9))
    kernel = (int(rng.integers(1, 6)), int(rng.integers(1, 6)))
    stride = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    padding = (int(rng.integers(0, 3)), int(rng.integers(0, 3)))
    dilation = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    bias = bool(rng.integers(0, 2))
    spans = [dilation[i] * (kernel[i] - 1) + 1 - 2 * padding[i] for i in range(2)]
    h = max(spans[0], 1) + int(rng.integers(0, 20))
    w = max(spans[1], 1) + int(rng.integers(0, 20))
    conv = nn.Conv2d(c_in, c_out, kernel, stride, padding, dilation, groups, bias)
    return conv, (int(rng.integers(1, 4)), c_in, h, w)


def check_conv2d_flops(conv2d_flops: Callable[..., int], seed: int = 0, cases: int = 25) -> None:
    """The student's conv FLOPs equal FlopCounterMode's on random convolution shapes."""
    rng = np.random.default_rng(seed)
    for _ in range(cases):
        conv, shape = _random_conv(rng)
        want = _flop_counter(conv, torch.zeros(shape))
        got = conv2d_flops(conv, shape)
        assert int(got) == want, f"{conv} on input {shape}: you counted {got} FLOPs, FlopCounterMode counts {want}"


def check_linear_flops(linear_flops: Callable[..., int], seed: int = 0, cases: int = 15) -> None:
    """The student's linear FLOPs equal FlopCounterMode's on random shapes (1 to 3 leading dims)."""
    rng = np.random.default_rng(seed)
    for _ in range(cases):
        linear = nn.Linear(int(rng.integers(1, 64)), int(rng.integers(1, 64)), bias=bool(rng.integers(0, 2)))
        lead = tuple(int(v) for v in rng.integers(1, 6, size=int(rng.integers(1, 4))))
        shape = (*lead, linear.in_features)
        want = _flop_counter(linear, torch.zeros(shape))
        got = linear_flops(linear, shape)
        assert int(got) == want, f"{linear} on input {shape}: you counted {got} FLOPs, FlopCounterMode counts {want}"


def check_param_counts(conv2d_params: Callable[[nn.Conv2d], int], linear_params: Callable[[nn.Linear], int],
                       seed: int = 0, cases: int = 15) -> None:
    """Closed-form parameter counts equal the layers' real parameter counts."""
    rng = np.random.default_rng(seed)
    for _ in range(cases):
        conv, _shape = _random_conv(rng)
        want = sum(p.numel() for p in conv.parameters())
        assert int(conv2d_params(conv)) == want, f"{conv}: you counted {conv2d_params(conv)} parameters, it has {want}"
        linear = nn.Linear(int(rng.integers(1, 300)), int(rng.integers(1, 300)), bias=bool(rng.integers(0, 2)))
        want = sum(p.numel() for p in linear.parameters())
        assert int(linear_params(linear)) == want, \
            f"{linear}: you counted {linear_params(linear)} parameters, it has {want}"


def check_model_flops(model_forward_flops: Callable[..., int], seed: int = 0) -> None:
    """The student's whole-model FLOPs equal FlopCounterMode's for ResNet-18 and a small random CNN."""
    import torchvision

    rng = np.random.default_rng(seed)
    side = int(rng.choice([32, 48, 64, 96]))
    shape = (int(rng.integers(1, 4)), 3, side, side)
    models = [torchvision.models.resnet18(weights=None, num_classes=int(rng.integers(2, 200)))]
    width = int(rng.integers(4, 17))
    models.append(nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, 2 * width, 3, stride=2, groups=width),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, int(rng.integers(2, 20)))))
    for model in models:
        want = _flop_counter(model, torch.zeros(shape))
        got = model_forward_flops(model, shape)
        assert int(got) == want, \
            f"{type(model).__name__} on {shape}: you counted {got} FLOPs, FlopCounterMode counts {want}"


def check_memory_budget(training_memory_budget: Callable[..., dict[str, int]], seed: int = 0) -> None:
    """The student's budget against perflab.memory's measurement on random small models and optimizers."""
    from perflab import memory

    rng = np.random.default_rng(seed)
    for case in range(3):
        width = int(rng.integers(4, 17))
        side = int(rng.choice([8, 12, 16]))
        model = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1, bias=False), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, int(rng.integers(2, 10))))
        if case == 2:
            model[0].weight.requires_grad_(False)  # frozen parameters have no gradient, no state
        optimizer = ("sgd", "sgd-momentum", "adam")[case]
        shape = (int(rng.integers(2, 6)), 3, side, side)
        torch.manual_seed(seed + case)
        with _quiet():
            want = memory.memory_budget(model, optimizer, torch.randn(shape))
            got = training_memory_budget(model, optimizer, shape)
        where = f"case {case} ({optimizer}, input {shape})"
        for key, value in (("parameters", want.parameters), ("gradients", want.gradients)):
            assert int(got[key]) == value, f"{where}: {key} {got[key]} bytes, measured {value}"
        trainable = sum(1 for p in model.parameters() if p.requires_grad)
        counters = 8 * trainable if optimizer == "adam" else 0  # Adam's scalar steps, counted or not
        assert want.optimizer_state - counters <= int(got["optimizer"]) <= want.optimizer_state, \
            f"{where}: optimizer state {got['optimizer']} bytes, measured {want.optimizer_state}"
        assert abs(int(got["activations"]) - want.activations) <= ACTIVATION_TOLERANCE * want.activations, \
            f"{where}: activations {got['activations']} bytes, saved-tensor hooks measure {want.activations}"


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def _leaf(n: int) -> int:
    return _spin(n)


def _middle(k: int, n: int) -> int:
    return sum(_leaf(n) for _ in range(k))


def _root(k1: int, k2: int, n: int) -> int:
    return _middle(k1, n) + _middle(k2, n) + _spin(n * k2)


def check_top_by_cumulative(top_by_cumulative: Callable[..., list[FunctionRow]], seed: int = 0) -> None:
    """The student's top-n rows are pstats' own, ordered by cumulative time."""
    rng = np.random.default_rng(seed)
    profiler = cProfile.Profile()
    profiler.runcall(_root, int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(2000, 8000)))
    stats = pstats.Stats(profiler)
    table = stats.stats  # type: ignore[attr-defined]
    for n in (1, 3, int(rng.integers(4, 8)), 1000):
        rows = list(top_by_cumulative(stats, n))
        want = sorted((entry[3] for entry in table.values()), reverse=True)[:n]
        assert len(rows) == len(want), f"n={n}: {len(rows)} rows, expected {len(want)}"
        for i, row in enumerate(rows):
            key = tuple(row.function)
            assert key in table, f"n={n}, row {i}: {key} is not a function of this profile"
            cc, nc, tt, ct, _callers = table[key]
            assert (row.calls, row.tottime, row.cumtime) == (nc, tt, ct), \
                f"n={n}, row {i} {key}: (calls, tottime, cumtime) should be pstats' {(nc, tt, ct)}"
        assert [row.cumtime for row in rows] == want, f"n={n}: rows are not the top {n} by cumulative time, most first"


def _three_steps(a: int, b: int, c: int) -> int:
    x = _spin(a)
    y = _spin(b)
    z = _spin(c)
    return x + y + z


def check_slowest_line(slowest_line: Callable[..., LineTiming], seed: int = 0) -> None:
    """The student's slowest line is the one line_profiler charged most, with its hits, seconds and share."""
    from line_profiler import LineProfiler

    rng = np.random.default_rng(seed)
    slow = int(rng.integers(0, 3))
    sizes = [3000, 3000, 3000]
    sizes[slow] = 60000
    profiler = LineProfiler()
    profiled = profiler(_three_steps)
    profiled(*sizes)
    stats = profiler.get_stats()
    code = _three_steps.__code__
    timings = stats.timings[(code.co_filename, code.co_firstlineno, code.co_name)]
    lineno, hits, t = max(timings, key=lambda row: row[2])
    assert lineno == code.co_firstlineno + 1 + slow, "internal: the planted slow line did not dominate"
    got = slowest_line(stats, _three_steps)
    total = sum(row[2] for row in timings)
    assert got.lineno == lineno, f"slowest line is {lineno} (`_spin({sizes[slow]})`), you said {got.lineno}"
    assert got.hits == hits, f"line {lineno} ran {hits} times, you said {got.hits}"
    assert _close(got.seconds, t * stats.unit, rel=1e-6), f"line {lineno} took {t * stats.unit} s, you said {got.seconds}"
    assert _close(got.share, t / total, rel=1e-6), f"line {lineno} holds {t / total:.3f} of the time, you said {got.share}"


_PLANTED: list[Any] = []


def _leak_first(x: np.ndarray) -> float:
    kept = x * 2.0
    _PLANTED.append(kept)
    scratch = np.ones_like(x)
    return float((kept + scratch).sum())


def _leak_second(x: np.ndarray) -> float:
    scratch = np.sqrt(np.abs(x))
    kept = x.astype(np.float64).tobytes()
    _PLANTED.append(kept)
    return float(scratch.sum())


def _leak_cached(x: np.ndarray) -> float:
    table = {"x": x.copy()}
    _PLANTED.append(table)
    return float(table["x"].mean())


_LEAKERS = ((_leak_first, 1), (_leak_second, 2), (_leak_cached, 1))


def check_find_leak(find_leak: Callable[..., tuple[str, int]], seed: int = 0) -> None:
    """The student's leak finder names the planted line in functions it has never seen."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(_LEAKERS))
    try:
        for index in order[:2]:
            fn, offset = _LEAKERS[int(index)]
            side = int(rng.integers(64, 128))
            filename, lineno = find_leak(fn, lambda side=side: rng.standard_normal((side, side)), calls=30)
            want = fn.__code__.co_firstlineno + offset
            assert Path(filename).name == Path(__file__).name and int(lineno) == want, (
                f"{fn.__name__} keeps what line {want} allocates; you found {Path(filename).name}:{lineno}")
    finally:
        _PLANTED.clear()


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


def check_profile_training(profile_training: Callable[..., Any], config: Any, seed: int = 0) -> None:
    """Run the student's profiler on `config` with a random number of active steps and check its trace."""
    active = int(np.random.default_rng(seed).integers(1, 3))
    with tempfile.TemporaryDirectory(prefix="lab01-trace-") as tmp:
        path = Path(tmp) / "check.trace.json"
        with _quiet():
            prof = profile_training(config, active, path)
        assert isinstance(prof, torch.profiler.profile), "profile_training should return the torch.profiler.profile"
        check_trace(path, active)
        ops = [avg.key for avg in prof.key_averages()]
        assert any(k.startswith("aten::") for k in ops), "the profiler recorded no aten ops"


def check_conv2d_bytes(conv2d_bytes: Callable[..., int], seed: int = 0, cases: int = 20) -> None:
    """Minimum traffic of random convolutions (perflab.roofline's traffic model)."""
    from perflab import roofline

    rng = np.random.default_rng(seed)
    for _ in range(cases):
        conv, shape = _random_conv(rng)
        size = int(rng.choice([2, 4]))
        dtype = torch.float16 if size == 2 else torch.float32
        (cost,) = roofline.layer_intensity(conv, shape, dtype)
        got = conv2d_bytes(conv, shape, size)
        assert int(got) == cost.bytes, f"{conv} on {shape} at {size} bytes/element: {got} bytes, expected {cost.bytes}"


def check_roofline_verdict(roofline_verdict: Callable[..., tuple[str, float]], seed: int = 0, cases: int = 30) -> None:
    """Verdict and attainable FLOP/s on random layers and devices (none sits on the ridge itself)."""
    rng = np.random.default_rng(seed)
    for _ in range(cases):
        peak, bandwidth = 10 ** rng.uniform(10, 15), 10 ** rng.uniform(9, 13)
        ridge = peak / bandwidth
        intensity = ridge * 10 ** rng.uniform(-2, 2)
        if abs(math.log10(intensity / ridge)) < 1e-3:
            intensity *= 2
        nbytes = 10 ** rng.uniform(3, 9)
        flops = intensity * nbytes
        verdict, attainable = roofline_verdict(flops, nbytes, peak, bandwidth)
        want = "compute-bound" if intensity >= ridge else "memory-bound"
        assert verdict == want, f"intensity {intensity:.3g} FLOP/B against ridge {ridge:.3g}: {want}, you said {verdict}"
        assert _close(attainable, min(peak, bandwidth * intensity), rel=1e-9), \
            f"attainable should be min(peak, bandwidth * intensity) = {min(peak, bandwidth * intensity):.4g}, got {attainable:.4g}"


def reference_verdict(phase_seconds: dict[str, float], layers: Sequence[dict[str, float]],
                      peak_flops: float, peak_bandwidth: float) -> dict[str, Any]:
    """The grader's verdict with its evidence: shares, memory-bound time share, and which answers count."""
    total = sum(phase_seconds.values())
    data, copy = phase_seconds.get("data", 0.0) / total, phase_seconds.get("h2d", 0.0) / total
    memory_share = diagnose.memory_bound_time_share(
        {"peak_flops": peak_flops, "peak_bandwidth": peak_bandwidth,
         "layers": [{"flops": layer["flops"], "bytes": layer["bytes"]} for layer in layers]}) or 0.0
    stage = "data" if data >= DATA_SHARE or copy >= COPY_SHARE else "model"
    near_stage = abs(data - DATA_SHARE) < SHARE_MARGIN or abs(copy - COPY_SHARE) < SHARE_MARGIN
    bound = "memory" if memory_share >= MEMORY_TIME_SHARE else "compute"
    near_bound = abs(memory_share - MEMORY_TIME_SHARE) < MEMORY_SHARE_MARGIN
    return {"stage": stage, "bound": bound, "data_share": data, "h2d_share": copy,
            "memory_time_share": memory_share,
            "stages_accepted": ("data", "model") if near_stage else (stage,),
            "bounds_accepted": ("compute", "memory") if near_bound else (bound,)}


def _verdict_of(fn: Callable[..., dict[str, str]], *args: Any) -> tuple[str, str]:
    got = fn(*args)
    assert isinstance(got, dict) and {"stage", "bound"} <= set(got), \
        "bottleneck_verdict should return a dict with 'stage' and 'bound'"
    return got["stage"], got["bound"]


def check_bottleneck_rule(bottleneck_verdict: Callable[..., dict[str, str]], seed: int = 0, cases: int = 30) -> None:
    """The verdict rule on random synthetic measurements far from its thresholds."""
    rng = np.random.default_rng(seed)
    peak, bandwidth = 1e11, 1e10  # ridge 10 FLOP/B
    checked = 0
    while checked < cases:
        phases = {name: float(v) for name, v in zip(PHASE_LABELS, rng.dirichlet(np.ones(5) * 0.7), strict=True)}
        layers = [{"flops": float(10 ** rng.uniform(5, 9)), "bytes": 0.0} for _ in range(int(rng.integers(1, 6)))]
        for layer in layers:
            layer["bytes"] = layer["flops"] / (10 * 10 ** rng.uniform(-1.5, 1.5))
        ref = reference_verdict(phases, layers, peak, bandwidth)
        if len(ref["stages_accepted"]) > 1 or len(ref["bounds_accepted"]) > 1:
            continue
        checked += 1
        stage, bound = _verdict_of(bottleneck_verdict, phases, layers, peak, bandwidth)
        assert (stage, bound) == (ref["stage"], ref["bound"]), (
            f"data share {ref['data_share']:.2f}, h2d share {ref['h2d_share']:.2f}, memory-bound layers "
            f"{ref['memory_time_share']:.2f} of the roofline time: expected {ref['stage']}/{ref['bound']}, "
            f"you said {stage}/{bound}")


def grader_measurement(config: Any, steps: int = 3) -> dict[str, Any]:
    """The grader's own measurement on this machine: phase seconds, layer costs and device peaks."""
    from perflab import phases, roofline, workload

    with _quiet():
        breakdown = phases.measure_phases(config, steps=steps, warmup=1)
        work = workload.build(config)
        try:
            shape = (config.batch_size, 3, config.image_size, config.image_size)
            layers = [{"name": c.name, "flops": float(c.flops), "bytes": float(c.bytes)}
                      for c in roofline.layer_intensity(work.model, shape)]
        finally:
            work.close()
        peaks = roofline.measure_peaks(work.device)
    return {"phase_seconds": dict(breakdown.seconds), "layers": layers,
            "peak_flops": peaks.peak_flops(), "peak_bandwidth": peaks.bandwidth}


def check_bottleneck_here(bottleneck_verdict: Callable[..., dict[str, str]], config: Any,
                          measured: dict[str, Any] | None = None) -> dict[str, Any]:
    """The student's verdict on the grader's own measurement of `config` on this machine."""
    m = measured or grader_measurement(config)
    ref = reference_verdict(m["phase_seconds"], m["layers"], m["peak_flops"], m["peak_bandwidth"])
    stage, bound = _verdict_of(bottleneck_verdict, m["phase_seconds"], m["layers"], m["peak_flops"], m["peak_bandwidth"])
    assert stage in ref["stages_accepted"], (
        f"on the grading machine the data phase takes {ref['data_share']:.0%} and h2d {ref['h2d_share']:.0%} "
        f"of the step: the stage is {ref['stage']}, you said {stage}")
    assert bound in ref["bounds_accepted"], (
        f"on the grading machine memory-bound layers hold {ref['memory_time_share']:.0%} of the model's "
        f"roofline time: the model is {ref['bound']}-bound, you said {bound}")
    return ref
