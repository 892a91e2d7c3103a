"""Lab 6's check machinery: what the visible checks, the grader's probes and its judges run.

The rows stored for the visible `cumulative_speedups` example (`CUMULATIVE_FILE`, `stored_cumulative`)
and what is wrong with a student's rows (`rows_problems`); random ablations and tables drawn from a
seed for the hidden checks (`cumulative_cases`, `table_cases`) with the visible inputs
(`VISIBLE_ABLATION`, `VISIBLE_TABLES`); what a probe records of one call (`observe_cumulative`,
`read_capped`); and what is wrong with the rendered report (`report_problems`), with the visible checks
the notebook's test cells call (`cumulative_problems`, `check_report`). This module imports the contract
`perflab.labs.lab06`, never the reverse; the probes (`perflab.labs.lab06.probes`) run these, and the
grader-only `perflab/labs/lab06/judges/` judges with them.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from perflab.labs.lab06 import CI_SEED, LAB, PARITY, QUANTILE

# ---------------------------------------------------------------------------------------------
# The visible cumulative_speedups example and what is wrong with a student's rows


CUMULATIVE_FILE = Path(__file__).with_name("cumulative.json")


def stored_cumulative(measurements: Mapping[str, Sequence[float]], quantile: float = QUANTILE,
                      seed: int = CI_SEED, path: str | Path | None = None) -> list[dict[str, Any]]:
    """The rows `cumulative_speedups` must return for a visible example, stored in CUMULATIVE_FILE
    (or `path`); ValueError for an ablation not stored there."""
    path = Path(path) if path is not None else CUMULATIVE_FILE
    cases = json.loads(path.read_text(encoding="utf-8"))["cases"]
    given = {str(k): [float(t) for t in v] for k, v in measurements.items()}
    for case in cases:
        if case["measurements"] == given and case["quantile"] == quantile and case["seed"] == seed:
            return [dict(row) for row in case["rows"]]
    raise ValueError(f"no stored rows for this ablation (quantile {quantile}, seed {seed}); {path.name} holds "
                     f"{len(cases)} visible example(s). Other ablations need their rows passed as expected=")


def close_to(a: Any, b: Any, rel: float = 1e-9) -> bool:
    """Is `a` a real number (not a bool) within `rel` of `b`?"""
    return isinstance(a, (int, float)) and not isinstance(a, bool) and math.isclose(float(a), float(b),
                                                                                       rel_tol=rel, abs_tol=1e-12)


def rows_problems(got: Any, measurements: Mapping[str, Sequence[float]], want: Sequence[Mapping[str, Any]],
                  quantile: float = QUANTILE) -> list[str]:
    """What is wrong with rows `got` for this ablation, against the rows it must give (`want`)."""
    where = f"{len(measurements)} configurations of {len(next(iter(measurements.values())))} blocks"
    if not isinstance(got, list) or len(got) != len(want):
        n = len(got) if isinstance(got, list) else type(got).__name__
        return [f"{where}: expected a list of {len(want)} rows (one per configuration after the baseline), got {n}"]
    base_q = float(np.quantile(np.asarray(next(iter(measurements.values())), float), quantile))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(g, Mapping):
            return [f"{where}: row {i} should be a dict, got {type(g).__name__}"]
        if g.get("name") != w["name"]:
            return [f"{where}: row {i} is named {g.get('name')!r}, expected {w['name']!r} (keep the ablation order)"]
        if not close_to(g.get("speedup"), w["speedup"]):
            times = list(measurements.values())[i + 1]
            prev = list(measurements.values())[i]
            chained = float(np.quantile(np.asarray(prev, float), quantile)) / float(
                np.quantile(np.asarray(times, float), quantile))
            median = float(np.median(next(iter(measurements.values())))) / float(np.median(times))
            hint = ""
            if close_to(g.get("speedup"), chained, 1e-6) and i > 0:
                hint = " (that is the speedup over the previous configuration: measure against the ORIGINAL baseline)"
            elif close_to(g.get("speedup"), median, 1e-6):
                hint = f" (that is the ratio of medians: use the {quantile} quantile)"
            return [f"{where}: {w['name']}: speedup {g.get('speedup')!r}, expected {w['speedup']:.6g} "
                    f"= q(baseline) {base_q:.4g} / q({w['name']}){hint}"]
        ci = g.get("ci")
        if not (isinstance(ci, (list, tuple)) and len(ci) == 2 and all(close_to(a, b) for a, b in zip(ci, w["ci"], strict=True))):
            return [f"{where}: {w['name']}: ci {ci!r}, expected {w['ci']} from ratio_ci(baseline, its times, "
                    "quantile, seed) (paired: block i of both were timed in the same round)"]
        if g.get("cumulative") is not True:
            return [f"{where}: {w['name']}: rows must say 'cumulative': True (each is against the original baseline)"]
    return []


def cumulative_problems(fn: Callable[..., Any], measurements: Mapping[str, Sequence[float]],
                        expected: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> list[str]:
    """Does `fn(measurements, **kwargs)` return the contract's rows for this ablation? The rows it must
    return are `expected`, by default those stored for the visible example (`stored_cumulative`)."""
    copy = {k: list(v) for k, v in measurements.items()}
    want = list(expected) if expected is not None else stored_cumulative(
        measurements, kwargs.get("quantile", QUANTILE), kwargs.get("seed", CI_SEED))
    got = fn(measurements, **kwargs)
    if dict(measurements) != copy:
        return ["cumulative_speedups changed its input measurements"]
    return rows_problems(got, measurements, want, kwargs.get("quantile", QUANTILE))


# ---------------------------------------------------------------------------------------------
# Random problems for the hidden checks, drawn from a seed, and what a probe records


VISIBLE_ABLATION = {"baseline": [1.0, 1.2, 1.1, 1.0], "+ workers": [0.5, 0.6, 0.5, 0.55],
                    "+ bf16": [0.25, 0.3, 0.26, 0.25]}
VISIBLE_TABLES = ([{"name": "a", "speedup": 2.0, "ci": [1.9, 2.1]}, {"name": "b", "speedup": 4.0, "ci": [3.8, 4.2]}],
                  [{"name": "a", "speedup": 1.5}, {"name": "b", "speedup": 1.0}])
# The largest report and results file the grader reads back (a report embeds its figures as PNG).
REPORT_CAP_BYTES = 6 * 1024 * 1024


def random_measurements(rng: Any, configs: int | None = None, blocks: int | None = None) -> dict[str, list[float]]:
    """A random ablation: a baseline, then configs that each add a change with a random true speedup,
    timed in noisy blocks (lognormal jitter plus occasional interference that only adds time)."""
    configs = configs if configs is not None else rng.randint(1, 5)
    blocks = blocks if blocks is not None else rng.randint(4, 24)
    level = rng.uniform(0.02, 2.0)
    names = ["baseline"] + [f"{rng.choice(['+ workers', '+ bf16', '+ channels_last', '+ compile', '+ ckpt'])}"
                            f" #{i}" for i in range(1, configs + 1)]
    out: dict[str, list[float]] = {}
    for name in names:
        noise = rng.uniform(0.005, 0.1)
        out[name] = [level * math.exp(rng.gauss(0, noise)) * (1 + (rng.random() < 0.15) * rng.uniform(0, 0.6))
                     for _ in range(blocks)]
        level /= rng.uniform(0.6, 2.5)
    return out


def random_rows(rng: Any, n: int | None = None, final: float | None = None) -> list[dict[str, Any]]:
    """Random cumulative rows (each with a CI around it); `final` pins the last speedup."""
    n = n if n is not None else rng.randint(1, 6)
    level, rows = 1.0, []
    for i in range(n):
        level *= math.exp(rng.gauss(0.15, 0.3))
        if final is not None and i == n - 1:
            level = final
        width = rng.uniform(0.01, 0.2) * level
        rows.append({"name": f"change {i + 1}", "speedup": level, "ci": [level - width, level + width],
                     "cumulative": True})
    return rows


def cumulative_cases(seed: int, cases: int = 12) -> tuple[list[tuple[dict[str, list[float]], dict[str, Any]]],
                                                          list[tuple[dict[str, list[float]], str]]]:
    """(random ablations with their keyword arguments, bad inputs with what is wrong) drawn from `seed`."""
    rng = random.Random(seed)
    good = []
    for case in range(cases):
        m = random_measurements(rng)
        kwargs: dict[str, Any] = {}
        if case % 3 == 1:
            kwargs["quantile"] = rng.choice([0.1, 0.5, 0.8])
        if case % 4 == 2:
            kwargs["seed"] = rng.randint(1, 10_000)
        good.append((m, kwargs))
    ok = random_measurements(rng, configs=2, blocks=6)
    base = ok["baseline"]
    bad = [({"baseline": base}, "only the baseline"),
           ({"baseline": base, "short": base[:3]}, "another number of blocks"),
           ({"baseline": base[:1], "one": base[:1]}, "a single block"),
           ({"baseline": base, "neg": [-1.0] + base[1:]}, "a negative time"),
           ({"baseline": base, "nan": [float("nan")] + base[1:]}, "a NaN time"),
           ({"baseline": base, "zero": [0.0] * len(base)}, "zero times")]
    return good, bad


def table_cases(seed: int, cases: int = 15) -> tuple[list[list[dict[str, Any]]], list[tuple[list[dict[str, Any]], float]]]:
    """(random ablations, some ending within PARITY of 1.0 and some losing time; rows with a bad speedup)."""
    rng = random.Random(seed)
    good = []
    for case in range(cases):
        final = None
        if case % 5 == 3:
            final = 1.0 + rng.uniform(-0.6, 0.6) * PARITY
        elif case % 5 == 4:
            final = rng.uniform(0.4, 0.9)
        good.append(random_rows(rng, final=final))
    bad = []
    for value in (0.0, -1.5, float("nan"), float("inf")):
        rows = random_rows(rng, 2)
        rows[1]["speedup"] = value
        bad.append((rows, value))
    return good, bad


def observe_cumulative(fn: Callable[..., Any], measurements: Mapping[str, Sequence[float]],
                       kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """What `fn(measurements, **kwargs)` gave or raised, and whether it changed its input."""
    from perflab.grading.probing import outcome

    copy = {k: list(v) for k, v in measurements.items()}
    got = outcome(fn, measurements, **kwargs)
    return {**got, "mutated": dict(measurements) != copy}


def read_capped(path: Path) -> str | None:
    """The text of a plain file of at most REPORT_CAP_BYTES, else None."""
    if not path.is_file() or path.is_symlink() or path.stat().st_size > REPORT_CAP_BYTES:
        return None
    return path.read_text(encoding="utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# The report


def report_problems(report_path: str | os.PathLike[str], results_path: str | os.PathLike[str]) -> list[str]:
    """Does the HTML report hold every section, and this lab's ablation, memory curve and accuracy?"""
    from perflab import report as rep
    from perflab import results

    path = Path(report_path)
    if not path.is_file():
        return [f"{path}: no report written (render it with perflab.report.write_report)"]
    page = path.read_text(encoding="utf-8")
    try:
        doc = results.load(results_path)
    except results.ResultsError as exc:
        return [f"the report's data is not valid: {exc}"]
    problems = [f"{path}: no section {sid!r}" for sid in rep.SECTION_IDS if f'<section id="{sid}">' not in page]
    sections = doc["sections"]
    if LAB not in page:
        problems.append(f"{path}: {LAB}'s results are not among the report's files")
    if sections.get("speedups") and 'id="fig-speedup-waterfall"' not in page:
        problems.append(f"{path}: the cumulative waterfall is missing from the speedups section")
    if sections.get("memory_vs_batch") and 'id="fig-memory"' not in page:
        problems.append(f"{path}: the memory-against-batch figure is missing")
    if "accuracy" in sections and "Accuracy after a short training run" not in page:
        problems.append(f"{path}: the accuracy kept is missing from the verification section")
    text = (sections.get("analysis") or "").strip()
    if text:
        words = re.findall(r"[A-Za-z]{5,}", text)
        if words and not all(w in page for w in words[:5]):
            problems.append(f"{path}: the written analysis saved in the results is not in the report")
    return problems


def check_report(report_path: str | os.PathLike[str], results_path: str | os.PathLike[str]) -> None:
    """The HTML report holds every section, and this lab's ablation, memory curve, accuracy and analysis."""
    problems = report_problems(report_path, results_path)
    assert not problems, problems[0]
