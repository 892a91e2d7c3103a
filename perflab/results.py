"""Lab results as versioned JSON: what every lab saves, what `perflab report` reads.

A results file is one JSON object:

    {"schema": "perflab.results", "version": 2, "lab": "lab03_amp", "created": "...",
     "machine": {...perflab.env.MachineInfo...}, "config": {...TrainConfig...} | null,
     "sections": {name: data, ...}}

Its shape is the JSON Schema in `perflab/schemas/results.schema.json` (Draft 2020-12): every section
a lab or `perflab profile` writes, each field typed; a section it does not know is refused. The core
sections a report reads: counts, baseline (STATs), speedups, phases, memory_vs_batch, memory_budget,
roofline, top_ops, verification, accuracy, mfu, analysis, bottleneck.

Raw samples are kept (version 2) so that a reader can recompute what was derived from them: a STAT
(`{"median", "ci", "unit", "samples"}`) holds the values its statistic came from, and a speedup row
measured by ABBA blocks holds both arms' block times (`samples`: `baseline_s`, `candidate_s`,
`block_size`, `quantile`); `recompute_speedup` derives the speedup and its CI again. A speedup row's
`cumulative` means it was measured against the lab's baseline with every earlier row's change
included (lab06's ablation); otherwise each row is against its own baseline.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

SCHEMA = "perflab.results"
VERSION = 2  # what this perflab writes
READS = (1, 2)  # what it reads: version 1 files (no raw samples) stay readable
SCHEMA_FILE = Path(__file__).resolve().parent / "schemas" / "results.schema.json"


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
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
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
    """Raise `ResultsError` naming the first field that does not fit the schema (`SCHEMA_FILE`)."""
    if not isinstance(doc, dict):
        raise ResultsError("top level: expected a JSON object")
    if doc.get("schema") != SCHEMA:
        raise ResultsError(f"field 'schema': expected {SCHEMA!r}, got {doc.get('schema')!r}")
    version = doc.get("version")
    if version not in READS:
        raise ResultsError(f"field 'version': this perflab reads versions {', '.join(map(str, READS))}, "
                           f"the file has {version!r}")
    errors = sorted(_validator().iter_errors(doc), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        raise ResultsError(_describe(errors[0]))
    for field, (low, high) in _intervals(doc["sections"], "sections"):
        if low > high:
            raise ResultsError(f"field {field!r}: low {low} is above high {high}")


@functools.cache
def _validator() -> Any:
    import jsonschema

    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _field(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "top level"


def _describe(error: Any) -> str:
    """One line for the first schema error: the field, what it should hold, what it holds."""
    field = _field(error.absolute_path)
    if error.validator == "required":
        missing = next(k for k in error.validator_value if k not in error.instance)
        return f"field {_field([*error.absolute_path, missing])!r}: missing"
    if error.validator == "additionalProperties" and error.absolute_path and error.absolute_path[-1] == "sections":
        known = ", ".join(sorted(error.schema.get("properties", {})))
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return f"field 'sections.{extra[0]}': not a section perflab knows ({known})"
    if error.validator == "additionalProperties":
        return f"field {field!r}: {error.message}"
    expected = {"type": lambda v: " or ".join(v) if isinstance(v, list) else str(v),
                "anyOf": lambda v: " or ".join(s.get("type", "a value") for s in v if isinstance(s, dict)),
                "exclusiveMinimum": lambda v: f"a number above {v}", "minimum": lambda v: f"a number of at least {v}",
                "minItems": lambda v: f"at least {v} item(s)", "maxItems": lambda v: f"at most {v} item(s)",
                "const": repr, "enum": lambda v: "one of " + ", ".join(map(repr, v))}
    what = expected.get(error.validator, lambda v: error.message)(error.validator_value)
    return f"field {field!r}: expected {what}, got {error.instance!r}"[:300]


def _intervals(value: Any, field: str) -> Iterator[tuple[str, tuple[float, float]]]:
    """Every `ci` pair under `value`, with its field name."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "ci" and isinstance(item, list) and len(item) == 2:
                yield f"{field}.ci", (item[0], item[1])
            else:
                yield from _intervals(item, f"{field}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _intervals(item, f"{field}[{i}]")


def recompute_speedup(row: Mapping[str, Any]) -> tuple[float, tuple[float, float]] | None:
    """(speedup, (low, high)) recomputed from a speedup row's raw `samples` (schema version 2), or None
    for a row without them: the same statistic and bootstrap that measured it."""
    samples = row.get("samples")
    if not samples:
        return None
    from perflab.timing import Comparison

    comparison = Comparison(samples["baseline_s"], samples["candidate_s"], samples["block_size"],
                            quantile=samples["quantile"])
    ci = comparison.ci()
    return comparison.speedup, (ci.low, ci.high)


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
