"""Lab 6 — Put it together: the one contract between the notebook, its tests and the grader.

The student writes four things in `solutions/lab06_together` (the notebook); the tests call nothing else:

    cumulative_speedups(measurements, *, quantile=QUANTILE, seed=CI_SEED) -> list[dict]
        `measurements` maps configuration names to block times (seconds per block), in ablation
        order: the FIRST entry is the original baseline, each later one adds a change to the one
        before it. Blocks were timed in interleaved rounds (block i of every configuration in round
        i), so block i of any two entries are paired. One row per entry after the baseline, in
        order: {"name": its name, "speedup": q(baseline) / q(entry) where q is the `quantile` of the
        block times (numpy.quantile, linear interpolation), "ci": [low, high] from
        `ratio_ci(baseline, entry, quantile, seed)` (paired bootstrap), "cumulative": True}. Every
        speedup is against the ORIGINAL baseline, never the previous entry (products of step ratios
        compound their noise). Fewer than two entries, an entry with fewer than two blocks or another
        number of blocks than the baseline's, or a time that is not a positive finite number:
        ValueError naming `measurements` (and the entry).

    ablation_table(rows) -> list[dict]
        From `cumulative_speedups` rows, one record per row, in order: {"name", "cumulative": its
        speedup, "ci": its ci, "step": cumulative / the previous row's cumulative (the baseline's is
        1.0): what this change added on top of the ones before it, "share": log(step) /
        log(final cumulative), this change's part of the total gain (the shares add up to 1; a change
        that cost time has a negative share), or None when |log(final)| < log(1 + PARITY): no gain
        to share}. An empty list gives an empty list; a speedup that is not a
        positive finite number: ValueError naming the row.

    FINAL: TrainConfig, CHAIN: list[(name, TrainConfig)]
        The greedy ablation: starting from BASELINE, each change `plan_changes` says to try is
        added to the configuration kept so far and screened (`screen`); it stays when its step
        speedup's CI lies above KEEP_ABOVE, and a change memory demands stays regardless. CHAIN is
        ("baseline", BASELINE) followed by one (name, config) per change kept, each config the one
        before plus that change; FINAL is CHAIN's last config. FINAL may differ from BASELINE in
        SPEED_FIELDS only. The grader re-measures FINAL against BASELINE in a fresh process with
        `perflab.verify` (correctness gate included) and holds it to the bar calibrated for the
        grading hardware (entry EXPECTATION); its accuracy after a short fixed-seed run must stay
        within `accuracy_tolerance` of the baseline's.

This module holds what the notebook, its tests and the grader share: the sizes of each mode, the
changes this hardware can benefit from (`plan_changes`, from the calibration), the measurements the
notebook runs (`screen`, `measure_chain`, `memory_vs_batch`, `measure_accuracy`, `mfu`), the visible
checks (`cumulative_problems`, against the rows stored for the visible example in CUMULATIVE_FILE;
`check_final`, `check_accuracy`, `check_report`) and `verify_final`. The
hidden tests' checks (`check_cumulative_speedups`, `check_ablation_table`) and the reference answers
they compare against live in the grader-only `perflab/labs/hidden/lab06.py`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perflab import env, stats
from perflab.labs.common import (  # noqa: F401
    INCONCLUSIVE_ENV,
    INCONCLUSIVE_POLICIES,
    accepted,
    changed_fields_problems,
    inconclusive_policy,
    report,
    verify_against_bar,
)
from perflab.verify.decide import QUANTILE
from perflab.workload import AMP_DTYPES, RESNET_STAGES, TrainConfig

LAB = "lab06_together"
# The entry of autograder/expectations/<hardware_class>.json that holds the bar of FINAL
# (`calibration_pair` is what `perflab calibrate` times for it).
EXPECTATION = "lab06_final"
# The knobs FINAL may change: how the same samples reach the model and how the same arithmetic runs.
# Left out on purpose: gpu_augment (kornia draws other random flips and jitters, so losses cannot be
# compared step by step), accumulation_steps and batch_size (another optimisation problem), threads
# (a property of the machine, not of the training code).
SPEED_FIELDS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "amp_dtype",
                "channels_last", "checkpoint_segments", "compile_mode")
# QUANTILE, the quantile of block times a speedup is taken from, is perflab.verify's estimator's:
# interference on a shared machine only adds time, so a low quantile of many blocks is the least
# disturbed estimate.
# The bootstrap seed of every CI in this lab: the same raw times always give the same interval.
CI_SEED = 0
# A screened change is kept when the lower bound of its step speedup's 95% CI lies above this: it
# made the step measurably faster. A change within noise adds risk (another dtype, more processes)
# for no gain a grader could confirm.
KEEP_ABOVE = 1.0
# Below this total gain (1%), the shares of it are shares of noise: ablation_table reports None.
PARITY = 0.01
# Accuracy kept: the final configuration may lose at most ACCURACY_Z standard errors of the
# difference of two accuracies measured on the same n evaluation images (sqrt(2 p (1 - p) / n)),
# and never less than ACCURACY_MIN_TOLERANCE. Early in training the trajectories of two numerically
# different runs (bf16 against fp32, another memory format) drift apart and their accuracies move
# more than evaluation noise alone: measured on the small set at laptop sizes, bf16 against fp32
# differed by +4.5 points after 30 steps and -7 points after 60 (200 images, both near 20%), about
# 2.3 of these standard errors; 3 leaves room for that, while a configuration that stops learning
# falls to chance.
ACCURACY_Z = 3.0
ACCURACY_MIN_TOLERANCE = 0.02
# Checkpointing is planned only when training at the baseline's batch size would need more than this
# share of the device's memory (the rest: the allocator's fragmentation, the loader's batches, CUDA
# context and workspaces).
MEMORY_BUDGET_SHARE = 0.8
# ResNet-18 leaves a 32-pixel image 1x1 in its last stage, where BatchNorm in train mode cannot
# normalise a batch of one: the memory sweep starts at two.
MIN_MEMORY_BATCH = 2
# The optimizer whose state the memory model counts: TrainConfig's SGD keeps one momentum buffer.
OPTIMIZER = "sgd-momentum"
# The Markdown cell whose text is the student's analysis, and where the report is written.
ANALYSIS_GRADE_ID = "analysis"
NOTEBOOK = f"{LAB}.ipynb"
REPORT_FILE = "report.html"
# What nbgrader leaves in an unanswered written cell.
UNANSWERED = "YOUR ANSWER HERE"
# What this lab can promise on each kind of device (printed by common.hardware_statement).
HARDWARE_NOTES = {
    "cuda": "the full chain can pay here: loader workers with pinned memory, bf16 (or fp16) with "
            "channels_last on tensor cores, and torch.compile; expect a large cumulative speedup.",
    "mps": "loader workers and fp16 autocast may pay; pinned memory does nothing on shared memory, and "
           "compiling is not screened here.",
    "cpu": "loader workers compete with the model for the same cores and bf16 pays only with bf16 "
           "units; the final configuration may be the baseline itself, graded as 'no regression'.",
}


# ---------------------------------------------------------------------------------------------
# Sizes and the baseline


@dataclass(frozen=True)
class LabSizes:
    """What one mode runs: the workload sizes, the screening and ablation timings, the short training
    run, the memory sweep and the grader's budget."""

    mode: str
    data: str
    image_size: int
    batch_size: int
    phase_steps: int
    block_steps: int           # training steps in one timed block
    screen_blocks: int         # blocks of each side when screening one change
    chain_blocks: int          # rounds of the interleaved ablation (one block of every config a round)
    accuracy_steps: int        # steps of the fixed-seed training run before evaluation
    memory_batches: tuple[int, ...]
    verify_max_pairs: int | None  # None: the protocol's own budget
    # Timed seconds the tiny run's verification may use: a sequential decision on a quiet machine
    # stops after its minimum pairs in a few seconds; the rest is room for a busy one to get there.
    verify_seconds: float | None


_LAB_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(phase_steps=3, block_steps=1, screen_blocks=4, chain_blocks=4, accuracy_steps=4,
                 memory_batches=(2, 4, 8, 16, 32), verify_max_pairs=12, verify_seconds=15.0),
    "laptop": dict(phase_steps=6, block_steps=1, screen_blocks=8, chain_blocks=10, accuracy_steps=60,
                   memory_batches=(8, 16, 32, 64, 128), verify_max_pairs=None, verify_seconds=None),
    "grade": dict(phase_steps=3, block_steps=1, screen_blocks=4, chain_blocks=4, accuracy_steps=8,
                  memory_batches=(2, 4, 8, 16, 32), verify_max_pairs=None, verify_seconds=None),
    "full": dict(phase_steps=20, block_steps=4, screen_blocks=8, chain_blocks=10, accuracy_steps=200,
                 memory_batches=(32, 64, 128, 256, 512), verify_max_pairs=None, verify_seconds=None),
}


def sizes(mode: str | None = None) -> LabSizes:
    """The lab's sizes in `mode` (default: the mode in force), built on `perflab.env.mode_sizes`."""
    base = env.mode_sizes(mode, lab=LAB)
    return LabSizes(base.mode, base.data, base.image_size, base.batch_size, **_LAB_SIZES[base.mode])


def baseline_config(mode: str | None = None) -> TrainConfig:
    """The configuration every lab starts from: fp32, no loader workers, nothing compiled."""
    s = sizes(mode)
    return TrainConfig(data=s.data, image_size=s.image_size, batch_size=s.batch_size)


# ---------------------------------------------------------------------------------------------
# What this hardware can benefit from


@dataclass(frozen=True)
class Change:
    """One optimisation of the ablation: the knobs it sets and the calibration entry that judged it."""

    name: str
    fields: Mapping[str, Any]
    expectation: str

    def apply(self, config: TrainConfig) -> TrainConfig:
        return config.replace(**dict(self.fields))


@dataclass(frozen=True)
class Plan:
    """What the lab does with one change on this machine: "try" (screen it), "force" (memory demands
    it), or "skip", and why, in words a student can check."""

    change: Change
    action: str
    reason: str


def loader_change(info: env.MachineInfo) -> Change:
    """Loader workers (one per core, at most 4), kept alive across epochs; pinned memory on CUDA."""
    workers = max(1, min(info.cpu_count, 4))
    fields = {"num_workers": workers, "persistent_workers": True, "prefetch_factor": 2}
    if info.device == "cuda":
        fields["pin_memory"] = True
    name = f"{workers} loader workers" + (", pinned" if info.device == "cuda" else "")
    return Change(name, fields, "num_workers")


def amp_dtype_for(device: str) -> str | None:
    """The autocast dtype this device runs: bf16 where supported (no GradScaler needed), else fp16 on GPUs."""
    if env.supports_autocast(device, AMP_DTYPES["bf16"]):
        return "bf16"
    if device in ("cuda", "mps") and env.supports_autocast(device, AMP_DTYPES["fp16"]):
        return "fp16"
    return None


def memory_budget_bytes(info: env.MachineInfo) -> int | None:
    """MEMORY_BUDGET_SHARE of the device's memory (the GPU's, else the machine's RAM); None if unknown."""
    if info.gpu_memory_bytes:
        return int(MEMORY_BUDGET_SHARE * info.gpu_memory_bytes)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return int(MEMORY_BUDGET_SHARE * ram)


def plan_changes(info: env.MachineInfo, mode: str | None = None, *, memory_needed: bool = False,
                 expectations: Callable[[str], Any] | None = None) -> list[Plan]:
    """The ablation's changes in order, each with what to do on this machine and why.

    A change whose calibration on this hardware class found no gain (parity or a cost) is skipped:
    the calibration already measured it here. Uncalibrated changes are tried where the hardware can
    give something and kept only if the screening measures a gain. Checkpointing is a cost: it is
    forced when memory demands it, else skipped. torch.compile of ResNet-18 costs about 90 s on a
    small CPU and gains nothing there, so it is tried on CUDA only, or where calibration says it pays.
    """
    from perflab.verify import load_expectation

    mode = mode or env.run_mode()
    lookup = expectations or (lambda name: load_expectation(name, info, workload=baseline_config(mode)))
    plans = []

    def judged(change: Change, hardware_can: bool, why_not: str) -> Plan:
        bar = lookup(change.expectation)
        if bar.calibrated and bar.kind == "gain":
            return Plan(change, "try", f"calibrated on {bar.hardware_class}: a gain ({bar.reason})")
        if bar.calibrated:
            return Plan(change, "skip", f"calibrated on {bar.hardware_class}: {bar.kind}, no gain to take")
        if not hardware_can:
            return Plan(change, "skip", f"not calibrated here, and {why_not}")
        return Plan(change, "try", "not calibrated for this workload on this hardware: the screening measures it")

    plans.append(judged(loader_change(info), True, ""))
    amp = amp_dtype_for(info.device)
    if amp is not None:
        can = info.device != "cpu" or info.cpu_bf16
        plans.append(judged(Change(f"{amp} autocast", {"amp_dtype": amp}, f"amp_{amp}"), can,
                            "this CPU has no bf16 hardware (AMX/AVX-512-BF16): autocast is emulated, slower"))
    plans.append(judged(Change("channels_last", {"channels_last": True}, "channels_last"), True, ""))
    ckpt = Change("checkpoint every stage", {"checkpoint_segments": len(RESNET_STAGES)}, "checkpoint")
    if memory_needed:
        plans.append(Plan(ckpt, "force", "the baseline's batch does not fit the memory budget without it"))
    else:
        plans.append(Plan(ckpt, "skip", "the batch fits in memory: checkpointing would only cost time"))
    compile_change = Change("torch.compile", {"compile_mode": "default"}, "compile")
    bar = lookup("compile")
    if bar.calibrated:
        plans.append(judged(compile_change, True, ""))
    elif info.device == "cuda" and mode in ("full", "grade"):
        plans.append(Plan(compile_change, "try", "not calibrated on this GPU: the screening measures it "
                                                 "(compilation happens in the warm-up)"))
    else:
        plans.append(Plan(compile_change, "skip", f"not calibrated here; on {info.device} in {mode} mode "
                          "compiling ResNet-18 costs minutes and gains nothing measurable (lab 5)"))
    return plans


def reference_final(mode: str = "grade", info: env.MachineInfo | None = None,
                    expectations: Callable[[str], Any] | None = None) -> TrainConfig:
    """The reference solution's FINAL without screening: the baseline plus every planned change the
    calibration calls a gain (and checkpointing where memory demands it)."""
    from perflab.verify import load_expectation

    info = info or env.machine_info()
    lookup = expectations or (lambda name: load_expectation(name, info, workload=baseline_config(mode)))
    config = baseline_config(mode)
    for plan in plan_changes(info, mode, memory_needed=needs_checkpointing(config, info),
                             expectations=lookup):
        bar = lookup(plan.change.expectation)
        if plan.action == "force" or (plan.action == "try" and bar.calibrated and bar.kind == "gain"):
            config = plan.change.apply(config)
    return config


def calibration_pair(mode: str = "grade") -> tuple[TrainConfig, TrainConfig]:
    """(baseline, candidate) that `perflab calibrate` times for EXPECTATION on the grading machine."""
    return baseline_config(mode), reference_final(mode)


# ---------------------------------------------------------------------------------------------
# Measurements the notebook runs


def screen(current: TrainConfig, candidate: TrainConfig, s: LabSizes | None = None) -> Any:
    """Time `candidate` against `current` in interleaved blocks (perflab.timing.compare): a Comparison."""
    from perflab import timing, workload

    s = s or sizes()
    works = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for config in (current, candidate):
                works.append(workload.build(config))
            a, b = works
            return timing.compare(lambda: workload.train_step(a), lambda: workload.train_step(b),
                                  blocks=s.screen_blocks, block_size=s.block_steps, warmup=2,
                                  device=a.device, labels=("kept so far", "with the change"))
        finally:
            for work in works:
                work.close()


def measure_chain(chain: Sequence[tuple[str, TrainConfig]], s: LabSizes | None = None, *,
                  warmup: int = 2) -> dict[str, list[float]]:
    """Block times of every configuration of `chain`, timed in interleaved rounds.

    Each round times one block (`s.block_steps` training steps ended by a device sync) of every
    configuration, starting at a different one each round, so that all of them share the machine's
    drift and block i of any two are paired. Returns {name: [seconds of each block]} in chain order.
    """
    import time

    from perflab import workload
    from perflab.labs import common

    s = s or sizes()
    names = [name for name, _ in chain]
    if len(set(names)) != len(names):
        raise ValueError(f"chain: names must be unique, got {names}")
    times: dict[str, list[float]] = {name: [] for name in names}
    works = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for _, config in chain:
                work = workload.build(config)
                works.append(work)
                for _ in range(warmup):
                    workload.train_step(work)
                env.synchronize(work.device)
            for r in common.progress(range(s.chain_blocks), desc="ablation rounds"):
                for k in range(len(works)):
                    i = (r + k) % len(works)
                    work = works[i]
                    start = time.perf_counter()
                    for _ in range(s.block_steps):
                        workload.train_step(work)
                    env.synchronize(work.device)
                    times[names[i]].append(time.perf_counter() - start)
        finally:
            for work in works:
                work.close()
    return times


def ratio_ci(baseline: Sequence[float], times: Sequence[float], quantile: float = QUANTILE,
             seed: int = CI_SEED) -> tuple[float, float]:
    """95% paired-bootstrap CI of q(baseline) / q(times), q the `quantile` of the block times."""
    interval = stats.bootstrap_ratio_ci(baseline, times, stats.quantile_of(quantile), seed=seed, paired=True)
    return interval.low, interval.high


def step_stat(block_times: Sequence[float], block_steps: int, batch_size: int) -> dict[str, Any]:
    """The `baseline` results section from block times: step time and throughput with 95% CIs."""
    per_step = np.asarray(block_times, dtype=float) / block_steps
    ci = stats.bootstrap_ci(per_step, stats.quantile_of(QUANTILE), seed=CI_SEED)
    return {"step_time": {"median": ci.estimate, "ci": [ci.low, ci.high], "unit": "s",
                          "statistic": f"p{QUANTILE * 100:.0f} of blocks", "samples": per_step.tolist()},
            "throughput": {"median": batch_size / ci.estimate, "ci": [batch_size / ci.high, batch_size / ci.low],
                           "unit": "img/s", "statistic": "batch size / step_time",
                           "samples": (batch_size / per_step).tolist()}}


def training_memory(config: TrainConfig, batch_sizes: Sequence[int], num_classes: int = 10) -> list[int]:
    """Bytes of one training step at each batch size, by the memory model: parameters, gradients,
    optimizer state, and the activations saved for backward by the forward and loss of that many
    random images (under `config`'s autocast, memory format and checkpointing)."""
    import torch
    from torch.nn import functional as F

    from perflab import memory, workload

    device = env.pick_device(config.device)
    model = workload.build_model(config.replace(compile_mode=None), num_classes)
    model.train()
    static = memory.static_memory(model, OPTIMIZER).total
    out = []
    for b in batch_sizes:
        if b < MIN_MEMORY_BATCH:
            raise ValueError(f"batch_sizes: {b} is below {MIN_MEMORY_BATCH} (BatchNorm in train mode needs two images)")
        images = torch.randn(b, 3, config.image_size, config.image_size, device=device)
        if config.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, num_classes, (b,), device=device)
        autocast = (torch.autocast(device_type=device.type, dtype=AMP_DTYPES[config.amp_dtype])
                    if config.amp_dtype else contextlib.nullcontext())
        with autocast:
            saved = memory.activation_bytes(model, images, lambda logits, y=labels: F.cross_entropy(logits, y))
        out.append(static + saved.bytes)
    return out


def memory_vs_batch(config: TrainConfig, batches: Sequence[int], num_classes: int = 10) -> list[dict[str, Any]]:
    """`memory_vs_batch` rows for `config`, plain and with every stage checkpointed."""
    rows = []
    for checkpointed in (False, True):
        cfg = config.replace(checkpoint_segments=len(RESNET_STAGES) if checkpointed else 0)
        for b, nbytes in zip(batches, training_memory(cfg, batches, num_classes), strict=True):
            rows.append({"batch_size": int(b), "bytes": int(nbytes), "checkpointed": checkpointed})
    return rows


def largest_batch(rows: Sequence[Mapping[str, Any]], budget: float, checkpointed: bool) -> int:
    """The largest batch the affine fit of `rows` (bytes = fixed + per_image * batch) keeps under `budget`."""
    pts = sorted((r["batch_size"], r["bytes"]) for r in rows if bool(r["checkpointed"]) == checkpointed)
    if len(pts) < 2:
        raise ValueError("rows: need at least two batch sizes to fit memory against batch size")
    x, y = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
    per_image, fixed = np.polyfit(x, y, 1)
    if per_image <= 0:
        return 0
    return max(0, int((budget - fixed) // per_image))


def needs_checkpointing(config: TrainConfig, info: env.MachineInfo | None = None) -> bool:
    """Whether training `config` at its batch size needs more than the device's memory budget."""
    info = info or env.machine_info()
    budget = memory_budget_bytes(info)
    if budget is None:
        return False
    return training_memory(config, [max(config.batch_size, MIN_MEMORY_BATCH)])[0] > budget


def measure_accuracy(baseline: TrainConfig, final: TrainConfig, steps: int) -> dict[str, Any]:
    """Train each configuration `steps` fixed-seed steps from the same initial model, then evaluate both
    on the evaluation images (perflab.workload.evaluate)."""
    from perflab import dataset, workload

    out: dict[str, Any] = {"steps": steps}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key, config in (("baseline", baseline), ("final", final)):
            work = workload.build(config)
            try:
                losses = [workload.train_step(work)[0] for _ in range(steps)]
                out[key] = workload.evaluate(work)
                out[f"{key}_loss"] = float(losses[-1])
            finally:
                work.close()
        out["n_eval"] = len(dataset.load(baseline.data, image_size=baseline.image_size, train=False))
    return out


def mfu(config: TrainConfig, step_seconds: float) -> dict[str, Any]:
    """The `mfu` results section: FLOPs of one training step of `config` over `step_seconds`, against the
    device's peak at the step's compute dtype (spec sheet for known GPUs, else measured)."""
    import torch
    from torch.nn import functional as F

    from perflab import counting, roofline, workload

    device = env.pick_device(config.device)
    model = workload.build_model(config.replace(checkpoint_segments=0, channels_last=False), 10)
    images = torch.randn(config.batch_size, 3, config.image_size, config.image_size, device=device)
    labels = torch.randint(0, 10, (config.batch_size,), device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flops = counting.count_flops(model, images, backward=True,
                                     loss_fn=lambda logits: F.cross_entropy(logits, labels)).train
        dtype = AMP_DTYPES[config.amp_dtype] if config.amp_dtype else torch.float32
        peaks = roofline.device_peaks(device, dtype)
    try:
        peak = peaks.peak_flops(dtype)
    except ValueError:  # a spec sheet without this dtype: the fastest it lists is the honest ceiling
        peak = max(peaks.flops.values())
    return {"achieved_flops_per_s": flops / step_seconds, "peak_flops": float(peak),
            "flops_per_step": int(flops), "step_seconds": step_seconds,
            "dtype": str(dtype).removeprefix("torch."), "peak_source": str(getattr(peaks, "source", ""))}


# ---------------------------------------------------------------------------------------------
# The analysis and the report


def read_analysis(notebook: str | os.PathLike[str] = NOTEBOOK, grade_id: str = ANALYSIS_GRADE_ID) -> str:
    """The text of the notebook's written-analysis cell as last saved ('' if unanswered).

    The kernel cannot see a cell's text, only the file: in Jupyter, save the notebook first.
    """
    path = Path(notebook)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: the notebook is not in the working folder; run it from its own "
                                "folder (Jupyter does) so its analysis cell can be read") from None
    except ValueError as exc:
        raise ValueError(f"{path}: not a readable notebook ({exc})") from None
    for cell in doc.get("cells", []):
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            source = cell.get("source", "")
            text = "".join(source) if isinstance(source, list) else str(source)
            text = text.strip()
            return "" if text == UNANSWERED else text
    raise ValueError(f"{path}: no cell with grade_id {grade_id!r} (the analysis cell)")


def find_results(folder: str | os.PathLike[str] | None = None) -> list[Path]:
    """Results files of every lab the student has run, one per lab, valid ones only, in lab order.

    Looks in `folder`/results (this lab's own) and in the results folder of each sibling lab folder
    (`../lab0*/results/lab0*.json`: the labs sit side by side in labs/). A file that fails validation is
    left out (perflab.results says why in the log); this lab's own file wins over a copy elsewhere.
    """
    import logging

    from perflab import results

    here = Path(folder or Path.cwd()).resolve()
    candidates = sorted(here.glob("results/lab0*.json"))
    candidates += sorted(here.parent.glob("lab0*/results/lab0*.json"))
    found: dict[str, Path] = {}
    for path in candidates:
        if not re.fullmatch(r"lab\d\d_\w+\.json", path.name):  # not a results file: a trace, a candidate, a temp
            continue
        try:
            doc = results.load(path)
        except results.ResultsError as exc:
            logging.getLogger(__name__).warning("left out of the report: %s", exc)
            continue
        found.setdefault(doc["lab"], path)
    return [found[lab] for lab in sorted(found)]


# ---------------------------------------------------------------------------------------------
# The visible cumulative_speedups check: what is wrong, in words (empty when all is well). The hidden
# tests' checks, random cases drawn from a seed, live in perflab/labs/hidden/lab06.py.


CUMULATIVE_FILE = Path(__file__).with_name("lab06_cumulative.json")


def stored_cumulative(measurements: Mapping[str, Sequence[float]], quantile: float = QUANTILE,
                      seed: int = CI_SEED, path: str | Path | None = None) -> list[dict[str, Any]]:
    """The rows `cumulative_speedups` must return for a visible example, stored in CUMULATIVE_FILE
    (or `path`); ValueError for an ablation not stored there."""
    path = Path(path) if path is not None else CUMULATIVE_FILE
    cases = json.loads(path.read_text(encoding="utf-8"))["cases"]
    given = {str(k): [float(t) for t in v] for k, v in measurements.items()}
    for case in cases:
        if case["measurements"] == given and case["quantile"] == quantile and case["seed"] == seed:
            return [dict(row) for row in case["rows"]]
    raise ValueError(f"no stored rows for this ablation (quantile {quantile}, seed {seed}); {path.name} holds "
                     f"{len(cases)} visible example(s). Other ablations need their rows passed as expected=")


def _close(a: Any, b: Any, rel: float = 1e-9) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool) and math.isclose(float(a), float(b),
                                                                                       rel_tol=rel, abs_tol=1e-12)


def cumulative_problems(fn: Callable[..., Any], measurements: Mapping[str, Sequence[float]],
                        expected: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> list[str]:
    """Does `fn(measurements, **kwargs)` return the contract's rows for this ablation? The rows it must
    return are `expected`, by default those stored for the visible example (`stored_cumulative`)."""
    copy = {k: list(v) for k, v in measurements.items()}
    want = list(expected) if expected is not None else stored_cumulative(
        measurements, kwargs.get("quantile", QUANTILE), kwargs.get("seed", CI_SEED))
    got = fn(measurements, **kwargs)
    if dict(measurements) != copy:
        return ["cumulative_speedups changed its input measurements"]
    return rows_problems(got, measurements, want, kwargs.get("quantile", QUANTILE))


def rows_problems(got: Any, measurements: Mapping[str, Sequence[float]], want: Sequence[Mapping[str, Any]],
                  quantile: float = QUANTILE) -> list[str]:
    """What is wrong with rows `got` for this ablation, against the rows it must give (`want`)."""
    where = f"{len(measurements)} configurations of {len(next(iter(measurements.values())))} blocks"
    if not isinstance(got, list) or len(got) != len(want):
        n = len(got) if isinstance(got, list) else type(got).__name__
        return [f"{where}: expected a list of {len(want)} rows (one per configuration after the baseline), got {n}"]
    base_q = float(np.quantile(np.asarray(next(iter(measurements.values())), float), quantile))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(g, Mapping):
            return [f"{where}: row {i} should be a dict, got {type(g).__name__}"]
        if g.get("name") != w["name"]:
            return [f"{where}: row {i} is named {g.get('name')!r}, expected {w['name']!r} (keep the ablation order)"]
        if not _close(g.get("speedup"), w["speedup"]):
            times = list(measurements.values())[i + 1]
            prev = list(measurements.values())[i]
            chained = float(np.quantile(np.asarray(prev, float), quantile)) / float(
                np.quantile(np.asarray(times, float), quantile))
            median = float(np.median(next(iter(measurements.values())))) / float(np.median(times))
            hint = ""
            if _close(g.get("speedup"), chained, 1e-6) and i > 0:
                hint = " (that is the speedup over the previous configuration: measure against the ORIGINAL baseline)"
            elif _close(g.get("speedup"), median, 1e-6):
                hint = f" (that is the ratio of medians: use the {quantile} quantile)"
            return [f"{where}: {w['name']}: speedup {g.get('speedup')!r}, expected {w['speedup']:.6g} "
                    f"= q(baseline) {base_q:.4g} / q({w['name']}){hint}"]
        ci = g.get("ci")
        if not (isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_close(a, b) for a, b in zip(ci, w["ci"], strict=True))):
            return [f"{where}: {w['name']}: ci {ci!r}, expected {w['ci']} from ratio_ci(baseline, its times, "
                    "quantile, seed) (paired: block i of both were timed in the same round)"]
        if g.get("cumulative") is not True:
            return [f"{where}: {w['name']}: rows must say 'cumulative': True (each is against the original baseline)"]
    return []


# ---------------------------------------------------------------------------------------------
# FINAL, the chain, the accuracy gate and the report


def final_problems(final: Any, chain: Any = None, mode: str | None = None) -> list[str]:
    """Is FINAL a TrainConfig changing only SPEED_FIELDS of the baseline, and CHAIN a chain ending in it?"""
    base = baseline_config(mode)
    problems = changed_fields_problems("FINAL", final, base, SPEED_FIELDS, base_name="the baseline",
                                       purpose="not how fast it is done")
    if problems or chain is None:
        return problems
    if not isinstance(chain, (list, tuple)) or not chain:
        return ["CHAIN: expected a list of (name, TrainConfig) pairs starting with ('baseline', BASELINE)"]
    try:
        names = [name for name, _ in chain]
        configs = [config for _, config in chain]
    except (TypeError, ValueError):
        return ["CHAIN: every entry should be a (name, TrainConfig) pair"]
    if configs[0] != base:
        return ["CHAIN: the first configuration must be the baseline (the ablation measures against it)"]
    if configs[-1] != final:
        return ["CHAIN: the last configuration must be FINAL"]
    if len(set(names)) != len(names):
        return [f"CHAIN: names must be unique, got {names}"]
    for (n0, c0), (n1, c1) in zip(chain, chain[1:], strict=False):
        if not isinstance(c1, TrainConfig):
            return [f"CHAIN: {n1!r} is not a TrainConfig"]
        if c1 == c0:
            return [f"CHAIN: {n1!r} changes nothing over {n0!r}; a step of the ablation adds a change"]
    return []


def check_final(final: Any, chain: Any, mode: str | None = None) -> None:
    problems = final_problems(final, chain, mode)
    assert not problems, problems[0]


def accuracy_tolerance(baseline_accuracy: float, n_eval: int) -> float:
    """How far below the baseline's accuracy the final configuration's may fall (see ACCURACY_Z)."""
    if n_eval < 1:
        raise ValueError(f"n_eval: need at least one evaluation image, got {n_eval}")
    p = min(max(baseline_accuracy, 1.0 / n_eval), 1.0 - 1.0 / n_eval) if n_eval > 1 else 0.5
    return max(ACCURACY_MIN_TOLERANCE, ACCURACY_Z * math.sqrt(2.0 * p * (1.0 - p) / n_eval))


def accuracy_problems(acc: Mapping[str, Any]) -> list[str]:
    """Did the final configuration keep the baseline's accuracy within tolerance?"""
    base, final, n = float(acc["baseline"]), float(acc["final"]), int(acc["n_eval"])
    tol = accuracy_tolerance(base, n)
    if final < base - tol:
        return [f"after {acc.get('steps', '?')} fixed-seed steps the final configuration reaches {final:.1%} "
                f"against the baseline's {base:.1%} on {n} images: more than {tol:.1%} lost"]
    return []


def check_accuracy(acc: Mapping[str, Any]) -> None:
    problems = accuracy_problems(acc)
    assert not problems, problems[0]


def report_problems(report_path: str | os.PathLike[str], results_path: str | os.PathLike[str]) -> list[str]:
    """Does the HTML report hold every section, and this lab's ablation, memory curve and accuracy?"""
    from perflab import report as rep
    from perflab import results

    path = Path(report_path)
    if not path.is_file():
        return [f"{path}: no report written (render it with perflab.report.write_report)"]
    page = path.read_text(encoding="utf-8")
    try:
        doc = results.load(results_path)
    except results.ResultsError as exc:
        return [f"the report's data is not valid: {exc}"]
    problems = [f"{path}: no section {sid!r}" for sid in rep.SECTION_IDS if f'<section id="{sid}">' not in page]
    sections = doc["sections"]
    if LAB not in page:
        problems.append(f"{path}: {LAB}'s results are not among the report's files")
    if sections.get("speedups") and 'id="fig-speedup-waterfall"' not in page:
        problems.append(f"{path}: the cumulative waterfall is missing from the speedups section")
    if sections.get("memory_vs_batch") and 'id="fig-memory"' not in page:
        problems.append(f"{path}: the memory-against-batch figure is missing")
    if "accuracy" in sections and "Accuracy after a short training run" not in page:
        problems.append(f"{path}: the accuracy kept is missing from the verification section")
    text = (sections.get("analysis") or "").strip()
    if text:
        words = re.findall(r"[A-Za-z]{5,}", text)
        if words and not all(w in page for w in words[:5]):
            problems.append(f"{path}: the written analysis saved in the results is not in the report")
    return problems


def check_report(report_path: str | os.PathLike[str], results_path: str | os.PathLike[str]) -> None:
    problems = report_problems(report_path, results_path)
    assert not problems, problems[0]


# ---------------------------------------------------------------------------------------------
# The graded re-measurement


def verify_final(final: TrainConfig, claim: float | None = None, mode: str | None = None) -> Any:
    """Re-measure FINAL against the baseline in a fresh interpreter with the calibrated bar of this machine.

    Returns (verdict, expectation): a `perflab.verify.Verdict` and the `Expectation` it was held to.
    """
    problems = final_problems(final, mode=mode)
    if problems:
        raise ValueError(problems[0])
    s = sizes(mode)
    return verify_against_bar(baseline_config(mode), final, EXPECTATION, claim=claim,
                              max_pairs=s.verify_max_pairs, max_seconds=s.verify_seconds)


# ---------------------------------------------------------------------------------------------
# What the grader reads from a notebook (perflab.grading.probing): each autograded cell's probe
# returns the student's raw outputs on inputs drawn from the grader's seed; the grader-only judges
# (perflab/labs/hidden/lab06.py) draw the same inputs, compute the reference answers and decide.

VISIBLE_ABLATION = {"baseline": [1.0, 1.2, 1.1, 1.0], "+ workers": [0.5, 0.6, 0.5, 0.55],
                    "+ bf16": [0.25, 0.3, 0.26, 0.25]}
VISIBLE_TABLES = ([{"name": "a", "speedup": 2.0, "ci": [1.9, 2.1]}, {"name": "b", "speedup": 4.0, "ci": [3.8, 4.2]}],
                  [{"name": "a", "speedup": 1.5}, {"name": "b", "speedup": 1.0}])
# The largest report and results file the grader reads back (a report embeds its figures as PNG).
REPORT_CAP_BYTES = 6 * 1024 * 1024


def random_measurements(rng: Any, configs: int | None = None, blocks: int | None = None) -> dict[str, list[float]]:
    """A random ablation: a baseline, then configs that each add a change with a random true speedup,
    timed in noisy blocks (lognormal jitter plus occasional interference that only adds time)."""
    configs = configs if configs is not None else rng.randint(1, 5)
    blocks = blocks if blocks is not None else rng.randint(4, 24)
    level = rng.uniform(0.02, 2.0)
    names = ["baseline"] + [f"{rng.choice(['+ workers', '+ bf16', '+ channels_last', '+ compile', '+ ckpt'])}"
                            f" #{i}" for i in range(1, configs + 1)]
    out: dict[str, list[float]] = {}
    for name in names:
        noise = rng.uniform(0.005, 0.1)
        out[name] = [level * math.exp(rng.gauss(0, noise)) * (1 + (rng.random() < 0.15) * rng.uniform(0, 0.6))
                     for _ in range(blocks)]
        level /= rng.uniform(0.6, 2.5)
    return out


def random_rows(rng: Any, n: int | None = None, final: float | None = None) -> list[dict[str, Any]]:
    """Random cumulative rows (each with a CI around it); `final` pins the last speedup."""
    n = n if n is not None else rng.randint(1, 6)
    level, rows = 1.0, []
    for i in range(n):
        level *= math.exp(rng.gauss(0.15, 0.3))
        if final is not None and i == n - 1:
            level = final
        width = rng.uniform(0.01, 0.2) * level
        rows.append({"name": f"change {i + 1}", "speedup": level, "ci": [level - width, level + width],
                     "cumulative": True})
    return rows


def cumulative_cases(seed: int, cases: int = 12) -> tuple[list[tuple[dict[str, list[float]], dict[str, Any]]],
                                                          list[tuple[dict[str, list[float]], str]]]:
    """(random ablations with their keyword arguments, bad inputs with what is wrong) drawn from `seed`."""
    import random

    rng = random.Random(seed)
    good = []
    for case in range(cases):
        m = random_measurements(rng)
        kwargs: dict[str, Any] = {}
        if case % 3 == 1:
            kwargs["quantile"] = rng.choice([0.1, 0.5, 0.8])
        if case % 4 == 2:
            kwargs["seed"] = rng.randint(1, 10_000)
        good.append((m, kwargs))
    ok = random_measurements(rng, configs=2, blocks=6)
    base = ok["baseline"]
    bad = [({"baseline": base}, "only the baseline"),
           ({"baseline": base, "short": base[:3]}, "another number of blocks"),
           ({"baseline": base[:1], "one": base[:1]}, "a single block"),
           ({"baseline": base, "neg": [-1.0] + base[1:]}, "a negative time"),
           ({"baseline": base, "nan": [float("nan")] + base[1:]}, "a NaN time"),
           ({"baseline": base, "zero": [0.0] * len(base)}, "zero times")]
    return good, bad


def table_cases(seed: int, cases: int = 15) -> tuple[list[list[dict[str, Any]]], list[tuple[list[dict[str, Any]], float]]]:
    """(random ablations, some ending within PARITY of 1.0 and some losing time; rows with a bad speedup)."""
    import random

    rng = random.Random(seed)
    good = []
    for case in range(cases):
        final = None
        if case % 5 == 3:
            final = 1.0 + rng.uniform(-0.6, 0.6) * PARITY
        elif case % 5 == 4:
            final = rng.uniform(0.4, 0.9)
        good.append(random_rows(rng, final=final))
    bad = []
    for value in (0.0, -1.5, float("nan"), float("inf")):
        rows = random_rows(rng, 2)
        rows[1]["speedup"] = value
        bad.append((rows, value))
    return good, bad


def _config_data(value: Any) -> dict[str, Any]:
    return {"type": type(value).__name__, "config": value.to_dict() if isinstance(value, TrainConfig) else None}


def _call_cumulative(fn: Callable[..., Any], measurements: Mapping[str, Sequence[float]],
                     kwargs: Mapping[str, Any]) -> dict[str, Any]:
    from perflab.grading.probing import outcome

    copy = {k: list(v) for k, v in measurements.items()}
    got = outcome(fn, measurements, **kwargs)
    return {**got, "mutated": dict(measurements) != copy}


def _probe_final_config(answers: Any, seed: int) -> dict[str, Any]:
    chain = answers["CHAIN"]
    try:
        steps = [{"name": str(name), **_config_data(config)} for name, config in chain]
    except (TypeError, ValueError):
        steps = None
    return {"final": _config_data(answers["FINAL"]), "chain": steps}


def _probe_cumulative_visible(answers: Any, seed: int) -> dict[str, Any]:
    fn = answers["cumulative_speedups"]
    return _call_cumulative(fn, {k: list(v) for k, v in VISIBLE_ABLATION.items()}, {})


def _probe_cumulative_hidden(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import outcome

    fn = answers["cumulative_speedups"]
    good, bad = cumulative_cases(seed)
    return {"good": [_call_cumulative(fn, m, kwargs) for m, kwargs in good],
            "bad": [outcome(fn, m) for m, _ in bad]}


def _probe_ablation_table(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import outcome

    fn = answers["ablation_table"]
    good, bad = table_cases(seed)
    return {"visible": [outcome(fn, [dict(r) for r in rows]) for rows in VISIBLE_TABLES],
            "good": [outcome(fn, rows) for rows in good], "empty": outcome(fn, []),
            "bad": [outcome(fn, rows) for rows, _ in bad]}


def _probe_final_verified(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import encode

    return {"final": _config_data(answers["FINAL"]), "claim": encode(answers.get("CLAIM"))}


def _read_capped(path: Path) -> str | None:
    if not path.is_file() or path.is_symlink() or path.stat().st_size > REPORT_CAP_BYTES:
        return None
    return path.read_text(encoding="utf-8", errors="replace")


def _probe_report(answers: Any, seed: int) -> dict[str, Any]:
    results_path = answers.get("RESULTS_PATH")
    return {"report": _read_capped(Path(REPORT_FILE)),
            "results": _read_capped(Path(results_path)) if isinstance(results_path, (str, os.PathLike)) else None}


PROBES = {
    "test_final_config": _probe_final_config,
    "test_cumulative_visible": _probe_cumulative_visible,
    "test_cumulative_hidden": _probe_cumulative_hidden,
    "test_ablation_table": _probe_ablation_table,
    "test_final_verified": _probe_final_verified,
    "test_accuracy": lambda answers, seed: {"final": _config_data(answers["FINAL"])},
    "test_report": _probe_report,
}
