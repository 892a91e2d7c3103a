"""Which re-measured cells of the labs being graded have no calibrated bar on the grading machine.

A lab's re-measured cell is held to the bar `perflab calibrate` wrote for the grading machine's
hardware class (`autograder/expectations/<class>.json`). Where the class has no file, or the file has
no entry for the lab at the workload it grades, the cell falls back to the conservative rule (no gain
required; a cost no lower than 0.5x), and a student who kept the baseline earns it: on an H100 whose
lab 6 entry was not yet calibrated, lab 6's lazy baseline did. The grader says so before it grades,
one line per cell, and `perflab grade grade --require-calibration` refuses to grade instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


def graded_bars(lab: str, mode: str) -> list[tuple[str, Any]]:
    """(expectations entry, baseline workload or None) of each cell of `lab` re-measured against a bar
    calibrated on the grading machine, at `mode`'s sizes on this machine's device. Lab 1's fix bar is a
    fixed rule, and lab 5's small model (a CPU's or a Mac's) is held to parity by design: neither is listed."""
    from perflab.labs import lab02, lab03, lab04, lab05, lab06

    if lab == lab05.LAB:
        name = lab05.expectation_name(mode)
        return [] if name == lab05.EXPECTATION_SMALL else [(name, lab05.sides(None, mode)[0])]
    module = {m.LAB: m for m in (lab02, lab03, lab04, lab06)}.get(lab)
    return [] if module is None else [(module.EXPECTATION, module.baseline_config(mode))]


def uncalibrated(labs: Iterable[str], mode: str, machine: Any = None, directory: Path | None = None) -> list[str]:
    """One line for each re-measured cell of `labs` that has no calibrated bar here, saying what it is held
    to instead and how to calibrate it. The workloads are those of this machine's device; `machine` (a
    hardware class, or this machine's by default) names the file they are looked up in."""
    from perflab.verify import load_expectation

    lines = []
    for lab in sorted(set(labs)):
        for name, workload in graded_bars(lab, mode):
            bar = load_expectation(name, machine, directory=directory, workload=workload)
            if not bar.calibrated:
                lines.append(f"{lab}: no calibrated bar for its re-measured cell here ({bar.reason}); run "
                             "`perflab calibrate` (on a GPU, `make gpu-check`) on this machine first")
    return lines
