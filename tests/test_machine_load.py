"""The verifier reads how busy the rest of the machine is (`perflab.verify.machine_load`) and measures again,
once it is quiet, where another process competed with its child: a busy host must not fail a decision."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from perflab.labs import common
from perflab.verify import machine_load, protocol
from perflab.workload import TrainConfig

BASE = TrainConfig(data="tiny", image_size=32, batch_size=8, threads=1)
WORKERS = BASE.replace(num_workers=1, persistent_workers=True, prefetch_factor=2)
BUSY_LOOP = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def _outside_process(seconds: float) -> Iterator[int]:
    """A busy loop that is no descendant of this process (its parent exits at once, so it is re-parented
    away): another user's job on the machine. Yields its pid; killed on the way out."""
    program = ("import os, sys\nif os.fork():\n    os._exit(0)\nprint(os.getpid(), flush=True)\n"
               + BUSY_LOOP.format(seconds=seconds))
    launcher = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    pid = int(launcher.stdout.readline())
    launcher.wait()
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _foreign_over(seconds: float) -> float | None:
    start = machine_load.sample()
    time.sleep(seconds)
    return machine_load.foreign_cores(start, machine_load.sample())


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc")
def test_a_process_outside_the_grader_reads_as_other_work_and_the_graders_own_children_do_not() -> None:
    own = subprocess.Popen([sys.executable, "-c", BUSY_LOOP.format(seconds=2.0)])
    try:
        time.sleep(0.2)
        with_own = _foreign_over(1.5)
    finally:
        own.kill()
        own.wait()
    with _outside_process(2.0):
        time.sleep(0.2)
        with_outside = _foreign_over(1.5)
    assert with_own is not None and with_outside is not None
    # One busy process reads about one core; both windows share whatever else the host was doing.
    assert with_outside - with_own > 0.4, (with_own, with_outside)


def test_a_machine_without_proc_is_not_judged(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(machine_load, "PROC", tmp_path)
    assert machine_load.sample() is None
    assert machine_load.foreign_cores(None, None) is None and not machine_load.disturbed(None)
    assert machine_load.wait_for_quiet(limit_s=5) is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc")
def test_a_child_that_reaps_what_it_started_leaves_no_other_work_behind() -> None:
    """The verifier's child adopts its orphans and reaps every descendant before it exits: a worker's own
    child, orphaned when the worker ends, is this tree's work. Left behind, it is re-parented away and its
    CPU time reads as another process's."""
    spawn = (f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {BUSY_LOOP.format(seconds=3.0)!r}])\n"
             )
    program = ("import os, subprocess, sys, time\nfrom perflab.verify import machine_load\n"
               "reap = sys.argv[1] == 'reap'\nif reap:\n    machine_load.adopt_orphans()\n"
               f"subprocess.run([sys.executable, '-c', {spawn!r}])\ntime.sleep(1.5)\n"
               "if reap:\n    machine_load.reap_descendants()\nos._exit(0)\n")
    seen = {}
    for how in ("leave", "reap"):
        start = machine_load.sample()
        subprocess.run([sys.executable, "-c", program, how], check=True, timeout=60)
        seen[how] = machine_load.foreign_cores(start, machine_load.sample())
        time.sleep(1.6)  # a busy loop left behind ends on its own
    assert seen["leave"] is not None and seen["reap"] is not None
    assert seen["leave"] - seen["reap"] > 0.3, seen


def test_other_work_disturbs_a_measurement_only_beyond_the_cores_it_leaves_free(monkeypatch) -> None:
    monkeypatch.setattr(machine_load, "_allowed_cpus", lambda: set(range(2)))
    assert machine_load.disturbed(0.6) and not machine_load.disturbed(0.4)
    monkeypatch.setattr(machine_load, "_allowed_cpus", lambda: set(range(16)))
    assert not machine_load.disturbed(1.0) and not machine_load.disturbed(13.9, needed=2)
    assert machine_load.disturbed(14.6, needed=2) and machine_load.disturbed(11.6, needed=5)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc")
def test_waiting_for_quiet_ends_at_the_first_quiet_window_or_at_its_limit(monkeypatch) -> None:
    monkeypatch.setattr(machine_load, "_allowed_cpus", lambda: {0, 1})
    readings = iter([1.0, 0.9, 0.1, 1.0])
    monkeypatch.setattr(machine_load, "foreign_cores", lambda a, b: next(readings))
    assert machine_load.wait_for_quiet(limit_s=60, window_s=0.01) == 0.1
    monkeypatch.setattr(machine_load, "foreign_cores", lambda a, b: 1.0)
    started = time.monotonic()
    assert machine_load.wait_for_quiet(limit_s=0.05, window_s=0.01) == 1.0
    assert time.monotonic() - started < 5


@pytest.fixture()
def child(monkeypatch) -> list[dict]:
    """The verify child, replaced by one whose loader worker reads 0.88x (12 pairs): what a busy second core
    makes of it."""
    jobs: list[dict] = []

    def fake_run_child(job, *, time_limit, memory_limit):
        jobs.append(job)
        a = [0.100 + 0.001 * (i % 5) for i in range(12)]
        return {"baseline_times": a, "candidate_times": [t / 0.88 for t in a], "block_steps": 1,
                "timed_seconds": 0.5}, "", 2.0

    monkeypatch.setattr(protocol, "run_child", fake_run_child)
    monkeypatch.setattr(machine_load, "_allowed_cpus", lambda: {0, 1})  # a 2-core grader
    monkeypatch.setattr(machine_load, "sample", lambda root=None: machine_load.Sample(0.0, 0.0, 0.0))
    monkeypatch.setattr(machine_load, "wait_for_quiet", lambda *a, **k: 0.0)
    return jobs


def _loads(monkeypatch, *cores: float) -> None:
    readings = iter(cores)
    monkeypatch.setattr(machine_load, "foreign_cores", lambda a, b: next(readings))


def test_a_measurement_the_machines_other_work_disturbed_is_taken_again_once_it_is_quiet(child, monkeypatch) -> None:
    _loads(monkeypatch, 1.0, 0.02)
    with protocol.placed(None, None):  # the grader's measurement
        verdict = protocol.verify(BASE, WORKERS, expectation=0.9)
    assert len(child) == 2
    assert verdict.details["foreign_cores"] == 0.02 and protocol.BUSY_WORDS not in verdict.reason
    assert common.suspicion(verdict) is None
    assert verdict.details["first_run"]["foreign_cores"] == 1.0  # what the disturbed run measured is kept


def test_a_run_that_raised_or_was_caught_tampering_is_never_measured_again(monkeypatch) -> None:
    """Disturbing the machine must never buy a candidate a second draw of a verdict it earned."""
    jobs: list[dict] = []

    def tampered(job, *, time_limit, memory_limit):
        jobs.append(job)
        a = [0.1] * 12
        return {"baseline_times": a, "candidate_times": [t / 2 for t in a], "block_steps": 1, "timed_seconds": 0.5,
                "problems": [{"code": "clock_tampered", "detail": "time.perf_counter_ns was replaced"}]}, "", 2.0

    monkeypatch.setattr(protocol, "run_child", tampered)
    monkeypatch.setattr(machine_load, "_allowed_cpus", lambda: {0, 1})
    monkeypatch.setattr(machine_load, "sample", lambda root=None: machine_load.Sample(0.0, 0.0, 0.0))
    monkeypatch.setattr(machine_load, "foreign_cores", lambda a, b: 1.0)
    with protocol.placed(None, None):
        verdict = protocol.verify(BASE, WORKERS, expectation=0.9)
    assert len(jobs) == 1 and verdict.outcome == "fail" and verdict.code == "clock_tampered"


def test_a_quiet_measurement_is_taken_once(child, monkeypatch) -> None:
    _loads(monkeypatch, 0.03)
    verdict = protocol.verify(BASE, WORKERS, expectation=0.9)
    assert len(child) == 1 and verdict.details["foreign_cores"] == 0.03


def test_a_machine_busy_both_times_keeps_the_verdict_and_says_so_for_a_person(child, monkeypatch) -> None:
    _loads(monkeypatch, 1.0, 0.8)
    with protocol.placed(None, None):
        verdict = protocol.verify(BASE, WORKERS, expectation=0.9)
    assert len(child) == 2 and verdict.outcome == "fail"  # no credit from a busy machine either
    assert protocol.BUSY_WORDS in verdict.reason and "0.80 CPU cores busy on average while it was timed, twice" \
        in verdict.reason
    flag = common.suspicion(verdict)
    assert flag is not None and flag.endswith(common.BUSY_FLAG_END)
    mark = common.mark_of(verdict, common.decision_bar(_parity()))
    assert mark.fraction == 0.0 and mark.flag == flag and mark.verdict["foreign_cores"] == 0.8


def test_a_grading_run_never_shares_a_disturbed_measurement(child, monkeypatch) -> None:
    _loads(monkeypatch, 1.0, 0.9, 0.0)
    with protocol.shared_measurements(), protocol.placed(None, None):
        protocol.verify(BASE, WORKERS, expectation=0.9)  # busy twice: measured twice, kept for no one
        again = protocol.verify(BASE, WORKERS, expectation=0.9)
    assert len(child) == 3 and again.details["foreign_cores"] == 0.0


def test_a_students_own_measurement_is_not_repeated_but_says_what_disturbed_it(child, monkeypatch) -> None:
    """At home (no grader around it) the notebook's verdict is measured once and tells the student why its
    figure may be low."""
    _loads(monkeypatch, 0.9)
    verdict = protocol.verify(BASE, WORKERS, expectation=0.9)
    assert len(child) == 1 and protocol.BUSY_WORDS in verdict.reason and ", twice" not in verdict.reason
    # The keep rule rewrites the reason of a measurably slower decision: the note stays.
    judged = common.judge_decision(verdict)
    assert judged.code in ("below_bar", "slower_than_without") and protocol.BUSY_WORDS in judged.reason
    assert common.suspicion(judged) == ("the machine was busy with other work (0.90 CPU cores on average) while "
                                        f"this cell was re-measured: {common.BUSY_FLAG_END}")


def _parity():
    from perflab.verify.expectations import Expectation

    return Expectation("lab06_final", 0.9, "parity", "cpu-bf16", True, "calibrated here")


def test_calibration_measures_again_what_the_machine_disturbed_and_keeps_the_load_of_each_run(monkeypatch) -> None:
    """A bar calibrated beside other work is the load's: each calibration run is taken as the grader takes
    its re-measurements, and its file keeps the other work it saw."""
    from types import SimpleNamespace

    from perflab.verify import Budget, calibrate

    seen: list[bool] = []

    def fake_verify(base, cand, *, expectation, budget, seed, hashes):
        seen.append(protocol._grading.get())
        return SimpleNamespace(speedup=1.3, ci=(1.25, 1.35), code="clears_bar", outcome="pass", pairs=16,
                               block_steps=1, elapsed_seconds=1.0, details={"foreign_cores": 0.01}, reason="")

    monkeypatch.setattr(protocol, "verify", fake_verify)
    entry = calibrate._measure("num_workers", BASE, WORKERS, 2, Budget(min_pairs=16, max_pairs=16), None)
    assert seen == [True, True] and not protocol._grading.get()
    assert [run["foreign_cores"] for run in entry["runs"]] == [0.01, 0.01]
