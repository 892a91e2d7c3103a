"""Lab 2's probes: what the grader reads from a notebook (perflab.grading.probing).

Each autograded cell's probe calls the student's answers on inputs drawn from the grader's seed
(`lab02_checks.*_cases`) and returns the raw outputs; the grader-only judges
(perflab/labs/lab02/judges/) draw the same inputs and decide.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from perflab import env
from perflab.grading.probing import encode, outcome
from perflab.labs import predict
from perflab.labs.lab02 import PREDICTIONS
from perflab.labs.lab02.augment import VISIBLE_AUGMENT_CASE, augment_case, observe_augment
from perflab.labs.lab02.checks import (
    DATA_WAIT_BAD_STEPS,
    PICK_WORKERS_BAD,
    SLOW_LOADER_S,
    SLOW_STEP_S,
    VISIBLE_LOADER_CASES,
    data_wait_cases,
    data_wait_fields,
    make_loader_cases,
    observe_data_wait,
    observe_epochs,
    observe_orders,
    order_cases,
    pick_workers_cases,
)
from perflab.workload import TrainConfig


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
        out["wall"] = data_wait_fields(fn(slow_batches(), lambda batch: time.sleep(SLOW_STEP_S), 2))
    except Exception as exc:
        out["wall"] = {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return out


def _probe_pick_workers(answers: Any, seed: int) -> dict[str, Any]:
    fn = answers["pick_workers"]
    picked = [outcome(fn, sweep) if tol is None else outcome(fn, sweep, tol) for sweep, tol in pick_workers_cases(seed)]
    return {"picked": picked, "bad": [outcome(fn, dict(bad)) for bad in PICK_WORKERS_BAD]}


def _probe_augment(answers: Any, seed: int, visible: bool) -> dict[str, Any]:
    case = VISIBLE_AUGMENT_CASE if visible else augment_case(seed)
    return observe_augment(answers["make_augment"], case, env.pick_device())


def _probe_best(answers: Any, seed: int) -> dict[str, Any]:
    best = answers["BEST"]
    config = best.to_dict() if isinstance(best, TrainConfig) else None
    return {"type": type(best).__name__, "config": config, "claim": encode(answers.get("CLAIM")),
            "why": predict.reason(answers, "WHY_BEST")}


PROBES = {
    "test_make_loader_visible": _probe_loader_visible,
    "test_make_loader_random": _probe_loader_random,
    "test_make_loader_order": _probe_loader_order,
    "test_measure_data_wait_visible": lambda answers, seed: _probe_data_wait(answers, seed, True),
    "test_measure_data_wait_hidden": lambda answers, seed: _probe_data_wait(answers, seed, False),
    "test_pick_workers": _probe_pick_workers,
    "test_make_augment_visible": lambda answers, seed: _probe_augment(answers, seed, True),
    "test_make_augment_hidden": lambda answers, seed: _probe_augment(answers, seed, False),
    "test_best_samples": _probe_best,
    "test_best_verified": _probe_best,
    **{f"test_predict_{key}": predict.prober(name, why) for key, (name, why) in PREDICTIONS.items()},
}
