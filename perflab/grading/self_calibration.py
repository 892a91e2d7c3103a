"""A grading machine with no bar for a lab it grades measures that bar first, and keeps it with the course.

A re-measured cell is held to the bar `perflab calibrate` wrote for the grading machine's hardware class.
Where `autograder/expectations/` has none for an entry a graded lab reads, the cell would fall back to
the conservative rule (no gain required), and a student who kept the baseline would earn a speedup's
points: on a 2-core `cpu` host, lab 2's lazy student earned its verified cell although two loader
workers gain 1.22x there. So before it grades (the local back-end, grade and laptop mode), `perflab grade
grade` calibrates exactly the entries the graded labs read that no folder has (at the grade workload of
the lab that reads each, at the protocol's budget), says what it will cost first and what it cost after,
and writes them to `<course>/calibration/<hardware_class>.json` with the host's name. Every later run
on that machine reads that file after the committed folder (`expectations.reading`): a committed bar
wins where it exists. The course folder is hidden from every sandbox, this file with it.

`--no-calibration` grades such cells by the conservative rule instead, says so once, and every record
of the run keeps the entries held to it (`Record.uncalibrated`); the Ray back-end grades on the workers'
hardware, which the head cannot calibrate.
"""

from __future__ import annotations

import logging
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perflab.verify import expectations
from perflab.verify.calibrate import CALIBRATION_PAIRS

log = logging.getLogger(__name__)

# The course's own calibration: <course>/calibration/<hardware_class>.json.
COURSE_FOLDER = "calibration"
# The protocol's budget: a calibration run's pairs (`calibrate.CALIBRATION_PAIRS`), and the runs a
# calibration needs to count beside another calibration's (`expectations.summarise`). Fewer pairs left
# the bar undecided: on the 2-core AVX-512-BF16 host one run of 8 (decide.MIN_PAIRS, the verifier's
# fewest) timed lab 2's workers at 1.41x with a CI of 1.09-1.53, a parity bar the lazy student passed.
PAIRS = CALIBRATION_PAIRS
REPEATS = expectations.MIN_RUNS_PER_CALIBRATION
# The seconds one run is guessed to take where no committed calibration of this kind of device timed the
# entry (a 2-core CPU's slowest, lab 2's loader workers at 16 pairs, took about 40 s).
GUESSED_RUN_SECONDS = 30.0


def folder(course: Path) -> Path:
    """Where a course keeps the bars it calibrated itself."""
    return Path(course) / COURSE_FOLDER


@dataclass(frozen=True)
class Outcome:
    """What the step before grading did: the entries it calibrated, what that cost, the folders the run's
    judges read after the committed one, and the entries of each lab still held to a conservative rule."""

    calibrated: tuple[str, ...] = ()
    seconds: float = 0.0
    estimate_seconds: float = 0.0
    path: Path | None = None
    folders: tuple[Path, ...] = ()
    held: dict[str, tuple[str, ...]] = field(default_factory=dict)  # lab -> entries without a calibrated bar
    skipped: str = ""  # why nothing was calibrated where something was missing (--no-calibration, Ray)

    def line(self) -> str:
        """The closing note's part: what calibrating first cost ("" where nothing was calibrated)."""
        if self.calibrated:
            return (f"calibrated {len(self.calibrated)} bar(s) here first ({', '.join(self.calibrated)}) in "
                    f"{self.seconds:.0f} s, kept in {self.path}")
        return ""


def needed(labs: Iterable[str], mode: str, course: Path) -> dict[str, list[str]]:
    """{lab: [entries to calibrate]} for the labs with an entry no folder holds at the workload it grades:
    its own re-measured cells' entries, and the entries its reference pair is built from (lab 6's final
    keeps only the gains calibrated before it). An entry whose runs all failed last time (a busy machine,
    a file changed during the run) is tried again: until it is measured, its cell is held to the
    conservative rule, and said so."""
    from perflab.grading import bars

    out: dict[str, list[str]] = {}
    with expectations.reading([folder(course)]):
        for lab in sorted(set(labs)):
            for name, workload in bars.graded_bars(lab, mode):
                if _has(name, workload):
                    continue
                deps = [dep for dep, at in _built_from(name, mode) if not _has(dep, at)]
                entries = out.setdefault(lab, [])
                entries += [n for n in dict.fromkeys([*deps, name]) if n not in entries]
    return out


def _hardware_class() -> str:
    from perflab import env

    return env.machine_info().hardware_class


def _has(name: str, workload: Any) -> bool:
    return expectations.load_expectation(name, workload=workload).calibrated


def _built_from(name: str, mode: str) -> list[tuple[str, Any]]:
    """(entry, its workload) of each bar the reference pair of `name` reads at that pair's own workload,
    where the lab whose bar it is builds its pair from the bars calibrated before it (its manifest's
    `pair_from_bars`: lab 6's final configuration takes every change its plan finds calibrated as a gain,
    lab 3's answer, channels_last, compile); only entries calibrated at that lab's own sizes can count there."""
    from perflab import env
    from perflab.labs import registry
    from perflab.verify import calibrate

    owner = next((m for m in registry.with_any("pair_from_bars")
                  if getattr(registry.contract(m), "EXPECTATION", None) == name), None)
    if owner is None:
        return []
    info = env.machine_info()
    base = registry.contract(owner).baseline_config(mode)
    read: list[str] = []

    def record(entry: str) -> Any:
        read.append(entry)
        return expectations.load_expectation(entry, info, workload=base)

    calibrate.grader_side(owner.key).plan_changes(info, mode, expectations=record)  # the grader's answer key
    return [(entry, base) for entry in dict.fromkeys(read) if _same_sizes(calibrated_at(entry, mode), base)]


def calibrated_at(name: str, mode: str) -> Any:
    """The baseline `perflab calibrate` times entry `name` against (its sizes are where its bar holds)."""
    from perflab.verify import calibrate

    if name in calibrate.REFERENCE_CHANGES:
        return calibrate.baseline_config(mode, None, calibrate.graded_in(name))
    module = {m.EXPECTATION: m for m in calibrate._lab_modules()}[name]
    return module.baseline_config(mode)


def _same_sizes(a: Any, b: Any) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in expectations.WORKLOAD_FIELDS)


def estimate(names: Iterable[str], repeats: int = REPEATS, pairs: int = PAIRS) -> tuple[float, str]:
    """(seconds, where the figure comes from): the runs of the committed calibrations of this kind of
    device (their wall time per run, the warm-up kept and the timed part scaled to `pairs`), else a guess
    of GUESSED_RUN_SECONDS a run."""
    from perflab import env

    kind = env.pick_device().type
    per_name: dict[str, list[float]] = {}
    sources = set()
    files = {*expectations.default_dir().glob("*.json"), *expectations.COMMITTED_DIR.glob("*.json")}
    for path in sorted(files):
        try:
            doc = expectations.load_file(path)
        except ValueError:
            continue
        if (doc.get("machine") or {}).get("device") != kind:
            continue
        for name, entry in doc.get("optimisations", {}).items():
            for run in entry.get("runs", []):
                if "seconds" in run and run.get("pairs"):
                    warm = float(sum((run.get("warmup_seconds") or {}).values()))
                    timed = max(0.0, float(run["seconds"]) - warm)
                    per_name.setdefault(name, []).append(warm + timed * pairs / float(run["pairs"]))
                    sources.add(path.stem)
    total, guessed = 0.0, []
    for name in names:
        if name in per_name:
            total += repeats * statistics.median(per_name[name])
        else:
            total += repeats * GUESSED_RUN_SECONDS
            guessed.append(name)
    where = (f"from the committed calibration(s) of {', '.join(sorted(sources))}" if sources else "a guess")
    if guessed and sources:
        where += f"; {', '.join(guessed)} guessed at {GUESSED_RUN_SECONDS:.0f} s a run"
    return total, where


def before_grading(course: Path, labs: Iterable[str], settings: Any, backend: str = "local",
                   say: Callable[[str], None] | None = None, *, repeats: int | None = None,
                   pairs: int | None = None) -> Outcome:
    """Calibrate what the graded labs read and no folder holds (see the module docstring); the outcome.

    Nothing is calibrated in tiny mode (the kit's own tests: never calibrated), on the Ray back-end (the
    workers' hardware, not this machine's), or with `settings.self_calibrate` off (--no-calibration), which
    is said once. `repeats` and `pairs` default to REPEATS and PAIRS."""
    from perflab.grading import bars, judging

    say = say or (lambda text: log.warning("%s", text))
    labs = sorted(set(labs))
    mode = judging.grading_mode(settings.env)
    if mode == "tiny":
        return Outcome()
    if backend != "local":
        return Outcome(skipped="the Ray back-end grades on the workers' hardware: the head cannot calibrate it")
    folders = (folder(course),)
    missing = needed(labs, mode, course)
    names = list(dict.fromkeys(n for lab in labs for n in missing.get(lab, [])))
    skipped, done, path, seconds, guess = "", (), None, 0.0, 0.0
    if names and not settings.self_calibrate:
        skipped = "--no-calibration"
        say(f"--no-calibration: {len(names)} bar(s) the graded labs read have no calibration on this machine "
            f"({', '.join(names)}); their cells are held to the conservative rule (no gain required), and every "
            "grade of those labs records it")
    elif names:
        repeats, pairs = repeats or REPEATS, pairs or PAIRS
        guess, where = estimate(names, repeats, pairs)
        hw = _hardware_class()
        path = expectations.expectations_path(hw, folder(course))
        say(f"this machine (class {hw}) has no calibrated bar for " + "; ".join(
            f"{lab} ({', '.join(missing[lab])})" for lab in labs if lab in missing)
            + f": without one a student who changes nothing would pass those cells. Calibrating them first: "
              f"{len(names)} reference pair(s) x {repeats} run(s) of {pairs} pairs, about {_minutes(guess)} "
              f"({where}), into {path}")
        started = time.monotonic()
        path = _calibrate(names, mode, repeats, pairs, course)
        seconds = time.monotonic() - started
        done = tuple(names)
        say(f"calibration took {seconds:.0f} s (estimated {guess:.0f} s): " + "; ".join(_bar_text(path, n) for n in names))
    with expectations.reading(folders):
        held = {lab: tuple(name for name, _ in entries)
                for lab, entries in bars.held_to_rules(labs, mode).items()}
    return Outcome(done, seconds, guess, path, folders, held, skipped)


def _calibrate(names: list[str], mode: str, repeats: int, pairs: int, course: Path) -> Path:
    """`perflab calibrate` of `names` into the course's folder, with a progress bar of its runs."""
    from tqdm.auto import tqdm

    from perflab.verify import calibrate

    with tqdm(total=len(names) * repeats, desc="calibrating", unit="run", leave=False) as bar, \
            expectations.reading([folder(course)]):

        def on_run(name: str, i: int, verdict: Any) -> None:
            bar.set_postfix_str(f"{name} run {i + 1}: {verdict.speedup or 0:.2f}x", refresh=False)
            bar.update(1)

        return calibrate.calibrate(names, repeats=repeats, pairs=pairs, mode=mode, out_dir=folder(course),
                                   on_run=on_run, host=platform.node() or None)


def _bar_text(path: Path, name: str) -> str:
    entry = expectations.load_file(path).get("optimisations", {}).get(name, {})
    if "threshold" not in entry:
        return f"{name} unmeasured ({entry.get('rule', 'no entry written')})"
    if entry.get("rule") == expectations.NO_CHANGE_RULE:
        return f"{name}: no change is the right answer here (parity bar {entry['threshold']:.2f})"
    return f"{name} {entry['kind']} bar {entry['threshold']:.2f} (reference {entry['reference']:.2f}x)"


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
