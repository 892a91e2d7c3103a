"""Lab 06's hidden checks and the reference answers they compare against; grader-only: the student
bundle leaves this module out.

The hidden test cells of `solutions/lab06_together` import this module inside their `BEGIN HIDDEN
TESTS` blocks and call the `check_*` functions below with the student's functions: random cases
drawn from a seed, AssertionError on the first problem. The contract they check, and the visible
`cumulative_problems` that `check_cumulative_speedups` is built on, are in `perflab/labs/lab06.py`.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from perflab.labs.lab06 import (
    CI_SEED,
    CUMULATIVE_FILE,
    PARITY,
    QUANTILE,
    _close,
    cumulative_problems,
    ratio_ci,
)

# The visible test cell's example (each change halves the time), whose rows CUMULATIVE_FILE stores.
VISIBLE_EXAMPLES: tuple[dict[str, list[float]], ...] = (
    {"baseline": [1.0, 1.2, 1.1, 1.0], "+ workers": [0.5, 0.6, 0.5, 0.55], "+ bf16": [0.25, 0.3, 0.26, 0.25]},
)

# ---------------------------------------------------------------------------------------------
# Random cases


def random_measurements(rng: random.Random, configs: int | None = None, blocks: int | None = None,
                        ) -> dict[str, list[float]]:
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


def random_rows(rng: random.Random, n: int | None = None, final: float | None = None) -> list[dict[str, Any]]:
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


def table_problems(fn: Callable[[Sequence[Mapping[str, Any]]], Any], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Does `fn(rows)` return the contract's records?"""
    got = fn(rows)
    want = reference_table(rows)
    where = f"ablation of {len(rows)} rows (final {rows[-1]['speedup']:.4g}x)" if rows else "no rows"
    if not isinstance(got, list) or len(got) != len(want):
        return [f"{where}: expected a list of {len(want)} records, got {got!r:.120}"]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(g, Mapping):
            return [f"{where}: record {i} should be a dict"]
        for key in ("name", "cumulative", "step"):
            ok = g.get(key) == w[key] if key == "name" else _close(g.get(key), w[key])
            if not ok:
                return [f"{where}: {w['name']}: {key} {g.get(key)!r}, expected {w[key]!r}"]
        if list(g.get("ci") or []) != list(w["ci"] or []):
            return [f"{where}: {w['name']}: ci {g.get('ci')!r}, expected the row's own {w['ci']!r}"]
        if w["share"] is None:
            if g.get("share") is not None:
                return [f"{where}: {w['name']}: share should be None when the final speedup is within "
                        f"{PARITY:.0%} of 1.0 (no gain to share), got {g.get('share')!r}"]
        elif not _close(g.get("share"), w["share"], 1e-7):
            return [f"{where}: {w['name']}: share {g.get('share')!r}, expected log(step) / log(final) = "
                    f"{w['share']:.6g}"]
    return []


def _raises_value_error(fn: Callable[..., Any], *args: Any, must_name: str = "measurements") -> str | None:
    try:
        fn(*args)
    except ValueError as exc:
        if must_name not in str(exc):
            return f"the ValueError should name {must_name!r}: {exc}"
        return None
    except Exception as exc:  # noqa: BLE001 - any other error is the wrong one, reported in words
        return f"expected ValueError, got {type(exc).__name__}: {exc}"
    return "expected ValueError, nothing was raised"


# ---------------------------------------------------------------------------------------------
# The hidden tests: random cases drawn from `seed`, AssertionError on the first problem


def check_cumulative_speedups(fn: Callable[..., Any], seed: int, cases: int = 12) -> None:
    """Random ablations (with the quantile and seed varied), and the bad inputs."""
    rng = random.Random(seed)
    for case in range(cases):
        m = random_measurements(rng)
        kwargs: dict[str, Any] = {}
        if case % 3 == 1:
            kwargs["quantile"] = rng.choice([0.1, 0.5, 0.8])
        if case % 4 == 2:
            kwargs["seed"] = rng.randint(1, 10_000)
        problems = cumulative_problems(fn, m, reference_cumulative(m, **kwargs), **kwargs)
        assert not problems, problems[0]
    good = random_measurements(rng, configs=2, blocks=6)
    base = good["baseline"]
    bad_inputs = [
        ({"baseline": base}, "only the baseline"),
        ({"baseline": base, "short": base[:3]}, "another number of blocks"),
        ({"baseline": base[:1], "one": base[:1]}, "a single block"),
        ({"baseline": base, "neg": [-1.0] + base[1:]}, "a negative time"),
        ({"baseline": base, "nan": [float("nan")] + base[1:]}, "a NaN time"),
        ({"baseline": base, "zero": [0.0] * len(base)}, "zero times"),
    ]
    for bad, what in bad_inputs:
        problem = _raises_value_error(fn, bad)
        assert problem is None, f"cumulative_speedups with {what}: {problem}"


def check_ablation_table(fn: Callable[[Sequence[Mapping[str, Any]]], Any], seed: int, cases: int = 15) -> None:
    """Random ablations, some ending within PARITY of 1.0 and some losing time, and the bad inputs."""
    rng = random.Random(seed)
    for case in range(cases):
        final = None
        if case % 5 == 3:
            final = 1.0 + rng.uniform(-0.6, 0.6) * PARITY
        elif case % 5 == 4:
            final = rng.uniform(0.4, 0.9)
        problems = table_problems(fn, random_rows(rng, final=final))
        assert not problems, problems[0]
    assert fn([]) == [], "ablation_table([]) should be []"
    for bad in (0.0, -1.5, float("nan"), float("inf")):
        rows = random_rows(rng, 2)
        rows[1]["speedup"] = bad
        problem = _raises_value_error(fn, rows, must_name=rows[1]["name"])
        assert problem is None, f"ablation_table with a speedup of {bad}: {problem}"


if __name__ == "__main__":
    print(f"wrote {write_visible_cumulative()}")
