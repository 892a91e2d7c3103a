"""How busy the rest of the machine is while the verifier times: CPU time spent outside this process tree.

A re-measurement is fair only while nothing else competes for the cores it runs on. A loader worker is the
change that shows it first: on a 2-core host it gains 0.97-1.03x over lab 6's baseline while the machine is
idle and reads 0.90x (CI 0.86-0.99x) beside one busy process, which shares its core; a clean-clone CI
failed the reference's decision at 0.88x that way. The verifier reads this module around each child run
and measures again, once the machine is quiet, where the first run was disturbed (`protocol.verify`).

    start = sample()                      # None where the machine has no /proc (macOS): nothing is judged
    ...                                   # the verifier's child runs
    foreign_cores(start, sample())        # average cores kept busy by processes outside this tree
    disturbed(cores, needed)              # more than BUSY_CORES beyond the cores the measurement left free
    wait_for_quiet(needed=needed)         # until one window is not disturbed, at most QUIET_WAIT_S

The verifier's child makes itself the parent of its orphans (`adopt_orphans`) and kills and reaps every
descendant before it exits (`reap_descendants`): their CPU time then reaches the tree's count.

"Outside this tree": every process but this one and its descendants (the child, its loader workers, the
grading sandbox and the notebooks of other jobs all count as this grader's own work), on the CPUs this
process may run on (a container's cpuset, not the whole host). Linux's per-CPU counters (/proc/stat,
steal time included: a neighbour on the same hypervisor is a process outside too) and each process's
user and system time, with its reaped children's (/proc/PID/stat).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# Cores the rest of the machine may keep busy on average before a measurement counts as disturbed. A
# second process at full speed reads 1.0; an idle 2-core host reads under 0.05 (daemons, the shell).
BUSY_CORES = 0.5
# The longest the verifier waits for the machine to quiet down before it measures again anyway.
QUIET_WAIT_S = 30.0
# One window of `wait_for_quiet`.
QUIET_WINDOW_S = 1.0
# The shortest measurement `measured_when_quiet` reads the load over: a shorter span holds too few of the
# kernel's 10 ms CPU-time ticks to tell other work from rounding.
LOAD_READ_MIN_S = 0.25

PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Sample:
    """One reading: the wall clock, the busy time of the CPUs this process may use, and this tree's CPU time
    (both in seconds)."""

    wall: float
    busy: float
    own: float


def sample(root: int | None = None) -> Sample | None:
    """The machine now, with `root` (default this process) and its descendants as the grader's own work;
    None where /proc cannot be read."""
    try:
        busy = _busy_seconds(_allowed_cpus())
        own = _tree_seconds(os.getpid() if root is None else root)
    except (OSError, ValueError, IndexError):
        return None
    return Sample(time.monotonic(), busy, own)


def foreign_cores(start: Sample | None, end: Sample | None) -> float | None:
    """Cores kept busy on average between two samples by processes outside the tree (None: not measured)."""
    if start is None or end is None or end.wall <= start.wall:
        return None
    foreign = (end.busy - start.busy) - (end.own - start.own)
    return round(max(0.0, foreign) / (end.wall - start.wall), 3)


def disturbed(cores: float | None, needed: int = 2) -> bool:
    """Whether a measurement that saw `cores` of other work was disturbed by it: more than BUSY_CORES beyond
    the cores the measurement left free (this process's CPUs less the `needed` ones its child runs on: a
    training thread and a loader worker by default). On 2 cores any half core of other work disturbs it; on
    a 16-core node, other jobs on the 14 cores it does not use do not."""
    if cores is None:
        return False
    cpus = _allowed_cpus()
    spare = max(0, (len(cpus) if cpus else os.cpu_count() or 1) - needed)
    return cores > spare + BUSY_CORES


def wait_for_quiet(limit_s: float = QUIET_WAIT_S, window_s: float = QUIET_WINDOW_S, needed: int = 2) -> float | None:
    """Wait until one window reads no other work that would disturb a measurement on `needed` cores
    (`disturbed`), at most `limit_s`: the last window's reading (None where the machine cannot be read)."""
    deadline = time.monotonic() + limit_s
    while True:
        start = sample()
        if start is None:
            return None
        time.sleep(window_s)
        cores = foreign_cores(start, sample())
        if not disturbed(cores, needed) or time.monotonic() >= deadline:
            return cores


def measured_when_quiet(measure: Callable[[], T], what: str) -> T:
    """`measure()` in this process, taken again once the machine is quiet where other work kept more than
    BUSY_CORES busy meanwhile: for a measurement that runs on every core this process may use (torch's
    default), so any other work shares them; this process's own children are not other work."""
    cpus = _allowed_cpus()
    cores = len(cpus) if cpus else os.cpu_count() or 1
    start = sample()
    value = measure()
    end = sample()
    if start is None or end is None or end.wall - start.wall < LOAD_READ_MIN_S:
        return value
    busy = foreign_cores(start, end)
    if not disturbed(busy, cores):
        return value
    log.warning("the machine was busy with other work while %s (%.2f CPU cores on average); measuring again "
                "once it is quiet", what, busy)
    wait_for_quiet(needed=cores)
    return measure()


def _allowed_cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _busy_seconds(cpus: set[int] | None) -> float:
    """Busy time (user, nice, system, irq, softirq, steal) of `cpus` (None: all), from /proc/stat."""
    total = 0
    found = False
    for line in (PROC / "stat").read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
        total += user + nice + system + irq + softirq + steal
        found = True
    if not found:
        raise ValueError("/proc/stat lists none of this process's CPUs")
    return total / _TICKS


def _tree_seconds(root: int) -> float:
    """User and system time of `root` and every live descendant, with the reaped children of each (a child
    that exits moves its time into its parent's count, so the sum stays whole)."""
    parents, times = _process_table()
    if root not in times:
        raise ValueError(f"process {root} is not in /proc")
    return sum(times.get(pid, 0) for pid in [root, *_below(root, parents)]) / _TICKS


def _process_table() -> tuple[dict[int, int], dict[int, int]]:
    """(parent of each process, its utime + stime + cutime + cstime in ticks), read newest process first: a
    child reaped while the scan runs is then read before the parent that takes its time over (counted twice,
    which can only hide other work), never after (lost, which would invent it). Entries that exit while
    read, or cannot be parsed, are skipped."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for pid in sorted((int(e.name) for e in PROC.iterdir() if e.name.isdigit()), reverse=True):
        try:
            raw = (PROC / str(pid) / "stat").read_bytes()
            fields = raw[raw.rindex(b")") + 2:].split()  # after "pid (comm) ": state is field 3
            parents[pid] = int(fields[1])
            times[pid] = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        except (OSError, ValueError, IndexError):
            continue
    return parents, times


def _below(root: int, parents: dict[int, int]) -> list[int]:
    """Every descendant of `root` in a table of parents."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    out, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out

# Linux's prctl option that makes a process the parent of its orphaned descendants (<linux/prctl.h>).
PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> bool:
    """Make this process the parent of its descendants whose own parent exits (Linux): `reap_descendants`
    can then reap them all, and their CPU time reaches this process's count of reaped children."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_descendants(timeout_s: float = 5.0) -> None:
    """Kill every descendant of this process and reap them, so the CPU time they spent moves into this
    process's count before it exits: loader workers left alive at the verifier child's exit would otherwise
    be re-parented away and their time read as other work (with `adopt_orphans`, their own children too)."""
    import signal

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in _below(os.getpid(), _process_table()[0]):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.01)
