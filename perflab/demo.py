"""A demo class, graded end to end: `python -m perflab.demo [--labs L ...] [--mode grade|tiny]`.

From the real lab notebooks in solutions/ it makes a handful of synthetic students, one file per
(student, lab), the way an LMS download names them:

    reference   the solution with its answers kept and the hidden tests removed, as a student
                who answered everything right would hand it in
    partial     the reference with every other code answer left blank (`YOUR CODE HERE`)
    cheater     the reference with its speedup claims typed in and the clock patched while it
                measures (lab 1 has no claim: its timer returns typed-in timings under a patched clock)
    crasher     the reference with a cell that kills the kernel (a segfault)
    marker      the reference with a cell that prints the hidden-test marker (its feedback notebook is
                withheld and flagged; the batch goes on)
    lazy        the reference with every speed choice left at the baseline (the lab manifest's
                `lazy_choices`): every answer right, nothing optimised; it earns no re-measured
                speedup where the grading hardware has one to give
    broken      a notebook cut off half-way: not valid JSON

then drives the instructor's workflow through `perflab.grading` (setup, collect, grade with the
local back-end in grade mode, feedback, export; on a machine whose class has no committed bar for a
graded lab, it calibrates that bar first, `perflab.grading.self_calibration`, so that the lazy student
loses every gain cell this machine gives), renders each student's optimization report from
the results files their graded notebook wrote and the class report, and prints where each artefact
is and a table of scores. Everything lands in `demo/` (or `--out`), which a re-run replaces. The students
of a lab that decides from its home measurements (labs 2, 3, 5 and 6) are made from one executed
reference, so grading flags them as copies of one another (`perflab.grading.copies`), as it should: the
demo says so and lists the pairs.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perflab.grading.checks import grade_id

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
DEMO_DIR = REPO / "demo"
SOLUTIONS_DIR = REPO / "solutions"
STUDENTS = ("reference", "partial", "lazy", "cheater", "crasher", "marker", "broken")
WHO = {
    "reference": "the solution, answers kept, hidden tests removed",
    "partial": "every other code answer left blank",
    "lazy": "every answer right, every speed choice left at the baseline",
    "cheater": "typed-in speedup claims, clock patched while measuring",
    "crasher": "a cell that segfaults the kernel",
    "marker": "the reference, plus a cell printing the hidden-test marker",
    "broken": "a file cut off half-way (not JSON)",
}
# A typed-in claim far above anything ResNet-18 training gains from one knob on any device here.
FAKE_CLAIM = 9.0
# A name holding a claimed speedup: what a cheater types a number into.
CLAIM_NAME = re.compile(r"CLAIM\w*|\w*_speedup|claimed\w*", re.IGNORECASE)
SOLUTION_MARKER = re.compile(r"^[ \t]*#+[ \t]*(BEGIN|END) SOLUTION[^\n]*\n?", re.MULTILINE)
CLOCK_PATCH = ("import time as _clock\n_real_clock = _clock.perf_counter\n"
               "_clock.perf_counter = lambda: 0.0  # every interval measures as zero\n")
CLOCK_RESTORE = "_clock.perf_counter = _real_clock\n"
LAB1_FAKE_TIMER = '''def time_callable(fn, warmup=3, repeats=20, clock=time.perf_counter, sync=None):
    """Typed-in timings under a patched clock."""
    _real = time.perf_counter
    time.perf_counter = lambda: 0.0
    fn()
    time.perf_counter = _real
    speedup = 4.0
    return {"samples": [0.001] * repeats, "median": 0.001, "p95": 0.001, "p99": 0.001, "spread": 0.0,
            "speedup": speedup}
'''
# Why the demo's graded students of a lab that records its home measurements are flagged as copies.
COPIES_NOTE = ("the demo's students of a lab are made from one executed reference, so they hand in the same home "
               "measurements, which two runs never share; a class's own students each run their notebook")
SEGFAULT = "import ctypes\nctypes.string_at(0)  # reads address 0: the kernel dies\n"


# ---------------------------------------------------------------------------------------------
# the synthetic students


def strip_solution_markers(source: str) -> str:
    """A solution cell's text with its BEGIN/END SOLUTION lines removed and its answer kept."""
    return SOLUTION_MARKER.sub("", source)


def reference_notebook(source: Any, release: Any) -> Any:
    """The released notebook with every answer cell filled in from the source: what nbgrader
    releases (hidden tests gone, locked cells as released) plus the solutions, without markers."""
    answers = {grade_id(c): c.source for c in source.cells
               if (c.metadata.get("nbgrader") or {}).get("solution") and grade_id(c)}
    nb = copy.deepcopy(release)
    for cell in nb.cells:
        gid = grade_id(cell)
        if gid in answers:
            cell.source = strip_solution_markers(answers[gid])
    return nb


def _answer_cells(nb: Any, cell_type: str = "code") -> list[Any]:
    return [c for c in nb.cells if c.cell_type == cell_type and (c.metadata.get("nbgrader") or {}).get("solution")]


def partial_notebook(reference: Any, release: Any) -> Any:
    """The reference with every other code answer (the 2nd, 4th, ...) back to its blank release text."""
    blank = {grade_id(c): c.source for c in _answer_cells(release)}
    nb = copy.deepcopy(reference)
    for cell in _answer_cells(nb)[1::2]:
        cell.source = blank[grade_id(cell)]
    return nb


def claim_names(source: str) -> list[str]:
    """Names a cell assigns that hold a claimed speedup (`CLAIM`, `CLAIM_AMP`, `best_speedup`...)."""
    try:
        tree = ast.parse("\n".join("pass" if line.lstrip().startswith(("%", "!")) else line
                                   for line in source.splitlines()))
    except SyntaxError:
        return []
    names = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name) and CLAIM_NAME.fullmatch(name.id):
                    names.append(name.id)
    return list(dict.fromkeys(names))


def cheater_notebook(reference: Any, release: Any) -> Any:
    """The reference with its claims typed in over the honest figures, under a patched clock (after
    the notebook's own timing ran, so the notebook still reaches its verification cells). Where the claim sits in a locked cell, that cell is edited (the
    grader restores it and flags the edit)."""
    locked = {grade_id(c) for c in release.cells if (c.metadata.get("nbgrader") or {}).get("locked")}
    nb = copy.deepcopy(reference)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        if grade_id(cell) == "time_callable":  # lab 1: its timer is the claim
            cell.source = LAB1_FAKE_TIMER
            return nb
    editable = [c for c in code if grade_id(c) is None or grade_id(c) not in locked]
    targets = [c for c in editable if claim_names(c.source)] or [c for c in code if claim_names(c.source)]
    for cell in targets:
        typed = "".join(f"{name} = {FAKE_CLAIM}  # typed in\n" for name in claim_names(cell.source))
        cell.source = cell.source + "\n" + CLOCK_PATCH + typed + CLOCK_RESTORE
    if not targets:  # a lab without a claim: patch the clock in its first answer
        cells = _answer_cells(nb)
        if cells:
            cells[0].source = CLOCK_PATCH + cells[0].source + "\n" + CLOCK_RESTORE
    return nb


def crasher_notebook(reference: Any) -> Any:
    """The reference with a segfault at the top of its second code answer (the first still scores)."""
    nb = copy.deepcopy(reference)
    cells = _answer_cells(nb)
    target = cells[1] if len(cells) > 1 else cells[0]
    target.source = SEGFAULT + target.source
    return nb


def lazy_notebook(reference: Any, lab: str) -> Any:
    """The reference with each speed choice of `lab` set back to the baseline after its own code ran: what
    the lazy student appends to each speed-choice answer (by grade_id) is the lab's manifest's
    `lazy_choices`, the baseline kept with the honest claim and a consistent ablation, so that only the
    choice itself differs."""
    from perflab.labs import registry

    choices = registry.manifest(lab).lazy_choices
    nb = copy.deepcopy(reference)
    for cell in _answer_cells(nb):
        line = choices.get(grade_id(cell) or "")
        if line:
            cell.source = cell.source.rstrip("\n") + "\n# every speed choice left at the baseline\n" + line + "\n"
    return nb


# Spelled in two pieces so the student bundle's own leak scan does not stop at this file.
MARKER_CELL = 'print("### " + "BEGIN HIDDEN TESTS")  # looks like grader material: feedback withholds it\n'


def marker_notebook(reference: Any) -> Any:
    """The reference with a cell that prints the hidden-test marker after its first answer."""
    from nbformat.v4 import new_code_cell

    nb = copy.deepcopy(reference)
    first = _answer_cells(nb)[0]
    nb.cells.insert(nb.cells.index(first) + 1, new_code_cell(MARKER_CELL))
    return nb


def home_run(nb: Any, folder: Path, mode: str, timeout: int = 600, name: str = "notebook.ipynb") -> Any:
    """`nb` executed as a student runs it at home (saved as `name` in `folder`, run there in `mode`,
    outside any grader), so that what it hands in carries its home measurements
    (`perflab.labs.homework`); the executed copy, also saved there."""
    import nbformat

    from perflab.labs.build import run_notebook

    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / name)  # a lab reads its own saved notebook (lab 6's written analysis)
    executed, _ = run_notebook(folder / name, mode=mode, timeout=timeout, workdir=folder, allow_errors=True)
    nbformat.write(executed, folder / name)
    return executed


def write_class(labs: Sequence[str], release_dir: Path, solutions: Path, out: Path,
                students: Sequence[str] = STUDENTS,
                home: Callable[[Any, str], Any] | None = None) -> dict[str, dict[str, Path]]:
    """Write `<student>_<lab>.ipynb` for every student and lab into `out`; {student: {lab: path}}.
    `home(reference, lab)`, where given, runs the reference as at home first: every student of the lab
    is made from the executed copy, and hands in what it measured there."""
    import nbformat

    out.mkdir(parents=True, exist_ok=True)
    made: dict[str, dict[str, Path]] = {s: {} for s in students}
    for lab in labs:
        source = nbformat.read(next((Path(solutions) / lab).glob("*.ipynb")), as_version=4)
        release = nbformat.read(next((Path(release_dir) / lab).glob("*.ipynb")), as_version=4)
        reference = reference_notebook(source, release)
        if home is not None:
            reference = home(reference, lab)
        notebooks = {"reference": reference, "partial": partial_notebook(reference, release),
                     "lazy": lazy_notebook(reference, lab),
                     "cheater": cheater_notebook(reference, release), "crasher": crasher_notebook(reference),
                     "marker": marker_notebook(reference)}
        for student, nb in notebooks.items():
            if student not in made:
                continue
            path = out / f"{student}_{lab}.ipynb"
            nbformat.write(nb, path)
            made[student][lab] = path
        if "broken" in made:
            text = nbformat.writes(reference)
            path = out / f"broken_{lab}.ipynb"
            path.write_text(text[: len(text) // 2], encoding="utf-8")
            made["broken"][lab] = path
    return made


# ---------------------------------------------------------------------------------------------
# the run


@dataclass(frozen=True)
class Demo:
    """Where everything the demo made lies, and the scores it got."""

    root: Path
    course: Path
    labs: tuple[str, ...]
    students: tuple[str, ...]
    grades_csv: Path
    grades_json: Path
    feedback: tuple[Path, ...]
    reports: dict[str, Path]  # student -> report.html (students with results files)
    class_report: Path
    scores: dict[str, dict[str, tuple[float, float]]]  # student -> lab -> (score, max)
    notes: dict[str, dict[str, tuple[str, ...]]]  # student -> lab -> feedback lines
    seconds: float
    warnings: tuple[str, ...] = field(default=())
    autograded_max: dict[str, float] = field(default_factory=dict)  # lab -> points of its autograded cells
    calibration_seconds: float = 0.0  # calibrating the bars this machine had none for, before grading
    calibration: str = ""  # what was calibrated, in words ("" where every bar was there)
    copies: tuple[str, ...] = ()  # the copy pairs grading flagged (`perflab.grading.copies`): expected here

    def table(self) -> str:
        """Student x lab autograded scores out of each lab's autograded points (written answers wait
        for a person, so they score nothing yet)."""
        width = max(len(lab) for lab in self.labs)
        head = f"{'student':10s} " + " ".join(f"{lab:>{width}s}" for lab in self.labs) + "   who"
        lines = [head, "-" * len(head)]
        for student in self.students:
            cells = []
            for lab in self.labs:
                score, top = self.scores.get(student, {}).get(lab, (0.0, 0.0))
                top = self.autograded_max.get(lab, top)
                cells.append(f"{f'{score:g}/{top:g}':>{width}s}")
            lines.append(f"{student:10s} " + " ".join(cells) + f"   {WHO[student]}")
        return "\n".join(lines)


def run(labs: Sequence[str] | None = None, *, out: Path = DEMO_DIR, mode: str = "grade",
        solutions: Path = SOLUTIONS_DIR, students: Sequence[str] | None = None, cell_timeout: int = 600,
        wall: float = 1500.0, gpus: int | None = None, say: Callable[[str], None] = log.info) -> Demo:
    """Make the demo class and grade it; returns where everything is (see the module docstring). `gpus`:
    as `perflab grade grade --gpus` (default: every GPU here, one per job; 0 grades on the CPU)."""
    from perflab import course as course_file
    from perflab import dataset
    from perflab import report as report_mod
    from perflab.env import MODES, mode_sizes
    from perflab.grading import collect, devices, export, pipeline, sandbox, self_calibration
    from perflab.grading.state import State
    from perflab.labs import homework

    if mode not in MODES:
        raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
    started = time.monotonic()
    labs = list(labs) if labs else pipeline.lab_names(solutions)
    students = tuple(students) if students else STUDENTS
    unknown = [s for s in students if s not in STUDENTS]
    if unknown:
        raise ValueError(f"--students: no synthetic student {', '.join(unknown)} (known: {', '.join(STUDENTS)})")
    missing = [lab for lab in labs if not (Path(solutions) / lab).is_dir()]
    if missing:
        known = ", ".join(pipeline.lab_names(solutions))
        raise ValueError(f"--labs: no lab {', '.join(missing)} in {solutions} (known: {known})")
    out = Path(out).resolve()
    if out.exists():
        shutil.rmtree(out)
    course = out / "course"
    steps = 8
    step = iter(range(1, steps + 1))

    def stage(text: str) -> None:
        say(f"[{next(step)}/{steps} {time.monotonic() - started:6.0f} s] {text}")

    device = devices.decide(gpus)  # the one device every job grades for, and the data sets it needs
    say(f"    {device.line()}")
    sizes = sorted({mode_sizes(mode, device=device.kind).data,
                    *(mode_sizes(mode, lab=lab, device=device.kind).data for lab in labs)})
    stage(f"data set(s) {', '.join(sizes)} (built once, verified against the manifest)")
    for size in sizes:
        if not dataset.is_built(size):
            dataset.build(size)
    stage(f"course folder {course} from {solutions} ({len(labs)} lab(s))")
    pipeline.setup(course, solutions, labs)
    # The course file setup wrote (or kept) is in force for the home runs and the calibration as for the grading.
    with course_file.in_force(course_file.of_folder(course)):
        stage("demo class: " + ", ".join(students))
        at_home = [lab for lab in labs if lab in homework.LABS]

        def home(reference: Any, lab: str) -> Any:
            if lab not in at_home:
                return reference
            begun = time.monotonic()
            executed = home_run(reference, out / "home" / lab, mode, timeout=cell_timeout, name=f"{lab}.ipynb")
            say(f"    {lab}: the reference ran at home in {time.monotonic() - begun:.0f} s; every student of the lab "
                f"hands in what it measured there ({len(homework.from_notebook(executed))} measurement(s))")
            return executed

        if at_home:
            say(f"    {', '.join(at_home)}: each decides from its own measurements, so its reference runs once at home "
                "first, as a student's does, and the grader replays what it measured (perflab.labs.homework)")
        made = write_class(labs, course / "release", solutions, out / "class", students, home=home)
        stage(f"collect {sum(len(v) for v in made.values())} submission(s) from {out / 'class'}")
        collected = collect.collect(course, out / "class")
        for line in collected.lines():
            log.debug("collect: %s", line)

        total = sum(len(v) for v in made.values())
        done = [0]

        def graded(record: Any) -> None:
            done[0] += 1
            flag = "  FLAGGED" if record.flagged else ""
            say(f"    {done[0]:2d}/{total} {record.lab}/{record.student}: {record.score:g}/{record.max_score:g} "
                f"{record.outcome} ({record.wall_s:.0f} s){flag}")

        stage(f"grade {total} submission(s) in {mode} mode, local back-end, with verification")
        # The demo class is the kit's own notebooks, so it may grade where the sandbox has no namespaces
        # (a student's never is, unless the instructor says --unisolated); it says so, and the grades record it.
        unisolated = sandbox.isolation().kind == "none"
        if unisolated:
            say("    no Linux namespaces here: the demo class (the kit's own notebooks) is graded unisolated")
        settings = pipeline.Settings(limits=sandbox.Limits(wall_s=wall), cell_timeout=cell_timeout,
                                     env={"PERFLAB_MODE": mode}, unisolated=unisolated, gpus=device.gpus,
                                     device=device.kind)
        # A machine with no bar for what the labs grade measures it first (kept with the course): without
        # one, the lazy student would pass every gain cell. One line says why and about how long, one what it cost.
        calibration = self_calibration.before_grading(course, labs, settings, say=lambda text: say(f"    {text}"))
        graded_run = pipeline.grade(course, settings, solutions=solutions, progress=graded)
        for fault in graded_run.machine_faults:
            say(f"    NOT GRADED (the grading machine's fault) {fault}")
        if graded_run.copies:
            say(f"    {len(graded_run.copies)} copy pair(s) flagged, as expected: {COPIES_NOTE}")
        stage("feedback pages")
        pages = pipeline.feedback(course).pages
        stage("export grades.csv and grades.json")
        csv_path, json_path = export.export(course)
        stage("optimization reports: one per student, and the class report")
        reports_dir = out / "reports"
        warnings: list[str] = []
        reports: dict[str, Path] = {}
        for student in students:
            files = [course / "autograded" / student / lab / "results" / f"{lab}.json" for lab in labs]
            files = [f for f in files if f.is_file()]
            if not files:
                warnings.append(f"{student}: no results files (the notebook never reached its save cell)")
                continue
            try:
                rendered = report_mod.write_report(files, reports_dir / f"{student}.html",
                                                   title=f"Optimization report: {student}")
            except Exception as exc:  # a student's own results file may be malformed: say so, go on
                warnings.append(f"{student}: no report ({type(exc).__name__}: {exc})")
                continue
            warnings += [f"{student}: {w}" for w in rendered.warnings]
            reports[student] = reports_dir / f"{student}.html"
        class_report = reports_dir / "class.html"
        report_mod.write_class_report(json_path, class_report, title="Demo class")

        state = State.load(course)
        scores: dict[str, dict[str, tuple[float, float]]] = {}
        notes: dict[str, dict[str, tuple[str, ...]]] = {}
        for record in state.records.values():
            scores.setdefault(record.student, {})[record.lab] = (record.score, record.max_score)
            notes.setdefault(record.student, {})[record.lab] = tuple(record.notes)
        return Demo(out, course, tuple(labs), students, csv_path, json_path, tuple(pages), reports, class_report,
                    scores, notes, time.monotonic() - started, tuple(warnings),
                    {lab: autograded_points(course / "source" / lab / f"{lab}.ipynb") for lab in labs},
                    calibration.seconds, calibration.line(), graded_run.copies)


def autograded_points(source: Path) -> float:
    """Points of a source notebook's autograded cells (graded, not an answer a person grades)."""
    import nbformat

    total = 0.0
    for cell in nbformat.read(source, as_version=4).cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            total += float(meta.get("points", 0))
    return total


def summary(demo: Demo) -> str:
    """Where each artefact is, and the score table."""

    def rel(path: Path) -> str:
        path = Path(path)
        return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)

    lines = [f"demo finished in {demo.seconds / 60:.1f} min"
             + (f", {demo.calibration_seconds:.0f} s of it calibrating this machine's missing bars" if demo.calibration else ""),
             *([f"  {demo.calibration}"] if demo.calibration else []), "", "artefacts:",
             f"  course folder      {rel(demo.course)}",
             f"  submissions        {rel(demo.root / 'class')}/",
             f"  grade table        {rel(demo.grades_csv)}  and  {rel(demo.grades_json)}",
             f"  feedback (HTML)    {rel(demo.course / 'feedback')}/<student>/<lab>/  ({len(demo.feedback)} pages)",
             f"  class report       {rel(demo.class_report)}"]
    for student, path in demo.reports.items():
        lines.append(f"  report {student:11s} {rel(path)}")
    lines += ["", "autograded scores (written answers wait for a person: see the feedback):", demo.table()]
    if demo.copies:
        lines += ["", f"copy pairs flagged for review ({len(demo.copies)}), as expected: {COPIES_NOTE}"]
        lines += [f"  {pair[:200]}" for pair in demo.copies[:8]] + (["  ..."] if len(demo.copies) > 8 else [])
    for student in ("cheater", "crasher", "broken"):
        for lab, items in sorted(demo.notes.get(student, {}).items()):
            for item in items[:3]:
                lines.append(f"  {student}/{lab}: {item[:160]}")
    if demo.warnings:
        lines += ["", "notes:"] + [f"  {w}" for w in demo.warnings]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perflab.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--labs", nargs="+", help="only these labs (default: every lab in solutions/)")
    p.add_argument("--mode", default=os.environ.get("PERFLAB_MODE", "grade"),
                   help="run mode of the graded notebooks (default: grade, or PERFLAB_MODE)")
    p.add_argument("--students", nargs="+", help=f"only these synthetic students (of: {', '.join(STUDENTS)})")
    p.add_argument("--out", type=Path, default=DEMO_DIR, help="folder for everything (replaced; default: demo/)")
    p.add_argument("--cell-timeout", type=int, default=600, help="seconds one cell may run")
    p.add_argument("--gpus", type=int, default=None,
                   help="GPUs grading uses, one per job (default: every GPU here; 0 grades on the CPU)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("traitlets").setLevel(logging.ERROR)  # nbconvert's notes on image alt text
    try:
        demo = run(args.labs, out=args.out, mode=args.mode, students=args.students, cell_timeout=args.cell_timeout,
                   gpus=args.gpus, say=lambda text: print(text, flush=True))
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary(demo))
    (demo.root / "summary.json").write_text(json.dumps(
        {"seconds": demo.seconds, "calibration_seconds": demo.calibration_seconds, "labs": demo.labs,
         "scores": {s: {lab: list(v) for lab, v in labs.items()} for s, labs in demo.scores.items()},
         "reports": {s: str(p) for s, p in demo.reports.items()}, "class_report": str(demo.class_report)},
        indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
