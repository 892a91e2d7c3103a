"""Interpreting a sandboxed run: what came back from the worker, turned into a `SubmissionResult`.

    interpret(run, job, info) -> SubmissionResult    the worker's report, or every cell 0 with the reason
    kernel_findings(observations) -> [Finding]       hooks and settings the notebook changed in its kernel

Everything here is untrusted data from the student's process: a report that does not fit its model,
a timeout, a dead process all become the submission's failure line, never an exception.
"""

from __future__ import annotations

import logging
from typing import Any

from perflab.grading.checks import Finding
from perflab.grading.result import (
    Job,
    LabInfo,
    ResultError,
    SubmissionResult,
    WorkerReport,
    failure_result,
)
from perflab.grading.sandbox import SandboxRun

log = logging.getLogger(__name__)

# Event callbacks the notebook's libraries register themselves (matplotlib's inline backend flushes
# figures after each cell): not hooks a student installed.
LIBRARY_CALLBACKS = ("matplotlib", "matplotlib_inline", "IPython.", "ipykernel.", "ipywidgets.")


def interpret(run: SandboxRun, job: Job, info: LabInfo) -> SubmissionResult:
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
        return failure_result(info, why, machine_fault=report is not None and report.machine_fault, **box)
    assert report is not None
    return SubmissionResult(notebook=report.notebook, observations=report.observations, events=report.events,
                            files=report.files, **box)


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
