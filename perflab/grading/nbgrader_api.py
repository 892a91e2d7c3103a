"""Thin, documented plumbing over nbgrader's Python API: one course folder, four verbs.

A course folder is nbgrader's standard layout with perflab's settings:

    <course>/nbgrader_config.py          a copy of autograder/nbgrader_config.py
    <course>/gradebook.db                the gradebook (SQLite); one writer at a time
    <course>/source/<lab>/<lab>.ipynb    instructor notebooks (solutions, visible and hidden tests)
    <course>/release/<lab>/              student copies made by `generate_assignment`
    <course>/submitted/<student>/<lab>/  what a student handed in (`submit` puts it there)
    <course>/autograded/<student>/<lab>/ the executed, scored copy (`autograde`)
    <course>/feedback/<student>/<lab>/   HTML feedback (`generate_feedback`)

Every function takes the course folder first, then the lab (nbgrader's "assignment") and the
student, and raises `GradingError` with nbgrader's log tail when nbgrader reports a failure:

    course = make_course(tmp / "course")
    add_source(course, "lab01_measure", "solutions/lab01_measure/lab01_measure.ipynb")
    generate_assignment(course, "lab01_measure")            # -> release/lab01_measure/
    submit(course, "lab01_measure", "alice", "alice/lab01_measure.ipynb")
    autograde(course, "lab01_measure", "alice", timeout=600, env={"PERFLAB_MODE": "tiny"})
    for cell in scores(course, "lab01_measure", "alice"): ...
    generate_feedback(course, "lab01_measure", "alice")     # -> feedback/alice/lab01_measure/ (scrub first)

Autograding executes the notebook in the `python3` kernel of this environment, in the
submission's own autograded folder (so files a lab writes land there). nbgrader sets
`NBGRADER_EXECUTION=autograde` while it runs, which makes `perflab.env.run_mode()` return
"grade"; `env=` adds variables for that run only (e.g. `PERFLAB_MODE=tiny` for the kit's own
tests; a value of None removes a variable). The kernel inherits the rest of this process's
environment. These calls run nbgrader in this process: isolation (limits, a clean copy, a
child process) is the job of the pipeline that calls them.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
import re
import shutil
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

COURSE_ID = "perflab"
# The settings every course folder gets (kept in the repository, beside the expectations).
CONFIG_FILE = Path(__file__).resolve().parents[2] / "autograder" / "nbgrader_config.py"
# Seconds one cell may run while autograding when the caller does not say.
DEFAULT_CELL_TIMEOUT = 600
COURSE_FOLDERS = ("source", "release", "submitted", "autograded", "feedback")
# nbgrader's own timestamp format for submitted/<student>/<lab>/timestamp.txt.
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"


class GradingError(RuntimeError):
    """nbgrader could not do what was asked; the message names the step, lab and student."""


@dataclass(frozen=True)
class CellScore:
    """One graded cell of one submission, as the gradebook holds it.

    `manual` is True for cells a person grades (written answers, tasks); their `auto_score` is
    None until graded, or 0 when nbgrader saw the answer left as released.
    """

    notebook: str
    grade_id: str
    auto_score: float | None
    manual_score: float | None
    max_score: float
    manual: bool
    needs_manual_grade: bool

    @property
    def score(self) -> float:
        """The score in force: the manual score if a person gave one, else the automatic one, else 0."""
        if self.manual_score is not None:
            return self.manual_score
        return self.auto_score or 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"notebook": self.notebook, "grade_id": self.grade_id, "auto_score": self.auto_score,
                "manual_score": self.manual_score, "max_score": self.max_score, "manual": self.manual,
                "needs_manual_grade": self.needs_manual_grade}


# ---------------------------------------------------------------------------------------------
# The course folder


def load_config(course_dir: str | os.PathLike[str], **overrides: Any) -> Any:
    """nbgrader's traitlets Config: autograder/nbgrader_config.py, rooted at `course_dir`.

    `overrides` are "Section.name" = value pairs written with a double underscore,
    e.g. `Execute__timeout=60`.
    """
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    if CONFIG_FILE.is_file():
        config = PyFileConfigLoader(CONFIG_FILE.name, str(CONFIG_FILE.parent)).load_config()
    else:  # an installed perflab without the repository beside it: the same essentials
        config = Config()
        config.CourseDirectory.course_id = COURSE_ID
        config.Execute.kernel_name = "python3"
    config.CourseDirectory.root = str(Path(course_dir).resolve())
    for key, value in overrides.items():
        section, _, name = key.partition("__")
        if not name:
            raise ValueError(f"config override {key!r}: write it as Section__name, e.g. Execute__timeout")
        setattr(getattr(config, section), name, value)
    return config


def make_course(course_dir: str | os.PathLike[str]) -> Path:
    """Create (or reuse) a course folder with perflab's settings; returns its absolute path."""
    course = Path(course_dir).resolve()
    for name in COURSE_FOLDERS:
        (course / name).mkdir(parents=True, exist_ok=True)
    if CONFIG_FILE.is_file():
        shutil.copyfile(CONFIG_FILE, course / "nbgrader_config.py")
    return course


def add_source(course_dir: str | os.PathLike[str], lab: str,
               notebooks: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> Path:
    """Copy a lab's source notebook(s) into source/<lab>/ (replacing what was there)."""
    course = _course(course_dir)
    paths = [Path(notebooks)] if isinstance(notebooks, (str, os.PathLike)) else [Path(p) for p in notebooks]
    if not paths:
        raise ValueError(f"add_source {lab}: no notebooks given")
    dest = course / "source" / lab
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for path in paths:
        if path.suffix != ".ipynb" or not path.is_file():
            raise FileNotFoundError(f"add_source {lab}: {path} is not a notebook file")
        shutil.copyfile(path, dest / path.name)
    return dest


def generate_assignment(course_dir: str | os.PathLike[str], lab: str) -> Path:
    """Run nbgrader generate_assignment for `lab`: records its cells in the gradebook and writes
    the student copy (solutions and hidden tests removed, test cells locked) to release/<lab>/."""
    course = _course(course_dir)
    if not (course / "source" / lab).is_dir():
        raise FileNotFoundError(f"generate_assignment: {course / 'source' / lab} does not exist "
                                "(copy the lab's notebook there with add_source first)")
    with _tools_on_path():
        result = _api(course).generate_assignment(lab, force=True, create=True)
    _check(result, "generate_assignment", lab)
    return course / "release" / lab


def submit(course_dir: str | os.PathLike[str], lab: str, student: str,
           notebooks: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
           timestamp: _dt.datetime | None = None) -> Path:
    """Place a student's notebook(s) in submitted/<student>/<lab>/ with nbgrader's timestamp.txt."""
    course = _course(course_dir)
    _check_name("student", student)
    paths = [Path(notebooks)] if isinstance(notebooks, (str, os.PathLike)) else [Path(p) for p in notebooks]
    dest = course / "submitted" / student / lab
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"submit {lab} for {student}: {path} does not exist")
        shutil.copyfile(path, dest / path.name)
    when = timestamp or _dt.datetime.now(_dt.UTC)
    (dest / "timestamp.txt").write_text(when.strftime(TIMESTAMP_FORMAT).strip(), encoding="utf-8")
    return dest


def autograde(course_dir: str | os.PathLike[str], lab: str, student: str, *,
              timeout: int = DEFAULT_CELL_TIMEOUT, env: Mapping[str, str | None] | None = None,
              config: Mapping[str, Any] | None = None) -> Path:
    """Run nbgrader autograde on submitted/<student>/<lab>/ and return autograded/<student>/<lab>/.

    Cells are executed in order in a fresh kernel; each may run `timeout` seconds. Scores go to
    the gradebook (read them with `scores`). `env` sets (or, with None, removes) environment
    variables for the kernel of this run only. `config` adds nbgrader settings for this run, written
    as in `load_config` (e.g. `{"Autograde__autograde_preprocessors": [...]}`).
    """
    course = _course(course_dir)
    _check_name("student", student)
    if not (course / "submitted" / student / lab).is_dir():
        raise FileNotFoundError(f"autograde: {course / 'submitted' / student / lab} does not exist "
                                "(hand the notebook in with submit first)")
    if timeout < 1:
        raise ValueError(f"timeout: must be at least 1 second, got {timeout}")
    with _tools_on_path(), _environment(env or {}), warnings.catch_warnings():
        # nbgrader's own session handling warns (SAWarning) on every new submission; harmless.
        warnings.filterwarnings("ignore", message=".*not in session.*")
        result = _api(course, Execute__timeout=int(timeout), **dict(config or {})).autograde(
            lab, student, force=True, create=True)
    _check(result, "autograde", lab, student)
    return course / "autograded" / student / lab


def scores(course_dir: str | os.PathLike[str], lab: str, student: str) -> list[CellScore]:
    """The per-cell scores of `student`'s autograded `lab`, in notebook order, from the gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    course = _course(course_dir)
    out: list[CellScore] = []
    with _tools_on_path(), Gradebook(_db_url(course), COURSE_ID) as gb:
        try:
            submission = gb.find_submission(lab, student)
        except MissingEntry:
            raise GradingError(f"scores: no graded submission of {lab} by {student} in {course}") from None
        for nb in submission.notebooks:
            solution_cells = {cell.name for cell in nb.notebook.solution_cells}
            order = _cell_order(course / "source" / lab / f"{nb.name}.ipynb")
            rows = []
            for grade in nb.grades:
                manual = (grade.cell_type == "markdown" or grade.name in solution_cells
                          or grade.cell.type == "TaskCell")
                rows.append(CellScore(
                    notebook=nb.name, grade_id=grade.name, auto_score=grade.auto_score,
                    manual_score=grade.manual_score, max_score=float(grade.max_score or 0.0),
                    manual=bool(manual), needs_manual_grade=bool(grade.needs_manual_grade)))
            out.extend(sorted(rows, key=lambda r: order.get(r.grade_id, len(order))))
    return out


def generate_feedback(course_dir: str | os.PathLike[str], lab: str, student: str) -> Path:
    """Render nbgrader's HTML feedback for an autograded submission; returns its folder.

    nbgrader renders the autograded notebook as it is, hidden tests included: scrub it first
    (perflab.grading.feedback does, before anything reaches a student).
    """
    course = _course(course_dir)
    with _tools_on_path(), _quiet("traitlets"):  # nbgrader's traceback lands in the result's log, not the console
        result = _api(course).generate_feedback(lab, student, force=True)
    _check(result, "generate_feedback", lab, student)
    return course / "feedback" / student / lab


# ---------------------------------------------------------------------------------------------
# Internals


def _course(course_dir: str | os.PathLike[str]) -> Path:
    course = Path(course_dir).resolve()
    if not (course / "source").is_dir():
        raise FileNotFoundError(f"{course}: not a course folder (make one with make_course)")
    return course


def _cell_order(notebook: Path) -> dict[str, int]:
    """grade_id -> position of its cell in the source notebook (empty if the notebook is gone)."""
    import nbformat

    if not notebook.is_file():
        return {}
    nb = nbformat.read(notebook, as_version=4)
    ids = (cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") for cell in nb.cells)
    return {grade_id: i for i, grade_id in enumerate(ids) if grade_id}


def _db_url(course: Path) -> str:
    return f"sqlite:///{course / 'gradebook.db'}"


def _check_name(field: str, value: str) -> None:
    if not value or "/" in value or value.startswith(".") or value != value.strip():
        raise ValueError(f"{field}: {value!r} is not a usable folder name")


def _api(course: Path, **overrides: Any) -> Any:
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    config = load_config(course, **overrides)
    # A local exchange inside the course folder: nothing outside it is touched.
    (course / "exchange").mkdir(exist_ok=True)
    config.Exchange.root = str(course / "exchange")
    coursedir = CourseDirectory(config=config)
    return NbGraderAPI(coursedir=coursedir, config=config, log_level=logging.WARNING)


def _check(result: Mapping[str, Any], step: str, lab: str, student: str | None = None) -> None:
    who = f" for {student}" if student else ""
    text = (result.get("log") or "") + (result.get("error") or "")
    for line in text.splitlines():
        if line.strip():
            log.debug("%s %s%s: %s", step, lab, who, line)
    if not result.get("success"):
        tail = "\n".join(text.strip().splitlines()[-20:])
        raise GradingError(f"nbgrader {step} of {lab}{who} failed: {_cause(text)}\n{tail}")


# An exception line in nbgrader's log ("nbgrader.api.MissingEntry: No such taskcomment: ...").
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Entry|Exit)): (.*)$")


def _cause(log_text: str) -> str:
    """The first error nbgrader logged, as one line ("MissingEntry: No such taskcomment: ..."),
    skipping its generic "see the above traceback" wrappers."""
    for line in log_text.splitlines():
        match = _EXCEPTION_LINE.match(line.strip())
        if match and match.group(1) != "NbGraderException":
            return f"{match.group(1)}: {match.group(2)}"[:300]
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no reason given"


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Keep logger `name` from printing to the console for the duration (its records still reach
    the handlers nbgrader's API adds to capture them)."""
    logger = logging.getLogger(name)
    saved = logger.propagate
    logger.propagate = False
    try:
        yield
    finally:
        logger.propagate = saved


def _tools_on_path() -> contextlib.AbstractContextManager[None]:
    """nbgrader runs `alembic` by name when it creates a gradebook: put this interpreter's
    scripts folder (the venv's bin/) first on PATH, as an activated venv would (and ask it once)."""
    _alembic_head_once()
    scripts = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if scripts in path.split(os.pathsep):
        return contextlib.nullcontext()
    return _environment({"PATH": scripts + os.pathsep + path if path else scripts})


def _alembic_head_once() -> None:
    """nbgrader starts the `alembic` command each time it creates a gradebook (every course folder and
    every lab's template) only to read the head of its own migrations, fixed for the installed nbgrader:
    a process of its own, 2.5 s on 2 cores. Read once per process, what each later gradebook is given."""
    import functools

    import nbgrader.api as gradebook

    if not hasattr(gradebook.get_alembic_version, "cache_info"):
        gradebook.get_alembic_version = functools.cache(gradebook.get_alembic_version)


@contextlib.contextmanager
def _environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or remove) environment variables for the duration; the kernel started inside inherits them."""
    saved = {key: os.environ.get(key) for key in changes}
    try:
        for key, value in changes.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = str(value)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
