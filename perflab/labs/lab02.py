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

    PREDICT_WORKERS, WHY_WORKERS; PREDICT_CROWDED, WHY_CROWDED (PREDICTIONS)
        Written before the sweep and before the crowded-threads run: a positive number (the training
        speedup of workers over none) and one line of why. Graded on being there, never on being right
        (`perflab.labs.predict`).

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
from perflab.labs import predict
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
# Torch threads of the training process in this lab: the count perflab.verify re-measures with. A loader
# worker decodes on a core the training threads leave free; measured on 2 cores (photo set, 32 px,
# batch 16), 1 or 2 workers beside 1 training thread gain 1.4-1.5x, beside 2 threads 0.9-1.06x.
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


def sizes(mode: str | None = None) -> LabSizes:
    """The lab's sizes in `mode` (default: the mode in force), built on `perflab.env.mode_sizes`."""
    base = env.mode_sizes(mode, lab=LAB)
    return LabSizes(base.mode, base.data, base.image_size, base.batch_size, **_LAB_SIZES[base.mode])


def sweep_counts(cpu_count: int) -> list[int]:
    """Worker counts the sweep tries: 0 up to twice the cores (to show what oversubscription does), capped."""
    limit = min(MAX_SWEEP_WORKERS, max(4, 2 * cpu_count))
    return [n for n in (0, 1, 2, 3, 4, 6, 8) if n <= limit]


def baseline_config(mode: str | None = None) -> TrainConfig:
    """The loader the lab starts from: everything in the training process, no workers, nothing pinned,
    the model on TRAIN_THREADS torch threads."""
    s = sizes(mode)
    return TrainConfig(data=s.data, image_size=s.image_size, batch_size=s.batch_size, threads=TRAIN_THREADS)


def loader_pace(baseline: TrainConfig, candidate: TrainConfig, block_size: int) -> dict[str, Any]:
    """`timing.compare`'s `block_size` and `lead_in` that time two loader configurations at the pace
    their loaders sustain (`perflab.verify.pace`, as the grader's re-measurement does): while one runs,
    the other's workers fill their queue, which a short block would read at no cost. On 2 cores at the
    tiny sizes, 1-step blocks timed 2 workers 1.11x faster than none where training sustained 0.84x."""
    from perflab.verify import pace

    queues = [pace.queued_batches(c.num_workers, c.prefetch_factor) for c in (baseline, candidate)]
    return {"block_size": max(block_size, pace.min_block_steps(*queues)),
            "lead_in": (pace.lead_in(queues[0]), pace.lead_in(queues[1]))}


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


def _where(size: int, batch_size: int, num_workers: int, seed: int, options: dict[str, Any]) -> str:
    return (f"make_loader(IndexData({size}), batch_size={batch_size}, num_workers={num_workers}, seed={seed}"
            + "".join(f", {k}={v!r}" for k, v in options.items()) + ")")


def observe_epochs(make_loader: Callable[..., Iterable[Any]], size: int, batch_size: int, num_workers: int = 0,
                   *, seed: int = 0, epochs: int = 2, **options: Any) -> dict[str, Any]:
    """What `make_loader` over IndexData(size) yields over `epochs` passes, as data: {"epochs": [[batch
    indices]]}, or {"raised": type, "message": ...} when it fails."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "more workers than cores": the tests sweep past the core count
            loader = make_loader(IndexData(size), batch_size, num_workers, seed=seed, **options)
            return {"epochs": epochs_of(loader, epochs)}
    except Exception as exc:  # the student's loader may fail in any way: that is an answer too
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}


def epochs_problems(observed: Any, size: int, batch_size: int, num_workers: int = 0, *, seed: int = 0,
                    epochs: int = 2, **options: Any) -> list[str]:
    """What is wrong with a loader's observed epochs (`observe_epochs`): every sample once per epoch,
    in full batches but the last."""
    where = _where(size, batch_size, num_workers, seed, options)
    if not isinstance(observed, dict) or "epochs" not in observed:
        raised = observed.get("raised", "no result") if isinstance(observed, dict) else "no result"
        message = observed.get("message", "") if isinstance(observed, dict) else ""
        return [f"{where} raised {raised}: {message}".rstrip(": ")]
    seen = observed["epochs"]
    if not isinstance(seen, list) or len(seen) != epochs:
        return [f"{where}: expected {epochs} epochs of batches"]
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


def loader_problems(make_loader: Callable[..., Iterable[Any]], size: int, batch_size: int, num_workers: int = 0,
                    *, seed: int = 0, epochs: int = 2, **options: Any) -> list[str]:
    """Does `make_loader` over IndexData(size) give every sample once per epoch, in full batches but the last?"""
    observed = observe_epochs(make_loader, size, batch_size, num_workers, seed=seed, epochs=epochs, **options)
    return epochs_problems(observed, size, batch_size, num_workers, seed=seed, epochs=epochs, **options)


def order_settings(workers: Iterable[int]) -> list[tuple[int, dict[str, Any]]]:
    """The loader settings whose orders `observe_orders` compares: no workers, then each count plain and tuned."""
    settings: list[tuple[int, dict[str, Any]]] = [(0, {})]
    for n in workers:
        if n > 0:
            settings += [(n, {}), (n, {"persistent_workers": True, "prefetch_factor": 3})]
    return settings


def observe_orders(make_loader: Callable[..., Iterable[Any]], size: int, batch_size: int, *, seed: int = 0,
                   workers: Iterable[int] = (0, 2), epochs: int = 3) -> dict[str, Any]:
    """The sample orders of every `order_settings` loader over `epochs` passes, of a second loader with the
    same seed and of one with the next seed (one pass each), as data."""
    def order(loader: Iterable[Any], n: int) -> list[list[int]]:
        return [[i for b in epoch for i in b] for epoch in epochs_of(loader, n)]

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            orders = [order(make_loader(IndexData(size), batch_size, n, seed=seed, **opts), epochs)
                      for n, opts in order_settings(workers)]
            repeat = order(make_loader(IndexData(size), batch_size, 0, seed=seed), 1)
            other = order(make_loader(IndexData(size), batch_size, 0, seed=seed + 1), 1)
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"orders": orders, "repeat": repeat, "other": other}


def orders_problems(observed: Any, size: int, *, seed: int = 0, workers: Iterable[int] = (0, 2),
                    epochs: int = 3) -> list[str]:
    """Is the observed order (`observe_orders`) shuffled, new each epoch, fixed by the seed, and the same
    for every loader setting?"""
    if not isinstance(observed, dict) or "orders" not in observed:
        raised = observed.get("raised", "no result") if isinstance(observed, dict) else "no result"
        message = observed.get("message", "") if isinstance(observed, dict) else ""
        return [f"make_loader(IndexData({size}), ..., seed={seed}) raised {raised}: {message}".rstrip(": ")]
    settings = order_settings(workers)
    orders, repeat, other_order = observed["orders"], observed["repeat"], observed["other"]
    if len(orders) != len(settings) or any(len(o) != epochs for o in orders) or not repeat or not other_order:
        return [f"seed {seed}: the loaders did not yield {epochs} epochs each"]
    problems = []
    first = orders[0]
    if sorted(first[0]) != list(range(size)):
        problems.append(f"seed {seed}: the first epoch does not hold every sample exactly once")
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


def order_problems(make_loader: Callable[..., Iterable[Any]], size: int, batch_size: int, *, seed: int = 0,
                   workers: Iterable[int] = (0, 2), epochs: int = 3) -> list[str]:
    """Is the order shuffled, new each epoch, fixed by the seed, and the same for every loader setting?"""
    observed = observe_orders(make_loader, size, batch_size, seed=seed, workers=workers, epochs=epochs)
    return orders_problems(observed, size, seed=seed, workers=workers, epochs=epochs)


def check_best(best: Any, mode: str | None = None) -> None:
    """The correctness gate: only loader knobs changed, and the baseline's samples and pixels consumed."""
    problems = best_problems(best, mode) or sample_problems(best, mode)
    assert not problems, problems[0]


def best_problems(best: Any, mode: str | None = None) -> list[str]:
    """Is `best` a TrainConfig that changes only loader knobs of this mode's baseline?"""
    return changed_fields_problems("BEST", best, baseline_config(mode), LOADER_FIELDS, allowed_kind="the loader knobs",
                                   purpose="not how it is fed")


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


# ---------------------------------------------------------------------------------------------
# What the grader reads from a notebook (perflab.grading.probing): each autograded cell's probe
# calls the student's answers on inputs drawn from the grader's seed and returns the raw outputs;
# the grader-only judges (perflab/labs/hidden/lab02.py) draw the same inputs and decide.

VISIBLE_LOADER_CASES = ((20, 4, 0), (23, 5, 0), (23, 5, 2), (3, 8, 0))
VISIBLE_ORDER_CASE = (24, 5, 3, (2,))  # size, batch, seed, workers


def make_loader_cases(seed: int) -> list[tuple[int, int, int, int, dict[str, Any]]]:
    """(size, batch, workers, loader seed, options): fixed edge cases, then random sizes, batches
    (most with a ragged last batch) and worker counts drawn from `seed`."""
    import random

    rng = random.Random(seed)
    fixed: list[tuple[int, int, int, dict[str, Any]]] = [
        (1, 1, 0, {}), (17, 17, 0, {}), (5, 8, 1, {}), (31, 4, 3, {}),
        (29, 6, 2, {"persistent_workers": True, "prefetch_factor": 1}),
        (13, 4, 0, {"persistent_workers": True, "prefetch_factor": 4, "pin_memory": True}),
    ]
    for _ in range(5):
        size, batch = rng.randint(5, 90), rng.randint(2, 12)
        fixed.append((size + (size % batch == 0), batch, rng.randint(0, 3), {}))
    return [(size, batch, workers, rng.randint(0, 10_000), options) for size, batch, workers, options in fixed]


def order_cases(seed: int) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """(size, batch, loader seed, workers): the visible case, then two drawn from `seed`."""
    import random

    rng = random.Random(seed)
    cases = [VISIBLE_ORDER_CASE]
    for _ in range(2):
        cases.append((rng.randint(12, 40), rng.randint(2, 7), rng.randint(0, 999), (1, 3)))
    return cases


def data_wait_cases(seed: int) -> list[dict[str, Any]]:
    """Scripted loaders on a fake clock: startup, per-batch delays, step costs, batch sizes, steps, clock
    start. The first is the visible test's; delays are multiples of 2**-10, exact in binary."""
    import random

    rng = random.Random(seed)
    cases = [{"start": 100.0, "startup": 0.5, "delays": [0.25, 0.125, 0.125], "costs": [1.0, 1.0, 0.5],
              "sizes": [8, 8, 3], "steps": 3}]
    for _ in range(5):
        n = rng.randint(1, 12)
        cases.append({"start": rng.uniform(0, 1e6), "delays": [rng.randint(0, 2000) / 1024 for _ in range(n)],
                      "costs": [rng.randint(1, 2000) / 1024 for _ in range(n)],
                      "sizes": [rng.randint(1, 64) for _ in range(n)], "startup": rng.randint(0, 4000) / 1024,
                      "steps": rng.randint(1, n)})
    return cases


DATA_WAIT_BAD_STEPS = ((0, 1), (-3, 1), (3, 2))  # (steps, batches available): each must raise ValueError
# A loader that sleeps this long per batch and a step that sleeps this long: the wall clock must see both.
SLOW_LOADER_S, SLOW_STEP_S = 0.06, 0.01


def _data_wait_fields(got: Any) -> dict[str, Any]:
    if not isinstance(got, DataWait):
        return {"type": type(got).__name__}
    return {"type": "DataWait", "startup": got.startup, "wait": list(got.wait), "compute": list(got.compute),
            "sizes": list(got.sizes), "share": got.share()}


def observe_data_wait(measure_data_wait: Callable[..., Any], case: dict[str, Any]) -> dict[str, Any]:
    clock = FakeClock(start=case["start"])
    batches = ScriptedBatches(clock, case["startup"], case["delays"], case["sizes"])
    try:
        got = measure_data_wait(batches, scripted_step(clock, case["costs"]), case["steps"], clock=clock)
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {**_data_wait_fields(got), "iterations": batches.iterations}


def pick_workers_cases(seed: int) -> list[tuple[dict[int, float], float | None]]:
    """(sweep, tolerance or None for the default): the visible cases, then 30 random sweeps."""
    import random

    rng = random.Random(seed)
    cases: list[tuple[dict[int, float], float | None]] = [
        ({0: 100.0, 1: 180.0, 2: 200.0, 4: 205.0}, None), ({0: 100.0, 1: 99.0, 2: 60.0}, None),
        ({4: 50.0, 2: 50.0}, None)]
    for _ in range(30):
        sweep = {n: rng.uniform(10, 1000) for n in rng.sample(range(17), rng.randint(1, 6))}
        cases.append((sweep, rng.choice([0.0, 0.02, 0.05, 0.2])))
        cases.append((sweep, None))
    return cases


PICK_WORKERS_BAD = ({}, {-1: 10.0}, {1: 0.0}, {1: float("nan")}, {2: -5.0})


# The predictions written before a headline measurement, by the key of their graded cell
# (`test_predict_<key>`): the value's name and its one line of why (`perflab.labs.predict`).
PREDICTIONS = {"workers": ("PREDICT_WORKERS", "WHY_WORKERS"), "crowded": ("PREDICT_CROWDED", "WHY_CROWDED")}


def _probe_loader_visible(answers: Any, seed: int) -> list[dict[str, Any]]:
    fn = answers["make_loader"]
    return [observe_epochs(fn, *case) for case in VISIBLE_LOADER_CASES]


def _probe_loader_random(answers: Any, seed: int) -> list[dict[str, Any]]:
    fn = answers["make_loader"]
    return [observe_epochs(fn, size, batch, workers, seed=s, **opts)
            for size, batch, workers, s, opts in make_loader_cases(seed)]


def _probe_loader_order(answers: Any, seed: int) -> list[dict[str, Any]]:
    fn = answers["make_loader"]
    return [observe_orders(fn, size, batch, seed=s, workers=workers) for size, batch, s, workers in order_cases(seed)]


def _probe_data_wait(answers: Any, seed: int, visible: bool) -> dict[str, Any]:
    import time

    from perflab.grading.probing import outcome

    fn = answers["measure_data_wait"]
    cases = data_wait_cases(seed)[:1] if visible else data_wait_cases(seed)
    out: dict[str, Any] = {"cases": [observe_data_wait(fn, case) for case in cases]}
    if visible:
        return out
    one = [(torch.zeros(2), torch.zeros(2))]
    out["bad"] = [outcome(fn, one * available, lambda batch: None, steps) for steps, available in DATA_WAIT_BAD_STEPS]

    def slow_batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(2):
            time.sleep(SLOW_LOADER_S)
            yield torch.zeros(4), torch.zeros(4)

    try:
        out["wall"] = _data_wait_fields(fn(slow_batches(), lambda batch: time.sleep(SLOW_STEP_S), 2))
    except Exception as exc:
        out["wall"] = {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return out


def _probe_pick_workers(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import outcome

    fn = answers["pick_workers"]
    picked = [outcome(fn, sweep) if tol is None else outcome(fn, sweep, tol) for sweep, tol in pick_workers_cases(seed)]
    return {"picked": picked, "bad": [outcome(fn, dict(bad)) for bad in PICK_WORKERS_BAD]}


def _probe_best(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import encode

    best = answers["BEST"]
    config = best.to_dict() if isinstance(best, TrainConfig) else None
    return {"type": type(best).__name__, "config": config, "claim": encode(answers.get("CLAIM"))}


PROBES = {
    "test_make_loader_visible": _probe_loader_visible,
    "test_make_loader_random": _probe_loader_random,
    "test_make_loader_order": _probe_loader_order,
    "test_measure_data_wait_visible": lambda answers, seed: _probe_data_wait(answers, seed, True),
    "test_measure_data_wait_hidden": lambda answers, seed: _probe_data_wait(answers, seed, False),
    "test_pick_workers": _probe_pick_workers,
    "test_best_samples": _probe_best,
    "test_best_verified": _probe_best,
    **{f"test_predict_{key}": predict.prober(name, why) for key, (name, why) in PREDICTIONS.items()},
}
