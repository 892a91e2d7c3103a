"""Calibrate expectations: time perflab's reference optimisations on this machine, write the bars.

Each named optimisation is a (baseline, candidate) pair of `TrainConfig`s at the mode's sizes, run
through the same verification protocol the grader uses, `repeats` times. The pooled reference
speedups set the bar (`expectations.threshold_rule`); nothing here is typed by hand.

A lab's own pair is its reference answer, which lives on the grader's side (`grader_side`: the
student's kit holds each lab's contract only), so calibration is the instructor's: in a student's kit
it stops with NoGraderSide, one line (NO_GRADER_SIDE).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.util
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from perflab.verify import expectations, guard
from perflab.verify.decide import Budget

log = logging.getLogger(__name__)

# Calibration measures a fixed number of pairs (no early stop), enough for a CI a few % wide on a
# quiet machine, few enough that a repeat of a grade-size pair takes well under a minute.
CALIBRATION_PAIRS = 16
DEFAULT_REPEATS = 3

# What each reference optimisation changes in the baseline configuration.
REFERENCE_CHANGES: dict[str, dict[str, Any]] = {
    "amp_bf16": {"amp_dtype": "bf16"},
    "amp_fp16": {"amp_dtype": "fp16"},
    "channels_last": {"channels_last": True},
    "num_workers": {"num_workers": 2},
    # Every stage (`workload.REFERENCE_CHECKPOINT_STAGES`): the count lab 4 grades and lab 6 forces.
    "checkpoint": {"checkpoint_stages": 4},
    "compile": {"compile_mode": "default"},
}


# What `perflab calibrate` says where the grader's side is not there (a student's kit).
NO_GRADER_SIDE = ("calibration is the instructor's: the grader's side of the labs (each lab's judges/, "
                  "with each lab's reference answer) is not in this kit")


class NoGraderSide(LookupError):
    """The labs' reference pairs live on the grader's side, which this copy of perflab does not hold."""


def grader_side(lab: str) -> Any:
    """The grader's half of lab `lab` ("lab06"), where its answer key lives (`reference_best`,
    `reference_final`, `calibration_pair`: the student's kit holds the contract only); None for a lab
    without one. NoGraderSide where this copy has no grader's side at all (a student's kit). A course's own
    lab in force (`registry.course_labs`) has its `judges.py`."""
    from perflab.labs import registry

    own = registry.grader_side(lab)
    if own is not None:
        return own
    try:
        from perflab.grading import judging
    except ImportError as exc:  # the student bundle leaves the judges out with the answer key
        if exc.name not in ("perflab.grading", "perflab.grading.judging"):
            raise
        raise NoGraderSide(NO_GRADER_SIDE) from exc
    module = judging.hidden_module(lab)
    if module is None and importlib.util.find_spec(judging.HIDDEN_PACKAGE) is None:
        raise NoGraderSide(NO_GRADER_SIDE)
    return module


def _lab_sides() -> list[tuple[Any, Any]]:
    """(contract, grader's side) of each lab that holds a graded run to a pair of its own: EXPECTATION in
    the contract (`perflab.labs.labNN`, a course lab's `probes.py`), `calibration_pair(mode)` on the
    grader's side (lab 4's checkpointing of every stage, lab 3's and lab 6's reference answers)."""
    from perflab.labs import registry

    found = []
    for lab in registry.labs():
        module = registry.contract(lab)
        side = grader_side(lab.lab)
        if hasattr(side, "calibration_pair") and hasattr(module, "EXPECTATION"):
            found.append((module, side))
    return found


def _lab_modules() -> list[Any]:
    """The lab contracts (`perflab.labs.labNN`) whose graded run is held to a pair of their own
    (`_lab_sides`): their EXPECTATION and baseline_config."""
    return [module for module, _ in _lab_sides()]


def graded_in(name: str) -> str | None:
    """The lab that grades reference optimisation `name` (its manifest's `graded_changes`): it is calibrated
    at that lab's grade workload, the sizes its bar is then used at; None for none."""
    from perflab.labs import registry

    return next((m.lab for m in registry.labs() if name in m.graded_changes), None)


def lab_names() -> list[str]:
    """The lab expectations `perflab calibrate` measures besides REFERENCE_CHANGES."""
    return [module.EXPECTATION for module in _lab_modules()]


def lab_pairs(mode: str = "grade") -> dict[str, tuple[Any, Any]]:
    """{expectation: (baseline, candidate)} of each lab's own pair at `mode`'s sizes."""
    return {module.EXPECTATION: side.calibration_pair(mode) for module, side in _lab_sides()}


def baseline_config(mode: str = "grade", device: str | None = None, lab: str | None = None) -> Any:
    """The lab baseline at `mode`'s sizes (`lab`'s own in grade and laptop mode): the plain fp32 loop, with
    no loader workers, or on a GPU the set kept on the device where `lab` starts fed (`env.baseline_loader`)."""
    from perflab import env
    from perflab.workload import TrainConfig

    sizes = env.mode_sizes(mode, lab=lab, device=device)
    return TrainConfig(data=sizes.data, image_size=sizes.image_size, batch_size=sizes.batch_size, device=device,
                       **env.baseline_loader(lab, device, mode))


def available(names: Sequence[str] | None, device: str | None = None) -> list[str]:
    """The optimisations to calibrate: `names` (checked), else every one this device can run."""
    from perflab import env
    from perflab.workload import AMP_DTYPES

    labs = lab_names()
    chosen = list(names) if names else [*REFERENCE_CHANGES, *labs]
    unknown = [n for n in chosen if n not in REFERENCE_CHANGES and n not in labs]
    if unknown:
        raise ValueError(f"--config: unknown optimisation(s) {', '.join(unknown)}; "
                         f"choose from {', '.join([*REFERENCE_CHANGES, *labs])}")
    kind = env.pick_device(device).type
    usable = []
    for name in chosen:
        amp = REFERENCE_CHANGES.get(name, {}).get("amp_dtype")
        if amp is not None and not env.supports_autocast(kind, AMP_DTYPES[amp]):
            if names:
                raise ValueError(f"--config {name}: {amp} autocast is not supported on {kind} here")
            continue
        usable.append(name)
    return usable


def calibrate(names: Sequence[str] | None = None, *, repeats: int = DEFAULT_REPEATS, mode: str = "grade",
              device: str | None = None, pairs: int = CALIBRATION_PAIRS,
              out_dir: Path | None = None, on_run: Callable[[str, int, Any], None] | None = None,
              add: bool = False, host: str | None = None) -> Path:
    """Run every reference pair `repeats` times and write `<out_dir>/<hardware_class>.json`; its path.

    With `add`, the file's earlier runs of the same pairs are kept beside this calibration's, and each
    bar is the lowest of the calibrations (`expectations.summarise`): for a class graded on several
    hosts, calibrate on each. Without, this calibration replaces the entries it measures. `host` (the
    machine's name) is recorded in the file where given: a course's own calibration says where it ran."""
    from perflab import env

    if repeats < 1:
        raise ValueError(f"--repeats: must be at least 1, got {repeats}")
    if pairs < 4:
        raise ValueError(f"--pairs: must be at least 4, got {pairs}")
    machine = env.machine_info(device)
    budget = Budget(min_pairs=pairs, max_pairs=pairs, max_timed_seconds=300.0)
    chosen = available(names, device)
    path = expectations.expectations_path(machine.hardware_class, out_dir)
    entries = _kept_entries(path, machine.hardware_class, mode)
    stamp = _dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds")
    kept = dict(entries) if add else {}
    for name in chosen:
        if name in REFERENCE_CHANGES:
            base = baseline_config(mode, device, graded_in(name))
            entries[name] = _measure(name, base, base.replace(**REFERENCE_CHANGES[name]), repeats, budget, on_run,
                                     stamp=stamp, earlier=kept.get(name))
    sides = {module.EXPECTATION: side for module, side in _lab_sides()}
    for name in [name for name in sides if name in chosen]:  # lab order: lab 6 after the labs it sums
        # A lab's pair may depend on the bars measured before it (lab 6 adds only calibrated gains, lab 3's
        # answer among them): write them first, and let the lab read them from where they were written.
        _write(path, machine, mode, repeats, pairs, entries, host)
        with _reading_expectations_from(path.parent):
            pair = sides[name].calibration_pair(mode)
        entries[name] = _measure(name, *pair, repeats, budget, on_run, stamp=stamp, earlier=kept.get(name))
    _write(path, machine, mode, repeats, pairs, entries, host)
    return path


def _kept_entries(path: Path, hardware_class: str, mode: str) -> dict[str, Any]:
    """The entries of an existing file for the same hardware class and mode, re-summarised from their
    raw runs under today's rules: calibrating some optimisations never drops the others'."""
    if not path.is_file():
        return {}
    try:
        old = expectations.load_file(path)
    except ValueError as exc:
        log.warning("%s; starting a new file", exc)
        return {}
    if old.get("hardware_class") != hardware_class or old.get("mode") != mode:
        return {}
    other = expectations.other_threads(old)
    if other is not None:
        log.warning("%s: %s; starting a new file", path, other)
        return {}
    kept = {}
    for name, entry in old.get("optimisations", {}).items():
        measured = [r for r in entry.get("runs", []) if "speedup" in r]
        kept[name] = {**entry, **expectations.summarise(measured)} if measured else entry
    return kept


@contextlib.contextmanager
def _reading_expectations_from(folder: Path) -> Iterator[None]:
    """`load_expectation` reads `folder` first inside the block (in this thread), then the folders it read
    before: the bars just written win."""
    with expectations.reading([folder], first=True):
        yield


def _measure(name: str, base: Any, cand: Any, repeats: int, budget: Budget,
             on_run: Callable[[str, int, Any], None] | None, *, stamp: str = "",
             earlier: dict[str, Any] | None = None) -> dict[str, Any]:
    """`repeats` verifications of `cand` against `base`, summarised into an expectations entry: each run
    tagged with this calibration's `stamp`, after the runs of `earlier` (an entry of an earlier
    calibration, kept when it timed the same pair: `calibrate(add=True)`)."""
    from perflab.verify.protocol import measured_again_when_disturbed, verify

    if base.effective() == cand.effective():  # e.g. lab 3's answer on a CPU without bf16: FP32 as it was
        return {"baseline": base.to_dict(), "candidate": cand.to_dict(), "runs": [], **expectations.no_change_entry()}
    runs = []
    for i in range(repeats):
        # The bar 1.0 only decides when the run may stop; with min_pairs == max_pairs it never stops early.
        # Only perflab's own code runs here, so the hashes are taken fresh for each run.
        # A run another process disturbed is measured again once the machine is quiet: a bar calibrated
        # beside other work is the load's (two loader workers timed 0.82x there, 1.4x on an idle host).
        with measured_again_when_disturbed():
            verdict = verify(base, cand, expectation=1.0, budget=budget, seed=i, hashes=guard.file_hashes())
        if on_run is not None:
            on_run(name, i, verdict)
        if verdict.speedup is None or verdict.code not in ("clears_bar", "below_bar", "undecided"):
            log.warning("calibrate %s run %d: %s", name, i, verdict.reason)
            runs.append({"outcome": verdict.outcome, "code": verdict.code, "reason": verdict.reason})
            continue
        lo, hi = verdict.ci or (float("nan"), float("nan"))
        runs.append({expectations.CALIBRATION_KEY: stamp, "speedup": verdict.speedup, "ci": [lo, hi],
                     "outcome": verdict.outcome,
                     "pairs": verdict.pairs, "block_steps": verdict.block_steps,
                     "seconds": verdict.elapsed_seconds,
                     "warmup_seconds": verdict.details.get("warmup_seconds", {}),
                     **({"foreign_cores": verdict.details["foreign_cores"]} if "foreign_cores" in verdict.details
                        else {})})
    if earlier and same_pair(earlier, base, cand):
        runs = [*earlier.get("runs", []), *runs]
    elif earlier:
        log.warning("calibrate %s: the file's earlier runs timed other configurations; this calibration "
                    "replaces them", name)
    measured = [r for r in runs if "speedup" in r]
    entry: dict[str, Any] = {"baseline": base.to_dict(), "candidate": cand.to_dict(), "runs": runs}
    if measured:
        entry.update(expectations.summarise(measured))
    else:
        entry.update(kind="unmeasured", rule="every reference run failed; conservative rules apply")
    return entry


def same_pair(entry: dict[str, Any], base: Any, cand: Any) -> bool:
    """Whether an expectations entry timed the configurations `base` and `cand` (read as `TrainConfig`s,
    so a file written before the model was a field still matches)."""
    from perflab.workload import TrainConfig

    def what(config: Any) -> Any:  # the device is the hardware class's: `--device cpu` or none times the same
        return config.replace(device=None)

    try:
        return (what(TrainConfig.from_dict(entry["baseline"])) == what(base)
                and what(TrainConfig.from_dict(entry["candidate"])) == what(cand))
    except (KeyError, TypeError, ValueError):
        return False


def _write(path: Path, machine: Any, mode: str, repeats: int, pairs: int, entries: dict[str, Any],
           host: str | None = None) -> None:
    from perflab.verify.protocol import VERIFY_THREADS

    doc = {"schema": expectations.SCHEMA, "version": expectations.VERSION,
           "hardware_class": machine.hardware_class, "mode": mode, "repeats": repeats, "pairs": pairs,
           "verify_threads": VERIFY_THREADS,
           "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
           "machine": machine.to_dict(),
           "optimisations": {k: v for k, v in entries.items() if "threshold" in v or v["kind"] == "unmeasured"}}
    if host:
        doc["host"] = host
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
