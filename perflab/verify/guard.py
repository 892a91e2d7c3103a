"""Tamper checks: clocks bound before student code runs, perflab's files against recorded hashes,
and the identity of the functions the protocol relies on.

This module imports only the standard library at the top, so the child can bind its clocks
before anything else (torch included) is imported.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

# Set by the grading pipeline to a manifest written (with `write_manifest`) before any student
# code ran, outside the student's reach. Without it the hashes recorded when perflab.verify was
# first imported in this process are used.
MANIFEST_ENV = "PERFLAB_VERIFY_MANIFEST"

# Modules whose attributes the protocol calls during timing: replacing any of them from student
# code (a no-op synchronize, a sleeping conv in the baseline's path, a clock that runs slow) is
# tampering. Only attributes present before the student's import are compared, so lazily added
# submodules do not count.
WATCHED_MODULES = ("time", "torch", "torch.cuda", "torch.nn.functional", "torch.optim",
                   "perflab.env", "perflab.workload", "perflab.verify.candidates", "perflab.verify.decide")
WATCHED_CLASSES = (("torch", "Tensor"), ("torch.cuda", "Event"), ("torch.nn", "Module"),
                   ("torch.optim", "SGD"), ("torch.optim", "Optimizer"))


def package_root() -> Path:
    """The folder of the perflab package that is imported here."""
    import perflab

    return Path(perflab.__file__).resolve().parent


def file_hashes(root: Path | None = None) -> dict[str, str]:
    """SHA-256 of every .py file under perflab's package folder, keyed by its path relative to it."""
    root = root or package_root()
    hashes = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in rel:
            continue
        hashes[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def check_hashes(expected: dict[str, str], root: Path | None = None, *,
                 only: set[str] | None = None) -> list[str]:
    """The files that differ from `expected` (modified or missing), as readable lines.

    Added files are not reported: nothing imports a file perflab does not name. `only` limits the
    check to those relative paths (e.g. the modules this process has imported).
    """
    actual = file_hashes(root)
    problems = []
    for rel, digest in sorted(expected.items()):
        if only is not None and rel not in only:
            continue
        if rel not in actual:
            problems.append(f"perflab/{rel} is missing")
        elif actual[rel] != digest:
            problems.append(f"perflab/{rel} was modified")
    return problems


def write_manifest(path: str | os.PathLike[str], root: Path | None = None) -> Path:
    """Record perflab's file hashes now (before any student code runs) for later checks."""
    path = Path(path)
    path.write_text(json.dumps({"perflab": file_hashes(root)}, indent=1, sort_keys=True))
    return path


def imported_files() -> set[str]:
    """perflab's .py files (relative paths) that this process has imported."""
    root = package_root()
    found = set()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if (name == "perflab" or name.startswith("perflab.")) and path:
            try:
                found.add(Path(path).resolve().relative_to(root).as_posix())
            except ValueError:
                continue
    return found


_IMPORT_TIME_HASHES: dict[str, str] | None = None


def expected_hashes() -> dict[str, str]:
    """The hashes perflab's files must have: the manifest in $PERFLAB_VERIFY_MANIFEST, else those at first import."""
    global _IMPORT_TIME_HASHES
    manifest = os.environ.get(MANIFEST_ENV)
    if manifest:
        try:
            return dict(json.loads(Path(manifest).read_text())["perflab"])
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"{MANIFEST_ENV}: cannot read the hash manifest {manifest}: {exc}") from exc
    if _IMPORT_TIME_HASHES is None:
        _IMPORT_TIME_HASHES = file_hashes()
    return dict(_IMPORT_TIME_HASHES)


@dataclass
class Clocks:
    """Private references to the clocks, bound before any student code is imported."""

    perf_counter_ns: Any = time.perf_counter_ns
    perf_counter: Any = time.perf_counter
    monotonic_ns: Any = time.monotonic_ns
    clock_gettime_ns: Any = time.clock_gettime_ns  # per-thread CPU clocks (verify's idle probe)
    event: Any = None  # torch.cuda.Event
    elapsed_time: Any = None  # torch.cuda.Event.elapsed_time
    synchronize: Any = None  # torch.cuda.synchronize

    def bind_torch(self) -> None:
        import torch

        self.event = torch.cuda.Event
        self.elapsed_time = torch.cuda.Event.elapsed_time
        self.synchronize = torch.cuda.synchronize

    def problems(self) -> list[str]:
        """The clocks that no longer are the ones bound (a student replaced them)."""
        found = []
        for name in ("perf_counter_ns", "perf_counter", "monotonic_ns", "clock_gettime_ns"):
            if getattr(time, name) is not getattr(self, name):
                found.append(f"time.{name} was replaced")
        if self.event is not None:
            import torch

            if torch.cuda.Event is not self.event:
                found.append("torch.cuda.Event was replaced")
            if self.event.elapsed_time is not self.elapsed_time:
                found.append("torch.cuda.Event.elapsed_time was replaced")
            if torch.cuda.synchronize is not self.synchronize:
                found.append("torch.cuda.synchronize was replaced")
        return found


@dataclass
class Snapshot:
    """The identity of every attribute of the watched modules and classes at one moment."""

    ids: dict[str, int] = field(default_factory=dict)

    @classmethod
    def take(cls) -> Snapshot:
        ids: dict[str, int] = {}
        for name in WATCHED_MODULES:
            module = sys.modules.get(name)
            if isinstance(module, ModuleType):
                ids.update(_attribute_ids(name, vars(module)))
        for module_name, cls_name in WATCHED_CLASSES:
            module = sys.modules.get(module_name)
            klass = getattr(module, cls_name, None) if module is not None else None
            if klass is not None:
                # Resolved through the MRO: a method set on the class shadows an inherited one.
                resolved = {}
                for key in dir(klass):
                    try:
                        resolved[key] = inspect.getattr_static(klass, key)
                    except AttributeError:
                        continue
                ids.update(_attribute_ids(f"{module_name}.{cls_name}", resolved, dunders=True))
        return cls(ids)

    def changed(self, later: Snapshot) -> list[str]:
        """Attributes present now and later whose object changed in between."""
        return sorted(key for key, ident in self.ids.items() if key in later.ids and later.ids[key] != ident)


def _attribute_ids(prefix: str, namespace: dict[str, Any], dunders: bool = False) -> dict[str, int]:
    # Callables and classes only: plain values (counters, caches, flags) legitimately change. A
    # class's operators (Tensor.__matmul__) count; a module's dunders (__loader__, ...) do not.
    return {f"{prefix}.{key}": id(value) for key, value in list(namespace.items())
            if (dunders or not key.startswith("__")) and (callable(value) or isinstance(value, type))}
