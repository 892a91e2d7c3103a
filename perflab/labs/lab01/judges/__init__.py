"""Lab 01's judges: the grader's decision on every autograded cell, from the observations the lab's
probes (`perflab.labs.lab01.probes.PROBES`) returned, and the reference answers they compare against.
Grader-only: the student bundle and the grading sandbox leave this module out.

Each judge draws the probe's inputs again from the grader's seed with the public case generators of
`perflab/labs/lab01/checks.py`, computes the reference answer here (FlopCounterMode, perflab.memory,
perflab.roofline, the grader's own measurement of the training step) and compares: AssertionError on
the first problem, its message the student's feedback line. `JUDGES` maps grade ids to judges;
`perflab.grading.judging` runs them in the grading parent, and a solution notebook's hidden blocks
run probe and judge in-process with `check(grade_id, globals())`.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from perflab import diagnose
from perflab.grading.judging import Context, check_here
from perflab.grading.probing import decode_float
from perflab.labs import lab01
from perflab.labs.lab01 import COPY_SHARE, DATA_SHARE, MEMORY_TIME_SHARE
from perflab.labs.lab01 import checks as lab01_checks
from perflab.labs.lab01.checks import (
    RIDGE_GRID,
    TIMER_BAD_ARGS,
    VISIBLE_ROOFLINE,
    VISIBLE_TIMER,
)
from perflab.labs.lab01.judges import mystery

# Relative tolerance on activation bytes: storages saved for backward can be counted with or
# without the input batch's own storage pinned by a view; 2% covers that, a wrong method misses by far more.
ACTIVATION_TOLERANCE = 0.02
# A grading machine whose own measurement lands this close to a threshold cannot tell the two
# answers apart from one run (step-time shares move by a few points between runs), so both count.
SHARE_MARGIN = 0.05
MEMORY_SHARE_MARGIN = 0.10


def check(grade_id: str, namespace: Mapping[str, Any], seed: int = 0) -> None:
    """A solution notebook's hidden block: this cell's probe and judge, in this process."""
    check_here(lab01.LAB, grade_id, namespace, seed)


def _close(a: float, b: float, rel: float = 1e-9, abs_: float = 1e-12) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=abs_)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _list(observed: Any, count: int, what: str = "case") -> list[Any]:
    assert isinstance(observed, list) and len(observed) == count, f"the probe returned no result for every {what}"
    return observed


def _value(got: Any, call: str) -> Any:
    """The value of an `outcome` record (AssertionError naming the call when it raised)."""
    assert isinstance(got, dict), f"{call}: no result"
    if "raised" in got:
        raise AssertionError(f"{call} raised {got['raised']}: {got.get('message', '')}")
    assert "value" in got, f"{call}: no result"
    return got["value"]


def _number(value: Any, what: str) -> float:
    number = decode_float(value)
    assert number is not None, f"{what}: expected a number, got {value!r:.80}"
    return number


def _integer(value: Any, what: str) -> int:
    number = _number(value, what)
    assert math.isfinite(number), f"{what}: expected a whole number, got {value!r:.80}"
    return int(value) if isinstance(value, int) else int(number)


# ---------------------------------------------------------------------------------------------
# Part 1: the timer


def _expect_timer(observed: Any, case: dict[str, Any], where: str) -> None:
    assert isinstance(observed, dict), f"{where}: no result"
    warmup, repeats = case["warmup"], case["repeats"]
    result = _value(observed.get("result"), f"{where}: time_callable")
    calls, trace = observed.get("calls"), str(observed.get("trace", ""))
    assert calls == warmup + repeats, f"{where}: fn was called {calls} times, expected {warmup + repeats}"
    assert isinstance(result, dict), f"{where}: time_callable should return a dict, got {result!r:.80}"
    samples = result.get("samples")
    assert isinstance(samples, list) and len(samples) == repeats, (
        f"{where}: {len(samples) if isinstance(samples, list) else 'no'} samples, expected one per timed call")
    expected = [case["launch"] + d for d in case["durations"][warmup:]]
    no_sync = "s" not in trace
    for i, (got, want) in enumerate(zip(samples, expected, strict=True)):
        value = _number(got, f"{where}: sample {i}")
        hint = "you never called sync()" if no_sync else "did you sync before reading the clock, and after the warm-up?"
        assert _close(value, want), f"{where}: sample {i} is {value:.3e} s, the call took {want:.3e} s ({hint})"
    p25, median, p75, p95, p99 = np.percentile(expected, [25, 50, 75, 95, 99])
    want_stats = {"median": median, "p95": p95, "p99": p99, "spread": (p75 - p25) / median}
    for key, want in want_stats.items():
        assert key in result, f"{where}: the result has no {key!r}"
        value = _number(result[key], f"{where}: {key}")
        assert _close(value, want), f"{where}: {key} is {value!r}, expected {float(want)!r}"


def judge_timer_visible(observed: Any, ctx: Context) -> None:
    case = VISIBLE_TIMER
    _expect_timer(observed, case, f"warmup={case['warmup']}, repeats={case['repeats']}")


def judge_timer_hidden(observed: Any, ctx: Context) -> None:
    cases = lab01_checks.timer_cases(ctx.seed)
    for i, (case, got) in enumerate(zip(cases, _list(observed.get("cases"), len(cases)), strict=True)):
        _expect_timer(got, case, f"case {i} (warmup={case['warmup']}, repeats={case['repeats']})")
    for args, got in zip(TIMER_BAD_ARGS, _list(observed.get("bad"), len(TIMER_BAD_ARGS)), strict=True):
        assert isinstance(got, dict) and got.get("raised") == "ValueError", (
            f"time_callable({args}) should raise ValueError")
    plain = _value(observed.get("plain"), "time_callable(fn, warmup=1, repeats=3) with the default clock")
    samples = plain.get("samples") if isinstance(plain, dict) else None
    assert isinstance(samples, list) and len(samples) == 3 and all(
        (decode_float(s) or -1.0) >= 0 for s in samples), \
        "with the default clock and no sync, time_callable should still time 3 calls"


# ---------------------------------------------------------------------------------------------
# Part 2: counting


def _flop_counter(module: nn.Module, x: torch.Tensor) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    was = module.training
    module.eval()  # a batch of one reaching a 1x1 feature map cannot be normalised in train mode; FLOPs are the same
    try:
        with _quiet(), FlopCounterMode(display=False) as counter, torch.no_grad():
            module(x)
    finally:
        module.train(was)
    return int(counter.get_total_flops())


def judge_counting_visible(observed: Any, ctx: Context) -> None:
    want = {"conv_flops": 2 * 64 * 112 * 112 * 3 * 7 * 7, "conv_params": 64 * 3 * 7 * 7,
            "linear_flops": 2 * 8 * 512 * 1000, "linear_params": 512 * 1000 + 1000, "model_flops": 3_628_146_688}
    calls = {"conv_flops": "conv2d_flops(stem, (1, 3, 224, 224))", "conv_params": "conv2d_params(stem)",
             "linear_flops": "linear_flops(fc, (8, 512))", "linear_params": "linear_params(fc)",
             "model_flops": "model_forward_flops(resnet18, (1, 3, 224, 224))"}
    for key, expected in want.items():
        got = _integer(_value(observed.get(key), calls[key]), calls[key])
        assert got == expected, f"{calls[key]} gave {got}, expected {expected}"


def judge_counting_layers(observed: Any, ctx: Context) -> None:
    cases = lab01_checks.counting_cases(ctx.seed)
    for spec, got in zip(cases["convs"], _list(observed.get("conv_flops"), len(cases["convs"])), strict=True):
        conv, shape = lab01_checks.build_conv(spec)
        want = _flop_counter(conv, torch.zeros(shape))
        value = _integer(_value(got, f"conv2d_flops({conv}, {shape})"), "conv2d_flops")
        assert value == want, f"{conv} on input {shape}: you counted {value} FLOPs, FlopCounterMode counts {want}"
    for spec, got in zip(cases["linears"], _list(observed.get("linear_flops"), len(cases["linears"])), strict=True):
        linear, shape = lab01_checks.build_linear(spec)
        want = _flop_counter(linear, torch.zeros(shape))
        value = _integer(_value(got, f"linear_flops({linear}, {shape})"), "linear_flops")
        assert value == want, f"{linear} on input {shape}: you counted {value} FLOPs, FlopCounterMode counts {want}"
    for spec, got in zip(cases["param_convs"], _list(observed.get("conv_params"), len(cases["param_convs"])),
                         strict=True):
        conv, _ = lab01_checks.build_conv(spec)
        want = sum(p.numel() for p in conv.parameters())
        value = _integer(_value(got, f"conv2d_params({conv})"), "conv2d_params")
        assert value == want, f"{conv}: you counted {value} parameters, it has {want}"
    for spec, got in zip(cases["param_linears"], _list(observed.get("linear_params"), len(cases["param_linears"])),
                         strict=True):
        linear, _ = lab01_checks.build_linear(spec)
        want = sum(p.numel() for p in linear.parameters())
        value = _integer(_value(got, f"linear_params({linear})"), "linear_params")
        assert value == want, f"{linear}: you counted {value} parameters, it has {want}"


def judge_counting_model(observed: Any, ctx: Context) -> None:
    case = lab01_checks.model_flops_case(ctx.seed)
    shape = tuple(case["shape"])
    models = lab01_checks.build_flops_models(case)
    for model, got in zip(models, _list(observed, len(models), "model"), strict=True):
        name = type(model).__name__
        value = _integer(_value(got, f"model_forward_flops({name}, {shape})"), "model_forward_flops")
        want = _flop_counter(model, torch.zeros(shape))
        assert value == want, f"{name} on {shape}: you counted {value} FLOPs, FlopCounterMode counts {want}"


# ---------------------------------------------------------------------------------------------
# Part 3: the memory budget


def _budget(got: Any, call: str) -> dict[str, int]:
    value = _value(got, call)
    assert isinstance(value, dict), f"{call} should return a dict, got {value!r:.80}"
    out = {}
    for key in ("parameters", "gradients", "optimizer", "activations"):
        assert key in value, f"{call}: the budget has no {key!r}"
        out[key] = _integer(value[key], f"{call}: {key}")
    return out


def judge_memory_visible(observed: Any, ctx: Context) -> None:
    budget = _budget(observed, "training_memory_budget(tiny_net, 'adam', (2, 3, 4, 4))")
    n_params = (8 * 3 * 9 + 8) + (128 * 2 + 2)
    assert budget["parameters"] == budget["gradients"] == 4 * n_params, budget
    assert budget["optimizer"] == 2 * 4 * n_params, budget
    assert budget["activations"] == 4 * (2 * 3 * 4 * 4 + 2 * 8 * 4 * 4), budget


def judge_memory_hidden(observed: Any, ctx: Context) -> None:
    from perflab import memory

    cases = lab01_checks.memory_cases(ctx.seed)
    for i, (case, got) in enumerate(zip(cases, _list(observed, len(cases)), strict=True)):
        optimizer, shape = case["optimizer"], tuple(case["shape"])
        where = f"case {i} ({optimizer}, input {shape})"
        budget = _budget(got, f"{where}: training_memory_budget")
        model = lab01_checks.build_memory_model(case)
        torch.manual_seed(case["torch_seed"])
        with _quiet():
            want = memory.memory_budget(model, optimizer, torch.randn(shape))
        for key, value in (("parameters", want.parameters), ("gradients", want.gradients)):
            assert budget[key] == value, f"{where}: {key} {budget[key]} bytes, measured {value}"
        trainable = sum(1 for p in model.parameters() if p.requires_grad)
        counters = 8 * trainable if optimizer == "adam" else 0  # Adam's scalar steps, counted or not
        assert want.optimizer_state - counters <= budget["optimizer"] <= want.optimizer_state, \
            f"{where}: optimizer state {budget['optimizer']} bytes, measured {want.optimizer_state}"
        assert abs(budget["activations"] - want.activations) <= ACTIVATION_TOLERANCE * want.activations, \
            f"{where}: activations {budget['activations']} bytes, saved-tensor hooks measure {want.activations}"


# ---------------------------------------------------------------------------------------------
# Part 6: the leak


def _leak_answer(got: Any, call: str) -> tuple[str, int]:
    value = _value(got, call)
    assert isinstance(value, list) and len(value) == 2, f"{call} should return (filename, lineno), got {value!r:.80}"
    filename, lineno = value
    assert isinstance(filename, str) and isinstance(lineno, int), \
        f"{call} should return (filename, lineno), got {value!r:.80}"
    return filename, lineno


def judge_leak_visible(observed: Any, ctx: Context) -> None:
    import inspect

    filename, lineno = _leak_answer(observed, "find_leak(lab01.preprocess_leaky, ...)")
    source, first = inspect.getsourcelines(lab01.preprocess_leaky)
    where = inspect.getsourcefile(lab01.preprocess_leaky) or ""
    assert Path(filename).parts[-2:] == Path(where).parts[-2:], f"the leak is in {where}, " \
                                          f"you found {filename}"
    assert first <= lineno < first + len(source), f"line {lineno} is not a line of preprocess_leaky"


def judge_leak_hidden(observed: Any, ctx: Context) -> None:
    for index, got in enumerate(_list(observed, 2)):
        case = lab01_checks.leak_case(ctx.seed, index)
        filename, lineno = _leak_answer(got, "find_leak(leaky, ...)")
        assert filename == case["filename"] and lineno == case["line"], (
            f"this function keeps what line {case['line']} of {case['filename']} allocates; you found "
            f"{filename}:{lineno}\n{case['source']}")


def judge_preprocess(observed: Any, ctx: Context) -> None:
    problems = lab01_checks.preprocess_problems(observed, ctx.seed)
    assert not problems, problems[0]


# ---------------------------------------------------------------------------------------------
# Part 7: torch.profiler


def judge_trace_visible(observed: Any, ctx: Context) -> None:
    active = observed.get("active")
    assert isinstance(active, int) and not isinstance(active, bool) and active >= 1, f"ACTIVE is {active!r}"
    problems = lab01_checks.trace_problems(observed.get("names"), active)
    assert not problems, problems[0]


def judge_profile_hidden(observed: Any, ctx: Context) -> None:
    active = lab01_checks.profile_active_steps(ctx.seed)
    assert observed.get("is_profile") is True and observed.get("type") == "torch.profiler.profiler.profile", \
        f"profile_training should return the torch.profiler.profile, got {observed.get('type')}"
    names = observed.get("names")
    if isinstance(names, dict) and isinstance(names.get("missing"), str):
        raise AssertionError(names["missing"])
    problems = lab01_checks.trace_problems(names, active)
    assert not problems, problems[0]
    ops = observed.get("ops")
    assert isinstance(ops, list) and any(isinstance(k, str) and k.startswith("aten::") for k in ops), \
        "the profiler recorded no aten ops"


# ---------------------------------------------------------------------------------------------
# Part 8: the roofline


def _verdict_pair(got: Any, call: str) -> tuple[str, float]:
    value = _value(got, call)
    assert isinstance(value, list) and len(value) == 2 and isinstance(value[0], str), \
        f"{call} should return (verdict, attainable), got {value!r:.80}"
    return value[0], _number(value[1], f"{call}: attainable")


def _expect_roofline(got: Any, args: Sequence[float]) -> None:
    flops, nbytes, peak, bandwidth = args
    intensity, ridge = flops / nbytes, peak / bandwidth
    verdict, attainable = _verdict_pair(got, f"roofline_verdict({flops:.3g}, {nbytes:.3g}, {peak:.3g}, {bandwidth:.3g})")
    want = "compute-bound" if intensity >= ridge else "memory-bound"
    assert verdict == want, f"intensity {intensity:.3g} FLOP/B against ridge {ridge:.3g}: {want}, you said {verdict}"
    roof = min(peak, bandwidth * intensity)
    assert _close(attainable, roof, rel=1e-9), \
        f"attainable should be min(peak, bandwidth * intensity) = {roof:.4g}, got {attainable:.4g}"


def judge_roofline_visible(observed: Any, ctx: Context) -> None:
    got = _integer(_value(observed.get("bytes"), "conv2d_bytes(conv, (1, 64, 56, 56))"), "conv2d_bytes")
    want = 4 * (64 * 56 * 56 + 64 * 64 * 9 + 64 * 56 * 56)
    assert got == want, f"conv2d_bytes(conv, (1, 64, 56, 56)) gave {got}, expected {want}"
    for args, verdict in zip(VISIBLE_ROOFLINE, _list(observed.get("verdicts"), len(VISIBLE_ROOFLINE)), strict=True):
        _expect_roofline(verdict, args)


def judge_roofline_hidden(observed: Any, ctx: Context) -> None:
    from perflab import roofline

    cases = lab01_checks.conv_bytes_cases(ctx.seed)
    for (spec, size), got in zip(cases, _list(observed.get("bytes"), len(cases)), strict=True):
        conv, shape = lab01_checks.build_conv(spec)
        (cost,) = roofline.layer_intensity(conv, shape, torch.float16 if size == 2 else torch.float32)
        value = _integer(_value(got, f"conv2d_bytes({conv}, {shape}, {size})"), "conv2d_bytes")
        assert value == cost.bytes, f"{conv} on {shape} at {size} bytes/element: {value} bytes, expected {cost.bytes}"
    verdict_cases = lab01_checks.roofline_cases(ctx.seed)
    for args, got in zip(verdict_cases, _list(observed.get("verdicts"), len(verdict_cases)), strict=True):
        _expect_roofline(got, args)


# ---------------------------------------------------------------------------------------------
# Part 9: the bottleneck verdict


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


def _verdict_of(got: Any, call: str) -> tuple[str, str]:
    value = _value(got, call)
    assert isinstance(value, dict) and {"stage", "bound"} <= set(value), \
        "bottleneck_verdict should return a dict with 'stage' and 'bound'"
    return value["stage"], value["bound"]


def judge_bottleneck_visible(observed: Any, ctx: Context) -> None:
    want = ({"stage": "data", "bound": "compute"}, {"stage": "model", "bound": "memory"})
    for i, (expected, got) in enumerate(zip(want, _list(observed, len(want)), strict=True)):
        stage, bound = _verdict_of(got, f"bottleneck_verdict (visible case {i + 1})")
        assert {"stage": stage, "bound": bound} == expected, \
            f"visible case {i + 1}: expected {expected}, you said {stage}/{bound}"


def judge_bottleneck_rule(observed: Any, ctx: Context) -> None:
    cases = lab01_checks.bottleneck_cases(ctx.seed)
    for (phases, layers, peak, bandwidth), got in zip(cases, _list(observed, len(cases)), strict=True):
        ref = reference_verdict(phases, layers, peak, bandwidth)
        if len(ref["stages_accepted"]) > 1 or len(ref["bounds_accepted"]) > 1:
            continue  # near a threshold: not a fair question
        stage, bound = _verdict_of(got, "bottleneck_verdict")
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


def _nearest_stage_point(data: float, h2d: float) -> int:
    grid = lab01_checks.stage_grid()
    return min(range(len(grid)), key=lambda i: (grid[i][0] - data) ** 2 + (grid[i][1] - h2d) ** 2)


def _nearest_ridge(ridge: float) -> int:
    logs = [math.log(r) for r in RIDGE_GRID]
    i = bisect.bisect_left(logs, math.log(ridge))
    candidates = [j for j in (i - 1, i) if 0 <= j < len(logs)]
    return min(candidates, key=lambda j: abs(logs[j] - math.log(ridge)))


def judge_verdict_here(observed: Any, measured: dict[str, Any]) -> dict[str, Any]:
    """The student's verdict (read off the probe's grid at the measured point) against the reference
    on `measured`; near a threshold, or where the grid point and the measurement disagree, both count."""
    m = measured
    ref = reference_verdict(m["phase_seconds"], m["layers"], m["peak_flops"], m["peak_bandwidth"])
    grid = lab01_checks.stage_grid()
    stages = _list(observed.get("stages"), len(grid), "grid point")
    s = _nearest_stage_point(ref["data_share"], ref["h2d_share"])
    at = grid[s]
    grid_stage = "data" if at[0] >= DATA_SHARE or at[1] >= COPY_SHARE else "model"
    stage = stages[s]
    assert stage in (*ref["stages_accepted"], grid_stage), (
        f"on the grading machine the data phase takes {ref['data_share']:.0%} and h2d {ref['h2d_share']:.0%} "
        f"of the step: the stage is {ref['stage']}, you said {stage}")
    bounds = _list(observed.get("bounds"), len(RIDGE_GRID), "grid point")
    r = _nearest_ridge(m["peak_flops"] / m["peak_bandwidth"])
    grid_ref = reference_verdict(lab01_checks.grid_phases(0.1, 0.0), m["layers"], lab01_checks.GRID_PEAK_FLOPS,
                                 lab01_checks.GRID_PEAK_FLOPS / RIDGE_GRID[r])
    bound = bounds[r]
    assert bound in (*ref["bounds_accepted"], grid_ref["bound"]), (
        f"on the grading machine memory-bound layers hold {ref['memory_time_share']:.0%} of the model's "
        f"roofline time: the model is {ref['bound']}-bound, you said {bound}")
    return ref


def machine_measurement(mode: str) -> dict[str, Any]:
    """`grader_measurement` of the lab's configuration in `mode`, under the run's timing lock, once per
    grading run (`perflab.verify.protocol.once_per_run`): the machine does not change between the
    submissions of one run, and every student's verdict is judged against the same measurement of it."""
    from perflab.grading.timelock import timed_section
    from perflab.verify import machine_load
    from perflab.verify.protocol import once_per_run

    def measure() -> dict[str, Any]:
        with timed_section():
            return machine_load.measured_when_quiet(lambda: grader_measurement(lab01.lab_config(mode)),
                                                    "lab 1's grader measured the machine")

    return once_per_run(f"lab01_measure:machine:{mode}", measure)


def warm_up(mode: str) -> None:
    """Before the first notebook runs (`judging.warm_up`): the machine, measured while no notebook runs
    beside it, and the diagnosis judge's measuring server, started after that measurement (it imports
    torch meanwhile)."""
    machine_measurement(mode)
    mystery.warm_up()


def judge_bottleneck_here(observed: Any, ctx: Context) -> None:
    # The form first: an answer without a verdict per grid point costs no measurement of the machine.
    assert isinstance(observed, dict), "the probe returned no verdicts"
    _list(observed.get("stages"), len(lab01_checks.stage_grid()), "grid point")
    _list(observed.get("bounds"), len(RIDGE_GRID), "grid point")
    judge_verdict_here(observed, machine_measurement(ctx.mode))


JUDGES = {
    "time_callable_visible": judge_timer_visible,
    "time_callable_hidden": judge_timer_hidden,
    "counting_visible": judge_counting_visible,
    "counting_hidden_layers": judge_counting_layers,
    "counting_hidden_model": judge_counting_model,
    "memory_budget_visible": judge_memory_visible,
    "memory_budget_hidden": judge_memory_hidden,
    "find_leak_visible": judge_leak_visible,
    "find_leak_hidden": judge_leak_hidden,
    "preprocess_fixed_check": judge_preprocess,
    "profile_training_visible": judge_trace_visible,
    "profile_training_hidden": judge_profile_hidden,
    "roofline_visible": judge_roofline_visible,
    "roofline_hidden": judge_roofline_hidden,
    "bottleneck_visible": judge_bottleneck_visible,
    "bottleneck_rule_hidden": judge_bottleneck_rule,
    "bottleneck_here": judge_bottleneck_here,
    **mystery.JUDGES,
}
