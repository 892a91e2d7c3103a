"""Lab 2 — Feed the model: the one contract between the notebook, its tests and the grader.

The student writes four things in `solutions/lab02_feed` (the notebook); the tests call nothing else:

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

This module holds what the tests and the grader share: `DataWait`, the sizes of each mode, the
baseline, small deterministic fixtures (`IndexData`, `FakeClock`, `ScriptedBatches`), the checks the
visible tests call (`loader_problems`, `order_problems`, `check_best`) and `verify_best`. The hidden
tests' checks (`check_make_loader`, `check_loader_order`, `check_measure_data_wait`,
`check_pick_workers`: random cases drawn from a seed, AssertionError on the first problem) live in the
grader-only `perflab/labs/hidden/lab02.py`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from perflab import env
from perflab.labs.common import (  # noqa: F401
    INCONCLUSIVE_ENV,
    INCONCLUSIVE_POLICIES,
    FakeClock,
    accepted,
    inconclusive_policy,
    report,
    verify_against_bar,
)
from perflab.workload import TrainConfig

LAB = "lab02_feed"
# The entry of autograder/expectations/<hardware_class>.json that holds this lab's bar: `perflab
# calibrate` times its reference change (`reference_best`) against the baseline on the grading machine.
EXPECTATION = "num_workers"
# The knobs BEST may change: they change how samples reach the model, never which samples or how
# they are augmented. `gpu_augment` is left out on purpose: kornia on the device draws other random
# flips and jitters than torchvision on the CPU, so losses cannot be compared step for step.
LOADER_FIELDS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
# Throughputs within this fraction of the best count as "as fast" when choosing a worker count:
# run-to-run noise of a loader sweep on a busy laptop is a few percent.
DEFAULT_TOLERANCE = 0.05
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


def sizes(mode: str | None = None) -> LabSizes:
    """The lab's sizes in `mode` (default: the mode in force), built on `perflab.env.mode_sizes`."""
    base = env.mode_sizes(mode)
    return LabSizes(base.mode, base.data, base.image_size, base.batch_size, **_LAB_SIZES[base.mode])


def sweep_counts(cpu_count: int) -> list[int]:
    """Worker counts the sweep tries: 0 up to twice the cores (to show what oversubscription does), capped."""
    limit = min(MAX_SWEEP_WORKERS, max(4, 2 * cpu_count))
    return [n for n in (0, 1, 2, 3, 4, 6, 8) if n <= limit]


def baseline_config(mode: str | None = None) -> TrainConfig:
    """The loader the lab starts from: everything in the training process, no workers, nothing pinned."""
    s = sizes(mode)
    return TrainConfig(data=s.data, image_size=s.image_size, batch_size=s.batch_size)


def reference_best(mode: str | None = None) -> TrainConfig:
    """The reference loader calibration times against the baseline: the bar a student's BEST is held to."""
    from perflab.verify.calibrate import REFERENCE_CHANGES

    return baseline_config(mode).replace(**REFERENCE_CHANGES[EXPECTATION])


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
# Checks: `*_problems` return what is wrong, in words (empty when all is well); the hidden tests'
# `check_*`, which draw random cases from `seed`, live in perflab/labs/hidden/lab02.py.


def _indices(batch: Any) -> list[int]:
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        ids = batch[1]
        return [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
    raise TypeError(f"a batch should be a (inputs, labels, ...) sequence, got {type(batch).__name__}")


def epochs_of(loader: Iterable[Any], epochs: int) -> list[list[list[int]]]:
    """The sample indices of each batch of `epochs` successive passes over `loader` (IndexData items)."""
    out = []
    for _ in range(epochs):
        out.append([_indices(batch) for batch in loader])
    return out


def loader_problems(make_loader: Callable[..., Iterable[Any]], size: int, batch_size: int, num_workers: int = 0,
                    *, seed: int = 0, epochs: int = 2, **options: Any) -> list[str]:
    """Does `make_loader` over IndexData(size) give every sample once per epoch, in full batches but the last?"""
    where = f"make_loader(IndexData({size}), batch_size={batch_size}, num_workers={num_workers}, seed={seed}" + (
        "".join(f", {k}={v!r}" for k, v in options.items()) + ")")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "more workers than cores": the tests sweep past the core count
        loader = make_loader(IndexData(size), batch_size, num_workers, seed=seed, **options)
        seen = epochs_of(loader, epochs)
    problems = []
    full, ragged = divmod(size, batch_size)
    expected_sizes = [batch_size] * full + ([ragged] if ragged else [])
    for e, batches in enumerate(seen):
        flat = [i for b in batches for i in b]
        if sorted(flat) != list(range(size)):
            missing = sorted(set(range(size)) - set(flat))
            repeated = len(flat) - len(set(flat))
            problems.append(f"{where}: epoch {e + 1} yielded {len(flat)} samples, {len(missing)} missing"
                            f" and {repeated} repeated (every sample exactly once per epoch)")
        elif [len(b) for b in batches] != expected_sizes:
            problems.append(f"{where}: epoch {e + 1} batch sizes {[len(b) for b in batches]}, expected "
                            f"{expected_sizes}")
    return problems


def order_problems(make_loader: Callable[..., Iterable[Any]], size: int, batch_size: int, *, seed: int = 0,
                   workers: Iterable[int] = (0, 2), epochs: int = 3) -> list[str]:
    """Is the order shuffled, new each epoch, fixed by the seed, and the same for every loader setting?"""
    settings: list[tuple[int, dict[str, Any]]] = [(0, {})]
    for n in workers:
        if n > 0:
            settings += [(n, {}), (n, {"persistent_workers": True, "prefetch_factor": 3})]
    orders = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n, opts in settings:
            loader = make_loader(IndexData(size), batch_size, n, seed=seed, **opts)
            orders.append([[i for b in epoch for i in b] for epoch in epochs_of(loader, epochs)])
        again = make_loader(IndexData(size), batch_size, 0, seed=seed)
        repeat = [[i for b in epoch for i in b] for epoch in epochs_of(again, 1)]
        other = make_loader(IndexData(size), batch_size, 0, seed=seed + 1)
        other_order = [[i for b in epoch for i in b] for epoch in epochs_of(other, 1)]
    problems = []
    first = orders[0]
    if first[0] == list(range(size)):
        problems.append(f"seed {seed}: the first epoch is in dataset order; shuffle it")
    if len({tuple(o) for o in first}) < len(first):
        problems.append(f"seed {seed}: two epochs came in the same order; reshuffle every epoch")
    if repeat[0] != first[0]:
        problems.append(f"seed {seed}: two loaders made with the same seed gave different orders")
    if other_order[0] == first[0]:
        problems.append(f"seeds {seed} and {seed + 1} gave the same order; the seed must set the order")
    for (n, opts), order in zip(settings[1:], orders[1:], strict=True):
        for e in range(epochs):
            if order[e] != first[e]:
                shown = ", ".join([f"num_workers={n}", *(f"{k}={v!r}" for k, v in opts.items())])
                problems.append(f"with {shown} epoch {e + 1} came in another order than with num_workers=0: "
                                "every loader setting must consume the same samples in the same order")
                break
    return problems


def check_best(best: Any, mode: str | None = None) -> None:
    """The correctness gate: only loader knobs changed, and the baseline's samples and pixels consumed."""
    problems = best_problems(best, mode) or sample_problems(best, mode)
    assert not problems, problems[0]


def best_problems(best: Any, mode: str | None = None) -> list[str]:
    """Is `best` a TrainConfig that changes only loader knobs of this mode's baseline?"""
    if not isinstance(best, TrainConfig):
        return [f"BEST: expected a perflab.workload.TrainConfig, got {type(best).__name__}"]
    base = baseline_config(mode)
    changed = [f for f in TrainConfig.__dataclass_fields__ if getattr(best, f) != getattr(base, f)]
    others = [f for f in changed if f not in LOADER_FIELDS]
    if others:
        return [f"BEST changes {', '.join(others)}: only the loader knobs {', '.join(LOADER_FIELDS)} may differ "
                "from baseline_config() (anything else changes the work, not how it is fed)"]
    return []


def sample_problems(best: TrainConfig, mode: str | None = None, batches: int | None = None) -> list[str]:
    """Does `best`'s loader give the baseline's samples, pixel for pixel, across an epoch boundary?"""
    from perflab import workload

    base = baseline_config(mode)
    data = workload.build_dataset(base)
    per_epoch = len(data) // base.batch_size
    batches = batches or per_epoch + 2  # into the second epoch: reshuffled, reseeded augmentation
    works = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cfg in (base, best):
            work = workload.build(cfg)
            try:
                works.append([work.next_batch() for _ in range(batches)])
            finally:
                work.close()
    for k, ((xa, _, ia), (xb, _, ib)) in enumerate(zip(*works, strict=True)):
        if ia.tolist() != ib.tolist():
            return [f"batch {k + 1}: BEST's loader gave samples {ib.tolist()[:6]}... where the baseline gave "
                    f"{ia.tolist()[:6]}...: it must consume the same samples"]
        if not torch.equal(xa, xb):
            return [f"batch {k + 1}: same samples but other pixels than the baseline's (augmentation changed)"]
    return []


# ---------------------------------------------------------------------------------------------
# The graded re-measurement


def verify_best(best: TrainConfig, claim: float | None = None, mode: str | None = None) -> Any:
    """Re-measure `best` against the baseline in a fresh interpreter with the calibrated bar of this machine.

    Returns (verdict, expectation): a `perflab.verify.Verdict` and the `Expectation` it was held to.
    """
    problems = best_problems(best, mode)
    if problems:
        raise ValueError(problems[0])
    s = sizes(mode)
    return verify_against_bar(baseline_config(mode), best, EXPECTATION, claim=claim,
                              max_pairs=s.verify_max_pairs, max_seconds=s.verify_seconds)
