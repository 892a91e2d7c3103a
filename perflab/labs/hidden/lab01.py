"""Lab 01's hidden checks and the reference answers they compare against; grader-only: the student
bundle leaves this module out.

The hidden test cells of `solutions/lab01_measure` import this module inside their `BEGIN HIDDEN
TESTS` blocks and call the `check_*` functions below with the student's functions: random cases
drawn from a seed, AssertionError on the first problem. The contract they check is stated in
`perflab/labs/lab01.py`.
"""

from __future__ import annotations

import contextlib
import cProfile
import math
import pstats
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from perflab import diagnose
from perflab.labs.lab01 import (
    COPY_SHARE,
    DATA_SHARE,
    MEMORY_TIME_SHARE,
    PHASE_LABELS,
    FakeDevice,
    FunctionRow,
    LineTiming,
    check_trace,
)

# Relative tolerance on activation bytes: storages saved for backward can be counted with or
# without the input batch's own storage pinned by a view; 2% covers that, a wrong method misses by far more.
ACTIVATION_TOLERANCE = 0.02
# A grading machine whose own measurement lands this close to a threshold cannot tell the two
# answers apart from one run (step-time shares move by a few points between runs), so both count.
SHARE_MARGIN = 0.05
MEMORY_SHARE_MARGIN = 0.10


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
