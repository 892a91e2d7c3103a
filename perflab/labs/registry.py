"""The labs of the kit, in course order, as their manifests declare them.

    registry.manifests()            every `perflab/labs/labNN.py` contract's MANIFEST, in order
    registry.manifest("lab03_amp")  one lab's (by name or key, "lab03"); a course lab's from its folder
    registry.graded_bars(lab, mode) its cells re-measured against a calibrated bar

A manifest is read from the contract's source (`ast.literal_eval` of its `MANIFEST = {...}`), never by
importing it: env reads workloads before anything else is imported, and the report imports no torch.
Only `contract` and `graded_bars` import a lab's contract, when called.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from perflab.labs.manifest import LabManifest

PACKAGE = "perflab.labs"
CONTRACT = re.compile(r"lab\d\d")
# A course's own lab keeps its manifest, like its probes, in this file beside its source notebook.
COURSE_MANIFEST_FILE = "probes.py"


def read(path: Path) -> LabManifest | None:
    """The MANIFEST a module's source assigns at its top level (None where it assigns none)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "MANIFEST" for t in targets) and node.value is not None:
                try:
                    data = ast.literal_eval(node.value)
                except ValueError:
                    raise ValueError(f"{path}: MANIFEST must be a literal dict (data only)") from None
                return LabManifest.from_dict(data, str(path))
    return None


@functools.cache
def manifests() -> tuple[LabManifest, ...]:
    """Every lab of the kit, in course order: the MANIFEST of each `perflab/labs/labNN.py`."""
    folder = Path(__file__).resolve().parent
    found = []
    for info in sorted(pkgutil.iter_modules([str(folder)]), key=lambda i: i.name):
        if CONTRACT.fullmatch(info.name):
            manifest = read(folder / f"{info.name}.py")
            if manifest is None:
                raise ValueError(f"{folder / info.name}.py: a lab contract without a MANIFEST")
            if manifest.key != info.name:
                raise ValueError(f"{folder / info.name}.py: MANIFEST names lab {manifest.lab!r}, not a {info.name}")
            found.append(manifest)
    return tuple(found)


def names() -> tuple[str, ...]:
    """The kit's labs' names, in course order."""
    return tuple(m.lab for m in manifests())


def find(lab: str | None) -> LabManifest | None:
    """The kit's lab named `lab` ("lab03_amp") or keyed so ("lab03"); None where the kit has none."""
    return next((m for m in manifests() if lab in (m.lab, m.key)), None)


def manifest(lab: str, folder: str | Path | None = None) -> LabManifest:
    """`lab`'s manifest: the kit's, else the MANIFEST of the course lab's `probes.py` in `folder` (its
    source folder), else a bare one (no workloads of its own, no bar, no report role)."""
    found = find(lab)
    if found is not None:
        return found
    path = Path(folder) / COURSE_MANIFEST_FILE if folder is not None else None
    course = read(path) if path is not None and path.is_file() else None
    if course is not None and course.lab != lab:
        raise ValueError(f"{path}: MANIFEST names lab {course.lab!r}, not {lab!r}")
    return course or LabManifest(lab=lab)


def contract(lab: LabManifest) -> ModuleType:
    """The kit lab's contract module (`perflab.labs.labNN`), imported now."""
    return importlib.import_module(f"{PACKAGE}.{lab.key}")


def graded_bars(lab: str, mode: str) -> list[tuple[str, Any]]:
    """(expectations entry, baseline workload) of each cell of `lab` re-measured against a bar calibrated on
    the grading machine, at `mode`'s sizes: what its contract's `bars` function returns ([] where none)."""
    found = find(lab)
    if found is None or not found.bars:
        return []
    return list(getattr(contract(found), found.bars)(mode))


def with_any(attribute: str) -> tuple[LabManifest, ...]:
    """The labs whose manifest sets `attribute` (a flag, or a non-empty field), in order."""
    return tuple(m for m in manifests() if getattr(m, attribute))
