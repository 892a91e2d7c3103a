"""Per-hardware expectations: the bar a candidate's speedup must clear, from calibration on that hardware.

`autograder/expectations/<hardware_class>.json` is written by `perflab calibrate` (never by hand):

    {"schema": "perflab.expectations", "version": 1, "hardware_class": "cpu", "mode": "grade",
     "verify_threads": 1,  # the child's torch threads it was timed with (protocol.VERIFY_THREADS)
     "machine": {...MachineInfo...}, "created": "...",
     "optimisations": {NAME: {"baseline": {...TrainConfig...}, "candidate": {...}, "runs": [
         {"speedup": float, "ci": [lo, hi], "outcome": str, "pairs": int, "seconds": float}, ...],
         "reference": float, "reference_low": float, "kind": "gain|parity|cost", "threshold": float,
         "rule": str}}}
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = "perflab.expectations"
VERSION = 1
EXPECTATIONS_ENV = "PERFLAB_EXPECTATIONS"

# Fraction of the reference's lower CI bound a candidate must reach: the reference solution is timed
# on the grading machine itself, so a correct student solution should come close; 0.8 leaves room for
# a different but sound implementation and for run-to-run drift.
THRESHOLD_FRACTION = 0.8
# A reference speedup whose lower bound clears this is a gain to grade on this hardware: far enough
# above GAIN_BAR_FLOOR that the reference itself clears the bar (or, at worst, stays undecided).
GAIN_MIN = 1.15
# A gain's bar is never below this, so that changing nothing cannot pass: an unchanged configuration's
# CI sits around 1.0, and under the protocol's 20th-percentile estimator it cleared a 1.1x bar in none
# of the trials of `bench/bench_verify.py` (one core busy half the time), while it fails the bar as
# soon as its upper bound drops below it.
GAIN_BAR_FLOOR = 1.1
# A reference whose upper bound stays below this is a real cost (e.g. checkpointing recomputes).
COST_MAX = 0.95
# Where the hardware gives no real gain, the bar is "no regression": parity, less the noise a
# correct implementation may show.
PARITY_BAR = 0.9
# Without calibration, a cost optimisation must not be slower than this (recomputing the forward of
# checkpointed stages costs at most ~1/3 more work; half speed means something else is wrong).
COST_FLOOR = 0.5

# Optimisations known to cost time on purpose: without calibration they get COST_FLOOR.
KNOWN_COSTS = ("checkpoint",)
# The rule of an entry whose reference answer is the baseline itself on this hardware (lab 3's on a CPU
# without bf16 units, lab 6's final where nothing before it gains): a bar, not a missing one.
NO_CHANGE_RULE = ("no change is the right answer here: the reference plan is the baseline on this hardware, "
                  f"so nothing is timed and no gain is required; no regression below {PARITY_BAR}x")


def no_change_entry() -> dict[str, Any]:
    """The summary of an entry whose reference candidate is its baseline: a parity bar, with its reason."""
    return {"reference": 1.0, "reference_low": 1.0, "reference_high": 1.0, "kind": "parity",
            "threshold": PARITY_BAR, "rule": NO_CHANGE_RULE, "calibrations": 1}


@dataclass(frozen=True)
class Expectation:
    """The bar for one named optimisation on one hardware class, and where it came from."""

    name: str
    threshold: float
    kind: str  # gain | parity | cost
    hardware_class: str
    calibrated: bool
    reason: str
    source: Path | None = None  # the file the bar was read from (None: a conservative rule)


# The committed expectations: autograder/expectations in the source tree perflab is installed from.
COMMITTED_DIR = Path(__file__).resolve().parents[2] / "autograder" / "expectations"


def default_dir() -> Path:
    """$PERFLAB_EXPECTATIONS, else the committed folder (COMMITTED_DIR)."""
    env = os.environ.get(EXPECTATIONS_ENV)
    if env:
        return Path(env)
    return COMMITTED_DIR


# The folders `load_expectation` reads when it is given none, in order, as a block of code set them
# (`reading`); None: the committed folder alone. A context variable, not a module global: each grading
# thread (`perflab.grading.submission.grade_one`) sets the folders of its own run, from its settings.
_FOLDERS: ContextVar[tuple[Path, ...] | None] = ContextVar("perflab_expectation_folders", default=None)


def search_path() -> tuple[Path, ...]:
    """The folders `load_expectation` reads, in order (the first with a calibrated bar gives it): the
    committed folder (`default_dir`), then any a run added with `reading`."""
    folders = _FOLDERS.get()
    return folders if folders is not None else (default_dir(),)


@contextlib.contextmanager
def reading(folders: Sequence[Path], *, first: bool = False) -> Iterator[tuple[Path, ...]]:
    """Inside the block (in this thread), `load_expectation` also reads `folders`: after the folders it read
    before, so that a committed bar wins where it exists (a course's own calibration, `perflab grade grade`),
    or with `first` before them (bars just calibrated into a folder of their own, `perflab calibrate --out`).
    Yields the search path in force."""
    now = search_path()
    added = tuple(Path(f) for f in folders)
    order = (*added, *now) if first else (*now, *added)
    path = tuple(dict.fromkeys(order))
    token = _FOLDERS.set(path)
    try:
        yield path
    finally:
        _FOLDERS.reset(token)


# The field of a reference run naming the calibration it came from (its start, UTC): `summarise` pools
# runs per calibration.
CALIBRATION_KEY = "calibration"
MIN_RUNS_PER_CALIBRATION = 2


def threshold_rule(reference_low: float, reference_high: float) -> tuple[str, float, str]:
    """(kind, threshold, rule in words) from the reference speedup's pooled CI.

    The bar never asks more than the reference itself reliably shows here: on a noisy machine
    (a wide CI) it drops below the parity bar rather than fail correct solutions.
    """
    if reference_low >= GAIN_MIN:
        bar = max(GAIN_BAR_FLOOR, THRESHOLD_FRACTION * reference_low)
        return "gain", bar, (f"gain: {THRESHOLD_FRACTION} x the reference's lower bound "
                             f"{reference_low:.3f}, never below {GAIN_BAR_FLOOR} (changing nothing must not pass)")
    if reference_high < COST_MAX:
        bar = THRESHOLD_FRACTION * reference_low
        return "cost", bar, (f"cost: the reference is slower here (upper bound {reference_high:.3f}); "
                             f"{THRESHOLD_FRACTION} x its lower bound {reference_low:.3f}")
    noisy_machine = reference_low < PARITY_BAR
    bar = THRESHOLD_FRACTION * reference_low if noisy_machine else PARITY_BAR
    noisy = (f" (lowered to {THRESHOLD_FRACTION} x the reference's own lower bound: it is below the parity bar "
             "here)") if noisy_machine else ""
    return "parity", bar, (f"parity: no clear gain or cost on this hardware (reference CI "
                           f"{reference_low:.3f}-{reference_high:.3f}); no regression below {bar:.3f}{noisy}")


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool repeated reference runs: the medians of their speedups and CI bounds, the rule and the bar.

    Medians, not extremes: one run hit by interference must not move the bar. Runs of several
    calibrations (`CALIBRATION_KEY`: one `perflab calibrate --add` on each host that grades the class)
    are pooled per calibration, and the bar is the lowest: one that every calibrated host's reference
    clears (two hosts of one class can differ: bf16 gained 1.62x over fp32 at lab 3's sizes on one
    2-core `cpu-bf16` host and 1.26x on another).
    """
    groups: dict[Any, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(run.get(CALIBRATION_KEY), []).append(run)
    # A calibration left with one measured run (the others failed) is one draw of the noise: it sets the
    # bar only where no calibration has more.
    counted = [g for g in groups.values() if len(g) >= MIN_RUNS_PER_CALIBRATION] or list(groups.values())
    pooled = min((_pooled(group) for group in counted), key=lambda p: p["reference_low"])
    if len(groups) > 1:
        pooled["rule"] += f" (the lowest of {len(groups)} calibrations)"
    pooled["calibrations"] = len(groups)
    return pooled


def _pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    speedups = [r["speedup"] for r in runs]
    low = statistics.median(r["ci"][0] for r in runs)
    high = statistics.median(r["ci"][1] for r in runs)
    kind, bar, rule = threshold_rule(low, high)
    return {"reference": statistics.median(speedups), "reference_low": low, "reference_high": high,
            "kind": kind, "threshold": round(bar, 4), "rule": rule}


def expectations_path(hardware_class: str, directory: Path | None = None) -> Path:
    return (directory or default_dir()) / f"{hardware_class}.json"


def load_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); re-run perflab calibrate") from exc
    if data.get("schema") != SCHEMA or data.get("version") != VERSION:
        raise ValueError(f"{path}: not a {SCHEMA} v{VERSION} file; re-run perflab calibrate")
    return data


# The fields of a workload that decide what a calibration measured: a bar holds only for this model at these
# sizes on this data set. An entry written before the model was a field timed ResNet-18 (`_measured_fields`).
WORKLOAD_FIELDS = ("model", "data", "image_size", "batch_size")


def _workload_text(config: dict[str, Any]) -> str:
    return (f"{config.get('model')} at {config.get('image_size')} px, batch {config.get('batch_size')}, "
            f"{config.get('data')} data")


def _measured_fields(config: Any) -> dict[str, Any]:
    """WORKLOAD_FIELDS of a configuration (a `TrainConfig` or an entry's dict), the model ResNet-18 where it
    names none."""
    from perflab.env import DEFAULT_MODEL

    get = config.get if isinstance(config, dict) else lambda f: getattr(config, f, None)
    return {f: get(f) or (DEFAULT_MODEL if f == "model" else None) for f in WORKLOAD_FIELDS}


def _other_workload(entry: dict[str, Any], workload: Any) -> str | None:
    """Why `entry`'s calibration does not hold for `workload` (None: it does, or nothing to compare)."""
    if workload is None or not isinstance(entry.get("baseline"), dict):
        return None
    measured, here = _measured_fields(entry["baseline"]), _measured_fields(workload)
    if measured == here:
        return None
    return f"calibrated on {_workload_text(measured)}, this run is {_workload_text(here)}"


def other_threads(doc: dict[str, Any]) -> str | None:
    """Why a calibration timed at another thread count than the verifier's does not hold (None: it does)."""
    from perflab.verify.protocol import VERIFY_THREADS

    threads = doc.get("verify_threads")
    if threads == VERIFY_THREADS:
        return None
    counted = "torch's default thread count (the file predates verify_threads)" if threads is None else f"{threads} torch thread(s)"
    return f"calibrated with {counted}, the verifier times with {VERIFY_THREADS}; re-run perflab calibrate"


def load_expectation(name: str, machine: Any = None, *, directory: Path | None = None,
                     workload: Any = None) -> Expectation:
    """The bar for optimisation `name` on `machine` (default: this one); conservative rules where uncalibrated.

    `directory` is the one folder to read; without it, the folders of `search_path()` are read in order
    (the committed expectations first, then a grading run's own calibration) and the first calibrated
    bar wins. `workload` (the baseline `TrainConfig` the candidate is held against) must match the sizes
    the calibration measured: a gain found at one image size and batch says nothing about another. The
    file must have been timed at the verifier's thread count (`verify_threads`), too.
    """
    if machine is None:
        from perflab import env

        machine = env.machine_info()
    hw = machine if isinstance(machine, str) else machine.hardware_class
    folders = (directory,) if directory is not None else search_path()
    reasons = []
    for i, folder in enumerate(folders):
        found = _bar_in(expectations_path(hw, folder), name, hw, workload, named=i > 0)
        if isinstance(found, Expectation):
            return found
        reasons.append(found)
    missing = "; ".join(dict.fromkeys(reasons))
    if any(name.startswith(cost) for cost in KNOWN_COSTS):
        return Expectation(name, COST_FLOOR, "cost", hw, False,
                           f"{missing}; conservative rule: a cost optimisation may be slower, not below {COST_FLOOR}x")
    return Expectation(name, PARITY_BAR, "parity", hw, False,
                       f"{missing}; conservative rule: no gain required, no regression below {PARITY_BAR}x")


def _bar_in(path: Path, name: str, hw: str, workload: Any, *, named: bool = False) -> Expectation | str:
    """The calibrated bar for `name` in the file `path`, or why it has none there (`named`: say the
    folder too, for a folder other than the first read)."""
    where = str(path) if named else path.name
    if not path.is_file():
        return (f"{where} not found" if named
                else f"no calibration for hardware class {hw!r} ({path.name} not found)")
    doc = load_file(path)
    entry = doc.get("optimisations", {}).get(name)
    other = _other_workload(entry, workload) if entry is not None else None
    other = other or other_threads(doc)
    if entry is not None and "threshold" in entry and other is None:
        by = "" if not named else f" (this course's calibration, {path})"
        return Expectation(name, float(entry["threshold"]), entry["kind"], hw, True,
                           f"calibrated on {hw}{by}: reference {entry['reference']:.2f}x; {entry['rule']}", path)
    if entry is None:
        return f"{where} has no entry for {name!r}"
    if other is not None:
        return f"{where}: {name!r} {other}"
    return f"{where}: {name!r} unmeasured ({entry.get('rule') or 'the reference runs all failed'})"
