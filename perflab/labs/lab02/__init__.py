"""Lab 2 — Feed the model: the one contract between the notebook, its tests and the grader.

The student writes five things in `solutions/lab02_feed` (the notebook); the tests call nothing else:

    make_loader(dataset, batch_size, num_workers=0, *, seed=0, pin_memory=False,
                persistent_workers=False, prefetch_factor=None) -> Iterable
        A loader over `dataset` (items `(x, y, ...)`) that yields EVERY sample EXACTLY ONCE per
        epoch, in batches of `batch_size` with a smaller last batch when the size does not divide
        (no sample dropped). Each `iter(loader)` is one epoch; the order is shuffled, and depends
        only on `seed` and the epoch: not on `num_workers`, `persistent_workers`, `prefetch_factor`
        or `pin_memory`, so any loader setting trains on exactly the same data. With
        `num_workers=0` the worker-only options are ignored (never an error); `pin_memory` is only
        used where a CUDA device exists (pinning is for host-to-GPU copies).

    measure_data_wait(batches, step, steps, *, clock=time.perf_counter) -> DataWait
        Runs `steps` steps over `batches`, timing with `clock` (wall clock, never CPU time):
        `startup` the call `iter(batches)` (with workers: starting them), `wait[i]` the call
        `next(it)` of step i, `compute[i]` the call `step(batch)`, `sizes[i]` is `len(batch[0])`.
        `steps < 1` or a loader that runs out first: ValueError naming `steps`.

    pick_workers(sweep, tolerance=0.05) -> int
        `sweep` maps worker counts to throughput (samples/s). The smallest count whose throughput
        is at least (1 - tolerance) x the best: workers beyond it cost memory and cores for
        nothing. An empty sweep, a negative count or a throughput that is not a positive number:
        ValueError.

    BEST: TrainConfig
        The fastest loader settings found, as `baseline_config().replace(...)` of the loader knobs
        only (LOADER_FIELDS): the grader re-measures it against `baseline_config()` in a fresh
        process with `perflab.verify`. `CLAIM` is the speedup measured in the notebook.

    WHY_BEST: str
        One line (at least three words) of why the notebook's measurements make BEST the loader: a
        person reads it; without one the re-measured cell earns half (`predict.with_reason`).

    make_augment(crop) -> nn.Module
        The augmentation on the device, built from `kornia.augmentation` (e.g. `AugmentationSequential`):
        called on float images in [0, 1], (n, 3, H, W) on any device, it returns (n, 3, crop, crop) float32
        on the same device, the model's normalised input. Each image, on its own: a random resized crop to
        `crop` (area a share of the picture in CROP_SCALE, width/height ratio in CROP_RATIO), a left-right
        flip with probability FLIP_P, colour jitter (brightness, contrast and saturation factors in
        [1 - JITTER, 1 + JITTER], no hue) with probability JITTER_P, then `Normalize(MEAN, STD)`
        (`perflab.device_augment`'s constants and `perflab.dataset`'s MEAN and STD: the kit's batched
        `DeviceAugment` draws the same distribution). Each call draws anew. Checked in
        `perflab.labs.lab02.augment`.

    PREDICT_WORKERS, WHY_WORKERS; PREDICT_CROWDED, WHY_CROWDED; PREDICT_AUGMENT, WHY_AUGMENT (PREDICTIONS)
        Written before the sweep, before the crowded-threads run and before the augmentations are timed: a
        positive number (the training speedup of workers over none; the kit's `DeviceAugment` per batch
        against the student's kornia pipeline) and one line of why. Graded on being there, never on being
        right (`perflab.labs.predict`).

This module holds what the tests and the grader share: `DataWait`, the sizes of each mode, the
baseline, small deterministic fixtures (`IndexData`, `FakeClock`, `ScriptedBatches`, `scripted_step`),
BEST's field rule (`best_problems`) and its re-measurement (`verify_best`): the contract, never the
answer.

Elsewhere, each importing this module and never imported by it: the checks the visible tests call
(`loader_problems`, `order_problems`, `check_best`) with their machinery and the grader's cases in
`perflab.labs.lab02.checks`; the notebook's timing helper `loader_pace` in
`perflab.labs.lab02.measure`; `make_augment`'s cases and checks in `perflab.labs.lab02.augment`;
`PROBES`, what the grader reads from a notebook, in `perflab.labs.lab02.probes`. The hidden tests'
checks (random cases drawn from a seed, AssertionError on the first problem) and the answer key
(`reference_best`, the loader calibration times) live in the grader-only `perflab/labs/lab02/judges/`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from perflab import env
from perflab.labs import homework
from perflab.labs.common import (  # noqa: F401
    INCONCLUSIVE_ENV,
    INCONCLUSIVE_POLICIES,
    FakeClock,
    accepted,
    changed_fields_problems,
    inconclusive_policy,
    report,
    verify_against_bar,
)
from perflab.verify.protocol import VERIFY_THREADS
from perflab.workload import TrainConfig

# What the core (env, grading, the report, the demo) knows of this lab: data, read by
# perflab.labs.registry without importing this module (perflab.labs.manifest says what each field holds).
MANIFEST = {
    "lab": "lab02_feed",
    "title": "Lab 2 — Feed the model",
    # Photograph-sized JPEGs wherever it runs, so that the loader keeps the model waiting: on a 2-core CPU
    # at 32 px, batch 16, a third of the step is loading and 2 workers gain 1.39x; on CUDA the starved
    # fp32 baseline waits on its loader 84% of its step (env.py has the measurements).
    "workloads": {"grade": {"cpu": ("photo", 32, 16), "cuda": ("small", 224, 128)},
                  "laptop": {"cpu": ("photo", 32, 16), "mps": ("photo", 64, 32), "cuda": ("photo", 64, 32)}},
    "bars": "graded_bars",
    "graded_changes": ("num_workers",),
    "decides_at_home": True,
    "untimed_records": ("lab02.best",),
    "report_sections": ("speedups", "phases"),
    "lazy_choices": {"best": "BEST = BASELINE"},
    "hints": ("data loading",),
}
LAB = MANIFEST["lab"]
# The entry of autograder/expectations/<hardware_class>.json that holds this lab's bar: `perflab
# calibrate` times its reference change (the grader's `reference_best`) against the baseline on the
# grading machine.
EXPECTATION = "num_workers"
# The knobs BEST may change: they change how samples reach the model, never which samples or how
# they are augmented. `gpu_augment` is left out on purpose: the augmentation on the device draws other
# random flips and jitters than torchvision on the CPU, so losses cannot be compared step for step.
LOADER_FIELDS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
# Throughputs within this fraction of the best count as "as fast" when choosing a worker count:
# run-to-run noise of a loader sweep on a busy laptop is a few percent.
DEFAULT_TOLERANCE = 0.05
# Torch threads of the training process in this lab: the count perflab.verify re-measures with. A loader
# worker decodes on a core the training threads leave free (what that gave on 2 cores, with one training
# thread and with two, is in docs/DESIGN.md, "Workloads where the lesson is true").
TRAIN_THREADS = VERIFY_THREADS
# What this lab can promise on each device kind (printed by common.hardware_statement).
HARDWARE_NOTES = {
    "cpu": f"the model trains on {TRAIN_THREADS} torch thread(s), the count the autograder re-measures with; "
           "a loader worker decodes on a core the training threads leave free, so workers pay off up to the "
           "free cores; pin_memory does nothing without a CUDA device.",
    "mps": "the model runs on the GPU and the workers decode on the CPU cores; pin_memory does nothing on MPS "
           "(host and GPU share memory).",
    "cuda": "workers keep the GPU fed while it trains; pinned memory with non_blocking copies overlaps each "
            "batch's copy with the previous step.",
}
# Largest worker count the lab sweeps: beyond the core count workers only queue for cores, and
# each one holds a copy of the dataset object and prefetched batches in memory.
MAX_SWEEP_WORKERS = 8

# ---------------------------------------------------------------------------------------------
# What measure_data_wait returns


@dataclass(frozen=True)
class DataWait:
    """Raw seconds of a run of steps: starting the iterator, each wait in `next(it)`, each step, each batch's size.

    Everything else (totals, the wait share, throughput) is derived from these samples. `skip`
    leaves out the first steps (and the start): what the loop does once it runs, not how it starts.
    """

    startup: float
    wait: tuple[float, ...]
    compute: tuple[float, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "wait", tuple(float(x) for x in self.wait))
        object.__setattr__(self, "compute", tuple(float(x) for x in self.compute))
        object.__setattr__(self, "sizes", tuple(int(x) for x in self.sizes))
        if not self.wait or not len(self.wait) == len(self.compute) == len(self.sizes):
            raise ValueError(f"wait/compute/sizes: need one of each per step, got {len(self.wait)}, "
                             f"{len(self.compute)} and {len(self.sizes)}")
        if min((self.startup, *self.wait, *self.compute)) < 0:
            raise ValueError("startup/wait/compute: seconds cannot be negative")
        if min(self.sizes) < 0:
            raise ValueError("sizes: a batch cannot hold a negative number of samples")

    @property
    def steps(self) -> int:
        return len(self.wait)

    @property
    def samples(self) -> int:
        return sum(self.sizes)

    def _check_skip(self, skip: int) -> None:
        if not 0 <= skip < self.steps:
            raise ValueError(f"skip: must be within [0, {self.steps - 1}] for {self.steps} steps, got {skip}")

    def total_wait(self, skip: int = 0) -> float:
        """Seconds the loop waited for data (starting the iterator included unless steps are skipped)."""
        self._check_skip(skip)
        return (self.startup if skip == 0 else 0.0) + sum(self.wait[skip:])

    def total_compute(self, skip: int = 0) -> float:
        self._check_skip(skip)
        return sum(self.compute[skip:])

    def total(self, skip: int = 0) -> float:
        return self.total_wait(skip) + self.total_compute(skip)

    def share(self, skip: int = 0) -> float:
        """The fraction of the loop's wall time spent waiting for data."""
        total = self.total(skip)
        return self.total_wait(skip) / total if total > 0 else 0.0

    def throughput(self, skip: int = 0) -> float:
        """Samples per second of wall time."""
        total = self.total(skip)
        return sum(self.sizes[skip:]) / total if total > 0 else 0.0

    def describe(self, skip: int = 0) -> str:
        return (f"{self.steps - skip} steps, {sum(self.sizes[skip:])} samples: waited "
                f"{self.total_wait(skip) * 1e3:.1f} ms" + (f" (start {self.startup * 1e3:.1f} ms)" if not skip else "")
                + f", computed {self.total_compute(skip) * 1e3:.1f} ms, data-wait share {self.share(skip):.1%}, "
                f"{self.throughput(skip):.0f} samples/s")

    def to_dict(self) -> dict[str, Any]:
        return {"startup": self.startup, "wait": list(self.wait), "compute": list(self.compute),
                "sizes": list(self.sizes)}


# ---------------------------------------------------------------------------------------------
# Sizes and the baseline


@dataclass(frozen=True)
class LabSizes:
    """What one mode runs: the workload sizes, the sweep, the steps timed, the grader's budget."""

    mode: str
    data: str
    image_size: int
    batch_size: int
    phase_steps: int
    sweep_batches: int  # batches the loader-alone sweep times, once the prefetch buffer is drained
    sweep_steps: int  # training steps each loader setting is timed over
    sweep_rounds: int  # rounds over every setting, alternating order; each setting keeps its best
    compare_blocks: int
    compare_block_size: int
    verify_max_pairs: int | None  # None: the protocol's own budget
    verify_seconds: float | None


# In tiny mode the re-measurement gets fewer pairs than the protocol's own budget (the suite must stay
# fast: on a quiet machine 8 pairs of tiny steps take about a second). Its time limit is generous on
# purpose: on a loaded test machine a tiny step can take seconds, and a run cut off before the
# protocol's minimum of pairs decides on too few blocks.
_LAB_SIZES = {
    "tiny": dict(phase_steps=3, sweep_batches=12, sweep_steps=3, sweep_rounds=1, compare_blocks=3, compare_block_size=1, verify_max_pairs=16,
                 verify_seconds=60.0),
    "laptop": dict(phase_steps=10, sweep_batches=32, sweep_steps=8, sweep_rounds=2, compare_blocks=8, compare_block_size=2, verify_max_pairs=None,
                   verify_seconds=None),
    "grade": dict(phase_steps=3, sweep_batches=12, sweep_steps=3, sweep_rounds=1, compare_blocks=4, compare_block_size=2, verify_max_pairs=None,
                  verify_seconds=None),
    "full": dict(phase_steps=20, sweep_batches=60, sweep_steps=20, sweep_rounds=2, compare_blocks=10, compare_block_size=4, verify_max_pairs=None,
                 verify_seconds=None),
}


# The notebook's own timing budgets in the grading kernel where its sweep is replayed: the smallest that
# still runs its code, for the sweeps (replayed) and the phase tables (shown, never decided from). The
# comparison BEST is decided from runs in the grading kernel, so it keeps the mode's budget.
GRADING_BUDGET = dict(phase_steps=2, sweep_batches=4, sweep_steps=2, sweep_rounds=1)


def sizes(mode: str | None = None) -> LabSizes:
    """The lab's sizes in `mode` (default: the mode in force), built on `perflab.env.mode_sizes`."""
    base = env.mode_sizes(mode, lab=LAB)
    s = LabSizes(base.mode, base.data, base.image_size, base.batch_size, **_LAB_SIZES[base.mode])
    # Called with no mode, in a notebook: the grading kernel runs the notebook's own timing at
    # GRADING_BUDGET (the grade reads the grader's re-measurements and the home run's record).
    return s if mode is not None else homework.smallest(s, replayed="lab02.workers", **GRADING_BUDGET)


def as_decided(best: Any, why: Any, baseline: TrainConfig, device: Any, swept: Any = None) -> tuple[Any, Any]:
    """(`BEST`, `WHY_BEST`) as this run of the notebook decided them (`homework.decided`): at home BEST's
    loader knobs, the line of why and the worker counts the notebook's sweep measured (`swept`, its
    `train_sweep`) are recorded in the cell's output; in the grading kernel they are what the submitted code
    decided in this run, from the replayed sweep and its own comparison, never the record. The grader reads
    the counts: a BEST whose worker count the home sweep never measured was not decided from it
    (`hidden.lab02.measured_at_home`)."""
    counts = sorted({n for n in swept if isinstance(n, int) and not isinstance(n, bool)}) if isinstance(
        swept, (dict, list, tuple, set)) else None

    def encode(decision: tuple[Any, Any]) -> dict[str, Any]:
        config, line = decision
        knobs = ({name: getattr(config, name) for name in LOADER_FIELDS if getattr(config, name) != getattr(baseline, name)}
                 if isinstance(config, TrainConfig) else None)
        return {"knobs": knobs, "why": line if isinstance(line, str) else None, "swept": counts}

    def decode(value: Any) -> tuple[Any, Any]:
        knobs = value.get("knobs") if isinstance(value, dict) else None
        if not isinstance(knobs, dict) or not set(knobs) <= set(LOADER_FIELDS):
            raise ValueError("not a loader decision")
        line = value.get("why")
        return baseline.replace(**knobs), (line if isinstance(line, str) else why)

    return homework.decided("lab02.best", (best, why), device=getattr(device, "type", str(device)), encode=encode,
                            decode=decode, what="BEST", show=lambda d: repr(d[0]))


def sweep_counts(cpu_count: int) -> list[int]:
    """Worker counts the sweep tries: 0 up to twice the cores (to show what oversubscription does), capped."""
    limit = min(MAX_SWEEP_WORKERS, max(4, 2 * cpu_count))
    return [n for n in (0, 1, 2, 3, 4, 6, 8) if n <= limit]


def graded_bars(mode: str) -> list[tuple[str, TrainConfig]]:
    """This lab's cell re-measured against a calibrated bar: (its entry, its baseline at `mode`)."""
    return [(EXPECTATION, baseline_config(mode))]


def baseline_config(mode: str | None = None) -> TrainConfig:
    """The loader the lab starts from: everything in the training process, no workers, nothing pinned,
    the model on TRAIN_THREADS torch threads."""
    s = sizes(mode)
    return TrainConfig(data=s.data, image_size=s.image_size, batch_size=s.batch_size, threads=TRAIN_THREADS)


# ---------------------------------------------------------------------------------------------
# Deterministic fixtures for the tests


class IndexData(torch.utils.data.Dataset):
    """`size` samples; sample i is `(tensor([i, i]), i)`, so a batch says which samples it holds."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for {self.size} samples")
        return torch.tensor([index, index]), index


class ScriptedBatches:
    """An iterable whose `iter()` costs `startup` and whose i-th `next()` costs `delays[i]` on `clock`."""

    def __init__(self, clock: FakeClock, startup: float, delays: Iterable[float], batch_sizes: Iterable[int]) -> None:
        self.clock, self.startup = clock, startup
        self.delays, self.batch_sizes = list(delays), list(batch_sizes)
        self.iterations = 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.clock.advance(self.startup)
        self.iterations += 1
        return self._batches()

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for delay, size in zip(self.delays, self.batch_sizes, strict=True):
            self.clock.advance(delay)
            yield torch.zeros(size, 3), torch.arange(size)


def scripted_step(clock: FakeClock, costs: Iterable[float]) -> Callable[[Any], None]:
    """A step function whose i-th call costs `costs[i]` on `clock`."""
    pending = list(costs)

    def step(batch: Any) -> None:
        clock.advance(pending.pop(0))

    return step


# ---------------------------------------------------------------------------------------------
# BEST: what it may change, and its graded re-measurement


def best_problems(best: Any, mode: str | None = None) -> list[str]:
    """Is `best` a TrainConfig that changes only loader knobs of this mode's baseline?"""
    return changed_fields_problems("BEST", best, baseline_config(mode), LOADER_FIELDS, allowed_kind="the loader knobs",
                                   purpose="not how it is fed")


def verify_best(best: TrainConfig, claim: float | None = None, mode: str | None = None) -> tuple[Any, Any]:
    """Re-measure `best` against the baseline in a fresh interpreter with the calibrated bar of this machine,
    judged as the grader judges a decision (`common.verify_against_bar(decision=True)`: the keep rule).

    Returns (verdict, expectation): a `perflab.verify.Verdict` and the `Expectation` it was held to.
    """
    problems = best_problems(best, mode)
    if problems:
        raise ValueError(problems[0])
    s = sizes(mode)
    return verify_against_bar(baseline_config(mode), best, EXPECTATION, claim=claim,
                              max_pairs=s.verify_max_pairs, max_seconds=s.verify_seconds, decision=True)


# The predictions written before a headline measurement, by the key of their graded cell
# (`test_predict_<key>`): the value's name and its one line of why (`perflab.labs.predict`).
PREDICTIONS = {"workers": ("PREDICT_WORKERS", "WHY_WORKERS"), "crowded": ("PREDICT_CROWDED", "WHY_CROWDED"),
               "augment": ("PREDICT_AUGMENT", "WHY_AUGMENT")}
