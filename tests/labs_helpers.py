"""Shared helpers for the lab tests: find the labs, read their cells, autograde a notebook for real.

Autograding goes through the real grading pipeline (`perflab.grading.pipeline`: the notebook runs in
the sandbox, the lab's probes after each autograded cell, the judges decide in this process, the
scores land in nbgrader's gradebook) in a temporary course folder, in tiny mode. A lab's solution and its blank student copy are each graded once per test
session and cached, so the common checks (tests/test_labs_common.py) and a lab's own tests
(tests/test_labNN.py) share the run:

    run = labs_helpers.graded_solution("lab01_measure")   # GradedRun: scores, executed notebook, time
    run = labs_helpers.graded_blank("lab01_measure")
"""

from __future__ import annotations

import atexit
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from perflab.grading import nbgrader_api
from perflab.labs import build

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
# The kit's own tests run labs in tiny mode: the same code paths on a few images.
TINY_ENV = {"PERFLAB_MODE": "tiny"}
# Seconds one cell may run when a test autogrades (a tiny-mode cell takes seconds; this only
# stops a hung kernel from hanging the suite).
CELL_TIMEOUT = 300
SOLUTION_STUDENT = "solution"
BLANK_STUDENT = "blank"

SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
HIDDEN_MARKERS = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
MARK_SCHEME_MARKERS = ("=== BEGIN MARK SCHEME ===", "=== END MARK SCHEME ===")


def lab_names() -> list[str]:
    return build.lab_names()


def source_cells(lab: str) -> list[Any]:
    return list(build.read_notebook(build.source_notebook(lab)).cells)


def nbgrader_meta(cell: Any) -> dict[str, Any]:
    return dict(cell.get("metadata", {}).get("nbgrader", {}))


def grade_cells(lab: str) -> list[Any]:
    return [c for c in source_cells(lab) if nbgrader_meta(c).get("grade")]


def marker_problems(source: str, begin: str, end: str) -> list[str]:
    """Why `begin`/`end` markers in `source` are unbalanced or nested (empty when fine)."""
    problems, depth = [], 0
    for number, line in enumerate(source.splitlines(), 1):
        text = line.strip()
        if text.startswith(begin):
            if depth:
                problems.append(f"line {number}: {begin} inside an open block")
            depth += 1
        elif text.startswith(end):
            if not depth:
                problems.append(f"line {number}: {end} without {begin}")
            depth = max(depth - 1, 0)
    if depth:
        problems.append(f"{begin} never closed")
    return problems


def solution_lines(source: str) -> list[str]:
    """The lines inside BEGIN/END SOLUTION (or HIDDEN TESTS) blocks of a cell."""
    inside, out = False, []
    for line in source.splitlines():
        text = line.strip()
        if text.startswith(("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS")):
            inside = True
        elif text.startswith(("### END SOLUTION", "### END HIDDEN TESTS")):
            inside = False
        elif inside:
            out.append(line)
    return out


# ---------------------------------------------------------------------------------------------
# Autograding for real


# The verifier's codes for a re-measurement that timed both sides and found the figure short of its bar or of
# the keep rule, or ran out of pairs: a verdict of the host's timing at tiny sizes, not of the notebook's
# plumbing (a decision kept on a marginal gain at home re-measured 0.88x on a CI host whose second core was
# busy: a loader worker then shares its core). The verdicts themselves are held on a simulated machine
# (tests/test_decisions.py) and on real ones by the benchmarks and `make demo`.
TIMED_CODES = frozenset({"below_bar", "undecided", "too_few_pairs", "slower_than_without", "dropped_by_rule",
                         "no_gain_within_ci"})


def only_timed_shortfalls(short: dict[str, T], code: Callable[[T], Any], what: str) -> dict[str, T]:
    """Of `short` (grade_id -> what the grader recorded for a cell below full marks), the cells lost on the
    host's timing (`code` of the record in TIMED_CODES), reported as a warning; AssertionError where any
    other cell is short (a check, a gate, a record or a config the notebook got wrong)."""
    timed = {gid: s for gid, s in short.items() if code(s) in TIMED_CODES}
    untimed = {gid: s for gid, s in short.items() if gid not in timed}
    if untimed:
        raise AssertionError(f"{what}: below full marks for a reason other than timing: {untimed}")
    if timed:
        warnings.warn(f"{what}: re-measured below full marks on this host's timing: {timed}", stacklevel=2)
    return timed


@dataclass(frozen=True)
class GradedRun:
    """One notebook autograded by nbgrader: its per-cell scores, the executed notebook and the time."""

    lab: str
    student: str
    scores: tuple[nbgrader_api.CellScore, ...]
    notebook: Any
    seconds: float
    folder: Path  # autograded/<student>/<lab>/: what the notebook wrote at run time lies here
    record: Any = None  # the grader's Record (perflab.grading.state): each cell's score and line

    def shortfalls(self) -> dict[str, str]:
        """grade_id -> 'score/max: the grader's line' for every autograded cell below full marks."""
        lines = {c.grade_id: c.error for c in (self.record.cells if self.record else ())}
        return {s.grade_id: f"{s.auto_score}/{s.max_score}: {lines.get(s.grade_id)}"
                for s in self.autograded if s.auto_score != s.max_score}

    def timed_shortfalls(self) -> dict[str, str]:
        """The shortfalls whose cell was re-measured and judged on its timing (`TIMED_CODES`)."""
        codes = {c.grade_id: c.code for c in (self.record.cells if self.record else ())}
        return {gid: line for gid, line in self.shortfalls().items() if codes.get(gid) in TIMED_CODES}

    def untimed_shortfalls(self) -> dict[str, str]:
        """Every shortfall but the timed ones: a check, a gate, a record or a config the notebook got wrong."""
        timed = self.timed_shortfalls()
        return {gid: line for gid, line in self.shortfalls().items() if gid not in timed}

    @property
    def autograded(self) -> list[nbgrader_api.CellScore]:
        return [s for s in self.scores if not s.manual]

    @property
    def manual(self) -> list[nbgrader_api.CellScore]:
        return [s for s in self.scores if s.manual]

    def cell(self, grade_id: str) -> Any:
        for cell in self.notebook.cells:
            if nbgrader_meta(cell).get("grade_id") == grade_id:
                return cell
        raise KeyError(f"{self.lab}: no cell with grade_id {grade_id!r}")

    def errors(self) -> list[str]:
        """'cell N (grade_id): ename: evalue' for every cell that raised."""
        out = []
        for i, cell in enumerate(self.notebook.cells):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    gid = nbgrader_meta(cell).get("grade_id", "")
                    out.append(f"cell {i} ({gid}): {output.get('ename')}: {output.get('evalue')}")
        return out

    def stderr_test_cells(self) -> list[str]:
        """grade_ids of test cells with text on stderr (nbgrader scores those 0)."""
        out = []
        for cell in self.notebook.cells:
            meta = nbgrader_meta(cell)
            if meta.get("grade") and not meta.get("solution"):
                text = "".join(o.get("text", "") for o in cell.get("outputs", [])
                               if o.get("output_type") == "stream" and o.get("name") == "stderr")
                if text:
                    out.append(f"{meta.get('grade_id')}: {text.strip()[:300]}")
        return out


def autograde(course: Path, lab: str, student: str, notebook: Path, *,
              env: dict[str, str] | None = None, timeout: int = CELL_TIMEOUT) -> GradedRun:
    """Submit `notebook` as `student` in `course` (lab set up there) and grade it with the pipeline."""
    from perflab.grading import pipeline, sandbox, state

    nbgrader_api.submit(course, lab, student, notebook)
    # The kit's own notebooks: graded even where the sandbox has no namespaces (recorded as such).
    settings = pipeline.Settings(limits=sandbox.Limits(wall_s=SUBMISSION_WALL_S), cell_timeout=timeout,
                                 env=dict(env or TINY_ENV), unisolated=sandbox.isolation().kind == "none")
    start = time.perf_counter()
    summary = pipeline.grade(course, settings, labs=[lab], students=[student], force=True)
    seconds = time.perf_counter() - start
    assert summary.graded or summary.failed, summary.line()
    folder = course / "autograded" / student / lab
    executed = build.read_notebook(folder / f"{lab}.ipynb")
    return GradedRun(lab, student, tuple(nbgrader_api.scores(course, lab, student)), executed, seconds, folder,
                     state.State.load(course).get(lab, student))


# Seconds one graded submission may take in the kit's tests (a tiny-mode lab takes a minute or two).
SUBMISSION_WALL_S = 1500


_ROOT: list[Path] = []
_COURSES: dict[str, Path] = {}
_RUNS: dict[tuple[str, str], GradedRun] = {}


def _session_root() -> Path:
    if not _ROOT:
        root = Path(tempfile.mkdtemp(prefix="perflab-labtests-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        _ROOT.append(root)
    return _ROOT[0]


def course_for(lab: str) -> Path:
    """A course folder (one per lab per session) where `lab` has been generated from solutions/."""
    if lab not in _COURSES:
        from perflab.grading import pipeline

        course = _session_root() / re.sub(r"\W", "_", lab)
        pipeline.setup(course, REPO / "solutions", labs=[lab])
        _COURSES[lab] = course
    return _COURSES[lab]


def graded_solution(lab: str) -> GradedRun:
    """The lab's solution notebook, autograded in tiny mode (once per session). A lab whose decisions
    rest on its home measurements (`perflab.labs.homework.LABS`) runs once at home first, as a student
    hands it in: saved with the outputs that carry them."""
    key = (lab, SOLUTION_STUDENT)
    if key not in _RUNS:
        course = course_for(lab)
        _RUNS[key] = autograde(course, lab, SOLUTION_STUDENT, solution_at_home(lab))
    return _RUNS[key]


_HOMES: dict[str, Path] = {}


def solution_at_home(lab: str) -> Path:
    """The lab's solution notebook as its student hands it in (`run_at_home`), run once per session."""
    if lab not in _HOMES:
        _HOMES[lab] = run_at_home(lab, build.source_notebook(lab))
    return _HOMES[lab]


def run_at_home(lab: str, notebook: Path) -> Path:
    """`notebook` as the student hands it in: for a lab of `homework.LABS`, executed once in tiny mode
    in a folder of its own and saved with its outputs (the path of that copy); else unchanged."""
    import nbformat

    from perflab import demo
    from perflab.labs import homework

    if lab not in homework.LABS:
        return notebook
    # A folder of its own under a parent of its own: a lab reads the results of the labs beside it (lab 6
    # reads labs 2-5's decisions), and this lab is graded alone.
    folder = _session_root() / "home" / f"{lab}-{notebook.stem}-{len(_RUNS)}" / lab
    demo.home_run(nbformat.read(notebook, as_version=4), folder, "tiny", name=f"{lab}.ipynb")
    return folder / f"{lab}.ipynb"


def graded_blank(lab: str) -> GradedRun:
    """The lab's student copy as nbgrader releases it, unanswered, autograded in tiny mode (once per session)."""
    key = (lab, BLANK_STUDENT)
    if key not in _RUNS:
        course = course_for(lab)
        release = course / "release" / lab / f"{lab}.ipynb"
        _RUNS[key] = autograde(course, lab, BLANK_STUDENT, release)
    return _RUNS[key]


_GENERATED: dict[str, str] = {}


def generated(lab: str) -> str:
    """What nbgrader generates from solutions/ for `lab` (all labs generated once per session)."""
    if not _GENERATED:
        _GENERATED.update(build.generated_notebooks())
    return _GENERATED[lab]


def every_cheat_notebook(lab: str, name: str, extra: str) -> Path:
    """The lab's blank release with every cheat of the fixture corpus (tests/fixtures/grading/cases.py)
    inserted after its setup cell, plus `extra` (a lab-specific rebinding), written under the lab's own
    notebook name in `<course>/<name>/`; its path."""
    import nbformat
    from nbformat.v4 import new_code_cell

    sys.path.insert(0, str(REPO / "tests" / "fixtures" / "grading"))
    import cases

    course = course_for(lab)
    nb = nbformat.read(course / "release" / lab / f"{lab}.ipynb", as_version=4)
    setup = next(i for i, c in enumerate(nb.cells) if nbgrader_meta(c).get("grade_id") == "setup")
    for code in reversed([*(code for _, code, _ in cases.CHEATS), extra]):
        nb.cells.insert(setup + 1, new_code_cell(code))
    path = course / name / f"{lab}.ipynb"
    path.parent.mkdir(exist_ok=True)
    nbformat.write(nb, path)
    return path


def snooped(run: GradedRun) -> bytes:
    """What the corpus's snoop printed (zlib + base64 in 76-character lines), decoded."""
    import base64
    import zlib

    text = "".join(o.get("text", "") for c in run.notebook.cells for o in c.get("outputs", []))
    lines = [ln for ln in text.splitlines() if re.fullmatch(r"[A-Za-z0-9+/=]{1,76}", ln)]
    return zlib.decompress(base64.b64decode("".join(lines))) if lines else b""
