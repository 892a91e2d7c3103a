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
        The fastest of the precision settings the kit's one keep rule keeps (`common.keep_rule`:
        measurably faster than FP32), else the baseline, as `baseline_config().replace(...)` of AMP_FIELDS only:
        the grader re-measures it against `baseline_config()` in a fresh process with
        `perflab.verify`, correctness gate included, and holds it to the calibrated bar of the machine
        that grades (`expectation_name()`): a real gain on tensor-core GPUs and AMX CPUs, no regression
        where the hardware has nothing to give. `CLAIM` is the speedup measured in the notebook.

    PREDICT_AMP, WHY_AMP (PREDICTIONS)
        Written BEFORE the whole-step measurement: the speedup over FP32 the fastest low-precision
        setting is expected to give here (a positive number; 1.0 for none) and one line of why. Graded
        on being there and being a prediction, never on being right (`perflab.labs.predict`).

This module holds what the notebook, its tests and the grader share: the sizes of each mode, the
baseline, the lab's names for precisions (`DTYPES`, `as_dtype`, `dtype_name`, `make_scaler`), what each
kind of hardware can give (`HARDWARE_EXPECTATIONS`, `expectation_name`), AMP_CONFIG's field rule
(`config_problems`) and its re-measurement (`verify_amp`), and the problems the grader draws
(`problems_for`, `devices`, the visible seeds): the contract, never the answer.

Elsewhere, each importing this module and never imported by it: the visible checks of amp_train_step
and AMP_CONFIG with their machinery and tolerances in `perflab.labs.lab03.checks`
(`parity_problems`, `low_precision_problems`, `scaler_problems`, `check_config`), the census check
in `perflab.labs.lab03.census` (`census_problems`); what the notebook measures and draws in
`perflab.labs.lab03.figures`; `PROBES`, what the grader reads from a notebook, in
`perflab.labs.lab03.probes`; the judges, the
reference census and the answer key (`reference_best`, the AMP_CONFIG calibration times, and
`calibration_pair`) in the grader-only `perflab/labs/lab03/judges/`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

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
from perflab.workload import TrainConfig

# What the core (env, grading, the report, the demo) knows of this lab: data, read by
# perflab.labs.registry without importing this module (perflab.labs.manifest says what each field holds).
MANIFEST = {
    "lab": "lab03_amp",
    "title": "Lab 3 — Mixed precision",
    # On a 2-core bf16 CPU, bf16 autocast gains 1.6x at 64 px, batch 32 (at 32 px overhead hides it).
    "workloads": {"grade": {"cpu": ("small", 64, 32), "cuda": ("full", 224, 128)},
                  "laptop": {"cuda": ("small", 128, 64)}},
    "fed": True,
    "bars": "graded_bars",
    "graded_changes": ("amp_bf16", "amp_fp16", "channels_last"),
    "decides_at_home": True,
    "report_sections": ("speedups",),
    "lazy_choices": {"amp_config": "AMP_CONFIG, CLAIM = BASELINE, 1.0"},
    "hints": ("mixed precision", "memory format"),
}
LAB = MANIFEST["lab"]
# The entry of autograder/expectations/<hardware_class>.json that holds this lab's bar: what
# `perflab calibrate` measures for this lab's own reference answer (the grader's `calibration_pair`:
# `reference_best`, the precision *and* the layout the device wants) against its baseline. A bare
# autocast is not the answer everywhere: a bar taken from the bare change let a student who changed
# nothing pass (the GPU runs in docs/DESIGN.md, "Workloads where the lesson is true", give the figures).
EXPECTATION = "lab03_amp"
# The reference changes of perflab.verify.calibrate.REFERENCE_CHANGES that time one autocast dtype on its
# own (the figures the lab's tables compare; no longer the lab's bar).
EXPECTATIONS = {"bf16": "amp_bf16", "fp16": "amp_fp16"}
# The knobs AMP_CONFIG may change: the precision of the compute and the memory layout it runs in.
# Everything else (data, batch, image size, loader) stays the baseline's, so the speedup is AMP's.
AMP_FIELDS = ("amp_dtype", "channels_last")
# What this lab can promise on each device kind (`common.hardware_statement` prints it).
HARDWARE_NOTES = {
    "cuda": "fp16 and bf16 autocast run on tensor cores where the GPU has them (Volta+ fp16, Ampere+ bf16 "
            "and TF32), where a real gain is possible; the GradScaler is shown at work with fp16.",
    "mps": "fp16 (and bf16 on recent macOS) autocast runs on the Apple GPU; whether it gains depends on "
           "the chip, which is what you measure.",
    "cpu": "only bf16 autocast is timed on a CPU: a real gain is possible with AMX or AVX-512-BF16 units, a "
           "slowdown where bf16 is emulated; fp16 runs only in the checks.",
}
# The names the lab uses for precisions, and what they are in torch.
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LOW_PRECISION = (torch.bfloat16, torch.float16)
# torch threads of the workload in tiny mode: the kit's tests share a CI machine with other tests, and
# on 2 busy cores a 2-thread ResNet-18 step at 32 px measured 1-9 s against 0.2-0.5 s on one thread
# (each thread waits at every barrier for the other to be scheduled).
TINY_THREADS = 1
# The type of what the student writes as amp_train_step (the checks and the figures call it).
StepFn = Callable[..., Any]


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


def needs_scaler(dtype: torch.dtype) -> bool:
    """fp16 (5 exponent bits) flushes small gradients to zero without loss scaling; bf16 keeps FP32's range."""
    return dtype == torch.float16


def make_scaler(device_type: str, dtype: str | torch.dtype | None, **kwargs: Any) -> torch.amp.GradScaler | None:
    """A GradScaler for `dtype` on `device_type` where it needs one (fp16), else None."""
    if not needs_scaler(as_dtype(dtype)):
        return None
    return torch.amp.GradScaler(device_type, **kwargs)


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


# Blocks of each timing comparison: a 95% CI of a ratio of low quantiles from 2 or 3 one-step blocks
# says little (a simulated A/A CI holds 1.0 in about 82% of runs at 4 blocks, 90% at 8, 96% at 12:
# tests/test_lab06.py), and the student's AMP_CONFIG is chosen from them.
_LAB_SIZES = {
    "tiny": dict(curve_steps=3, compare_blocks=4, compare_warmup=1, matmul_size=256, verify_max_pairs=12,
                 verify_seconds=6.0),
    "laptop": dict(curve_steps=30, compare_blocks=12, compare_warmup=3, matmul_size=1024, verify_max_pairs=None,
                   verify_seconds=None),
    "grade": dict(curve_steps=3, compare_blocks=8, compare_warmup=1, matmul_size=256, verify_max_pairs=None,
                  verify_seconds=None),
    "full": dict(curve_steps=100, compare_blocks=12, compare_warmup=3, matmul_size=4096, verify_max_pairs=None,
                 verify_seconds=None),
}


def sizes(mode: str | None = None) -> LabSizes:
    """The lab's sizes in `mode` (default: the mode in force), built on `perflab.env.mode_sizes`."""
    base = env.mode_sizes(mode, lab=LAB)
    return LabSizes(base.mode, base.data, base.image_size, base.batch_size, **_LAB_SIZES[base.mode])


def graded_bars(mode: str) -> list[tuple[str, TrainConfig]]:
    """This lab's cell re-measured against a calibrated bar: (its entry, its baseline at `mode`)."""
    return [(EXPECTATION, baseline_config(mode))]


def baseline_config(mode: str | None = None) -> TrainConfig:
    """What the lab starts from: FP32, the default (contiguous NCHW) memory format, on the best device.

    In tiny mode (the kit's own tests) it runs on TINY_THREADS torch threads; every other mode keeps torch's
    default.
    """
    s = sizes(mode)
    return TrainConfig(data=s.data, image_size=s.image_size, batch_size=s.batch_size,
                       device=str(env.pick_device()), threads=TINY_THREADS if s.mode == "tiny" else None,
                       **env.baseline_loader(LAB, mode=s.mode))


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


def expectation_name(device_type: str | None = None) -> str:
    """The calibrated entry AMP_CONFIG is held to: the lab's own reference pair (EXPECTATION) on every
    device (`device_type` is kept for notebooks released when the entry depended on it)."""
    return EXPECTATION


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
        "AMD Zen 4 and Intel Cooper Lake have bf16 dot-product instructions (twice the FP32 multiply "
        "rate on paper) but no matrix units: oneDNN's bf16 convolutions help, the casts around every "
        "autocast region cost, and the net effect on a whole training step is modest, smaller still on "
        "small images and batches, where the casts weigh more against each layer's work."),
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
    the grader holds AMP_CONFIG to here (calibrated, or the conservative rule). The notebook prints it
    beside the student's own comparison, never before it: the bar is a measured figure."""
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
# AMP_CONFIG and its graded re-measurement


def config_problems(config: Any, mode: str | None = None) -> list[str]:
    """Is `config` a TrainConfig that changes only AMP knobs of this mode's baseline, runnable here?"""
    return changed_fields_problems("AMP_CONFIG", config, baseline_config(mode), AMP_FIELDS,
                                   purpose="not its precision")


def verify_amp(config: TrainConfig, claim: float | None = None, mode: str | None = None) -> tuple[Any, Any]:
    """Re-measure `config` against the FP32 baseline in a fresh interpreter, held to this machine's bar and
    judged as the grader judges a decision (`common.verify_against_bar(decision=True)`: the keep rule).

    Returns (verdict, expectation): a `perflab.verify.Verdict` and the `Expectation` it was held to.
    """
    problems = config_problems(config, mode)
    if problems:
        raise ValueError(problems[0])
    s = sizes(mode)
    return verify_against_bar(baseline_config(mode), config, expectation_name(config.device_type), claim=claim,
                              max_pairs=s.verify_max_pairs, max_seconds=s.verify_seconds, decision=True)


# ---------------------------------------------------------------------------------------------
# The problems the grader draws: the probes (perflab.labs.lab03.probes) run the student's functions on
# them in the notebook's kernel, and the grader-only judges (perflab/labs/lab03/judges/) draw the
# same ones to compute the FP32 references and the expected census.

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


# The prediction written before the headline measurement, by the key of its graded cell
# (`test_predict_<key>`): the value's name and its one line of why (`perflab.labs.predict`).
PREDICTIONS = {"amp": ("PREDICT_AMP", "WHY_AMP")}
