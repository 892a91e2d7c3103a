"""The package's shape, from its own source: no circle in the import graph, no module over 600 lines.

The graph is built from every `import` and `from ... import` the modules write (at any depth: an
import inside a function is still a dependency), relative imports resolved, each name resolved to the
deepest perflab module it names (`from perflab.verify import decide` depends on the submodule, `from
perflab.verify import Side` on the package). A circle means two modules cannot be read, tested or changed apart.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "perflab"
MAX_LINES = 600


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _resolve(module: str | None, importer: str, level: int, is_package: bool) -> str:
    if not level:
        return module or ""
    parts = importer.split(".") if is_package else importer.split(".")[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, *([module] if module else [])])


def import_graph() -> dict[str, set[str]]:
    """perflab module -> the perflab modules it imports."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):  # `from pkg import sub` depends on sub; `import X` on pkg
                base = _resolve(node.module, name, node.level, is_package)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                           for alias in node.names]
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_cycle_finder_finds_a_circle_and_a_clean_graph_has_none():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_graph_sees_imports_inside_functions_and_relative_ones():
    graph = import_graph()
    assert "perflab.verify.protocol" in graph and graph["perflab.verify.protocol"]
    assert any(target.startswith("perflab.") for targets in graph.values() for target in targets)


def test_no_circle_in_perflabs_import_graph():
    found = cycles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_module_over_600_lines():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by what they do): {long}"


# A lab is named only by its own folder (perflab/labs/labNN/): the core reads the labs' manifests
# (`perflab.labs.registry`). Docstrings and comments may give a lab as an example; code may not.
LAB_NAME = re.compile(r"lab[0-9][0-9]")
LABS_PACKAGE = PACKAGE / "labs"


def lab_owned(path: Path) -> bool:
    """A lab's own module: anything in its folder, `perflab/labs/labNN/` (judges included). The shared
    modules beside the folders (the registry, the notebook builder, homework, common) are core."""
    rel = path.relative_to(LABS_PACKAGE).parts if LABS_PACKAGE in path.parents else ()
    return len(rel) > 1 and bool(LAB_NAME.fullmatch(rel[0]))


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are a module's, class's or function's docstring."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def lab_names_in(path: Path) -> list[str]:
    """Where the code of `path` imports a lab's module or holds a string naming a lab, as 'line: what'."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module or ''}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names = [node.value]
        else:
            continue
        found += [(node.lineno, name) for name in names if LAB_NAME.search(name)]
    return [f"{line}: {name!r}" for line, name in sorted(found)]


def test_the_lab_scan_finds_an_import_and_a_constant_but_no_docstring(tmp_path):
    module = tmp_path / "core.py"
    module.write_text('"""Grades lab03_amp."""\nfrom perflab.labs import lab02\nimport perflab.labs.lab04.measure\n'
                      'def f():\n    """lab05."""\n    # lab06 in a comment\n    return f"{1}lab06_together"\n',
                      encoding="utf-8")
    assert lab_names_in(module) == ["2: 'perflab.labs.lab02'", "3: 'perflab.labs.lab04.measure'",
                                    "7: 'lab06_together'"]


def test_no_module_outside_the_labs_names_a_lab():
    found = [f"{path.relative_to(PACKAGE.parent)}:{hit}"
             for path in sorted(PACKAGE.rglob("*.py")) if not lab_owned(path)
             for hit in lab_names_in(path)]
    assert not found, f"{len(found)} places outside the labs' own modules name a lab (read the manifests):\n" + "\n".join(found)
    assert lab_owned(LABS_PACKAGE / "lab01" / "mystery.py") and lab_owned(LABS_PACKAGE / "lab01" / "judges" / "mystery.py")
    assert not lab_owned(LABS_PACKAGE / "homework.py")


def test_every_lab_is_one_folder_of_the_same_shape():
    """The kit's six labs are laid out as a course's seventh is: a folder with its public module, its
    probes and its grader-only judges, and no lab module outside its folder."""
    folders = sorted(p for p in LABS_PACKAGE.iterdir() if p.is_dir() and LAB_NAME.fullmatch(p.name))
    assert len(folders) >= 6
    for folder in folders:
        assert {"__init__.py", "probes.py", "checks.py"} <= {p.name for p in folder.glob("*.py")}, folder
        assert (folder / "judges" / "__init__.py").is_file(), folder
    assert not [p.name for p in LABS_PACKAGE.glob("*.py") if LAB_NAME.match(p.name)]
