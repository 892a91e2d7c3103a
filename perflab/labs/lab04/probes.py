"""Lab 4's probes: what the grader reads from a notebook (perflab.grading.probing).

Each function cell's probe exports the function's source, which the grader runs in a fresh sandboxed
process (`lab04_checks.observation_program`) and judges (perflab/labs/lab04/judges/); the cost cell's
probe adds the claimed cost, and the decision's probe reads CHECKPOINT_CHOICE as data (the grader
measures what it keeps and counts what it costs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perflab.grading.probing import encode, export_source
from perflab.labs import predict
from perflab.labs.lab04 import PREDICTIONS


def _exported(answers: Any, name: str) -> dict[str, Any]:
    fn = answers[name]
    if not callable(fn):
        return {"source": None, "why": f"`{name}` is a {type(fn).__name__}, not a function"}
    try:
        source = export_source(fn, answers.namespace)
    except (OSError, TypeError, SyntaxError) as exc:
        return {"source": None, "why": f"the source of `{name}` could not be read ({exc})"}
    if getattr(fn, "__name__", name) != name:
        source += f"\n\n{name} = {fn.__name__}\n"
    return {"source": source}


def _probe_function(name: str) -> Callable[[Any, int], dict[str, Any]]:
    return lambda answers, seed: _exported(answers, name)


def _probe_cost(answers: Any, seed: int) -> dict[str, Any]:
    return {**_exported(answers, "checkpoint_stages"), "claim": encode(answers.get("CLAIM"))}


def _probe_choice(answers: Any, seed: int) -> dict[str, Any]:
    choice = answers["CHECKPOINT_CHOICE"]
    if isinstance(choice, (list, tuple)):
        return {"choice": [name if isinstance(name, str) else {"type": type(name).__name__}
                           for name in list(choice)[:16]]}
    return {"choice": choice if choice is None or isinstance(choice, str) else {"type": type(choice).__name__}}


PROBES = {
    "checkpoint_visible": _probe_function("checkpoint_stages"),
    "checkpoint_hidden": _probe_function("checkpoint_stages"),
    "checkpoint_batchnorm": _probe_function("checkpoint_stages"),
    "largest_batch_visible": _probe_function("largest_batch"),
    "largest_batch_hidden": _probe_function("largest_batch"),
    "largest_batch_model": _probe_function("largest_batch"),
    "checkpoint_choice": _probe_choice,
    "checkpoint_cost_verified": _probe_cost,
    "accumulate_visible": _probe_function("accumulate_gradients"),
    "accumulate_hidden": _probe_function("accumulate_gradients"),
    **{f"test_predict_{key}": predict.prober(name, why) for key, (name, why) in PREDICTIONS.items()},
}
