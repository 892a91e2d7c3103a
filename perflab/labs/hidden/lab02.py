"""Lab 02's hidden checks and the reference answers they compare against; grader-only: the student
bundle leaves this module out.

The hidden test cells of `solutions/lab02_feed` import this module inside their `BEGIN HIDDEN TESTS`
blocks and call the `check_*` functions below with the student's functions: random cases drawn from
a seed, AssertionError on the first problem. The contract they check is stated in
`perflab/labs/lab02.py`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from perflab.labs.lab02 import (
    DEFAULT_TOLERANCE,
    DataWait,
    FakeClock,
    ScriptedBatches,
    loader_problems,
    order_problems,
    scripted_step,
)


def check_make_loader(make_loader: Callable[..., Iterable[Any]], seed: int) -> None:
    """Random sizes, batch sizes (most with a ragged last batch) and worker counts; the options too."""
    rng = random.Random(seed)
    cases: list[tuple[int, int, int, dict[str, Any]]] = [
        (1, 1, 0, {}), (17, 17, 0, {}), (5, 8, 1, {}), (31, 4, 3, {}),
        (29, 6, 2, {"persistent_workers": True, "prefetch_factor": 1}),
        (13, 4, 0, {"persistent_workers": True, "prefetch_factor": 4, "pin_memory": True}),
    ]
    for _ in range(5):
        size, batch = rng.randint(5, 90), rng.randint(2, 12)
        cases.append((size + (size % batch == 0), batch, rng.randint(0, 3), {}))
    for size, batch, workers, options in cases:
        problems = loader_problems(make_loader, size, batch, workers, seed=rng.randint(0, 10_000), **options)
        assert not problems, problems[0]


def check_loader_order(make_loader: Callable[..., Iterable[Any]], seed: int) -> None:
    """Random sizes and seeds: shuffled, reshuffled each epoch, set by the seed, the same for 1 and 3 workers."""
    rng = random.Random(seed)
    for _ in range(2):
        problems = order_problems(make_loader, rng.randint(12, 40), rng.randint(2, 7), seed=rng.randint(0, 999),
                                  workers=(1, 3))
        assert not problems, problems[0]


def check_measure_data_wait(measure_data_wait: Callable[..., Any], seed: int) -> None:
    """Random scripted loaders on a fake clock (exact answers), the errors, and the real wall clock."""
    rng = random.Random(seed)
    for _ in range(5):
        n = rng.randint(1, 12)
        steps = rng.randint(1, n)
        clock = FakeClock(start=rng.uniform(0, 1e6))
        delays = [rng.randint(0, 2000) / 1024 for _ in range(n)]  # multiples of 2**-10: exact in binary
        costs = [rng.randint(1, 2000) / 1024 for _ in range(n)]
        batch_sizes = [rng.randint(1, 64) for _ in range(n)]
        startup = rng.randint(0, 4000) / 1024
        batches = ScriptedBatches(clock, startup, delays, batch_sizes)
        got = measure_data_wait(batches, scripted_step(clock, costs), steps, clock=clock)
        assert isinstance(got, DataWait), f"measure_data_wait should return a DataWait, got {type(got).__name__}"
        assert batches.iterations == 1, f"iter(batches) was called {batches.iterations} times, expected once"
        assert abs(got.startup - startup) < 1e-9, f"startup: expected {startup} s (the cost of iter()), got {got.startup}"
        for name, value, expected in (("wait", got.wait, delays), ("compute", got.compute, costs)):
            assert len(value) == steps and all(abs(a - b) < 1e-9 for a, b in zip(value, expected, strict=False)), (
                f"{name}: expected {expected[:steps]} for {steps} steps, got {list(value)}")
        assert got.sizes == tuple(batch_sizes[:steps]), f"sizes: expected {batch_sizes[:steps]}, got {got.sizes}"
    one = [(torch.zeros(2), torch.zeros(2))]
    for steps, batches in ((0, one), (-3, one), (3, one * 2)):
        try:
            measure_data_wait(batches, lambda batch: None, steps)
        except ValueError as exc:
            assert "steps" in str(exc), f"the error for steps={steps} should name steps: {exc}"
        else:
            raise AssertionError(f"steps={steps} over {len(batches)} batches should raise ValueError")

    def slow_batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(2):
            time.sleep(0.06)
            yield torch.zeros(4), torch.zeros(4)

    got = measure_data_wait(slow_batches(), lambda batch: time.sleep(0.01), 2)
    assert min(got.wait) >= 0.055 and min(got.compute) >= 0.009 and max(got.compute) < min(got.wait), (
        f"a loader sleeping 60 ms and a step sleeping 10 ms gave wait {got.wait}, compute {got.compute}: "
        "time with the wall clock (time.perf_counter), never CPU time")


def check_pick_workers(pick_workers: Callable[..., int], seed: int) -> None:
    """Random sweeps and tolerances against the rule, and the bad inputs."""
    rng = random.Random(seed)
    for _ in range(30):
        sweep = {n: rng.uniform(10, 1000) for n in rng.sample(range(17), rng.randint(1, 6))}
        tolerance = rng.choice([0.0, 0.02, 0.05, 0.2])
        best = max(sweep.values())
        expected = min(n for n, v in sweep.items() if v >= (1 - tolerance) * best)
        got = pick_workers(sweep, tolerance)
        assert got == expected, f"pick_workers({sweep}, {tolerance}) gave {got}, expected {expected}"
        assert pick_workers(sweep) == pick_workers(sweep, DEFAULT_TOLERANCE), "the default tolerance is 0.05"
    for bad in ({}, {-1: 10.0}, {1: 0.0}, {1: float("nan")}, {2: -5.0}):
        try:
            pick_workers(bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"pick_workers({bad}) should raise ValueError")
