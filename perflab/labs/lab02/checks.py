"""Lab 2's checks: what the visible tests, the grader's probes and its judges run.

The visible checks the notebook's test cells call (`loader_problems`, `order_problems`: the problems in
words, empty when all is well; `check_best`, BEST's correctness gate) and their machinery: what a loader
yields over IndexData (`observe_epochs`, `observe_orders`) and what is wrong with it
(`epochs_problems`, `orders_problems`), whether BEST's loader gives the baseline's samples
(`sample_problems`). Then the grader's cases, public so that a probe (in the student's kernel) and a
judge (in the grader) draw identical inputs from the same seed (`*_cases`, `VISIBLE_*`), with
`observe_data_wait`. This module imports the contract `perflab.labs.lab02`, never the reverse; the probes
(`perflab.labs.lab02.probes`) run these, and the hidden tests' checks and judges (random cases drawn
from a seed, AssertionError on the first problem) live in the grader-only `perflab/labs/lab02/judges/`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from perflab.labs.common import FakeClock
from perflab.labs.lab02 import (
    DataWait,
    IndexData,
    ScriptedBatches,
    baseline_config,
    best_problems,
    scripted_step,
)
from perflab.workload import TrainConfig

# ---------------------------------------------------------------------------------------------
# Checks: `*_problems` return what is wrong, in words (empty when all is well)


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
# The grader's cases: each autograded cell's probe calls the student's answers on inputs drawn from the
# grader's seed and returns the raw outputs; the grader-only judges (perflab/labs/lab02/judges/) draw
# the same inputs and decide.

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


def data_wait_fields(got: Any) -> dict[str, Any]:
    """A DataWait as data (its raw samples and its share), or the type of what was returned instead."""
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
    return {**data_wait_fields(got), "iterations": batches.iterations}


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
