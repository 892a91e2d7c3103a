"""What can be told about a submission before it runs: is it a notebook, are its graded cells
there, was a locked cell edited, does its code patch the clock or perflab, hook the kernel, steer the
grader through environment variables, or read outside its folder.

`inspect_submission(raw_bytes, release)` returns the notebook to grade (upgraded to nbformat 4)
or None, and `Finding`s. A finding is a line for the student's feedback; `flag=True` findings
mark the submission for an instructor's review; `fatal=True` means there is nothing to run.
None of this decides a score: the grader's judges do, from what the notebook's answers return, and
claimed speedups are held to the grader's own re-measurement only (never to how a claim is written).
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from perflab.labs import registry

# Modules whose attributes a notebook must not reassign: the clocks timing reads, and perflab.
GUARDED = ("time", "timeit", "perflab", "torch.cuda", "torch.mps", "torch.utils.benchmark", "torch._dynamo", "torch.compile",
           "builtins", "sys.modules", "datetime")
# Attributes through which a notebook hooks the kernel that runs it (or the interpreter under it).
HOOK_ATTRS = ("ast_transformers", "input_transformers_post", "input_transformers_cleanup",
              "input_transformer_manager", "set_custom_exc", "register_magic_function", "settrace",
              "setprofile", "addaudithook", "meta_path", "path_hooks", "excepthook", "displayhook")
# Environment variables that steer perflab, Python, nbgrader or torch: a notebook has no business setting them.
WATCHED_ENV = re.compile(r"^(PERFLAB_|PYTHON|NBGRADER_|TORCH)")
# Paths a notebook reads only to reach what is not its own: the grader's files, the kit's checkout.
OUTSIDE = re.compile(r"(^|/)\.\.(/|$)|^[/~]|gradebook|solutions/|autograder|\.git\b|\bjudges\b|"
                     r"observations")
_MAGIC = re.compile(r"^\s*[%!]")


@dataclass(frozen=True)
class Finding:
    """One thing noticed about a submission, in words a student can act on."""

    cell: str  # a grade id, or "cell N" (1-based) for a cell without one, or "notebook"
    message: str
    flag: bool = False
    fatal: bool = False

    def line(self) -> str:
        return f"{self.cell}: {self.message}" if self.cell != "notebook" else self.message

    def to_dict(self) -> dict[str, Any]:
        return {"cell": self.cell, "message": self.message, "flag": self.flag, "fatal": self.fatal}


def grade_id(cell: Any) -> str | None:
    """The cell's nbgrader grade id, or None (also for malformed metadata)."""
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    nbg = meta.get("nbgrader") if isinstance(meta, dict) else None
    gid = nbg.get("grade_id") if isinstance(nbg, dict) else None
    return gid if isinstance(gid, str) else None


CELL_TYPES = ("code", "markdown", "raw")


def repair_structure(nb: Any) -> list[Finding]:
    """Make `nb` safe to read: cells that are not cells are removed, sources made text, malformed
    nbgrader metadata dropped; one finding per repair, naming the cell."""
    findings: list[Finding] = []
    kept = []
    for index, cell in enumerate(nb.get("cells") or [], start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") not in CELL_TYPES:
            findings.append(Finding(f"cell {index}", "this is not a notebook cell (no known cell_type); it was left out"))
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(x, str) for x in source):
            cell["source"] = "".join(source)
        elif not isinstance(source, str):
            findings.append(Finding(f"cell {index}", f"its source is not text ({type(source).__name__}); it was "
                                    "left out"))
            continue
        meta = cell.get("metadata")
        if not isinstance(meta, dict):
            cell["metadata"] = meta = {}
        nbg = meta.get("nbgrader")
        if nbg is not None and (not isinstance(nbg, dict) or not isinstance(nbg.get("grade_id", ""), str)):
            del meta["nbgrader"]
            findings.append(Finding(f"cell {index}", f"its nbgrader metadata is malformed ({type(nbg).__name__}); "
                                    "it ran as an ordinary cell", flag=True))
        if cell["cell_type"] == "code" and not isinstance(cell.get("outputs", []), list):
            cell["outputs"] = []
        kept.append(cell)
    nb["cells"] = kept
    return findings


def inspect_submission(raw: bytes, release: Any) -> tuple[Any | None, list[Finding]]:
    """Read a submitted notebook and compare it with the released one (an nbformat v4 node)."""
    import nbformat

    findings: list[Finding] = []
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return None, [Finding("notebook", f"the file is not a notebook (not UTF-8 text: {exc.reason} at byte "
                              f"{exc.start}); download it again from Jupyter (File > Download) and resubmit",
                              fatal=True)]
    except json.JSONDecodeError as exc:
        return None, [Finding("notebook", f"the file is not a notebook (not valid JSON: {exc.msg} at line "
                              f"{exc.lineno} column {exc.colno}); download it again from Jupyter "
                              "(File > Download) and resubmit", fatal=True)]
    if not isinstance(doc, dict) or not ("cells" in doc or "worksheets" in doc):
        return None, [Finding("notebook", "the file is JSON but not a Jupyter notebook (it has no cells); "
                              "submit the lab's .ipynb file", fatal=True)]
    if not isinstance(doc.get("cells", []), list):
        return None, [Finding("notebook", "the file is JSON but its cells are not a list; submit the lab's "
                              ".ipynb file", fatal=True)]
    if not isinstance(doc.get("metadata", {}), dict):
        doc["metadata"] = {}
    version = doc.get("nbformat")
    if not isinstance(version, int) or version > 4 or version < 3:
        return None, [Finding("notebook", f"unsupported notebook format nbformat={version!r} "
                              "(expected 4); save it with a current Jupyter and resubmit", fatal=True)]
    if version == 4:
        findings += repair_structure(doc)
    try:
        nb = nbformat.reads(json.dumps(doc), as_version=4)
    except Exception as exc:  # nbformat raises a handful of types for malformed documents
        return None, [Finding("notebook", f"the notebook could not be read ({type(exc).__name__}: {exc}); "
                              "resubmit the lab's .ipynb file", fatal=True)]
    if version < 4:
        findings.append(Finding("notebook", f"saved in the old nbformat {version}; converted to nbformat 4 "
                                "before grading"))
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        findings.append(Finding("notebook", f"the notebook does not follow the nbformat schema "
                                f"({str(exc.message)[:120]}); graded as far as it could be read"))
    findings += _compare_cells(nb, release)
    findings += scan_notebook(nb, release)
    _demote_duplicates(nb)
    return nb, findings


def _demote_duplicates(nb: Any) -> None:
    """Later copies of a graded cell become ordinary cells (nbgrader cannot grade duplicates)."""
    seen: set[str] = set()
    for cell in nb.cells:
        gid = grade_id(cell)
        if gid in seen:
            del cell.metadata["nbgrader"]
        elif gid:
            seen.add(gid)


def _compare_cells(nb: Any, release: Any) -> list[Finding]:
    out: list[Finding] = []
    released = {grade_id(c): c for c in release.cells if grade_id(c)}
    counts = Counter(grade_id(c) for c in nb.cells if grade_id(c))
    for gid, cell in released.items():
        meta = cell.metadata.nbgrader
        if counts[gid] == 0:
            what = "graded cell" if meta.get("grade") else "answer cell"
            out.append(Finding(gid, f"the {what} was deleted (or its nbgrader metadata removed); "
                               "it scores 0", flag=bool(meta.get("locked"))))
        elif counts[gid] > 1:
            out.append(Finding(gid, f"the cell appears {counts[gid]} times; the first copy was graded, "
                               "the others ran as ordinary code"))
    seen: set[str] = set()
    for cell in nb.cells:
        gid = grade_id(cell)
        if not gid or gid in seen or gid not in released:
            continue
        seen.add(gid)
        original = released[gid]
        if original.metadata.nbgrader.get("locked") and cell.source.strip() != original.source.strip():
            out.append(Finding(gid, "this locked cell was edited; the original was restored before grading",
                               flag=True))
    for gid in counts:
        if gid not in released:
            out.append(Finding(gid, "a cell carries a grade id the lab does not have; it ran as ordinary code"))
    return out


def scan_notebook(nb: Any, release: Any) -> list[Finding]:
    """Static checks of the code a student could edit (cells not locked in the release)."""
    locked = {grade_id(c) for c in release.cells if grade_id(c) and c.metadata.nbgrader.get("locked")}
    out: list[Finding] = []
    known: dict[str, str] = {}  # names imported by the cells above (locked ones too): one kernel runs them all
    for index, cell in enumerate(nb.cells, start=1):
        if cell.cell_type != "code":
            continue
        if grade_id(cell) not in locked:
            name = grade_id(cell) or f"cell {index}"
            out += [Finding(name, message, flag=True) for message in scan_code(cell.source, known)]
        known.update(_aliases(_parse(cell.source) or ast.Module(body=[], type_ignores=[])))
    return out


def _parse(source: str) -> ast.AST | None:
    """A cell's code as a tree (IPython magics and shell lines read as `pass`); None if it does not parse."""
    text = "\n".join("pass" if _MAGIC.match(line) else line for line in source.splitlines())
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def scan_code(source: str, known: dict[str, str] | None = None) -> list[str]:
    """Messages for clock or perflab patching, kernel hooks, steering environment variables, reads
    outside the notebook's folder in one cell's code (with the line). `known`: names the cells before
    it imported (`lab02` -> `perflab.labs.lab02`), which this cell may use without importing them."""
    messages = _scan_magics(source)
    tree = _parse(source)
    if tree is None:
        return messages
    aliases = {**(known or {}), **_aliases(tree)}
    messages += _scan_hooks_env_paths(tree, aliases)
    messages += _scan_planted_truth(tree, aliases)
    for node in ast.walk(tree):
        line = f"line {getattr(node, 'lineno', '?')}: "
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):  # `x *= 10` patches if x is guarded
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            dotted = _dotted(target, aliases)
            if dotted and isinstance(target, (ast.Attribute, ast.Subscript)) and _guarded(dotted):
                messages.append(line + f"the code replaces {dotted}; timing and perflab must not be patched "
                                "(the autograder re-measures in a fresh process, and flags this)")
            elif (isinstance(target, ast.Name) and aliases.get(target.id, "").startswith("perflab.")
                  and not isinstance(node, ast.Delete) and not _imports(node)):
                messages.append(line + f"the code rebinds {target.id}, which stands for {aliases[target.id]}; "
                                "perflab must not be replaced (the grader uses its own, and flags this)")
        if isinstance(node, ast.Call):
            func = _dotted(node.func, aliases) or ""
            if func in ("setattr", "delattr") and node.args:
                owner = _dotted(node.args[0], aliases)
                if owner and _guarded(owner + "."):
                    messages.append(line + f"the code calls {func} on {owner}; timing and perflab must not be patched")
            if func.endswith("patch") or func.endswith("patch.object") or func.endswith(".setattr"):
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                owner = _dotted(node.args[0], aliases) if node.args else None
                if any(_guarded(n) for n in names) or (owner and _guarded(owner + ".")):
                    messages.append(line + f"the code patches {names[0] if names else owner} with {func}")
    return list(dict.fromkeys(messages))


def _scan_magics(source: str) -> list[str]:
    out = []
    for number, line in enumerate(source.splitlines(), 1):
        match = re.match(r"^\s*%+\s*(env|set_env)\s+([A-Za-z_][A-Za-z0-9_]*)", line)
        if match and WATCHED_ENV.match(match.group(2)):
            out.append(f"line {number}: the code sets the environment variable {match.group(2)} "
                       "(it steers perflab, Python or nbgrader; flagged for review)")
    return out


def _scan_hooks_env_paths(tree: ast.AST, aliases: dict[str, str]) -> list[str]:
    """Kernel hooks, environment variables that steer the grader, and paths outside the notebook's folder."""
    out = []
    for node in ast.walk(tree):
        line = f"line {getattr(node, 'lineno', '?')}: "
        if isinstance(node, ast.Attribute) and node.attr in HOOK_ATTRS:
            out.append(line + f"the code installs kernel hooks ({node.attr}); the grader checks answers in its "
                       "own process, so hooks change nothing, and they are flagged for review")
        if isinstance(node, ast.Call):
            func = _dotted(node.func, aliases) or ""
            if func.endswith("events.register"):
                out.append(line + "the code installs kernel hooks (events.register); flagged for review")
            keys = [a.value for a in node.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if func in ("os.putenv", "os.unsetenv", "os.environ.setdefault", "os.environ.pop") and (
                    not keys or WATCHED_ENV.match(keys[0])):
                out.append(line + f"the code sets the environment variable {keys[0] if keys else '(computed)'} "
                           "(it steers perflab, Python or nbgrader; flagged for review)")
            if func == "os.environ.update":
                out.append(line + "the code changes environment variables (os.environ.update); flagged for review")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and _dotted(target.value, aliases) == "os.environ":
                    key = target.slice.value if isinstance(target.slice, ast.Constant) else None
                    if not isinstance(key, str) or WATCHED_ENV.match(key):
                        out.append(line + f"the code sets the environment variable {key or '(computed)'} "
                                   "(it steers perflab, Python or nbgrader; flagged for review)")
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 300
                and OUTSIDE.search(node.value) and not node.value.startswith(("/dev/null", "//"))):
            out.append(line + f"the code reads outside its folder ({node.value[:60]!r}); a notebook works "
                       "in its own folder (flagged for review)")
        if isinstance(node, ast.Attribute) and node.attr == "__file__":
            owner = _dotted(node.value, aliases) or ""
            if owner.split(".")[0] == "perflab":
                out.append(line + "the code reads outside its folder (the perflab package's own files); "
                           "flagged for review")
    return out


# The ways into what lab 1's mystery pipeline carries: the kit's renderer (any id's pipeline, a classmate's
# to diff, or a copy with the planted code tracked or left out: `_render` tells where each snippet lands),
# its draw, its snippets and its clean template. A diagnosis comes from measurements, and a notebook that
# reaches for these is reviewed by a person. The kit returns no planted truth (the grader recomputes it),
# and the names a notebook written for an older kit would read (`draw`, `light_dose`, `Planted`,
# `CATALOGUE`, a case's `.planted`) are flagged too. Writing, loading and measuring the student's own
# pipeline (lab01_mystery, mystery.student_id) are the lab's own tools.
PLANTED_TRUTH = ("perflab.mystery.for_student", "perflab.mystery.planted_step", "perflab.mystery.Mystery",
                 "perflab.mystery._render", "perflab.mystery._draw", "perflab.mystery._plan",
                 "perflab.mystery._light", "perflab.mystery._doses", "perflab.mystery.catalogue",
                 "perflab.mystery.template", "perflab.mystery.draw", "perflab.mystery.Planted",
                 "perflab.mystery.CATALOGUE", "perflab.mystery.light_dose")
PLANTED_ATTRS = frozenset({"planted", "accepted_lines", "helper_lines", "dose"})
# Any private name of perflab.mystery is the renderer's inside, not a tool of the lab; one of a module a
# lab's manifest lists in `private_modules` (lab01_mystery, its log of what the notebook measured: a
# finding's saving counts only as measured) is that lab's inside.
PLANTED_PRIVATE = ("perflab.mystery._",
                   *(f"{module}._" for lab in registry.manifests() for module in lab.private_modules))


def _reaches_truth(dotted: str) -> bool:
    return (any(dotted == name or dotted.startswith(name + ".") for name in PLANTED_TRUTH)
            or dotted.startswith(PLANTED_PRIVATE))


IMPORTERS = frozenset({"importlib.import_module", "__import__", "importlib.__import__", "builtins.__import__"})


def _literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _imports(node: ast.AST) -> bool:
    """`name = importlib.import_module("...")`: an import spelled as a call, not a rebinding."""
    return (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and (_dotted(node.value.func, {}) or "") in (*IMPORTERS, "import_module"))


def _scan_computed_reach(tree: ast.AST, aliases: dict[str, str]) -> list[str]:
    """A module or a perflab attribute reached by a name the code computes (`import_module("perflab." +
    "mys" + "tery")`, `getattr(perflab_module, name)`, `sys.modules[key]`): what a text scan cannot read,
    a person does."""
    out = []
    for node in ast.walk(tree):
        line = f"line {getattr(node, 'lineno', '?')}: "
        if isinstance(node, ast.Call):
            func = _dotted(node.func, aliases) or ""
            first = node.args[0] if node.args else None
            if func in IMPORTERS and not _literal(first):
                out.append(line + f"the code imports a module whose name it computes ({func}); flagged for review")
            owner = _dotted(node.args[0], aliases) if func == "getattr" and len(node.args) >= 2 else None
            if owner and _literal(node.args[1]) and _reaches_truth(f"{owner}.{node.args[1].value}"):
                out.append(line + f"the code reads what perflab planted in the mystery pipeline "
                           f"({owner}.{node.args[1].value}); a diagnosis comes from your measurements (flagged for review)")
            if (func == "getattr" and len(node.args) >= 2 and not _literal(node.args[1])
                    and (_dotted(node.args[0], aliases) or "").split(".")[0] in ("perflab", "sys")):
                out.append(line + "the code reads an attribute of perflab whose name it computes (getattr); "
                           "flagged for review")
        if (isinstance(node, ast.Subscript) and _dotted(node.value, aliases) == "sys.modules"
                and not _literal(node.slice)):
            out.append(line + "the code reads sys.modules by a computed name; flagged for review")
        if _literal(node) and _reaches_truth(node.value):
            out.append(line + f"the code names what perflab planted in the mystery pipeline ({node.value!r}); "
                       "a diagnosis comes from your measurements (flagged for review)")
    return out


def _scan_planted_truth(tree: ast.AST, aliases: dict[str, str]) -> list[str]:
    out = _scan_computed_reach(tree, aliases)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Attribute, ast.Name)):
            continue
        dotted = _dotted(node, aliases) or ""
        if _reaches_truth(dotted) or (
                isinstance(node, ast.Attribute) and node.attr in PLANTED_ATTRS):
            out.append(f"line {getattr(node, 'lineno', '?')}: the code reads what perflab planted in the "
                       f"mystery pipeline ({dotted or node.attr}); a diagnosis comes from your measurements "
                       "(flagged for review)")
    return list(dict.fromkeys(out))


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the module or object it stands for (`import time as t` gives t -> time)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = alias.name
                else:
                    out[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):  # `m = importlib.import_module("perflab.mystery")`: m stands for it too
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and node.value.args and _literal(node.value.args[0])
                and (_dotted(node.value.func, out) or "") in IMPORTERS):
            out[node.targets[0].id] = node.value.args[0].value
    return out


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            key = node.slice
            parts.append(str(key.value) if isinstance(key, ast.Constant) else "[...]")
            node = node.value
        elif isinstance(node, ast.Name):
            parts.append(aliases.get(node.id, node.id))
            return ".".join(reversed(parts))
        else:
            return None


def _guarded(dotted: str) -> bool:
    return any(dotted == g or dotted.startswith(g + ".") for g in GUARDED) and "." in dotted
