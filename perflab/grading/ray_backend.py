"""The Ray back-end: one task per submission on an existing Ray cluster; the head merges.

    perflab grade grade --backend ray --ray-address 10.0.0.5:6379     (or RAY_ADDRESS, or "auto")

Each task gets the submission's bytes and its lab's gradebook template (a zip, put in the object
store once per lab), grades in the same sandbox as the local back-end on whichever node runs it,
and returns the worker's result as a JSON string; nothing from a student is unpickled on the head.
The head (this process) merges results one at a time into the one gradebook, as they arrive.
A task whose worker process dies is retried by Ray (`MAX_RETRIES`); a result that still cannot be
had is recorded as a failed submission with the reason. The head merges a (student, lab, content)
once: a retried task that somehow reports twice is ignored the second time.

A task runs the same stages as the local pool (`submission.grade_one`); this module depends on the
stages only, and `pipeline.grade` (the top of the stack) calls `run`.

Resources per task: `num_cpus=Settings.limits.cpus or CPUS_PER_TASK`, and `num_gpus=1` when the
run grades on GPUs (`Settings.gpus > 0`). The judges' re-measurements of tasks on the same node
take the node's timing lock, so they never overlap. Unlike the local back-end, a task does not share
a re-measurement with another student who exported the same configuration (each worker measures).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# A task that dies with its worker process is tried again this many times.
MAX_RETRIES = 3
# CPUs Ray reserves for one grading task (a notebook runs one kernel; timed work is serialised).
CPUS_PER_TASK = 1
_HARDWARE_CLASS: str | None = None


def _zip_folder(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(folder).as_posix())
    return buffer.getvalue()


def grade_task(job: dict[str, Any], submission: bytes, template_zip: bytes, info: dict[str, Any],
               settings: Any, hide: list[str]) -> str:
    """Runs on a Ray worker: grade one submission in the sandbox; returns the result as JSON."""
    global _HARDWARE_CLASS
    from perflab.grading.result import Job, LabInfo
    from perflab.grading.submission import grade_one
    from perflab.grading.workfolders import node_timing_lock

    if _HARDWARE_CLASS is None:
        from perflab import env

        with env.assigned(getattr(settings, "device", None)):  # the class of the device the run grades for
            _HARDWARE_CLASS = env.machine_info().hardware_class
    with tempfile.TemporaryDirectory(prefix="perflab-ray-") as tmp:
        tmpl = Path(tmp) / "template"
        with zipfile.ZipFile(io.BytesIO(template_zip)) as zf:
            zf.extractall(tmpl)
        folder = Path(tmp) / "submitted"
        folder.mkdir()
        path = folder / info["notebook"]
        path.write_bytes(submission)
        lab_info = LabInfo(info["lab"], info["notebook"], tuple(info["cells"]), info["guarded"])
        one = Job(job["student"], job["lab"], path, job["sha256"],
                  tuple((str(lab), str(text)) for lab, text in job.get("earlier", ())))
        lock = node_timing_lock()
        result = grade_one(one, lab_info, tmpl, settings, hide=[Path(p) for p in hide], timing_lock=lock)
    return result.replace(hardware_class=_HARDWARE_CLASS).to_json()


def run(todo, infos, templates, settings, hide, on_result, *, address: str | None = None) -> None:
    """Grade `todo` on the Ray cluster at `address`, calling `on_result(job, result)` on the head."""
    import ray
    from ray.exceptions import RayError

    from perflab.grading.result import ResultError, SubmissionResult, failure_result

    if not todo:
        return
    # Ray's driver swaps builtins.print for its tqdm-aware one (RAY_TQDM_PATCH_PRINT); the grader's
    # process keeps the interpreter's own, which the judges (dynamo's break lines among them) rely on.
    os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
    own_print = builtins.print
    ray.init(address=address or "auto", ignore_reinit_error=True, log_to_driver=False,
             logging_level=logging.WARNING)
    try:
        cpus = len(settings.limits.cpus) if settings.limits.cpus else CPUS_PER_TASK
        remote = ray.remote(num_cpus=cpus, num_gpus=1 if settings.gpus else 0, max_retries=MAX_RETRIES,
                            retry_exceptions=False)(grade_task)
        template_refs = {lab: ray.put(_zip_folder(path)) for lab, path in templates.items()}
        info_docs = {lab: {"lab": i.lab, "notebook": i.notebook, "cells": list(i.cells), "guarded": i.guarded}
                     for lab, i in infos.items()}
        pending = {}
        for job in todo:
            ref = remote.remote({"student": job.student, "lab": job.lab, "sha256": job.sha256,
                                 "earlier": [list(pair) for pair in job.earlier]},
                                job.path.read_bytes(), template_refs[job.lab], info_docs[job.lab],
                                settings, [str(p) for p in hide])
            pending[ref] = job
        log.info("ray: %d task(s) submitted to %s", len(pending), address or "auto")
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                job = pending.pop(ref)
                try:
                    result = SubmissionResult.from_json(ray.get(ref))
                except ResultError as exc:  # a worker node is another process: its result is checked
                    log.warning("%s/%s: the Ray task's result does not fit (%s)", job.lab, job.student, exc)
                    result = failure_result(infos[job.lab], f"the Ray task sent a result that does not fit ({exc})")
                except RayError as exc:
                    cause = getattr(exc, "cause", None) or exc
                    lines = [ln for ln in str(cause).strip().splitlines() if ln.strip()]
                    reason = lines[-1][:300] if lines else type(cause).__name__
                    log.warning("%s/%s: the Ray task failed: %s", job.lab, job.student, exc)
                    result = failure_result(infos[job.lab], f"the Ray task failed ({type(cause).__name__}: {reason})")
                on_result(job, result)
    finally:
        ray.shutdown()
        builtins.print = own_print


# Tries at starting a local cluster: on a loaded machine Ray's head can time out waiting for its
# own agents, and a second try usually succeeds.
START_TRIES = 3


@contextlib.contextmanager
def local_cluster(num_cpus: int | None = None, timeout_s: float = 300.0) -> Iterator[str]:
    """Start a Ray head on loopback for the duration (tests, benchmarks, a single machine);
    yields its address. Stops only this cluster's processes, found by its own temp folder."""
    import psutil

    ray = Path(sys.executable).parent / "ray"
    errors = []
    for _ in range(START_TRIES):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        temp = Path(tempfile.mkdtemp(prefix="pray", dir="/tmp"))  # short: Ray's socket paths are limited
        cmd = [str(ray), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
               f"--num-cpus={num_cpus or os.cpu_count() or 1}", "--include-dashboard=false",
               f"--temp-dir={temp}", "--disable-usage-stats"]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=temp,
                                 env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
            if run.returncode == 0:
                yield f"127.0.0.1:{port}"
                return
            errors.append((run.stderr or run.stdout).strip().splitlines()[-1:])
        except subprocess.TimeoutExpired:
            errors.append([f"ray start took longer than {timeout_s:.0f} s"])
        finally:
            marks = (str(temp), f"127.0.0.1:{port}")
            procs = [p for p in psutil.process_iter(["cmdline"])
                     if any(m in " ".join(p.info["cmdline"] or []) for m in marks) and p.pid != os.getpid()]
            for proc in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.send_signal(signal.SIGTERM)
            for proc in psutil.wait_procs(procs, timeout=5)[1]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
            shutil.rmtree(temp, ignore_errors=True)
    raise RuntimeError(f"could not start a local Ray cluster: {errors}")
