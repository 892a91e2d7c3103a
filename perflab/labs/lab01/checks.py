"""Lab 1's checks: what the visible tests, the grader's probes and its judges run.

The visible checks the notebook's test cells call (`check_preprocess_fixed`, `check_trace`) and their
machinery: the preprocessing check (`observe_preprocess`, `preprocess_problems`, with its memory
tolerances), the trace check (`trace_names`, `trace_problems`), and the grader's cases: public, so a
probe (in the student's kernel) and a judge (in the grader) draw identical inputs from the same seed
(`*_cases`, `VISIBLE_*`, generated leaky functions, the verdict grid), with the `observe_*` functions
that record what the student's function did. This module imports the contract `perflab.labs.lab01`,
never the reverse; the probes (`perflab.labs.lab01.probes`) run these, and the grader-only
`perflab/labs/lab01/judges/` judges with them.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from perflab.labs.lab01 import (
    PHASE_LABELS,
    REQUIRED_LABELS,
    FakeDevice,
    preprocess_leaky,
    random_batch,
    reset_leak,
)

# A fixed preprocessing step may keep a few small objects (caches of constants): less than this
# share of one batch's float copy per call is "not growing".
LEAK_GROWTH_PER_CALL = 0.05
# Resident-set growth allowed over the RSS check's calls; a leak of the float copies grows by
# about 80 MB there, allocator noise stays under a few MB.
LEAK_RSS_BYTES = 24 * 2**20


# ---------------------------------------------------------------------------------------------
# The preprocessing and trace checks: observations as data, and what is wrong with them in words


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


def check_preprocess_fixed(preprocess_fixed: Callable[[np.ndarray], torch.Tensor], seed: int = 0,
                           calls: int = 30) -> None:
    """Same output as `preprocess_leaky`; memory (tracemalloc and resident set) does not grow over calls."""
    problems = preprocess_problems(observe_preprocess(preprocess_fixed, seed, calls), seed, calls)
    assert not problems, problems[0]


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


def quiet_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """`fn(*args, **kwargs)`'s outcome as data (`perflab.grading.probing.outcome`), warnings silenced."""
    import warnings

    from perflab.grading.probing import outcome

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return outcome(fn, *args, **kwargs)


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
    from perflab.workload import network

    width = case["width"]
    return [network("resnet18", case["classes"]),
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
