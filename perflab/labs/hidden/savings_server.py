"""Where lab 1's diagnosis judge measures a pipeline's savings: a process of its own per measurement,
forked from a server that imported torch once per grading process.

    savings = measure(student, mode, timing_lock, timeout_s)   # starts the server on first use
    warm_up()                                                   # start it now, without waiting

The grader's own process grades several notebooks on threads, and torch's thread count is one per
process, so the savings are measured elsewhere. A fresh interpreter per submission spent 2.9 s of lab
1's grading importing torch; a fork of this server starts with it imported (it has run no torch op, so
no thread pool is copied half-alive). Only perflab's own pipelines run here, never student code.

    python -m perflab.labs.hidden.savings_server    (started by `measure`, never by hand)

reads one JSON request a line on stdin ({"student", "mode", "timing_lock"}) and answers each with one
JSON line on stdout: {"savings": {bug: saving}} or {"error": why}.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any

from perflab.grading.timelock import TIMING_LOCK_ENV
from perflab.labs import lab01_mystery
from perflab.labs.hidden import mystery_truth
from perflab.labs.hidden.mystery_truth import BY_KEY

# The end of the server's own error output quoted when it dies (an import that failed).
STDERR_TAIL_CHARS = 300


class SavingsUnmeasured(RuntimeError):
    """The grader could not measure a pipeline's savings (the finding is then judged on line and type)."""


class _Server:
    """The running server (None before the first use, or after one died or ran past its time)."""

    lock = threading.Lock()
    process: subprocess.Popen[bytes] | None = None
    stderr: IO[bytes] | None = None


def warm_up() -> None:
    """Start the server now: it imports torch (about 3 s on 2 cores) while the first notebook runs."""
    with _Server.lock:
        _running()


def measure(student: str, mode: str | None, timing_lock: str, timeout_s: float) -> dict[str, float]:
    """What fixing each bug planted for `student` alone saves of its pipeline's step time
    (`measure_savings_here`, in a fork of the server); SavingsUnmeasured with the reason where
    no measurement came back within `timeout_s`. One measurement at a time per grading process."""
    with _Server.lock:
        process = _running()
        assert process.stdin is not None and process.stdout is not None
        request = {"student": student, "mode": mode, "timing_lock": timing_lock}
        try:
            process.stdin.write((json.dumps(request) + "\n").encode())
            process.stdin.flush()
        except BrokenPipeError:
            raise SavingsUnmeasured(_died()) from None
        ready, _, _ = select.select([process.stdout], [], [], timeout_s)
        if not ready:
            _stop()
            raise SavingsUnmeasured(f"the measurement ran past {timeout_s:.0f} s")
        line = process.stdout.readline()
        if not line:
            raise SavingsUnmeasured(_died())
    reply = json.loads(line)
    if "error" in reply:
        raise SavingsUnmeasured(f"the measuring process failed: {reply['error']}")
    return {key: float(saved) for key, saved in reply["savings"].items()}


def _running() -> subprocess.Popen[bytes]:
    if _Server.process is not None and _Server.process.poll() is None:
        return _Server.process
    _stop()
    _Server.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (kept for the server's life)
    _Server.process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=_Server.stderr, start_new_session=True)
    return _Server.process


def _died() -> str:
    """Why the server stopped answering, and forget it (the next measurement starts another)."""
    process, tail = _Server.process, ""
    if process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
    if _Server.stderr is not None:
        _Server.stderr.seek(0)
        text = _Server.stderr.read().decode(errors="replace").strip()
        tail = text.splitlines()[-1][-STDERR_TAIL_CHARS:] if text else ""
    code = process.returncode if process is not None else None
    _stop()
    return f"the measuring process exited with {code}" + (f": {tail}" if tail else " without a result")


def _stop() -> None:
    """Kill the server and whatever measurement it forked (one process group)."""
    process, _Server.process = _Server.process, None
    if process is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for pipe in (process.stdin, process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
    if _Server.stderr is not None:
        _Server.stderr.close()
        _Server.stderr = None


# ---------------------------------------------------------------------------------------------
# The server's side


def measure_savings_here(student: str, mode: str | None) -> dict[str, float]:
    """What `mystery.measured_savings` returns, measured in this process by the lab's own helper
    (`lab01_mystery.savings`, the protocol the student measures with): the planted pipeline beside one
    copy per bug that costs step time without it (a memory-only bug earns no share of the diagnosis, so
    it is not timed)."""
    import tempfile
    from pathlib import Path

    case = mystery_truth.truth(student, mode)
    keys = [p.key for p in case.planted if BY_KEY[p.key].costs_time]
    with tempfile.TemporaryDirectory(prefix="perflab-savings-") as tmp:
        planted = case.write(Path(tmp) / "planted.py")
        copies = [mystery_truth.without(student, mode, key).write(Path(tmp) / f"without_{key}.py") for key in keys]
        return {key: max(0.0, saved) for key, saved in zip(keys, lab01_mystery.savings(planted, copies), strict=True)}


def _measured(request: dict[str, Any]) -> dict[str, Any]:
    """One request, in a forked child whose output goes nowhere: a notebook's kernel (a solution checking
    itself) shows what its children write as the test cell's stderr, which nbgrader scores 0."""
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
    if request.get("timing_lock"):
        os.environ[TIMING_LOCK_ENV] = request["timing_lock"]
    else:
        os.environ.pop(TIMING_LOCK_ENV, None)
    try:
        return {"savings": measure_savings_here(str(request["student"]), request.get("mode"))}
    except BaseException as exc:  # noqa: BLE001 (whatever it was, the grader reads why)
        return {"error": f"{type(exc).__name__}: {exc}"}


def _serve_one(request: dict[str, Any]) -> dict[str, Any]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the measuring process
        os.close(read_end)
        data = json.dumps(_measured(request)).encode()
        with contextlib.suppress(OSError):
            while data:
                data = data[os.write(write_end, data):]
        os._exit(0)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as reader:
        while chunk := reader.read(65536):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        why = (f"killed by signal {signal.Signals(-os.waitstatus_to_exitcode(status)).name}"
               if os.WIFSIGNALED(status) else f"exited with {os.waitstatus_to_exitcode(status)}")
        return {"error": f"the measuring process {why} without a result"}
    return json.loads(b"".join(chunks))


def main() -> None:
    import torch  # noqa: F401 (imported once, before any fork)
    import torchvision  # noqa: F401

    from perflab.labs import lab01_mystery  # noqa: F401

    for line in sys.stdin:
        if line.strip():
            sys.stdout.write(json.dumps(_serve_one(json.loads(line))) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
