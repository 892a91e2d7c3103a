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
        The greedy ablation: starting from BASELINE, each change of the plan built from the student's
        own decisions in labs 2, 3 and 5 (`plan_from`: lab 2's loader, lab 3's precision, lab 5's
        compile mode, read by `lab06_report.earlier_decisions` or re-entered) is added to the
        configuration kept so far and screened (`lab06_measure.screen`); the student decides from the
        screening whether it stays (the reference keeps what the kit's one keep rule, `common.keep_rule`,
        keeps: a change measurably faster than what was kept before it), and a change memory demands stays
        regardless. Each kept change is then timed leave-one-out
        (`without`): FINAL against FINAL without it, in the ablation's own rounds
        (`lab06_measure.measure_ablation`). CHAIN is
        ("baseline", BASELINE) followed by one (name, config) per change kept, each config the one
        before plus that change; FINAL is CHAIN's last config. FINAL may differ from BASELINE in
        SPEED_FIELDS only. The grader re-measures FINAL against BASELINE in a fresh process with
        `perflab.verify` (correctness gate included) and holds it to the bar calibrated for the
        grading hardware (entry EXPECTATION); its accuracy after a short fixed-seed run must stay
        within `accuracy_tolerance` of the baseline's.

    PREDICT_CUMULATIVE, WHY_CUMULATIVE (PREDICTIONS)
        Written BEFORE the ablation is timed: the cumulative speedup FINAL is expected to reach over the
        baseline (a positive number; 1.0 for none) and one line of why. Graded on being there and being a
        prediction, never on being right (`perflab.labs.predict`).

This module holds what the notebook, its tests and the grader share: the sizes of each mode, the
baseline, the plan built from the student's own decisions (`plan_from`, its `Change`s and `Plan`s,
`without`), `ratio_ci` (what `cumulative_speedups` takes its CIs from), the rules FINAL and its
accuracy are held to (`final_problems`/`check_final`, `accuracy_tolerance`/`accuracy_problems`/
`check_accuracy`), and `verify_final`: the contract, never the answer.

Elsewhere, each importing this module and never imported by it: the visible checks of the rows and
the report (`cumulative_problems`, against the rows stored for the visible example; `check_report`)
with their machinery and random cases in `perflab.labs.lab06.checks`; what the notebook measures
(screening, the ablation's block times, accuracy, MFU) in `perflab.labs.lab06.measure`; the analysis
and results files the report is built from in `perflab.labs.lab06.report_inputs`; `PROBES`, what the grader
reads from a notebook, in `perflab.labs.lab06.probes`; the judges and reference answers in the
grader-only `perflab/labs/lab06/judges/`, the answer key among them (the changes the calibration
says this hardware benefits from, `plan_changes`; the reference decisions and FINAL,
`reference_decisions` and `reference_final`; `calibration_pair`). The memory model, which the plan
needs, is `perflab.labs.lab06.memory` (it imports nothing of lab 6).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perflab import env, stats, workload
from perflab.labs.common import (  # noqa: F401
    INCONCLUSIVE_ENV,
    INCONCLUSIVE_POLICIES,
    KEEP_ABOVE,
    accepted,
    changed_fields_problems,
    inconclusive_policy,
    report,
    verify_against_bar,
)
from perflab.verify.decide import QUANTILE
from perflab.verify.protocol import VERIFY_THREADS
from perflab.workload import AMP_DTYPES, REFERENCE_CHECKPOINT_STAGES, RESNET_STAGES, TrainConfig

# What the core (env, grading, the report, the demo) knows of this lab: data, read by
# perflab.labs.registry without importing this module (perflab.labs.manifest says what each field holds).
MANIFEST = {
    "lab": "lab06_together",
    "title": "Lab 6 — Put it together",
    # On a CPU, laptop mode trains batches of 16: its screening, leave-one-out and ablation time each
    # configuration in blocks long enough for loader workers (`perflab.verify.pace`), and at batch 32 the
    # lab ran 13 min 07 s on 2 cores, over the 10 minutes a laptop-mode lab may take.
    "workloads": {"grade": {"cpu": ("small", 64, 32), "cuda": ("full", 224, 128)},
                  "laptop": {"cpu": ("small", 64, 16), "cuda": ("small", 128, 64)}},
    "fed": True,
    "bars": "graded_bars",
    "starts_from": ("lab02_feed", "lab03_amp", "lab04_memory", "lab05_compile"),  # their graded decisions
    "pair_from_bars": True,  # FINAL keeps only the gains calibrated before it (the grader's plan_changes)
    "decides_at_home": True,
    "untimed_records": ("lab06.accuracy",),  # a fixed-seed run: the same losses for every honest student
    "repeated_records": ("lab06.chain",),
    "report_sections": ("speedups", "phases", "memory", "mfu", "analysis"),
    "ablation": True,
    "lazy_choices": {"ablation": 'current = FINAL = BASELINE\nCHAIN = [("baseline", BASELINE)]\n'
                                 'SCREEN = [{**row, "kept": False, "reason": "kept the baseline"} for row in SCREEN]'},
    "hints": ("ablation",),
}
LAB = MANIFEST["lab"]
# The entry of autograder/expectations/<hardware_class>.json that holds the bar of FINAL
# (the grader's `calibration_pair` is what `perflab calibrate` times for it).
EXPECTATION = "lab06_final"
# The knobs FINAL may change: how the same samples reach the model and how the same arithmetic runs.
# Left out on purpose: gpu_augment (kornia draws other random flips and jitters, so losses cannot be
# compared step by step), accumulation_steps and batch_size (another optimisation problem), threads
# (a property of the machine, not of the training code).
SPEED_FIELDS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "amp_dtype",
                "channels_last", "checkpoint_stages", "compile_mode")
# The model trains on the verifier's torch thread count here, as in lab 2, so that screening measures
# what the grader re-measures, and a loader worker has a core of its own beside the model. On a 2-core
# machine with another process on one core, two torch threads wait at every op for the busy one.
TRAIN_THREADS = VERIFY_THREADS
# QUANTILE, the quantile of block times a speedup is taken from, is perflab.verify's estimator's:
# interference on a shared machine only adds time, so a low quantile of many blocks is the least
# disturbed estimate.
# The bootstrap seed of every CI in this lab: the same raw times always give the same interval.
CI_SEED = 0
# A screened change is kept by the kit's one keep rule (`common.keep_rule`; KEEP_ABOVE, imported above, is
# its line and the screening plot's): when it made the step measurably faster. A change within noise adds
# risk (another dtype, more processes) for no gain a grader could confirm.
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
# Where accuracy can move: on the small set, ResNet-18 from its seed at 64 px, batch 32, is at 18.5%
# after 60 steps (chance 10%; the tolerance at 200 images is then 11.6 points, so a configuration that
# stopped learning would pass); at 32 px, batch 32, it reaches 29% after 120 steps, 33.5% after 200 and
# 44.5% after 300, where the tolerance (14.9 points) fails one left at chance. Measured on a 2-core CPU;
# laptop mode trains the accuracy run there (LabSizes.accuracy_image_size).
ACCURACY_MIN_TOLERANCE = 0.02
# The grader's accuracy run (grade mode): at 32 px, 120 steps take ResNet-18 to about 29% on the small
# set, where a configuration that stopped learning (chance, 10%) falls outside the tolerance; 8 steps
# at 64 px compared two models near chance, which any configuration passed.
GRADE_ACCURACY_STEPS = 120
# The Markdown cell whose text is the student's analysis, and where the report is written.
ANALYSIS_GRADE_ID = "analysis"
NOTEBOOK = f"{LAB}.ipynb"
REPORT_FILE = "report.html"
# What this lab can promise on each kind of device (printed by common.hardware_statement).
HARDWARE_NOTES = {
    "cuda": "the full chain can pay here: data that keeps up (the training set kept on the GPU), bf16 (or "
            "fp16) with channels_last on tensor cores, and torch.compile; the ablation measures what each adds here.",
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
    # The image side of the accuracy run (None: the workload's own), so that accuracy moves off chance
    # within `accuracy_steps` (ACCURACY_WORKLOAD).
    accuracy_image_size: int | None = None


# Blocks of each configuration in a screening or the ablation: the 95% bootstrap CI of a ratio of
# low quantiles covers a true 1.0 in about 82% of simulated A/A tests with 4 blocks, 90% with 8 and 96%
# with 12 (tests/test_lab06.py simulates it; bench/bench_aa.py measures it on real training steps).
CI_BLOCKS = 12
_LAB_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(phase_steps=3, block_steps=1, screen_blocks=CI_BLOCKS, chain_blocks=CI_BLOCKS,
                 accuracy_steps=4, memory_batches=(2, 4, 8, 16, 32), verify_max_pairs=12, verify_seconds=15.0),
    "laptop": dict(phase_steps=6, block_steps=1, screen_blocks=CI_BLOCKS, chain_blocks=CI_BLOCKS,
                   accuracy_steps=300, accuracy_image_size=32, memory_batches=(8, 16, 32, 64, 128),
                   verify_max_pairs=None, verify_seconds=None),
    "grade": dict(phase_steps=3, block_steps=1, screen_blocks=CI_BLOCKS, chain_blocks=CI_BLOCKS,
                  accuracy_steps=GRADE_ACCURACY_STEPS, accuracy_image_size=32, memory_batches=(2, 4, 8, 16, 32),
                  verify_max_pairs=None, verify_seconds=None),
    "full": dict(phase_steps=20, block_steps=4, screen_blocks=CI_BLOCKS, chain_blocks=CI_BLOCKS,
                 accuracy_steps=200, memory_batches=(32, 64, 128, 256, 512), verify_max_pairs=None,
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
    """The configuration every lab starts from: fp32, no loader workers (on a GPU fed, its training set
    kept on the device by `env.baseline_loader`), nothing compiled, the model on TRAIN_THREADS torch
    threads."""
    s = sizes(mode)
    config = TrainConfig(data=s.data, image_size=s.image_size, batch_size=s.batch_size, threads=TRAIN_THREADS,
                         **env.baseline_loader(LAB, mode=s.mode))
    return workload.require_stages(LAB, config)  # its plan may checkpoint ResNet's stages


# ---------------------------------------------------------------------------------------------
# The ablation's changes (which of them this hardware benefits from is the grader's answer key:
# `plan_changes` in perflab/labs/lab06/judges/)


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


def amp_dtype_for(device: str) -> str | None:
    """The autocast dtype this device runs: bf16 where supported (no GradScaler needed), else fp16 on GPUs."""
    if env.supports_autocast(device, AMP_DTYPES["bf16"]):
        return "bf16"
    if device in ("cuda", "mps") and env.supports_autocast(device, AMP_DTYPES["fp16"]):
        return "fp16"
    return None


def is_fed(config: TrainConfig) -> bool:
    """Whether `config` starts fed (a GPU's baseline: its data on the device, or loader workers)."""
    return config.data_on_device or config.num_workers > 0


def fed_text(config: TrainConfig) -> str:
    """How a fed `config` is fed, in words."""
    if config.data_on_device:
        return "its training set is decoded once into device memory"
    return f"it loads with {config.num_workers} workers"


# The knobs each earlier lab decided, as lab 6 takes them over: lab 2's loader, lab 3's precision,
# lab 5's compile mode.
LOADER_FIELDS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
PRECISION_FIELDS = ("amp_dtype", "channels_last")


def decided_fields(config: Any, fields: Sequence[str]) -> dict[str, Any]:
    """The `fields` of an earlier lab's exported TrainConfig (or its `to_dict()`) that differ from a plain
    TrainConfig's: what that lab's decision changed ({} when it kept its baseline)."""
    if config is None:
        return {}
    data = config.to_dict() if isinstance(config, TrainConfig) else dict(config)
    plain = TrainConfig().to_dict()
    return {f: data[f] for f in fields if f in data and data[f] != plain[f]}


def checkpoint_stages_for(choice: Sequence[str] | None) -> int:
    """`TrainConfig.checkpoint_stages` (the first N ResNet stages) for lab 4's CHECKPOINT_CHOICE: the
    fewest leading stages that hold every chosen one (every stage where the choice is None: lab 4 not
    decided here)."""
    if choice is None:
        return REFERENCE_CHECKPOINT_STAGES
    unknown = [name for name in choice if name not in RESNET_STAGES]
    if unknown:
        raise ValueError(f"CHECKPOINT: {unknown[0]!r} is not a stage of ResNet-18 ({', '.join(RESNET_STAGES)})")
    return max((RESNET_STAGES.index(name) + 1 for name in choice), default=0)


def plan_from(loader: Mapping[str, Any] | None, precision: Mapping[str, Any] | None, compile_mode: str | None,
              info: env.MachineInfo, mode: str | None = None, *, memory_needed: bool = False,
              checkpoint: Sequence[str] | None = None) -> list[Plan]:
    """The ablation's changes from the student's own decisions in labs 2-5, in that order.

    `loader`: the loader fields lab 2's BEST changed ({} or None: it kept no workers); `precision`: the
    fields lab 3's AMP_CONFIG changed; `checkpoint`: lab 4's CHECKPOINT_CHOICE, the stages that fit its
    memory budget at the least recomputation (None: every stage); `compile_mode`: lab 5's CHOICE (None: do
    not compile). Each decision that changed something is tried (screened on top of what is kept); one that
    changed nothing is skipped, since that lab's own measurement found nothing to gain. Checkpointing is a
    cost: lab 4's choice is forced when memory demands it, else skipped.
    """
    base = baseline_config(mode)
    plans = []
    fields = {k: v for k, v in dict(loader or {}).items() if k in LOADER_FIELDS}
    if is_fed(base) and fields:
        plans.append(Plan(Change("your lab 2 loader", fields, "num_workers"), "skip",
                          f"this device's baseline is already fed ({fed_text(base)})"))
    elif fields.get("num_workers"):
        workers = fields["num_workers"]
        plans.append(Plan(Change(f"your lab 2 loader ({workers} worker{'s' if workers != 1 else ''})", fields, "num_workers"),
                          "try", "lab 2's BEST: measure it on this workload, beside the rest"))
    else:
        plans.append(Plan(Change("your lab 2 loader", {"num_workers": 0}, "num_workers"), "skip",
                          "lab 2's BEST kept the training process loading its own data"))
    fields = {k: v for k, v in dict(precision or {}).items() if k in PRECISION_FIELDS}
    name = "your lab 3 precision (" + (", ".join(f"{k}={v}" for k, v in fields.items()) or "fp32") + ")"
    plans.append(Plan(Change(name, fields or {"amp_dtype": None}, "lab03_amp"),
                      "try" if fields else "skip",
                      "lab 3's AMP_CONFIG: measure it on top of the loader" if fields
                      else "lab 3's AMP_CONFIG kept FP32"))
    stages = checkpoint_stages_for(checkpoint)
    what = "every stage" if checkpoint is None else ("your lab 4 choice (" + (", ".join(checkpoint) or "none") + ")")
    ckpt = Change(f"checkpoint {what}", {"checkpoint_stages": stages}, "checkpoint")
    plans.append(Plan(ckpt, "force", "the baseline's batch does not fit the memory budget without it")
                 if memory_needed and stages else
                 Plan(ckpt, "skip", "the batch fits in memory: checkpointing would only cost time" if not memory_needed
                      else "lab 4 chose no stage to checkpoint"))
    plans.append(Plan(Change(f"your lab 5 compile ({compile_mode})", {"compile_mode": compile_mode}, "compile"),
                      "try", "lab 5's CHOICE: measure it on top of the rest (compilation happens in the warm-up)")
                 if compile_mode else
                 Plan(Change("your lab 5 compile", {"compile_mode": None}, "compile"), "skip",
                      "lab 5's CHOICE was not to compile"))
    return plans


def without(chain: Sequence[tuple[str, TrainConfig]], name: str, mode: str | None = None) -> TrainConfig:
    """The last configuration of `chain` with the change named `name` left out: the baseline with every
    other step's change applied in order (what leave-one-out times FINAL against)."""
    names = [n for n, _ in chain]
    if name not in names[1:]:
        raise ValueError(f"name: {name!r} is not a change of the chain ({', '.join(names[1:]) or 'none kept'})")
    config = chain[0][1]
    for (_, before), (n, after) in zip(chain, chain[1:], strict=False):
        if n != name:
            config = config.replace(**{f: getattr(after, f) for f in SPEED_FIELDS
                                       if getattr(after, f) != getattr(before, f)})
    return config


# ---------------------------------------------------------------------------------------------
# What cumulative_speedups takes its CIs from (its visible check, `cumulative_problems`, and the stored
# rows are perflab.labs.lab06.checks'; the hidden checks are the grader's)


def ratio_ci(baseline: Sequence[float], times: Sequence[float], quantile: float = QUANTILE,
             seed: int = CI_SEED) -> tuple[float, float]:
    """95% paired-bootstrap CI of q(baseline) / q(times), q the `quantile` of the block times."""
    interval = stats.bootstrap_ratio_ci(baseline, times, stats.quantile_of(quantile), seed=seed, paired=True)
    return interval.low, interval.high


# ---------------------------------------------------------------------------------------------
# FINAL, the chain and the accuracy gate


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


# ---------------------------------------------------------------------------------------------
# The graded re-measurement


def verify_final(final: TrainConfig, claim: float | None = None, mode: str | None = None) -> tuple[Any, Any]:
    """Re-measure FINAL against the baseline in a fresh interpreter with the calibrated bar of this machine,
    judged as the grader judges a decision (`common.verify_against_bar(decision=True)`: the keep rule).

    Returns (verdict, expectation): a `perflab.verify.Verdict` and the `Expectation` it was held to.
    """
    problems = final_problems(final, mode=mode)
    if problems:
        raise ValueError(problems[0])
    s = sizes(mode)
    return verify_against_bar(baseline_config(mode), final, EXPECTATION, claim=claim,
                              max_pairs=s.verify_max_pairs, max_seconds=s.verify_seconds, decision=True)


# The prediction written before the headline measurement, by the key of its graded cell
# (`test_predict_<key>`): the value's name and its one line of why (`perflab.labs.predict`).
PREDICTIONS = {"cumulative": ("PREDICT_CUMULATIVE", "WHY_CUMULATIVE")}
