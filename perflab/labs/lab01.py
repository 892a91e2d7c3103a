"""Lab 1 — Measure first: the contract between the notebook, its tests and the grader.

The student writes these functions in `labs/lab01_measure/lab01_measure.ipynb`. What is asked is
stated once, here. The visible tests call the `check_*` functions below (`check_preprocess_fixed`,
`check_trace`) with the student's function. The grader decides every autograded cell from what the
probes at the bottom (`PROBES`) return: the student's raw outputs on inputs drawn from the grader's
seed by the public case generators here; the judges and the reference answers they compare against
live in the grader-only `perflab/labs/hidden/lab01.py`.

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

    sizes = env.mode_sizes(mode, lab=LAB)
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
        self.log: list[str] = []  # what was called, in order: "t" clock(), "s" sync(), "c" fn()

    def clock(self) -> float:
        self.log.append("t")
        return self.now

    def sync(self) -> None:
        self.now += self.pending
        self.pending = 0.0
        self.syncs += 1
        self.log.append("s")

    def work(self, durations: Sequence[float]) -> Callable[[], None]:
        queue = list(durations)

        def fn() -> None:
            if self.calls >= len(queue):
                raise AssertionError(f"fn was called more than the {len(queue)} times asked for")
            self.now += self.launch
            self.pending += queue[self.calls]
            self.calls += 1
            self.log.append("c")

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


def preprocess_batches(seed: int) -> list[np.ndarray]:
    """The small batches whose outputs `preprocess_fixed` must match `preprocess_leaky` on."""
    return [random_batch(seed + i, n=int(2 + i), size=int(8 + 4 * i)) for i in range(3)]


def observe_preprocess(preprocess_fixed: Callable[[np.ndarray], torch.Tensor], seed: int = 0,
                       calls: int = 30) -> dict[str, Any]:
    """The student's outputs on `preprocess_batches(seed)`, and how much traced memory and the resident
    set grew over repeated calls (raw numbers, judged by `preprocess_problems`)."""
    import psutil

    from perflab.grading.probing import encode, outcome

    out: dict[str, Any] = {"outputs": [outcome(preprocess_fixed, batch) for batch in preprocess_batches(seed)],
                           "calls": calls}
    batch = random_batch(seed, n=16, size=64)
    out["one_copy"] = int(batch.size * 4)
    try:
        preprocess_fixed(batch)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(calls):
                preprocess_fixed(batch)
            out["traced_growth"] = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        process = psutil.Process()
        rss = process.memory_info().rss
        for _ in range(100):
            preprocess_fixed(batch)
        out["rss_growth"] = process.memory_info().rss - rss
    except Exception as exc:
        out["raised"] = encode({"raised": type(exc).__name__, "message": str(exc)[:300]})
    return out


def preprocess_problems(observed: Any, seed: int = 0, calls: int = 30) -> list[str]:
    """What is wrong with an `observe_preprocess` record made with `seed` (empty: nothing)."""
    from perflab.grading.probing import decode_float

    if not isinstance(observed, dict) or not isinstance(observed.get("outputs"), list):
        return ["preprocess_fixed could not be observed"]
    batches = preprocess_batches(seed)
    if len(observed["outputs"]) != len(batches):
        return ["preprocess_fixed was not observed on every batch"]
    for batch, got in zip(batches, observed["outputs"], strict=True):
        if not isinstance(got, dict) or "raised" in got:
            return [f"preprocess_fixed raised {got.get('raised') if isinstance(got, dict) else got}: "
                    f"{got.get('message', '') if isinstance(got, dict) else ''}"]
        want = preprocess_leaky(batch)
        reset_leak()
        tensor = got.get("value", {}).get("tensor") if isinstance(got.get("value"), dict) else None
        if not isinstance(tensor, dict):
            return [f"preprocess_fixed returned {got.get('value')!r:.80}, not a tensor"]
        dtype, shape = str(tensor.get("dtype")), tensor.get("shape")
        if shape != list(want.shape) or dtype != str(want.dtype).replace("torch.", ""):
            return [f"shape/dtype {shape} {dtype}, expected {list(want.shape)} {want.dtype}"]
        values = tensor.get("values")
        if not isinstance(values, list) or len(values) != want.numel():
            return ["preprocess_fixed gives different values from preprocess_leaky"]
        numbers = [decode_float(v) for v in values]
        if any(v is None for v in numbers) or not torch.allclose(
                torch.tensor(numbers, dtype=torch.float64), want.reshape(-1).double(), atol=1e-6):
            return ["preprocess_fixed gives different values from preprocess_leaky"]
    if "raised" in observed:
        raised = observed["raised"] if isinstance(observed["raised"], dict) else {}
        return [f"preprocess_fixed raised {raised.get('raised')} on repeated calls: {raised.get('message', '')}"]
    traced, rss = decode_float(observed.get("traced_growth")), decode_float(observed.get("rss_growth"))
    one_copy = random_batch(seed, n=16, size=64).size * 4
    if traced is None or rss is None:
        return ["the memory growth of preprocess_fixed could not be measured"]
    if traced > LEAK_GROWTH_PER_CALL * one_copy * calls:
        return [f"traced memory grew by {traced / 2**20:.1f} MiB over {calls} calls: something is still kept"]
    if rss > LEAK_RSS_BYTES:
        return [f"the process grew by {rss / 2**20:.0f} MiB over 100 calls: something tracemalloc cannot see "
                "(tensor storage?) is still kept"]
    return []


def check_preprocess_fixed(preprocess_fixed: Callable[[np.ndarray], torch.Tensor], seed: int = 0,
                           calls: int = 30) -> None:
    """Same output as `preprocess_leaky`; memory (tracemalloc and resident set) does not grow over calls."""
    problems = preprocess_problems(observe_preprocess(preprocess_fixed, seed, calls), seed, calls)
    assert not problems, problems[0]


def trace_names(trace_path: str | Path) -> dict[str, int]:
    """How many events of each name a Chrome trace holds (AssertionError: no trace, or not JSON)."""
    path = Path(trace_path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AssertionError(f"no trace at {path}: export it with prof.export_chrome_trace(path)") from None
    except json.JSONDecodeError as exc:
        raise AssertionError(f"{path} is not a JSON trace ({exc.msg})") from None
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    counts: dict[str, int] = {}
    for event in events if isinstance(events, list) else []:
        if isinstance(event, dict):
            name = str(event.get("name", ""))
            counts[name] = counts.get(name, 0) + 1
    return counts


def trace_problems(names: Any, active_steps: int) -> list[str]:
    """What a trace's event-name counts (`trace_names`) lack for `active_steps` recorded steps."""
    if not isinstance(names, dict) or not all(isinstance(v, int) for v in names.values()):
        return ["the trace's events could not be read"]
    steps = {n for n in names if n.startswith("ProfilerStep#")}
    if len(steps) != active_steps:
        return [f"the trace holds {len(steps)} profiler steps, the schedule records {active_steps} "
                "(schedule(wait=1, warmup=1, active=...) and prof.step() once per step)"]
    missing = [label for label in REQUIRED_LABELS if names.get(label, 0) < active_steps]
    if missing:
        return [f"labels missing from some recorded steps: {missing} (wrap each phase in record_function)"]
    if not any("conv" in n for n in names):
        return ["the trace holds no convolution ops: was the model run inside the profiler?"]
    return []


def check_trace(trace_path: str | Path, active_steps: int) -> dict[str, int]:
    """A Chrome trace holds `active_steps` profiler steps and the phase labels; returns label counts."""
    names = trace_names(trace_path)
    problems = trace_problems(names, active_steps)
    assert not problems, problems[0]
    return {label: names.get(label, 0) for label in PHASE_LABELS}


# ---------------------------------------------------------------------------------------------
# The grader's cases: public, so a probe (in the student's kernel) and a judge (in the grader)
# draw identical inputs from the same seed. Each generator mixes its own tag into the seed, so the
# cells do not share one random stream.


def _rng(seed: int, tag: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, tag])


VISIBLE_TIMER = {"launch": 1e-6, "durations": [0.5, 0.4, 0.010, 0.011, 0.012, 0.013, 0.100], "warmup": 2, "repeats": 5}
TIMER_BAD_ARGS = ({"warmup": -1, "repeats": 3}, {"warmup": 0, "repeats": 0})


def timer_cases(seed: int, cases: int = 5) -> list[dict[str, Any]]:
    """Random warm-ups, repeats, launch costs and device durations for `time_callable` on a FakeDevice."""
    rng = _rng(seed, 101)
    out = []
    for _ in range(cases):
        warmup, repeats = int(rng.integers(0, 6)), int(rng.integers(5, 41))
        launch = float(rng.uniform(0, 2e-5))
        durations = rng.lognormal(mean=-7, sigma=0.6, size=warmup + repeats).tolist()
        out.append({"launch": launch, "durations": durations, "warmup": warmup, "repeats": repeats})
    return out


def observe_timer(time_callable: Callable[..., Any], case: dict[str, Any]) -> dict[str, Any]:
    """The student's result on a FakeDevice running `case`, with the device's call trace."""
    from perflab.grading.probing import outcome

    dev = FakeDevice(case["launch"])
    result = outcome(time_callable, dev.work(case["durations"]), warmup=case["warmup"], repeats=case["repeats"],
                     clock=dev.clock, sync=dev.sync)
    return {"result": result, "calls": dev.calls, "syncs": dev.syncs, "trace": "".join(dev.log)[:2000]}


def conv_spec(rng: np.random.Generator) -> dict[str, Any]:
    """A random convolution (kernel, stride, padding, dilation, groups, bias) and an input shape it fits."""
    groups = int(rng.choice([1, 1, 1, 2, 4]))
    c_in, c_out = groups * int(rng.integers(1, 9)), groups * int(rng.integers(1, 9))
    kernel = [int(rng.integers(1, 6)), int(rng.integers(1, 6))]
    stride = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
    padding = [int(rng.integers(0, 3)), int(rng.integers(0, 3))]
    dilation = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
    bias = bool(rng.integers(0, 2))
    spans = [dilation[i] * (kernel[i] - 1) + 1 - 2 * padding[i] for i in range(2)]
    h, w = max(spans[0], 1) + int(rng.integers(0, 20)), max(spans[1], 1) + int(rng.integers(0, 20))
    return {"in_channels": c_in, "out_channels": c_out, "kernel_size": kernel, "stride": stride,
            "padding": padding, "dilation": dilation, "groups": groups, "bias": bias,
            "shape": [int(rng.integers(1, 4)), c_in, h, w]}


def build_conv(spec: dict[str, Any]) -> tuple[nn.Conv2d, tuple[int, ...]]:
    """The convolution of a `conv_spec` and its input shape."""
    conv = nn.Conv2d(spec["in_channels"], spec["out_channels"], tuple(spec["kernel_size"]), tuple(spec["stride"]),
                     tuple(spec["padding"]), tuple(spec["dilation"]), spec["groups"], spec["bias"])
    return conv, tuple(spec["shape"])


def build_linear(spec: dict[str, Any]) -> tuple[nn.Linear, tuple[int, ...]]:
    return nn.Linear(spec["in_features"], spec["out_features"], bias=spec["bias"]), tuple(spec["shape"])


def counting_cases(seed: int) -> dict[str, list[dict[str, Any]]]:
    """Random convolutions and linear layers for the FLOP and parameter formulas."""
    rng = _rng(seed, 202)
    convs = [conv_spec(rng) for _ in range(25)]
    linears = []
    for _ in range(15):
        fin, fout, bias = int(rng.integers(1, 64)), int(rng.integers(1, 64)), bool(rng.integers(0, 2))
        lead = [int(v) for v in rng.integers(1, 6, size=int(rng.integers(1, 4)))]
        linears.append({"in_features": fin, "out_features": fout, "bias": bias, "shape": [*lead, fin]})
    param_linears = []
    for _ in range(15):
        fin, fout, bias = int(rng.integers(1, 300)), int(rng.integers(1, 300)), bool(rng.integers(0, 2))
        param_linears.append({"in_features": fin, "out_features": fout, "bias": bias, "shape": [1, fin]})
    return {"convs": convs, "linears": linears, "param_convs": convs[:15], "param_linears": param_linears}


def model_flops_case(seed: int) -> dict[str, Any]:
    """ResNet-18 with a random number of classes and a small random CNN, at a random input shape."""
    rng = _rng(seed, 203)
    side = int(rng.choice([32, 48, 64, 96]))
    return {"shape": [int(rng.integers(1, 4)), 3, side, side], "classes": int(rng.integers(2, 200)),
            "width": int(rng.integers(4, 17)), "cnn_classes": int(rng.integers(2, 20))}


def build_flops_models(case: dict[str, Any]) -> list[nn.Module]:
    import torchvision

    width = case["width"]
    return [torchvision.models.resnet18(weights=None, num_classes=case["classes"]),
            nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(width, 2 * width, 3, stride=2, groups=width),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, case["cnn_classes"]))]


def memory_cases(seed: int) -> list[dict[str, Any]]:
    """Random small CNNs (BatchNorm, a frozen layer in the last) with SGD, SGD with momentum and Adam."""
    rng = _rng(seed, 303)
    out = []
    for case, optimizer in enumerate(("sgd", "sgd-momentum", "adam")):
        width, side = int(rng.integers(4, 17)), int(rng.choice([8, 12, 16]))
        out.append({"width": width, "classes": int(rng.integers(2, 10)), "frozen": case == 2,
                    "optimizer": optimizer, "shape": [int(rng.integers(2, 6)), 3, side, side],
                    "torch_seed": int(seed) % 2**31 + case})
    return out


def build_memory_model(case: dict[str, Any]) -> nn.Module:
    width = case["width"]
    model = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1, bias=False), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, case["classes"]))
    if case["frozen"]:
        model[0].weight.requires_grad_(False)  # frozen parameters have no gradient, no state
    return model


def visible_memory_net() -> nn.Module:
    """The visible cell's tiny network."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 2))


class _FixedProfile:
    """What pstats.Stats loads a profile from (`create_stats` and `stats`): a fixed table."""

    def __init__(self, table: dict[Any, Any]) -> None:
        self.stats = table

    def create_stats(self) -> None:
        pass


VISIBLE_PROFILE_SEED = 4040


def profile_table(seed: int) -> dict[tuple[str, int, str], tuple[int, int, float, float, dict[Any, Any]]]:
    """A random cProfile table: key (filename, line, name) -> (primitive calls, total calls, tottime,
    cumtime, callers), all cumulative times distinct."""
    rng = _rng(seed, 404)
    count = int(rng.integers(6, 14))
    cumtimes = sorted({round(float(v), 6) for v in rng.uniform(0.001, 2.0, size=count)}, reverse=True)
    table: dict[tuple[str, int, str], tuple[int, int, float, float, dict[Any, Any]]] = {}
    for i, cum in enumerate(cumtimes):
        key = ("~", 0, f"<built-in method op_{i}>") if rng.random() < 0.2 else \
            (f"/lab01/case_{int(rng.integers(0, 3))}.py", int(rng.integers(1, 400)), f"fn_{i}")
        prim = int(rng.integers(1, 6))
        total = prim + (int(rng.integers(1, 4)) if rng.random() < 0.3 else 0)  # some recursive
        tot = round(cum * float(rng.uniform(0.05, 1.0)), 6)
        table[key] = (prim, total, tot, cum, {})
    return table


def profile_stats(seed: int) -> Any:
    """`profile_table(seed)` as the pstats.Stats the student's function reads."""
    import pstats

    return pstats.Stats(_FixedProfile(dict(profile_table(seed))))


def profile_ns(seed: int) -> list[int]:
    return [1, 3, int(_rng(seed, 405).integers(4, 8)), 1000]


def _row(row: Any) -> dict[str, Any]:
    from perflab.grading.probing import encode

    return {"type": type(row).__name__, **{k: encode(getattr(row, k, None)) for k in ("function", "calls",
                                                                                      "tottime", "cumtime")}}


def observe_top(top_by_cumulative: Callable[..., Any], seed: int) -> list[dict[str, Any]]:
    """The student's rows for each n of `profile_ns(seed)` on `profile_stats(seed)`."""
    out = []
    for n in profile_ns(seed):
        try:
            rows = [_row(r) for r in list(top_by_cumulative(profile_stats(seed), n))[:2000]]
            out.append({"n": n, "rows": rows})
        except Exception as exc:
            out.append({"n": n, "raised": type(exc).__name__, "message": str(exc)[:300]})
    return out


def three_steps(a: int, b: int, c: int) -> int:
    """The function whose line timings `slowest_line` reads (its body lines are first + 1 .. first + 4)."""
    x = a * 2
    y = b * 2
    z = c * 2
    return x + y + z


VISIBLE_LINES_SEED = 5050


def line_case(seed: int) -> dict[str, Any]:
    """Line timings of `three_steps`: [(offset from its first line, hits, time in units)], and the unit."""
    rng = _rng(seed, 505)
    rows = []
    times = rng.choice(np.arange(50, 5000), size=4, replace=False)
    for offset, t in zip(range(1, 5), times, strict=True):
        rows.append([offset, int(rng.integers(1, 200)), int(t)])
    return {"rows": rows, "unit": float(rng.choice([1e-6, 1e-7, 1e-9]))}


def line_stats(seed: int) -> Any:
    """`line_case(seed)` as the line_profiler LineStats the student's function reads."""
    from line_profiler import LineStats

    code = three_steps.__code__
    case = line_case(seed)
    rows = [(code.co_firstlineno + offset, hits, t) for offset, hits, t in case["rows"]]
    return LineStats({(code.co_filename, code.co_firstlineno, code.co_name): rows}, case["unit"])


def observe_slowest(slowest_line: Callable[..., Any], seed: int) -> dict[str, Any]:
    from perflab.grading.probing import encode

    try:
        got = slowest_line(line_stats(seed), three_steps)
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"type": type(got).__name__, **{k: encode(getattr(got, k, None)) for k in ("lineno", "hits", "seconds",
                                                                                       "share")}}


# Each allocates in C (a ufunc, a method): a numpy function written in Python, such as np.ones_like,
# allocates inside numpy's own file, and the leak's line would not be the student's to find.
_LEAK_STATEMENTS = ("{v} = x * 2.0", "{v} = np.negative(x)", "{v} = np.sqrt(np.abs(x))",
                    "{v} = x.astype(np.float64).tobytes()", "{v} = {{'x': x.copy()}}", "{v} = x.T.copy()")


def leak_case(seed: int, index: int) -> dict[str, Any]:
    """A function `leaky(x)` the student's leak finder has never seen: its source, the pseudo file it is
    compiled as, the line whose allocation it keeps, and the side of its square input."""
    rng = _rng(seed, 606 + index)
    lead = int(rng.integers(0, 6))
    picks = rng.permutation(len(_LEAK_STATEMENTS))[: int(rng.integers(2, 5))]
    names = [f"v{i}" for i in range(len(picks))]
    kept = int(rng.integers(0, len(picks)))
    lines = [f"# case {seed}-{index}, line {i + 1}" for i in range(lead)] + ["def leaky(x):"]
    body_first = len(lines) + 1
    lines += ["    " + _LEAK_STATEMENTS[int(p)].format(v=v) for p, v in zip(picks, names, strict=True)]
    lines += [f"    _KEPT.append({names[kept]})", "    return float(len(_KEPT))"]
    return {"source": "\n".join(lines) + "\n", "filename": f"<lab01-leak-{int(seed)}-{index}>",
            "line": body_first + kept, "side": int(rng.integers(64, 128))}


def observe_leaks(find_leak: Callable[..., Any], seed: int, cases: int = 2) -> list[dict[str, Any]]:
    """The student's (filename, line) for each `leak_case`."""
    from perflab.grading.probing import outcome

    out = []
    for index in range(cases):
        case = leak_case(seed, index)
        kept: list[Any] = []
        namespace: dict[str, Any] = {"np": np, "_KEPT": kept}
        exec(compile(case["source"], case["filename"], "exec"), namespace)  # perflab's own generated code
        rng = _rng(seed, 700 + index)
        side = case["side"]
        out.append(outcome(find_leak, namespace["leaky"], lambda rng=rng, side=side: rng.standard_normal((side, side)),
                           calls=30))
        kept.clear()
    return out


def profile_active_steps(seed: int) -> int:
    return int(_rng(seed, 707).integers(1, 3))


def observe_profile_training(profile_training: Callable[..., Any], config: Any, active: int) -> dict[str, Any]:
    """The student's profiler run: what it returned, the trace's event names, the recorded op names."""
    import tempfile
    import warnings

    with tempfile.TemporaryDirectory(prefix="lab01-trace-") as tmp:
        path = Path(tmp) / "check.trace.json"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prof = profile_training(config, active, path)
        try:
            names: Any = trace_names(path)
        except AssertionError as exc:
            names = {"missing": str(exc)}
    try:
        ops = sorted({str(avg.key) for avg in prof.key_averages()})[:5000]
    except Exception as exc:
        ops = {"raised": type(exc).__name__}
    return {"type": f"{type(prof).__module__}.{type(prof).__qualname__}",
            "is_profile": isinstance(prof, torch.profiler.profile), "names": names, "ops": ops}


def conv_bytes_cases(seed: int) -> list[tuple[dict[str, Any], int]]:
    rng = _rng(seed, 808)
    return [(conv_spec(rng), int(rng.choice([2, 4]))) for _ in range(20)]


def roofline_cases(seed: int) -> list[list[float]]:
    """(flops, bytes, peak FLOP/s, bandwidth) of random layers on random devices, none on the ridge."""
    rng = _rng(seed, 809)
    out = []
    for _ in range(30):
        peak, bandwidth = 10 ** rng.uniform(10, 15), 10 ** rng.uniform(9, 13)
        ridge = peak / bandwidth
        intensity = ridge * 10 ** rng.uniform(-2, 2)
        if abs(np.log10(intensity / ridge)) < 1e-3:
            intensity *= 2
        nbytes = 10 ** rng.uniform(3, 9)
        out.append([float(intensity * nbytes), float(nbytes), float(peak), float(bandwidth)])
    return out


VISIBLE_ROOFLINE = ([1e9, 1e9, 1e12, 1e11], [1e11, 1e9, 1e12, 1e11])
VISIBLE_BOTTLENECK = (
    ({"data": 0.6, "h2d": 0.0, "forward": 0.1, "backward": 0.2, "optimizer": 0.1},
     [{"flops": 1e9, "bytes": 1e7}, {"flops": 1e6, "bytes": 1e6}], 1e11, 1e10),
    ({"data": 0.05, "h2d": 0.0, "forward": 0.3, "backward": 0.55, "optimizer": 0.1},
     [{"flops": 1e6, "bytes": 1e6}], 1e11, 1e10),
)


def bottleneck_cases(seed: int, cases: int = 45) -> list[tuple[dict[str, float], list[dict[str, float]], float, float]]:
    """Random phase times and layers (ridge 10 FLOP/B); the judge skips those near a threshold."""
    rng = _rng(seed, 909)
    out = []
    for _ in range(cases):
        phases = {name: float(v) for name, v in zip(PHASE_LABELS, rng.dirichlet(np.ones(5) * 0.7), strict=True)}
        layers = [{"flops": float(10 ** rng.uniform(5, 9)), "bytes": 0.0} for _ in range(int(rng.integers(1, 6)))]
        for layer in layers:
            layer["bytes"] = layer["flops"] / (10 * 10 ** rng.uniform(-1.5, 1.5))
        out.append((phases, layers, 1e11, 1e10))
    return out


# The verdict on the grading machine's own measurement (cell bottleneck_here): the grader measures in
# its own process, after the notebook, so the probe records the student's verdict over the whole
# range a measurement can take and the judge reads it at the point it measured. Stage: data and h2d
# shares on a grid of this step; bound: the lab model's layers under device ridges on a log grid.
STAGE_GRID_STEP = 0.025
RIDGE_GRID = tuple(float(r) for r in np.logspace(-1, 4, 201))  # FLOP/B, about 6% apart
GRID_PEAK_FLOPS = 1e12


def stage_grid() -> list[tuple[float, float]]:
    """(data share, h2d share) points, each share a multiple of STAGE_GRID_STEP, together at most 0.95."""
    steps = round(1 / STAGE_GRID_STEP)
    return [(d * STAGE_GRID_STEP, c * STAGE_GRID_STEP) for d in range(steps) for c in range(steps // 2 + 1)
            if d + c <= round(0.95 / STAGE_GRID_STEP)]


def grid_phases(data: float, h2d: float) -> dict[str, float]:
    rest = 1.0 - data - h2d
    return {"data": data, "h2d": h2d, "forward": 0.3 * rest, "backward": 0.6 * rest, "optimizer": 0.1 * rest}


def lab_layers(config: Any) -> list[dict[str, float]]:
    """FLOPs and bytes of every conv and linear call of this lab's model (perflab.roofline's model)."""
    from perflab import roofline, workload

    model = workload.build_model(config.replace(device="cpu") if hasattr(config, "replace") else config,
                                 num_classes=10)
    shape = (config.batch_size, 3, config.image_size, config.image_size)
    return [{"flops": float(c.flops), "bytes": float(c.bytes)} for c in roofline.layer_intensity(model, shape)]


def _field(fn: Callable[..., Any], key: str, *args: Any) -> Any:
    try:
        got = fn(*args)
    except Exception as exc:
        return f"raised {type(exc).__name__}"
    if not isinstance(got, dict):
        return f"returned {type(got).__name__}"
    value = got.get(key)
    return value if isinstance(value, str) else repr(value)[:40]


def observe_verdict_grid(bottleneck_verdict: Callable[..., Any], layers: list[dict[str, float]]) -> dict[str, Any]:
    """The student's stage over `stage_grid()` and bound over RIDGE_GRID with `layers`."""
    one_layer = [{"flops": 1e9, "bytes": 1e7}]
    stages = [_field(bottleneck_verdict, "stage", grid_phases(d, c), one_layer, 1e11, 1e10) for d, c in stage_grid()]
    even = grid_phases(0.1, 0.0)
    bounds = [_field(bottleneck_verdict, "bound", even, layers, GRID_PEAK_FLOPS, GRID_PEAK_FLOPS / ridge)
              for ridge in RIDGE_GRID]
    return {"stages": stages, "bounds": bounds}


# ---------------------------------------------------------------------------------------------
# Probes: what the grader reads from the student's notebook, one per autograded cell (raw outputs
# only; `perflab/labs/hidden/lab01.py` judges them)


def _quiet_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    import warnings

    from perflab.grading.probing import outcome

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return outcome(fn, *args, **kwargs)


def _probe_timer_visible(answers: Any, seed: int) -> dict[str, Any]:
    return observe_timer(answers["time_callable"], VISIBLE_TIMER)


def _probe_timer_hidden(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import outcome

    fn = answers["time_callable"]
    cases = [observe_timer(fn, case) for case in timer_cases(seed)]
    bad = [outcome(fn, lambda: None, **args) for args in TIMER_BAD_ARGS]
    plain = outcome(fn, lambda: sum(range(100)), warmup=1, repeats=3)
    return {"cases": cases, "bad": bad, "plain": plain}


def _probe_counting_visible(answers: Any, seed: int) -> dict[str, Any]:
    from perflab import workload

    stem = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
    fc = nn.Linear(512, 1000)
    resnet = workload.build_model(workload.TrainConfig(device="cpu"), num_classes=1000)
    return {"conv_flops": _quiet_call(answers["conv2d_flops"], stem, (1, 3, 224, 224)),
            "conv_params": _quiet_call(answers["conv2d_params"], stem),
            "linear_flops": _quiet_call(answers["linear_flops"], fc, (8, 512)),
            "linear_params": _quiet_call(answers["linear_params"], fc),
            "model_flops": _quiet_call(answers["model_forward_flops"], resnet, (1, 3, 224, 224))}


def _probe_counting_layers(answers: Any, seed: int) -> dict[str, Any]:
    cases = counting_cases(seed)
    conv_flops, linear_flops = answers["conv2d_flops"], answers["linear_flops"]
    conv_params, linear_params = answers["conv2d_params"], answers["linear_params"]
    return {"conv_flops": [_quiet_call(conv_flops, *build_conv(s)) for s in cases["convs"]],
            "linear_flops": [_quiet_call(linear_flops, *build_linear(s)) for s in cases["linears"]],
            "conv_params": [_quiet_call(conv_params, build_conv(s)[0]) for s in cases["param_convs"]],
            "linear_params": [_quiet_call(linear_params, build_linear(s)[0]) for s in cases["param_linears"]]}


def _probe_counting_model(answers: Any, seed: int) -> list[dict[str, Any]]:
    fn = answers["model_forward_flops"]
    case = model_flops_case(seed)
    return [_quiet_call(fn, model, tuple(case["shape"])) for model in build_flops_models(case)]


def _probe_memory_visible(answers: Any, seed: int) -> dict[str, Any]:
    torch.manual_seed(0)
    return _quiet_call(answers["training_memory_budget"], visible_memory_net(), "adam", (2, 3, 4, 4))


def _probe_memory_hidden(answers: Any, seed: int) -> list[dict[str, Any]]:
    fn = answers["training_memory_budget"]
    out = []
    for case in memory_cases(seed):
        model = build_memory_model(case)
        torch.manual_seed(case["torch_seed"])
        out.append(_quiet_call(fn, model, case["optimizer"], tuple(case["shape"])))
    return out


def _probe_slowest_visible(answers: Any, seed: int) -> dict[str, Any]:
    return observe_slowest(answers["slowest_line"], VISIBLE_LINES_SEED)


def _probe_slowest_hidden(answers: Any, seed: int) -> dict[str, Any]:
    return observe_slowest(answers["slowest_line"], seed)


def _probe_leak_visible(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import outcome

    fn = answers["find_leak"]
    got = outcome(fn, preprocess_leaky, lambda: random_batch(0, n=4, size=16), calls=20)
    reset_leak()
    return got


def _probe_leak_hidden(answers: Any, seed: int) -> list[dict[str, Any]]:
    return observe_leaks(answers["find_leak"], seed)


def _probe_preprocess(answers: Any, seed: int) -> dict[str, Any]:
    return observe_preprocess(answers["preprocess_fixed"], seed)


def _probe_trace_visible(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import encode

    return {"active": encode(answers["ACTIVE"]), "names": trace_names(answers["TRACE"])}


def _probe_profile_hidden(answers: Any, seed: int) -> dict[str, Any]:
    return observe_profile_training(answers["profile_training"], lab_config(), profile_active_steps(seed))


def _probe_roofline_visible(answers: Any, seed: int) -> dict[str, Any]:
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)
    verdict = answers["roofline_verdict"]
    return {"bytes": _quiet_call(answers["conv2d_bytes"], conv, (1, 64, 56, 56)),
            "verdicts": [_quiet_call(verdict, *args) for args in VISIBLE_ROOFLINE]}


def _probe_roofline_hidden(answers: Any, seed: int) -> dict[str, Any]:
    conv_bytes, verdict = answers["conv2d_bytes"], answers["roofline_verdict"]
    return {"bytes": [_quiet_call(conv_bytes, *build_conv(spec), size) for spec, size in conv_bytes_cases(seed)],
            "verdicts": [_quiet_call(verdict, *args) for args in roofline_cases(seed)]}


def _probe_bottleneck_visible(answers: Any, seed: int) -> list[dict[str, Any]]:
    fn = answers["bottleneck_verdict"]
    return [_quiet_call(fn, *args) for args in VISIBLE_BOTTLENECK]


def _probe_bottleneck_rule(answers: Any, seed: int) -> list[dict[str, Any]]:
    fn = answers["bottleneck_verdict"]
    return [_quiet_call(fn, *args) for args in bottleneck_cases(seed)]


def _probe_bottleneck_here(answers: Any, seed: int) -> dict[str, Any]:
    return observe_verdict_grid(answers["bottleneck_verdict"], lab_layers(lab_config()))


PROBES = {
    "time_callable_visible": _probe_timer_visible,
    "time_callable_hidden": _probe_timer_hidden,
    "counting_visible": _probe_counting_visible,
    "counting_hidden_layers": _probe_counting_layers,
    "counting_hidden_model": _probe_counting_model,
    "memory_budget_visible": _probe_memory_visible,
    "memory_budget_hidden": _probe_memory_hidden,
    "top_by_cumulative_visible": lambda answers, seed: observe_top(answers["top_by_cumulative"], VISIBLE_PROFILE_SEED),
    "top_by_cumulative_hidden": lambda answers, seed: observe_top(answers["top_by_cumulative"], seed),
    "slowest_line_visible": _probe_slowest_visible,
    "slowest_line_hidden": _probe_slowest_hidden,
    "find_leak_visible": _probe_leak_visible,
    "find_leak_hidden": _probe_leak_hidden,
    "preprocess_fixed_check": _probe_preprocess,
    "profile_training_visible": _probe_trace_visible,
    "profile_training_hidden": _probe_profile_hidden,
    "roofline_visible": _probe_roofline_visible,
    "roofline_hidden": _probe_roofline_hidden,
    "bottleneck_visible": _probe_bottleneck_visible,
    "bottleneck_rule_hidden": _probe_bottleneck_rule,
    "bottleneck_here": _probe_bottleneck_here,
}
