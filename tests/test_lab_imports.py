"""Every name a lab notebook reads from perflab is defined where the notebook reads it.

A notebook's cells read `lab03.parity_problems` or `from perflab.labs.lab06.measure import screen`; no
module answers a name that lives elsewhere, so a name moved out of a module while a notebook still reads
it there fails here (statically, in a second), not in a student's kernel.
"""

from __future__ import annotations

import ast
import importlib

import pytest

from perflab.labs import build

LABS = build.lab_names()


def perflab_reads(source: str) -> set[tuple[str, str, int]]:
    """(module, name, line) for every name `source` reads from a perflab module: an attribute of a module
    it imported (`import perflab.x as m`, `from perflab import x`: `m.name`) or a `from perflab.x import
    name`. A module name the source also binds to something else (`report = ...`) is not followed."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}
    reads: set[tuple[str, str, int]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update({a.asname: a.name for a in node.names if a.asname and a.name.startswith("perflab.")})
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "perflab" and not node.level:
            reads.update((node.module, a.name, node.lineno) for a in node.names if a.name != "*")
            modules.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                            if _is_module(f"{node.module}.{a.name}")})
    rebound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    rebound |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    modules = {alias: module for alias, module in modules.items() if alias not in rebound}  # `report = ...`
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            reads.add((modules[node.value.id], node.attr, node.lineno))
    return reads


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return False
    return True


def missing(source: str) -> list[str]:
    """`module.name (line N)` for each read of `source` its module does not define (a submodule counts)."""
    return sorted(f"{module}.{name} (line {line})" for module, name, line in perflab_reads(source)
                  if not hasattr(importlib.import_module(module), name) and not _is_module(f"{module}.{name}"))


def test_there_are_labs_to_scan() -> None:
    assert len(LABS) >= 6, LABS


@pytest.mark.parametrize("lab", LABS)
def test_every_name_the_notebook_reads_from_perflab_exists_there(lab: str) -> None:
    source = build.source_twin(lab).read_text(encoding="utf-8")
    reads = perflab_reads(source)
    assert any(module.startswith("perflab.labs.lab") for module, _, _ in reads), f"{lab} reads nothing of its lab?"
    assert missing(source) == [], f"{lab} reads names its modules do not define"


def test_the_scan_finds_a_name_a_module_lacks() -> None:
    """The detector itself: each way of reading a name, with one its module lacks, is found."""
    source = ("import perflab.labs.lab03 as L3\n"
              "from perflab.labs import lab06\n"
              "from perflab.labs.lab06 import measure as lab06_measure\n"
              "from perflab.labs.lab01 import not_here\n"
              "L3.parity_problems\n"
              "lab06_measure.screen, lab06.screen\n"
              "from perflab import report\n"
              "report.model\n"
              "def f(lab03):\n    return lab03.not_a_module_here\n")
    assert missing(source) == ["perflab.labs.lab01.not_here (line 4)", "perflab.labs.lab03.parity_problems (line 5)",
                               "perflab.labs.lab06.screen (line 6)"]
