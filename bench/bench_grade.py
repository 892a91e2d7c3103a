"""Grading throughput: submissions per hour, serial, with the local pool, and through Ray.

Each mode grades the same class (N copies of the lab's reference solution, handed in by N
students) in a fresh course folder, in grade mode, through the full sandbox. The clock runs
from the first submission to the last merge; setting up the course, the lab's gradebook
template and the Ray cluster are timed apart (they happen once per course, not per notebook).
A lab whose notebook decides from its own measurements (`perflab.labs.homework.LABS`) is first run
once as at home, in grade mode, as a student runs it before handing it in: the copies carry what it
measured there, which the grader replays instead of timing the homework again. That home run is
timed apart too (the student's time, not the grader's).

    python bench/bench_grade.py [--lab lab01_measure] [--solutions solutions/] [-n 6]
                                [--modes serial,pool,ray] [--jobs 2] [--ray-address ADDR]

Without --ray-address it starts a local Ray cluster on loopback for the run and stops it after.
The lab defaults to the kit's test fixture (a small lab with one timed cell: it measures the
autograder's own cost per notebook); name a lab to measure that lab from solutions/.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from perflab.grading import collect, pipeline, ray_backend, sandbox
from perflab.grading.state import State

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "grading" / "solutions"


@dataclass(frozen=True)
class Row:
    mode: str
    jobs: int
    submissions: int
    wall_s: float
    ok: int
    once_s: float  # one-off cost before the first submission (cluster start)
    home_s: float = 0.0  # the reference's one home run before it was handed in (not grading time)

    @property
    def per_hour(self) -> float:
        return self.submissions / self.wall_s * 3600


def solved(release, source):
    """The student copy with every answer cell filled in from the instructor's source."""
    nb = copy.deepcopy(release)
    answers = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in source.cells}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and meta.get("grade_id") in answers:
            cell.source = re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", "", answers[meta["grade_id"]],
                                 flags=re.MULTILINE)
    return nb


def make_course(folder: Path, solutions: Path, lab: str, n: int, cell_timeout: int = 600) -> tuple[Path, float]:
    """The course with `n` copies of the reference handed in; and the seconds of its home run (0 if none)."""
    from perflab.demo import home_run
    from perflab.labs import homework

    course = folder / "course"
    pipeline.setup(course, solutions, [lab])
    pipeline.template(course, lab)
    name = next((solutions / lab).glob("*.ipynb")).name
    good = solved(nbformat.read(course / "release" / lab / name, as_version=4),
                  nbformat.read(solutions / lab / name, as_version=4))
    home_s = 0.0
    if lab in homework.LABS:
        began = time.perf_counter()
        good = home_run(good, folder / "home" / lab, "grade", timeout=cell_timeout, name=name)
        home_s = time.perf_counter() - began
    hand_ins = folder / "hand_ins"
    hand_ins.mkdir()
    for i in range(n):
        good.metadata["perflab_bench_copy"] = i  # distinct content: nothing is skipped as already graded
        nbformat.write(good, hand_ins / f"s{i:03d}_{lab}.ipynb")
    collect.collect(course, hand_ins)
    return course, home_s


def run_mode(mode: str, solutions: Path, lab: str, n: int, jobs: int, address: str | None,
             settings: pipeline.Settings) -> Row:
    with tempfile.TemporaryDirectory(prefix=f"bench-grade-{mode}-") as tmp:
        course, home_s = make_course(Path(tmp), solutions, lab, n, settings.cell_timeout)
        once = 0.0
        with contextlib.ExitStack() as stack:
            if mode == "ray" and address is None:
                began = time.perf_counter()
                address = stack.enter_context(ray_backend.local_cluster())
                once = time.perf_counter() - began
            run_settings = pipeline.Settings(limits=settings.limits, cell_timeout=settings.cell_timeout,
                                             jobs=1 if mode == "serial" else jobs, unisolated=settings.unisolated)
            started = time.perf_counter()
            pipeline.grade(course, run_settings, backend="ray" if mode == "ray" else "local",
                           ray_address=address, solutions=solutions)
            wall = time.perf_counter() - started
        records = State.load(course).records.values()
        ok = sum(r.outcome == "graded" and all(c.score is None or c.score == c.max_score for c in r.cells)
                 for r in records)  # every autograded cell at full marks (written answers wait for a person)
        for r in records:  # what kept a copy of the reference below full marks, in one line each
            if not (r.outcome == "graded" and r.score == r.max_score):
                short = "; ".join(f"{c.grade_id} {c.score}/{c.max_score}: {c.error}"[:240] for c in r.cells
                                  if c.score is not None and c.score < c.max_score) or r.outcome
                print(f"  {r.student}: {r.score}/{r.max_score}: {short}", file=sys.stderr)
    return Row(mode, 1 if mode == "serial" else jobs, n, wall, ok, once, home_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--solutions", type=Path, default=None)
    parser.add_argument("--lab", default=None)
    parser.add_argument("-n", type=int, default=6, help="submissions per mode")
    parser.add_argument("--modes", default="serial,pool,ray")
    parser.add_argument("--jobs", type=int, default=2, help="pool size for the pool mode (Ray: the cluster's CPUs)")
    parser.add_argument("--ray-address", default=None)
    parser.add_argument("--wall", type=float, default=900.0)
    parser.add_argument("--cell-timeout", type=int, default=600)
    parser.add_argument("--unisolated", action="store_true",
                        help="grade even where the OS has no namespaces (the kit's own notebooks only)")
    args = parser.parse_args()
    solutions = args.solutions or (ROOT / "solutions" if args.lab else FIXTURE)
    lab = args.lab or pipeline.lab_names(solutions)[0]
    settings = pipeline.Settings(limits=sandbox.Limits(wall_s=args.wall), cell_timeout=args.cell_timeout,
                                 unisolated=args.unisolated)
    print(f"grading throughput: {lab} from {solutions}, {args.n} submissions per mode, "
          f"{os.cpu_count()} cores, sandbox {sandbox.isolation().kind}")
    print(f"{'mode':8s} {'jobs':>4s} {'graded':>7s} {'wall s':>8s} {'s/each':>7s} {'per hour':>9s}  one-off",
          flush=True)
    rows = []
    for mode in (m.strip() for m in args.modes.split(",") if m.strip()):
        r = run_mode(mode, solutions, lab, args.n, args.jobs, args.ray_address, settings)
        rows.append(r)
        once = "; ".join(([f"cluster start {r.once_s:.0f} s"] if r.once_s else [])
                         + ([f"home run {r.home_s:.0f} s"] if r.home_s else []))
        print(f"{r.mode:8s} {r.jobs:4d} {r.ok:3d}/{r.submissions:<3d} {r.wall_s:8.1f} {r.wall_s / r.submissions:7.1f} "
              f"{r.per_hour:9.0f}  {once}", flush=True)
    return 0 if all(r.ok == r.submissions for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
