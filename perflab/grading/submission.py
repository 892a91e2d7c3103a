"""One submission through the stages, from its file to its scored result: what a local pool thread or
a Ray task runs (`grade_one`); the merge into the gradebook is the caller's, on the head.

    checks.inspect_submission   read as data: a notebook? which graded cells? locked cells edited?
    job.restore_locked          locked cells put back as released; a fresh seed for this grade
    job.prepare_job             the sandbox's work folder (`workfolders.work_folder`)
    run.run_worker              the notebook and its probes run in the sandbox
    interpret.interpret         what came back, as a SubmissionResult
    score.score                 the judges decide every cell, here (their re-measurements under the run's timing lock)
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from perflab import env as env_module
from perflab.grading import checks, devices, judging
from perflab.grading.checks import grade_id
from perflab.grading.interpret import interpret, kernel_findings
from perflab.grading.job import Settings, prepare_job, released_notebook, restore_locked
from perflab.grading.result import Job, LabInfo, SubmissionResult, failure_result
from perflab.grading.run import (
    Unisolated,
    check_isolation,
    run_worker,
    sandboxed_child,
    sandboxed_program,
)
from perflab.grading.score import score
from perflab.grading.workfolders import work_folder
from perflab.labs import homework

log = logging.getLogger(__name__)


def grade_one(job: Job, info: LabInfo, tmpl: Path, settings: Settings, *, hide: Sequence[Path] = (),
              timing_lock: Path | None = None, cpus: tuple[int, ...] | None = None,
              gpu: str | None = None) -> SubmissionResult:
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
    measured_at_home = homework.from_notebook(nb)  # read before the outputs are cleared
    restore_locked(nb, release)
    with work_folder(f"{job.lab}-") as workdir:
        env = prepare_job(job, info, tmpl, workdir, settings, nb, seed)
        homework.write_file(measured_at_home, workdir / "notebook")
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        (workdir / "job.json").write_text(json.dumps({**json.loads((workdir / "job.json").read_text()),
                                                      "env": env}), encoding="utf-8")
        job_limits = devices.job_limits(settings.limits, settings.device)  # no address-space cap on CUDA
        limits = replace(job_limits, cpus=cpus) if cpus else job_limits
        run = run_worker(workdir, env, limits, hide)
    result = interpret(run, job, info)
    if result.machine_fault:  # nothing of the student's was graded: the grader says so, and scores nothing
        return result
    result = result.replace(findings=(*findings, *result.findings, *kernel_findings(result.observations)), seed=seed)
    if result.error is None:
        mode = judging.grading_mode(settings.env)
        box = {"limits": devices.job_limits(settings.limits, settings.device), "hide": hide, "cpus": cpus,
               "gpu": gpu, "device": settings.device}
        runners = (functools.partial(sandboxed_child, **box), functools.partial(sandboxed_program, **box))
        from perflab.verify.expectations import reading
        from perflab.verify.protocol import placed

        # Every re-measurement child of this job on its own cores or GPU: student code through `runners`,
        # perflab's configurations through `placed` (a judge measuring in this process, such as lab 1's
        # machine measurement, runs where the grader does). The judges read the bars of the committed
        # folder, then the run's own (`settings.expectations`: the course's calibration, `self_calibration`).
        with _timing_lock(timing_lock), placed(cpus, gpu), env_module.assigned(settings.device), \
                reading(settings.expectations):
            result = result.replace(cells=tuple(score(info, tmpl, result, present, seed, mode, runners,
                                                      student=job.student,
                                                      measured_at_home=tuple(measured_at_home))))
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
