"""What a notebook measured at home, carried to the grader in the notebook's own outputs.

A decision (lab 2's BEST, lab 3's AMP_CONFIG, lab 5's CHOICE, lab 6's FINAL) rests on the student's own
measurements, and the grade on the grader's re-measurement of what was decided. Grading therefore never
repeats the homework:

* At home (any kernel the autograder does not run), a kit measurement that a decision reads, lab 6's
  screening, ablation (`measure_ablation` or `measure_chain`) and
  accuracy run, lab 3's comparison of precisions, lab 5's compile of each mode and lab 2's loader sweeps
  (`lab02_measure.measured`), runs in full and shows its
  raw samples as an output of its cell (`HOMEWORK_MIME`, beside one line of text). Saving the notebook
  keeps them: the notebook the student hands in carries them, with no file beside it to lose.
* The grader reads them from the submitted notebook (`from_notebook`) before it clears the outputs and
  lays them beside the notebook it runs (`HOMEWORK_FILE`). In the grading kernel the same call returns
  what was measured at home (`measured`), and the submitted code decides from it, in a fraction of the
  time. Each measurement is matched by what it measures (which knobs change, which names it times, in
  the order of the calls) and, where the student wrote the measuring, by a digest of that code
  (`code_digest`), never by values, so a home run on a laptop replays on a GPU server.
* A measurement the notebook does not carry runs at the smallest budget that still executes its code
  (`QUICK_BLOCKS` blocks), and its cell says so: a decision made on it was not made on a measurement.
* A decision (lab 2's `BEST`, lab 3's `AMP_CONFIG`, lab 5's `CHOICE`, lab 6's `FINAL`) is never
  replayed: in the grading kernel it is whatever the submitted code computes, from the replayed
  measurements where those belong to the code that made them. A decision a notebook derives in its own
  code is recorded at home too (`decided`: what the grader's copy detection and lab 2's "was this worker
  count measured" read), and in the grading kernel the record is shown beside the decision, never used.
* `smallest` shortens only the notebook's timing that is replayed (or that no decision reads): a
  comparison a decision is made from in the grading kernel keeps the grade budget.
* A record made on the grader's kind of machine with the grader's workload (`stamp`) is held against the
  grader's own re-measurement of the decision (`contradicted`): one faster than the re-measurement's CI
  allows by more than `RECORD_CONTRADICTED` is flagged for a person and earns nothing.

What is replayed only steers the notebook: every graded speedup is the grader's own re-measurement.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from perflab.labs import registry

T = TypeVar("T")

HOMEWORK_MIME = "application/vnd.perflab.homework+json"
# The labs whose notebooks decide from a recorded measurement, as their manifests say (`decides_at_home`;
# tests/test_homework.py holds it to them).
LABS = tuple(lab.lab for lab in registry.with_any("decides_at_home"))
# Beside the notebook in the grading kernel's folder: what the submission's outputs carried.
HOMEWORK_FILE = "homework.json"
# Blocks of each side a measurement runs in the grading kernel when the notebook does not carry it:
# the fewest a comparison's CI takes, so the student's code runs as written.
QUICK_BLOCKS = 2
# Training steps of an accuracy run the notebook does not carry (the grader trains its own to grade).
QUICK_STEPS = 2
# A submission's record larger than this is not read (a screening's record is a few kilobytes).
MAX_RECORD_BYTES = 2_000_000
# What this kernel recorded (at home) or replayed and timed quickly (graded), in call order.
RECORDED: list[dict[str, Any]] = []
EVENTS: list[dict[str, Any]] = []

_BOOK: list[dict[str, Any]] | None = None


def _grading_kernel() -> bool:
    from perflab.labs import common

    return common.in_grading_kernel()


# Knobs that make one change together: a loader on a laptop without a GPU pins no memory, the same
# loader on the grader's GPU does, and it is still the loader the student measured.
CHANGE_GROUPS = {"num_workers": "loader", "pin_memory": "loader", "persistent_workers": "loader",
                 "prefetch_factor": "loader", "amp_dtype": "precision", "channels_last": "precision"}


def config_changes(before: Any, after: Any) -> list[str]:
    """The TrainConfig fields `after` sets differently from `before`."""
    return sorted(f.name for f in dataclasses.fields(before) if getattr(before, f.name) != getattr(after, f.name))


def change_groups(before: Any, after: Any) -> list[str]:
    """What a measurement of `before` against `after` compares, whatever the machine (`CHANGE_GROUPS`:
    4 loader workers at home and 1 with pinned memory on the grader are one change, "loader")."""
    return sorted({CHANGE_GROUPS.get(name, name) for name in config_changes(before, after)})


def measured(kind: str, key: Any, measure: Callable[[], T], *, quick: Callable[[], T],
             encode: Callable[[T], Any], decode: Callable[[Any], T], what: str, quick_budget: str | None = None) -> T:
    """`measure()` at home, recorded in the cell's output; in the grading kernel, what the notebook's
    home run recorded for (`kind`, `key`), else `quick()`. `what` names it for the student, in words;
    `quick_budget`, what `quick()` runs where that is not the smallest budget (a lab whose decision is
    replayed on its own, `decided`, keeps its budget where the notebook carries no decision)."""
    key = json.loads(json.dumps(key))  # the form it takes in the notebook and back
    if not _grading_kernel():
        result = measure()
        _record(kind, key, encode(result), what)
        return result
    found, result = _replay(kind, key, decode)
    if found:
        print(f"[{what}: replayed from your home run; the grade rests on the grader's own re-measurement]")
        return result
    EVENTS.append({"kind": kind, "key": key, "event": "quick"})
    ran = (f"ran here at {quick_budget}" if quick_budget else
           f"ran at the smallest budget ({QUICK_BLOCKS} blocks); a decision made on it rests on no measurement")
    edited = any(e["kind"] == kind and _same_but_code(e["key"], key) for e in _book())
    why = ("the code that measured it changed after the run your notebook saved" if edited else
           "this notebook carries no home measurement of it")
    print(f"[{what}: {why}, so it {ran}. Run the notebook, save it, then hand it in]")
    return quick()


def _same_but_code(recorded: Any, key: Any) -> bool:
    """Whether a record's key is `key` but for the digest of the code that made it (`code_digest`)."""
    if not (isinstance(recorded, dict) and isinstance(key, dict) and "code" in recorded and "code" in key):
        return False
    rest = {k: v for k, v in recorded.items() if k != "code"}
    return recorded["code"] != key["code"] and rest == {k: v for k, v in key.items() if k != "code"}


def decided(kind: str, value: T, *, device: str, encode: Callable[[T], Any], decode: Callable[[Any], T],
            what: str, show: Callable[[T], str] = repr) -> T:
    """`value`, the decision the running code made, everywhere: at home it is recorded in the cell's
    output (with the kind of `device` it was made on and a digest of the cell run just before it, the
    student's decision cell); in the grading kernel it is what this run of the submitted code decided,
    never the record (a decision cell left at the baseline, or a function edited after the saved run,
    decides as submitted), and the cell says where the saved run decided otherwise. `decode` reads a
    record back for that note; a record it rejects (ValueError) is not mentioned."""
    key = {"device": str(device), "code": _digest(previous_cell())}
    if not _grading_kernel():
        _record(kind, key, encode(value), what)
        return value
    EVENTS.append({"kind": kind, "key": key, "event": "decided"})
    saved = []
    for entry in _book():
        if entry["kind"] == kind and isinstance(entry.get("key"), dict) and entry["key"].get("device") == key["device"]:
            try:
                saved.append(decode(entry["value"]))
            except (TypeError, ValueError, KeyError, AttributeError):
                continue
    differs = [d for d in saved if show(d) != show(value)]
    note = (f"; your saved run decided {show(differs[-1])}, but the grade follows the code you handed in"
            if differs else "")
    print(f"[{what}: {show(value)}, as your code decides it in this run{note}; the grade rests on the "
          "grader's own re-measurement]")
    return value


def _record(kind: str, key: Any, value: Any, what: str) -> None:
    """At home: the entry, kept for this process and shown as an output of the running cell."""
    entry = {"kind": kind, "key": key, "value": value}
    RECORDED.append(entry)
    _show(entry, f"[{what}: recorded in this output for the grader; save the notebook to keep it]")


def _replay(kind: str, key: Any, decode: Callable[[Any], T]) -> tuple[bool, T | None]:
    """In the grading kernel: (True, the decoded value) of the home run's entry for (`kind`, `key`), each
    entry used once; (False, None) where there is none or it cannot be decoded. Each outcome is an EVENT."""
    entry = _take(kind, key)
    if entry is not None:
        try:
            value = decode(entry["value"])
        except (TypeError, ValueError, KeyError, AttributeError):
            EVENTS.append({"kind": kind, "key": key, "event": "unreadable"})
        else:
            EVENTS.append({"kind": kind, "key": key, "event": "replayed"})
            return True, value
    return False, None


def previous_cell() -> str | None:
    """The source of the cell this kernel ran before the running one (None outside a notebook kernel)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with the kit
        return None
    shell = get_ipython()
    history = shell.user_ns.get("In") if shell is not None else None
    return history[-2] if isinstance(history, list) and len(history) >= 2 else None


def _digest(source: str | None) -> str | None:
    if source is None:
        return None
    import hashlib

    lines = [line.rstrip() for line in source.strip().splitlines()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def code_digest(*fns: Any) -> str | None:
    """A digest of the source of `fns` (functions defined in a notebook cell too), None where one has
    none: a record keyed by it is replayed only for the code that made it."""
    import inspect

    try:
        return _digest("\n".join(inspect.getsource(fn) for fn in fns))
    except (OSError, TypeError):
        return None


def smallest(sizes: T, *, replayed: str | None, **budget: Any) -> T:
    """`sizes` (a lab's frozen dataclass of sizes) with the notebook's own timing budgets set to `budget`
    in the grading kernel, unchanged at home. `budget` may name only the budgets of measurements the
    grading kernel replays (recorded by `measured` as `replayed`) or that no decision reads: a comparison
    the submitted code decides from in the grading kernel keeps its budget. Where the notebook carries no
    record of `replayed` made on this kind of device (not saved after running, or run at home on a
    laptop's CPU and graded on a GPU), the budgets stay, so the notebook
    decides on a measurement. `replayed=None`: the timing steers no decision (lab 4's), so the budgets
    are always the smallest in the grading kernel."""
    if not _grading_kernel():
        return sizes
    if replayed is None:
        return dataclasses.replace(sizes, **budget)  # type: ignore[type-var]
    here = device_kind()
    if not any(e["kind"] == replayed and isinstance(e.get("key"), dict) and e["key"].get("device") == here
               for e in _book()):
        return sizes
    return dataclasses.replace(sizes, **budget)  # type: ignore[type-var]


def device_kind() -> str | None:
    """The kind of device this kernel runs on ("cpu", "cuda", "mps"), None where it has none."""
    from perflab import env

    try:
        return env.pick_device().type
    except Exception:  # noqa: BLE001 - a kernel without its device: the notebook's first cell says why
        return None


def _show(entry: Mapping[str, Any], note: str) -> None:
    """The entry as an output of the running cell (in a notebook kernel only)."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython ships with the kit
        return
    if get_ipython() is None:
        return
    display({HOMEWORK_MIME: dict(entry), "text/plain": note}, raw=True)


def _book() -> list[dict[str, Any]]:
    """The entries laid beside this notebook by the grader (read once), each to be replayed once."""
    global _BOOK
    if _BOOK is None:
        _BOOK = read_file(Path(os.getcwd()) / HOMEWORK_FILE)
    return _BOOK


def _take(kind: str, key: Any) -> dict[str, Any] | None:
    for entry in _book():
        if not entry.get("_used") and entry["kind"] == kind and entry["key"] == key:
            entry["_used"] = True
            return entry
    return None


def _entries(values: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"kind": v["kind"], "key": v.get("key"), "value": v.get("value")} for v in values
            if isinstance(v, Mapping) and isinstance(v.get("kind"), str)]


def read_file(path: Path) -> list[dict[str, Any]]:
    """The entries of a HOMEWORK_FILE; none where it is missing, too large or not a list of entries."""
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            return []
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return _entries(data) if isinstance(data, list) else []


def from_notebook(nb: Any) -> list[dict[str, Any]]:
    """Every entry a notebook's outputs carry, in cell order (what its home run measured)."""
    found: list[Any] = []
    for cell in getattr(nb, "cells", []):
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            data = output.get("data") or {}
            value = data.get(HOMEWORK_MIME) if isinstance(data, Mapping) else None
            if isinstance(value, str):  # a front end may keep a JSON output as text
                try:
                    value = json.loads(value)
                except ValueError:
                    continue
            found.append(value)
    entries = _entries(found)
    return entries if len(json.dumps(entries)) <= MAX_RECORD_BYTES else []


def write_file(entries: list[dict[str, Any]], folder: Path) -> Path:
    """Lay `entries` beside the notebook the grader runs."""
    path = Path(folder) / HOMEWORK_FILE
    path.write_text(json.dumps(entries), encoding="utf-8")
    return path


def reset() -> None:
    """Forget what this process recorded and read (tests, and a second notebook in one process)."""
    global _BOOK
    _BOOK = None
    RECORDED.clear()
    EVENTS.clear()


# ---------------------------------------------------------------------------------------------
# Was a decision measured at home? (the judges of lab 3's AMP_CONFIG and lab 6's FINAL ask)


def keys_of(entries: Iterable[Mapping[str, Any]] | None, kind: str) -> list[Any]:
    """The keys of every recorded measurement of `kind`, in order."""
    return [e.get("key") for e in entries or () if e.get("kind") == kind]


def unmeasured_note(what: str, setting: str, entries: Iterable[Mapping[str, Any]]) -> str:
    """The judge's line for a decision its notebook never measured at home."""
    carried = "carries no measurement from a home run" if not list(entries) else \
        f"never measured {setting} at home (its saved outputs hold no measurement of it)"
    return (f"{what}: this notebook {carried}, so this decision was not made from your own measurement and "
            "earns nothing here; the grader's re-measurement of it is graded on its own. Run the notebook, "
            "decide from what it measures, save it (outputs and all), then hand it in")


# ---------------------------------------------------------------------------------------------
# Does the grader's re-measurement contradict the record? (the judges of lab 3's AMP_CONFIG, lab 6's FINAL)

# A record whose speedup's CI lies wholly above the grader's re-measured CI by more than this factor (its
# low end over the grader's high end) is contradicted: noise does not explain it. Held only where the record
# names the grader's machine and workload (`stamp`): a laptop's gain and a server's differ honestly. The
# factor is generous on purpose: lab 3's reference in tiny mode, kept at CI 1.21-1.97x in the notebook,
# re-measured 1.02x (CI 0.84-1.44x), a ratio of 0.84; a record typed in at 1.9x where the grader measures
# 1.0x (CI 0.95-1.05x) reads 1.8; a loader worker measured on an idle machine and again beside one busy
# process differs by about 10% (0.97-1.03x against 0.90x), never by half.
RECORD_CONTRADICTED = 1.5


def stamp(baseline: Any, device: Any = None) -> dict[str, Any]:
    """Where a measurement of `baseline`'s workload was made, recorded beside it: the machine (its device,
    CPU model and cores), its hardware class, and a digest of the workload (the baseline TrainConfig)."""
    from perflab import env

    info = env.machine_info(device)
    workload = json.dumps(baseline.to_dict(), sort_keys=True, default=str)
    return {"machine": f"{info.device_name} | {info.cpu_model} | {info.cpu_count} cores",
            "hardware_class": info.hardware_class, "workload": _digest(workload)}


def contradicted(recorded_low: float | None, where: Any, verdict: Mapping[str, Any] | None, baseline: Any,
                 what: str) -> str | None:
    """Why the grader's re-measurement (`verdict`: `common.verdict_record`'s "ci") contradicts a record
    whose speedup's CI starts at `recorded_low`, made `where` (`stamp`), or None: None too where the record
    was made on another machine or workload than the grader's `baseline` here, or either CI is missing."""
    ci = (verdict or {}).get("ci")
    if recorded_low is None or not isinstance(where, Mapping) or not isinstance(ci, (list, tuple)) or len(ci) != 2:
        return None
    try:
        here = stamp(baseline)
    except Exception:  # noqa: BLE001 - no device to describe: nothing to compare against
        return None
    if any(where.get(k) != here[k] for k in here) or not ci[1] or ci[1] <= 0:
        return None
    if recorded_low <= RECORD_CONTRADICTED * float(ci[1]):
        return None
    return (f"{what}: your saved run's record reads at least {recorded_low:.2f}x on this machine and workload, "
            f"the grader re-measured {float(ci[0]):.2f}-{float(ci[1]):.2f}x: more than {RECORD_CONTRADICTED:g} "
            "times apart, which noise does not explain, so the decision earns nothing from that record and a "
            "person will look at it")


def hold_against(records: Iterable[tuple[float | None, Any]], remeasure: Callable[[], tuple[Any, Any]],
                 baseline: Any, what: str) -> None:
    """Raise Suspicious (0 points, flagged) where one of `records` ((its CI's low end, its `stamp`)) is
    `contradicted` by the grader's re-measurement (`remeasure()`: a verdict and its expectation). A
    re-measurement that fails holds nothing: the verified cell meets the same fault and says so."""
    from perflab.grading.marks import Suspicious
    from perflab.labs import common

    records = list(records)
    if not records:
        return
    try:
        verdict, expectation = remeasure()
    except Exception:  # noqa: BLE001 - see above
        return
    measured = common.verdict_record(verdict, expectation)
    for low, where in records:
        why = contradicted(low, where, measured, baseline, what)
        if why:
            raise Suspicious(why)


# ---------------------------------------------------------------------------------------------
# Comparisons, as recorded


def comparison_value(comparison: Any) -> dict[str, Any]:
    """A perflab.timing.Comparison as JSON data (its raw block times and how they were taken)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(comparison).items()}


def comparison_from(value: Mapping[str, Any]) -> Any:
    """The Comparison `comparison_value` recorded (its own checks reject malformed times)."""
    from perflab.timing import Comparison

    fields = {f.name for f in dataclasses.fields(Comparison)}
    data = {k: v for k, v in value.items() if k in fields}
    data["a_times"], data["b_times"] = tuple(data["a_times"]), tuple(data["b_times"])
    data["labels"] = tuple(str(x) for x in data.get("labels", ("A", "B")))
    return Comparison(**data)
