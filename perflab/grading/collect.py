"""Collect submissions into the course folder (a folder of notebooks or an LMS zip download), and list
what is collected: grading's first stage.

    collect(course, source)                  copy each matched notebook to submitted/<student>/<lab>/
    submissions(course, labs, students)      every collected submission, as a `Job`
    plan(course, state, ...)                 (to grade, already graded with the same content)

Which student and lab a file belongs to is read from its path (a zip member's name, or the path
below the folder given), in this order:

1. `--pattern REGEX` if given: a regular expression with the named group `student` (and
   optionally `lab`), matched against the file name, e.g. `(?P<student>[a-z0-9]+)-(?P<lab>lab\\d\\d_\\w+)\\.ipynb`.
2. An LMS export name, identified by the LMS's user id, so two people with the same name never
   become one (the name is kept as the display name):
   Canvas     `doejane_12345_67890_lab01_measure.ipynb` (`_LATE_` after the name when late) -> `doejane-12345`
   Moodle     `Jane Doe_12345_assignsubmission_file_lab01_measure.ipynb`, or that name as a folder -> `jane.doe-12345`
   Blackboard `Lab 1_jdoe_attempt_2026-01-02-10-00-00_lab01_measure.ipynb` -> `jdoe` (a unique username)
   The LMS's own id (Canvas user id, Moodle participant id, Blackboard username) is kept in the gradebook
   (the student's `lms_user_id`), and the display name as their first name: `export --lms` writes them back.
3. A folder per student: `<student>/<anything>.ipynb` (or `<student>/<lab>/...`).
4. The file name: `<student>_<...>.ipynb`, the student id before the first underscore
   (`doejane_lab01_measure.ipynb`).

The lab is the first known lab name (from the course's source/ folder) found in the path, or the
one given with `--lab`. A student id is letters, digits and `.@-`. Files that match nothing are
listed with the reason; so are older copies when a student handed in one lab twice (the newest
is kept, by timestamp, then by name). Nothing is ever guessed silently.
"""

from __future__ import annotations

import datetime as _dt
import re
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from perflab.grading import nbgrader_api as nbapi
from perflab.grading.result import Job
from perflab.grading.state import State, sha256

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.@-]*$")
# Folders LMS downloads and macOS zips add that never hold a submission.
IGNORED_PARTS = ("__MACOSX", ".ipynb_checkpoints")


@dataclass(frozen=True)
class Candidate:
    name: str  # path inside the zip or below the folder
    data: bytes
    when: _dt.datetime


@dataclass(frozen=True)
class Collected:
    student: str
    lab: str
    name: str
    display: str = ""  # the name the LMS export gives the student, kept beside the id
    lms_id: str = ""  # the LMS's own id of the student (Canvas user id, Moodle participant id, ...)


@dataclass(frozen=True)
class Report:
    collected: tuple[Collected, ...]
    unmatched: tuple[tuple[str, str], ...]  # (file, why)

    def lines(self) -> list[str]:
        out = [f"collected {len(self.collected)} submission(s)"]
        if self.unmatched:
            out.append(f"could not use {len(self.unmatched)} file(s):")
            out += [f"  {name}: {why}" for name, why in self.unmatched]
        return out


def read_source(source: Path) -> list[Candidate]:
    """Every file of a folder (recursively) or a zip, with its time."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"{source}: no such folder or zip file")
    out = []
    if source.is_file():
        if not zipfile.is_zipfile(source):
            raise ValueError(f"{source}: not a zip file; give a folder of notebooks or the LMS's zip download")
        with zipfile.ZipFile(source) as zf:
            for info in zf.infolist():
                if not info.is_dir():
                    out.append(Candidate(info.filename, zf.read(info), _dt.datetime(*info.date_time)))
    else:
        for path in sorted(source.rglob("*")):
            if path.is_file():
                out.append(Candidate(path.relative_to(source).as_posix(), path.read_bytes(),
                                     _dt.datetime.fromtimestamp(path.stat().st_mtime)))
    return out


CANVAS = re.compile(r"^(?P<login>[A-Za-z0-9.-]+?)(?:_LATE)?_(?P<uid>\d+)_(?P<sub>\d+)_")
MOODLE = re.compile(r"^(?P<name>[^_/]+)_(?P<uid>\d+)_assignsubmission_[a-z]+_")
BLACKBOARD = re.compile(r"_(?P<user>[A-Za-z0-9.@-]+)_attempt_\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2}")


def lms_student(path: PurePosixPath) -> tuple[str, str, str] | None:
    """(student id, display name, the LMS's user id) from an LMS export's file or folder name, or None."""
    for part in (path.name, *path.parts[:-1]):
        if m := CANVAS.match(part):
            return f"{m.group('login')}-{m.group('uid')}", m.group("login"), m.group("uid")
        if m := MOODLE.match(part):
            display = m.group("name").strip()
            slug = re.sub(r"[^a-z0-9]+", ".", display.lower()).strip(".") or "student"
            return f"{slug}-{m.group('uid')}", display, m.group("uid")
        if m := BLACKBOARD.search(part):
            return m.group("user"), m.group("user"), m.group("user")
    return None


def match(name: str, labs: Sequence[str], lab: str | None = None,
          pattern: re.Pattern[str] | None = None) -> tuple[str, str] | str:
    """(student, lab) for a file name, or the reason it does not match."""
    path = PurePosixPath(name)
    if path.suffix != ".ipynb":
        return f"not a notebook ({path.suffix or 'no extension'})"
    student = found_lab = None
    lms = lms_student(path) if pattern is None else None
    if pattern is not None:
        m = pattern.search(path.name)
        if not m:
            return f"does not match --pattern {pattern.pattern!r}"
        student = m.group("student")
        found_lab = m.groupdict().get("lab")
    elif lms is not None:
        student = lms[0]
    elif len(path.parts) > 1:
        student = path.parts[0]
    else:
        student = path.stem.split("_", 1)[0] if "_" in path.stem else None
    found_lab = found_lab or lab or next((known for known in sorted(labs, key=len, reverse=True)
                                          if known in name), None)
    if not student:
        return "no student id in the file name (expected <student>_<lab>.ipynb or <student>/<lab>.ipynb)"
    if not STUDENT_ID.match(student):
        return f"{student!r} is not a usable student id (letters, digits and .@- only)"
    if found_lab is None:
        return f"no known lab in the name (known: {', '.join(labs) or 'none; run perflab grade setup'}); use --lab"
    if found_lab not in labs:
        return f"lab {found_lab!r} is not set up in this course"
    return student, found_lab


def collect(course: Path, source: Path, *, lab: str | None = None, pattern: str | None = None,
            labs: Iterable[str] | None = None) -> Report:
    """Copy every matched notebook to submitted/<student>/<lab>/<the lab's notebook name>."""
    course = Path(course).resolve()
    known = sorted(labs) if labs else sorted(p.name for p in (course / "source").iterdir() if p.is_dir())
    if lab is not None and lab not in known:
        raise ValueError(f"--lab {lab}: not set up in {course} (known: {', '.join(known) or 'none'})")
    regex = re.compile(pattern) if pattern else None
    if regex is not None and "student" not in regex.groupindex:
        raise ValueError(f"--pattern {pattern!r}: needs a named group (?P<student>...)")
    chosen: dict[tuple[str, str], Candidate] = {}
    unmatched: list[tuple[str, str]] = []
    for cand in read_source(source):
        if any(part in IGNORED_PARTS or part.startswith("._") for part in PurePosixPath(cand.name).parts):
            continue
        found = match(cand.name, known, lab, regex)
        if isinstance(found, str):
            unmatched.append((cand.name, found))
            continue
        previous = chosen.get(found)
        if previous is not None:
            older, newer = sorted([previous, cand], key=lambda c: (c.when, c.name))
            unmatched.append((older.name, f"an older copy of {found[0]}'s {found[1]}; kept {newer.name}"))
            cand = newer
        chosen[found] = cand
    collected = []
    for (student, lab_name), cand in sorted(chosen.items()):
        notebook = next((course / "source" / lab_name).glob("*.ipynb")).name
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / notebook
            path.write_bytes(cand.data)
            nbapi.submit(course, lab_name, student, path, timestamp=cand.when.astimezone(_dt.UTC))
        lms = lms_student(PurePosixPath(cand.name)) if regex is None else None
        collected.append(Collected(student, lab_name, cand.name, *(lms[1:] if lms else ())))
    _keep_display_names(course, collected)
    return Report(tuple(collected), tuple(unmatched))


def _keep_display_names(course: Path, collected: Sequence[Collected]) -> None:
    """Record each LMS display name (the student's first name field) and LMS id in the gradebook."""
    named = [c for c in collected if c.display]
    if not named or not (course / "gradebook.db").is_file():
        return
    import warnings

    from nbgrader.api import Gradebook

    with nbapi._tools_on_path(), warnings.catch_warnings(), \
            Gradebook(f"sqlite:///{course / 'gradebook.db'}", nbapi.COURSE_ID) as gb:
        warnings.simplefilter("ignore")
        for c in named:
            gb.update_or_create_student(c.student, first_name=c.display, lms_user_id=c.lms_id or None)


def lab_names(folder: Path) -> list[str]:
    """Labs in a solutions or release folder: subfolders holding at least one notebook."""
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"{folder}: no such folder")
    return sorted(p.name for p in Path(folder).iterdir()
                  if p.is_dir() and not p.name.startswith(".") and any(p.glob("*.ipynb")))


def submissions(course: Path, labs: Iterable[str] | None = None, students: Iterable[str] | None = None) -> list[Job]:
    """Every collected submission (submitted/<student>/<lab>/<notebook>), filtered."""
    course = Path(course)
    labs = set(labs) if labs else None
    students = set(students) if students else None
    known = set(lab_names(course / "source"))
    jobs = []
    for folder in sorted((course / "submitted").glob("*/*")):
        student, lab = folder.parent.name, folder.name
        if (labs and lab not in labs) or (students and student not in students) or lab not in known:
            continue
        info_nb = next((course / "source" / lab).glob("*.ipynb")).name
        path = folder / info_nb
        if path.is_file():
            jobs.append(Job(student, lab, path, sha256(path)))
    return jobs


def plan(course: Path, state: State, labs: Iterable[str] | None = None, students: Iterable[str] | None = None,
         force: bool = False) -> tuple[list[Job], list[Job]]:
    """(to grade, already graded) for the selection."""
    todo, done = [], []
    for job in submissions(course, labs, students):
        (done if (state.done(job.lab, job.student, job.sha256) and not force) else todo).append(job)
    return todo, done
