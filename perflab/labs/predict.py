"""Predict, then measure: the prediction a student writes before a headline measurement, and its check.

Before each headline measurement a lab asks for a named prediction (a number) and one line of why,
in a cell of their own. The measurement cell prints the prediction beside what was measured. A
prediction is graded on being there and being one, never on being right: a person may read the why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# The fewest words a reason can have: "workers overlap decoding" is a reason, "idk" is not.
MIN_WHY_WORDS = 3


def problems(name: str, value: Any, why_name: str, why: Any) -> list[str]:
    """What keeps `value` (the notebook's `name`) and `why` (its `why_name`) from being a prediction."""
    found = []
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        found.append(f"{name}: write your prediction as a positive number (math.inf where that is the answer) "
                     f"before you measure, got {value!r}")
    found += reason_problems(why_name, why, f"why you expect {name}")
    return found


def reason_problems(why_name: str, why: Any, what: str) -> list[str]:
    """What keeps `why` (the notebook's `why_name`) from being one line of reason for `what`."""
    words = why.split() if isinstance(why, str) else []
    if len(words) < MIN_WHY_WORDS:
        return [f"{why_name}: one line (at least {MIN_WHY_WORDS} words) of {what}, got {short(why)}"]
    return []


def short(value: Any, width: int = 80) -> str:
    """`value`'s repr, cut to `width` characters."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def with_reason(mark: Any, why_name: str, why: Any, what: str) -> Any:
    """A decision's re-measured mark with its reason judged: the mark as it is when `why` is a reason,
    else half of it, with the line that says what is missing. A decision is worth its why."""
    from dataclasses import replace

    found = reason_problems(why_name, why, what)
    if not found:
        return mark
    return replace(mark, fraction=mark.fraction / 2,
                   message="; ".join(m for m in (mark.message, found[0] + " (half of this cell)") if m))


def check(name: str, value: Any, why_name: str, why: Any) -> None:
    """The visible check: AssertionError with the first problem."""
    found = problems(name, value, why_name, why)
    assert not found, found[0]


def observe(answers: Any, name: str, why_name: str) -> dict[str, Any]:
    """What the grader reads of a prediction (a probe's output): the value and the why, as plain data."""
    from perflab.grading.probing import encode

    value = answers.get(name)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return {"value": encode(float(value)) if number else None, "type": type(value).__name__,
            "why": reason(answers, why_name)}


def reason(answers: Any, why_name: str) -> str | None:
    """A line of why as a probe sends it: the notebook's string (its first 500 characters), else None."""
    why = answers.get(why_name)
    return why[:500] if isinstance(why, str) else None


def judge(observed: Any, name: str, why_name: str) -> None:
    """A judge: the prediction was written (its value is never compared with a measurement)."""
    from perflab.grading.probing import decode_float

    assert isinstance(observed, dict), f"{name} could not be read"
    value = decode_float(observed.get("value"))
    shown = value if value is not None else f"a {observed.get('type')}"
    found = problems(name, shown, why_name, observed.get("why"))
    assert not found, found[0]


def beside(name: str, predicted: Any, measured: float, unit: str = "x") -> str:
    """One line with the prediction beside the measurement (a missing prediction says so)."""
    def text(value: float) -> str:
        return "never" if value == math.inf else f"{value:.3g}{unit}"

    number = isinstance(predicted, (int, float)) and not isinstance(predicted, bool)
    return f"{name}: predicted {text(predicted) if number else 'nothing (no prediction written)'}, measured {text(measured)}"


def prober(name: str, why_name: str) -> Callable[[Any, int], dict[str, Any]]:
    """The probe of a prediction's graded cell (for a lab's PROBES)."""
    return lambda answers, seed: observe(answers, name, why_name)


def judger(name: str, why_name: str) -> Callable[[Any, Any], None]:
    """The judge of a prediction's graded cell (for a lab's JUDGES)."""
    return lambda observed, ctx: judge(observed, name, why_name)


def row(what: str, predicted: Any, why: Any, measured: Any, unit: str = "x") -> dict[str, Any]:
    """A `predictions` row of a results file: the prediction (None where none was written, or it is no
    finite positive number) and its why beside the measurement, for the report to show side by side."""
    def number(value: Any, positive: bool) -> float | None:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok and (value > 0 or not positive) else None

    return {"name": what, "predicted": number(predicted, True), "why": why[:500] if isinstance(why, str) else None,
            "measured": number(measured, False), "unit": unit}
