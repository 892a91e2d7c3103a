"""Lab 3 — Mixed precision: the one contract between the notebook, its tests and the grader.

The student writes three things in `solutions/lab03_amp` (the notebook); the tests call nothing else:

    amp_train_step(model, optimizer, images, labels, *, dtype, scaler=None) -> float
        ONE optimizer step of `model` on `(images, labels)` with the cross-entropy loss:
        * the forward pass and the loss run under
          `torch.autocast(device_type=images.device.type, dtype=dtype)`; with `dtype=torch.float32`
          there is no autocast at all (the FP32 reference);
        * with a `scaler` (a `torch.amp.GradScaler`, what fp16 needs): `scaler.scale(loss).backward()`,
          `scaler.step(optimizer)` (unscales the gradients and skips the step when one holds inf or
          NaN), `scaler.update()` (adjusts the scale); without one: `loss.backward()`,
          `optimizer.step()`;
        * it ends with `optimizer.zero_grad(set_to_none=True)`: no gradient is left behind.
        Returns the step's loss, unscaled, as a Python float. The parameters stay FP32: autocast
        casts on the fly (never `model.half()` or `model.to(torch.bfloat16)`).

    dtype_census(model, images, labels, *, dtype) -> dict[str, dict[str, int]]
        ONE forward pass and loss as above (same autocast rule), under `torch.no_grad()` with the
        model in eval mode for the pass (its mode restored afterwards), counting the dtype of what
        was produced: every call of a leaf module (one without child modules) under its class name,
        and the loss under "loss". Example: {"Conv2d": {"bfloat16": 20}, ..., "loss": {"float32": 1}}.
        Dtype names are `str(dtype)` without "torch."; a module called twice counts twice; an output
        that is a tuple or list counts its first tensor; a call that returns no tensor is not counted.
        Every hook is removed afterwards, even when the pass raises.

    AMP_CONFIG: TrainConfig
        The fastest precision settings found, as `baseline_config().replace(...)` of AMP_FIELDS only:
        the grader re-measures it against `baseline_config()` in a fresh process with
        `perflab.verify`, correctness gate included, and holds it to the calibrated bar of the machine
        that grades (`expectation_name()`): a real gain on tensor-core GPUs and AMX CPUs, no regression
        where the hardware has nothing to give. `CLAIM` is the speedup measured in the notebook.

This module holds what the notebook, its tests and the grader share: the sizes of each mode, the
baseline, what each kind of hardware can give (`HARDWARE_EXPECTATIONS`, `reference_best`), the visible
checks (`parity_problems`, `low_precision_problems`, `scaler_problems`, `census_problems`,
`config_problems`, each returning the problems in words, and `check_config`), the measurements the
notebook shows (`loss_curves`, `op_census`, `compare_precisions`, `matmul_shapes`) and `verify_amp`.
The visible census check compares against stored expected censuses (`CENSUS_FILE`, beside this
module). The hidden tests' checks (`check_amp_step`, `check_scaler`, `check_census`) and the reference
census they compare against live in the grader-only `perflab/labs/hidden/lab03.py`.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from perflab import env
from perflab.labs.common import (  # noqa: F401
    INCONCLUSIVE_ENV,
    INCONCLUSIVE_POLICIES,
    accepted,
    changed_fields_problems,
    inconclusive_policy,
    report,
    verify_against_bar,
)
from perflab.verify.tolerance import LOSS_TOLERANCE, LOSS_TRAJECTORY_RTOL
from perflab.workload import TrainConfig

LAB = "lab03_amp"
# The entries of autograder/expectations/<hardware_class>.json that hold this lab's bar: what
# `perflab calibrate` measures for the reference AMP of each device (bf16 where autocast runs it, else
# fp16; see perflab.verify.calibrate.REFERENCE_CHANGES).
EXPECTATIONS = {"bf16": "amp_bf16", "fp16": "amp_fp16"}
# The knobs AMP_CONFIG may change: the precision of the compute and the memory layout it runs in.
# Everything else (data, batch, image size, loader) stays the baseline's, so the speedup is AMP's.
AMP_FIELDS = ("amp_dtype", "channels_last")
# What this lab can promise on each device kind (`common.hardware_statement` prints it).
HARDWARE_NOTES = {
    "cuda": "fp16 and bf16 autocast run on tensor cores where the GPU has them (Volta+ fp16, Ampere+ bf16 "
            "and TF32): expect a real gain; the GradScaler is shown at work with fp16.",
    "mps": "fp16 (and bf16 on recent macOS) autocast runs on the Apple GPU; the gain depends on the chip, "
           "from none to modest.",
    "cpu": "only bf16 autocast is timed on a CPU: a real gain with AMX, modest or none with AVX-512-BF16 "
           "alone, a slowdown where bf16 is emulated; fp16 runs only in the checks.",
}
# The names the lab uses for precisions, and what they are in torch.
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LOW_PRECISION = (torch.bfloat16, torch.float16)

# Loss tolerances of the step checks, relative to the FP32 reference's loss, per precision.
# The first step is the same initial model on the same batch, so it differs by rounding alone:
# measured on the checks' small CNNs over 400 random problems on a CPU, bf16 (8-bit mantissa) stayed
# under 0.10% and fp16 (11-bit) under 0.02%; the bounds leave 10x room for other kernels (GPUs). FP32
# against FP32 differs by summation order only (TF32 or another cuDNN algorithm on a GPU).
FIRST_STEP_RTOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2, torch.float16: 2e-3}
# Later steps follow the updates, and SGD with momentum amplifies rounding: over PARITY_STEPS steps of
# the same 400 problems bf16 drifted by up to 1.2% and fp16 by up to 0.4%; the bounds leave 5x room.
# A wrong step (a skipped or doubled update, a scaled gradient applied, a forgotten zero_grad) moves
# the loss by far more.
TRAJECTORY_RTOL = {torch.float32: 1e-2, torch.bfloat16: 0.06, torch.float16: 0.02}
# The same gate for a whole TrainConfig (ResNet-18 on the lab's data), with perflab.verify's bounds: its
# first-step loss differs from FP32's by rounding (measured 0.8% for bf16 at batch 8), and BatchNorm
# over a small batch then amplifies the difference (up to 18% within four steps).
RESNET_FIRST_STEP_RTOL = {dtype: LOSS_TOLERANCE[name][0] for name, dtype in DTYPES.items()}
RESNET_TRAJECTORY_RTOL = LOSS_TRAJECTORY_RTOL
CONFIG_GATE_STEPS = 2
# Absolute slack on top of the relative bounds: a loss near zero has no relative scale.
LOSS_ATOL = 1e-3
# Steps of each fixed-seed parity check: enough for momentum to build up, few enough to be quick.
PARITY_STEPS = 6
# The GradScaler checks. A scale of 2**10 leaves fp16 gradients finite, so one good step with
# growth_interval=1 must double it; 2**60 overflows any fp16 gradient of these nets (fp16 tops out
# at 65504), so the step must be skipped, the parameters left untouched and the scale halved.
SAFE_SCALE = 2.0**10
OVERFLOW_SCALE = 2.0**60
# Relative tolerance of one scaled fp16 step's parameter update against the FP32 reference's: an
# update left scaled is SAFE_SCALE (1024x) too large; fp16 rounding moved it by under 0.3% over 200
# random problems.
UPDATE_RTOL = 0.05
# Steps of the "never NaN" run: fp16 with a GradScaler starting far too high, so it has to back off
# several times; each backoff halves the scale, from 2**24 that is a handful of skipped steps.
NAN_STEPS = 12
NAN_INIT_SCALE = 2.0**24
# An fp16 update without unscaling is 2**10 times too big; with lr 0.05 that diverges to inf/NaN.
CHECK_LR = 0.05
CHECK_MOMENTUM = 0.9
# torch threads the checks run on (see _one_thread).
CHECK_THREADS = 1
# torch threads of the workload in tiny mode: the kit's tests share a CI machine with other tests, and
# on 2 busy cores a 2-thread ResNet-18 step at 32 px measured 1-9 s against 0.2-0.5 s on one thread
# (each thread waits at every barrier for the other to be scheduled).
TINY_THREADS = 1
# aten ops that only move or view data, left out of the op census (they have no precision of their
# own); casts (`_to_copy`) are kept: they are the price autocast pays at every precision boundary.
CENSUS_SKIP_OPS = frozenset({
    "detach", "view", "_unsafe_view", "t", "expand", "lift_fresh", "empty", "empty_like", "alias",
    "as_strided", "transpose", "permute", "reshape", "unsqueeze", "squeeze", "slice", "select",
    "clone", "copy_", "zeros", "zeros_like", "ones_like", "new_empty", "new_zeros", "fill_", "zero_",
    "_local_scalar_dense", "add_", "lift_fresh_copy", "contiguous", "split", "unbind",
})
# The expected censuses of the visible census check (small CNNs only), keyed by `census_case`:
# written by the grader-only perflab/labs/hidden/lab03.py (`write_visible_census`) from its reference.
CENSUS_FILE = Path(__file__).with_name("lab03_census.json")


def dtype_name(dtype: torch.dtype) -> str:
    """'float32', 'bfloat16', 'float16': how the census and the results name a dtype."""
    return str(dtype).removeprefix("torch.")


def as_dtype(value: str | torch.dtype | None) -> torch.dtype:
    """A precision given as a torch dtype, a lab name ('fp32', 'bf16', 'fp16') or None (FP32)."""
    if value is None:
        return torch.float32
    if isinstance(value, torch.dtype):
        if value not in DTYPES.values():
            raise ValueError(f"dtype: {value} is not one of {', '.join(map(str, DTYPES.values()))}")
        return value
    if value not in DTYPES:
        raise ValueError(f"dtype: {value!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[value]


# ---------------------------------------------------------------------------------------------
# Sizes and the baseline


@dataclass(frozen=True)
class LabSizes:
    """What one mode runs: the workload sizes, the loss curves, the timings and the grader's budget."""

    mode: str
    data: str
    image_size: int
    batch_size: int
    curve_steps: int           # steps of the FP32 vs low-precision loss curves on the lab's data
    compare_blocks: int        # ABBA blocks of each timing comparison in the notebook
    compare_warmup: int        # untimed steps of each side before a comparison
    matmul_size: int           # side of the square matmuls of the shape demo
    verify_max_pairs: int | None   # None: the protocol's own budget
    verify_seconds: float | None


_LAB_SIZES = {
    "tiny": dict(curve_steps=3, compare_blocks=2, compare_warmup=1, matmul_size=256, verify_max_pairs=12,
                 verify_seconds=6.0),
    "laptop": dict(curve_steps=30, compare_blocks=8, compare_warmup=3, matmul_size=1024, verify_max_pairs=None,
                   verify_seconds=None),
    "grade": dict(curve_steps=3, compare_blocks=3, compare_warmup=1, matmul_size=256, verify_max_pairs=None,
                  verify_seconds=None),
    "full": dict(curve_steps=100, compare_blocks=10, compare_warmup=3, matmul_size=4096, verify_max_pairs=None,
                 verify_seconds=None),
}


def sizes(mode: str | None = None) -> LabSizes:
    """The lab's sizes in `mode` (default: the mode in force), built on `perflab.env.mode_sizes`."""
    base = env.mode_sizes(mode, lab=LAB)
    return LabSizes(base.mode, base.data, base.image_size, base.batch_size, **_LAB_SIZES[base.mode])


def baseline_config(mode: str | None = None) -> TrainConfig:
    """What the lab starts from: FP32, the default (contiguous NCHW) memory format, on the best device.

    In tiny mode (the kit's own tests) it runs on TINY_THREADS torch threads; every other mode keeps torch's
    default.
    """
    s = sizes(mode)
    return TrainConfig(data=s.data, image_size=s.image_size, batch_size=s.batch_size,
                       device=str(env.pick_device()), threads=TINY_THREADS if s.mode == "tiny" else None)


def low_precisions(device_type: str) -> list[str]:
    """The low precisions this lab times on a device type: bf16 where autocast supports it, and fp16
    on GPUs (CUDA, MPS). fp16 autocast also runs on a CPU, without hardware for it: the checks use
    it there to test a GradScaler, the timings leave it out."""
    out = [name for name in ("bf16", "fp16") if env.supports_autocast(device_type, DTYPES[name])]
    return out


def candidate_configs(mode: str | None = None, device_type: str | None = None) -> dict[str, TrainConfig]:
    """Every AMP setting worth timing here, by name: each low precision, with and without channels_last,
    and FP32 with channels_last (to tell the layout's share from the precision's)."""
    base = baseline_config(mode)
    device_type = device_type or base.device_type
    out = {"fp32 channels_last": base.replace(channels_last=True)}
    for name in low_precisions(device_type):
        out[name] = base.replace(amp_dtype=name)
        out[f"{name} channels_last"] = base.replace(amp_dtype=name, channels_last=True)
    return out


def reference_best(mode: str | None = None, info: env.MachineInfo | None = None) -> TrainConfig:
    """The reference solution's AMP setting for this machine (what calibration times against the baseline).

    bf16 where the hardware has it (Ampere+ GPUs, AMX or AVX-512-BF16 CPUs), else fp16 on a GPU,
    always with channels_last on a GPU (tensor-core convolutions want NHWC). On a CPU without bf16
    hardware it stays FP32: emulated bf16 only adds casts.
    """
    info = info or env.machine_info()
    base = baseline_config(mode)
    if info.device == "cuda":
        amp = "bf16" if env.supports_autocast("cuda", torch.bfloat16) else "fp16"
        return base.replace(amp_dtype=amp, channels_last=True)
    if info.device == "mps":
        return base.replace(amp_dtype="fp16")
    if info.cpu_bf16:
        return base.replace(amp_dtype="bf16", channels_last=True)
    return base


def expectation_name(device_type: str | None = None) -> str:
    """The calibrated entry AMP_CONFIG is held to on `device_type` (default: the best device here)."""
    device_type = device_type or env.pick_device().type
    return EXPECTATIONS["bf16" if env.supports_autocast(device_type, torch.bfloat16) else "fp16"]


def needs_scaler(dtype: torch.dtype) -> bool:
    """fp16 (5 exponent bits) flushes small gradients to zero without loss scaling; bf16 keeps FP32's range."""
    return dtype == torch.float16


def make_scaler(device_type: str, dtype: str | torch.dtype | None, **kwargs: Any) -> torch.amp.GradScaler | None:
    """A GradScaler for `dtype` on `device_type` where it needs one (fp16), else None."""
    if not needs_scaler(as_dtype(dtype)):
        return None
    return torch.amp.GradScaler(device_type, **kwargs)


# ---------------------------------------------------------------------------------------------
# What the hardware can give


HARDWARE_EXPECTATIONS: dict[str, str] = {
    "tensor-core GPU": (
        "NVIDIA Volta and later run fp16 convolutions and matmuls on tensor cores (Ampere and later also "
        "bf16 and TF32) at many times the FP32 rate, and activations take half the bytes: a real gain "
        "for ResNet-18 training, larger with channels_last. Since Ampere, cuDNN runs FP32 convolutions "
        "in TF32 by default, so the FP32 baseline is already partly fast and the gain is smaller than "
        "the raw rates suggest."),
    "GPU without tensor cores": (
        "Pascal and older NVIDIA GPUs store fp16 at half the bytes but compute it at about the FP32 "
        "rate (or far below it): expect little or nothing."),
    "MPS": (
        "Apple GPUs run fp16 autocast (bf16 on recent macOS); the gain depends on the chip and on how "
        "much of the step is convolutions, from none to modest. channels_last brings little there."),
    "AMX CPU": (
        "Intel Sapphire Rapids and later multiply bf16 tiles in AMX units through oneDNN: convolutions "
        "and matmuls gain several times, the whole training step clearly (BatchNorm, ReLU and the "
        "optimizer stay at FP32 speed). channels_last is oneDNN's preferred layout."),
    "AVX-512-BF16 CPU": (
        "AMD Zen 4 and Intel Cooper Lake have bf16 dot-product instructions (2x the FP32 multiply rate "
        "on paper) but no matrix units: oneDNN's bf16 convolutions help, the casts around every "
        "autocast region cost, and the net effect on a whole training step is modest. Measured on a "
        "2-core AMD EPYC, one thread: about 1.3x at 64 px and batch 32, within noise at 32 px and "
        "batch 8 (the casts weigh more on small layers); channels_last alone, nothing."),
    "plain CPU": (
        "Without bf16 instructions bf16 is emulated (converted to FP32 and back around every op): "
        "expect a slowdown. Stay in FP32; autocast here is for checking correctness, not for speed."),
}


def hardware_kind(info: env.MachineInfo) -> str:
    """Which row of HARDWARE_EXPECTATIONS this machine is."""
    if info.device == "cuda":
        major, _ = torch.cuda.get_device_capability() if torch.cuda.is_available() else (7, 0)
        return "tensor-core GPU" if major >= 7 else "GPU without tensor cores"
    if info.device == "mps":
        return "MPS"
    flags = env.cpu_flags()
    if "amx_bf16" in flags or "amx_tile" in flags:
        return "AMX CPU"
    if info.cpu_bf16:
        return "AVX-512-BF16 CPU"
    return "plain CPU"


def hardware_expectations(info: env.MachineInfo | None = None, expectation: Any = None) -> str:
    """What mixed precision can give on each kind of hardware, this machine's kind marked, and the bar
    the grader holds AMP_CONFIG to here (calibrated, or the conservative rule)."""
    info = info or env.machine_info()
    mine = hardware_kind(info)
    lines = []
    for kind, text in HARDWARE_EXPECTATIONS.items():
        marker = ">>" if kind == mine else "  "
        lines.append(f"{marker} {kind}: {text}")
    lines.append(f"This machine: {mine} ({info.hardware_class}; {info.device_name}).")
    if expectation is not None:
        lines.append(f"The grader's bar for AMP_CONFIG here: {expectation.threshold:.2f}x "
                     f"({expectation.kind}; {expectation.reason}).")
    return "\n".join(lines)


def precision_settings() -> dict[str, Any]:
    """The global settings that decide what 'FP32' means on this machine (state them with any timing)."""
    return {
        "torch.backends.cuda.matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "torch.backends.cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.backends.cudnn.benchmark": bool(torch.backends.cudnn.benchmark),
    }


# ---------------------------------------------------------------------------------------------
# Small problems for the checks: random shapes, fixed by a seed


@dataclass(frozen=True)
class Problem:
    """A small CNN classification problem whose shapes and data follow from `seed`.

    `model()` builds the same initial network every time; `batch(step)` gives step `step`'s batch.
    Widths are drawn both on and off multiples of 8, so nothing depends on tensor-core-friendly shapes.
    """

    seed: int
    batch_size: int
    side: int
    widths: tuple[int, ...]
    classes: int
    extra: tuple[str, ...] = ()   # extra leaf layers to vary the census: "maxpool", "dropout", "gelu"
    device: str = "cpu"

    @classmethod
    def draw(cls, seed: int, device: str = "cpu") -> Problem:
        rng = random.Random(seed)
        depth = rng.randint(1, 3)
        widths = tuple(rng.choice((6, 8, 12, 16, 20, 24, 32)) for _ in range(depth))
        extra = tuple(sorted(rng.sample(("maxpool", "dropout", "gelu"), rng.randint(0, 2))))
        return cls(seed=seed, batch_size=rng.choice((4, 6, 8, 12, 16)), side=rng.choice((12, 16, 20, 24)),
                   widths=widths, classes=rng.randint(3, 10), extra=extra, device=device)

    def model(self) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            layers: list[nn.Module] = []
            channels = 3
            for i, width in enumerate(self.widths):
                layers += [nn.Conv2d(channels, width, 3, stride=1 if i == 0 else 2, padding=1, bias=False),
                           nn.BatchNorm2d(width), nn.GELU() if "gelu" in self.extra else nn.ReLU()]
                if i == 0 and "maxpool" in self.extra:
                    layers.append(nn.MaxPool2d(2))
                channels = width
            layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
            if "dropout" in self.extra:
                layers.append(nn.Dropout(0.0))  # p=0: the same numbers with or without it
            layers.append(nn.Linear(channels, self.classes))
            model = nn.Sequential(*layers)
        return model.to(self.device).train()

    def batch(self, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000 + step)
        images = torch.randn(self.batch_size, 3, self.side, self.side, generator=gen)
        labels = torch.randint(0, self.classes, (self.batch_size,), generator=gen)
        return images.to(self.device), labels.to(self.device)

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=CHECK_LR, momentum=CHECK_MOMENTUM)

    def describe(self) -> str:
        extra = f", with {'+'.join(self.extra)}" if self.extra else ""
        return (f"Problem(seed={self.seed}): batch {self.batch_size}, {self.side}x{self.side} images, conv widths "
                f"{list(self.widths)}, {self.classes} classes{extra}, on {self.device}")


def fp32_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
              labels: torch.Tensor) -> float:
    """The FP32 reference step the checks compare against: forward, loss, backward, step, clear."""
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


StepFn = Callable[..., Any]


def _run(problem: Problem, step: StepFn | None, steps: int, dtype: torch.dtype,
         scaler: torch.amp.GradScaler | None = None) -> tuple[list[float], nn.Module]:
    """`steps` steps of `problem` through `step` (None: the FP32 reference); the losses and the model."""
    model = problem.model()
    optimizer = problem.optimizer(model)
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. GradScaler's note about devices: not the student's doing
        for k in range(steps):
            images, labels = problem.batch(k)
            if step is None:
                loss = fp32_step(model, optimizer, images, labels)
            else:
                loss = step(model, optimizer, images, labels, dtype=dtype, scaler=scaler)
            losses.append(_as_float(loss, f"step {k + 1}"))
    return losses, model


def _as_float(loss: Any, where: str) -> float:
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise TypeError(f"amp_train_step returned a tensor of shape {tuple(loss.shape)} at {where}; "
                            "return the loss as a float")
        return float(loss.detach())
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return float(loss)
    raise TypeError(f"amp_train_step returned {type(loss).__name__} at {where}; return the loss as a float")


# ---------------------------------------------------------------------------------------------
# Checks (each returns the problems found, in words; empty when all is well)


def _one_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a check on one torch thread, restored afterwards: the checks' networks are tiny, and on a busy
    machine a second thread only waits for a core (measured: 10x slower under load on 2 cores)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        threads = torch.get_num_threads()
        torch.set_num_threads(CHECK_THREADS)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return wrapper


@_one_thread
def observe_parity(step: StepFn, seed: int, dtype: str | torch.dtype, *, device: str = "cpu",
                   steps: int = PARITY_STEPS) -> dict[str, Any]:
    """What `steps` fixed-seed steps of `step` at `dtype` give, as data: losses, parameter dtypes."""
    dtype = as_dtype(dtype)
    problem = Problem.draw(seed, device)
    scaler = make_scaler(torch.device(device).type, dtype)
    try:
        got, model = _run(problem, step, steps, dtype, scaler)
    except Exception as exc:  # the student's step may fail in any way: that is an answer too
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"losses": got, "param_dtypes": {name: dtype_name(p.dtype) for name, p in model.named_parameters()}}


@_one_thread
def parity_from(observed: Any, seed: int, dtype: str | torch.dtype, *, device: str = "cpu",
                steps: int = PARITY_STEPS) -> list[str]:
    """What is wrong with `observe_parity`'s data: losses within tolerance of FP32, never NaN, FP32 parameters."""
    dtype = as_dtype(dtype)
    problem = Problem.draw(seed, device)
    where = f"{problem.describe()}, dtype {dtype_name(dtype)}"
    if not isinstance(observed, Mapping) or "losses" not in observed:
        raised = observed.get("raised", "no result") if isinstance(observed, Mapping) else "no result"
        return [f"{where}: amp_train_step raised {raised}: {observed.get('message', '') if isinstance(observed, Mapping) else ''}"]
    reference, _ = _run(problem, None, steps, torch.float32)
    got = [_number(v) for v in observed["losses"]]
    if len(got) != steps:
        return [f"{where}: expected {steps} losses, got {len(got)}"]
    for k, (a, b) in enumerate(zip(reference, got, strict=True)):
        if not math.isfinite(b):
            return [f"{where}: the loss of step {k + 1} is {b} (FP32 gives {a:.4f}); it must never be NaN or inf"]
        rtol = FIRST_STEP_RTOL[dtype] if k == 0 else TRAJECTORY_RTOL[dtype]
        if abs(a - b) > LOSS_ATOL + rtol * abs(a):
            hint = (" (the first step sees the same model and batch, so only rounding may differ: is the loss "
                    "returned unscaled, computed on this batch?)" if k == 0 else
                    " (is every step applied exactly once, and are gradients cleared after each step?)")
            return [f"{where}: step {k + 1} loss {b:.5g} differs from FP32's {a:.5g} by {abs(a - b):.3g}, more "
                    f"than {LOSS_ATOL + rtol * abs(a):.3g}{hint}; FP32 losses {_fmt(reference)}, yours {_fmt(got)}"]
    dtypes = observed.get("param_dtypes")
    names = [name for name, _ in problem.model().named_parameters()]
    if not isinstance(dtypes, Mapping) or sorted(dtypes) != sorted(names):
        return [f"{where}: the model's parameters could not be read after the steps"]
    bad = [name for name in names if dtypes[name] != "float32"]
    if bad:
        return [f"{where}: parameters {', '.join(bad[:3])} are {dtypes[bad[0]]} "
                "after the steps; keep the model in FP32 and let autocast cast on the fly"]
    return []


def parity_problems(step: StepFn, seed: int, dtype: str | torch.dtype, *, device: str = "cpu",
                    steps: int = PARITY_STEPS) -> list[str]:
    """Do `steps` fixed-seed steps of `step` at `dtype` keep the losses within tolerance of FP32, never NaN?"""
    return parity_from(observe_parity(step, seed, dtype, device=device, steps=steps), seed, dtype,
                       device=device, steps=steps)


def _number(value: Any) -> float:
    from perflab.grading.probing import decode_float

    number = decode_float(value)
    if number is None:
        raise TypeError(f"expected a number, got {value!r:.60}")
    return number


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


@_one_thread
def observe_low_precision(step: StepFn, seed: int, dtype: str | torch.dtype, *, device: str = "cpu") -> dict[str, Any]:
    """One step of `step` at `dtype`, as data: the output dtype of every convolution and linear call, and
    the parameters left with a non-zero gradient."""
    dtype = as_dtype(dtype)
    problem = Problem.draw(seed, device)
    model = problem.model()
    optimizer = problem.optimizer(model)
    seen: list[list[str]] = []

    def record(module: nn.Module, inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):  # convolutions and linear layers return one tensor
            seen.append([type(module).__name__, dtype_name(output.dtype)])

    handles = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    images, labels = problem.batch(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step(model, optimizer, images, labels, dtype=dtype, scaler=make_scaler(torch.device(device).type, dtype))
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    finally:
        for handle in handles:
            handle.remove()
    left = [name for name, p in model.named_parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)]
    return {"seen": seen, "grads_left": left}


def low_precision_from(observed: Any, seed: int, dtype: str | torch.dtype, *, device: str = "cpu") -> list[str]:
    """What is wrong with `observe_low_precision`'s data: every conv/linear call in `dtype`, no gradient left."""
    dtype = as_dtype(dtype)
    problem = Problem.draw(seed, device)
    where = f"{problem.describe()}, dtype {dtype_name(dtype)}"
    if not isinstance(observed, Mapping) or "seen" not in observed:
        raised = observed.get("raised", "no result") if isinstance(observed, Mapping) else "no result"
        return [f"{where}: amp_train_step raised {raised}"]
    seen = observed["seen"]
    expected = len(problem.widths) + 1
    if not isinstance(seen, list) or len(seen) != expected:
        return [f"{where}: {len(seen) if isinstance(seen, list) else 0} convolution/linear calls ran, expected "
                f"{expected} (one forward pass per step)"]
    wrong = [(name, got) for name, got in seen if got != dtype_name(dtype)]
    if wrong:
        name, got = wrong[0]
        return [f"{where}: a {name} produced {got}, not {dtype_name(dtype)}; run the forward pass "
                f"under torch.autocast(device_type=images.device.type, dtype=dtype)"
                + (" (and no autocast at all for float32)" if dtype == torch.float32 else "")]
    left = observed.get("grads_left")
    if not isinstance(left, list):
        return [f"{where}: the gradients could not be read after the step"]
    if left:
        return [f"{where}: gradients of {', '.join(map(str, left[:3]))} are still there after the step; end with "
                "optimizer.zero_grad(set_to_none=True)"]
    return []


def low_precision_problems(step: StepFn, seed: int, dtype: str | torch.dtype, *, device: str = "cpu") -> list[str]:
    """Do the convolutions and linear layers really compute in `dtype`, with no gradient left behind?"""
    return low_precision_from(observe_low_precision(step, seed, dtype, device=device), seed, dtype, device=device)


@_one_thread
def observe_scaler(step: StepFn, seed: int, *, device: str = "cpu") -> dict[str, Any]:
    """fp16 with a GradScaler, as data, in three parts: a safe scale (the loss returned, the norm of the
    update applied, the scale after), an overflowing one (the largest parameter change, the scale after,
    the loss) and a run from a large scale (its losses, parameters left non-finite)."""
    dtype = torch.float16
    device_type = torch.device(device).type
    problem = Problem.draw(seed, device)
    images, labels = problem.batch(0)

    def safe_scale() -> dict[str, Any]:
        model = problem.model()
        before = [p.detach().clone() for p in model.parameters()]
        scaler = torch.amp.GradScaler(device_type, init_scale=SAFE_SCALE, growth_interval=1)
        loss = _as_float(step(model, problem.optimizer(model), images, labels, dtype=dtype, scaler=scaler),
                         "the first step")
        update = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)])
        return {"loss": loss, "update_norm": float(update.float().norm()), "scale": scaler.get_scale()}

    def overflow() -> dict[str, Any]:
        model = problem.model()
        before = [p.detach().clone() for p in model.parameters()]
        scaler = torch.amp.GradScaler(device_type, init_scale=OVERFLOW_SCALE, growth_interval=1)
        loss = _as_float(step(model, problem.optimizer(model), images, labels, dtype=dtype, scaler=scaler),
                         "the overflow step")
        change = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before, strict=True))
        return {"loss": loss, "max_change": change, "scale": scaler.get_scale()}

    def never_nan() -> dict[str, Any]:
        scaler = torch.amp.GradScaler(device_type, init_scale=NAN_INIT_SCALE)
        losses, model = _run(problem, step, NAN_STEPS, dtype, scaler)
        return {"losses": losses, "nonfinite": sum(int((~torch.isfinite(p)).sum()) for p in model.parameters())}

    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, part in (("safe", safe_scale), ("overflow", overflow), ("never_nan", never_nan)):
            try:
                out[name] = part()
            except Exception as exc:  # the student's step failed in this part: that part's answer
                out[name] = {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return out


@_one_thread
def scaler_from(observed: Any, seed: int, *, device: str = "cpu") -> list[str]:
    """What is wrong with `observe_scaler`'s data: scaled backward, unscaled update, skipped overflow,
    updated scale, never NaN. Each part is reported on its own."""
    dtype = torch.float16
    problem = Problem.draw(seed, device)
    where = f"{problem.describe()}, fp16 with a GradScaler"
    images, labels = problem.batch(0)
    if not isinstance(observed, Mapping):
        return [f"{where}: no result"]
    problems: list[str] = []
    names = {"safe": "from a scale of 2**10", "overflow": "from a scale of 2**60",
             "never_nan": f"over {NAN_STEPS} steps from a scale of 2**24"}
    parts = {}
    for key, name in names.items():
        part = observed.get(key)
        if not isinstance(part, Mapping) or "raised" in part:
            raised = part.get("raised", "no result") if isinstance(part, Mapping) else "no result"
            message = part.get("message", "") if isinstance(part, Mapping) else ""
            if "No inf checks were recorded" in str(message):  # torch's words for update() without step()
                message = ("scaler.update() ran, but no scaler.step(optimizer) before it: call "
                           "scaler.step(optimizer) instead of optimizer.step() (it unscales the gradients "
                           "and skips the step when they overflowed), then scaler.update()")
            problems.append(f"{where}, {name}: the step raised {raised}: {message}")
        else:
            parts[key] = part
    if "safe" in parts:
        part = parts["safe"]
        ref_model = problem.model()
        before = [p.detach().clone() for p in ref_model.parameters()]
        ref_loss = fp32_step(ref_model, problem.optimizer(ref_model), images, labels)
        ref_update = torch.cat([(p.detach() - b).flatten() for p, b in zip(ref_model.parameters(), before, strict=True)])
        loss, norm, scale = _number(part.get("loss")), _number(part.get("update_norm")), _number(part.get("scale"))
        if abs(loss - ref_loss) > LOSS_ATOL + FIRST_STEP_RTOL[dtype] * abs(ref_loss):
            scaled = abs(loss - ref_loss * SAFE_SCALE) < 0.05 * SAFE_SCALE * abs(ref_loss)
            problems.append(f"{where}: the step returned {loss:.5g} where FP32's loss is {ref_loss:.5g}"
                            + ("; that is the scaled loss: return the loss itself, not scaler.scale(loss)"
                               if scaled else ""))
        ratio = norm / float(ref_update.norm()) if float(ref_update.norm()) > 0 else math.nan
        if not (math.isfinite(ratio) and abs(ratio - 1) <= UPDATE_RTOL):
            if ratio == 0:
                why = "no update was applied"
            elif ratio > 10:
                why = (f"the update is {ratio:.3g} times FP32's: it is still scaled (step through "
                       "scaler.step(optimizer), which unscales the gradients first)")
            else:
                why = f"the update is {ratio:.3g} times FP32's"
            problems.append(f"{where}: {why}")
        if scale != SAFE_SCALE * 2:
            problems.append(f"{where}: after one good step with growth_interval=1 the scale is {scale:g}, "
                            f"expected {SAFE_SCALE * 2:g}: call scaler.update() after scaler.step(optimizer)")
    if "overflow" in parts:
        part = parts["overflow"]
        if _number(part.get("max_change")) != 0.0:
            problems.append(f"{where}: with a scale of 2**60 the fp16 gradients overflow, yet the parameters changed: "
                            "let scaler.step(optimizer) decide whether to step (it skips steps with inf/NaN gradients)")
        if _number(part.get("scale")) >= OVERFLOW_SCALE:
            problems.append(f"{where}: after an overflow the scale stayed {_number(part.get('scale')):g}; call "
                            "scaler.update()")
        if not math.isfinite(_number(part.get("loss"))):
            problems.append(f"{where}: the overflow step returned the loss {part.get('loss')}; the loss itself is "
                            "finite, only the scaled gradients overflow")
    if "never_nan" in parts:
        part = parts["never_nan"]
        losses = [_number(v) for v in part.get("losses") or []]
        if len(losses) != NAN_STEPS or not all(math.isfinite(v) for v in losses):
            problems.append(f"{where}: starting from a scale of 2**24, the losses went {_fmt(losses)}")
        elif _number(part.get("nonfinite")) != 0:
            problems.append(f"{where}: starting from a scale of 2**24, parameters became inf/NaN within {NAN_STEPS} steps")
    return problems


def scaler_problems(step: StepFn, seed: int, *, device: str = "cpu") -> list[str]:
    """Is a GradScaler used right with fp16: scaled backward, unscaled update, skipped overflow, updated scale?"""
    return scaler_from(observe_scaler(step, seed, device=device), seed, device=device)


def _plain(census: Any) -> dict[str, dict[str, int]]:
    if not isinstance(census, Mapping):
        raise TypeError(f"dtype_census returned {type(census).__name__}; return a dict of dicts")
    out = {}
    for name, inner in census.items():
        if not isinstance(inner, Mapping):
            raise TypeError(f"dtype_census()[{name!r}] is {type(inner).__name__}; expected a dict of dtype name -> count")
        out[str(name)] = {str(k): int(v) for k, v in inner.items() if int(v)}
    return out


def census_case(seed: int, dtype: str | torch.dtype, device: str = "cpu", resnet: bool = False) -> str:
    """The key of one census problem in CENSUS_FILE, e.g. "seed=5 dtype=bfloat16 device=cpu"."""
    model = "resnet18 " if resnet else ""
    return f"{model}seed={seed} dtype={dtype_name(as_dtype(dtype))} device={device}"


def census_inputs(seed: int, device: str = "cpu", resnet: bool = False
                  ) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    """(model, images, labels, description) of one census problem: the seed's small CNN and its first
    batch, or ResNet-18 (`resnet=True`) on that batch resized to 32x32. The model is in train mode."""
    problem = Problem.draw(seed, device)
    images, labels = problem.batch(0)
    if not resnet:
        return problem.model(), images, labels, problem.describe()
    import torchvision

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = torchvision.models.resnet18(weights=None, num_classes=problem.classes).to(device)
    images = nn.functional.interpolate(images, size=(32, 32))
    return model.train(), images, labels, f"ResNet-18 on {problem.batch_size} images of 32x32"


def stored_census(case: str, path: str | Path | None = None) -> dict[str, dict[str, int]]:
    """The expected census of `case` (a `census_case` key) stored in CENSUS_FILE (or `path`)."""
    path = Path(path) if path is not None else CENSUS_FILE
    cases = json.loads(path.read_text(encoding="utf-8"))["cases"]
    if case not in cases:
        raise ValueError(f"no stored census for {case!r}; {path.name} holds {', '.join(map(repr, sorted(cases)))}. "
                         "Other problems need their expected census passed as expected= (the hidden checks "
                         "pass their own)")
    return {str(name): {str(d): int(n) for d, n in inner.items()} for name, inner in cases[case].items()}


@_one_thread
def observe_census(census_fn: Callable[..., Any], seed: int, dtype: str | torch.dtype, *, device: str = "cpu",
                   resnet: bool = False) -> dict[str, Any]:
    """`census_fn` on one census problem (`census_inputs`), as data: the census it returned, and the state
    it left the model in (mode, hooks, changed weights and buffers, gradients)."""
    dtype = as_dtype(dtype)
    model, images, labels, _ = census_inputs(seed, device, resnet)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = _plain(census_fn(model, images, labels, dtype=dtype))
        except Exception as exc:
            return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"census": got, "training": model.training,
            "hooks_left": [name or "the model" for name, m in model.named_modules()
                           if m._forward_hooks or m._forward_pre_hooks],
            "changed": [k for k, v in model.state_dict().items() if not torch.equal(v, state[k])],
            "grads": any(p.grad is not None for p in model.parameters())}


def census_from(observed: Any, seed: int, dtype: str | torch.dtype, *, device: str = "cpu", resnet: bool = False,
                expected: Mapping[str, Mapping[str, int]] | None = None) -> list[str]:
    """What is wrong with `observe_census`'s data against the `expected` census (default: the stored one)."""
    dtype = as_dtype(dtype)
    if expected is None:
        expected = stored_census(census_case(seed, dtype, device, resnet))
    expected = {str(name): {str(d): int(n) for d, n in inner.items() if int(n)} for name, inner in expected.items()}
    problem = Problem.draw(seed, device)
    where = (f"ResNet-18 on {problem.batch_size} images of 32x32" if resnet else problem.describe())
    where = f"{where}, dtype {dtype_name(dtype)}"
    if not isinstance(observed, Mapping) or "census" not in observed:
        raised = observed.get("raised", "no result") if isinstance(observed, Mapping) else "no result"
        message = observed.get("message", "") if isinstance(observed, Mapping) else ""
        return [f"{where}: dtype_census raised {raised}: {message}" if raised != "TypeError" else f"{where}: {message}"]
    try:
        got = _plain(observed["census"])
    except (TypeError, ValueError) as exc:
        return [f"{where}: {exc}"]
    problems = []
    if got != expected:
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        wrong = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"unexpected {', '.join(extra)}")
        for k in wrong[:3]:
            parts.append(f"{k}: {got[k]} instead of {expected[k]}")
        problems.append(f"{where}: census differs ({'; '.join(parts)})")
    if observed.get("training") is not True:
        problems.append(f"{where}: the model was in train mode and is left in eval mode; restore its mode")
    leftover = observed.get("hooks_left")
    if not isinstance(leftover, list) or leftover:
        problems.append(f"{where}: hooks are still registered on {', '.join(map(str, (leftover or ['?'])[:3]))}; "
                        "remove every handle (handle.remove()) in a finally block")
    changed = observed.get("changed")
    if not isinstance(changed, list) or changed:
        problems.append(f"{where}: the census changed {', '.join(map(str, (changed or ['?'])[:3]))}; run the pass in "
                        "eval mode under torch.no_grad()")
    if observed.get("grads") is not False:
        problems.append(f"{where}: the census left gradients; run it under torch.no_grad()")
    return problems


def census_problems(census_fn: Callable[..., Any], seed: int, dtype: str | torch.dtype, *, device: str = "cpu",
                    resnet: bool = False, expected: Mapping[str, Mapping[str, int]] | None = None) -> list[str]:
    """Does `census_fn` count every leaf module call and the loss by dtype, leaving the model as it was?

    The model is the seed's small CNN, or ResNet-18 (`resnet=True`) on 32x32 images of the seed's batch
    (`census_inputs`). The census is compared with `expected`, by default the one stored for this
    problem in CENSUS_FILE (`stored_census`; a ValueError names the stored problems when it has none).
    """
    if expected is None:
        expected = stored_census(census_case(seed, as_dtype(dtype), device, resnet))
    return census_from(observe_census(census_fn, seed, dtype, device=device, resnet=resnet), seed, dtype,
                       device=device, resnet=resnet, expected=expected)


def config_problems(config: Any, mode: str | None = None) -> list[str]:
    """Is `config` a TrainConfig that changes only AMP knobs of this mode's baseline, runnable here?"""
    return changed_fields_problems("AMP_CONFIG", config, baseline_config(mode), AMP_FIELDS,
                                   purpose="not its precision")


def config_parity_problems(config: TrainConfig, mode: str | None = None, steps: int = CONFIG_GATE_STEPS) -> list[str]:
    """Does `config` train on the baseline's samples with losses within its precision's tolerance?"""
    from perflab import workload

    base = baseline_config(mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = workload.train(base, steps), workload.train(config, steps)
    dtype = as_dtype(config.amp_dtype)
    for k in range(steps):
        if a.indices[k] != b.indices[k]:
            return [f"AMP_CONFIG: step {k + 1} trained on other samples than the baseline"]
        rtol = RESNET_FIRST_STEP_RTOL[dtype] if k == 0 else RESNET_TRAJECTORY_RTOL
        if not math.isfinite(b.losses[k]) or abs(a.losses[k] - b.losses[k]) > LOSS_ATOL + rtol * abs(a.losses[k]):
            return [f"AMP_CONFIG: step {k + 1} loss {b.losses[k]:.5g} against the baseline's {a.losses[k]:.5g}, "
                    f"more than {dtype_name(dtype)} rounding explains"]
    return []


# ---------------------------------------------------------------------------------------------
# Measurements the notebook shows


def loss_curves(step: StepFn, precisions: Sequence[str], *, mode: str | None = None, steps: int | None = None,
                progress: Callable[[Any], Any] | None = None) -> dict[str, list[float]]:
    """Fixed-seed ResNet-18 runs on the lab's data through `step`, one per precision (fp32, bf16, fp16).

    Every run starts from the same initial weights and sees the same batches, so the curves differ by
    precision alone. fp16 runs get a GradScaler.
    """
    from perflab import workload

    config = baseline_config(mode)
    steps = steps or sizes(mode).curve_steps
    curves: dict[str, list[float]] = {}
    for name in precisions:
        dtype = as_dtype(name)
        work = workload.build(config)
        scaler = make_scaler(work.device.type, dtype)
        losses = []
        try:
            for _ in (progress or iter)(range(steps)):
                images, labels, _ = work.next_batch()
                images, labels = images.to(work.device), labels.to(work.device)
                losses.append(_as_float(step(work.model, work.optimizer, images, labels, dtype=dtype, scaler=scaler),
                                        f"{name} step {len(losses) + 1}"))
        finally:
            work.close()
        curves[name] = losses
    return curves


def curve_summary(curves: Mapping[str, Sequence[float]], reference: str = "fp32") -> dict[str, dict[str, float]]:
    """Per precision: its first and last loss, and its largest absolute and relative gap to `reference`."""
    ref = list(curves[reference])
    out = {}
    for name, losses in curves.items():
        gaps = [abs(a - b) for a, b in zip(ref, losses, strict=True)]
        rel = [g / max(abs(a), 1e-12) for g, a in zip(gaps, ref, strict=True)]
        out[name] = {"first": float(losses[0]), "last": float(losses[-1]), "max_abs_gap": max(gaps),
                     "max_rel_gap": max(rel), "finite": all(math.isfinite(v) for v in losses)}
    return out


class _OpCensus(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        tensor = next((t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)), None)
        if name not in CENSUS_SKIP_OPS and tensor is not None and tensor.is_floating_point():
            self.counts[name][dtype_name(tensor.dtype)] += 1
        return out


def op_census(fn: Callable[[], Any]) -> dict[str, dict[str, int]]:
    """Every floating-point aten op `fn()` runs (forward and backward alike) by the dtype it produced.

    This sits below autocast, so it sees what really ran: the casts autocast inserted (`_to_copy`),
    convolutions and matmuls in the low dtype, and what autocast keeps in FP32.
    """
    census = _OpCensus()
    with census:
        fn()
    return {name: dict(c) for name, c in sorted(census.counts.items())}


def census_rows(census: Mapping[str, Mapping[str, int]]) -> list[dict[str, Any]]:
    """A census as table rows (name, then a count per dtype), most calls first."""
    dtypes = sorted({d for inner in census.values() for d in inner})
    rows = [{"name": name, **{d: int(inner.get(d, 0)) for d in dtypes}} for name, inner in census.items()]
    return sorted(rows, key=lambda r: (-sum(r[d] for d in dtypes), r["name"]))


def census_table(census: Mapping[str, Mapping[str, int]]) -> str:
    """A census as a fixed-width text table."""
    rows = census_rows(census)
    dtypes = sorted({d for inner in census.values() for d in inner})
    width = max([len("op / module")] + [len(r["name"]) for r in rows])
    lines = [f"{'op / module':<{width}}  " + "  ".join(f"{d:>9}" for d in dtypes)]
    lines += [f"{r['name']:<{width}}  " + "  ".join(f"{r[d] or '':>9}" for d in dtypes) for r in rows]
    return "\n".join(lines)


def plot_census(census: Mapping[str, Mapping[str, int]], title: str = "") -> Any:
    """A horizontal stacked bar per op or module: how many of its calls produced each dtype."""
    import matplotlib.pyplot as plt

    rows = census_rows(census)[::-1]
    dtypes = sorted({d for inner in census.values() for d in inner})
    colours = {"float32": "#4c72b0", "bfloat16": "#dd8452", "float16": "#55a868"}
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(rows) + 1.2))
    left = [0] * len(rows)
    for d in dtypes:
        values = [r[d] for r in rows]
        ax.barh([r["name"] for r in rows], values, left=left, label=d, color=colours.get(d))
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("calls")
    ax.legend(loc="lower right")
    ax.set_title(title or "which dtype each op produced")
    fig.tight_layout()
    return fig


def plot_loss_curves(curves: Mapping[str, Sequence[float]], title: str = "") -> Any:
    """The loss curves of a fixed-seed run per precision, on one axis, and their gap to FP32 below it."""
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ref = curves.get("fp32")
    for name, losses in curves.items():
        steps = range(1, len(losses) + 1)
        top.plot(steps, losses, marker="o" if len(losses) <= 30 else None, ms=3, label=name)
        if ref is not None and name != "fp32":
            bottom.plot(steps, [b - a for a, b in zip(ref, losses, strict=True)], label=f"{name} - fp32")
    top.set_ylabel("training loss")
    top.legend()
    top.set_title(title or "same seed, same batches: only the precision differs")
    bottom.axhline(0, color="grey", lw=0.8)
    bottom.set_xlabel("step")
    bottom.set_ylabel("gap to fp32")
    if len(curves) > 1:
        bottom.legend()
    fig.tight_layout()
    return fig


def compare_precisions(configs: Mapping[str, TrainConfig], *, mode: str | None = None, blocks: int | None = None,
                       progress: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Time each config's training step against the FP32 baseline's, interleaved (ABBA); Comparisons by name.

    One baseline workload serves every comparison; each candidate gets its own (same seed, same data).
    """
    from perflab import timing, workload

    s = sizes(mode)
    blocks = blocks or s.compare_blocks
    base = workload.build(baseline_config(mode))
    out = {}
    try:
        for name in (progress or iter)(list(configs)):
            work = workload.build(configs[name])
            try:
                out[name] = timing.compare(lambda: workload.train_step(base), lambda w=work: workload.train_step(w),
                                           blocks=blocks, block_size=1, warmup=s.compare_warmup, device=base.device,
                                           labels=("fp32", name))
            finally:
                work.close()
    finally:
        base.close()
    return out


def speedup_rows(comparisons: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The `speedups` section of the results from named Comparisons."""
    return [comparison.as_speedup(name) for name, comparison in comparisons.items()]


def plot_speedups(comparisons: Mapping[str, Any], bar: float | None = None, title: str = "") -> Any:
    """Each setting's speedup over FP32 with its 95% CI; the grader's bar as a dashed line."""
    import matplotlib.pyplot as plt

    names = list(comparisons)
    values = [comparisons[n].speedup for n in names]
    cis = [comparisons[n].ci() for n in names]
    low = [v - ci.low for v, ci in zip(values, cis, strict=True)]
    high = [ci.high - v for v, ci in zip(values, cis, strict=True)]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.5))
    ax.barh(names, values, xerr=[low, high], color="#4c72b0", capsize=4)
    ax.axvline(1.0, color="grey", lw=1, label="FP32 baseline")
    if bar is not None:
        ax.axvline(bar, color="#c44e52", ls="--", lw=1, label=f"grader's bar {bar:.2f}x")
    ax.set_xlabel("speedup over FP32 (time FP32 / time setting), 95% CI")
    ax.legend(loc="lower right")
    ax.set_title(title or "what each precision setting gives on this machine")
    fig.tight_layout()
    return fig


def matmul_shapes(n: int, dtypes: Sequence[str] = ("fp32", "bf16"), device: str | None = None) -> list[dict[str, Any]]:
    """Time an n x n matmul against an (n-1) x (n-1) one per dtype: tensor cores want multiples of 8.

    Returns rows {"dtype", "n", "seconds", "tflops"}; the seconds are the median of perflab.timing.
    """
    from perflab import timing

    dev = env.pick_device(device)
    rows = []
    for name in dtypes:
        dtype = as_dtype(name)
        for side in (n, n - 1):
            a = torch.randn(side, side, device=dev).to(dtype)
            b = torch.randn(side, side, device=dev).to(dtype)
            m = timing.benchmark(lambda a=a, b=b: a @ b, device=dev, min_run_time=0.1,
                                 label=f"{name} {side}")
            rows.append({"dtype": name, "n": side, "seconds": m.median, "tflops": 2 * side**3 / m.median / 1e12})
    return rows


# ---------------------------------------------------------------------------------------------
# The graded re-measurement


def verify_amp(config: TrainConfig, claim: float | None = None, mode: str | None = None) -> tuple[Any, Any]:
    """Re-measure `config` against the FP32 baseline in a fresh interpreter, held to this machine's bar.

    Returns (verdict, expectation): a `perflab.verify.Verdict` and the `Expectation` it was held to.
    """
    problems = config_problems(config, mode)
    if problems:
        raise ValueError(problems[0])
    s = sizes(mode)
    return verify_against_bar(baseline_config(mode), config, expectation_name(config.device_type), claim=claim,
                              max_pairs=s.verify_max_pairs, max_seconds=s.verify_seconds)


# ---------------------------------------------------------------------------------------------
# The visible AMP_CONFIG check (the hidden tests' checks live in perflab/labs/hidden/lab03.py)


def check_config(config: Any, mode: str | None = None) -> None:
    """AMP_CONFIG changes only the AMP knobs of the baseline, and trains like it (same samples, close losses)."""
    found = config_problems(config, mode) or config_parity_problems(config, mode)
    assert not found, found[0]


# ---------------------------------------------------------------------------------------------
# What the grader reads from a notebook (perflab.grading.probing): each autograded cell's probe
# runs the student's functions on problems drawn from the grader's seed and returns what they did,
# as data (`observe_*`); the grader-only judges (perflab/labs/hidden/lab03.py) draw the same problems,
# compute the FP32 references and the expected census, and decide (`*_from`).

STEP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
VISIBLE_STEP_SEED, VISIBLE_SCALER_SEED, VISIBLE_CENSUS_SEED = 7, 11, 5
HIDDEN_STEP_PROBLEMS, HIDDEN_SCALER_PROBLEMS, HIDDEN_CENSUS_PROBLEMS = 4, 2, 3


def problems_for(seed: int, count: int) -> list[int]:
    """The problem seeds a hidden check draws from the grader's seed."""
    rng = random.Random(seed)
    return [rng.randrange(2**31) for _ in range(count)]


def devices() -> list[str]:
    """The devices the checks run on: the CPU always, and CUDA where there is one."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def _step_observations(step: StepFn, seed: int, device: str) -> dict[str, Any]:
    return {dtype_name(d): {"parity": observe_parity(step, seed, d, device=device),
                            "low": observe_low_precision(step, seed, d, device=device)} for d in STEP_DTYPES}


def _probe_step_visible(answers: Any, seed: int) -> dict[str, Any]:
    return _step_observations(answers["amp_train_step"], VISIBLE_STEP_SEED, "cpu")


def _probe_step_hidden(answers: Any, seed: int) -> dict[str, Any]:
    step = answers["amp_train_step"]
    return {device: [_step_observations(step, s, device) for s in problems_for(seed, HIDDEN_STEP_PROBLEMS)]
            for device in devices()}


def _probe_scaler(answers: Any, seed: int) -> dict[str, Any]:
    step = answers["amp_train_step"]
    return {"visible": observe_scaler(step, VISIBLE_SCALER_SEED),
            "hidden": {device: [observe_scaler(step, s, device=device)
                                for s in problems_for(seed, HIDDEN_SCALER_PROBLEMS)] for device in devices()}}


def _probe_census_visible(answers: Any, seed: int) -> dict[str, Any]:
    fn = answers["dtype_census"]
    return {dtype_name(d): observe_census(fn, VISIBLE_CENSUS_SEED, d) for d in (torch.float32, torch.bfloat16)}


def _probe_census_hidden(answers: Any, seed: int) -> dict[str, Any]:
    fn = answers["dtype_census"]
    out: dict[str, Any] = {}
    for device in devices():
        out[device] = {"small": [{dtype_name(d): observe_census(fn, s, d, device=device) for d in STEP_DTYPES}
                                 for s in problems_for(seed, HIDDEN_CENSUS_PROBLEMS)],
                       "resnet": {dtype_name(d): observe_census(fn, seed, d, device=device, resnet=True)
                                  for d in LOW_PRECISION}}
    return out


def _probe_config(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import encode

    config = answers["AMP_CONFIG"]
    return {"type": type(config).__name__, "config": config.to_dict() if isinstance(config, TrainConfig) else None,
            "claim": encode(answers.get("CLAIM"))}


PROBES = {
    "test_amp_step_visible": _probe_step_visible,
    "test_amp_step_hidden": _probe_step_hidden,
    "test_amp_step_scaler": _probe_scaler,
    "test_census_visible": _probe_census_visible,
    "test_census_hidden": _probe_census_hidden,
    "test_amp_config": _probe_config,
    "test_amp_verified": _probe_config,
}
