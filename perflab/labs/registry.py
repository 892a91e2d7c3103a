"""The labs of a course, in course order, each read from its folder.

    registry.manifests()            the kit's labs: each `perflab/labs/labNN/` folder's MANIFEST, in order
    registry.manifest("lab03_amp")  one lab's (by name or key, "lab03"); a course lab's from its folder
    registry.graded_bars(lab, mode) its cells re-measured against a calibrated bar
    with registry.course_labs({"lab07_x": folder}):   a course's own labs, read from their folders
        registry.labs()             the kit's labs, then the course's own

Every lab is a folder of the same shape, the kit's six (`perflab/labs/labNN/`) and a course's own
(beside its source notebook):

    __init__.py or probes.py   its public module, assigning MANIFEST (a dict literal: data)
    probes.py                  PROBES: what the grader reads from a notebook after each graded cell
    judges.py or judges/       grader-only: JUDGES and the answer key (`calibration_pair`); left out of
                               the student bundle and hidden from the grading sandbox

A manifest is read from the source (`ast.literal_eval` of its `MANIFEST = {...}`), never by importing
it: env reads workloads before anything else is imported, and the report imports no torch. A grading
run puts the course labs it grades in force (`course_labs`), so that the core (calibration,
self-calibration, the bars it reports) reads a seventh lab as it reads the kit's six.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from perflab.labs.manifest import LabManifest

PACKAGE = "perflab.labs"
KIT = Path(__file__).resolve().parent  # the kit's labs' folders: KIT / "labNN"
KEY = re.compile(r"lab\d\d")
# The files of a lab folder: where its MANIFEST is (the first that exists), its probes, its grader's side.
MANIFEST_FILES = ("__init__.py", "probes.py")
PROBES_FILE = "probes.py"
JUDGES = "judges"  # judges.py, or a judges/ package
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


def _manifest_in(folder: Path) -> LabManifest | None:
    path = next((folder / f for f in MANIFEST_FILES if (folder / f).is_file()), None)
    return read(path) if path is not None else None


@functools.cache
def manifests() -> tuple[LabManifest, ...]:
    """Every lab of the kit, in course order: the MANIFEST of each `perflab/labs/labNN/` folder."""
    found = []
    for folder in sorted(p for p in KIT.iterdir() if p.is_dir() and KEY.fullmatch(p.name)):
        manifest = _manifest_in(folder)
        if manifest is None:
            raise ValueError(f"{folder}: a lab folder without a MANIFEST")
        if manifest.key != folder.name:
            raise ValueError(f"{folder}: MANIFEST names lab {manifest.lab!r}, not a {folder.name}")
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


def folder(lab: str) -> Path | None:
    """`lab`'s folder: the kit's `perflab/labs/labNN/`, or a course lab's source folder where it is in force."""
    found = find(lab)
    return KIT / found.key if found is not None else _COURSE_LABS.get(lab)


def manifest(lab: str, source: str | Path | None = None) -> LabManifest:
    """`lab`'s manifest: the kit's, else the MANIFEST of the course lab's folder (`source`; default: its
    folder where it is in force), else a bare one (no workloads of its own, no bar, no report role)."""
    found = find(lab)
    if found is not None:
        return found
    source = source if source is not None else _COURSE_LABS.get(lab)
    course = _manifest_in(Path(source)) if source is not None else None
    if course is not None and course.lab != lab:
        raise ValueError(f"{source}: MANIFEST names lab {course.lab!r}, not {lab!r}")
    return course or LabManifest(lab=lab)


def _part(lab: str, part: str, source: str | Path | None = None) -> ModuleType | None:
    """Module `part` ("probes", "judges", "" for the public module) of `lab`'s folder, imported now; None
    where the folder has none. The kit's are imported as `perflab.labs.labNN.<part>`; a course lab's
    files are loaded from its folder (`source`, else its folder in force)."""
    found = find(lab)
    if found is not None:
        name = ".".join(filter(None, (PACKAGE, found.key, part)))
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            return None
    where = Path(source) if source is not None else _COURSE_LABS.get(lab)
    if where is None:
        return None
    paths = [where / f"{part}.py", where / part / "__init__.py"] if part else [where / PROBES_FILE]
    path = next((p for p in paths if p.is_file()), None)
    return load_file(path, f"{lab}_{part or 'public'}") if path is not None else None


def contract(lab: LabManifest) -> ModuleType:
    """The lab's public module, imported now: the kit's `perflab.labs.labNN`, a course lab's `probes.py`."""
    module = _part(lab.lab, "")
    if module is None:
        raise ImportError(f"{lab.lab}: no public module (probes.py) in its folder")
    return module


def probes(lab: str, source: str | Path | None = None) -> ModuleType | None:
    """The lab's probes module (PROBES); None where it has none."""
    return _part(lab, "probes", source)


def grader_side(lab: str, source: str | Path | None = None) -> ModuleType | None:
    """The lab's grader-only module (JUDGES, its answer key); None where this copy has none (a student's kit)."""
    return _part(lab, JUDGES, source)


def grader_only_folders() -> list[Path]:
    """The kit's folders a student never sees: each lab's `judges/` (the bundle leaves them out, the
    sandbox hides them)."""
    return sorted(p for p in KIT.glob(f"lab[0-9][0-9]/{JUDGES}") if p.is_dir())


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
