"""Lab 6's probes: what the grader reads from a notebook (perflab.grading.probing).

Each autograded cell's probe returns the student's raw outputs on inputs drawn from the grader's seed
(`lab06_checks.*_cases`); the grader-only judges (perflab/labs/lab06/judges/) draw the same inputs,
compute the reference answers and decide.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from perflab.grading.probing import encode, outcome
from perflab.labs import predict
from perflab.labs.lab06 import PREDICTIONS, REPORT_FILE
from perflab.labs.lab06.checks import (
    VISIBLE_ABLATION,
    VISIBLE_TABLES,
    cumulative_cases,
    observe_cumulative,
    read_capped,
    table_cases,
)
from perflab.workload import TrainConfig


def _config_data(value: Any) -> dict[str, Any]:
    return {"type": type(value).__name__, "config": value.to_dict() if isinstance(value, TrainConfig) else None}


def _probe_final_config(answers: Any, seed: int) -> dict[str, Any]:
    chain = answers["CHAIN"]
    try:
        steps = [{"name": str(name), **_config_data(config)} for name, config in chain]
    except (TypeError, ValueError):
        steps = None
    return {"final": _config_data(answers["FINAL"]), "chain": steps}


def _probe_cumulative_visible(answers: Any, seed: int) -> dict[str, Any]:
    fn = answers["cumulative_speedups"]
    return observe_cumulative(fn, {k: list(v) for k, v in VISIBLE_ABLATION.items()}, {})


def _probe_cumulative_hidden(answers: Any, seed: int) -> dict[str, Any]:
    fn = answers["cumulative_speedups"]
    good, bad = cumulative_cases(seed)
    return {"good": [observe_cumulative(fn, m, kwargs) for m, kwargs in good],
            "bad": [outcome(fn, m) for m, _ in bad]}


def _probe_ablation_table(answers: Any, seed: int) -> dict[str, Any]:
    fn = answers["ablation_table"]
    good, bad = table_cases(seed)
    return {"visible": [outcome(fn, [dict(r) for r in rows]) for rows in VISIBLE_TABLES],
            "good": [outcome(fn, rows) for rows in good], "empty": outcome(fn, []),
            "bad": [outcome(fn, rows) for rows, _ in bad]}


def _probe_final_verified(answers: Any, seed: int) -> dict[str, Any]:
    return {"final": _config_data(answers["FINAL"]), "claim": encode(answers.get("CLAIM"))}


def _probe_report(answers: Any, seed: int) -> dict[str, Any]:
    results_path = answers.get("RESULTS_PATH")
    return {"report": read_capped(Path(REPORT_FILE)),
            "results": read_capped(Path(results_path)) if isinstance(results_path, (str, os.PathLike)) else None}


PROBES = {
    "test_final_config": _probe_final_config,
    "test_cumulative_visible": _probe_cumulative_visible,
    "test_cumulative_hidden": _probe_cumulative_hidden,
    "test_ablation_table": _probe_ablation_table,
    "test_final_verified": _probe_final_verified,
    "test_accuracy": lambda answers, seed: {"final": _config_data(answers["FINAL"])},
    "test_report": _probe_report,
    **{f"test_predict_{key}": predict.prober(name, why) for key, (name, why) in PREDICTIONS.items()},
}
