"""Lab 2's measuring helpers: how the notebook times two loader configurations against each other,
and how its loader measurements travel from the home run to the grader.

`measured` records each of the notebook's loader measurements at home and replays it when graded.
`loader_pace` gives `timing.compare` the block size and lead-in that time each side at the pace its
loader sustains, as the grader's re-measurement does (`perflab.verify.pace`). It needs nothing of the
contract `perflab.labs.lab02`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from perflab.labs import homework
from perflab.workload import TrainConfig

T = TypeVar("T")


def loader_pace(baseline: TrainConfig, candidate: TrainConfig, block_size: int) -> dict[str, Any]:
    """`timing.compare`'s `block_size` and `lead_in` that time two loader configurations at the pace
    their loaders sustain (`perflab.verify.pace`, as the grader's re-measurement does): while one runs,
    the other's workers fill their queue, which a short block would read at no cost (docs/DESIGN.md
    gives what short blocks timed against the sustained pace)."""
    from perflab.verify import pace

    queues = [pace.queued_batches(c.num_workers, c.prefetch_factor) for c in (baseline, candidate)]
    return {"block_size": max(block_size, pace.min_block_steps(*queues)),
            "lead_in": (pace.lead_in(queues[0]), pace.lead_in(queues[1]))}


def compare_loaders(baseline: TrainConfig, candidate: TrainConfig, sizes: Any) -> Any:
    """The decision's comparison: `candidate`'s training step against `baseline`'s in interleaved blocks at
    their loaders' pace (`loader_pace`), `sizes.compare_blocks` blocks, a `perflab.timing.Comparison`. At
    home it runs and is recorded in the cell's output; in the grading kernel it is the home run's for the
    same two loaders on the same kind of device (it is the kit's code, so the loaders and the device are
    all it depends on), else it runs at the budget in force. A BEST decided from it is decided again by
    the submitted code in the grading kernel, from the same figures, not from a noisier run of its own."""
    from perflab import timing, workload

    def measure() -> Any:
        a, b = workload.build(baseline), workload.build(candidate)
        try:
            return timing.compare(lambda: workload.train_step(a), lambda: workload.train_step(b),
                                  blocks=sizes.compare_blocks, labels=("baseline", "candidate"),
                                  **loader_pace(baseline, candidate, sizes.compare_block_size))
        finally:
            a.close()
            b.close()

    fields = sorted(name for name, group in homework.CHANGE_GROUPS.items() if group == "loader")
    key = {"loaders": [{name: getattr(c, name) for name in fields} for c in (baseline, candidate)],
           "device": candidate.device_type}
    return homework.measured("lab02.compare", key, measure, quick=measure, encode=homework.comparison_value,
                             decode=homework.comparison_from, what="comparison of your loader",
                             quick_budget=f"{sizes.compare_blocks} blocks")


def measured(cell: str, measure: Callable[..., T], *args: Any, device: Any, sizes: Any, code: Sequence[Any] = ()) -> T:
    """`measure(*args)`, one of the notebook's loader measurements (its sweep, the crowded run, epoch
    starts, the prefetch sweep): at home it runs and its figures are recorded in the cell's output
    (`homework.measured`); in the grading kernel they are the home run's, made on the same kind of
    `device` with the same `args` by the same code (`measure` and the student's functions in `code`, by
    digest: a function edited after the saved run measures again). Nothing is re-timed only to be shown:
    the grader re-measures BEST itself. A notebook that carries none measures at the budgets in force
    (`sizes`). `measure` returns a {number: seconds or samples/s, or a list of them} table, or a tuple of
    such tables. Where the record could not be tied to its code and arguments (a function without
    source, such as a `functools.partial`; an argument that is not a whole number) it is neither recorded
    nor replayed: the cell measures, as it did before records."""
    digest = homework.code_digest(measure, *code)
    try:
        counts = [operator.index(a) for a in args]  # a numpy integer from the student's pick_workers too
    except TypeError:
        counts = None
    if digest is None or counts is None:
        return measure(*args)
    key = {"cell": cell, "args": counts, "device": getattr(device, "type", str(device)), "code": digest}
    budget = (f"{sizes.sweep_steps} steps and {sizes.sweep_batches} batches a setting, "
              f"{sizes.sweep_rounds} round(s)")
    return homework.measured(f"lab02.{cell}", key, lambda: measure(*args), quick=lambda: measure(*args),
                             encode=encode_tables, decode=decode_tables, what=f"{cell} measurement",
                             quick_budget=budget)


def encode_tables(result: Any) -> dict[str, Any] | None:
    """A table ({int or bool: number or list of numbers}) or a tuple of tables as JSON data (pairs keep
    the keys' types); None for anything else (kept at home, nothing the grader could replay)."""
    tables = result if isinstance(result, tuple) else (result,)
    if not all(isinstance(t, dict) for t in tables):
        return None
    try:
        value = {"tuple": isinstance(result, tuple),
                 "tables": [[[k, list(map(float, v)) if isinstance(v, (list, tuple)) else float(v)]
                             for k, v in t.items()] for t in tables]}
    except (TypeError, ValueError):
        return None
    if any(not isinstance(k, int) for t in value["tables"] for k, _ in t):
        return None
    figures = [x for t in value["tables"] for _, v in t for x in (v if isinstance(v, list) else [v])]
    return value if all(math.isfinite(x) for x in figures) else None


def decode_tables(value: Any) -> Any:
    """What `encode_tables` recorded; ValueError for anything else (keys not whole numbers or booleans,
    figures not finite numbers)."""
    def number(x: Any) -> float:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"loader record: {x!r} is not a finite number")
        return float(x)

    tables = []
    for pairs in value["tables"]:
        table: dict[Any, Any] = {}
        for k, v in pairs:
            if not isinstance(k, int):
                raise ValueError(f"loader record: key {k!r} is not a count")
            table[k] = [number(x) for x in v] if isinstance(v, list) else number(v)
        tables.append(table)
    if not tables or (not value["tuple"] and len(tables) != 1):
        raise ValueError("loader record: no table")
    return tuple(tables) if value["tuple"] else tables[0]
