"""A notebook released to students before the labs' checks, probes and measurements moved out of their
contract modules still runs, stays silent and grades as today's reference does.

`tests/fixtures/released/` holds student notebooks as nbgrader released them before the move (answers
blank). Their cells read names such as `lab03.parity_problems` or `lab06_measure.memory_vs_batch` that
now live elsewhere: the module they read them from answers them (`MOVED` and a module `__getattr__`),
warning once per name with a MovedNameWarning that no default filter shows, not even the one IPython
adds for a notebook's own code (nbgrader scores a test cell that writes to stderr 0).
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import labs_helpers as H
import nbformat
import pytest

from perflab.labs import build

RELEASED = H.REPO / "tests" / "fixtures" / "released"
LABS = ("lab03_amp", "lab06_together")
STUDENT = "released-copy"


def released(lab: str) -> nbformat.NotebookNode:
    return nbformat.read(RELEASED / f"{lab}.ipynb", as_version=4)


def _tree(source: str) -> ast.Module:
    """A cell's code as a tree, IPython magics and shell lines read as `pass`."""
    return ast.parse("\n".join("pass" if line.lstrip().startswith(("%", "!")) else line
                               for line in source.splitlines()))


def perflab_reads(nb: nbformat.NotebookNode) -> set[tuple[str, str]]:
    """(module, name): every name the notebook's code cells read from a `perflab.labs` module, by an
    attribute of an imported module (`lab03.parity_problems`) or a `from perflab.labs.lab03 import ...`."""
    trees = [_tree(cell.source) for cell in nb.cells if cell.cell_type == "code"]
    modules: dict[str, str] = {}
    reads: set[tuple[str, str]] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "perflab.labs":
                modules.update({a.asname or a.name: f"perflab.labs.{a.name}" for a in node.names})
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("perflab.labs."):
                reads.update((node.module, a.name) for a in node.names)
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                reads.add((modules[node.value.id], node.attr))
    return reads


def moved_reads(lab: str) -> list[tuple[str, str]]:
    """The names the released notebook reads from a module they moved out of."""
    return sorted((module, name) for module, name in perflab_reads(released(lab))
                  if name in getattr(importlib.import_module(module), "MOVED", {}))


def _python(code: str, *options: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    return subprocess.run([sys.executable, *options, "-c", code], capture_output=True, text=True, env=env,
                          cwd=H.REPO, timeout=300)


def _cell_code(reads: list[tuple[str, str]]) -> str:
    """What a released notebook's cell does with `reads`: import the modules, read each name as `mod.name`."""
    modules = sorted({module for module, _ in reads})
    lines = [f"import {module}" for module in modules]
    lines += [f"{module}.{name}" for module, name in reads]
    return "\n".join(lines) + "\nprint('read', len(" + repr(reads) + "), 'names')\n"


# ---------------------------------------------------------------------------------------------
# The names a released notebook reads


@pytest.mark.filterwarnings("ignore::perflab.labs.moved.MovedNameWarning")
@pytest.mark.parametrize("lab", LABS)
def test_every_name_a_released_notebook_reads_still_resolves(lab: str) -> None:
    reads = perflab_reads(released(lab))
    assert reads, f"{lab}: the released notebook reads nothing of perflab.labs?"
    missing = [f"{module}.{name}" for module, name in sorted(reads)
               if not hasattr(importlib.import_module(module), name)]
    assert not missing, f"{lab}: a notebook released before no longer finds {missing}"
    assert moved_reads(lab), f"{lab}: the released notebook reads no moved name; this test proves nothing"


@pytest.mark.filterwarnings("ignore::perflab.labs.moved.MovedNameWarning")
@pytest.mark.parametrize("lab", LABS)
def test_a_moved_name_is_the_object_that_lives_in_its_new_home(lab: str) -> None:
    for module, name in moved_reads(lab):
        old = importlib.import_module(module)
        home = importlib.import_module(old.MOVED[name])
        assert getattr(old, name) is getattr(home, name), f"{module}.{name}"
        assert name not in vars(old), f"{module}.{name} is defined there again: drop it from MOVED"


def test_reading_moved_names_in_a_notebooks_main_writes_nothing_to_stderr() -> None:
    """Default filters, plus the one IPython adds for code in __main__ (DeprecationWarning shown there):
    a released notebook's cells read every moved name they read, and nothing reaches stderr."""
    reads = sorted({read for lab in LABS for read in moved_reads(lab)})
    code = ("import warnings\n"
            "warnings.filterwarnings('default', category=DeprecationWarning, module='__main__')\n"
            + _cell_code(reads))
    run = _python(code)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr == "", run.stderr[-3000:]
    assert f"read {len(reads)} names" in run.stdout


def test_a_moved_name_warns_once_saying_where_it_lives_when_asked() -> None:
    """With pending deprecations shown (`-W always::PendingDeprecationWarning`), each moved name warns
    once, however often it is read, naming its new module."""
    code = ("from perflab.labs import lab03, lab06_measure\n"
            "lab03.parity_problems\nlab03.parity_problems\nlab06_measure.memory_vs_batch\n")
    run = _python(code, "-W", "always::PendingDeprecationWarning")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if "MovedNameWarning" in line]
    assert len(lines) == 2, run.stderr
    assert "perflab.labs.lab03.parity_problems moved to perflab.labs.lab03_checks.parity_problems" in lines[0]
    assert "perflab.labs.lab06_measure.memory_vs_batch moved to perflab.labs.lab06_memory" in lines[1]
    assert all("<string>" in line for line in lines), "the warning points at the reader, not the lookup"


# ---------------------------------------------------------------------------------------------
# A released notebook, answered with today's reference, run as a student runs it and graded for real


def answered(lab: str) -> nbformat.NotebookNode:
    """The released notebook with every answer cell holding today's reference solution."""
    from perflab import demo

    source = build.read_notebook(build.source_notebook(lab))
    release = released(lab)

    def answer_ids(nb: nbformat.NotebookNode) -> set[str]:
        return {H.nbgrader_meta(c)["grade_id"] for c in nb.cells if H.nbgrader_meta(c).get("solution")}

    assert answer_ids(release) <= answer_ids(source), answer_ids(release) - answer_ids(source)
    return demo.reference_notebook(source, release)


_AT_HOME: dict[str, nbformat.NotebookNode] = {}


@pytest.fixture(scope="module")
def at_home(tmp_path_factory, tiny_data):
    """The released notebook answered with today's reference, run once as a student runs it at home (tiny
    mode, saved with its outputs): the run the next two tests read, and the copy the second hands in."""
    def run(lab: str) -> tuple[nbformat.NotebookNode, Path]:
        # Under a parent of its own: lab 6 reads the results of the labs beside it, and is graded alone.
        folder = tmp_path_factory.getbasetemp() / "released-at-home" / lab / lab
        if lab not in _AT_HOME:
            from perflab import demo

            _AT_HOME[lab] = demo.home_run(answered(lab), folder, "tiny", name=f"{lab}.ipynb")
        return _AT_HOME[lab], folder / f"{lab}.ipynb"
    return run


def _verdict_code(cell: nbformat.NotebookNode) -> str | None:
    """The code of the last verdict a cell printed (`Verdict.describe`: "FAIL (below_bar): ..."), if any."""
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == "stdout")
    codes = re.findall(r"^(?:PASS|FAIL|INCONCLUSIVE) \((\w+)\):", text, re.MULTILINE)
    return codes[-1] if codes else None


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_a_released_notebook_runs_top_to_bottom_with_its_own_test_cells(lab: str, at_home) -> None:
    """As a student runs it before submitting: its own (released) visible test cells call the moved names;
    every cell runs, and no test cell writes to stderr. A verification cell whose re-measurement this host's
    timing decided (the verdict it printed names a code in `H.TIMED_CODES`) is reported, not failed."""
    nb, _ = at_home(lab)
    errors = {f"{H.nbgrader_meta(c).get('grade_id')}: {o.get('ename')}: {o.get('evalue', '')[:300]}": _verdict_code(c)
              for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"}
    H.only_timed_shortfalls(errors, lambda code: code, f"{lab} run at home")
    noisy = [f"{H.nbgrader_meta(c).get('grade_id')}: "
             + "".join(o.get("text", "") for o in c.get("outputs", []) if o.get("name") == "stderr")[:300]
             for c in nb.cells if H.nbgrader_meta(c).get("grade") and not H.nbgrader_meta(c).get("solution")
             and any(o.get("name") == "stderr" for o in c.get("outputs", []))]
    assert not noisy, noisy


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_a_released_notebook_with_todays_answers_grades_as_the_reference(lab: str, at_home) -> None:
    """Submitted to the lab's course and graded by the real pipeline against today's code, the released
    notebook, saved after it ran as a student hands it in, earns on every autograded cell what today's
    reference solution earns. A cell either run lost on a re-measurement the host's timing decided
    (`H.TIMED_CODES`) is compared as re-measured in both, not by its score: each run decided at home from
    its own noisy measurement (lab 6's screening may keep a loader worker in one run and not in the other)."""
    course = H.course_for(lab)
    run = H.autograde(course, lab, STUDENT, at_home(lab)[1])
    reference = H.graded_solution(lab)
    assert not run.errors(), run.errors()
    assert not run.stderr_test_cells(), run.stderr_test_cells()
    timed = run.timed_shortfalls().keys() | reference.timed_shortfalls().keys()
    earned = {s.grade_id: s.auto_score for s in run.autograded if s.grade_id not in timed}
    assert earned == {s.grade_id: s.auto_score for s in reference.autograded if s.grade_id not in timed}, (
        f"released: {run.shortfalls()}; reference: {reference.shortfalls()}")
    for graded in (run, reference):
        codes = {c.grade_id: c.code for c in graded.record.cells}
        assert all(codes.get(gid) for gid in timed), f"{graded.student}: {graded.shortfalls()}"


@pytest.mark.parametrize("lab", LABS)
def test_the_fixture_is_a_student_copy_as_released(lab: str) -> None:
    nb = released(lab)
    assert any(H.nbgrader_meta(c).get("grade_id") == "setup" for c in nb.cells), lab
    assert not any("BEGIN SOLUTION" in c.source or "BEGIN HIDDEN" in c.source for c in nb.cells), lab
    assert any("YOUR CODE HERE" in c.source for c in nb.cells), f"{lab}: its answer cells should be blank"
