"""Lab 06's judges and the reference answers they compare against; grader-only: the student bundle
and the grading sandbox leave this module out.

Each judge in `JUDGES` decides one autograded cell from what the lab's probe
(`perflab.labs.lab06.PROBES`) returned: it draws the same inputs from the grader's seed, computes the
reference answer here, and raises AssertionError with the student's feedback line on the first
problem. The re-measured speedup and the accuracy run happen here too, from the exported FINAL.
A solution notebook's hidden blocks run probe and judge in-process with `check(grade_id, globals())`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from perflab.grading.judging import Context, Mark, check_here
from perflab.grading.probing import decode_float
from perflab.labs import lab06, lab06_checks, lab06_measure, predict
from perflab.labs.lab06 import CI_SEED, PARITY, QUANTILE, ratio_ci
from perflab.labs.lab06_checks import (
    CUMULATIVE_FILE,
    VISIBLE_ABLATION,
    VISIBLE_TABLES,
    close_to,
    rows_problems,
)
from perflab.workload import TrainConfig

# The visible test cell's example (each change halves the time), whose rows CUMULATIVE_FILE stores.
VISIBLE_EXAMPLES: tuple[dict[str, list[float]], ...] = (VISIBLE_ABLATION,)

# ---------------------------------------------------------------------------------------------
# The reference answers and the checks built on them (the problems in words, empty when all is well)


def reference_cumulative(measurements: Mapping[str, Sequence[float]], quantile: float = QUANTILE,
                         seed: int = CI_SEED) -> list[dict[str, Any]]:
    """What `cumulative_speedups` must return (no input checks)."""
    items = list(measurements.items())
    base = items[0][1]
    q0 = float(np.quantile(np.asarray(base, float), quantile))
    return [{"name": name, "speedup": q0 / float(np.quantile(np.asarray(times, float), quantile)),
             "ci": list(ratio_ci(base, times, quantile, seed)), "cumulative": True} for name, times in items[1:]]


def visible_cumulative() -> dict[str, Any]:
    """CUMULATIVE_FILE's content: each visible example with the rows the reference gives it."""
    return {"about": "expected cumulative_speedups rows of the visible example; written by the grader's "
                     "perflab/labs/hidden/lab06.py (write_visible_cumulative)",
            "cases": [{"measurements": example, "quantile": QUANTILE, "seed": CI_SEED,
                       "rows": reference_cumulative(example)} for example in VISIBLE_EXAMPLES]}


def write_visible_cumulative(path: str | Path = CUMULATIVE_FILE) -> Path:
    """Rewrite the stored rows (after a change to the contract, or to numpy's quantile or bootstrap)."""
    path = Path(path)
    path.write_text(json.dumps(visible_cumulative(), indent=2) + "\n", encoding="utf-8")
    return path


def reference_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What `ablation_table` must return (no input checks)."""
    if not rows:
        return []
    final = math.log(float(rows[-1]["speedup"]))
    out, prev = [], 1.0
    for row in rows:
        cum = float(row["speedup"])
        step = cum / prev
        share = math.log(step) / final if abs(final) >= math.log1p(PARITY) else None
        out.append({"name": row["name"], "cumulative": cum, "ci": row.get("ci"), "step": step, "share": share})
        prev = cum
    return out


def table_problems(got: Any, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What is wrong with `ablation_table(rows)`'s output `got`?"""
    want = reference_table(rows)
    where = f"ablation of {len(rows)} rows (final {rows[-1]['speedup']:.4g}x)" if rows else "no rows"
    if not isinstance(got, list) or len(got) != len(want):
        return [f"{where}: expected a list of {len(want)} records, got {got!r:.120}"]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(g, Mapping):
            return [f"{where}: record {i} should be a dict"]
        for key in ("name", "cumulative", "step"):
            ok = g.get(key) == w[key] if key == "name" else close_to(g.get(key), w[key])
            if not ok:
                return [f"{where}: {w['name']}: {key} {g.get(key)!r}, expected {w[key]!r}"]
        if list(g.get("ci") or []) != list(w["ci"] or []):
            return [f"{where}: {w['name']}: ci {g.get('ci')!r}, expected the row's own {w['ci']!r}"]
        if w["share"] is None:
            if g.get("share") is not None:
                return [f"{where}: {w['name']}: share should be None when the final speedup is within "
                        f"{PARITY:.0%} of 1.0 (no gain to share), got {g.get('share')!r}"]
        elif not close_to(g.get("share"), w["share"], 1e-7):
            return [f"{where}: {w['name']}: share {g.get('share')!r}, expected log(step) / log(final) = "
                    f"{w['share']:.6g}"]
    return []


def _value_error(got: Any, what: str, must_name: str) -> None:
    """`got` (an `outcome`) must be a ValueError whose message names `must_name`."""
    assert isinstance(got, dict), f"{what}: no result"
    if "raised" not in got:
        raise AssertionError(f"{what}: expected ValueError, nothing was raised")
    assert got["raised"] == "ValueError", f"{what}: expected ValueError, got {got['raised']}: {got.get('message', '')}"
    assert must_name in str(got.get("message", "")), f"{what}: the ValueError should name {must_name!r}: {got.get('message')}"


def _value(got: Any, what: str) -> Any:
    assert isinstance(got, dict), f"{what}: no result"
    if "raised" in got:
        raise AssertionError(f"{what} raised {got['raised']}: {got.get('message', '')}")
    return got.get("value")


def _decoded(value: Any) -> Any:
    """Rows as `encode` wrote them, with numbers back as floats (NaN and infinities included)."""
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    if isinstance(value, dict):
        number = decode_float(value) if set(value) == {"float"} else None
        return number if number is not None else {k: _decoded(v) for k, v in value.items()}
    return value


def _cumulative(got: Any, measurements: Mapping[str, Any], kwargs: Mapping[str, Any]) -> None:
    assert isinstance(got, dict), "no result"
    assert got.get("mutated") is False, "cumulative_speedups changed its input measurements"
    rows = _decoded(_value(got, "cumulative_speedups"))
    problems = rows_problems(rows, measurements, reference_cumulative(measurements, **kwargs),
                             kwargs.get("quantile", QUANTILE))
    assert not problems, problems[0]


def config_of(data: Any, name: str) -> TrainConfig:
    """A configuration the notebook exported, rebuilt here from its fields."""
    assert isinstance(data, dict), f"{name} could not be read"
    if data.get("config") is None:
        raise AssertionError(f"{name}: expected a perflab.workload.TrainConfig, got {data.get('type')}")
    try:
        return TrainConfig.from_dict(dict(data["config"]))
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"{name} is not a valid TrainConfig: {exc}") from None


def judge_final_config(observed: Any, ctx: Context) -> None:
    final = config_of(observed.get("final"), "FINAL")
    steps = observed.get("chain")
    if not isinstance(steps, list):
        raise AssertionError("CHAIN: expected a list of (name, TrainConfig) pairs starting with ('baseline', BASELINE)")
    chain = [(step.get("name"), config_of(step, f"CHAIN step {step.get('name')!r}")) for step in steps]
    problems = lab06.final_problems(final, chain, ctx.mode)
    assert not problems, problems[0]


def judge_cumulative_visible(observed: Any, ctx: Context) -> None:
    _cumulative(observed, VISIBLE_ABLATION, {})


def judge_cumulative_hidden(observed: Any, ctx: Context) -> None:
    good, bad = lab06_checks.cumulative_cases(ctx.seed)
    got_good, got_bad = observed.get("good"), observed.get("bad")
    assert isinstance(got_good, list) and len(got_good) == len(good), "no result for every ablation"
    for (m, kwargs), got in zip(good, got_good, strict=True):
        _cumulative(got, m, kwargs)
    assert isinstance(got_bad, list) and len(got_bad) == len(bad), "no result for every bad input"
    for (_, what), got in zip(bad, got_bad, strict=True):
        _value_error(got, f"cumulative_speedups with {what}", "measurements")


def judge_ablation_table(observed: Any, ctx: Context) -> None:
    good, bad = lab06_checks.table_cases(ctx.seed)
    for name, cases in (("visible", list(VISIBLE_TABLES)), ("good", good)):
        got = observed.get(name)
        assert isinstance(got, list) and len(got) == len(cases), "no result for every ablation"
        for rows, result in zip(cases, got, strict=True):
            problems = table_problems(_decoded(_value(result, "ablation_table")), rows)
            assert not problems, problems[0]
    assert _value(observed.get("empty"), "ablation_table([])") == [], "ablation_table([]) should be []"
    got_bad = observed.get("bad")
    assert isinstance(got_bad, list) and len(got_bad) == len(bad), "no result for every bad input"
    for (rows, value), got in zip(bad, got_bad, strict=True):
        _value_error(got, f"ablation_table with a speedup of {value}", rows[1]["name"])


def judge_final_verified(observed: Any, ctx: Context) -> Mark:
    from perflab.labs import common

    final = config_of(observed.get("final"), "FINAL")
    problems = lab06.final_problems(final, mode=ctx.mode)
    assert not problems, problems[0]
    claim = decode_float(observed.get("claim"))
    claim = claim if claim is not None and math.isfinite(claim) and claim > 0 else None
    s = lab06.sizes(ctx.mode)
    verdict, expectation = common.verify_against_bar(lab06.baseline_config(ctx.mode), final, lab06.EXPECTATION,
                                                     claim=claim, max_pairs=s.verify_max_pairs,
                                                     max_seconds=s.verify_seconds, decision=True)
    return common.mark_of(verdict, expectation)


def judge_accuracy(observed: Any, ctx: Context) -> None:
    """The grader trains the baseline and FINAL itself (fixed seeds) and compares their accuracy."""
    final = config_of(observed.get("final"), "FINAL")
    problems = lab06.final_problems(final, mode=ctx.mode)
    assert not problems, problems[0]
    s = lab06.sizes(ctx.mode)
    acc = lab06_measure.measure_accuracy(lab06.baseline_config(ctx.mode), final, s.accuracy_steps,
                                         image_size=s.accuracy_image_size)
    problems = lab06.accuracy_problems(acc)
    assert not problems, problems[0]


def judge_report(observed: Any, ctx: Context) -> None:
    import tempfile

    report, results = observed.get("report"), observed.get("results")
    assert isinstance(report, str), f"{lab06.REPORT_FILE}: no report written (render it with perflab.report.write_report)"
    assert isinstance(results, str), "the results file the report was made from could not be read"
    with tempfile.TemporaryDirectory(prefix="perflab-report-") as tmp:
        report_path, results_path = Path(tmp) / lab06.REPORT_FILE, Path(tmp) / f"{lab06.LAB}.json"
        report_path.write_text(report, encoding="utf-8")
        results_path.write_text(results, encoding="utf-8")
        problems = lab06_checks.report_problems(report_path, results_path)
    assert not problems, problems[0].replace(str(report_path), lab06.REPORT_FILE)


JUDGES = {
    "test_final_config": judge_final_config,
    "test_cumulative_visible": judge_cumulative_visible,
    "test_cumulative_hidden": judge_cumulative_hidden,
    "test_ablation_table": judge_ablation_table,
    "test_final_verified": judge_final_verified,
    "test_accuracy": judge_accuracy,
    "test_report": judge_report,
    **{f"test_predict_{key}": predict.judger(name, why) for key, (name, why) in lab06.PREDICTIONS.items()},
}


def check(grade_id: str, namespace: Mapping[str, Any], seed: int = 0) -> None:
    """A solution notebook's hidden block: this cell's probe and judge, in this process."""
    check_here(lab06.LAB, grade_id, namespace, seed)


if __name__ == "__main__":
    print(f"wrote {write_visible_cumulative()}")
