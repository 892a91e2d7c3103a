"""Where lab 1's diagnosis judge measures a pipeline's savings: the measuring process a notebook's
`lab01_mystery.savings` measures in too (`perflab.labs.measuring_server`, a fork of a server that
imported torch once per process and ran no torch op), on copies this process renders from the truth.

    savings = measure(student, mode, timing_lock, timeout_s)   # starts the server on first use
    warm_up()                                                   # start it now, without waiting

The grader's own process grades several notebooks on threads, and torch's thread count is one per
process, so the savings are measured elsewhere; and the student's reading and the grader's are taken
by one function (`lab01_mystery.savings_here`) in one kind of process, so neither's state is in the
difference. Only perflab's own pipelines are sent to the grader's server, never student code.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from perflab.labs import measuring_server
from perflab.labs.lab01.judges import mystery_truth
from perflab.labs.lab01.judges.mystery_truth import BY_KEY

# The state the grader's last measurement was taken in (`measuring_server.measuring_state`).
LAST_STATE: dict[str, Any] = {}

warm_up = measuring_server.warm_up


class SavingsUnmeasured(RuntimeError):
    """The grader could not measure a pipeline's savings (the finding is then judged on line and type)."""


def measure(student: str, mode: str | None, timing_lock: str, timeout_s: float) -> dict[str, float]:
    """What fixing each bug planted for `student` alone saves of its pipeline's step time: the planted
    pipeline beside one copy per bug that costs step time without it (a memory-only bug earns no share
    of the diagnosis, so it is not timed), by the lab's own helper (`lab01_mystery.savings_here`, the
    protocol the student measures with) in a measuring process under `timing_lock`; SavingsUnmeasured
    with the reason where no measurement came back within `timeout_s`."""
    case = mystery_truth.truth(student, mode)
    keys = [p.key for p in case.planted if BY_KEY[p.key].costs_time]
    with tempfile.TemporaryDirectory(prefix="perflab-savings-") as tmp:
        planted = case.write(Path(tmp) / "planted.py")
        copies = [mystery_truth.without(student, mode, key).write(Path(tmp) / f"without_{key}.py") for key in keys]
        try:
            got = measuring_server.call("perflab.labs.lab01.mystery:savings_here",
                                        {"planted": str(planted), "fixed": [str(c) for c in copies]},
                                        timeout_s, timing_lock)
        except measuring_server.MeasurementFailed as exc:
            raise SavingsUnmeasured(str(exc)) from None
    LAST_STATE.clear()
    LAST_STATE.update(got["state"])
    return {key: max(0.0, float(saved)) for key, saved in zip(keys, got["savings"], strict=True)}
