"""A timed measurement in a process of its own, forked from a server that imported torch once and has
run no torch op: the notebook's `lab01_mystery.savings` and the grader's savings judge both measure
here, so a student's reading and the grader's are taken in the same state.

    value = call("perflab.labs.lab01.mystery:savings_here", {"planted": ..., "fixed": [...]}, timeout_s)
    warm_up()                                   # start the server now, without waiting

Why a process of its own: what a process did before a measurement changes the measurement. A kernel
that ran a notebook has torch's thread pool started at every core, its allocator grown, a profiler or
tracer perhaps still on (cProfile left enabled read an accuracy bug at 0.165 of a step where a fresh
process read 0.232), while a fork of this server starts from the state the grader's always started
from. The grader's own process grades several notebooks on threads, and torch's thread count is one
per process. A fork of a server that has imported torch starts in a fraction of a second (a fresh
interpreter spent 2.9 s of lab 1's grading on that import), and since the server has run no torch op,
no thread pool is copied half-alive. Whatever the measured function prints goes nowhere: a notebook's
kernel shows what its children write as the cell's stderr, which nbgrader scores 0.

    python -m perflab.labs.measuring_server    (started by `call`, never by hand)

reads one JSON request a line on stdin ({"fn": "perflab.module:function", "kwargs", "timing_lock"})
and answers each with one JSON line on stdout: {"value": what it returned} or {"error": why}.
"""

from __future__ import annotations

import contextlib
import importlib
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

# The end of the server's own error output quoted when it dies (an import that failed).
STDERR_TAIL_CHARS = 300
# Only perflab's own functions are called in the measuring process.
ALLOWED_PREFIX = "perflab."


class MeasurementFailed(RuntimeError):
    """No measurement came back: the measuring process failed, died or ran past its time."""


class _Server:
    """The running server (None before the first use, or after one died or ran past its time)."""

    lock = threading.Lock()
    process: subprocess.Popen[bytes] | None = None
    stderr: IO[bytes] | None = None


def warm_up() -> None:
    """Start the server now: it imports torch (about 3 s on 2 cores) while other work runs."""
    with _Server.lock:
        _running()


def call(fn: str, kwargs: dict[str, Any], timeout_s: float | None, timing_lock: str | None = None) -> Any:
    """`fn(**kwargs)` (a "perflab.module:function" whose arguments and result are JSON) in a fork of the
    server; MeasurementFailed with the reason where no result came back within `timeout_s` (None: no
    limit). `timing_lock`: the grading run's timing lock for the measuring process (default: this
    process's, `TIMING_LOCK_ENV`). One measurement at a time per process."""
    if not fn.startswith(ALLOWED_PREFIX) or ":" not in fn:
        raise ValueError(f"fn: a perflab function as 'perflab.module:function', got {fn!r}")
    lock = os.environ.get(TIMING_LOCK_ENV, "") if timing_lock is None else timing_lock
    with _Server.lock:
        process = _running()
        assert process.stdin is not None and process.stdout is not None
        request = {"fn": fn, "kwargs": kwargs, "timing_lock": lock}
        try:
            process.stdin.write((json.dumps(request) + "\n").encode())
            process.stdin.flush()
        except BrokenPipeError:
            raise MeasurementFailed(_died()) from None
        ready, _, _ = select.select([process.stdout], [], [], timeout_s)
        if not ready:
            _stop()
            raise MeasurementFailed(f"the measurement ran past {timeout_s:.0f} s")
        line = process.stdout.readline()
        if not line:
            raise MeasurementFailed(_died())
    reply = json.loads(line)
    if "error" in reply:
        raise MeasurementFailed(f"the measuring process failed: {reply['error']}")
    return reply["value"]


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


def measuring_state() -> dict[str, Any]:
    """What a timed measurement depends on besides its code, as this process holds it: whether it is a
    fork of the measuring server, torch's thread count, and the tracers and modes that slow some
    operations and not others (a profiler, tracemalloc, autograd's anomaly mode, grad mode)."""
    import tracemalloc

    import torch

    return {"forked_from_server": os.environ.get(_CHILD_ENV) == str(os.getppid()),
            "torch_threads": torch.get_num_threads(),
            "tracer": sys.gettrace() is not None or sys.getprofile() is not None,
            "tracemalloc": tracemalloc.is_tracing(), "anomaly": torch.is_anomaly_enabled(),
            "grad": torch.is_grad_enabled()}


# Set in a measuring process: the pid of the server it was forked from.
_CHILD_ENV = "PERFLAB_MEASURING_SERVER"


def _measured(request: dict[str, Any]) -> dict[str, Any]:
    """One request, in a forked child whose output goes nowhere."""
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
    if request.get("timing_lock"):
        os.environ[TIMING_LOCK_ENV] = request["timing_lock"]
    else:
        os.environ.pop(TIMING_LOCK_ENV, None)
    try:
        module, _, name = str(request["fn"]).partition(":")
        if not module.startswith(ALLOWED_PREFIX):
            raise ValueError(f"not a perflab function: {request['fn']!r}")
        value = getattr(importlib.import_module(module), name)(**request.get("kwargs", {}))
        return {"value": value}
    except BaseException as exc:  # noqa: BLE001 (whatever it was, the caller reads why)
        return {"error": f"{type(exc).__name__}: {exc}"}


def _serve_one(request: dict[str, Any]) -> dict[str, Any]:
    module = str(request.get("fn", "")).partition(":")[0]
    if module.startswith(ALLOWED_PREFIX):  # imported once, in the server, before the first fork
        with contextlib.suppress(Exception):  # the child meets the same error and reports it
            importlib.import_module(module)
    read_end, write_end = os.pipe()
    server = os.getpid()
    pid = os.fork()
    if pid == 0:  # the measuring process
        os.close(read_end)
        os.environ[_CHILD_ENV] = str(server)
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

    for line in sys.stdin:
        if line.strip():
            sys.stdout.write(json.dumps(_serve_one(json.loads(line))) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
