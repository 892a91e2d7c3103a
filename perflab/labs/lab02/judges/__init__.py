"""Lab 02's judges: the grader's decision on every autograded cell, from the observations the lab's
probes (`perflab.labs.lab02.probes.PROBES`) returned. Grader-only: the student bundle and the grading
sandbox leave this module out.

Each judge draws the probe's inputs again from the grader's seed, computes the reference answer here
and compares (AssertionError on the first problem: the message is the student's feedback line).
`JUDGES` maps grade ids to judges; `perflab.grading.judging` runs them in the grading parent, and a
solution notebook's hidden blocks run probe and judge in-process with `check(grade_id, globals())`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from perflab.grading.judging import Context, Mark, check_here
from perflab.grading.probing import decode_float
from perflab.labs import lab02, predict
from perflab.labs.lab02 import DEFAULT_TOLERANCE
from perflab.labs.lab02 import checks as lab02_checks
from perflab.labs.lab02.augment import VISIBLE_AUGMENT_CASE, augment_case, augment_problems
from perflab.labs.lab02.checks import (
    DATA_WAIT_BAD_STEPS,
    PICK_WORKERS_BAD,
    SLOW_LOADER_S,
    SLOW_STEP_S,
    VISIBLE_LOADER_CASES,
    data_wait_cases,
    epochs_problems,
    make_loader_cases,
    order_cases,
    orders_problems,
)
from perflab.workload import TrainConfig

# Seconds within which a fake-clock measurement is exact (its inputs are multiples of 2**-10).
EXACT = 1e-9


# ---------------------------------------------------------------------------------------------
# The answer key: the reference BEST (the student's kit holds the contract, `perflab.labs.lab02`, only)


def reference_best(mode: str | None = None) -> TrainConfig:
    """The reference loader calibration times against the baseline (`perflab.verify.calibrate`, entry
    `lab02.EXPECTATION`): the bar a student's BEST is held to."""
    from perflab.verify.calibrate import REFERENCE_CHANGES

    return lab02.baseline_config(mode).replace(**REFERENCE_CHANGES[lab02.EXPECTATION])


def check(grade_id: str, namespace: Mapping[str, Any], seed: int = 0) -> None:
    """A solution notebook's hidden block: this cell's probe and judge, in this process."""
    check_here(lab02.LAB, grade_id, namespace, seed)


def _cases(observed: Any, count: int) -> list[Any]:
    assert isinstance(observed, list) and len(observed) == count, "the probe returned no result for every case"
    return observed


def judge_loader_visible(observed: Any, ctx: Context) -> None:
    for case, seen in zip(VISIBLE_LOADER_CASES, _cases(observed, len(VISIBLE_LOADER_CASES)), strict=True):
        problems = epochs_problems(seen, *case)
        assert not problems, problems[0]


def judge_loader_random(observed: Any, ctx: Context) -> None:
    cases = make_loader_cases(ctx.seed)
    for (size, batch, workers, seed, options), seen in zip(cases, _cases(observed, len(cases)), strict=True):
        problems = epochs_problems(seen, size, batch, workers, seed=seed, **options)
        assert not problems, problems[0]


def judge_loader_order(observed: Any, ctx: Context) -> None:
    cases = order_cases(ctx.seed)
    for (size, _batch, seed, workers), seen in zip(cases, _cases(observed, len(cases)), strict=True):
        problems = orders_problems(seen, size, seed=seed, workers=workers)
        assert not problems, problems[0]


def _numbers(values: Any) -> list[float]:
    assert isinstance(values, list), f"expected a list of seconds, got {values!r}"[:200]
    out = [decode_float(v) for v in values]
    assert all(v is not None for v in out), f"expected numbers, got {values!r}"[:200]
    return out  # type: ignore[return-value]


def _expect_data_wait(got: Any, case: dict[str, Any]) -> None:
    assert isinstance(got, dict), "no result"
    if "raised" in got:
        raise AssertionError(f"measure_data_wait raised {got['raised']}: {got.get('message', '')}")
    assert got.get("type") == "DataWait", f"measure_data_wait should return a DataWait, got {got.get('type')}"
    steps = case["steps"]
    assert got.get("iterations") == 1, f"iter(batches) was called {got.get('iterations')} times, expected once"
    startup = decode_float(got.get("startup"))
    assert startup is not None and abs(startup - case["startup"]) < EXACT, (
        f"startup: expected {case['startup']} s (the cost of iter()), got {got.get('startup')}")
    for name, expected in (("wait", case["delays"][:steps]), ("compute", case["costs"][:steps])):
        value = _numbers(got.get(name))
        assert len(value) == steps and all(abs(a - b) < EXACT for a, b in zip(value, expected, strict=True)), (
            f"{name}: expected {expected} for {steps} steps, got {value}")
    assert got.get("sizes") == case["sizes"][:steps], f"sizes: expected {case['sizes'][:steps]}, got {got.get('sizes')}"


def judge_data_wait_visible(observed: Any, ctx: Context) -> None:
    (got,) = _cases(observed.get("cases"), 1)
    _expect_data_wait(got, data_wait_cases(ctx.seed)[0])


def judge_data_wait_hidden(observed: Any, ctx: Context) -> None:
    cases = data_wait_cases(ctx.seed)
    for got, case in zip(_cases(observed.get("cases"), len(cases)), cases, strict=True):
        _expect_data_wait(got, case)
    for (steps, available), got in zip(DATA_WAIT_BAD_STEPS, _cases(observed.get("bad"), len(DATA_WAIT_BAD_STEPS)),
                                       strict=True):
        assert got.get("raised") == "ValueError", (
            f"steps={steps} over {available} batch(es) should raise ValueError, got {got}")
        assert "steps" in got.get("message", ""), f"the error for steps={steps} should name steps: {got.get('message')}"
    wall = observed.get("wall") or {}
    assert "raised" not in wall, f"measure_data_wait raised {wall.get('raised')} on a real loader"
    wait, compute = _numbers(wall.get("wait")), _numbers(wall.get("compute"))
    assert len(wait) == len(compute) == 2, f"two steps were asked for, got wait {wait}, compute {compute}"
    assert min(wait) >= SLOW_LOADER_S - 0.005 and min(compute) >= SLOW_STEP_S - 0.001 and max(compute) < min(wait), (
        f"a loader sleeping {SLOW_LOADER_S * 1000:.0f} ms and a step sleeping {SLOW_STEP_S * 1000:.0f} ms gave wait "
        f"{wait}, compute {compute}: time with the wall clock (time.perf_counter), never CPU time")


def _reference_pick(sweep: dict[int, float], tolerance: float | None) -> int:
    tolerance = DEFAULT_TOLERANCE if tolerance is None else tolerance
    best = max(sweep.values())
    return min(n for n, v in sweep.items() if v >= (1 - tolerance) * best)


def judge_pick_workers(observed: Any, ctx: Context) -> None:
    cases = lab02_checks.pick_workers_cases(ctx.seed)
    for (sweep, tol), got in zip(cases, _cases(observed.get("picked"), len(cases)), strict=True):
        expected = _reference_pick(sweep, tol)
        call = f"pick_workers({sweep})" if tol is None else f"pick_workers({sweep}, {tol})"
        assert "raised" not in got, f"{call} raised {got['raised']}: {got.get('message', '')}"
        value = got.get("value")
        assert isinstance(value, int) and not isinstance(value, bool) and value == expected, (
            f"{call} gave {value!r}, expected {expected}")
    for bad, got in zip(PICK_WORKERS_BAD, _cases(observed.get("bad"), len(PICK_WORKERS_BAD)), strict=True):
        assert got.get("raised") == "ValueError", f"pick_workers({bad}) should raise ValueError, got {got}"


def judge_augment_visible(observed: Any, ctx: Context) -> None:
    problems = augment_problems(observed, VISIBLE_AUGMENT_CASE)
    assert not problems, problems[0]


def judge_augment_hidden(observed: Any, ctx: Context) -> None:
    """The student's kornia pipeline on a picture of another size and other colours, with rising or falling
    ramps (`lab02_augment.augment_case`): per-image crops, flips and jitter on the batch's device."""
    problems = augment_problems(observed, augment_case(ctx.seed))
    assert not problems, problems[0]


def exported_best(observed: Any, ctx: Context) -> TrainConfig:
    """BEST as the notebook exported it, rebuilt here from its fields (a non-TrainConfig fails)."""
    assert isinstance(observed, dict), "BEST could not be read"
    if observed.get("config") is None:
        raise AssertionError(f"BEST: expected a perflab.workload.TrainConfig, got {observed.get('type')}")
    try:
        return TrainConfig.from_dict(dict(observed["config"]))
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"BEST is not a valid TrainConfig: {exc}") from None


def judge_best_samples(observed: Any, ctx: Context) -> None:
    best = exported_best(observed, ctx)
    lab02_checks.check_best(best, ctx.mode)
    measured_at_home(best, ctx)


def measured_at_home(best: TrainConfig, ctx: Context) -> None:
    """BEST's worker count must be one the notebook's own sweep measured at home (or the baseline's, kept
    after measuring): a loader typed in from elsewhere (a classmate's 8 workers where this machine's sweep
    went to 4) earns the re-measurement's points only. A submission whose decision record names no sweep
    (not run at home: its sweep then ran in the grading kernel) is not judged on it, and neither is one
    made on another kind of device than the grader's: there the notebook decided again from the grading
    run's own sweep (a laptop's sweep went to 4 workers, a GPU server's to 8)."""
    from perflab.labs import homework

    if ctx.measured_at_home is None:  # no submission was read: a solution checking itself, the kit's tests
        return
    if best.num_workers == lab02.baseline_config(ctx.mode).num_workers:
        return
    here = homework.device_kind()
    sweeps = [e["value"]["swept"] for e in ctx.measured_at_home
              if e.get("kind") == "lab02.best" and isinstance(e.get("value"), dict)
              and isinstance(e["value"].get("swept"), list)
              and isinstance(e.get("key"), dict) and e["key"].get("device") == here]
    if not sweeps or any(best.num_workers in counts for counts in sweeps):
        return
    raise AssertionError(homework.unmeasured_note("BEST", f"{best.num_workers} loader workers", ctx.measured_at_home)
                         + f" (your sweep measured {', '.join(str(n) for n in sweeps[-1])} workers)")


def judge_best_verified(observed: Any, ctx: Context) -> Mark:
    from perflab.labs import common

    best = exported_best(observed, ctx)
    problems = lab02.best_problems(best, ctx.mode)
    assert not problems, problems[0]
    claim = decode_float(observed.get("claim"))
    claim = claim if claim is not None and math.isfinite(claim) and claim > 0 else None
    s = lab02.sizes(ctx.mode)
    verdict, expectation = common.verify_against_bar(lab02.baseline_config(ctx.mode), best, lab02.EXPECTATION,
                                                     claim=claim, max_pairs=s.verify_max_pairs,
                                                     max_seconds=s.verify_seconds, decision=True)
    mark = predict.with_reason(common.mark_of(verdict, expectation), "WHY_BEST", observed.get("why"),
                               "why your measurements make BEST your loader")
    return dataclasses.replace(mark, decision={"config": best.to_dict()})  # what lab 6 starts from


JUDGES = {
    "test_make_loader_visible": judge_loader_visible,
    "test_make_loader_random": judge_loader_random,
    "test_make_loader_order": judge_loader_order,
    "test_measure_data_wait_visible": judge_data_wait_visible,
    "test_measure_data_wait_hidden": judge_data_wait_hidden,
    "test_pick_workers": judge_pick_workers,
    "test_make_augment_visible": judge_augment_visible,
    "test_make_augment_hidden": judge_augment_hidden,
    "test_best_samples": judge_best_samples,
    "test_best_verified": judge_best_verified,
    **{f"test_predict_{key}": predict.judger(name, why) for key, (name, why) in lab02.PREDICTIONS.items()},
}
