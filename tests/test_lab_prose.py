"""No lab announces a result: a figure in prose is computed in the notebook or marked as the reference
machine's example, never a bare "measured ... 1.4x" a student reads before measuring it.

Three places are read with the same rule (`announced`):

- the notebooks' markdown;
- the text of every shipped lab module (`perflab/labs/**.py` that `perflab.bundle` ships, so not
  `hidden/`): each string constant, an f-string read whole with its values as placeholders. That is
  what a notebook prints, a function returns as text, an error or a check says, and a module-level
  table such as HARDWARE_NOTES. Docstrings and comments are left out: they are the source's notes for
  whoever reads the code, no notebook prints them, and a figure that is the reason for a constant
  belongs in docs/DESIGN.md. Source a notebook prints (`print(inspect.getsource(...))`) is read whole;
- what a notebook's setup cell prints, before anything is measured: its string literals, the text of
  each kit function it prints (`common.hardware_statement` rendered on a GPU, an Apple GPU and CPUs
  with and without bf16 units; any other, its own strings), and never the grader's bar (a calibrated
  figure, printed beside the student's own measurement instead).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted([*ROOT.glob("solutions/lab*/*.ipynb"), *ROOT.glob("labs/lab*/*.ipynb")])

_NUMBER = r"(?<![\w.])(?:about |~|≈)?\d+(?:[.,]\d+)?(?:\s*(?:-|–|to)\s*\d+(?:\.\d+)?)?\s*"
# A speed, a time or a share: what a measurement reports. "95% CI" names an interval, not a result.
SPEED = re.compile(_NUMBER + r"(?:x|×|%(?! CI)|s|ms|µs|us|min|minutes?|seconds?|samples/s|images/s)(?![\w/])")
SIZE = re.compile(_NUMBER + r"(?:KiB|MiB|GiB|KB|MB|GB)(?!\w)")
# Words that report what a run gave (a rule or a definition uses none of them).
REPORTED = re.compile(
    r"\b(?:measur\w*|on (?:a |this |one |two )?(?:\d+|two)[- ]cores?|on this (?:machine|CPU|GPU)|"
    r"gain(?:s|ed)?|faster|slower|speedup|took|takes|sat|costs?|saves?|saved|pays? after)\b", re.I)
MEASURED = re.compile(r"\bmeasur\w*", re.I)
# How a figure is marked as an example: "on the reference machine, for instance, ...".
MARKED = re.compile(r"\breference machine\b", re.I)
# Arithmetic on supposed values, not a result: "had the step saved, say, 0.1 ms ...".
SUPPOSED = re.compile(r"\b(?:say|suppose|supposing|imagine)\b,?", re.I)


def sentences(text: str) -> list[str]:
    """Markdown split into sentences, list items and table rows."""
    parts = re.split(r"(?<=[.!?;:])\s+(?=[A-Z(`*])|\n\s*\n|\n\s*[-*] |\n\|", text)
    return [" ".join(p.split()) for p in parts if p.strip()]


def announced(text: str) -> list[str]:
    """Sentences of `text` that state a measured figure without marking it as the reference machine's."""
    found = []
    for sentence in sentences(text):
        if MARKED.search(sentence) or SUPPOSED.search(sentence):
            continue
        if (SPEED.search(sentence) and REPORTED.search(sentence)) or (SIZE.search(sentence) and MEASURED.search(sentence)):
            found.append(sentence)
    return found


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("Measured on 2 cores (photo set), one or two workers made a step 1.4-1.5x faster.", True),
        ("On a 2-core CPU the workers then gain little or lose (measured 0.9-1.06x).", True),
        ("Compiling ResNet-18 training takes about 90 s on 2 cores and makes the step no faster.", True),
        ("Lab 4 measured 20-35% more step time.", True),
        ("The fit gave about 1.7 MiB per image, measured with saved-tensor hooks.", True),
        ("On the reference machine, for instance, one worker made a step 1.4-1.5x faster.", False),
        ("Had the step saved, say, 0.1 ms at 20 s of compile, it would pay after 200,000 steps.", False),
        ("The bar is 1.10x, a named constant of the grader.", False),
        ("Each bar carries the 95% CI of the cumulative speedup.", False),
        ("Your sweep shows how much the overlap gains here.", False),
    ],
)
def test_the_scan_tells_an_announced_result_from_an_example(text: str, flagged: bool) -> None:
    assert bool(announced(text)) is flagged, announced(text)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_markdown_cell_announces_a_measured_figure(notebook: Path) -> None:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = [f"cell {i}: {sentence}" for i, cell in enumerate(cells) if cell["cell_type"] == "markdown"
             for sentence in announced("".join(cell["source"]))]
    assert not found, (f"{notebook.relative_to(ROOT)} states measured figures a student has not measured; compute "
                       "them in the notebook or mark them 'on the reference machine, for instance':\n"
                       + "\n".join(found))


LABS = ("lab01_measure", "lab02_feed", "lab03_amp", "lab04_memory", "lab05_compile", "lab06_together")


@pytest.mark.parametrize("lab", LABS)
def test_no_hardware_note_announces_a_result(lab: str) -> None:
    """The note a lab prints at its top, before anything is measured, says what the hardware offers,
    not what it will give ("compiling costs about 90 s and gains nothing")."""
    from perflab.labs import common

    notes = common.lab_hardware_notes(lab)
    assert notes, f"{lab} has no hardware notes"
    found = [f"{device}: {sentence}" for device, note in notes.items() for sentence in announced(note)]
    found += [f"{device}: {note}" for device, note in notes.items() if re.search(r"\bexpect\b", note, re.I)]
    assert not found, f"{lab}'s HARDWARE_NOTES announce results:\n" + "\n".join(found)


# ---------------------------------------------------------------------------------------------
# The text of the shipped lab modules


def shipped_lab_modules() -> list[Path]:
    """The lab modules the student bundle holds (`perflab.bundle`: everything but GRADER_ONLY)."""
    from perflab import bundle

    def ships(path: Path) -> bool:
        rel = path.relative_to(ROOT).as_posix()
        return not any(rel == part or rel.startswith(part + "/") for part in bundle.GRADER_ONLY)

    return sorted(p for p in (ROOT / "perflab" / "labs").rglob("*.py")
                  if ships(p) and "__pycache__" not in p.parts)


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                found.add(id(first.value))
    return found


def _fstring(node: ast.JoinedStr) -> str:
    return "".join(part.value if isinstance(part, ast.Constant) else "{...}" for part in node.values)


def texts(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every string in `tree` but docstrings; an f-string whole, its values as {...}."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values)
            yield node.lineno, _fstring(node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


def test_the_module_scan_reads_strings_not_docstrings() -> None:
    tree = ast.parse(textwrap.dedent('''
        """Measured on 2 cores, workers gained 1.4x."""
        NOTE = "workers gain 1.4-1.5x here"
        def f(n):
            """It took 90 s."""
            # measured: 90 s
            return f"measured on {n} cores: 1.3x faster"
    '''))
    found = [text for _, text in texts(tree)]
    assert "workers gain 1.4-1.5x here" in found and "measured on {...} cores: 1.3x faster" in found
    assert not any("90 s" in text or "1.4x" in text for text in found)
    assert [announced(text) for text in found if "1.3x" in text] == [["measured on {...} cores: 1.3x faster"]]


def test_the_bundle_ships_the_modules_read_here() -> None:
    modules = {p.relative_to(ROOT).as_posix() for p in shipped_lab_modules()}
    assert {"perflab/labs/lab02/__init__.py", "perflab/labs/lab03/__init__.py", "perflab/labs/lab05/__init__.py"} <= modules
    assert not any("/judges/" in m for m in modules)


@pytest.mark.parametrize("module", shipped_lab_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_shipped_module_text_announces_a_measured_figure(module: Path) -> None:
    found = [f"line {line}: {sentence}" for line, text in texts(ast.parse(module.read_text(encoding="utf-8")))
             for sentence in announced(text)]
    assert not found, (f"{module.relative_to(ROOT)} ships text that states measured figures a student has not "
                       "measured; print them beside the student's measurement, mark them 'on the reference "
                       "machine, for instance', or keep the reason for a constant in docs/DESIGN.md:\n"
                       + "\n".join(found))


# ---------------------------------------------------------------------------------------------
# What a notebook prints


def _cells(lab: str) -> list[dict[str, Any]]:
    notebook = ROOT / "solutions" / lab / f"{lab}.ipynb"
    return json.loads(notebook.read_text(encoding="utf-8"))["cells"]


def _grade_id(cell: dict[str, Any]) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _code_cells(lab: str) -> list[tuple[int, str | None, ast.Module]]:
    """(index, grade_id, parsed source) of each code cell (magics and shell lines dropped)."""
    found = []
    for i, cell in enumerate(_cells(lab)):
        if cell["cell_type"] == "code":
            source = "\n".join(line for line in "".join(cell["source"]).splitlines()
                               if not line.lstrip().startswith(("%", "!")))
            found.append((i, _grade_id(cell), ast.parse(source)))
    return found


def _shown(tree: ast.AST) -> list[ast.expr]:
    """The arguments of every print() and display() call in `tree`."""
    return [arg for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("print", "display") for arg in node.args]


def _kit_names(tree: ast.AST) -> dict[str, Any]:
    """The perflab modules and objects a cell imports, by the name it binds them to."""
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "perflab":
            for alias in node.names:
                try:
                    value = importlib.import_module(f"{node.module}.{alias.name}")
                except ModuleNotFoundError:
                    value = getattr(importlib.import_module(node.module), alias.name)
                names[alias.asname or alias.name] = value
    return names


def _machines() -> list[Any]:
    """A GPU, an Apple GPU, and CPUs with and without bf16 units: every note a lab can print."""
    from perflab import env

    here = env.machine_info()
    kinds = [("cuda", "NVIDIA H100", False), ("mps", "Apple M2", False), ("cpu", "a CPU", True),
             ("cpu", "a CPU", False)]
    return [dataclasses.replace(here, device=device, device_name=name, cpu_bf16=bf16) for device, name, bf16 in kinds]


def _hardware_statements(lab: str) -> list[str]:
    from perflab.labs import common

    return [common.hardware_statement(lab, info) for info in _machines()]


# Kit functions a setup cell prints whose text is not all in their own strings: rendered on every machine.
RENDERED: dict[str, Callable[[str], list[str]]] = {"perflab.labs.common.hardware_statement": _hardware_statements}


def setup_output(lab: str) -> list[str]:
    """What `lab`'s setup cell can print: its literals and the text of each kit function it prints."""
    (tree,) = [tree for _, grade_id, tree in _code_cells(lab) if grade_id == "setup"]
    kit = _kit_names(tree)
    out: list[str] = []
    for arg in _shown(tree):
        out += [text for _, text in texts(ast.Expression(arg))]
        for call in ast.walk(arg):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and isinstance(call.func.value, ast.Name) and call.func.value.id in kit):
                continue
            function = getattr(kit[call.func.value.id], call.func.attr)
            name = f"{function.__module__}.{function.__qualname__}"
            out += RENDERED[name](lab) if name in RENDERED else function_text(function)
    return out


def function_text(function: Callable[..., Any]) -> list[str]:
    """The strings a kit function can print: its own, and those of the module-level tables it reads
    (lab 3's HARDWARE_EXPECTATIONS for `hardware_expectations`)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(function)))
    module = ast.parse(Path(inspect.getsourcefile(function) or "").read_text(encoding="utf-8"))
    read = {node.id for node in ast.walk(body) if isinstance(node, ast.Name)}
    tables = [node for node in module.body if isinstance(node, (ast.Assign, ast.AnnAssign))
              and any(isinstance(t, ast.Name) and t.id in read
                      for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
    return [text for tree in (body, *tables) for _, text in texts(tree)]


def test_the_setup_scan_renders_the_hardware_statement() -> None:
    out = setup_output("lab02_feed")
    notes = importlib.import_module("perflab.labs.lab02").HARDWARE_NOTES
    assert all(any(note in text for text in out) for note in notes.values())


@pytest.mark.parametrize("lab", LABS)
def test_no_setup_cell_prints_a_measured_figure(lab: str) -> None:
    found = [sentence for text in setup_output(lab) for sentence in announced(text)]
    assert not found, (f"{lab}'s setup cell prints measured figures before the student measures anything:\n"
                       + "\n".join(found))


@pytest.mark.parametrize("lab", LABS)
def test_no_setup_cell_prints_the_graders_bar(lab: str) -> None:
    """The bar is a calibrated figure: it prints beside the student's measurement, not before it."""
    (tree,) = [tree for _, grade_id, tree in _code_cells(lab) if grade_id == "setup"]
    bars = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call) and "expectation" in ast.unparse(node.value.func).lower()
            and "expectation_name" not in ast.unparse(node.value.func)
            for target in node.targets if isinstance(target, ast.Name)}
    found = [ast.unparse(arg) for arg in _shown(tree)
             if bars & {n.id for n in ast.walk(arg) if isinstance(n, ast.Name)}
             or re.search(r"\b(?:threshold|hardware_expectations)\b", ast.unparse(arg))]
    assert not found, f"{lab}'s setup cell prints the grader's bar before anything is measured: {found}"


def test_lab03_prints_its_hardware_table_beside_the_students_comparison() -> None:
    """What each kind of hardware gives, and the bar, print in the cell that measures COMPARISONS: after
    the prediction, beside the student's own figures."""
    cells = _code_cells("lab03_amp")
    predicted = next(i for i, grade_id, _ in cells if grade_id == "predict_amp")
    measured = next(i for i, _, tree in cells if "COMPARISONS" in {
        t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)})
    printed = [i for i, _, tree in cells if any("hardware_expectations" in ast.unparse(a) for a in _shown(tree))]
    assert printed == [measured] and predicted < measured


def _resolve(node: ast.expr, names: dict[str, Any]) -> Any:
    """The kit object a dotted name (`lab01.preprocess_leaky`, `BrokenBlock`) stands for."""
    if isinstance(node, ast.Name):
        return names[node.id]
    if isinstance(node, ast.Attribute):
        return getattr(_resolve(node.value, names), node.attr)
    raise ValueError(f"not a dotted name: {ast.unparse(node)}")


def test_no_source_a_notebook_prints_announces_a_measured_figure() -> None:
    """Lab 1 prints the leaky preprocessing step's source, lab 5 BrokenBlock's: comments and all."""
    shown, found = [], []
    for lab in LABS:
        cells = _code_cells(lab)
        setup = next(tree for _, grade_id, tree in cells if grade_id == "setup")
        for _, _, tree in cells:
            names = {**_kit_names(setup), **_kit_names(tree)}
            for arg in _shown(tree):
                if isinstance(arg, ast.Call) and ast.unparse(arg.func) == "inspect.getsource":
                    obj = _resolve(arg.args[0], names)
                    shown.append(obj.__qualname__)
                    found += [f"{lab}, {obj.__qualname__}: {s}" for s in announced(inspect.getsource(obj))]
    assert {"preprocess_leaky", "BrokenBlock"} <= set(shown)
    assert not found, "a notebook prints kit source that states measured figures:\n" + "\n".join(found)


@pytest.mark.parametrize("notebook", sorted(ROOT.glob("solutions/lab*/*.ipynb")), ids=lambda p: p.parent.name)
def test_every_lab_states_its_laptop_time_as_the_reference_machines_example(notebook: Path) -> None:
    """A student sees before starting how long the lab takes, as one machine's example (measured: `make lab
    LAB=... MODE=laptop`), and the lab's last cell prints its own time here (`common.elapsed_statement`)."""
    doc = json.loads(notebook.read_text(encoding="utf-8"))
    text = " ".join("".join(c["source"]) for c in doc["cells"] if c["cell_type"] == "markdown")
    stated = re.search(r"\*\*How long\.\*\* On the reference machine .*? in laptop mode in (\d+ min )?\d+ s", " ".join(text.split()))
    assert stated, f"{notebook.name}: no laptop-mode time stated as the reference machine's example"
    minutes = re.search(r"in laptop mode in (?:(\d+) min )?(\d+) s", stated.group(0))
    assert int(minutes.group(1) or 0) * 60 + int(minutes.group(2)) < 600  # every lab under 10 minutes on 2 cores
    code = "".join("".join(c["source"]) for c in doc["cells"] if c["cell_type"] == "code")
    assert "elapsed_statement" in code
