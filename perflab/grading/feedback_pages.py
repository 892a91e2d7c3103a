"""The feedback stage: one HTML page per graded submission, written one at a time.

    write_pages(course, labs, students, on_problem) -> FeedbackRun

nbgrader renders each graded notebook (already scrubbed of hidden tests by the merge); a notebook it
cannot render gets a minimal page with the score and notes instead (`feedback.failure_page`), and
one line naming the student and the reason; a page that cannot be written at all is counted, and
never stops the others. Every page passes `feedback.assert_nothing_hidden` before it is kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from perflab.grading import feedback as fb
from perflab.grading import nbgrader_api as nbapi
from perflab.grading.job import lab_info
from perflab.grading.result import LabInfo
from perflab.grading.state import Record, State

log = logging.getLogger(__name__)


# What a student reads when nbgrader could not render their graded notebook (their scores stand).
NOT_RENDERED = ("your graded notebook could not be rendered into this page, so only your scores and "
                "grading notes are shown (your scores are not affected; an instructor has been told)")


@dataclass(frozen=True)
class FeedbackRun:
    """What `write_pages` wrote: a page per submission, and which ones fell back or got none."""

    pages: tuple[Path, ...] = ()  # every page written, minimal ones included
    minimal: tuple[str, ...] = ()  # "lab/student: reason": nbgrader could not render it; a minimal page instead
    failed: tuple[str, ...] = ()  # "lab/student: reason": no page at all

    def line(self) -> str:
        return (f"wrote {len(self.pages)} feedback page(s), {len(self.minimal)} of them minimal (the notebook "
                f"could not be rendered); {len(self.failed)} submission(s) got no page")


def write_pages(course: Path, labs: Collection[str] | None = None, students: Collection[str] | None = None,
                on_problem: Callable[[str], None] | None = None) -> FeedbackRun:
    """Write HTML feedback for every graded submission in the selection, one at a time: a notebook
    nbgrader cannot render gets a minimal page with its score and notes instead, and one line (to
    `on_problem` and the log) naming the student and the reason; it never stops the others."""
    course = Path(course).resolve()
    state = State.load(course)
    pages: list[Path] = []
    minimal: list[str] = []
    failed: list[str] = []
    infos: dict[str, LabInfo] = {}

    def problem(kind: list[str], record: Record, what: str, exc: BaseException) -> None:
        line = f"{record.key}: {what} ({_reason(exc)})"
        kind.append(line)
        if on_problem:
            on_problem(line)
        else:
            log.warning("feedback %s", line)

    for record in sorted(state.records.values(), key=lambda r: r.key):
        if (labs and record.lab not in labs) or (students and record.student not in students):
            continue
        try:
            info = infos.get(record.lab) or infos.setdefault(record.lab, lab_info(course, record.lab))
            folder = course / "feedback" / record.student / record.lab
            name = Path(info.notebook).stem
            lines = list(record.notes) or ["the submission could not be graded"]
            page = None
            if (course / "autograded" / record.student / record.lab / info.notebook).is_file():
                try:
                    nbapi.generate_feedback(course, record.lab, record.student)
                    page = folder / f"{name}.html"
                    fb.assert_nothing_hidden(page.read_text(encoding="utf-8"), {}, str(page))
                except Exception as exc:
                    if page is not None:
                        page.unlink(missing_ok=True)
                    page = None
                    problem(minimal, record, "nbgrader could not render the graded notebook; wrote a minimal page",
                            exc)
                    lines = [NOT_RENDERED, *record.notes]
            if page is None:
                page = fb.write_page(folder, name, fb.failure_page(record.student, record.lab, lines, record.cells))
                fb.assert_nothing_hidden(page.read_text(encoding="utf-8"), {}, str(page))
            pages.append(page)
        except Exception as exc:
            problem(failed, record, "no feedback page", exc)
    return FeedbackRun(tuple(pages), tuple(minimal), tuple(failed))


def _reason(exc: BaseException) -> str:
    """One line for why a step failed: an nbgrader failure's cause, else the exception's first line."""
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    if isinstance(exc, nbapi.GradingError) and "failed: " in first:
        return first.split("failed: ", 1)[1][:300]
    return f"{type(exc).__name__}: {first}"[:300]
