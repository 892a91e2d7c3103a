"""The Ray back-end on a real local cluster (loopback): a worker killed mid-run, every submission
graded exactly once."""

from __future__ import annotations

import builtins
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from perflab.grading import collect, pipeline, ray_backend, sandbox
from perflab.grading.state import State

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "grading"))

import cases  # noqa: E402

pytestmark = pytest.mark.slow

SOLUTIONS = Path(__file__).parent / "fixtures" / "grading" / "solutions"
LAB = cases.LAB


def _ours(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if marker in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid()]


@pytest.fixture()
def ray_cluster():
    with ray_backend.local_cluster(num_cpus=2) as address:
        yield address


def test_ray_grades_each_submission_exactly_once_despite_a_killed_worker(tmp_path, ray_cluster):
    course = tmp_path / "course"
    pipeline.setup(course, SOLUTIONS)
    release = course / "release" / LAB / f"{LAB}.ipynb"
    every = cases.make_class(release, SOLUTIONS / LAB / f"{LAB}.ipynb", tmp_path / "all", port=9, forbidden=[tmp_path / "x"])
    chosen = {"sol": every["sol"], "partial": every["partial"], "blank": every["blank"], "segfault": every["segfault"]}
    (tmp_path / "class").mkdir()
    for student in chosen:
        name = f"{student}_{LAB}.ipynb"
        shutil.copy(tmp_path / "all" / name, tmp_path / "class" / name)
    assert len(collect.collect(course, tmp_path / "class").collected) == len(chosen)

    killed: list[int] = []
    seen_workers: set[int] = set()
    stop = threading.Event()

    def kill_one_ray_worker() -> None:
        """Kill the Ray worker process running the first sandboxed grade that shows up."""
        while not stop.is_set():
            for proc in _ours("perflab.grading.worker"):
                seen_workers.add(proc.pid)
                if killed:
                    continue
                for parent in proc.parents():
                    line = " ".join(parent.cmdline())
                    if parent.name().startswith("ray::") or "ray::" in line or "default_worker" in line:
                        parent.kill()
                        killed.append(parent.pid)
                        break
            time.sleep(0.2)

    watcher = threading.Thread(target=kill_one_ray_worker, daemon=True)
    watcher.start()
    settings = pipeline.Settings(limits=sandbox.Limits(wall_s=60, memory_bytes=4 * 1024**3, processes=256),
                                 cell_timeout=10)
    own_print = builtins.print
    try:
        summary = pipeline.grade(course, settings, backend="ray", ray_address=ray_cluster, solutions=SOLUTIONS)
    finally:
        stop.set()
        watcher.join(timeout=5)

    assert builtins.print is own_print, "Ray's driver left its print in the grader's process"
    assert killed, "no Ray worker was caught mid-grade"
    assert len(seen_workers) > len(chosen)  # the killed task ran again
    assert sorted(summary.graded) == sorted(f"{LAB}/{s}" for s in chosen)
    records = State.load(course).records
    assert sorted(records) == sorted(f"{LAB}/{s}" for s in chosen)
    for student, exp in chosen.items():
        record = records[f"{LAB}/{student}"]
        assert record.merges == 1 and record.backend == "ray"
        assert record.score == exp.score, (student, record.notes)
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "perflab") as gb:
        assert len(gb.find_assignment(LAB).submissions) == len(chosen)
