"""Lab 05's judges and the reference answers they compare against; grader-only: the student bundle
and the grading sandbox leave this module out.

Each judge in `JUDGES` decides one autograded cell from what the lab's probe
(`perflab.labs.lab05.probes.PROBES`) returned: it draws the same inputs from the grader's seed, computes the
reference here (dynamo's own break lines, eager BrokenBlock's outputs, the break-even step count, the
re-measurement of CHOICE) and raises AssertionError with the student's feedback line on the first
problem. A solution notebook's hidden blocks run probe and judge in-process with
`check(grade_id, globals())`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from perflab.grading.judging import Context, Mark, check_here
from perflab.grading.probing import decode_float
from perflab.labs import lab05, predict
from perflab.labs.lab05 import BrokenBlock
from perflab.labs.lab05 import checks as lab05_checks
from perflab.labs.lab05.dynamo import quiet

# Outputs of the fixed block against the original, both eager: the rewrite computes the same
# float32 operations, so only np.interp (float64, then rounded) differs, by an ulp or so.
FIXED_RTOL, FIXED_ATOL = 1e-5, 1e-5


def reference_breaks(fn: Callable[..., Any], *args: Any) -> list[tuple[int, str]]:
    """The grader's (line, reason) list for `fn(*args)`, from torch._dynamo.explain."""
    with quiet():
        torch._dynamo.reset()  # this process judges many notebooks: no earlier compile may answer for this one
        out = torch._dynamo.explain(fn)(*args)
    code = getattr(fn, "__code__", None) or getattr(getattr(type(fn), "forward", None), "__code__", None)
    home = code.co_filename if code is not None else None

    def line(reason: Any) -> int:
        # The innermost frame in the function's own file: in a process whose stdout or logging is
        # Python code (the grader's), dynamo may report the break inside that code instead.
        frames = [f for f in reason.user_stack if f.filename == home] or list(reason.user_stack)
        return int(frames[-1].lineno) if frames else -1

    return [(line(r), str(r.reason).splitlines()[0]) for r in out.break_reasons]


def reference_break_even(compile_seconds: float, eager_step: float, compiled_step: float) -> float:
    """The grader's answer: ceil(compile / saving), 0 without compile cost, inf without a saving."""
    if compile_seconds == 0:
        return 0
    saving = eager_step - compiled_step
    if saving <= 0:
        return math.inf
    return math.ceil(compile_seconds / saving)


def _break_even_ok(got: Any, c: float, e: float, k: float) -> bool:
    """Whether `got` is the reference's answer (within one of it when c / (e - k) is a whole number)."""
    want = reference_break_even(c, e, k)
    if want == math.inf:
        return got == math.inf
    if (isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)) or not math.isfinite(got)
            or got != int(got)):
        return False
    ratio = c / (e - k)
    if abs(ratio - round(ratio)) <= 1e-9 * max(1.0, ratio):  # on an integer: rounding may go either way
        return abs(int(got) - want) <= 1
    return int(got) == want


def _value(got: Any, what: str) -> Any:
    assert isinstance(got, dict), f"{what}: no result"
    if "raised" in got:
        raise AssertionError(f"{what} raised {got['raised']}: {got.get('message', '')}")
    return got.get("value")


def _lines(got: Any, what: str) -> list[int]:
    rows = _value(got, what)
    assert isinstance(rows, list), f"graph_breaks should return a list, got {rows!r:.80}"
    lines = []
    for row in rows:
        assert isinstance(row, list) and len(row) == 2, f"each break should be a (line, reason) tuple, got {row!r:.80}"
        line, reason = row
        assert isinstance(reason, str) and reason.strip(), f"each break needs a reason in words, got {reason!r:.80}"
        assert isinstance(line, int) and not isinstance(line, bool), f"a break's line should be a number, got {line!r}"
        lines.append(line)
    return lines


def judge_breaks_visible(observed: Any, ctx: Context) -> None:
    source, first = inspect.getsourcelines(BrokenBlock.forward)
    planted = [first + i for i, text in enumerate(source)
               if any(key in text for key in (".item()", "print(", "if h.mean()", "np.interp"))]
    found = _lines(observed, "graph_breaks(BrokenBlock(16), x)")
    assert found == planted, f"expected breaks at lines {planted}, found {found}"


def judge_breaks_hidden(observed: Any, ctx: Context) -> None:
    cases = lab05_checks.break_cases(ctx.seed)
    assert isinstance(observed, list) and len(observed) == len(cases), "no result for every function"
    for (target, x), got in zip(cases, observed, strict=True):
        name = getattr(target, "__name__", type(target).__name__)
        want = [line for line, _ in reference_breaks(target, x)]
        found = _lines(got, f"graph_breaks({name}, x)")
        assert found == want, f"{name}: dynamo breaks at lines {want}, you found {found}"


def _fixed(observed: Any, cases: list[Mapping[str, Any]]) -> None:
    assert isinstance(observed, list) and len(observed) == len(cases), "no result for every case"
    for case, got in zip(cases, observed, strict=True):
        where = f"width {case['width']}, batch {case['batch']}, fc2.bias shifted by {case['bias']:+.2f}"
        assert isinstance(got, dict), f"{where}: no result"
        if "raised" in got:
            raise AssertionError(f"{where}: FixedBlock raised {got['raised']}: {got.get('message', '')}")
        original, _ = lab05_checks.paired_for(BrokenBlock, case)
        with quiet():
            want = original(lab05_checks.case_input(case))
        breaks = got.get("breaks")
        assert breaks == 0, (f"{where}: FixedBlock still has {breaks} graph break(s): "
                             + "; ".join(map(str, got.get("reasons") or [])))
        out = lab05_checks.decoded_tensor(got.get("output"))
        assert out is not None and out.shape == want.shape, f"{where}: output shape differs from {tuple(want.shape)}"
        assert torch.allclose(out, want, rtol=FIXED_RTOL, atol=FIXED_ATOL), (
            f"{where}: outputs differ from BrokenBlock's by up to {(out - want).abs().max().item():.3g}")


def judge_fixed_visible(observed: Any, ctx: Context) -> None:
    _fixed(observed, list(lab05_checks.VISIBLE_FIXED_CASES))


def judge_fixed_hidden(observed: Any, ctx: Context) -> None:
    _fixed(observed, lab05_checks.fixed_block_cases(ctx.seed))


def _measure(got: Any, case: Mapping[str, Any]) -> None:
    assert isinstance(got, dict), "no result"
    if "raised" in got:
        raise AssertionError(f"measure_compile raised {got['raised']}: {got.get('message', '')}")
    steps, costs = case["steps"], case["costs"]
    timing = got.get("timing")
    assert isinstance(timing, dict), f"measure_compile should return a CompileTiming, got {got.get('type')}"
    assert got.get("builds") == 1, f"build() should be called once, it was called {got.get('builds')} times"
    assert got.get("calls") == steps + 1, (f"steps={steps}: step() should run {steps + 1} times (the first, then "
                                           f"{steps} steady), it ran {got.get('calls')} times")
    syncs = got.get("syncs")
    assert isinstance(syncs, int) and syncs >= steps + 1, (
        f"sync() should follow every timed call ({steps + 1}), it ran {syncs} times")
    first = decode_float(timing.get("first"))
    assert first is not None and abs(first - costs[0]) < 1e-9, (
        f"first: expected {costs[0]:.6f} s (the first call only; build() is not timed), got {timing.get('first')}")
    steady = [decode_float(v) for v in timing.get("steady") or []]
    assert len(steady) == steps and all(v is not None and abs(v - c) < 1e-9 for v, c in zip(steady, costs[1:], strict=True)), \
        f"steady: expected {costs[1:]}, got {steady}"


def judge_measure_visible(observed: Any, ctx: Context) -> None:
    (got,) = observed.get("cases") or [None]
    _measure(got, lab05_checks.measure_compile_cases(ctx.seed)[0])


def judge_measure_hidden(observed: Any, ctx: Context) -> None:
    cases = lab05_checks.measure_compile_cases(ctx.seed)[1:]
    got = observed.get("cases")
    assert isinstance(got, list) and len(got) == len(cases), "no result for every case"
    for case, one in zip(cases, got, strict=True):
        _measure(one, case)
    for steps, bad in zip((0, -2), observed.get("bad") or [None, None], strict=True):
        assert isinstance(bad, dict) and bad.get("raised") == "ValueError", f"steps={steps} should raise ValueError"
        assert "steps" in str(bad.get("message", "")), f"the error should name steps: {bad.get('message')}"
    reset = observed.get("reset") or {}
    assert "raised" not in reset, f"measure_compile raised {reset.get('raised')}: {reset.get('message', '')}"
    assert reset.get("count") == 3, (
        f"measuring an already-compiled function twice compiled it {(reset.get('count') or 1) - 1} time(s) instead "
        "of 2: call torch._dynamo.reset() before build(), or the first call reuses earlier compiled code")


def judge_compiled(observed: Any, ctx: Context) -> None:
    mode = observed.get("mode")
    mode = mode if isinstance(mode, str) and mode in lab05.COMPILE_MODES else "default"
    lab05_checks.compiled_from(observed.get("observed"), mode, seed=ctx.seed % 1000)


def _break_even(observed: Any, cases: Any) -> None:
    values = observed.get("values")
    assert isinstance(values, list) and len(values) == len(cases), "no result for every case"
    for (c, e, k), got in zip(cases, values, strict=True):
        value = _value(got, f"break_even_steps({c!r}, {e!r}, {k!r})")
        number = decode_float(value)
        want = reference_break_even(c, e, k)
        assert number is not None and _break_even_ok(number, c, e, k), (
            f"break_even_steps({c!r}, {e!r}, {k!r}) = {value!r}, expected {want!r}"
            + (" (no saving per step: it never pays, math.inf)" if want == math.inf else ""))
    bad = observed.get("bad")
    assert isinstance(bad, list) and len(bad) == len(lab05_checks.BREAK_EVEN_BAD), "no result for the bad arguments"
    for (args, name), got in zip(lab05_checks.BREAK_EVEN_BAD, bad, strict=True):
        assert isinstance(got, dict) and got.get("raised") == "ValueError", (
            f"break_even_steps{args} should raise ValueError naming {name}")
        assert name in str(got.get("message", "")), f"break_even_steps{args}: the error should name {name}: {got.get('message')}"


def judge_break_even_visible(observed: Any, ctx: Context) -> None:
    _break_even(observed, lab05_checks.BREAK_EVEN_VISIBLE)


def judge_break_even_hidden(observed: Any, ctx: Context) -> None:
    _break_even(observed, lab05_checks.break_even_cases(ctx.seed))


def _no_recompile(observed: Any, cases: list[Mapping[str, int]]) -> None:
    assert isinstance(observed, list) and len(observed) == len(cases), "no result for every data set"
    for case, got in zip(cases, observed, strict=True):
        size, batch = case["size"], case["batch"]
        where = f"{size} samples in batches of {batch}"
        assert isinstance(got, dict), f"{where}: no result"
        if "raised" in got:
            raise AssertionError(f"{where}: no_recompile_setup raised {got['raised']}: {got.get('message', '')}")
        count = got.get("count")
        assert isinstance(count, int) and count >= 1, (
            f"{where}: no graph reached the backend you were given: compile with torch.compile(..., backend=backend)")
        assert count == 1, (f"{where}: {count} graphs were compiled over two epochs, one expected. Dynamo recompiled "
                            "because: " + "; ".join(map(str, got.get("reasons") or [])))
        data = lab05.IndexedFeatures(size, case["features"], case["classes"], seed=case["data_seed"])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(case["model_seed"])
            model = torch.nn.Sequential(torch.nn.Linear(case["features"], 16), torch.nn.GELU(),
                                        torch.nn.Linear(16, case["classes"]))
        with torch.no_grad():
            want = model(data.x[:batch])
        out = lab05_checks.decoded_tensor(got.get("output"))
        assert out is not None and out.shape == want.shape and torch.allclose(out, want, atol=1e-5), (
            f"{where}: the compiled model's outputs differ from the model's")
        seen = got.get("epochs")
        assert isinstance(seen, list) and len(seen) == 2, f"{where}: two epochs were asked for"
        for e, batches in enumerate(seen):
            flat = [i for b in batches for i in b]
            assert len(flat) == len(set(flat)), f"{where}: epoch {e + 1} repeats samples"
            assert set(flat) <= set(range(size)), f"{where}: epoch {e + 1} yields samples not in the data set"
            assert len(flat) > size - batch, (f"{where}: epoch {e + 1} trained on {len(flat)} samples; at most the "
                                              f"ragged tail ({size % batch}) may be dropped")
            assert all(len(b) == batch for b in batches[:-1]), f"{where}: epoch {e + 1} has a short batch before the last"
        assert seen[0] != seen[1] or len(seen[0]) == 1, f"{where}: both epochs came in the same order; shuffle"


def judge_no_recompile_visible(observed: Any, ctx: Context) -> None:
    _no_recompile(observed, lab05_checks.no_recompile_cases(ctx.seed)[:1])


def judge_no_recompile_hidden(observed: Any, ctx: Context) -> None:
    _no_recompile(observed, lab05_checks.no_recompile_cases(ctx.seed))


def judge_choice(observed: Any, ctx: Context) -> Mark:
    from perflab.labs import common

    assert isinstance(observed, dict) and "choice" in observed, "CHOICE could not be read"
    choice = observed["choice"]
    problems = lab05.choice_problems(choice)
    assert not problems, problems[0]
    claim = decode_float(observed.get("claim"))
    claim = claim if claim is not None and math.isfinite(claim) and claim > 0 else None
    s = lab05.sizes(ctx.mode)
    baseline, candidate = lab05.sides(choice, ctx.mode)
    verdict, expectation = common.verify_against_bar(baseline, candidate, lab05.expectation_name(ctx.mode),
                                                     claim=claim, max_pairs=s.verify_max_pairs,
                                                     max_seconds=s.verify_seconds, decision=True)
    mark = predict.with_reason(common.mark_of(verdict, expectation), "WHY_CHOICE", observed.get("why"),
                               "why your measurements support CHOICE")
    return dataclasses.replace(mark, decision={"choice": choice})  # what lab 6 starts from


JUDGES = {
    "test_graph_breaks_visible": judge_breaks_visible,
    "test_graph_breaks_hidden": judge_breaks_hidden,
    "test_fixed_visible": judge_fixed_visible,
    "test_fixed_hidden": judge_fixed_hidden,
    "test_measure_compile_visible": judge_measure_visible,
    "test_measure_compile_hidden": judge_measure_hidden,
    "test_compiled_matches_eager": judge_compiled,
    "test_break_even_visible": judge_break_even_visible,
    "test_break_even_hidden": judge_break_even_hidden,
    "test_no_recompile_visible": judge_no_recompile_visible,
    "test_no_recompile_hidden": judge_no_recompile_hidden,
    "test_choice_verified": judge_choice,
    **{f"test_predict_{key}": predict.judger(name, why) for key, (name, why) in lab05.PREDICTIONS.items()},
}


def check(grade_id: str, namespace: Mapping[str, Any], seed: int = 0) -> None:
    """A solution notebook's hidden block: this cell's probe and judge, in this process."""
    check_here(lab05.LAB, grade_id, namespace, seed)
