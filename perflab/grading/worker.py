"""The sandboxed half of grading: runs one student's notebook, then the lab's probes, and sends up
what happened. It scores nothing.

    python -m perflab.grading.worker JOB_DIR

JOB_DIR (written by the parent, see `job.prepare_job`) holds `job.json` (lab, notebook name,
cell timeout, environment, the grader's seed) and `notebook/`: the submission with its locked cells
already restored by the parent, beside the files the lab releases. No gradebook, no hidden test, no
reference answer is here. The child executes the notebook with `SandboxExecute` (a dead kernel fails
the cell it died in; processes left behind are killed), then one last cell in the same kernel
(`harness.cell_source`) runs the lab's probes and writes their observations. The result (the
executed notebook, the observations, what happened, the results file) is one `WorkerReport`
(`perflab.grading.result`) written as JSON to the fd in $PERFLAB_RESULT_FD. The parent treats all of it as
untrusted data and decides every score itself (`perflab.grading.judging`).
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

# nbformat's validator imports jsonschema, whose format checkers compile the IRI grammar of
# `rfc3987_syntax` when it is installed: about 1 s of every worker's start on 2 cores, for an "iri"
# format no notebook schema uses. Marked absent before the import, jsonschema goes without that checker.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

from nbclient.exceptions import DeadKernelError  # noqa: E402
from nbgrader.preprocessors import Execute, NbGraderPreprocessor  # noqa: E402

from perflab.grading.checks import grade_id  # noqa: E402
from perflab.grading.result import Event, WorkerReport  # noqa: E402

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

    _dead_in: int | None = None
    # The first probe's observations (`harness.device_state`): read after the first cell, before any of the
    # student's, so that a kernel that cannot run the job's device runs nothing else.
    start_probe: Path | None = None
    machine_fault: str | None = None

    def preprocess(self, nb, resources=None, km=None):  # noqa: D102
        self._dead_in = None
        self.machine_fault = None
        self._current = 0
        try:
            return super().preprocess(nb, resources, km)
        finally:
            _kill_stragglers()

    def preprocess_cell(self, cell, resources, index):  # noqa: D102
        if self.machine_fault is not None:
            if cell.cell_type == "code":
                cell.outputs = ([_error("GradingMachine", self.machine_fault)] if self._first_after_fault
                                else [_error("NotRun", "not run: the grading machine could not run this notebook")])
                self._first_after_fault = False
            return cell, resources
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
        if index == 0 and self.start_probe is not None:
            self.machine_fault = device_fault(self.start_probe)
            self._first_after_fault = True
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


# The executed notebook travels up the result pipe (sandbox.RESULT_MAX_BYTES) with the observations
# (OBSERVATIONS_CAP_BYTES) and results files: its outputs are cut to this, largest first.
NOTEBOOK_CAP_BYTES = 40 * 1024 * 1024


def cap_total_outputs(nb: Any, budget: int) -> None:
    """Drop the largest outputs until the notebook's outputs fit in `budget` bytes, each replaced by a
    line saying what was dropped: a notebook is never scored 0 for the size of its own output."""
    sized = []
    for index, cell in enumerate(nb.cells, start=1):
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            sized.append((len(json.dumps(output)), index, output))
    total = sum(size for size, _, _ in sized)
    if total <= budget:
        return
    for size, index, output in sorted(sized, key=lambda item: -item[0]):
        if total <= budget:
            break
        kind = ", ".join(sorted(output.get("data", {}))) or output.get("output_type", "output")
        note = f"[{kind} output of {size:,} bytes removed: the notebook's outputs were over {budget // 2**20} MB]"
        output.clear()
        output.update({"output_type": "stream", "name": "stdout", "text": note + "\n"})
        total -= size - len(json.dumps(output))
        _EVENTS.append({"cell": index, "grade_id": None,
                        "event": f"an output of {size:,} bytes was removed (all outputs over {budget // 2**20} MB)"})


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


# Errors the grading worker itself adds to a cell: they say what happened better than the student's own
# exception (a fork bomb's BlockingIOError is the symptom, the process limit the cause).
KIT_ERRORS = ("ProcessLimit", "KernelDied", "KernelUnresponsive")


def first_error(cell: Any) -> tuple[str, str] | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error" and output.get("ename") in KIT_ERRORS:
            return output["ename"], str(output.get("evalue", ""))
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return output.get("ename", "Error"), str(output.get("evalue", ""))
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            return "stderr", output.get("text", "").strip().splitlines()[-1:][0] if output.get("text", "").strip() else ""
    return None


def run(job_dir: Path) -> WorkerReport:
    """Execute the prepared notebook, then the lab's probes in the same kernel; return what happened."""
    import nbformat
    from nbformat.v4 import new_code_cell

    from perflab.grading import harness

    job = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
    lab, name = job["lab"], job["notebook"]
    folder = job_dir / "notebook"
    nb = nbformat.read(folder / name, as_version=4)
    probe_dir = job_dir / "observations"
    probe_dir.mkdir()
    # Each autograded cell's probe runs right after it, in the same kernel: answers are read where
    # the cell's own tests read them, and a kernel that dies later keeps what was checked before.
    autograded = [gid for gid in job.get("autograded", []) if isinstance(gid, str)]
    # A first probe with nothing to check records the kernel as it starts, before any student code.
    cells = [new_code_cell(harness.cell_source(lab, int(job["seed"]), str(probe_dir / "start.json"), []))]
    probes, seen = [(0, None)], set()
    for cell in nb.cells:
        cells.append(cell)
        gid = grade_id(cell)
        if gid in autograded and gid not in seen and cell.cell_type == "code":
            seen.add(gid)
            out = probe_dir / f"{len(probes) - 1}.json"
            cells.append(new_code_cell(harness.cell_source(lab, int(job["seed"]), str(out), [gid])))
            probes.append((len(cells) - 1, gid))
    nb.cells = cells
    os.environ.update({**(job.get("env") or {}), "NBGRADER_EXECUTION": "autograde", "PERFLAB_GRADER_REMEASURES": "1"})
    executor = SandboxExecute(timeout=int(job["cell_timeout"]), kernel_name="python3",
                              extra_arguments=["--HistoryManager.hist_file=:memory:"])
    executor.start_probe = probe_dir / "start.json"
    try:
        executor.preprocess(nb, {"metadata": {"path": str(folder)}})
    except Exception as exc:  # nbclient could not start or talk to the kernel at all
        _kill_stragglers()
        text = str(exc).strip().splitlines()
        reason = next((line for line in reversed(text) if "rror" in line), text[-1] if text else type(exc).__name__)
        return WorkerReport(error=f"the notebook could not be run ({reason.strip()[:300]})",
                            events=_typed(_EVENTS))
    for index, gid in reversed(probes):
        probe_cell = nb.cells.pop(index)
        error = first_error(probe_cell)
        if error and error[0] not in ("NotRun", "stderr"):
            _EVENTS.append({"cell": index, "grade_id": gid, "event": f"the grader could not read your answers "
                            f"after this cell ({error[0]}: {error[1]})"[:300]})
    observations = read_observations(probe_dir, len(probes) - 1)
    CapOutput().preprocess(nb, {})
    cap_total_outputs(nb, NOTEBOOK_CAP_BYTES)
    files = results_files(folder, lab)
    fault = executor.machine_fault or results_device_mismatch(files, lab, job.get("device"), observations)
    if fault:
        return WorkerReport(notebook=nbformat.writes(nb), error=fault, machine_fault=True, events=_typed(_EVENTS))
    return WorkerReport(notebook=nbformat.writes(nb), observations=observations,
                        events=_typed(_EVENTS + _error_events(nb)), files=files)


# What an instructor does when a job's device cannot start in the sandbox.
MACHINE_FAULT_ADVICE = ("check that the grader's own account can start it (`perflab env`), or grade on the CPU with "
                        "`perflab grade grade --gpus 0`; the submission stays to be graded")


def device_fault(start_probe: Path) -> str | None:
    """Why the kernel cannot run the device its job is graded for, from the first probe's observations
    (`harness.device_state`); None where it can, or where the job names no device."""
    try:
        device = json.loads(start_probe.read_text(encoding="utf-8")).get("device") or {}
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(device, dict) and isinstance(device.get("error"), str):
        return f"not graded: the grading machine could not start {device.get('assigned')} in the sandbox " \
               f"({device['error'][:300]}); {MACHINE_FAULT_ADVICE}"
    return None


def results_device_mismatch(files: dict[str, str], lab: str, assigned: str | None,
                            observations: dict[str, Any] | None = None) -> str | None:
    """Why the results file the notebook wrote names another device than the one its job is graded for
    (the kernel then did not run the job's device: the machine's fault); None where they agree, and None
    where the notebook itself changed $PERFLAB_DEVICE (the last probe saw it): that is the submission's
    doing, graded as it ran and flagged with the kernel's environment, never the machine's fault."""
    if not assigned or f"{lab}.json" not in files:
        return None
    kernel = (observations or {}).get("kernel") or {}
    seen = (kernel.get("env") or {}).get("PERFLAB_DEVICE") if isinstance(kernel, dict) else None
    if seen is not None and seen != assigned:
        return None
    try:
        device = json.loads(files[f"{lab}.json"]).get("machine", {}).get("device")
    except (ValueError, AttributeError):
        return None
    if isinstance(device, str) and device != assigned:
        return (f"not graded: the notebook ran on {device}, but this job is graded for {assigned} (the grading "
                f"machine's fault, not the submission's); {MACHINE_FAULT_ADVICE}")
    return None


def _typed(events: list[dict[str, Any]]) -> tuple[Event, ...]:
    return tuple(e for e in (Event.read(item) for item in events) if e is not None)


# The probes' observations are small data (outputs on small inputs, a report page): one cell's file
# over the first cap is not read, nor files past the second in all.
OBSERVATIONS_CAP_BYTES = 8 * 1024 * 1024
OBSERVATIONS_TOTAL_BYTES = 16 * 1024 * 1024


def read_observations(folder: Path, count: int) -> dict[str, Any]:
    """The probes' files (0.json ... count-1.json) merged: {"schema", "cells": {grade_id: ...},
    "kernel": the last kernel state}. A missing, oversized or malformed file adds nothing."""
    from perflab.grading.harness import OBSERVATIONS_SCHEMA

    merged: dict[str, Any] = {"schema": OBSERVATIONS_SCHEMA, "version": 1, "cells": {}, "kernel": None,
                              "kernel_start": None}
    budget = OBSERVATIONS_TOTAL_BYTES
    for i in ["start", *range(count)]:
        path = folder / f"{i}.json"
        try:
            if (path.is_symlink() or not path.is_file() or path.stat().st_size > OBSERVATIONS_CAP_BYTES
                    or path.stat().st_size > budget):
                continue
            budget -= path.stat().st_size
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if i == "start" and isinstance(doc, dict):
            merged["kernel_start"] = doc.get("kernel")
        elif isinstance(doc, dict) and isinstance(doc.get("cells"), dict):
            merged["cells"].update({k: v for k, v in doc["cells"].items() if isinstance(v, dict)})
            merged["kernel"] = doc.get("kernel")
    return merged


# The results file a graded notebook wrote (results/<lab>.json), sent up for the student's report.
# A larger file is left out: an honest lab's results are a few tens of kB.
RESULTS_FILE_CAP_BYTES = 4 * 1024 * 1024


def results_files(folder: Path, lab: str) -> dict[str, str]:
    """{name: text} of results/<lab>.json and its trace, under `folder`, if the notebook wrote them
    (plain files, each capped)."""
    out = {}
    for name in (f"{lab}.json", f"{lab}.trace.json"):
        path = folder / "results" / name
        if path.is_file() and not path.is_symlink() and path.stat().st_size <= RESULTS_FILE_CAP_BYTES:
            out[name] = path.read_text(encoding="utf-8", errors="replace")
    return out


def _error_events(nb: Any) -> list[dict[str, Any]]:
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
        report = run(job_dir)
    except BaseException as exc:  # the parent still gets a reason, whatever happened here
        report = WorkerReport(error=f"the grading process failed: {type(exc).__name__}: {exc}"[:500],
                              trace=traceback.format_exc()[-4000:])
    data = report.to_json()
    with os.fdopen(fd, "wb", closefd=fd > 2) as out:
        out.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
