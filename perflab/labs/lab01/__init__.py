"""Lab 1 — Measure first: the contract between the notebook, its tests and the grader.

The student writes these functions in `labs/lab01_measure/lab01_measure.ipynb`. What is asked is
stated once, here; the modules that check it import this one, never the reverse. The visible tests
call the checks of `perflab.labs.lab01.checks` (`check_preprocess_fixed`, `check_trace`) with the
student's function. The grader decides every autograded cell from what the probes of
`perflab.labs.lab01.probes` (`PROBES`) return: the
student's raw outputs on inputs drawn from the grader's seed by the public case generators of
`lab01_checks`; the judges and the reference answers they compare against live in the grader-only
`perflab/labs/lab01/judges/`.

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
    TRACE_ANSWERS, as `perflab.labs.lab01.mystery` states them.
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
from typing import Any

import numpy as np
import torch
from torch import nn

from perflab import diagnose

# What the core (env, grading, the report, the demo) knows of this lab: data, read by
# perflab.labs.registry without importing this module (perflab.labs.manifest says what each field holds).
MANIFEST = {
    "lab": "lab01_measure",
    "title": "Lab 1 — Measure first",
    "report_sections": ("baseline", "roofline", "top-ops"),
    "private_modules": ("perflab.labs.lab01.mystery",),  # its log of what the notebook measured
    "mystery_data": True,
}
LAB = MANIFEST["lab"]

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
