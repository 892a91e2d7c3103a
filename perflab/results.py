"""Lab results as versioned JSON: what every lab saves, what `perflab report` reads.

A results file is one JSON object:

    {"schema": "perflab.results", "version": 1, "lab": "lab03_amp", "created": "...",
     "machine": {...perflab.env.MachineInfo...}, "config": {...TrainConfig...} | null,
     "sections": {name: data, ...}}

Known sections and their shapes (all optional; a report says "not measured" for a missing one):

    counts            {"parameters": int, "flops_forward": int, "flops_train": int}
    baseline          {"throughput": STAT, "step_time": STAT}      STAT = {"median": float, "ci": [lo, hi], "unit": str}
    speedups          [{"name": str, "speedup": float, "ci": [lo, hi], "verdict"?: str, "claimed"?: float,
                        "cumulative"?: bool}]   cumulative: measured against the lab's baseline with every
                                                earlier row's change included (the default in lab06_together,
                                                the ablation); otherwise each row is against its own baseline
    phases            {"before": {phase: seconds}, "after"?: {phase: seconds}}
    memory_vs_batch   [{"batch_size": int, "bytes": int, "checkpointed": bool}]
    memory_budget     {"parameters": int, "gradients": int, "optimizer": int, "activations": int}
    roofline          {"peak_flops": float, "peak_bandwidth": float,
                       "layers": [{"name": str, "flops": float, "bytes": float, "verdict": str}],
                       "achieved"?: {"flops_per_s": float, "intensity": float}}
    top_ops           [{"name": str, "self_time_s": float, "calls": int}]
    verification      [{"name": str, "verdict": str, "reason": str, "speedup"?: float, "ci"?: [lo, hi]}]
    accuracy          {"baseline": float, "final": float}
    mfu               {"achieved_flops_per_s": float, "peak_flops": float}
    analysis          str (the student's written analysis, Markdown)
    bottleneck        {"verdict": str, "reason": str}
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SCHEMA = "perflab.results"
VERSION = 1
_NUMBER = (int, float)


class ResultsError(ValueError):
    """A results file that cannot be used; the message names the file and the field."""


def make(lab: str, sections: Mapping[str, Any], *, config: Any = None, machine: Any = None) -> dict[str, Any]:
    """Build a results document for `lab` from its sections (machine described if not given)."""
    from perflab import env

    machine = machine if machine is not None else env.machine_info()
    doc = {
        "schema": SCHEMA,
        "version": VERSION,
        "lab": lab,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine.to_dict() if hasattr(machine, "to_dict") else dict(machine),
        "config": config.to_dict() if hasattr(config, "to_dict") else config,
        "sections": _jsonable(dict(sections)),
    }
    validate(doc)
    return doc


def save(path: str | os.PathLike[str], lab: str, sections: Mapping[str, Any], *,
         config: Any = None, machine: Any = None) -> Path:
    """Validate and write a results file atomically (a crash never leaves half a file)."""
    doc = make(lab, sections, config=config, machine=machine)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a results file; errors name the file and the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such results file") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        validate(doc)
    except ResultsError as exc:
        raise ResultsError(f"{path}: {exc}") from None
    return doc


def validate(doc: Any) -> None:
    """Raise `ResultsError` naming the first field that does not fit the schema."""
    if not isinstance(doc, dict):
        raise ResultsError("top level: expected a JSON object")
    if doc.get("schema") != SCHEMA:
        raise ResultsError(f"field 'schema': expected {SCHEMA!r}, got {doc.get('schema')!r}")
    version = doc.get("version")
    if version != VERSION:
        raise ResultsError(f"field 'version': this perflab reads version {VERSION}, the file has {version!r}")
    for name, kind in (("lab", str), ("created", str), ("machine", dict), ("sections", dict)):
        if not isinstance(doc.get(name), kind):
            raise ResultsError(f"field {name!r}: expected {kind.__name__}, got {type(doc.get(name)).__name__}")
    if doc.get("config") is not None and not isinstance(doc["config"], dict):
        raise ResultsError("field 'config': expected an object or null")
    for key in ("device", "hardware_class"):
        if not isinstance(doc["machine"].get(key), str):
            raise ResultsError(f"field 'machine.{key}': expected a string")
    for name, data in doc["sections"].items():
        checker = _SECTION_CHECKS.get(name)
        if checker is not None:
            checker(f"sections.{name}", data)


def _jsonable(value: Any) -> Any:
    """Plain JSON types only (dataclasses with to_dict, tuples, numpy/torch scalars); NaN/inf refused."""
    if hasattr(value, "to_dict"):
        return _jsonable(value.to_dict())
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ResultsError(f"value {value!r}: results hold finite numbers only")
        return value
    if isinstance(value, int):
        return value
    raise ResultsError(f"value of type {type(value).__name__} cannot be stored in results JSON")


def _need(field: str, value: Any, kinds: type | tuple[type, ...], what: str) -> None:
    if isinstance(value, bool) and kinds == _NUMBER or not isinstance(value, kinds):
        raise ResultsError(f"field {field!r}: expected {what}, got {value!r}")


def _check_ci(field: str, value: Any) -> None:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, _NUMBER) for v in value)):
        raise ResultsError(f"field {field!r}: expected [low, high], got {value!r}")
    if value[0] > value[1]:
        raise ResultsError(f"field {field!r}: low {value[0]} is above high {value[1]}")


def _check_records(required: dict[str, tuple[type | tuple[type, ...], str]]):
    def check(field: str, data: Any) -> None:
        if not isinstance(data, list):
            raise ResultsError(f"field {field!r}: expected a list")
        for i, row in enumerate(data):
            if not isinstance(row, dict):
                raise ResultsError(f"field '{field}[{i}]': expected an object")
            for key, (kinds, what) in required.items():
                if key not in row:
                    raise ResultsError(f"field '{field}[{i}].{key}': missing")
                _need(f"{field}[{i}].{key}", row[key], kinds, what)
            if "ci" in row:
                _check_ci(f"{field}[{i}].ci", row["ci"])
    return check


def _check_mapping_of_numbers(field: str, data: Any) -> None:
    if not isinstance(data, dict):
        raise ResultsError(f"field {field!r}: expected an object")
    for key, value in data.items():
        if isinstance(value, dict):
            _check_mapping_of_numbers(f"{field}.{key}", value)
        elif value is not None and not isinstance(value, (*_NUMBER, str, list, bool)):
            raise ResultsError(f"field '{field}.{key}': expected a number, got {value!r}")


def _check_baseline(field: str, data: Any) -> None:
    if not isinstance(data, dict):
        raise ResultsError(f"field {field!r}: expected an object")
    for key, stat in data.items():
        if isinstance(stat, dict) and "median" in stat:
            _need(f"{field}.{key}.median", stat["median"], _NUMBER, "a number")
            if "ci" in stat:
                _check_ci(f"{field}.{key}.ci", stat["ci"])


def _check_phases(field: str, data: Any) -> None:
    if not isinstance(data, dict) or "before" not in data:
        raise ResultsError(f"field '{field}.before': missing")
    for key in ("before", "after"):
        if key in data:
            _check_mapping_of_numbers(f"{field}.{key}", data[key])


def _check_roofline(field: str, data: Any) -> None:
    if not isinstance(data, dict):
        raise ResultsError(f"field {field!r}: expected an object")
    for key in ("peak_flops", "peak_bandwidth"):
        _need(f"{field}.{key}", data.get(key), _NUMBER, "a number")
        if data[key] <= 0:
            raise ResultsError(f"field '{field}.{key}': must be positive, got {data[key]!r}")
    _check_records({"name": (str, "a string"), "flops": (_NUMBER, "a number"),
                    "bytes": (_NUMBER, "a number")})(f"{field}.layers", data.get("layers"))


def _check_mfu(field: str, data: Any) -> None:
    _check_mapping_of_numbers(field, data)
    for key in ("achieved_flops_per_s", "peak_flops"):
        _need(f"{field}.{key}", data.get(key), _NUMBER, "a number")
    if data["peak_flops"] <= 0:
        raise ResultsError(f"field '{field}.peak_flops': must be positive, got {data['peak_flops']!r}")


def _check_bottleneck(field: str, data: Any) -> None:
    if not isinstance(data, dict):
        raise ResultsError(f"field {field!r}: expected an object")
    _need(f"{field}.verdict", data.get("verdict"), str, "a string")


def _check_text(field: str, data: Any) -> None:
    _need(field, data, str, "text")


_SECTION_CHECKS = {
    "counts": _check_mapping_of_numbers,
    "baseline": _check_baseline,
    "speedups": _check_records({"name": (str, "a string"), "speedup": (_NUMBER, "a number")}),
    "phases": _check_phases,
    "memory_vs_batch": _check_records({"batch_size": (int, "an integer"), "bytes": (_NUMBER, "a number")}),
    "memory_budget": _check_mapping_of_numbers,
    "roofline": _check_roofline,
    "top_ops": _check_records({"name": (str, "a string"), "self_time_s": (_NUMBER, "a number")}),
    "verification": _check_records({"name": (str, "a string"), "verdict": (str, "a string")}),
    "accuracy": _check_mapping_of_numbers,
    "mfu": _check_mfu,
    "analysis": _check_text,
    "bottleneck": _check_bottleneck,
}
