"""The labs of the kit, in course order, as their manifests declare them.

    registry.manifests()            every `perflab/labs/labNN.py` contract's MANIFEST, in order
    registry.manifest("lab03_amp")  one lab's (by name or key, "lab03"); a course lab's from its folder
    registry.graded_bars(lab, mode) its cells re-measured against a calibrated bar
    with registry.course_labs({"lab07_x": folder}):   a course's own labs, read from their folders
        registry.labs()             the kit's labs, then the course's own

A manifest is read from the contract's source (`ast.literal_eval` of its `MANIFEST = {...}`), never by
importing it: env reads workloads before anything else is imported, and the report imports no torch.
Only `contract` and `graded_bars` import a lab's contract, when called.

A course's own lab is a folder beside the kit's (its notebook, `probes.py`, `judges.py`): `probes.py` is
its public module (PROBES, its MANIFEST, and where it has a bar, EXPECTATION, `baseline_config(mode)`
and the `bars` function its manifest names), `judges.py` its grader's side (JUDGES, `calibration_pair`).
A grading run puts the labs it grades in force (`course_labs`), so that the core (calibration,
self-calibration, the bars it reports) reads a seventh lab as it reads the kit's six.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import pkgutil
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from perflab.labs.manifest import LabManifest

PACKAGE = "perflab.labs"
CONTRACT = re.compile(r"lab\d\d")
# A course's own lab keeps its manifest, like its probes, in this file beside its source notebook.
COURSE_MANIFEST_FILE = "probes.py"
# Its grader's side (judges, calibration pair), never released to students (`perflab.grading.judging`).
COURSE_JUDGES_FILE = "judges.py"
# The course's own labs in force ({lab: its source folder}): see `course_labs`.
_COURSE_LABS: dict[str, Path] = {}


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


@contextlib.contextmanager
def course_labs(folders: Mapping[str, str | Path]) -> Iterator[None]:
    """Within: each lab of `folders` ({lab: its source folder}) that is not the kit's is read from its folder
    (`manifest`, `contract`, `grader_side`, `graded_bars`) and listed by `labs`."""
    before = dict(_COURSE_LABS)
    _COURSE_LABS.update({lab: Path(f).resolve() for lab, f in folders.items() if find(lab) is None})
    try:
        yield
    finally:
        _COURSE_LABS.clear()
        _COURSE_LABS.update(before)


def labs() -> tuple[LabManifest, ...]:
    """The kit's labs in course order, then the course's own labs in force (by name)."""
    return (*manifests(), *(manifest(lab) for lab in sorted(_COURSE_LABS)))


def manifest(lab: str, folder: str | Path | None = None) -> LabManifest:
    """`lab`'s manifest: the kit's, else the MANIFEST of the course lab's `probes.py` in `folder` (its
    source folder; default: its folder where it is in force), else a bare one (no workloads of its own,
    no bar, no report role)."""
    found = find(lab)
    if found is not None:
        return found
    folder = folder if folder is not None else _COURSE_LABS.get(lab)
    path = Path(folder) / COURSE_MANIFEST_FILE if folder is not None else None
    course = read(path) if path is not None and path.is_file() else None
    if course is not None and course.lab != lab:
        raise ValueError(f"{path}: MANIFEST names lab {course.lab!r}, not {lab!r}")
    return course or LabManifest(lab=lab)


def contract(lab: LabManifest) -> ModuleType:
    """The lab's public module, imported now: the kit's contract (`perflab.labs.labNN`), or a course lab's
    `probes.py` where it is in force."""
    folder = _COURSE_LABS.get(lab.lab)
    if folder is not None:
        return load_file(folder / COURSE_MANIFEST_FILE, f"{lab.lab}_public")
    return importlib.import_module(f"{PACKAGE}.{lab.key}")


def grader_side(lab: str) -> ModuleType | None:
    """A course lab's grader's side (its `judges.py`) where it is in force and has one; else None (the kit's
    labs keep theirs in the grader-only `hidden` subpackage, which `perflab.grading.judging` reads)."""
    folder = _COURSE_LABS.get(lab)
    path = folder / COURSE_JUDGES_FILE if folder is not None else None
    return load_file(path, f"{lab}_judges") if path is not None and path.is_file() else None


@functools.cache
def _loaded(path: Path, stamp: tuple[int, int], name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"perflab_course_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_file(path: Path, name: str) -> ModuleType:
    """The module in file `path`, loaded once per version of the file."""
    info = Path(path).stat()
    return _loaded(Path(path).resolve(), (info.st_mtime_ns, info.st_size), name)


def graded_bars(lab: str, mode: str) -> list[tuple[str, Any]]:
    """(expectations entry, baseline workload) of each cell of `lab` re-measured against a bar calibrated on
    the grading machine, at `mode`'s sizes: what its public module's `bars` function returns ([] where none)."""
    found = find(lab) or (manifest(lab) if lab in _COURSE_LABS else None)
    if found is None or not found.bars:
        return []
    return list(getattr(contract(found), found.bars)(mode))


def with_any(attribute: str) -> tuple[LabManifest, ...]:
    """The labs whose manifest sets `attribute` (a flag, or a non-empty field), in order."""
    return tuple(m for m in manifests() if getattr(m, attribute))
