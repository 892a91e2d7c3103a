"""For the grader's timed re-measurements: the shared timing lock, and the verification record the
export reads.

    with timed_section():            # holds $PERFLAB_TIMING_LOCK, if set, for the timed work
        ratio = measure(...)
    report_verdict("fast_sum", "pass", speedup=ratio, ci=(lo, hi), claimed=claim)

The local back-end sets PERFLAB_TIMING_LOCK in the grader's process (one file per machine) when it
grades more than one submission at a time, and Ray's tasks on each node: the judges' re-measurements
and the measuring processes they start hold it, so no two overlap. A graded notebook's kernel never
sees it (a submission that held it could hold up every other one's timed cells), so there, as outside
the autograder, the lock is a no-op. `report_verdict` displays a `VERDICT_MIME` output that the
autograder reads from grade cells only (a record displayed by any other cell is ignored).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Sequence
from typing import Any

TIMING_LOCK_ENV = "PERFLAB_TIMING_LOCK"
VERDICT_MIME = "application/vnd.perflab.verdict+json"
VERDICTS = ("pass", "fail", "inconclusive", "deferred")


@contextlib.contextmanager
def timed_section() -> Iterator[None]:
    """Hold the grading run's timing lock (a no-op when none is set)."""
    path = os.environ.get(TIMING_LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def report_verdict(name: str, verdict: str, *, speedup: float | None = None,
                   ci: Sequence[float] | None = None, claimed: float | None = None,
                   hardware_class: str | None = None, reason: str = "") -> dict[str, Any]:
    """Display (in a notebook) and return one verification record for the autograder's export.

    `hardware_class` may be left out: the autograder fills in the class of the machine that graded.
    """
    if verdict not in VERDICTS:
        raise ValueError(f"verdict: must be one of {VERDICTS}, got {verdict!r}")
    record = {"name": name, "verdict": verdict, "speedup": speedup,
              "ci": list(ci) if ci is not None else None, "claimed": claimed,
              "hardware_class": hardware_class, "reason": reason}
    with contextlib.suppress(ImportError):
        from IPython.display import display

        text = f"verification {name}: {verdict}" + (f" ({speedup:.2f}x)" if speedup is not None else "")
        display({VERDICT_MIME: record, "text/plain": text}, raw=True)
    return record
