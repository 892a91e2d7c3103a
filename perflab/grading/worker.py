"""The grading child: grades one submission inside the sandbox and sends the result up its pipe.

    python -m perflab.grading.worker JOB_DIR

JOB_DIR (written by the parent, see `pipeline.prepare_job`) holds `job.json` and a throwaway
course folder with only what this one grade needs: the gradebook of this lab (no other
student, no solutions), the released notebook, and this student's submission. The child checks
the notebook (`checks`), runs nbgrader's autograde on it with `SandboxExecute` (a dead kernel
fails the cell it died in, not the whole notebook; processes left behind are killed before any
score is read), and scores each graded cell from the executed notebook against the maximum the
parent sent (never from anything the student's code could have rewritten). The result is one
JSON document (`RESULT_SCHEMA`) written to the fd in $PERFLAB_RESULT_FD.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from nbclient.exceptions import DeadKernelError
from nbgrader.preprocessors import Execute, NbGraderPreprocessor

from perflab.grading.checks import grade_id
from perflab.grading.timelock import VERDICT_MIME

RESULT_SCHEMA = "perflab.grading.result"
# Characters of one output kept in the graded copy: enough for any honest print, and a
# megabytes-long print stays a readable note instead of a notebook too big to render.
OUTPUT_CAP_CHARS = 20_000
# A rich output (an image) larger than this is replaced by a line saying so.
RICH_OUTPUT_CAP_BYTES = 2 * 1024 * 1024
# Processes and threads kept back from the kernel for this process (nbclient, nbgrader, sqlite).
KERNEL_PROCESS_RESERVE = 64
# What happened while the notebook ran (kernel deaths, cut outputs), for the student's feedback.
_EVENTS: list[dict[str, Any]] = []

log = logging.getLogger(__name__)


class SandboxExecute(Execute):
    """nbgrader's Execute, except that a kernel death fails the cell it happened in (later cells
    are marked not run) instead of losing the whole notebook, and every process the notebook
    left behind is killed before grading goes on."""

    def preprocess(self, nb, resources=None, km=None):  # noqa: D102
        self._dead_in: int | None = None
        self._current = 0
        try:
            return super().preprocess(nb, resources, km)
        finally:
            _kill_stragglers()

    def preprocess_cell(self, cell, resources, index):  # noqa: D102
        if self._dead_in is not None:
            if cell.cell_type == "code":
                cell.outputs = [_error("NotRun", f"not run: the kernel was lost in cell {self._dead_in}")]
            return cell, resources
        self._current = index + 1
        self._timed_out = False
        self._pids_before = _last_pid()
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            self._dead_in = index + 1
            cell.outputs.append(_error(
                "KernelDied", "the Python kernel died while running this cell (a crash such as a "
                "segfault, os._exit, or the memory limit); the cells after it did not run"))
            return cell, resources
        except Exception as exc:  # nbclient gave up on the kernel (no output, no reply)
            self._dead_in = index + 1
            if self._hit_process_limit(cell):
                cell.outputs.append(_error("ProcessLimit", PROCESS_LIMIT_NOTE))
                return cell, resources
            what = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            cell.outputs.append(_error(
                "KernelUnresponsive", f"the Python kernel stopped responding while running this cell "
                f"({what[:160]}; a fork bomb or a stuck process can do this); the cells after it did not run"))
            return cell, resources
        if cell.cell_type == "code" and self._hit_process_limit(cell):
            # Forked copies of the kernel share its sockets: whether it still answers afterwards is
            # chance, so a cell that reached the process limit always ends the run, the same way.
            self._dead_in = index + 1
            _kill_tree(self._kernel_pid())
            cell.outputs.append(_error("ProcessLimit", PROCESS_LIMIT_NOTE))
        return cell, resources

    def _kernel_pid(self) -> int | None:
        provisioner = getattr(getattr(self, "km", None), "provisioner", None)
        return getattr(provisioner, "pid", None)

    def _hit_process_limit(self, cell) -> bool:
        """Whether this cell ran into the kernel's process limit: a fork or thread start that failed
        for lack of processes; the kernel's process tree still near the limit; or a cell that ended
        badly after starting more processes and threads than the kernel may hold at once (forked
        kernels can die as fast as they are made, so the limit itself is not always reached)."""
        if any(_is_process_limit_error(out) for out in cell.get("outputs", [])):
            return True
        limit = _kernel_process_limit()
        if _tree_tasks(self._kernel_pid()) >= PROCESS_LIMIT_SHARE * limit:
            return True
        ended_badly = self._timed_out or any(out.get("output_type") == "error" for out in cell.get("outputs", []))
        return ended_badly and _tasks_created(self._pids_before, _last_pid()) >= limit

    async def _async_handle_timeout(self, timeout, cell=None):  # noqa: D102
        self._timed_out = True
        _EVENTS.append({"cell": self._current, "grade_id": grade_id(cell) if cell is not None else None,
                        "event": f"ran longer than {timeout} s, the limit for one cell, and was stopped"})
        return await super()._async_handle_timeout(timeout, cell)

    async def async_start_new_kernel(self, **kwargs):  # noqa: D102
        kwargs.setdefault("preexec_fn", _kernel_limits)
        return await super().async_start_new_kernel(**kwargs)


PROCESS_LIMIT_NOTE = ("this cell started processes or threads until it reached the sandbox's process limit "
                      "(a fork bomb?); the kernel was stopped and the cells after it did not run")
# A kernel whose processes and threads reach this share of its limit is taken to have hit it.
PROCESS_LIMIT_SHARE = 0.75
# The limit assumed for that check when the sandbox sets none.
UNLIMITED_PROCESSES = 4096


def _kernel_process_limit() -> int:
    """The processes and threads the kernel may run (see `_kernel_limits`)."""
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    if hard == resource.RLIM_INFINITY:
        return UNLIMITED_PROCESSES
    return hard - KERNEL_PROCESS_RESERVE if hard > 2 * KERNEL_PROCESS_RESERVE else hard


def _is_process_limit_error(output: Any) -> bool:
    """An error output from a fork or thread start that failed because no process was left (EAGAIN)."""
    if output.get("output_type") != "error":
        return False
    text = "\n".join(output.get("traceback", [])) + str(output.get("evalue", ""))
    if output.get("ename") == "RuntimeError":
        return "can't start new thread" in text
    return output.get("ename") == "BlockingIOError" and "fork" in text


def _last_pid() -> int | None:
    """The last process or thread id handed out in the sandbox's own PID namespace (ids there count
    up from 1, so the difference of two readings is the number of tasks started in between)."""
    if os.environ.get("PERFLAB_SANDBOX_PIDNS") != "1":
        return None
    try:
        return int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    except (OSError, ValueError):
        return None


def _tasks_created(before: int | None, after: int | None) -> int:
    """Tasks started between two `_last_pid` readings (0 when unknown; ids that wrapped count as many)."""
    if before is None or after is None:
        return 0
    return after - before if after >= before else UNLIMITED_PROCESSES


def _tree_tasks(pid: int | None) -> int:
    """Threads in the process `pid` and all its descendants (0 when it is gone)."""
    import psutil

    if pid is None:
        return 0
    total = 0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += proc.num_threads()
    return total


def _kill_tree(pid: int | None) -> None:
    """SIGKILL the process `pid` and every descendant (the kernel and what it forked)."""
    import psutil

    if pid is None:
        return
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [*root.children(recursive=True), root]:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def _kernel_limits() -> None:
    """The kernel may start `KERNEL_PROCESS_RESERVE` fewer processes than the sandbox allows, so
    a fork bomb in a cell cannot leave this process unable to finish grading."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if hard != resource.RLIM_INFINITY and hard > 2 * KERNEL_PROCESS_RESERVE:
        resource.setrlimit(resource.RLIMIT_NPROC, (hard - KERNEL_PROCESS_RESERVE,) * 2)


class CapOutput(NbGraderPreprocessor):
    """Cut outputs to `OUTPUT_CAP_CHARS` characters (and drop oversized images), saying so."""

    def preprocess_cell(self, cell, resources, index):  # noqa: D102
        if cell.cell_type != "code":
            return cell, resources
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and len(output.get("text", "")) > OUTPUT_CAP_CHARS:
                cut = len(output.text) - OUTPUT_CAP_CHARS
                output.text = output.text[:OUTPUT_CAP_CHARS] + f"\n... [{cut:,} characters of output cut]\n"
                _EVENTS.append({"cell": index + 1, "event": f"printed {cut + OUTPUT_CAP_CHARS:,} characters; cut"})
            for mime, value in list(output.get("data", {}).items()):
                size = len(value) if isinstance(value, str) else len(json.dumps(value))
                if mime == "text/plain" and size > OUTPUT_CAP_CHARS:
                    output.data[mime] = value[:OUTPUT_CAP_CHARS] + f"\n... [{size - OUTPUT_CAP_CHARS:,} characters cut]"
                elif size > RICH_OUTPUT_CAP_BYTES:
                    del output.data[mime]
                    output.data.setdefault("text/plain", f"[{mime} output of {size:,} bytes removed]")
        return cell, resources


def _error(ename: str, evalue: str) -> Any:
    from nbformat.v4 import new_output

    return new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _kill_stragglers() -> None:
    """In the sandbox's PID namespace, kill every process but this one and the namespace's init."""
    if os.environ.get("PERFLAB_SANDBOX_PIDNS") == "1":
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)


def _undumpable() -> None:
    """Keep the student's code (same uid) out of this process's memory and file descriptors."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0)  # PR_SET_DUMPABLE = 0


def first_error(cell: Any) -> tuple[str, str] | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return output.get("ename", "Error"), str(output.get("evalue", ""))
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            return "stderr", output.get("text", "").strip().splitlines()[-1:][0] if output.get("text", "").strip() else ""
    return None


def verdict_of(cell: Any) -> dict[str, Any] | None:
    """The last verification record a grade cell displayed, if any."""
    found = None
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if VERDICT_MIME in data and isinstance(data[VERDICT_MIME], dict):
            found = dict(data[VERDICT_MIME])
    return found


def score_cells(nb: Any, expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Score every graded cell the lab has, in the lab's order, from the executed notebook."""
    from nbgrader.utils import determine_grade, is_grade

    from perflab.grading.checks import grade_id

    first = {}
    for cell in nb.cells:
        gid = grade_id(cell)
        if gid and gid not in first:
            first[gid] = cell
    rows = []
    for spec in expected:
        gid, max_score = spec["grade_id"], float(spec["max_score"])
        row = {"grade_id": gid, "max_score": max_score, "score": 0.0, "needs_manual_grade": False,
               "error": None, "verdict": None}
        cell = first.get(gid)
        if cell is None or not is_grade(cell):
            row["error"] = "the cell was deleted; scored 0"
            rows.append(row)
            continue
        score, meta_max = determine_grade(cell, log)
        if score is None:
            row["score"], row["needs_manual_grade"] = None, True
        else:
            fraction = (float(score) / meta_max) if meta_max else 0.0
            row["score"] = round(max(0.0, min(1.0, fraction)) * max_score, 6)
        error = first_error(cell) if cell.cell_type == "code" else None
        if error:
            row["error"] = f"{error[0]}: {error[1]}"[:300]
        row["verdict"] = verdict_of(cell)
        rows.append(row)
    return rows


def grade(job_dir: Path) -> dict[str, Any]:
    import nbformat
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        IgnorePattern,
        LimitOutput,
        SaveAutoGrades,
    )

    from perflab.grading import checks, nbgrader_api

    job = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
    lab, student, name = job["lab"], job["student"], job["notebook"]
    course = job_dir / "course"
    result: dict[str, Any] = {"schema": RESULT_SCHEMA, "version": 1, "lab": lab, "student": student,
                              "sha256": job["sha256"], "findings": [], "events": [], "cells": [],
                              "notebook": None, "error": None}
    release = nbformat.read(course / "release" / lab / name, as_version=4)
    submitted = course / "submitted" / student / lab / name
    nb, findings = checks.inspect_submission(submitted.read_bytes(), release)
    result["findings"] = [f.to_dict() for f in findings]
    if nb is None:
        result["error"] = next(f.message for f in findings if f.fatal)
        result["cells"] = _zeros(job["cells"], "not graded: " + result["error"])
        return result
    nbformat.write(nb, submitted)
    from nbconvert.preprocessors import ClearMetadataPreprocessor

    preprocessors = [SandboxExecute, IgnorePattern, ClearMetadataPreprocessor, CapOutput, LimitOutput,
                     SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
    try:
        nbgrader_api.autograde(course, lab, student, timeout=int(job["cell_timeout"]), env=job.get("env") or {},
                               config={"Autograde__autograde_preprocessors": preprocessors})
    except Exception as exc:
        _kill_stragglers()
        text = str(exc).strip().splitlines()
        reason = next((line for line in reversed(text) if "Error" in line or "error" in line), text[-1] if text else "")
        result["error"] = f"nbgrader could not run the notebook ({reason.strip()[:300]})"
        result["cells"] = _zeros(job["cells"], result["error"])
        result["events"] = list(_EVENTS)
        return result
    graded = nbformat.read(nbgrader_api.autograded_notebook(course, lab, student, Path(name).stem), as_version=4)
    result["cells"] = score_cells(graded, job["cells"])
    result["events"] = list(_EVENTS) + _error_events(graded)
    result["notebook"] = nbformat.writes(graded)
    result["files"] = results_files(course / "autograded" / student / lab, lab)
    return result


# The results file a graded notebook wrote (results/<lab>.json), sent up for the student's report.
# A larger file is left out: an honest lab's results are a few tens of kB.
RESULTS_FILE_CAP_BYTES = 4 * 1024 * 1024


def results_files(folder: Path, lab: str) -> dict[str, str]:
    """{name: text} of results/<lab>.json under `folder`, if the notebook wrote it (a plain file, capped)."""
    path = folder / "results" / f"{lab}.json"
    if path.is_file() and not path.is_symlink() and path.stat().st_size <= RESULTS_FILE_CAP_BYTES:
        return {path.name: path.read_text(encoding="utf-8", errors="replace")}
    return {}


def _zeros(expected: list[dict[str, Any]], reason: str) -> list[dict[str, Any]]:
    return [{"grade_id": c["grade_id"], "max_score": float(c["max_score"]), "score": 0.0,
             "needs_manual_grade": False, "error": reason, "verdict": None} for c in expected]


def _error_events(nb: Any) -> list[dict[str, Any]]:
    from perflab.grading.checks import grade_id

    out = []
    for index, cell in enumerate(nb.cells, start=1):
        if cell.cell_type != "code":
            continue
        error = first_error(cell)
        if error and error[0] not in ("NotRun", "stderr"):
            out.append({"cell": index, "grade_id": grade_id(cell), "event": f"{error[0]}: {error[1]}"[:300]})
    return out


def main(argv: list[str]) -> int:
    _undumpable()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    fd = int(os.environ.get("PERFLAB_RESULT_FD", "1"))
    job_dir = Path(argv[0]).resolve()
    try:
        result = grade(job_dir)
    except BaseException as exc:  # the parent still gets a reason, whatever happened here
        result = {"schema": RESULT_SCHEMA, "version": 1, "error": f"the grading process failed: "
                  f"{type(exc).__name__}: {exc}"[:500], "trace": traceback.format_exc()[-4000:]}
    data = json.dumps(result).encode("utf-8")
    with os.fdopen(fd, "wb", closefd=fd > 2) as out:
        out.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
