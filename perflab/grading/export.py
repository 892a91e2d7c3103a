"""Grades out of the course folder: CSV and JSON per cell, per lab, per student; and `status`.

CSV (`grades.csv`), one row per graded cell of each submission, in this column order:

    student         the student id (from collect)
    lab             the lab (nbgrader assignment), e.g. lab01_measure
    cell            the grade cell's id in the lab notebook
    score           points given: a person's manual score where one was entered in the gradebook,
                    else the autograder's; empty while a written answer waits for a person
    max_score       points the cell is worth
    verdict         pass | fail | inconclusive from the cell's re-measurement of a claimed
                    speedup (perflab's verification record); empty for cells that time nothing
    code            the verifier's named reason for that verdict (clears_bar, below_bar, no_change,
                    loss_mismatch, ...; `perflab.verify`'s codes); empty where it gave none
    speedup         the re-measured speedup (x), empty if none
    hardware_class  the class of the machine that graded (perflab.env.MachineInfo.hardware_class)
    flagged         1 if the submission is flagged for review (tampering, a typed-in claim,
                    an inconclusive verification), else 0; the same on every row of a submission
    error           why the cell scored 0, when it did for a reason other than a plain failed
                    test (the notebook could not be read, the kernel died, the time limit...),
                    or the first error the cell raised; empty when it passed
    isolation       the sandbox the submission ran in: root | userns (Linux namespaces), none (graded
                    with --unisolated: no namespaces), empty when no student code ran; the same on
                    every row of a submission
    uncalibrated    the lab's expectations entries (space-separated) its re-measured cells were held
                    to the conservative rule for, no bar being calibrated on the grading machine
                    (graded with --no-calibration); empty where every bar was calibrated; the same on
                    every row of a submission
    comment         a comment a person entered on this cell in the gradebook (e.g. in formgrader), else
                    empty; comments on answer cells that hold no points are in grades.json's `comments`

JSON (`grades.json`): {"schema": "perflab.grades", "version": 1, "columns": [...], "rows": [...],
"submissions": [{"student", "lab", "score", "max_score", "outcome", "flagged", "flags", "notes",
"inconclusive", "isolation", "uncalibrated", "comments": {cell: a person's comment}}], "students": {student: {"score", "max_score", "labs": {lab: score}}},
"copies": [{"lab", "students": [a, b], "why", ...}]} (`copies.Pair`: two submissions whose home
measurements one run made, both flagged).

`export_lms` writes the same grades one row per student for an LMS to import (`perflab.grading.lms`).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perflab.grading import collect, copies, lms
from perflab.grading.state import Record, State

COLUMNS = ("student", "lab", "cell", "score", "max_score", "verdict", "code", "speedup", "hardware_class",
           "flagged", "error", "isolation", "uncalibrated", "comment")


@dataclass
class Entered:
    """What people entered in the gradebook (formgrader writes there), keyed (lab, student, cell)."""

    scores: dict[tuple[str, str, str], float] = field(default_factory=dict)
    comments: dict[tuple[str, str, str], str] = field(default_factory=dict)
    flagged: set[tuple[str, str]] = field(default_factory=set)  # (lab, student) flagged in the gradebook
    students: dict[str, lms.Student] = field(default_factory=dict)  # the LMS's name and id, from collect

    def comments_of(self, lab: str, student: str) -> dict[str, str]:
        return {cell: text for (l_, s_, cell), text in self.comments.items() if (l_, s_) == (lab, student)}

    def scores_by_submission(self) -> dict[tuple[str, str], dict[str, float]]:
        """(lab, student) -> {cell: the score a person entered}."""
        out: dict[tuple[str, str], dict[str, float]] = {}
        for (lab, student, cell), score in self.scores.items():
            out.setdefault((lab, student), {})[cell] = score
        return out


def entered(course: Path) -> Entered:
    """Manual scores and comments, flags and the students' LMS names and ids, read from the gradebook."""
    from nbgrader.api import Gradebook

    out = Entered()
    db = Path(course) / "gradebook.db"
    if not db.is_file():
        return out
    with Gradebook(f"sqlite:///{db}", "perflab") as gb:
        for student in gb.students:
            out.students[student.id] = lms.Student(student.id, student.first_name or "", student.lms_user_id or "")
        for assignment in gb.assignments:
            for submission in assignment.submissions:
                key = (assignment.name, submission.student.id)
                for notebook in submission.notebooks:
                    if notebook.flagged:
                        out.flagged.add(key)
                    for grade in notebook.grades:
                        if grade.manual_score is not None:
                            out.scores[(*key, grade.name)] = float(grade.manual_score)
                    for comment in notebook.comments:
                        if comment.manual_comment:
                            out.comments[(*key, comment.name)] = comment.manual_comment
    return out


def rows(records: Iterable[Record], people: Entered | None = None) -> list[dict[str, Any]]:
    people = people or Entered()
    out = []
    for rec in sorted(records, key=lambda r: (r.student, r.lab)):
        for cell in rec.cells:
            key = (rec.lab, rec.student, cell.grade_id)
            out.append({"student": rec.student, "lab": rec.lab, "cell": cell.grade_id,
                        "score": people.scores.get(key, cell.score),
                        "max_score": cell.max_score, "verdict": cell.verdict, "code": cell.code, "speedup": cell.speedup,
                        "hardware_class": cell.hardware_class, "flagged": int(rec.flagged),
                        "error": cell.error, "isolation": rec.isolation,
                        "uncalibrated": " ".join(rec.uncalibrated), "comment": people.comments.get(key, "")})
    return out


def export(course: Path, out_dir: Path | None = None, labs=None, students=None) -> tuple[Path, Path]:
    """Write grades.csv and grades.json (default: <course>/export/); returns their paths."""
    course = Path(course).resolve()
    state = State.load(course)
    records = [r for r in state.records.values()
               if (not labs or r.lab in labs) and (not students or r.student in students)]
    people = entered(course)
    table = rows(records, people)
    out_dir = Path(out_dir) if out_dir else course / "export"
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / "grades.csv", out_dir / "grades.json"
    with open(csv_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in table:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    submissions, students_out = [], {}
    for rec in sorted(records, key=lambda r: (r.student, r.lab)):
        score = sum(r["score"] or 0.0 for r in table if r["student"] == rec.student and r["lab"] == rec.lab)
        submissions.append({"student": rec.student, "lab": rec.lab, "score": score, "max_score": rec.max_score,
                            "outcome": rec.outcome, "flagged": rec.flagged, "flags": list(rec.flags),
                            "notes": list(rec.notes), "inconclusive": rec.inconclusive,
                            "isolation": rec.isolation, "uncalibrated": list(rec.uncalibrated),
                            "comments": people.comments_of(rec.lab, rec.student)})
        entry = students_out.setdefault(rec.student, {"score": 0.0, "max_score": 0.0, "labs": {}})
        entry["score"] += score
        entry["max_score"] += rec.max_score
        entry["labs"][rec.lab] = score
    pairs = [p for p in copies.pairs(course) if (not labs or p["lab"] in labs)
             and (not students or set(p["students"]) & set(students))]
    doc = {"schema": "perflab.grades", "version": 1, "columns": list(COLUMNS), "rows": table,
           "submissions": submissions, "students": students_out, "copies": pairs}
    json_path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return csv_path, json_path


def export_lms(course: Path, lms_name: str, out_dir: Path | None = None,
               labs: Collection[str] | None = None) -> lms.Written:
    """Write the grades for `lms_name` (canvas | moodle) into `out_dir` (default: <course>/export/):
    one row per student who handed anything in, one column (Canvas) or file (Moodle) per graded lab."""
    course = Path(course).resolve()
    records = [r for r in State.load(course).records.values() if not labs or r.lab in labs]
    people = entered(course)
    manual = people.scores_by_submission()
    grades = {(r.student, r.lab): lms.lab_grade(r, manual.get((r.lab, r.student), {}), (r.lab, r.student) in people.flagged)
              for r in records}
    students = [people.students.get(s, lms.Student(s)) for s in sorted({r.student for r in records})]
    return lms.write(lms_name, Path(out_dir) if out_dir else course / "export", students,
                     sorted({r.lab for r in records}), grades)


def status(course: Path) -> dict[str, list[str]]:
    """Submissions by state: pending (collected, not graded in this version), graded, failed,
    inconclusive, flagged, unisolated (graded with --unisolated), uncalibrated (a re-measured cell held to the
    conservative rule, no bar being calibrated here: --no-calibration); the last four overlap graded; copies
    (`lab:a~b`, pairs whose home measurements one run made, both flagged)."""
    course = Path(course).resolve()
    state = State.load(course)
    out: dict[str, list[str]] = {"pending": [], "graded": [], "failed": [], "inconclusive": [], "flagged": [],
                                 "unisolated": [], "uncalibrated": []}
    for job in collect.submissions(course):
        if not state.done(job.lab, job.student, job.sha256):
            out["pending"].append(f"{job.lab}/{job.student}")
    for rec in sorted(state.records.values(), key=lambda r: r.key):
        out["failed" if rec.outcome == "failed" else "graded"].append(rec.key)
        if rec.inconclusive:
            out["inconclusive"].append(rec.key)
        if rec.flagged:
            out["flagged"].append(rec.key)
        if rec.isolation == "none":
            out["unisolated"].append(rec.key)
        if rec.uncalibrated:
            out["uncalibrated"].append(rec.key)
    out["copies"] = [f"{p['lab']}:{'~'.join(p['students'])}" for p in copies.pairs(course)]
    return out
