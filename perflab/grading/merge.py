"""Merging: one result into the gradebook, `autograded/` and the state file; the single writer.

    merge(course, job, info, result, state, backend=..., hardware_class=...) -> state.Record

Only the process holding the course's lock merges, one result at a time, so the local pool and the
Ray back-end share one writer; a merge is idempotent. What a student reads of their submission is
made here too (`notes_for`; the graded copy for feedback, scrubbed of hidden tests: `feedback_notebook`),
and a results file the notebook handed back gets the grader's own re-measurements (`with_grader_verdicts`).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import re
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perflab.grading import feedback as fb
from perflab.grading import nbgrader_api as nbapi
from perflab.grading.result import Job, LabInfo, SubmissionResult
from perflab.grading.state import CellResult, Record, State
from perflab.verify.protocol import CLAIM_CONTRADICTED

log = logging.getLogger(__name__)

# A results file a graded notebook may hand back (kept in autograded/<student>/<lab>/results/).
RESULTS_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.json")


def notes_for(result: SubmissionResult, info: LabInfo) -> list[str]:
    """The lines a student reads about their submission; hidden tests stay hidden."""
    lines = []
    if result.error:
        lines.append(f"Not graded: {result.error}")
    for finding in result.findings:
        if finding.fatal and finding.message == result.error:
            continue
        lines.append(finding.line())
    for row in result.cells:
        if row.error and not row.needs_manual_grade and (row.score or 0) < row.max_score:
            lines.append(f"{row.grade_id}: {_num(row.score)}/{_num(row.max_score)} points: {row.error}")
    timed_out = {e.cell for e in result.events if "was stopped" in e.event}
    for event in result.events:
        text = event.event
        if event.cell in timed_out and text.startswith("KeyboardInterrupt"):
            continue  # the interrupt that stopped it: said already
        if event.grade_id in info.hidden:
            text = text.split(":", 1)[0] + " (a test in this cell failed; it holds hidden tests)"
        where = f"cell {event.cell}" + (f" ({event.grade_id})" if event.grade_id else "")
        lines.append(f"{where}: {text}")
    lines += [f"sandbox: {note}" for note in result.sandbox_notes]
    return list(dict.fromkeys(lines))


def merge(course: Path, job: Job, info: LabInfo, result: SubmissionResult, state: State, *,
          backend: str, hardware_class: str | None, uncalibrated: Sequence[str] = ()) -> Record:
    """Write one result into the gradebook, autograded/ and the state file (idempotent). `uncalibrated`:
    the lab's expectations entries this run held to the conservative rule (no bar calibrated here)."""
    from nbgrader.api import Gradebook, MissingEntry

    course = Path(course).resolve()
    previous = state.get(job.lab, job.student)
    cells = []
    for row in result.cells:
        verdict = row.verdict or {}
        cells.append(CellResult(
            grade_id=row.grade_id, score=row.score, max_score=row.max_score,
            needs_manual_grade=row.needs_manual_grade, error=row.error,
            verdict=verdict.get("verdict"), speedup=_float(verdict.get("speedup")),
            claimed=_float(verdict.get("claimed")),
            hardware_class=verdict.get("hardware_class") or result.hardware_class or hardware_class,
            code=verdict.get("code") if isinstance(verdict.get("code"), str) else None,
            decision=dict(row.decision) if row.decision is not None else None))
    flags = [f"{f.cell}: {f.message}" for f in result.findings if f.flag]
    flags += [f"{row.grade_id}: {row.flag}" for row in result.cells if row.flag]
    flags += [f"{c.grade_id}: verification inconclusive" for c in cells if c.verdict == "inconclusive"]
    flags += [f"{c.grade_id}: the claimed {c.claimed:.2f}x is more than {CLAIM_CONTRADICTED:g} times the re-measured "
              f"{c.speedup:.2f}x" for c in cells
              if c.claimed is not None and c.speedup and c.claimed > CLAIM_CONTRADICTED * c.speedup]
    notes = notes_for(result, info)
    text = feedback_notebook(result.notebook, info, notes, job) if result.notebook else None
    if result.notebook and text is None:
        notes.append("your graded notebook is not shown in this feedback: its outputs hold text that looks like "
                     "the grader's hidden material (your scores are not affected)")
        flags.append("notebook: its outputs quote hidden-test text or markers; not shown in feedback")
    record = Record(
        student=job.student, lab=job.lab, sha256=job.sha256,
        outcome="failed" if result.error else "graded", cells=tuple(cells), notes=tuple(notes),
        flagged=bool(flags), flags=tuple(flags), error=result.error, backend=backend,
        wall_s=float(result.wall_s),
        graded_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        merges=(previous.merges + 1) if previous and previous.sha256 == job.sha256 else 1,
        isolation=result.isolation, uncalibrated=tuple(uncalibrated))

    with nbapi._tools_on_path(), warnings.catch_warnings(), \
            Gradebook(f"sqlite:///{course / 'gradebook.db'}", nbapi.COURSE_ID) as gb:
        warnings.filterwarnings("ignore", message=".*not in session.*")  # nbgrader's own, harmless
        gb.update_or_create_student(job.student)
        gb.update_or_create_submission(job.lab, job.student)
        nb_name = Path(info.notebook).stem
        for cell in cells:
            try:
                grade = gb.find_grade(cell.grade_id, nb_name, job.lab, job.student)
            except MissingEntry:
                log.warning("%s/%s: the gradebook has no cell %s", job.lab, job.student, cell.grade_id)
                continue
            grade.auto_score = cell.score
            grade.needs_manual_grade = cell.needs_manual_grade
        order = nbapi._cell_order(course / "source" / job.lab / info.notebook)
        _flag_in_gradebook(gb, job, nb_name, record, previous, order)
        gb.db.commit()

    folder = course / "autograded" / job.student / job.lab
    if folder.exists():
        shutil.rmtree(folder)
    if text is not None:
        folder.mkdir(parents=True)
        (folder / info.notebook).write_text(text, encoding="utf-8")
    for name, data in result.files.items():  # results/*.json, for the student's report
        if RESULTS_FILE_NAME.fullmatch(name):
            (folder / "results").mkdir(parents=True, exist_ok=True)
            verdicts = [dict(row.verdict) for row in result.cells if row.verdict is not None]
            (folder / "results" / name).write_text(with_grader_verdicts(data, verdicts), encoding="utf-8")
    state.put(record)
    return record


def review(course: Path, state: State, record: Record, *, flags: Sequence[str], notes: Sequence[str],
           shown: Sequence[str] | None = None) -> Record:
    """`record` with the flags and notes a review across submissions found after grading (`copies.review`:
    a pair of copies), written where `merge` writes them: the state, the gradebook's flag (formgrader) and
    the notes cell of the graded copy the feedback page is made from. `shown`: the flags as the gradebook's
    comment shows them, which nbgrader's feedback renders for the student (default: `flags`). No score changes."""
    import dataclasses

    import nbformat
    from nbgrader.api import Gradebook

    course = Path(course).resolve()
    new = dataclasses.replace(record, flags=tuple(flags), flagged=bool(flags), notes=tuple(notes))
    source = sorted((course / "source" / record.lab).glob("*.ipynb"))
    if source:
        with nbapi._tools_on_path(), warnings.catch_warnings(), \
                Gradebook(f"sqlite:///{course / 'gradebook.db'}", nbapi.COURSE_ID) as gb:
            warnings.filterwarnings("ignore", message=".*not in session.*")
            comment = new if shown is None else dataclasses.replace(new, flags=tuple(shown))
            _flag_in_gradebook(gb, Job(record.student, record.lab, source[0], record.sha256), source[0].stem, comment,
                               record, nbapi._cell_order(source[0]))
            gb.db.commit()
        graded = course / "autograded" / record.student / record.lab / source[0].name
        if graded.is_file():
            nb = nbformat.read(graded, as_version=4)
            fb.add_notes(nb, list(new.notes), f"{record.lab}, {record.student}")
            nbformat.write(nb, graded)
    state.put(new)
    return new


# What opens the comment formgrader shows on a flagged submission's first answer cell.
FLAG_COMMENT_HEADER = "Flagged for review by perflab:"


def _flag_in_gradebook(gb: Any, job: Job, notebook: str, record: Record, previous: Record | None,
                       order: dict[str, int]) -> None:
    """Show the kit's flag in formgrader: the submitted notebook's own `flagged` (its "Flagged?" column)
    and the reasons as the automatic comment of the notebook's first answer cell (`order`: grade id ->
    position in the source notebook), which formgrader shows in that cell's comment box. A flag a person
    set stays; the kit clears only one it set itself."""
    from nbgrader.api import MissingEntry

    try:
        submitted = gb.find_submission_notebook(notebook, job.lab, job.student)
    except MissingEntry:
        log.warning("%s/%s: the gradebook has no notebook %s to flag", job.lab, job.student, notebook)
        return
    if record.flagged:
        submitted.flagged = True
    elif previous is not None and previous.flagged:
        submitted.flagged = False
    comments = sorted(submitted.comments, key=lambda c: (order.get(c.name, len(order)), c.name))
    for comment in comments:
        if (comment.auto_comment or "").startswith(FLAG_COMMENT_HEADER):
            comment.auto_comment = None
    if record.flagged and comments:
        comments[0].auto_comment = "\n".join([FLAG_COMMENT_HEADER, *(f"- {flag}" for flag in record.flags)])


def with_grader_verdicts(text: str, verdicts: list[dict[str, Any]]) -> str:
    """A results file whose `verification` rows are the grader's own re-measurements (the notebook's
    kernel only says "deferred"), so the student's report shows what was measured; unchanged if it
    is not a results document."""
    try:
        doc = json.loads(text)
        rows = doc["sections"]["verification"]
    except (ValueError, KeyError, TypeError):
        return text
    if not isinstance(rows, list) or not verdicts:
        return text
    by_name = {v.get("name"): v for v in verdicts}
    graded = []
    for row in rows:
        v = by_name.get(row.get("name")) if isinstance(row, dict) else None
        if v is None:
            graded.append(row)
            continue
        new = {"name": v["name"], "verdict": v.get("verdict"), "reason": v.get("reason") or ""}
        if v.get("speedup") is not None and v.get("ci"):
            new.update(speedup=v["speedup"], ci=list(v["ci"]))
        claimed = row.get("claimed", v.get("claimed"))
        if isinstance(claimed, (int, float)) and not isinstance(claimed, bool) and math.isfinite(claimed):
            new["claimed"] = float(claimed)  # the student's own figure, shown beside the grader's
        if isinstance(v.get("activation_bytes"), dict):  # lab 4: what the checkpoint keeps, re-measured
            new["activation_bytes"] = dict(v["activation_bytes"])
        graded.append(new)
    doc["sections"]["verification"] = graded
    speedups = doc["sections"].get("speedups")
    if len(verdicts) == 1 and isinstance(speedups, list):  # a speedup row the kernel marked "deferred"
        for row in speedups:
            if isinstance(row, dict) and row.get("verdict") == "deferred":
                row["verdict"] = verdicts[0].get("verdict")
    return json.dumps(doc, indent=1)


def feedback_notebook(notebook: str, info: LabInfo, notes: list[str], job: Job) -> str | None:
    """The graded copy a student's feedback is made from (scrubbed, with the notes on top), or None
    when it cannot be shown; a notebook the grader cannot show never stops the batch."""
    import nbformat

    try:
        nb = nbformat.reads(notebook, as_version=4)
        fb.scrub(nb, info.hidden)
        fb.add_notes(nb, notes, f"{job.lab}, {job.student}")
        text = nbformat.writes(nb)
        fb.assert_nothing_hidden(text, info.guarded, f"autograded notebook of {job.student}")
    except fb.HiddenTestLeak:
        log.warning("%s/%s: the graded notebook's outputs quote hidden-test text; not kept for feedback",
                    job.lab, job.student)
        return None
    except Exception as exc:
        log.warning("%s/%s: the graded notebook could not be kept for feedback (%s)", job.lab, job.student, exc)
        return None
    return text


def _num(value: Any) -> str:
    return f"{float(value or 0):g}"


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
