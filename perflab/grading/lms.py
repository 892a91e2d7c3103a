"""Grades an LMS imports: one row per student, one column per lab, in Canvas's or Moodle's layout.

    perflab grade export --lms canvas     <out>/canvas_grades.csv
    perflab grade export --lms moodle     <out>/moodle_<lab>.csv, one per lab (a Moodle grading
                                          worksheet belongs to one assignment)

Each lab gives the points the LMS imports (autograded + manual: what the autograder scored, plus the
scores a person entered in the gradebook, e.g. in formgrader), the two parts apart, and a status to
read before releasing grades: `graded`, or any of `failed` (the notebook could not be run: 0 points),
`flagged` (the kit's flag, or one set in formgrader), `inconclusive` (a re-measured speedup that still
straddled its bar), `manual grading pending` (a written answer with no score yet); `not graded` where
the student has no graded submission of the lab.

Canvas (Grades > Import): `Student, ID, SIS User ID, SIS Login ID, Section`, then per lab `<lab>`,
`<lab> autograded`, `<lab> manual`, `<lab> status`. The second row, `Points Possible`, gives each lab's
points and `(read only)` under its three other columns, which Canvas's importer skips as it skips the
read-only columns of its own export. `ID` is the Canvas user id `collect` read from the download's file
names (`doejane_12345_...` -> 12345) and `Student` the name they gave; a student collected otherwise has
no Canvas id, and their kit id goes in `SIS Login ID`. Canvas puts a lab's points into the assignment of
that title (name the Canvas assignment after the lab, or the column after the assignment).

Moodle (the assignment's "Upload grading worksheet"): `Identifier` (`Participant <id>`, the id `collect`
read from the download's names), `Full name`, `Email address`, `Status` (the status above), `Grade`,
`Maximum Grade`, `Grade can be changed`, `Last modified (grade)` (when the kit graded it: Moodle keeps a
grade changed in Moodle since then unless told to overwrite it), then `Autograded` and `Manual`, which
Moodle does not read. A student without a Moodle id gets no `Identifier`, and Moodle skips that row.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from perflab.grading.state import Record

LMS_NAMES = ("canvas", "moodle")
CANVAS_FILE = "canvas_grades.csv"
CANVAS_STUDENT_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
# What Canvas's own export writes in the Points Possible row of a column its importer must skip.
CANVAS_READ_ONLY = "(read only)"
MOODLE_COLUMNS = ("Identifier", "Full name", "Email address", "Status", "Grade", "Maximum Grade",
                  "Grade can be changed", "Last modified (grade)", "Autograded", "Manual")
# Moodle's worksheet names a participant "Participant <id>" (its string 'hiddenuser' and the id).
MOODLE_PARTICIPANT = "Participant "
NOT_GRADED = "not graded"


@dataclass(frozen=True)
class Student:
    """A student as the LMS knows them: the kit's id, the name and the LMS's id `collect` kept."""

    id: str
    name: str = ""
    lms_id: str = ""


@dataclass(frozen=True)
class LabGrade:
    """One student's lab for an LMS: the points in two parts, and what to read before releasing them."""

    autograded: float
    manual: float
    max_score: float
    status: str
    graded_at: str = ""

    @property
    def points(self) -> float:
        return self.autograded + self.manual


@dataclass(frozen=True)
class Written:
    paths: tuple[Path, ...]
    without_id: tuple[str, ...]  # students with no id of this LMS: matched otherwise, or skipped

    def lines(self, lms: str) -> list[str]:
        out = [str(p) for p in self.paths]
        if self.without_id:
            how = ("Canvas matches them by SIS Login ID (their id here)" if lms == "canvas"
                   else "Moodle skips their rows")
            out.append(f"{len(self.without_id)} student(s) were not collected from a {lms} download and have "
                       f"no {lms} id: {how}: {' '.join(self.without_id[:12])}"
                       f"{' ...' if len(self.without_id) > 12 else ''}")
        return out


def lab_grade(record: Record, manual_scores: Mapping[str, float], flagged_by_a_person: bool = False) -> LabGrade:
    """A record's lab for an LMS; `manual_scores`: grade id -> the score a person entered in the gradebook."""
    autograded = manual = 0.0
    pending = False
    for cell in record.cells:
        if cell.grade_id in manual_scores:
            manual += manual_scores[cell.grade_id]
        elif cell.score is None:
            pending = True
        else:
            autograded += cell.score
    words = [word for word, applies in (("failed", record.outcome == "failed"),
                                        ("flagged", record.flagged or flagged_by_a_person),
                                        ("inconclusive", record.inconclusive),
                                        ("manual grading pending", pending)) if applies]
    return LabGrade(autograded, manual, record.max_score, ", ".join(words) or "graded", record.graded_at)


def write(lms: str, out_dir: Path, students: Sequence[Student], labs: Sequence[str],
          grades: Mapping[tuple[str, str], LabGrade]) -> Written:
    """Write `lms`'s file(s) into `out_dir`; `grades`: (student id, lab) -> LabGrade."""
    if lms not in LMS_NAMES:
        raise ValueError(f"--lms {lms}: not one of {', '.join(LMS_NAMES)}")
    if not labs:
        raise ValueError("no graded lab to export (run `perflab grade grade` first)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    students = sorted(students, key=lambda s: (s.name or s.id).lower())
    without = tuple(s.id for s in students if not s.lms_id)
    if lms == "canvas":
        return Written((write_canvas(out_dir / CANVAS_FILE, students, labs, grades),), without)
    return Written(tuple(write_moodle(out_dir / f"moodle_{lab}.csv", students, lab, grades) for lab in labs),
                   without)


def write_canvas(path: Path, students: Sequence[Student], labs: Sequence[str],
                 grades: Mapping[tuple[str, str], LabGrade]) -> Path:
    maxima = _maxima(labs, grades)
    header = list(CANVAS_STUDENT_COLUMNS)
    possible = ["    Points Possible", "", "", "", ""]
    for lab in labs:
        header += [lab, f"{lab} autograded", f"{lab} manual", f"{lab} status"]
        possible += [_points(maxima[lab]), CANVAS_READ_ONLY, CANVAS_READ_ONLY, CANVAS_READ_ONLY]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerow(possible)
        for student in students:
            row = [student.name or student.id, student.lms_id, "", "" if student.lms_id else student.id, ""]
            for lab in labs:
                grade = grades.get((student.id, lab))
                row += ([_points(grade.points), _points(grade.autograded), _points(grade.manual), grade.status]
                        if grade else ["", "", "", NOT_GRADED])
            writer.writerow(row)
    return path


def write_moodle(path: Path, students: Sequence[Student], lab: str,
                 grades: Mapping[tuple[str, str], LabGrade]) -> Path:
    maximum = _maxima([lab], grades)[lab]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(MOODLE_COLUMNS)
        for student in students:
            grade = grades.get((student.id, lab))
            identifier = f"{MOODLE_PARTICIPANT}{student.lms_id}" if student.lms_id else ""
            if grade is None:
                writer.writerow([identifier, student.name or student.id, "", NOT_GRADED, "", _points(maximum),
                                 "Yes", "", "", ""])
                continue
            writer.writerow([identifier, student.name or student.id, "", grade.status, _points(grade.points),
                             _points(maximum), "Yes", grade.graded_at, _points(grade.autograded),
                             _points(grade.manual)])
    return path


def _maxima(labs: Sequence[str], grades: Mapping[tuple[str, str], LabGrade]) -> dict[str, float]:
    """Each lab's points: the largest maximum any of its graded submissions has."""
    out = dict.fromkeys(labs, 0.0)
    for (_, lab), grade in grades.items():
        if lab in out:
            out[lab] = max(out[lab], grade.max_score)
    return out


def _points(value: float) -> str:
    """Points as an LMS reads them: at most two decimals, no trailing zeros (7.5, 10)."""
    return f"{round(float(value), 2):g}"
