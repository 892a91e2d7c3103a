"""The instructor's workflow over one course folder, wiring grading's stages together.

    setup(course, solutions)                 source/ + release/ + gradebook from solutions/<lab>/
    release(course, bundle)                  student copies and a zip with no solutions or hidden tests
    grade(course, settings)                  every collected submission not graded yet -> Summary
    feedback(course)                         HTML per (student, lab), hidden tests never shown

A submission passes through one module per stage (docs/DESIGN.md, "The grading stages"):

    collect ─▶ job ─▶ run (sandboxed) ─▶ interpret ─▶ score ─▶ merge ─▶ feedback_pages / export

`submission.grade_one` takes one submission from `job` to `score` (in a local pool thread here, or
in a Ray task, `ray_backend`); only this process merges (`merge.merge`), one result at a time, so
the local pool and the Ray back-end share the same, single writer. This module is the top of the
stack: it imports every stage, and no stage imports it. The names the stages define stay
importable from here.

Local pool rule (`default_jobs`): timed work must never share cores or a GPU. With a GPU, one
job per GPU, each pinned to its own (CUDA_VISIBLE_DEVICES). Without, one job per
`CORES_PER_JOB` cores, each pinned to its own cores (sched_setaffinity), and one job when the
machine has fewer than `MIN_CORES_FOR_POOL`. Whenever more than one job runs, the judges'
re-measurements also take the run's timing lock (`timelock.timed_section`), so they run one at a
time; a notebook's own timed cells take none (no submission may hold up another's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import shutil
import zipfile
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from perflab import course as course_file
from perflab.grading import compile_cache, copies, judging, self_calibration
from perflab.grading import nbgrader_api as nbapi
from perflab.grading.collect import lab_names, plan, submissions
from perflab.grading.feedback_pages import NOT_RENDERED, FeedbackRun, write_pages
from perflab.grading.interpret import LIBRARY_CALLBACKS, interpret, kernel_findings
from perflab.grading.job import (
    SECRET_MARKERS,
    NoJudges,
    Settings,
    lab_info,
    lab_judges,
    prepare_job,
    released_notebook,
    restore_locked,
    support_files,
    template,
)
from perflab.grading.merge import (
    RESULTS_FILE_NAME,
    feedback_notebook,
    merge,
    notes_for,
    with_grader_verdicts,
)
from perflab.grading.result import Job, LabInfo, SubmissionResult, failure_result
from perflab.grading.run import (
    PUBLIC_ENTRIES,
    REPO,
    Unisolated,
    check_isolation,
    course_env,
    grader_only_paths,
    sandboxed_child,
    sandboxed_program,
)
from perflab.grading.score import manual_answers, score
from perflab.grading.state import Record, State, lock
from perflab.grading.submission import grade_one
from perflab.grading.workfolders import (
    node_timing_lock,
    remove_abandoned,
    sandbox_base,
    work_folder,
)
from perflab.labs import registry
from perflab.verify.expectations import reading
from perflab.workload import check_model

# What this module offers: its own workflow, and the stages' names it has always offered.
__all__ = [
    "BUNDLE_NAME", "COURSE_DIR", "CORES_PER_JOB", "LIBRARY_CALLBACKS", "MIN_CORES_FOR_POOL",
    "NOT_RENDERED", "PUBLIC_ENTRIES", "REPO", "RESULTS_FILE_NAME", "SECRET_MARKERS", "SOLUTIONS_DIR",
    "FeedbackRun", "Job", "LabInfo", "NoJudges", "Settings", "Summary", "Unisolated",
    "build_data", "check_isolation", "data_sizes", "default_jobs", "failure_result", "feedback", "feedback_notebook",
    "grade", "grade_one", "grader_only_paths", "interpret", "kernel_findings", "lab_info", "lab_judges", "lab_names",
    "manual_answers", "merge", "node_timing_lock", "notes_for", "plan", "prepare_job", "release", "released_notebook",
    "remove_abandoned", "restore_locked", "sandbox_base", "sandboxed_child", "sandboxed_program", "score", "setup",
    "submissions", "support_files", "template", "with_grader_verdicts", "with_instructor_policy", "work_folder",
]

log = logging.getLogger(__name__)

COURSE_DIR = REPO / "autograder" / "course"
SOLUTIONS_DIR = REPO / "solutions"
# Cores one grading job gets to itself: a training step uses two threads well on a laptop-class CPU.
CORES_PER_JOB = 2
# Below this many cores a second job would share cores with timed work: grade one at a time.
MIN_CORES_FOR_POOL = 4
BUNDLE_NAME = "perflab-student-bundle.zip"


@dataclass(frozen=True)
class Summary:
    graded: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # already graded with the same content
    failed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()  # work folders a stopped grading run had left, removed before this one
    isolation: str = ""  # the sandbox kind this run graded with
    uncalibrated: tuple[str, ...] = ()  # re-measured cells graded without a bar calibrated here (`bars`)
    # Submissions the grading machine could not run as graded (its device would not start in the
    # sandbox): "lab/student: why", recorded as no score, graded again by the next run.
    machine_faults: tuple[str, ...] = ()
    device: str = ""  # the device kind the run graded for
    calibration: str = ""  # what calibrating this machine's missing bars first cost (`self_calibration`)
    copies: tuple[str, ...] = ()  # pairs of a graded lab whose home measurements one run made (`copies.review`)

    def line(self) -> str:
        out = (f"graded {len(self.graded)} submission(s) ({len(self.failed)} could not be run), "
               f"{len(self.skipped)} already graded")
        if self.device:
            out += f", for {self.device}"
        if self.machine_faults:
            out += (f"; {len(self.machine_faults)} NOT GRADED through the grading machine's fault, no score "
                    f"recorded: {self.machine_faults[0].split(': ', 1)[1]}")
        if self.isolation == "none" and self.graded + self.failed:
            out += "; UNISOLATED: student code ran without namespaces (recorded in the grades)"
        if self.calibration:
            out += f"; {self.calibration}"
        if self.uncalibrated and self.graded:
            out += (f"; {len(self.uncalibrated)} re-measured cell(s) held to the conservative rule, no bar "
                    "being calibrated on this machine (the warnings above say which)")
        if self.copies:
            out += (f"; {len(self.copies)} pair(s) of submissions whose home measurements one run made, both "
                    "flagged for review (`perflab grade status` lists them)")
        return out


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


def setup(course: Path = COURSE_DIR, solutions: Path = SOLUTIONS_DIR, labs: Sequence[str] | None = None) -> list[str]:
    """Make the course folder from solutions/: copy each lab's source and generate its release. The course
    file (`perflab.course`) is kept where there is one, its labs set up unless `labs` names others; else it
    is written with the labs set up, and the model and data set in force here."""
    given = course_file.of_folder(course)
    course = nbapi.make_course(course)
    labs = list(labs) if labs else list(given.labs) or lab_names(solutions)
    if not labs:
        raise FileNotFoundError(f"{solutions}: no lab folders with notebooks (expected {solutions}/labNN_name/*.ipynb)")
    missing = [lab for lab in labs if not (Path(solutions) / lab).is_dir()]
    if missing:
        raise FileNotFoundError(f"{solutions}: no folder for {', '.join(missing)} (named by the course file "
                                f"{course / course_file.FILE_NAME} or --lab)")
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
    if not (course / course_file.FILE_NAME).is_file():
        course_file.write(course, dataclasses.replace(given, labs=tuple(labs)))
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
    course_path = course / course_file.FILE_NAME  # the students' notebooks read the course's model and data
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as zf:
        for lab, path in files:
            zf.write(path, f"perflab-labs/{lab}/{path.relative_to(released / lab)}")
        if course_path.is_file():
            zf.write(course_path, f"perflab-labs/{course_file.FILE_NAME}")
    if to is not None:
        for lab in labs:
            dest = Path(to) / lab
            shutil.copytree(released / lab, dest, dirs_exist_ok=True)
        if course_path.is_file():
            shutil.copy2(course_path, Path(to) / course_file.FILE_NAME)
    return bundle


# ---------------------------------------------------------------------------------------------
# the run


def grade(course: Path = COURSE_DIR, settings: Settings | None = None, *, labs=None, students=None,
          backend: str = "local", ray_address: str | None = None, force: bool = False,
          solutions: Path | None = None, progress: Callable[[Record], None] | None = None) -> Summary:
    """Grade every collected submission not graded yet (all of `labs`/`students` with `force`)."""
    settings = with_grading_device(settings or Settings(), backend)
    iso = check_isolation(settings)
    course = Path(course).resolve()
    if not (course / "gradebook.db").is_file():
        raise FileNotFoundError(f"{course}: no course folder here; run `perflab grade setup` first")
    if iso.kind == "none":
        log.warning("grading UNISOLATED (--unisolated): student code runs as you, with the network")
    hide = [course, *(p for p in [solutions or SOLUTIONS_DIR] if Path(p).exists()), *grader_only_paths(),
            *settings.hide]
    from perflab import env as _env

    # The course's model and data set in force for the grader and every process it starts; the grader's own
    # judges grade for the run's device too.
    this_course = course_file.of_folder(course)
    try:  # one line here, not a failure in every notebook
        check_model(this_course.model)
    except ValueError as exc:
        raise ValueError(f"{course / course_file.FILE_NAME}: {exc}") from None
    with (course_file.in_force(this_course), lock(course), _env.assigned(settings.device),
          contextlib.ExitStack() as own_labs):
        settings = with_instructor_policy(settings)  # the course now in force included
        hardware = _env.machine_info().hardware_class
        removed = remove_abandoned()
        for path in removed:
            log.warning("removed %s, left behind by a grading run that was stopped", path)
        state = State.load(course)
        todo, done = plan(course, state, labs, students, force)
        infos = {lab: lab_info(course, lab) for lab in {j.lab for j in todo}}
        templates = {lab: template(course, lab) for lab in infos}
        # A course's own lab is read from its folder wherever the core reads a lab (its bars, its workloads).
        own_labs.enter_context(registry.course_labs({lab: t / "source" / lab for lab, t in templates.items()}))
        for lab, info in infos.items():
            lab_judges(info, templates[lab])  # a lab the grader cannot decide stops here, before any grading
        build_data(infos, settings)
        if compile_cache.wanted(infos):  # once per machine: each job then starts from a copy
            settings = dataclasses.replace(settings, compile_cache=compile_cache.warm())
        # Bars no folder has for this machine are calibrated first and kept with the course; the judges
        # then read them after the committed ones (`self_calibration`, `expectations.reading`).
        calibration = self_calibration.before_grading(course, infos, settings, backend)
        settings = dataclasses.replace(settings, expectations=calibration.folders)
        with reading(settings.expectations):
            uncalibrated = check_calibration(infos, settings, backend)
        graded, failed, machine = [], [], []

        def on_result(job: Job, result: SubmissionResult) -> None:
            if result.machine_fault:  # the machine's fault, not the student's: no score, graded again next run
                log.error("%s/%s: %s", job.lab, job.student, result.error)
                machine.append(f"{job.lab}/{job.student}: {result.error}")
                failed.append(f"{job.lab}/{job.student}")
                return
            if state.done(job.lab, job.student, job.sha256) and not force:
                log.info("%s/%s: a second result for the same content; ignored", job.lab, job.student)
                return
            info = infos[job.lab]
            try:  # one submission's result never stops the batch
                record = merge(course, job, info, result, state, backend=backend, hardware_class=hardware,
                               uncalibrated=calibration.held.get(job.lab, ()))
            except Exception as exc:
                log.exception("%s/%s: could not record the result", job.lab, job.student)
                failure = failure_result(info, f"the grader could not record this result ({type(exc).__name__}); "
                                               "an instructor has been told", wall_s=result.wall_s,
                                         isolation=result.isolation)
                try:
                    record = merge(course, job, info, failure, state, backend=backend, hardware_class=hardware,
                                   uncalibrated=calibration.held.get(job.lab, ()))
                except Exception:  # not even the failure could be recorded: the next run tries again
                    log.exception("%s/%s: could not record the failure either; left pending", job.lab, job.student)
                    failed.append(f"{job.lab}/{job.student}")
                    return
            (failed if record.outcome == "failed" else graded).append(record.key)
            try:  # what it measured at home, kept to compare with the lab's other submissions (`copies`)
                copies.keep_submission(course, job)
            except Exception:
                log.exception("%s/%s: could not keep its fingerprint; compared from its file later", job.lab, job.student)
            if progress:
                progress(record)

        if backend not in ("local", "ray"):
            raise ValueError(f"backend: must be local or ray, got {backend!r}")

        def run(wave: list[Job]) -> None:
            if backend == "local":
                from perflab.verify.protocol import shared_measurements

                with shared_measurements():  # students who decided the same configuration share its re-measurement
                    for lab in sorted({job.lab for job in wave}):  # while no notebook runs beside it
                        judging.warm_up(lab, judging.grading_mode(settings.env))
                    _run_local(wave, infos, templates, settings, hide, on_result)
            else:
                from perflab.grading import ray_backend

                ray_backend.run(wave, infos, templates, settings, hide, on_result, address=ray_address)

        in_waves(course, todo, run)
        try:  # once every lab is merged: a copy is flagged whichever of the pair was graded first
            pairs = [copies.pair_line(p.to_dict()) for p in copies.review(course, state, {j.lab for j in todo})]
        except Exception:
            log.exception("could not compare the graded submissions for copies; the next run compares them")
            pairs = []
    return Summary(tuple(graded), tuple(f"{j.lab}/{j.student}" for j in done), tuple(failed),
                   tuple(str(p) for p in removed), iso.kind, tuple(uncalibrated), tuple(machine),
                   settings.device or "", calibration=calibration.line(), copies=tuple(pairs))


def starts_from(lab: str) -> tuple[str, ...]:
    """The labs whose graded decisions `lab` starts from, as its manifest declares them (`starts_from`; its
    grader-only module's `earlier_results` hands them over): lab 6 takes over labs 2-5's."""
    return registry.manifest(lab).starts_from


def in_waves(course: Path, todo: list[Job], run: Callable[[list[Job]], None]) -> None:
    """Grade `todo` with `run` in two waves: first every lab that starts from no other, then those that do
    (`starts_from`: lab 6), each job of the second carrying the decisions the first has graded."""
    first = [j for j in todo if not starts_from(j.lab)]
    later = [j for j in todo if starts_from(j.lab)]
    if first:
        run(first)
    if later:
        run([with_earlier(course, j) for j in later])  # read now, once the first wave is merged


def with_earlier(course: Path, job: Job) -> Job:
    """`job` carrying the student's decisions of the labs its lab starts from (`starts_from`), as the
    grading state holds them (`CellResult.decision`, what each lab's judges graded), laid out as the lab
    reads them at home (its `earlier_results`); never a file of the student's graded folders, which the
    student's own code wrote. A lab not graded yet is left out: the notebook starts from its default."""
    labs = starts_from(job.lab)
    if not labs:
        return job
    state = State.load(course)
    decisions = {}
    for lab in labs:
        record = state.get(lab, job.student)
        found = [c.decision for c in record.cells if c.decision] if record is not None and record.outcome == "graded" else []
        if found:
            decisions[lab] = found[-1]
    module = judging.hidden_module(job.lab)
    return dataclasses.replace(job, earlier=tuple(module.earlier_results(decisions)))  # type: ignore[union-attr]


class Uncalibrated(RuntimeError):
    """A lab to grade has a re-measured cell with no bar calibrated on this machine (--require-calibration)."""


def check_calibration(labs: Iterable[str], settings: Settings, backend: str = "local") -> list[str]:
    """The re-measured cells of `labs` with no bar calibrated on this machine, each logged as a warning
    (`perflab.grading.bars`); Uncalibrated where `settings.require_calibration`. The kit's own tiny mode
    is never calibrated and is not checked. The bars are this machine's: Ray tasks grade on the workers'
    hardware, which the head cannot read, so there it says so instead (and refuses to promise a check)."""
    from perflab.grading import bars

    mode = judging.grading_mode(settings.env)
    if mode == "tiny":
        return []
    if backend != "local":
        if settings.require_calibration:
            raise Uncalibrated("--require-calibration: the Ray back-end grades on the workers' hardware, which "
                               "this machine cannot check; calibrate it there, and grade without the flag")
        log.warning("the bars of the Ray workers' hardware are not checked before grading, and the head cannot "
                    "calibrate the workers: calibrate each worker's hardware class there (`perflab calibrate`; "
                    "each grade records the class it was graded on)")
        return []
    lines = bars.uncalibrated(labs, mode)
    if lines and settings.require_calibration:
        raise Uncalibrated(f"--require-calibration: {lines[0]}" + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""))
    for line in lines:
        log.warning("%s", line)
    return lines


def with_grading_device(settings: Settings, backend: str = "local") -> Settings:
    """`settings` with the run's one grading device decided (`devices.decide`), unless it names one
    already; said once in the log."""
    from perflab.grading import devices

    if settings.device is not None:
        return settings
    device = devices.decide(settings.gpus, backend)
    log.info("%s", device.line())
    if device.note:
        log.warning("%s", device.note)
    return dataclasses.replace(settings, gpus=device.gpus, device=device.kind)


def data_sizes(labs: Iterable[str], settings: Settings) -> list[str]:
    """The synthetic data sets the graded notebooks of `labs` train on, at the mode they are graded in,
    on the device the jobs are graded for (`settings.device`; default: this machine's)."""
    from perflab import env as _env
    from perflab import mystery

    labs = list(labs)
    mode = judging.grading_mode(settings.env)
    kind = settings.device or _env.pick_device().type
    sizes = {_env.mode_sizes(mode, device=kind).data, *(_env.mode_sizes(mode, lab=lab, device=kind).data for lab in labs)}
    if any(registry.manifest(lab).mystery_data for lab in labs):  # the mystery pipeline's set of its own
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
    checked here so that a typo fails the run once instead of every notebook, and the course's
    model and data set (`env.COURSE_ENV`)."""
    from perflab.labs.common import INCONCLUSIVE_ENV, inconclusive_policy

    return dataclasses.replace(settings, env={INCONCLUSIVE_ENV: inconclusive_policy(), **course_env(), **settings.env})


def _run_local(todo: list[Job], infos, templates, settings: Settings, hide, on_result) -> None:
    from perflab.grading import devices

    gpus = settings.gpus or 0
    jobs = settings.jobs or default_jobs(gpus=gpus)
    if gpus and jobs > gpus:  # timed work never shares a GPU
        log.warning("local pool: %d jobs asked for, %d GPU(s): running %d", jobs, gpus, gpus)
        jobs = gpus
    jobs = max(1, min(jobs, len(todo) or 1))
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    slots: queue.Queue = queue.Queue()
    for i in range(jobs):
        cpus = tuple(cores[i * CORES_PER_JOB:(i + 1) * CORES_PER_JOB]) if jobs > 1 and len(cores) >= jobs * CORES_PER_JOB else None
        # Its CUDA_VISIBLE_DEVICES entry, through the grader's own; "" where the run grades for no GPU.
        gpu = devices.slot_gpu(devices.GradingDevice(settings.device or "cpu", gpus), i)
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


def feedback(course: Path = COURSE_DIR, labs: Collection[str] | None = None, students: Collection[str] | None = None,
             on_problem: Callable[[str], None] | None = None) -> FeedbackRun:
    """Write HTML feedback for every graded submission in the selection (`feedback_pages.write_pages`)."""
    return write_pages(course, labs, students, on_problem)
