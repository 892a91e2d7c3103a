"""Copies flagged through `pipeline.grade`: a classmate's executed notebook handed in as one's own (unchanged,
or with comments and a written answer reworded) is flagged with the pair named, in the grades, the status,
the export, the class report and formgrader; the student's page says only that it is held for review; two
honest runs are not flagged; a later run compares its submissions with those graded before.

The fixture lab (a few seconds a submission) carries the real home records of two honest runs of lab 3
(tests/fixtures/copies/) in its outputs, as a notebook of labs 2, 3, 5 and 6 does; the last tests find a copy
of each real lab's executed reference by its records, and grade lab 6's through the pipeline.
"""

from __future__ import annotations

import contextlib
import copy
import html
import io
import json
import math
import random
import re
import sys
from pathlib import Path

import labs_helpers as H
import nbformat
import pytest

from perflab.cli import main
from perflab.grading import copies, export, nbgrader_api, pipeline, sandbox
from perflab.grading.state import State
from perflab.labs import homework
from perflab.report import classreport

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "grading"))
import cases  # noqa: E402

pytestmark = pytest.mark.slow

SOLUTIONS = Path(__file__).parent / "fixtures" / "grading" / "solutions"
FIXTURES = Path(__file__).parent / "fixtures" / "copies"
LAB = cases.LAB


def home_records(run: str) -> list[dict]:
    return json.loads((FIXTURES / f"lab03_amp-{run}.json").read_text(encoding="utf-8"))


def carrying(nb: nbformat.NotebookNode, entries: list[dict]) -> nbformat.NotebookNode:
    """`nb` with `entries` in the outputs of its first answer cell, as a home run saves them."""
    from nbformat.v4 import new_output

    nb = copy.deepcopy(nb)
    cell = next(c for c in nb.cells if c.cell_type == "code" and (c.metadata.get("nbgrader") or {}).get("solution"))
    cell.outputs = [new_output("display_data", data={homework.HOMEWORK_MIME: e, "text/plain": "[recorded]"})
                    for e in entries]
    return nb


def cosmetic(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """What a copier does to a classmate's notebook: every answer cell recommented, the written answers reworded."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if not (cell.metadata.get("nbgrader") or {}).get("solution"):
            continue
        if cell.cell_type == "code":
            cell.source = "# my own solution, written from scratch\n" + cell.source + "\n# (checked twice)\n"
        else:
            cell.source = "My answer, in my own words: " + cell.source.lower()
    return nb


def settings() -> pipeline.Settings:
    return pipeline.Settings(limits=sandbox.Limits(wall_s=60, memory_bytes=4 * 1024**3, processes=256),
                             cell_timeout=10, jobs=1, unisolated=sandbox.isolation().kind == "none")


def hand_in(course: Path, folder: Path, students: dict[str, nbformat.NotebookNode]) -> None:
    for student, nb in students.items():
        path = folder / student / f"{LAB}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
        nbgrader_api.submit(course, LAB, student, path)


def page_text(course: Path, student: str) -> str:
    page = course / "feedback" / student / LAB / f"{LAB}.html"
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("copies")
    course = root / "course"
    pipeline.setup(course, SOLUTIONS)
    release = nbformat.read(course / "release" / LAB / f"{LAB}.ipynb", as_version=4)
    good = cases.solved(release, nbformat.read(SOLUTIONS / LAB / f"{LAB}.ipynb", as_version=4))
    rng = random.Random(7)
    jittered = [json.loads(json.dumps(e), parse_float=lambda s: float(s) * 1.05 * math.exp(rng.gauss(0, 0.005)))
                for e in home_records("a")]
    ann = carrying(good, home_records("a"))
    # First run: ann and cy, two honest runs of the same lab with the same code.
    hand_in(course, root / "class", {"ann": ann, "cy": carrying(good, home_records("b"))})
    first = pipeline.grade(course, settings(), solutions=SOLUTIONS)
    # A later run: ben hands in ann's notebook reworded, dee ann's numbers rescaled and jittered, eve ann's
    # notebook unchanged; each is compared with what was graded before.
    hand_in(course, root / "class", {"ben": cosmetic(ann), "dee": carrying(good, jittered), "eve": copy.deepcopy(ann)})
    later = pipeline.grade(course, settings(), solutions=SOLUTIONS)
    pipeline.feedback(course)
    export.export(course)
    return {"course": course, "root": root, "first": first, "later": later}


def _flags(course: Path, student: str) -> list[str]:
    record = State.load(course).get(LAB, student)
    return [f for f in record.flags if f.startswith(copies.FLAG_PREFIX)]


def test_two_honest_runs_are_not_flagged(course) -> None:
    assert not course["first"].copies, course["first"].copies
    record = State.load(course["course"]).get(LAB, "cy")
    assert not _flags(course["course"], "cy") and copies.HELD_NOTE not in record.notes, record.flags


def test_a_copy_unchanged_reworded_or_retimed_is_flagged_with_the_pair_named(course) -> None:
    c = course["course"]
    pairs = {tuple(p["students"]) for p in copies.pairs(c)}
    assert pairs == {("ann", "ben"), ("ann", "dee"), ("ann", "eve"), ("ben", "dee"), ("ben", "eve"), ("dee", "eve")}
    assert len(course["later"].copies) == 6 and "pair(s)" in course["later"].line()
    for student in ("ann", "ben", "dee", "eve"):
        named = {other for other in ("ann", "ben", "dee", "eve") if other != student
                 and any(f"{other}'s submission" in f for f in _flags(c, student))}
        assert named == {"ann", "ben", "dee", "eve"} - {student}, _flags(c, student)
        assert State.load(c).get(LAB, student).flagged
        assert all("nothing deducted" in f for f in _flags(c, student))
    assert any("identical raw timing sample" in f for f in _flags(c, "ben"))
    assert any("correlated at r=" in f for f in _flags(c, "dee"))


def test_the_students_page_says_only_that_it_is_held_for_review(course) -> None:
    c = course["course"]
    text = page_text(c, "ann")
    assert copies.HELD_NOTE in text
    assert not re.search(r"\b(ben|dee|eve)\b", text), "the page names no one"
    assert copies.HELD_NOTE not in page_text(c, "cy")


def test_status_export_class_report_and_formgrader_list_the_pairs(course, tmp_path: Path) -> None:
    c = course["course"]
    status = export.status(c)
    assert "lab00_fixture:ann~ben" in status["copies"] and "cy" not in " ".join(status["copies"])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["grade", "status", "--course", str(c)]) == 0
    assert "copy pair  lab00_fixture: ann ~ ben (24 identical raw timing sample(s)" in printed.getvalue()
    assert {"lab00_fixture/ann", "lab00_fixture/ben"} <= set(status["flagged"])
    doc = json.loads((c / "export" / "grades.json").read_text(encoding="utf-8"))
    assert {tuple(p["students"]) for p in doc["copies"]} >= {("ann", "ben")}
    assert all(p["why"] for p in doc["copies"])
    report = classreport.render_class(classreport.load_export(c / "export" / "grades.json"))
    assert "Pairs of submissions whose home measurements one run made" in report.html
    assert report.html.count("<td>ann</td>") >= 3
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{c / 'gradebook.db'}", nbgrader_api.COURSE_ID) as gb:
        books = {s: gb.find_submission_notebook(LAB, LAB, s) for s in ("ann", "ben", "cy")}
        comments = {s: " ".join(c.auto_comment or "" for c in nb.comments) for s, nb in books.items()}
        assert books["ann"].flagged and books["ben"].flagged
    # nbgrader's feedback renders that comment for the student: it names no one
    assert copies.HELD_FLAG in comments["ann"] and "ben" not in comments["ann"] and copies.HELD_FLAG not in comments["cy"]


def test_a_resubmission_that_is_no_longer_a_copy_clears_its_pair(course) -> None:
    """ben hands in a notebook of his own (no home records): the pairs naming ben go, ann's other pairs stay."""
    c = course["course"]
    release = nbformat.read(c / "release" / LAB / f"{LAB}.ipynb", as_version=4)
    own = cases.solved(release, nbformat.read(SOLUTIONS / LAB / f"{LAB}.ipynb", as_version=4))
    hand_in(c, course["root"] / "again", {"ben": own})
    pipeline.grade(c, settings(), students=["ben"], solutions=SOLUTIONS)
    assert not _flags(c, "ben") and copies.HELD_NOTE not in State.load(c).get(LAB, "ben").notes
    assert not any("ben's" in f for f in _flags(c, "ann")) and any("eve's" in f for f in _flags(c, "ann"))


# ---------------------------------------------------------------------------------------------
# the real labs


@pytest.mark.parametrize("lab", homework.LABS)
def test_each_labs_home_records_mark_a_recommented_copy_of_its_executed_reference(lab: str) -> None:
    """What differs from lab to lab is the records a home run saves: the lab's reference, run at home as a
    student hands it in, and a classmate's recommented copy of it share what two runs cannot. (The pipeline
    that acts on a found pair is the same for every lab: the fixture lab above, and lab 6 below.)"""
    handed = nbformat.read(H.solution_at_home(lab), as_version=4)
    copied = cosmetic(handed)
    prints = [copies.fingerprint(homework.from_notebook(nb), nb, student=student, lab=lab, sha256=student)
              for student, nb in (("ann", handed), ("ben", copied))]
    assert prints[0].series, f"{lab}: the executed reference carries no timing samples"
    found = copies.copies(prints)
    assert [p.students for p in found] == [("ann", "ben")], lab
    assert "identical raw timing sample" in found[0].why()


def test_a_copy_of_a_classmates_executed_lab6_notebook_is_flagged_when_graded(tmp_path: Path) -> None:
    """Lab 6's reference run at home and graded (`labs_helpers.graded_solution`), then the executed notebook
    handed in again by a classmate, recommented and with its written answers reworded."""
    lab = "lab06_together"
    H.graded_solution(lab)
    course = H.course_for(lab)
    handed = course / "submitted" / H.SOLUTION_STUDENT / lab / f"{lab}.ipynb"
    path = tmp_path / lab / f"{lab}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(cosmetic(nbformat.read(handed, as_version=4)), path)
    run = H.autograde(course, lab, "copier", path)
    state = State.load(course)
    flags = {s: [f for f in state.get(lab, s).flags if f.startswith(copies.FLAG_PREFIX)]
             for s in (H.SOLUTION_STUDENT, "copier")}
    assert any("copier's submission" in f for f in flags[H.SOLUTION_STUDENT]), flags
    assert any(f"{H.SOLUTION_STUDENT}'s submission" in f for f in flags["copier"]), flags
    assert run.record.flagged  # the record as the run left it, the review included
    # The blank copy, where the suite graded it in this course, is an honest submission of its own
    if state.get(lab, H.BLANK_STUDENT) is not None:
        assert not any(copies.FLAG_PREFIX in f for f in state.get(lab, H.BLANK_STUDENT).flags), lab
