"""The instructor's workflow over one course folder: set up, release, grade, feedback.

    setup(course, solutions)                 source/ + release/ + gradebook from solutions/<lab>/
    release(course, bundle)                  student copies and a zip with no solutions or hidden tests
    grade(course, settings)                  every collected submission not graded yet -> Summary
    feedback(course)                         HTML per (student, lab), hidden tests never shown

Grading one submission (`grade_one`): the parent copies what the grade needs into a fresh work
folder (`prepare_job`: this lab's gradebook template, the released notebook, the submission),
runs `perflab.grading.worker` there in the sandbox, and reads the result from its pipe. Only the
parent writes the gradebook, the state file and `autograded/` (`merge`), one result at a time,
so the local pool and the Ray back-end share the same, single writer.

Local pool rule (`default_jobs`): timed work must never share cores or a GPU. With a GPU, one
job per GPU, each pinned to its own (CUDA_VISIBLE_DEVICES). Without, one job per
`CORES_PER_JOB` cores, each pinned to its own cores (sched_setaffinity), and one job when the
machine has fewer than `MIN_CORES_FOR_POOL`. Whenever more than one job runs, timed sections
also take the run's timing lock (`timelock.timed_section`), so they run one at a time.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import os
import queue
import re
import shutil
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perflab.grading import feedback as fb
from perflab.grading import nbgrader_api as nbapi
from perflab.grading import sandbox
from perflab.grading.checks import grade_id
from perflab.grading.state import CellResult, Record, State, lock, sha256
from perflab.verify import guard

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
COURSE_DIR = REPO / "autograder" / "course"
SOLUTIONS_DIR = REPO / "solutions"
# Cores one grading job gets to itself: a training step uses two threads well on a laptop-class CPU.
CORES_PER_JOB = 2
# Below this many cores a second job would share cores with timed work: grade one at a time.
MIN_CORES_FOR_POOL = 4
BUNDLE_NAME = "perflab-student-bundle.zip"
# Text that must never leave the course folder in a student bundle.
SECRET_MARKERS = ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS")
# A results file a graded notebook may hand back (kept in autograded/<student>/<lab>/results/).
RESULTS_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.json")


@dataclass(frozen=True)
class Settings:
    """How a grading run grades."""

    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    cell_timeout: int = 600  # seconds one cell may run before it is interrupted (and scored 0)
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the kernel
    jobs: int | None = None  # None: `default_jobs()`
    gpus: int = 0  # GPUs grading uses (the local pool gives each job one)
    hide: tuple[Path, ...] = ()  # more folders the sandbox must not see

    def __post_init__(self) -> None:
        if self.cell_timeout < 1:
            raise ValueError(f"cell_timeout: must be at least 1 second, got {self.cell_timeout}")
        if self.cell_timeout >= self.limits.wall_s:
            raise ValueError(f"cell_timeout ({self.cell_timeout} s) must be shorter than the wall-time "
                             f"limit of a submission ({self.limits.wall_s} s)")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"jobs: must be at least 1, got {self.jobs}")


@dataclass(frozen=True)
class Job:
    """One submission to grade."""

    student: str
    lab: str
    path: Path  # submitted/<student>/<lab>/<notebook>.ipynb
    sha256: str


@dataclass(frozen=True)
class LabInfo:
    """What the parent knows of a lab from its source notebook (never sent to the sandbox)."""

    lab: str
    notebook: str  # file name, e.g. lab01_measure.ipynb
    cells: tuple[dict[str, Any], ...]  # [{"grade_id", "max_score", "hidden"}] in notebook order
    guarded: dict[str, list[str]]  # grade_id -> hidden-test lines (for the leak guard)

    @property
    def hidden(self) -> set[str]:
        return set(self.guarded)


@dataclass(frozen=True)
class Summary:
    graded: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # already graded with the same content
    failed: tuple[str, ...] = ()

    def line(self) -> str:
        return (f"graded {len(self.graded)} submission(s) ({len(self.failed)} could not be run), "
                f"{len(self.skipped)} already graded")


def default_jobs(cores: int | None = None, gpus: int = 0) -> int:
    """The local pool's size: see the module docstring for the rule."""
    if gpus > 0:
        return gpus
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 1 if cores < MIN_CORES_FOR_POOL else cores // CORES_PER_JOB


# ---------------------------------------------------------------------------------------------
# setup and release


def lab_names(folder: Path) -> list[str]:
    """Labs in a solutions or release folder: subfolders holding at least one notebook."""
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"{folder}: no such folder")
    return sorted(p.name for p in Path(folder).iterdir()
                  if p.is_dir() and not p.name.startswith(".") and any(p.glob("*.ipynb")))


def support_files(folder: Path) -> list[Path]:
    """Files a lab ships beside its notebook (data, helpers) that a student may see: not the
    notebook's text twin (labNN.py, which holds the solutions), nothing with a solution or
    hidden-test marker in it, no hidden or cache files."""
    notebooks = {p.stem for p in Path(folder).glob("*.ipynb")}
    out = []
    for path in sorted(Path(folder).iterdir()):
        if (not path.is_file() or path.suffix == ".ipynb" or path.stem in notebooks
                or path.name.startswith(".")):
            continue
        text = path.read_bytes().decode("utf-8", "replace")
        if any(marker in text for marker in SECRET_MARKERS):
            log.info("%s: holds a solution or hidden tests; not given to students", path)
            continue
        out.append(path)
    return out


def setup(course: Path = COURSE_DIR, solutions: Path = SOLUTIONS_DIR, labs: Sequence[str] | None = None) -> list[str]:
    """Make the course folder from solutions/: copy each lab's source and generate its release."""
    course = nbapi.make_course(course)
    labs = list(labs) if labs else lab_names(solutions)
    if not labs:
        raise FileNotFoundError(f"{solutions}: no lab folders with notebooks (expected {solutions}/labNN_name/*.ipynb)")
    for lab in labs:
        folder = Path(solutions) / lab
        notebooks = sorted(folder.glob("*.ipynb"))
        if len(notebooks) != 1:
            raise ValueError(f"{folder}: a lab has exactly one notebook, found {len(notebooks)}")
        nbapi.add_source(course, lab, notebooks)
        for extra in support_files(folder):
            shutil.copy2(extra, course / "source" / lab / extra.name)
        nbapi.generate_assignment(course, lab)
        log.info("set up %s in %s", lab, course)
    return labs


def release(course: Path = COURSE_DIR, bundle: Path | None = None, labs: Sequence[str] | None = None,
            to: Path | None = None) -> Path:
    """Zip the student copies (release/<lab>/) into a bundle; optionally copy them to `to`/<lab>/.

    Raises if any file would carry a solution or a hidden test.
    """
    course = Path(course).resolve()
    released = course / "release"
    labs = list(labs) if labs else lab_names(released)
    bundle = Path(bundle) if bundle else course / "bundle" / BUNDLE_NAME
    bundle.parent.mkdir(parents=True, exist_ok=True)
    files = [(lab, p) for lab in labs for p in sorted((released / lab).rglob("*")) if p.is_file()]
    for _, path in files:
        text = path.read_bytes().decode("utf-8", "replace")
        for marker in SECRET_MARKERS:
            if marker in text:
                raise ValueError(f"{path}: contains {marker!r}; regenerate it with `perflab grade setup`")
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as zf:
        for lab, path in files:
            zf.write(path, f"perflab-labs/{lab}/{path.relative_to(released / lab)}")
    if to is not None:
        for lab in labs:
            dest = Path(to) / lab
            shutil.copytree(released / lab, dest, dirs_exist_ok=True)
    return bundle


# ---------------------------------------------------------------------------------------------
# planning


def lab_info(course: Path, lab: str) -> LabInfo:
    import nbformat

    folder = Path(course) / "source" / lab
    notebooks = sorted(folder.glob("*.ipynb"))
    if len(notebooks) != 1:
        raise FileNotFoundError(f"{folder}: expected the lab's one source notebook; run `perflab grade setup`")
    nb = nbformat.read(notebooks[0], as_version=4)
    cells = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and grade_id(cell):
            cells.append({"grade_id": grade_id(cell), "max_score": float(meta.get("points", 0)),
                          "hidden": fb.BEGIN_HIDDEN in cell.source})
    return LabInfo(lab, notebooks[0].name, tuple(cells), fb.hidden_lines(nb.cells))


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


def plan(course: Path, state: State, labs=None, students=None, force: bool = False) -> tuple[list[Job], list[Job]]:
    """(to grade, already graded) for the selection."""
    todo, done = [], []
    for job in submissions(course, labs, students):
        (done if (state.done(job.lab, job.student, job.sha256) and not force) else todo).append(job)
    return todo, done


# ---------------------------------------------------------------------------------------------
# one submission


def template(course: Path, lab: str) -> Path:
    """A gradebook holding only `lab` (no students, no solutions) and its release, made once per
    source version in <course>/.perflab/template/<lab>/; every sandbox starts from a copy."""
    course = Path(course).resolve()
    source = next((course / "source" / lab).glob("*.ipynb"))
    digest = sha256(source)
    out = course / ".perflab" / "template" / lab
    if (out / "digest").is_file() and (out / "digest").read_text() == digest:
        return out
    with tempfile.TemporaryDirectory(prefix="perflab-template-") as tmp:
        scratch = nbapi.make_course(Path(tmp) / "course")
        nbapi.add_source(scratch, lab, source)
        nbapi.generate_assignment(scratch, lab)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        shutil.copy2(scratch / "gradebook.db", out / "gradebook.db")
        shutil.copytree(scratch / "release" / lab, out / "release" / lab)
    extras = out / "source" / lab
    extras.mkdir(parents=True, exist_ok=True)
    for extra in support_files(course / "source" / lab):
        shutil.copy2(extra, extras / extra.name)
    (out / "digest").write_text(digest)
    return out


def prepare_job(job: Job, info: LabInfo, tmpl: Path, workdir: Path, settings: Settings) -> dict[str, str]:
    """Lay out the sandbox's work folder; returns the environment the worker runs with."""
    course = workdir / "course"
    for name in nbapi.COURSE_FOLDERS:
        (course / name).mkdir(parents=True, exist_ok=True)
    shutil.copy2(tmpl / "gradebook.db", course / "gradebook.db")
    shutil.copytree(tmpl / "release" / job.lab, course / "release" / job.lab)
    (course / "source" / job.lab).mkdir(parents=True, exist_ok=True)
    if (tmpl / "source" / job.lab).is_dir():  # support files a lab ships beside its notebook
        shutil.copytree(tmpl / "source" / job.lab, course / "source" / job.lab, dirs_exist_ok=True)
    dest = course / "submitted" / job.student / job.lab
    dest.mkdir(parents=True)
    shutil.copyfile(job.path, dest / info.notebook)
    stamp = job.path.parent / "timestamp.txt"
    if stamp.is_file():
        shutil.copyfile(stamp, dest / "timestamp.txt")
    for name in ("home", "runtime", "cache"):
        (workdir / name).mkdir()
    env = {"HOME": str(workdir / "home"), "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
           "IPYTHONDIR": str(workdir / "home" / ".ipython"), "MPLCONFIGDIR": str(workdir / "cache" / "mpl"),
           "XDG_CACHE_HOME": str(workdir / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(workdir / "cache" / "inductor"),
           "PYTHONDONTWRITEBYTECODE": "1", **settings.env}
    (workdir / "job.json").write_text(json.dumps({
        "lab": job.lab, "student": job.student, "notebook": info.notebook, "sha256": job.sha256,
        "cell_timeout": settings.cell_timeout, "env": env,
        "cells": [{"grade_id": c["grade_id"], "max_score": c["max_score"]} for c in info.cells],
    }), encoding="utf-8")
    return env


MANIFEST_NAME = "perflab-hashes.json"


def write_hash_manifest(path: Path) -> Path:
    """perflab's file hashes now, in a file only this user may change (readable by the sandbox)."""
    guard.write_manifest(path)
    os.chmod(path, 0o644)
    return path


def sandbox_base() -> Path:
    """Where this machine's sandboxes get their work folders (searchable, not listable, by others)."""
    base = Path(tempfile.gettempdir()) / "perflab-sandbox"
    base.mkdir(mode=0o711, exist_ok=True)
    os.chmod(base, 0o711)
    return base


def node_timing_lock() -> Path:
    """The timing lock every sandbox on this machine shares."""
    path = sandbox_base() / "timing.lock"
    path.touch()
    os.chmod(path, 0o666)
    return path


def failure_result(info: LabInfo, reason: str) -> dict[str, Any]:
    """The result of a submission that produced none: every cell 0, with the reason."""
    return {"error": reason, "notebook": None, "findings": [], "events": [],
            "cells": [{"grade_id": c["grade_id"], "max_score": c["max_score"], "score": 0.0,
                       "needs_manual_grade": False, "error": reason, "verdict": None} for c in info.cells]}


def grade_one(job: Job, info: LabInfo, tmpl: Path, settings: Settings, *, hide: Sequence[Path] = (),
              timing_lock: Path | None = None, cpus: tuple[int, ...] | None = None,
              gpu: int | None = None) -> dict[str, Any]:
    """Grade one submission in a sandbox and return the worker's result (always a result)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{job.lab}-", dir=sandbox_base()))
    manifest = write_hash_manifest(workdir.with_name(workdir.name + ".hashes.json"))
    try:
        env = prepare_job(job, info, tmpl, workdir, settings)
        binds = {}
        isolated = sandbox.isolation().kind != "none"
        # perflab's file hashes, recorded before the student's code runs and out of its reach (the
        # sandbox user may read the file, not replace it): verify checks the package against these
        # rather than against whatever the files held when the notebook first imported perflab.
        if isolated:
            binds[str(manifest)] = MANIFEST_NAME
        env[guard.MANIFEST_ENV] = str(workdir / MANIFEST_NAME if isolated else manifest)
        if timing_lock is not None:
            if not isolated:
                env["PERFLAB_TIMING_LOCK"] = str(timing_lock)
            else:
                binds[str(timing_lock)] = "timing.lock"
                env["PERFLAB_TIMING_LOCK"] = str(workdir / "timing.lock")
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        (workdir / "job.json").write_text(json.dumps({**json.loads((workdir / "job.json").read_text()),
                                                      "env": env}), encoding="utf-8")
        limits = replace(settings.limits, cpus=cpus) if cpus else settings.limits
        import sys

        run = sandbox.run([sys.executable, "-m", "perflab.grading.worker", str(workdir)], workdir=workdir,
                          limits=limits, hide=hide, env=env, binds=binds)
        return interpret(run, job, info)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        manifest.unlink(missing_ok=True)


def interpret(run: sandbox.SandboxRun, job: Job, info: LabInfo) -> dict[str, Any]:
    """Turn what came back from the sandbox into a result, whatever went wrong."""
    result: dict[str, Any] | None = None
    if run.result:
        try:
            result = json.loads(run.result.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            result = None
    if run.timed_out:
        why = (f"grading stopped after {run.wall_s:.0f} s, the time limit for one submission "
               "(a cell that never ends, or a run too slow to finish); every cell scored 0")
    elif result is None:
        sig = run.signal
        why = (f"the grading process died (signal {sig})" if sig else
               f"the grading process ended without a result (exit status {run.returncode})")
        why += "; every cell scored 0"
        log.warning("%s/%s: %s; output tail:\n%s", job.lab, job.student, why, run.output_tail[-2000:])
    else:
        why = None
    if why is not None or not result.get("cells"):
        error = why or result.get("error") or "the grading process failed"
        if result and result.get("trace"):
            log.warning("%s/%s: %s\n%s", job.lab, job.student, error, result["trace"])
        result = {**(result or {}), **failure_result(info, error),
                  "findings": (result or {}).get("findings", []), "events": (result or {}).get("events", [])}
    log.debug("%s/%s: sandbox output tail:\n%s", job.lab, job.student, run.output_tail[-6000:])
    result["wall_s"] = run.wall_s
    result["isolation"] = run.isolation.kind
    result["sandbox_notes"] = list(run.notes)
    result["sha256"] = job.sha256
    result.setdefault("findings", [])
    result.setdefault("events", [])
    return result


# ---------------------------------------------------------------------------------------------
# merging (the single writer)


def notes_for(result: dict[str, Any], info: LabInfo) -> list[str]:
    """The lines a student reads about their submission; hidden tests stay hidden."""
    lines = []
    if result.get("error"):
        lines.append(f"Not graded: {result['error']}")
    for finding in result.get("findings", []):
        if finding.get("fatal") and finding["message"] == result.get("error"):
            continue
        cell = finding["cell"]
        lines.append(finding["message"] if cell == "notebook" else f"{cell}: {finding['message']}")
    timed_out = {e["cell"] for e in result.get("events", []) if "was stopped" in e["event"]}
    for event in result.get("events", []):
        gid = event.get("grade_id")
        text = event["event"]
        if event["cell"] in timed_out and text.startswith("KeyboardInterrupt"):
            continue  # the interrupt that stopped it: said already
        if gid in info.hidden:
            text = text.split(":", 1)[0] + " (a test in this cell failed; it holds hidden tests)"
        where = f"cell {event['cell']}" + (f" ({gid})" if gid else "")
        lines.append(f"{where}: {text}")
    for note in result.get("sandbox_notes", []):
        lines.append(f"sandbox: {note}")
    return list(dict.fromkeys(lines))


def merge(course: Path, job: Job, info: LabInfo, result: dict[str, Any], state: State, *,
          backend: str, hardware_class: str | None) -> Record:
    """Write one result into the gradebook, autograded/ and the state file (idempotent)."""
    from nbgrader.api import Gradebook, MissingEntry

    course = Path(course).resolve()
    previous = state.get(job.lab, job.student)
    cells = []
    for row in result["cells"]:
        verdict = row.get("verdict") or {}
        cells.append(CellResult(
            grade_id=row["grade_id"], score=row["score"], max_score=float(row["max_score"]),
            needs_manual_grade=bool(row.get("needs_manual_grade")), error=row.get("error"),
            verdict=verdict.get("verdict"), speedup=_float(verdict.get("speedup")),
            claimed=_float(verdict.get("claimed")),
            hardware_class=verdict.get("hardware_class") or result.get("hardware_class") or hardware_class))
    findings = result.get("findings", [])
    flags = [f"{f['cell']}: {f['message']}" for f in findings if f.get("flag")]
    flags += [f"{c.grade_id}: verification inconclusive" for c in cells if c.verdict == "inconclusive"]
    notes = notes_for(result, info)
    record = Record(
        student=job.student, lab=job.lab, sha256=job.sha256,
        outcome="failed" if result.get("error") else "graded", cells=tuple(cells), notes=tuple(notes),
        flagged=bool(flags), flags=tuple(flags), error=result.get("error"), backend=backend,
        wall_s=float(result.get("wall_s", 0.0)),
        graded_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        merges=(previous.merges + 1) if previous and previous.sha256 == job.sha256 else 1,
        isolation=result.get("isolation", ""))

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
        gb.db.commit()

    folder = course / "autograded" / job.student / job.lab
    if folder.exists():
        shutil.rmtree(folder)
    if result.get("notebook"):
        import nbformat

        nb = nbformat.reads(result["notebook"], as_version=4)
        fb.scrub(nb, info.hidden)
        fb.add_notes(nb, notes, f"{job.lab}, {job.student}")
        text = nbformat.writes(nb)
        fb.assert_nothing_hidden(text, info.guarded, f"autograded notebook of {job.student}")
        folder.mkdir(parents=True)
        (folder / info.notebook).write_text(text, encoding="utf-8")
    for name, data in (result.get("files") or {}).items():  # results/*.json, for the student's report
        if isinstance(data, str) and RESULTS_FILE_NAME.fullmatch(name):
            (folder / "results").mkdir(parents=True, exist_ok=True)
            (folder / "results" / name).write_text(data, encoding="utf-8")
    state.put(record)
    return record


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# the run


def grade(course: Path = COURSE_DIR, settings: Settings | None = None, *, labs=None, students=None,
          backend: str = "local", ray_address: str | None = None, force: bool = False,
          solutions: Path | None = None, progress: Callable[[Record], None] | None = None) -> Summary:
    """Grade every collected submission not graded yet (all of `labs`/`students` with `force`)."""
    settings = with_instructor_policy(settings or Settings())
    course = Path(course).resolve()
    if not (course / "gradebook.db").is_file():
        raise FileNotFoundError(f"{course}: no course folder here; run `perflab grade setup` first")
    hide = [course, *(p for p in [solutions or SOLUTIONS_DIR] if Path(p).exists()), *settings.hide]
    from perflab import env as _env

    hardware = _env.machine_info().hardware_class
    with lock(course):
        state = State.load(course)
        todo, done = plan(course, state, labs, students, force)
        infos = {lab: lab_info(course, lab) for lab in {j.lab for j in todo}}
        templates = {lab: template(course, lab) for lab in infos}
        graded, failed = [], []

        def on_result(job: Job, result: dict[str, Any]) -> None:
            if state.done(job.lab, job.student, job.sha256) and not force:
                log.info("%s/%s: a second result for the same content; ignored", job.lab, job.student)
                return
            record = merge(course, job, infos[job.lab], result, state, backend=backend, hardware_class=hardware)
            (failed if record.outcome == "failed" else graded).append(record.key)
            if progress:
                progress(record)

        if backend == "local":
            _run_local(todo, infos, templates, settings, hide, on_result, course)
        elif backend == "ray":
            from perflab.grading import ray_backend

            ray_backend.run(todo, infos, templates, settings, hide, on_result, address=ray_address)
        else:
            raise ValueError(f"backend: must be local or ray, got {backend!r}")
    return Summary(tuple(graded), tuple(f"{j.lab}/{j.student}" for j in done), tuple(failed))


def with_instructor_policy(settings: Settings) -> Settings:
    """`settings` with the instructor's grading policy from this environment passed on to every
    sandbox (which sees nothing of the parent's environment otherwise): PERFLAB_INCONCLUSIVE,
    checked here so that a typo fails the run once instead of every notebook."""
    from perflab.labs.common import INCONCLUSIVE_ENV, inconclusive_policy

    return dataclasses.replace(settings, env={INCONCLUSIVE_ENV: inconclusive_policy(), **settings.env})


def _run_local(todo: list[Job], infos, templates, settings: Settings, hide, on_result, course: Path) -> None:
    jobs = settings.jobs or default_jobs(gpus=settings.gpus)
    jobs = max(1, min(jobs, len(todo) or 1))
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    slots: queue.Queue = queue.Queue()
    for i in range(jobs):
        cpus = tuple(cores[i * CORES_PER_JOB:(i + 1) * CORES_PER_JOB]) if jobs > 1 and len(cores) >= jobs * CORES_PER_JOB else None
        gpu = i if settings.gpus else None
        slots.put((cpus, gpu))
    timing_lock = node_timing_lock() if jobs > 1 else None
    log.info("local pool: %d job(s)%s", jobs, ", timed sections serialised" if timing_lock else "")

    def task(job: Job) -> dict[str, Any]:
        cpus, gpu = slots.get()
        try:
            return grade_one(job, infos[job.lab], templates[job.lab], settings, hide=hide,
                             timing_lock=timing_lock, cpus=cpus, gpu=gpu)
        finally:
            slots.put((cpus, gpu))

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        pending = {pool.submit(task, job): job for job in todo}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                job = pending.pop(future)
                on_result(job, future.result())


# ---------------------------------------------------------------------------------------------
# feedback


def feedback(course: Path = COURSE_DIR, labs=None, students=None) -> list[Path]:
    """Write HTML feedback for every graded submission in the selection; returns the files."""
    course = Path(course).resolve()
    state = State.load(course)
    written = []
    for record in state.records.values():
        if (labs and record.lab not in labs) or (students and record.student not in students):
            continue
        info = lab_info(course, record.lab)
        folder = course / "feedback" / record.student / record.lab
        name = Path(info.notebook).stem
        if (course / "autograded" / record.student / record.lab / info.notebook).is_file():
            nbapi.generate_feedback(course, record.lab, record.student)
            page = folder / f"{name}.html"
        else:
            lines = list(record.notes) or ["the submission could not be graded"]
            page = fb.write_page(folder, name, fb.failure_page(record.student, record.lab, lines, record.cells))
        fb.assert_nothing_hidden(page.read_text(encoding="utf-8"), {}, str(page))
        written.append(page)
    return written
