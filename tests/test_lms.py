"""The LMS export (`perflab grade export --lms canvas|moodle`): its totals, statuses and layouts."""

from __future__ import annotations

import csv
from pathlib import Path, PurePosixPath

import pytest

from perflab.grading import collect, lms
from perflab.grading.state import CellResult, Record

LAB, OTHER = "lab01_measure", "lab02_feed"


def record(student: str = "doejane-12345", lab: str = LAB, *, outcome: str = "graded", flagged: bool = False,
           written: float | None = None, verdict: str | None = "pass") -> Record:
    cells = (CellResult("test_timer", 3.0, 3.0), CellResult("test_speedup", 0.0, 5.0, verdict=verdict),
             CellResult("explain", written, 2.0, needs_manual_grade=written is None))
    return Record(student, lab, "sha", outcome, cells, flagged=flagged, flags=("x: why",) * flagged,
                  graded_at="2026-12-07T03:20:38+00:00")


def read(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


def test_lab_grade_splits_autograded_from_manual_and_says_what_to_read_first():
    grade = lms.lab_grade(record(), {})
    assert (grade.autograded, grade.manual, grade.max_score) == (3.0, 0.0, 10.0)
    assert grade.status == "manual grading pending"  # the written answer has no score yet
    graded = lms.lab_grade(record(), {"explain": 1.5, "test_speedup": 4.0})  # a person's scores override
    assert (graded.autograded, graded.manual, graded.points, graded.status) == (3.0, 5.5, 8.5, "graded")
    flagged = lms.lab_grade(record(flagged=True, written=2.0, verdict="inconclusive"), {})
    assert flagged.status == "flagged, inconclusive" and flagged.points == 5.0
    assert lms.lab_grade(record(written=0.0), {}, flagged_by_a_person=True).status == "flagged"
    assert lms.lab_grade(record(outcome="failed", written=0.0), {}).status == "failed"


def test_canvas_file_is_its_gradebook_import_layout(tmp_path):
    students = [lms.Student("doejane-12345", "doejane", "12345"), lms.Student("kim", "", "")]
    grades = {("doejane-12345", LAB): lms.lab_grade(record(), {"explain": 2.0}),
              ("kim", OTHER): lms.lab_grade(record("kim", OTHER, flagged=True, written=1.0), {})}
    written = lms.write("canvas", tmp_path, students, [LAB, OTHER], grades)
    rows = read(written.paths[0])
    assert written.paths == (tmp_path / lms.CANVAS_FILE,)
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                       LAB, f"{LAB} autograded", f"{LAB} manual", f"{LAB} status",
                       OTHER, f"{OTHER} autograded", f"{OTHER} manual", f"{OTHER} status"]
    # Canvas reads the row whose first cell holds "Points Possible", and skips a "(read only)" column.
    assert "Points Possible" in rows[1][0]
    assert rows[1][5:] == ["10", *[lms.CANVAS_READ_ONLY] * 3, "10", *[lms.CANVAS_READ_ONLY] * 3]
    by_name = {row[0]: row for row in rows[2:]}
    assert by_name["doejane"][:5] == ["doejane", "12345", "", "", ""]  # matched by the Canvas user id
    assert by_name["doejane"][5:] == ["5", "3", "2", "graded", "", "", "", "not graded"]
    assert by_name["kim"][:5] == ["kim", "", "", "kim", ""]  # no Canvas id: matched by SIS Login ID
    assert by_name["kim"][9:] == ["4", "4", "0", "flagged"]  # no score entered by a person
    assert written.without_id == ("kim",) and "SIS Login ID" in written.lines("canvas")[-1]


def test_moodle_writes_one_worksheet_per_lab_keyed_by_participant(tmp_path):
    students = [lms.Student("jane.doe-4321", "Jane Doe", "4321"), lms.Student("kim")]
    grades = {("jane.doe-4321", LAB): lms.lab_grade(record("jane.doe-4321", written=2.0), {}),
              ("kim", LAB): lms.lab_grade(record("kim", verdict="inconclusive", written=1.0), {})}
    written = lms.write("moodle", tmp_path, students, [LAB, OTHER], grades)
    assert written.paths == (tmp_path / f"moodle_{LAB}.csv", tmp_path / f"moodle_{OTHER}.csv")
    rows = read(written.paths[0])
    assert tuple(rows[0]) == lms.MOODLE_COLUMNS
    # Moodle's worksheet upload needs Identifier, Grade and Last modified (grade) by these names.
    assert {"Identifier", "Grade", "Last modified (grade)"} <= set(rows[0])
    jane = dict(zip(rows[0], rows[1], strict=True))
    assert jane["Identifier"] == "Participant 4321" and jane["Full name"] == "Jane Doe"
    assert (jane["Grade"], jane["Maximum Grade"], jane["Status"]) == ("5", "10", "graded")
    assert jane["Last modified (grade)"] == "2026-12-07T03:20:38+00:00"
    kim = dict(zip(rows[0], rows[2], strict=True))
    assert kim["Identifier"] == "" and kim["Status"] == "inconclusive"
    other = read(written.paths[1])
    assert [dict(zip(other[0], r, strict=True))["Status"] for r in other[1:]] == ["not graded", "not graded"]
    assert "Moodle skips their rows" in written.lines("moodle")[-1]


def test_bad_requests_are_one_clear_line(tmp_path):
    with pytest.raises(ValueError, match="--lms blackboard: not one of canvas, moodle"):
        lms.write("blackboard", tmp_path, [], [LAB], {})
    with pytest.raises(ValueError, match="no graded lab"):
        lms.write("canvas", tmp_path, [], [], {})


@pytest.mark.parametrize("name, expected", [
    ("doejane_12345_67890_lab01_measure.ipynb", ("doejane-12345", "doejane", "12345")),
    ("Jane Doe_4321_assignsubmission_file_lab01_measure.ipynb", ("jane.doe-4321", "Jane Doe", "4321")),
    ("Lab 1_jdoe_attempt_2026-01-02-10-00-00_lab01_measure.ipynb", ("jdoe", "jdoe", "jdoe")),
    ("jdoe/lab01_measure.ipynb", None),
])
def test_collect_keeps_the_lms_id_the_export_writes_back(name, expected):
    assert collect.lms_student(PurePosixPath(name)) == expected
