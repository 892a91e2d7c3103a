"""Lab 5's probes: what the grader reads from a notebook (perflab.grading.probing).

Each autograded cell's probe runs the student's functions on inputs drawn from the grader's seed
(`lab05_checks.*_cases`) and returns what they gave, as data (`lab05_checks.observe_*`); the grader-only
judges (perflab/labs/lab05/judges/) draw the same inputs, compute the references (dynamo's own break
lines, eager outputs, break-even, the re-measurement) and decide. Compile counts and dynamo's
graph-break count of FixedBlock are read in the notebook's kernel: patching torch._dynamo there is
flagged for review.
"""

from __future__ import annotations

from typing import Any

import torch

from perflab.grading.probing import encode, outcome
from perflab.labs import predict
from perflab.labs.common import FakeClock
from perflab.labs.lab05 import PREDICTIONS, BrokenBlock, ScriptedBuild
from perflab.labs.lab05.checks import (
    BREAK_EVEN_BAD,
    BREAK_EVEN_VISIBLE,
    VISIBLE_FIXED_CASES,
    break_cases,
    break_even_cases,
    fixed_block_cases,
    measure_compile_cases,
    no_recompile_cases,
    observe_compiled,
    observe_fixed,
    observe_measure_compile,
    observe_no_recompile,
    observe_reset,
)
from perflab.labs.lab05.dynamo import quiet


def _probe_breaks_visible(answers: Any, seed: int) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        block = BrokenBlock(16)
    with quiet():
        return encode(outcome(answers["graph_breaks"], block, torch.randn(8, 16)))


def _probe_breaks_hidden(answers: Any, seed: int) -> Any:
    fn = answers["graph_breaks"]
    with quiet():
        return [outcome(fn, target, x) for target, x in break_cases(seed)]


def _probe_fixed(answers: Any, seed: int, visible: bool) -> list[dict[str, Any]]:
    return observe_fixed(answers["FixedBlock"], VISIBLE_FIXED_CASES if visible else fixed_block_cases(seed))


def _probe_measure_compile(answers: Any, seed: int, visible: bool) -> dict[str, Any]:
    fn = answers["measure_compile"]
    cases = measure_compile_cases(seed)
    if visible:
        return {"cases": [observe_measure_compile(fn, cases[0])]}
    bad = [outcome(fn, ScriptedBuild(FakeClock(), 0.0, [1.0]), steps, clock=FakeClock()) for steps in (0, -2)]
    return {"cases": [observe_measure_compile(fn, c) for c in cases[1:]], "bad": bad, "reset": observe_reset(fn, seed)}


def _probe_compiled(answers: Any, seed: int) -> dict[str, Any]:
    choice = answers.get("CHOICE")
    return {"mode": choice if isinstance(choice, str) else None,
            "observed": observe_compiled(answers["FixedBlock"], choice if isinstance(choice, str) else "default",
                                         seed=seed % 1000)}


def _probe_break_even(answers: Any, seed: int, visible: bool) -> dict[str, Any]:
    fn = answers["break_even_steps"]
    cases = BREAK_EVEN_VISIBLE if visible else break_even_cases(seed)
    return {"values": [outcome(fn, *args) for args in cases],
            "bad": [outcome(fn, *args) for args, _ in BREAK_EVEN_BAD]}


def _probe_no_recompile(answers: Any, seed: int, visible: bool) -> list[dict[str, Any]]:
    cases = no_recompile_cases(seed)
    return [observe_no_recompile(answers["no_recompile_setup"], case) for case in (cases[:1] if visible else cases)]


def _probe_choice(answers: Any, seed: int) -> dict[str, Any]:
    choice = answers["CHOICE"]
    return {"choice": choice if choice is None or isinstance(choice, str) else {"type": type(choice).__name__},
            "claim": encode(answers.get("CLAIM")), "why": predict.reason(answers, "WHY_CHOICE")}


PROBES = {
    "test_graph_breaks_visible": _probe_breaks_visible,
    "test_graph_breaks_hidden": _probe_breaks_hidden,
    "test_fixed_visible": lambda answers, seed: _probe_fixed(answers, seed, True),
    "test_fixed_hidden": lambda answers, seed: _probe_fixed(answers, seed, False),
    "test_measure_compile_visible": lambda answers, seed: _probe_measure_compile(answers, seed, True),
    "test_measure_compile_hidden": lambda answers, seed: _probe_measure_compile(answers, seed, False),
    "test_compiled_matches_eager": _probe_compiled,
    "test_break_even_visible": lambda answers, seed: _probe_break_even(answers, seed, True),
    "test_break_even_hidden": lambda answers, seed: _probe_break_even(answers, seed, False),
    "test_no_recompile_visible": lambda answers, seed: _probe_no_recompile(answers, seed, True),
    "test_no_recompile_hidden": lambda answers, seed: _probe_no_recompile(answers, seed, False),
    "test_choice_verified": _probe_choice,
    **{f"test_predict_{key}": predict.prober(name, why) for key, (name, why) in PREDICTIONS.items()},
}
