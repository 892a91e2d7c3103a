"""Scoring: every graded cell's row, decided in the grading parent from the probes' observations.

    score(info, tmpl, result, present, seed, mode, runners) -> [CellRow]

Autograded cells are decided by the lab's judges (`perflab.grading.judging`); a written answer is left
to a person (0 when left as released); a deleted cell scores 0. Nothing the notebook computed is taken
as a score.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perflab.grading import harness, judging
from perflab.grading.checks import grade_id
from perflab.grading.job import released_notebook
from perflab.grading.result import CellRow, LabInfo, SubmissionResult

log = logging.getLogger(__name__)


def score(info: LabInfo, tmpl: Path, result: SubmissionResult, present: set[str], seed: int, mode: str,
          runners: tuple[Callable[..., Any] | None, Callable[..., Any] | None] = (None, None),
          student: str = "", measured_at_home: tuple[Any, ...] | None = None) -> list[CellRow]:
    """Every graded cell's row, decided here: autograded cells by the lab's judges from the
    observations, written answers left to a person (0 when left as released)."""
    judges = judging.judges_for(info.lab, tmpl / "source" / info.lab) or {}
    observations = result.observations
    cells_seen = observations.get("cells") if isinstance(observations, dict) else None
    if not isinstance(cells_seen, dict) or observations.get("schema") != harness.OBSERVATIONS_SCHEMA:
        cells_seen = {}
    ctx = judging.Context(info.lab, seed, mode, cells_seen, *runners, student=student,
                          measured_at_home=measured_at_home)
    answered = manual_answers(result.notebook, tmpl, info)
    rows = []
    for cell in info.cells:
        gid = cell["grade_id"]
        if gid not in present:
            rows.append(CellRow.for_cell(cell, 0.0, error="the cell was deleted; scored 0"))
        elif cell["manual"]:
            changed = answered.get(gid, True)
            rows.append(CellRow.for_cell(cell, None if changed else 0.0, manual=changed,
                                         error=None if changed else "left as released; scored 0"))
        elif gid not in judges:
            log.warning("%s: no judge for %s; scored 0", info.lab, gid)
            rows.append(CellRow.for_cell(cell, 0.0, error="the grader has no check for this cell"))
        else:
            mark = judging.judge_cell(gid, judges[gid], ctx)
            rows.append(CellRow.for_cell(cell, round(mark.fraction * float(cell["max_score"]), 6),
                                         error=None if mark.fraction >= 1.0 else (mark.message or "a check failed"),
                                         verdict=mark.verdict, flag=mark.flag, decision=mark.decision))
    return rows


def manual_answers(notebook_text: Any, tmpl: Path, info: LabInfo) -> dict[str, bool]:
    """grade_id -> whether a written answer differs from the released text (from the graded copy)."""
    import nbformat

    if not isinstance(notebook_text, str):
        return {}
    try:
        nb = nbformat.reads(notebook_text, as_version=4)
        release = released_notebook(tmpl, info.lab, info.notebook)
    except Exception:
        return {}
    released = {grade_id(c): c.source.strip() for c in release.cells if grade_id(c)}
    out: dict[str, bool] = {}
    for cell in nb.cells:
        gid = grade_id(cell)
        if gid and gid not in out and isinstance(cell.get("source"), str):
            out[gid] = cell.source.strip() != released.get(gid, "")
    return out
