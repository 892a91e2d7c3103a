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

import contextlib
import dataclasses
import datetime as _dt
import functools
import json
import logging
import os
import queue
import re
import secrets
import shutil
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perflab.grading import checks, harness, judging, sandbox
from perflab.grading import feedback as fb
from perflab.grading import nbgrader_api as nbapi
from perflab.grading.checks import Finding, grade_id
from perflab.grading.result import CellRow, ResultError, SubmissionResult, WorkerReport
from perflab.grading.state import CellResult, Record, State, lock, sha256
from perflab.mystery import STUDENT_ENV
from perflab.verify.protocol import CLAIM_CONTRADICTED

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
    # Grade even where the sandbox has no namespaces (student code then runs as the instructor, with
    # the network): the instructor's explicit choice, recorded in every record of the run.
    unisolated: bool = False

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
    cells: tuple[dict[str, Any], ...]  # [{"grade_id", "max_score", "hidden", "manual"}] in notebook order
    guarded: dict[str, list[str]]  # grade_id -> hidden-test lines (for the leak guard)
    source_folder: Path | None = None  # <course>/source/<lab>/ (a course lab's judges.py lives there)

    @property
    def hidden(self) -> set[str]:
        return set(self.guarded)


@dataclass(frozen=True)
class Summary:
    graded: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # already graded with the same content
    failed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()  # work folders a stopped grading run had left, removed before this one
    isolation: str = ""  # the sandbox kind this run graded with

    def line(self) -> str:
        out = (f"graded {len(self.graded)} submission(s) ({len(self.failed)} could not be run), "
               f"{len(self.skipped)} already graded")
        if self.isolation == "none" and self.graded + self.failed:
            out += "; UNISOLATED: student code ran without namespaces (recorded in the grades)"
        return out


class Unisolated(ValueError):
    """The sandbox has no namespaces here and the instructor did not choose to grade without them."""


def check_isolation(settings: Settings) -> sandbox.Isolation:
    """This machine's sandbox kind; `Unisolated` (one line: why, and the two ways on) where it has no
    namespaces and `settings.unisolated` is not set: perflab never runs student code unisolated by default."""
    iso = sandbox.isolation()
    if iso.kind == "none" and not settings.unisolated:
        why = "; ".join(iso.notes) or "no Linux namespaces here"
        raise Unisolated(f"refusing to run student code without Linux namespaces ({why}): it would run as you, "
                         "with the network and your files; grade in the container (autograder/Containerfile, see "
                         "README) or pass --unisolated to grade anyway (recorded in the grades)")
    return iso


def default_jobs(cores: int | None = None, gpus: int = 0) -> int:
    """The local pool's size: see the module docstring for the rule."""
    if gpus > 0:
        return gpus
    if cores is None:
        from perflab import env

        cores = env.usable_cores()
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
                          "hidden": fb.BEGIN_HIDDEN in cell.source, "manual": bool(meta.get("solution"))})
    return LabInfo(lab, notebooks[0].name, tuple(cells), fb.hidden_lines(nb.cells), folder)


class NoJudges(ValueError):
    """A lab some of whose autograded cells have no judge: perflab does not grade it."""


def lab_judges(info: LabInfo, tmpl: Path) -> dict[str, judging.Judge]:
    """The lab's judges, one per autograded cell; NoJudges naming the cells without one (perflab
    decides every score outside the student's kernel, so it grades no lab whose tests would decide there)."""
    judges = judging.judges_for(info.lab, tmpl / "source" / info.lab) or {}
    missing = [c["grade_id"] for c in info.cells if not c["manual"] and c["grade_id"] not in judges]
    if missing:
        raise NoJudges(f"{info.lab}: no judge for {', '.join(missing)}: perflab grades a lab only from its probes "
                       f"and judges (probes.py and judges.py beside source/{info.lab}/, see solutions/README.md); "
                       "grade it with `nbgrader autograde` instead")
    return judges


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


def restore_locked(nb: Any, release: Any) -> Any:
    """`nb` with every locked cell of the release put back as released (the first copy of each), so
    the setup and test cells run as the instructor wrote them."""
    released = {grade_id(c): c for c in release.cells if grade_id(c) and c.metadata.nbgrader.get("locked")}
    seen: set[str] = set()
    for cell in nb.cells:
        gid = grade_id(cell)
        if gid in released and gid not in seen:
            seen.add(gid)
            original = released[gid]
            cell.source = original.source
            cell.metadata["nbgrader"] = dict(original.metadata.nbgrader)
            if cell.cell_type != original.cell_type:
                cell.cell_type = original.cell_type
                if original.cell_type == "code":
                    cell.outputs, cell.execution_count = [], None
                else:
                    cell.pop("outputs", None)
                    cell.pop("execution_count", None)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def released_notebook(tmpl: Path, lab: str, name: str) -> Any:
    import nbformat

    return nbformat.read(tmpl / "release" / lab / name, as_version=4)


def prepare_job(job: Job, info: LabInfo, tmpl: Path, workdir: Path, settings: Settings, nb: Any,
                seed: int) -> dict[str, str]:
    """Lay out the sandbox's work folder (the notebook to run, the files the lab releases beside it,
    job.json); returns the environment the worker runs with. Nothing grader-only goes in."""
    import nbformat

    folder = workdir / "notebook"
    folder.mkdir()
    for extra in sorted((tmpl / "source" / job.lab).glob("*")):
        if extra.is_file() and extra.name != judging.JUDGES_FILE:
            shutil.copy2(extra, folder / extra.name)
    nbformat.write(nb, folder / info.notebook)
    for name in ("home", "runtime", "cache"):
        (workdir / name).mkdir()
    env = {"HOME": str(workdir / "home"), "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
           "IPYTHONDIR": str(workdir / "home" / ".ipython"), "MPLCONFIGDIR": str(workdir / "cache" / "mpl"),
           "XDG_CACHE_HOME": str(workdir / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(workdir / "cache" / "inductor"),
           "PYTHONDONTWRITEBYTECODE": "1", **settings.env,
           STUDENT_ENV: job.student}  # the id a lab draws per-student work for (lab 1's mystery pipeline)
    (workdir / "job.json").write_text(json.dumps({
        "lab": job.lab, "student": job.student, "notebook": info.notebook, "sha256": job.sha256,
        "cell_timeout": settings.cell_timeout, "env": env, "seed": seed,
        "autograded": [c["grade_id"] for c in info.cells if not c["manual"]]}), encoding="utf-8")
    return env


# Folders of the kit a graded notebook may read: the package (less its grader-only part), the data
# sets, the released labs and the environment. Everything else in the checkout is hidden from the sandbox.
PUBLIC_ENTRIES = frozenset({"perflab", "datasets", "labs", ".venv", "venv", ".whl"})
GRADER_ONLY_PACKAGE = REPO / "perflab" / "labs" / "hidden"


def grader_only_paths(repo: Path = REPO) -> list[Path]:
    """Folders of the checkout the sandbox must not see: the grader-only judges, the solutions, the
    expectations and course folders, the tests, the git history, and any other folder of the kit."""
    import sys

    keep = [Path(sys.prefix).resolve(), *(Path(p).resolve() for p in [os.environ.get("PERFLAB_DATA_DIR")] if p)]
    out = [GRADER_ONLY_PACKAGE] if GRADER_ONLY_PACKAGE.is_dir() else []
    for child in sorted(Path(repo).iterdir()):
        if not child.is_dir() or child.is_symlink() or child.name in PUBLIC_ENTRIES:
            continue
        if any(k == child.resolve() or child.resolve() in k.parents for k in keep):
            continue
        out.append(child)
    return out


@contextlib.contextmanager
def work_folder(prefix: str) -> Iterator[Path]:
    """A fresh work folder under `sandbox_base()`, held by a lock while it is in use and removed
    after; one a killed grader left behind is removed by the next run (`remove_abandoned`)."""
    import fcntl

    base = sandbox_base()
    fd, lock_name = tempfile.mkstemp(prefix=prefix, suffix=".lock", dir=base)
    path = Path(lock_name[: -len(".lock")])
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, _process_id(os.getpid()).encode())  # the owner, for when a forked child keeps the lock
        path.mkdir()
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        Path(lock_name).unlink(missing_ok=True)
        os.close(fd)


def remove_abandoned(base: Path | None = None) -> list[Path]:
    """Remove the work folders of gradings that are no longer running: their lock is free, or the
    process that took it is gone (a child it forked, a judge's data loader say, can outlive a killed
    grader and hold the lock a while). A grader killed half-way leaves the student's notebook there.
    Returns what was removed."""
    import fcntl

    base = base or sandbox_base()
    removed = []
    for lock_path in sorted(base.glob("*.lock")):
        folder = lock_path.with_name(lock_path.name[: -len(".lock")])
        if folder.name.startswith(".uid-slot") or folder.name == "timing":
            continue
        try:
            with open(lock_path, "a+") as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.seek(0)
                    if _owner_running(handle.read()):
                        continue
                for path in (folder, folder.with_name(folder.name + ".stage")):
                    if path.exists():
                        shutil.rmtree(path, ignore_errors=True)
                        removed.append(path)
                lock_path.unlink(missing_ok=True)
        except (BlockingIOError, OSError):
            continue
    return removed


def _process_id(pid: int) -> str:
    """"PID START": a process and when it started (so a reused pid is not taken for it)."""
    return f"{pid} {_start_time(pid)}\n"


def _start_time(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:].split()[19]  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return "?"


def _owner_running(text: str) -> bool:
    """Whether the process a work folder's lock names ("PID START") still runs; True when unsure."""
    try:
        pid_text, start = text.split()
        pid = int(pid_text)
    except ValueError:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return start == "?" or _start_time(pid) in (start, "?")


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


def failure_result(info: LabInfo, reason: str, **fields: Any) -> SubmissionResult:
    """The result of a submission that produced none: every cell 0, with the reason."""
    return SubmissionResult.failure(info.cells, reason, **fields)


def grade_one(job: Job, info: LabInfo, tmpl: Path, settings: Settings, *, hide: Sequence[Path] = (),
              timing_lock: Path | None = None, cpus: tuple[int, ...] | None = None,
              gpu: int | None = None) -> SubmissionResult:
    """Grade one submission and return its result (always a result, whatever the submission does).

    The submission is read and checked here (as data); its notebook runs in the sandbox, which
    returns the executed notebook and the probes' observations; the judges decide every score here.
    """
    try:  # checked again here: a Ray node is not the machine the run was started on
        check_isolation(settings)
    except Unisolated as exc:
        log.error("%s/%s: %s", job.lab, job.student, exc)
        return failure_result(info, "not graded: this grading machine cannot isolate a submission; "
                                    "an instructor has been told")
    try:
        release = released_notebook(tmpl, job.lab, info.notebook)
        nb, findings = checks.inspect_submission(job.path.read_bytes(), release)
    except Exception as exc:  # a submission must never stop the batch
        log.exception("%s/%s: could not read the submission", job.lab, job.student)
        return failure_result(info, f"the notebook could not be read ({type(exc).__name__}: {exc})"[:300])
    if nb is None:
        error = next(f.message for f in findings if f.fatal)
        return failure_result(info, error, findings=tuple(findings))
    present = {grade_id(c) for c in nb.cells if grade_id(c)}
    seed = secrets.randbelow(2**31)
    restore_locked(nb, release)
    with work_folder(f"{job.lab}-") as workdir:
        env = prepare_job(job, info, tmpl, workdir, settings, nb, seed)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        (workdir / "job.json").write_text(json.dumps({**json.loads((workdir / "job.json").read_text()),
                                                      "env": env}), encoding="utf-8")
        limits = replace(settings.limits, cpus=cpus) if cpus else settings.limits
        import sys

        run = sandbox.run([sys.executable, "-m", "perflab.grading.worker", str(workdir)], workdir=workdir,
                          limits=limits, hide=hide, env=env)
    result = interpret(run, job, info)
    result = result.replace(findings=(*findings, *result.findings, *kernel_findings(result.observations)), seed=seed)
    if result.error is None:
        mode = judging.grading_mode(settings.env)
        box = {"limits": settings.limits, "hide": hide, "cpus": cpus, "gpu": gpu}
        runners = (functools.partial(sandboxed_child, **box), functools.partial(sandboxed_program, **box))
        with _timing_lock(timing_lock):
            result = result.replace(cells=tuple(score(info, tmpl, result, present, seed, mode, runners,
                                                      student=job.student)))
    return result


@contextlib.contextmanager
def _timing_lock(path: Path | None) -> Iterator[None]:
    """The run's timing lock for the judges' re-measurements (a no-op with one job at a time)."""
    from perflab.grading.timelock import TIMING_LOCK_ENV

    if path is None:
        yield
        return
    os.environ[TIMING_LOCK_ENV] = str(path)
    yield


def kernel_findings(observations: Any) -> list[Finding]:
    """Flags from what the probes saw of the kernel, against the kernel as it started: hooks
    installed, perflab or Python settings changed. Evidence for a person, never a score (a kernel
    may hide its hooks)."""
    kernel = observations.get("kernel") if isinstance(observations, dict) else None
    start = observations.get("kernel_start") if isinstance(observations, dict) else None
    if not isinstance(kernel, dict) or not isinstance(start, dict):
        return []
    seen = []
    for key in ("ast_transformers", "input_transformers_post"):
        now, before = kernel.get(key), start.get(key)
        if isinstance(now, list) and isinstance(before, list) and len(now) > len(before):
            seen.append(f"{key} {', '.join(str(x) for x in now[len(before):])[:120]}")
    for key in ("input_transformers_cleanup", "input_transformers_line"):
        now, before = kernel.get(key), start.get(key)
        if isinstance(now, int) and isinstance(before, int) and now > before:
            seen.append(f"{key} (+{now - before})")
    callbacks, before_cb = kernel.get("event_callbacks"), start.get("event_callbacks")
    if isinstance(callbacks, dict) and isinstance(before_cb, dict):
        for event, funcs in callbacks.items():
            before = before_cb.get(event) if isinstance(before_cb.get(event), list) else []
            added = [f for f in funcs if isinstance(f, str) and f not in before
                     and not f.startswith(LIBRARY_CALLBACKS)] if isinstance(funcs, list) else []
            seen += [f"an event callback on {event} ({f})" for f in added]
    for key in ("trace", "profile"):
        if kernel.get(key) is True and start.get(key) is not True:
            seen.append(f"a {key} function (sys.set{key})")
    out = []
    if seen:
        out.append(Finding("notebook", "the notebook installed kernel hooks: " + "; ".join(seen)
                           + " (the grader checks your answers in its own process; hooks change nothing but are "
                           "reviewed by a person)", flag=True))
    env_now, env_start = kernel.get("env"), start.get("env")
    if isinstance(env_now, dict) and isinstance(env_start, dict):
        changed = sorted(str(k) for k in set(env_now) | set(env_start) if env_now.get(k) != env_start.get(k))
        if changed:
            out.append(Finding("notebook", "the notebook changed environment variables that steer "
                               f"perflab, Python or nbgrader: {', '.join(changed[:8])} (reviewed by a person)",
                               flag=True))
    return out


# Event callbacks the notebook's libraries register themselves (matplotlib's inline backend flushes
# figures after each cell): not hooks a student installed.
LIBRARY_CALLBACKS = ("matplotlib", "matplotlib_inline", "IPython.", "ipykernel.", "ipywidgets.")


def score(info: LabInfo, tmpl: Path, result: SubmissionResult, present: set[str], seed: int, mode: str,
          runners: tuple[Callable[..., Any] | None, Callable[..., Any] | None] = (None, None),
          student: str = "") -> list[CellRow]:
    """Every graded cell's row, decided here: autograded cells by the lab's judges from the
    observations, written answers left to a person (0 when left as released)."""
    judges = judging.judges_for(info.lab, tmpl / "source" / info.lab) or {}
    observations = result.observations
    cells_seen = observations.get("cells") if isinstance(observations, dict) else None
    if not isinstance(cells_seen, dict) or observations.get("schema") != harness.OBSERVATIONS_SCHEMA:
        cells_seen = {}
    ctx = judging.Context(info.lab, seed, mode, cells_seen, *runners, student=student)
    answered = manual_answers(result.notebook, tmpl, info)
    rows = []
    for cell in info.cells:
        gid = cell["grade_id"]
        if gid not in present:
            rows.append(CellRow.for_cell(cell, 0.0, error="the cell was deleted; scored 0"))
        elif cell["manual"]:
            changed = answered.get(gid, True)
            rows.append(CellRow.for_cell(cell, None if changed else 0.0, manual=changed,
                                         error=None if changed else "left as released; scored 0"))
        elif gid not in judges:
            log.warning("%s: no judge for %s; scored 0", info.lab, gid)
            rows.append(CellRow.for_cell(cell, 0.0, error="the grader has no check for this cell"))
        else:
            mark = judging.judge_cell(gid, judges[gid], ctx)
            rows.append(CellRow.for_cell(cell, round(mark.fraction * float(cell["max_score"]), 6),
                                         error=None if mark.fraction >= 1.0 else (mark.message or "a check failed"),
                                         verdict=mark.verdict, flag=mark.flag))
    return rows


def manual_answers(notebook_text: Any, tmpl: Path, info: LabInfo) -> dict[str, bool]:
    """grade_id -> whether a written answer differs from the released text (from the graded copy)."""
    import nbformat

    if not isinstance(notebook_text, str):
        return {}
    try:
        nb = nbformat.reads(notebook_text, as_version=4)
        release = released_notebook(tmpl, info.lab, info.notebook)
    except Exception:
        return {}
    released = {grade_id(c): c.source.strip() for c in release.cells if grade_id(c)}
    out: dict[str, bool] = {}
    for cell in nb.cells:
        gid = grade_id(cell)
        if gid and gid not in out and isinstance(cell.get("source"), str):
            out[gid] = cell.source.strip() != released.get(gid, "")
    return out


def sandboxed_child(job: dict[str, Any], *, time_limit: float, memory_limit: int | None, limits: sandbox.Limits,
                    hide: Sequence[Path], cpus: tuple[int, ...] | None, gpu: int | None) -> tuple[Any, str, float]:
    """`perflab.verify`'s child run in a fresh sandbox: a candidate of student code is re-measured
    where it can reach nothing of the grader's; the parent still decides from its raw times."""
    import sys

    with work_folder("verify-") as workdir:
        job = dict(job)
        candidate = dict(job["candidate"])
        if candidate.get("kind") == "module":
            shutil.copyfile(candidate["target"], workdir / "candidate.py")
            candidate["target"] = str(workdir / "candidate.py")
        job["candidate"] = candidate
        job["result_path"] = str(workdir / "result.json")
        (workdir / "verify-job.json").write_text(json.dumps(job), encoding="utf-8")
        env = {"HOME": str(workdir), "PYTHONDONTWRITEBYTECODE": "1", "MPLCONFIGDIR": str(workdir / "mpl"),
               **({"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else {})}
        box = replace(limits, wall_s=time_limit, cpus=cpus or limits.cpus,
                      memory_bytes=memory_limit if memory_limit is not None else limits.memory_bytes)
        run = sandbox.run([sys.executable, "-I", "-m", "perflab.verify.child", "--job", str(workdir / "verify-job.json")],
                          workdir=workdir, limits=box, hide=hide, env=env)
        if run.timed_out:
            return None, f"timeout: the run did not finish within its {time_limit:.0f} s limit", run.wall_s
        try:
            result = json.loads(run.result.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            result = None
        if not isinstance(result, dict) or result.get("nonce") != job["nonce"]:
            return None, (f"crashed: the process exited with status {run.returncode} without a result; its last "
                          f"output: {run.output_tail[-300:]}"), run.wall_s
        return result, "", run.wall_s


def sandboxed_program(program: str, timeout: float, *, limits: sandbox.Limits, hide: Sequence[Path],
                      cpus: tuple[int, ...] | None, gpu: int | None) -> tuple[int, str]:
    """A program holding student code, run with `python -I` in a fresh sandbox: (exit status, output tail)."""
    import sys

    with work_folder("program-") as workdir:
        (workdir / "program.py").write_text(program, encoding="utf-8")
        env = {"HOME": str(workdir), "PYTHONDONTWRITEBYTECODE": "1",
               **({"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else {})}
        run = sandbox.run([sys.executable, "-I", str(workdir / "program.py")], workdir=workdir,
                          limits=replace(limits, wall_s=timeout, cpus=cpus or limits.cpus), hide=hide, env=env)
        return (-9 if run.timed_out else run.returncode), run.output_tail


def interpret(run: sandbox.SandboxRun, job: Job, info: LabInfo) -> SubmissionResult:
    """Turn what came back from the sandbox into a result, whatever went wrong."""
    report: WorkerReport | None = None
    if run.result:
        try:
            report = WorkerReport.parse(run.result)
        except ResultError as exc:
            log.warning("%s/%s: the grading process sent a result that does not fit (%s)", job.lab, job.student, exc)
    if run.timed_out:
        why = (f"grading stopped after {run.wall_s:.0f} s, the time limit for one submission "
               "(a cell that never ends, or a run too slow to finish); every cell scored 0")
    elif report is None:
        sig = run.signal
        why = (f"the grading process died (signal {sig})" if sig else
               f"the grading process ended without a result (exit status {run.returncode})")
        why += "; every cell scored 0"
        log.warning("%s/%s: %s; output tail:\n%s", job.lab, job.student, why, run.output_tail[-2000:])
    else:
        why = report.error
    log.debug("%s/%s: sandbox output tail:\n%s", job.lab, job.student, run.output_tail[-6000:])
    box = {"wall_s": run.wall_s, "isolation": run.isolation.kind, "sandbox_notes": tuple(run.notes)}
    if why is not None:
        if report is not None and report.trace:
            log.warning("%s/%s: %s\n%s", job.lab, job.student, why, report.trace)
        return failure_result(info, why, **box)
    assert report is not None
    return SubmissionResult(notebook=report.notebook, observations=report.observations, events=report.events,
                            files=report.files, **box)


# ---------------------------------------------------------------------------------------------
# merging (the single writer)


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
          backend: str, hardware_class: str | None) -> Record:
    """Write one result into the gradebook, autograded/ and the state file (idempotent)."""
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
            hardware_class=verdict.get("hardware_class") or result.hardware_class or hardware_class))
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
        graded_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        merges=(previous.merges + 1) if previous and previous.sha256 == job.sha256 else 1,
        isolation=result.isolation)

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


# ---------------------------------------------------------------------------------------------
# the run


def grade(course: Path = COURSE_DIR, settings: Settings | None = None, *, labs=None, students=None,
          backend: str = "local", ray_address: str | None = None, force: bool = False,
          solutions: Path | None = None, progress: Callable[[Record], None] | None = None) -> Summary:
    """Grade every collected submission not graded yet (all of `labs`/`students` with `force`)."""
    settings = with_instructor_policy(settings or Settings())
    iso = check_isolation(settings)
    course = Path(course).resolve()
    if not (course / "gradebook.db").is_file():
        raise FileNotFoundError(f"{course}: no course folder here; run `perflab grade setup` first")
    if iso.kind == "none":
        log.warning("grading UNISOLATED (--unisolated): student code runs as you, with the network")
    hide = [course, *(p for p in [solutions or SOLUTIONS_DIR] if Path(p).exists()), *grader_only_paths(),
            *settings.hide]
    from perflab import env as _env

    hardware = _env.machine_info().hardware_class
    with lock(course):
        removed = remove_abandoned()
        for path in removed:
            log.warning("removed %s, left behind by a grading run that was stopped", path)
        state = State.load(course)
        todo, done = plan(course, state, labs, students, force)
        infos = {lab: lab_info(course, lab) for lab in {j.lab for j in todo}}
        templates = {lab: template(course, lab) for lab in infos}
        for lab, info in infos.items():
            lab_judges(info, templates[lab])  # a lab the grader cannot decide stops here, before any grading
        build_data(infos, settings)
        graded, failed = [], []

        def on_result(job: Job, result: SubmissionResult) -> None:
            if state.done(job.lab, job.student, job.sha256) and not force:
                log.info("%s/%s: a second result for the same content; ignored", job.lab, job.student)
                return
            info = infos[job.lab]
            try:  # one submission's result never stops the batch
                record = merge(course, job, info, result, state, backend=backend, hardware_class=hardware)
            except Exception as exc:
                log.exception("%s/%s: could not record the result", job.lab, job.student)
                failure = failure_result(info, f"the grader could not record this result ({type(exc).__name__}); "
                                               "an instructor has been told", wall_s=result.wall_s,
                                         isolation=result.isolation)
                try:
                    record = merge(course, job, info, failure, state, backend=backend, hardware_class=hardware)
                except Exception:  # not even the failure could be recorded: the next run tries again
                    log.exception("%s/%s: could not record the failure either; left pending", job.lab, job.student)
                    failed.append(f"{job.lab}/{job.student}")
                    return
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
    return Summary(tuple(graded), tuple(f"{j.lab}/{j.student}" for j in done), tuple(failed),
                   tuple(str(p) for p in removed), iso.kind)


def data_sizes(labs: Iterable[str], settings: Settings) -> list[str]:
    """The synthetic data sets the graded notebooks of `labs` train on, at the mode they are graded in."""
    from perflab import env as _env
    from perflab import mystery

    labs = list(labs)
    mode = judging.grading_mode(settings.env)
    sizes = {_env.mode_sizes(mode).data, *(_env.mode_sizes(mode, lab=lab).data for lab in labs)}
    if any(lab.startswith("lab01") for lab in labs):  # lab 1's mystery pipeline trains on a set of its own
        sizes.add(mystery.sizes_for(mode)[0])
    return sorted(sizes)


def build_data(labs: Iterable[str], settings: Settings) -> None:
    """Build, here and once, each data set the graded notebooks need and that is not built yet: a
    sandboxed notebook can read the data sets, and must not spend its cell time drawing one."""
    from perflab import dataset

    for size in data_sizes(labs, settings):
        if not dataset.is_built(size):
            log.warning("building the %s data set the graded labs train on (once)", size)
            dataset.build(size, progress=False)


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

    def task(job: Job) -> SubmissionResult:
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
                try:
                    result = future.result()
                except Exception as exc:  # a grader fault on one submission is that submission's line
                    log.exception("%s/%s: grading failed", job.lab, job.student)
                    result = failure_result(infos[job.lab], f"the grader failed on this submission "
                                                            f"({type(exc).__name__}); an instructor has been told")
                on_result(job, result)


# ---------------------------------------------------------------------------------------------
# feedback


# What a student reads when nbgrader could not render their graded notebook (their scores stand).
NOT_RENDERED = ("your graded notebook could not be rendered into this page, so only your scores and "
                "grading notes are shown (your scores are not affected; an instructor has been told)")


@dataclass(frozen=True)
class FeedbackRun:
    """What `feedback` wrote: a page per submission, and which ones fell back or got none."""

    pages: tuple[Path, ...] = ()  # every page written, minimal ones included
    minimal: tuple[str, ...] = ()  # "lab/student: reason": nbgrader could not render it; a minimal page instead
    failed: tuple[str, ...] = ()  # "lab/student: reason": no page at all

    def line(self) -> str:
        return (f"wrote {len(self.pages)} feedback page(s), {len(self.minimal)} of them minimal (the notebook "
                f"could not be rendered); {len(self.failed)} submission(s) got no page")


def feedback(course: Path = COURSE_DIR, labs=None, students=None,
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
