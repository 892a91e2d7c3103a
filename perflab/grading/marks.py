"""What a judge returns or raises: `Mark` (the fraction of a cell's points, and why) and `Suspicious`.

Shared by the grader (`perflab.grading.judging`, grader-only) and the lab helpers that run in a
student's notebook too (`perflab.labs.common.mark_of`), so it imports nothing of either and ships in
the student bundle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mark:
    """A judge's decision on one cell: the fraction of its points earned, and why."""

    fraction: float
    message: str = ""
    verdict: dict[str, Any] | None = None  # a re-measured speedup's record (name, verdict, speedup, ci, ...)
    flag: str | None = None  # why a person should look at this answer (evidence, never what scores it)
    # What the cell graded as the student's decision (lab 2's BEST as {"config": ...}, lab 5's {"choice": ...}):
    # kept in the grading state, where a later lab that starts from it reads it (lab 6: its manifest's `starts_from`).
    decision: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"fraction: must be within [0, 1], got {self.fraction}")


class Suspicious(AssertionError):
    """Raised by a judge for an answer that fails *and* that a person should look at (a trace no
    profiler wrote, work skipped where the verifier could not see it): 0 points, and flagged."""
