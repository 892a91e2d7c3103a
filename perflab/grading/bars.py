"""Which re-measured cells of the labs being graded have no calibrated bar on the grading machine.

A lab's re-measured cell is held to the bar `perflab calibrate` wrote for the grading machine's
hardware class (`autograder/expectations/<class>.json`, else the course's own calibration,
`perflab.grading.self_calibration`). Where neither has the entry at the workload the lab grades, the cell
falls back to the conservative rule (no gain required; a cost no lower than 0.5x), and a student who kept
the baseline earns it: on an H100 whose lab 6 entry was not yet calibrated, lab 6's lazy baseline did. So
`perflab grade grade` calibrates such entries first; where it does not (`--no-calibration`, the Ray
back-end, a calibration that measured nothing) it says so before it grades, one line per cell, and
`--require-calibration` refuses to grade instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


def graded_bars(lab: str, mode: str) -> list[tuple[str, Any]]:
    """(expectations entry, baseline workload or None) of each cell of `lab` re-measured against a bar
    calibrated on the grading machine, at `mode`'s sizes on this machine's device, as the lab's manifest
    declares them (`perflab.labs.registry.graded_bars`). A fixed-rule bar (lab 1's fix) or a cell held to
    parity by design (lab 5's small model) is not listed."""
    from perflab.labs import registry

    return registry.graded_bars(lab, mode)


def held_to_rules(labs: Iterable[str], mode: str, machine: Any = None,
                  directory: Path | None = None) -> dict[str, list[tuple[str, Any]]]:
    """{lab: [(expectations entry, the conservative `Expectation` it falls back to)]} for each re-measured
    cell of `labs` that has no calibrated bar here (labs with none left out). Read from `directory`, else
    from the folders of `expectations.search_path()` (the committed ones, then a run's own)."""
    from perflab.verify import load_expectation

    held: dict[str, list[tuple[str, Any]]] = {}
    for lab in sorted(set(labs)):
        for name, workload in graded_bars(lab, mode):
            bar = load_expectation(name, machine, directory=directory, workload=workload)
            if not bar.calibrated:
                held.setdefault(lab, []).append((name, bar))
    return held


def uncalibrated(labs: Iterable[str], mode: str, machine: Any = None, directory: Path | None = None) -> list[str]:
    """One line for each re-measured cell of `labs` that has no calibrated bar here, saying what it is held
    to instead and how to calibrate it. The workloads are those of this machine's device; `machine` (a
    hardware class, or this machine's by default) names the file they are looked up in."""
    return [f"{lab}: no calibrated bar for its re-measured cell here ({bar.reason}); run `perflab grade grade` "
            "without --no-calibration, or `perflab calibrate` (on a GPU, `make gpu-check`), on this machine first"
            for lab, held in held_to_rules(labs, mode, machine, directory).items() for _, bar in held]
