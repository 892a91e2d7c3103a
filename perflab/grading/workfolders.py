"""The sandboxes' work folders on this machine: made fresh, held by a lock while in use, removed after.

    with work_folder("lab01_measure-") as workdir: ...    a fresh folder under sandbox_base()
    remove_abandoned()                                     what a killed grader left behind
    node_timing_lock()                                     the timing lock every grading job here shares

A folder's lock file names its owner ("PID START"), so a folder whose grader was killed is found
and removed by the next run even while a child the grader forked still holds the lock.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


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
    """The timing lock the grading jobs on this machine share: their judges' re-measurements, and the
    measuring processes those start, hold it (a graded notebook never sees it)."""
    path = sandbox_base() / "timing.lock"
    path.touch()
    os.chmod(path, 0o666)
    return path
