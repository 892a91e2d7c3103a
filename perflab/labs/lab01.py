"""Lab 1 — Measure first: the contract between the notebook, its tests and the grader.

The student writes these functions in `labs/lab01_measure/lab01_measure.ipynb`. What is asked is
stated once, here. The visible tests call the `check_*` functions below (`check_preprocess_fixed`,
`check_trace`) with the student's function. The grader decides every autograded cell from what the
probes at the bottom (`PROBES`) return: the student's raw outputs on inputs drawn from the grader's
seed by the public case generators of `perflab.labs.lab01_checks` (which imports this module, so the
checks and probes import it when they run); the judges and the reference answers they compare
against live in the grader-only `perflab/labs/hidden/lab01.py`.

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
    The mystery pipeline (part 10): DIAGNOSIS, FIXED_PIPELINE, FIX_SPEEDUP, TRACE_FILE and
    TRACE_ANSWERS, as `perflab.labs.lab01_mystery` states them.
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from perflab import diagnose
from perflab.labs import lab01_mystery
from perflab.labs.common import moved_names

LAB = "lab01_measure"

# The thresholds of the bottleneck verdict are perflab.diagnose's, so the lab and `perflab
# profile` never disagree (their reasons are written there).
DATA_SHARE = diagnose.DATA_BOUND_SHARE
COPY_SHARE = diagnose.COPY_BOUND_SHARE
MEMORY_TIME_SHARE = diagnose.MEMORY_BOUND_TIME_SHARE
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
# Checks the visible tests call with the student's functions. Their machinery and tolerances live in
# perflab.labs.lab01_checks, which imports this module; so each check imports it when it runs. The
# hidden tests' checks are the grader's (perflab/labs/hidden/lab01.py).


def check_preprocess_fixed(preprocess_fixed: Callable[[np.ndarray], torch.Tensor], seed: int = 0,
                           calls: int = 30) -> None:
    """Same output as `preprocess_leaky`; memory (tracemalloc and resident set) does not grow over calls."""
    from perflab.labs.lab01_checks import observe_preprocess, preprocess_problems

    problems = preprocess_problems(observe_preprocess(preprocess_fixed, seed, calls), seed, calls)
    assert not problems, problems[0]


def check_trace(trace_path: str | Path, active_steps: int) -> dict[str, int]:
    """A Chrome trace holds `active_steps` profiler steps and the phase labels; returns label counts."""
    from perflab.labs.lab01_checks import trace_names, trace_problems

    names = trace_names(trace_path)
    problems = trace_problems(names, active_steps)
    assert not problems, problems[0]
    return {label: names.get(label, 0) for label in PHASE_LABELS}


# ---------------------------------------------------------------------------------------------
# Probes: what the grader reads from the student's notebook, one per autograded cell (raw outputs
# only, on the cases of perflab.labs.lab01_checks; `perflab/labs/hidden/lab01.py` judges them)


def _probe_timer_visible(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.labs.lab01_checks import VISIBLE_TIMER, observe_timer

    return observe_timer(answers["time_callable"], VISIBLE_TIMER)


def _probe_timer_hidden(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import outcome
    from perflab.labs.lab01_checks import TIMER_BAD_ARGS, observe_timer, timer_cases

    fn = answers["time_callable"]
    cases = [observe_timer(fn, case) for case in timer_cases(seed)]
    bad = [outcome(fn, lambda: None, **args) for args in TIMER_BAD_ARGS]
    plain = outcome(fn, lambda: sum(range(100)), warmup=1, repeats=3)
    return {"cases": cases, "bad": bad, "plain": plain}


def _probe_counting_visible(answers: Any, seed: int) -> dict[str, Any]:
    from perflab import workload
    from perflab.labs.lab01_checks import quiet_call

    stem = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
    fc = nn.Linear(512, 1000)
    resnet = workload.build_model(workload.TrainConfig(device="cpu"), num_classes=1000)
    return {"conv_flops": quiet_call(answers["conv2d_flops"], stem, (1, 3, 224, 224)),
            "conv_params": quiet_call(answers["conv2d_params"], stem),
            "linear_flops": quiet_call(answers["linear_flops"], fc, (8, 512)),
            "linear_params": quiet_call(answers["linear_params"], fc),
            "model_flops": quiet_call(answers["model_forward_flops"], resnet, (1, 3, 224, 224))}


def _probe_counting_layers(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.labs.lab01_checks import build_conv, build_linear, counting_cases, quiet_call

    cases = counting_cases(seed)
    conv_flops, linear_flops = answers["conv2d_flops"], answers["linear_flops"]
    conv_params, linear_params = answers["conv2d_params"], answers["linear_params"]
    return {"conv_flops": [quiet_call(conv_flops, *build_conv(s)) for s in cases["convs"]],
            "linear_flops": [quiet_call(linear_flops, *build_linear(s)) for s in cases["linears"]],
            "conv_params": [quiet_call(conv_params, build_conv(s)[0]) for s in cases["param_convs"]],
            "linear_params": [quiet_call(linear_params, build_linear(s)[0]) for s in cases["param_linears"]]}


def _probe_counting_model(answers: Any, seed: int) -> list[dict[str, Any]]:
    from perflab.labs.lab01_checks import build_flops_models, model_flops_case, quiet_call

    fn = answers["model_forward_flops"]
    case = model_flops_case(seed)
    return [quiet_call(fn, model, tuple(case["shape"])) for model in build_flops_models(case)]


def _probe_memory_visible(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.labs.lab01_checks import quiet_call, visible_memory_net

    torch.manual_seed(0)
    return quiet_call(answers["training_memory_budget"], visible_memory_net(), "adam", (2, 3, 4, 4))


def _probe_memory_hidden(answers: Any, seed: int) -> list[dict[str, Any]]:
    from perflab.labs.lab01_checks import build_memory_model, memory_cases, quiet_call

    fn = answers["training_memory_budget"]
    out = []
    for case in memory_cases(seed):
        model = build_memory_model(case)
        torch.manual_seed(case["torch_seed"])
        out.append(quiet_call(fn, model, case["optimizer"], tuple(case["shape"])))
    return out


def _probe_leak_visible(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import outcome

    fn = answers["find_leak"]
    got = outcome(fn, preprocess_leaky, lambda: random_batch(0, n=4, size=16), calls=20)
    reset_leak()
    return got


def _probe_leak_hidden(answers: Any, seed: int) -> list[dict[str, Any]]:
    from perflab.labs.lab01_checks import observe_leaks

    return observe_leaks(answers["find_leak"], seed)


def _probe_preprocess(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.labs.lab01_checks import observe_preprocess

    return observe_preprocess(answers["preprocess_fixed"], seed)


def _probe_trace_visible(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import encode
    from perflab.labs.lab01_checks import trace_names

    return {"active": encode(answers["ACTIVE"]), "names": trace_names(answers["TRACE"])}


def _probe_profile_hidden(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.labs.lab01_checks import observe_profile_training, profile_active_steps

    return observe_profile_training(answers["profile_training"], lab_config(), profile_active_steps(seed))


def _probe_roofline_visible(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.labs.lab01_checks import VISIBLE_ROOFLINE, quiet_call

    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)
    verdict = answers["roofline_verdict"]
    return {"bytes": quiet_call(answers["conv2d_bytes"], conv, (1, 64, 56, 56)),
            "verdicts": [quiet_call(verdict, *args) for args in VISIBLE_ROOFLINE]}


def _probe_roofline_hidden(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.labs.lab01_checks import build_conv, conv_bytes_cases, quiet_call, roofline_cases

    conv_bytes, verdict = answers["conv2d_bytes"], answers["roofline_verdict"]
    return {"bytes": [quiet_call(conv_bytes, *build_conv(spec), size) for spec, size in conv_bytes_cases(seed)],
            "verdicts": [quiet_call(verdict, *args) for args in roofline_cases(seed)]}


def _probe_bottleneck_visible(answers: Any, seed: int) -> list[dict[str, Any]]:
    from perflab.labs.lab01_checks import VISIBLE_BOTTLENECK, quiet_call

    fn = answers["bottleneck_verdict"]
    return [quiet_call(fn, *args) for args in VISIBLE_BOTTLENECK]


def _probe_bottleneck_rule(answers: Any, seed: int) -> list[dict[str, Any]]:
    from perflab.labs.lab01_checks import bottleneck_cases, quiet_call

    fn = answers["bottleneck_verdict"]
    return [quiet_call(fn, *args) for args in bottleneck_cases(seed)]


def _probe_bottleneck_here(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.labs.lab01_checks import lab_layers, observe_verdict_grid

    return observe_verdict_grid(answers["bottleneck_verdict"], lab_layers(lab_config()))


PROBES = {
    "time_callable_visible": _probe_timer_visible,
    "time_callable_hidden": _probe_timer_hidden,
    "counting_visible": _probe_counting_visible,
    "counting_hidden_layers": _probe_counting_layers,
    "counting_hidden_model": _probe_counting_model,
    "memory_budget_visible": _probe_memory_visible,
    "memory_budget_hidden": _probe_memory_hidden,
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
    **lab01_mystery.PROBES,
}


# Names that moved to the checks and helpers stay reachable as `lab01.<name>` (a notebook released before).
__getattr__ = moved_names(__name__, "perflab.labs.lab01_checks")
