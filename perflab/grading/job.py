"""Preparing a job: what the parent knows of a lab, and the work folder one submission runs in.

    Settings                                 how a grading run grades (limits, timeouts, pool, policy)
    lab_info(course, lab) -> LabInfo         the lab's graded cells and hidden-test lines, from its source
    lab_judges(info, tmpl)                   its judges, one per autograded cell (NoJudges otherwise)
    template(course, lab)                    a one-lab gradebook and release every sandbox starts from
    restore_locked(nb, release)              the submission with its locked cells put back as released
    prepare_job(job, info, tmpl, workdir, ...)   the sandbox's work folder and the worker's environment

Nothing grader-only goes into a work folder: no gradebook, no hidden test, no judge.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perflab.env import DEVICE_ENV
from perflab.grading import compile_cache, judging, sandbox
from perflab.grading import feedback as fb
from perflab.grading import nbgrader_api as nbapi
from perflab.grading.checks import grade_id
from perflab.grading.result import Job, LabInfo
from perflab.grading.state import sha256
from perflab.mystery import STUDENT_ENV

log = logging.getLogger(__name__)

# Text that must never leave the course folder in a student bundle.
SECRET_MARKERS = ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS")


@dataclass(frozen=True)
class Settings:
    """How a grading run grades."""

    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    cell_timeout: int = 600  # seconds one cell may run before it is interrupted (and scored 0)
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the kernel
    jobs: int | None = None  # None: `pipeline.default_jobs()`
    # GPUs grading uses, one per job: None, every GPU the grader sees (CUDA_VISIBLE_DEVICES respected);
    # 0, none even where there are some (the run then grades for the CPU class). `grading.devices.decide`.
    gpus: int | None = None
    # The device kind every job is graded for (cuda, mps, cpu), decided once per run from `gpus` by
    # `pipeline.grade` (None until then) and carried to each of the job's processes as $PERFLAB_DEVICE.
    device: str | None = None
    hide: tuple[Path, ...] = ()  # more folders the sandbox must not see
    # Grade even where the sandbox has no namespaces (student code then runs as the instructor, with
    # the network): the instructor's explicit choice, recorded in every record of the run.
    unisolated: bool = False
    # Refuse to grade a lab whose re-measured cell has no bar calibrated on this machine (`grading.bars`):
    # without one, such a cell takes the conservative rule, which keeping the baseline passes.
    require_calibration: bool = False
    # Calibrate, before grading, the bars the graded labs read that no folder has for this machine
    # (`self_calibration`); off (--no-calibration), such a cell takes the conservative rule, recorded.
    self_calibrate: bool = True
    # Folders of calibrated bars the judges read after the committed ones (the course's own calibration,
    # set by the local back-end for its run; `perflab.verify.expectations.reading`).
    expectations: tuple[Path, ...] = ()
    # The warm start every job's Inductor cache is copied from (`compile_cache.warm`, set by `pipeline.grade`
    # where a graded lab compiles); None: each graded notebook compiles from a cold cache.
    compile_cache: Path | None = None

    def __post_init__(self) -> None:
        if self.cell_timeout < 1:
            raise ValueError(f"cell_timeout: must be at least 1 second, got {self.cell_timeout}")
        if self.cell_timeout >= self.limits.wall_s:
            raise ValueError(f"cell_timeout ({self.cell_timeout} s) must be shorter than the wall-time "
                             f"limit of a submission ({self.limits.wall_s} s)")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"jobs: must be at least 1, got {self.jobs}")


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


def lab_info(course: Path, lab: str) -> LabInfo:
    """The lab's graded cells (grade_id, points, hidden tests or not, written answer or not) and the
    lines of its hidden tests, from its one source notebook in <course>/source/<lab>/."""
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
    """The lab's notebook as released to students, from the template."""
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
    for lab, text in job.earlier:  # the student's graded earlier labs, where the lab looks for them at home
        if re.fullmatch(r"lab\d\d_\w+", lab):
            (workdir / lab / "results").mkdir(parents=True, exist_ok=True)
            (workdir / lab / "results" / f"{lab}.json").write_text(text, encoding="utf-8")
    for name in ("home", "runtime", "cache"):
        (workdir / name).mkdir()
    compile_cache.seed(settings.compile_cache, workdir / "cache" / "inductor")  # a private copy: see its module
    env = {"HOME": str(workdir / "home"), "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
           "IPYTHONDIR": str(workdir / "home" / ".ipython"), "MPLCONFIGDIR": str(workdir / "cache" / "mpl"),
           "XDG_CACHE_HOME": str(workdir / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(workdir / "cache" / "inductor"),
           "PYTHONDONTWRITEBYTECODE": "1", **settings.env,
           STUDENT_ENV: job.student,  # the id a lab draws per-student work for (lab 1's mystery pipeline)
           **({DEVICE_ENV: settings.device} if settings.device else {})}  # the one device the job is graded for
    (workdir / "job.json").write_text(json.dumps({
        "lab": job.lab, "student": job.student, "notebook": info.notebook, "sha256": job.sha256,
        "cell_timeout": settings.cell_timeout, "env": env, "seed": seed, "device": settings.device,
        "autograded": [c["grade_id"] for c in info.cells if not c["manual"]]}), encoding="utf-8")
    return env
