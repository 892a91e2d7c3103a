"""The student bundle (`python -m perflab.bundle`) carries the labs and the package, and leaks nothing:
no solution, no hidden test, no model answer, no instructor folder."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from perflab import bundle

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "solutions"
# A solution line shorter than this (`return x`, `else:`) says nothing about the answer and may
# appear in any Python file; longer ones are the answer itself.
MIN_SECRET_LINE = 30
# Consecutive answer lines that, found in the same order in a shipped file, mean a copied answer.
COPY_RUN = 3
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "BEGIN MARK SCHEME")


def _blocks(source: str) -> list[str]:
    """Lines inside nbgrader's BEGIN/END SOLUTION and BEGIN/END HIDDEN TESTS blocks."""
    inside, out = False, []
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("#") and ("BEGIN SOLUTION" in text or "BEGIN HIDDEN TESTS" in text):
            inside = True
        elif text.startswith("#") and ("END SOLUTION" in text or "END HIDDEN TESTS" in text):
            inside = False
        elif inside:
            out.append(text)
    return out


def secret_lines() -> dict[str, str]:
    """{line: lab} for every solution, hidden-test and model-answer line of every lab in solutions/
    (a line that any lab also shows outside those blocks, e.g. lab 1's train step written out again
    in lab 2's prose code, is public, not a secret)."""
    out: dict[str, str] = {}
    public: set[str] = set()
    for notebook in sorted(SOLUTIONS.glob("*/*.ipynb")):
        lab = notebook.parent.name
        secret: set[str] = set()
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            meta = cell.get("metadata", {}).get("nbgrader", {})
            hidden = set(_blocks(source))
            if cell["cell_type"] == "markdown" and meta.get("solution") and "SOLUTION" not in source:
                hidden |= {line.strip() for line in source.splitlines()}  # nbgrader blanks all of it
            secret |= hidden
            public |= {line.strip() for line in source.splitlines()} - hidden
        out.update({line: lab for line in secret if len(line) >= MIN_SECRET_LINE})
    return {line: lab for line, lab in out.items() if line not in public}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> dict[str, bytes]:
    path = bundle.build(tmp_path_factory.mktemp("dist") / "perflab-student.zip")
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_bundle_holds_every_lab_the_package_and_the_recipe(shipped):
    names = set(shipped)
    root = bundle.ROOT_NAME
    for notebook in sorted(SOLUTIONS.glob("*/*.ipynb")):
        lab = notebook.parent.name
        assert f"{root}/labs/{lab}/{lab}.ipynb" in names, f"{lab} missing from the bundle"
    for needed in ("perflab/__init__.py", "perflab/workload.py", "perflab/verify/protocol.py",
                   "perflab/labs/common.py", "pyproject.toml", "environment.yml", "README.md",
                   "datasets/recipe.json", "datasets/DATA_CARD.md", "datasets/README.md"):
        assert f"{root}/{needed}" in names, needed
    assert b"nbgrader validate" in shipped[f"{root}/README.md"]


def test_bundle_has_no_instructor_paths(shipped):
    for name in shipped:
        parts = name.split("/")[1:]
        assert parts[0] not in ("solutions", "autograder", "tests", "demo", "dist"), name
        assert not {"build", "results", "__pycache__", ".ipynb_checkpoints"} & set(parts[:-1]), name
        assert not name.endswith((".pyc", ".db")), name


def _text(name: str, data: bytes) -> str:
    text = data.decode("utf-8", "replace")
    if name.endswith(".ipynb"):
        return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                         for c in json.loads(text)["cells"])
    return text


def test_bundle_has_no_marker_anywhere(shipped):
    for name, data in shipped.items():
        text = data.decode("utf-8", "replace")
        for marker in MARKERS:
            assert f"### {marker}" not in text and f"=== {marker}" not in text, f"{name}: {marker}"


def test_student_notebooks_carry_no_solution_line(shipped):
    secrets = secret_lines()
    assert len(secrets) > 100, "the solutions should hold many answer lines; is solutions/ there?"
    for name, data in shipped.items():
        if name.endswith(".ipynb"):
            lines = {line.strip() for line in _text(name, data).splitlines()}
            leaked = sorted(f"{secrets[line]}: {line}" for line in lines & secrets.keys())
            assert leaked == [], f"{name} carries solution lines: {leaked[:5]}"


def public_lines(shipped: dict[str, bytes]) -> set[str]:
    """Lines a student copy itself gives: its code lines, and its prose's lines and `inline code`
    (lab 3's instructions spell out `loss.backward()`, `optimizer.step()`, ...)."""
    out: set[str] = set()
    for name, data in shipped.items():
        if not name.endswith(".ipynb"):
            continue
        for cell in json.loads(data.decode("utf-8"))["cells"]:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            out |= {line.strip() for line in source.splitlines()}
            if cell["cell_type"] == "markdown":
                out |= {span.strip() for span in re.findall(r"`([^`\n]+)`", source)}
    return out


def copied_answers(shipped: dict[str, bytes]) -> list[str]:
    """'file: lab/grade_id' where COPY_RUN consecutive lines of one answer appear in a shipped file
    in the same order (one line alone may be ordinary code that perflab also holds), unless every
    line of the run is one the student copies themselves give."""
    blocks = []
    for notebook in sorted(SOLUTIONS.glob("*/*.ipynb")):
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            lines = [line for line in _blocks(source) if line and not line.startswith("#")]
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            blocks.append((f"{notebook.parent.name}/{gid}", lines))
    public = public_lines(shipped)
    found = []
    for name, data in shipped.items():
        body = "\n".join(line.strip() for line in _text(name, data).splitlines() if line.strip())
        for where, lines in blocks:
            for i in range(len(lines) - COPY_RUN + 1):
                run = lines[i:i + COPY_RUN]
                if (sum(map(len, run)) >= MIN_SECRET_LINE * 2 and not set(run) <= public
                        and "\n".join(run) in body):
                    found.append(f"{name}: {where}")
                    break
    return found


def test_student_notebooks_carry_no_copied_answer(shipped):
    assert [f for f in copied_answers(shipped) if f.split(":")[0].endswith(".ipynb")] == []


# The lab folders perflab/labs/labNN/ ship (the visible tests call their checks); the hidden checks and
# the reference answers they compare against live in each folder's judges/, left out.
def test_package_source_carries_no_copied_answer(shipped):
    package = [f for f in copied_answers(shipped) if not f.split(":")[0].endswith(".ipynb")]
    assert package == [], f"answers copied into shipped files: {package}"


def test_the_copy_detector_finds_an_answer_pasted_into_the_package(shipped):
    # The detector itself: lab 4's checkpointing answer pasted into a shipped module is found.
    hidden = next(notebook for notebook in SOLUTIONS.glob("lab04*/*.ipynb"))
    cell = next(c for c in json.loads(hidden.read_text(encoding="utf-8"))["cells"]
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "checkpoint_stages")
    answer = "\n".join(_blocks("".join(cell["source"])))
    tampered = dict(shipped)
    tampered[f"{bundle.ROOT_NAME}/perflab/labs/common.py"] += ("\n" + answer).encode()
    assert any(f.endswith("lab04_memory/checkpoint_stages") for f in copied_answers(tampered))


def test_bundle_leaves_the_grader_only_checks_out(shipped):
    assert (REPO / "perflab" / "labs" / "lab04" / "judges").is_dir(), "the hidden checks live in perflab/labs/labNN/judges"
    assert not [n for n in shipped if "/judges/" in n or n.endswith("/judges.py")]
    importers = [n for n, data in shipped.items() if n.endswith((".py", ".ipynb"))
                 and re.search(rb"perflab\.labs\.lab\d\d\.judges|import judges|from \.judges", data)]
    assert importers == [], f"shipped files import the grader-only package: {importers}"


def test_bundle_refuses_a_file_with_a_solution(tmp_path):
    fake = tmp_path / "repo"
    (fake / "labs" / "lab09_x").mkdir(parents=True)
    (fake / "labs" / "lab09_x" / "lab09_x.ipynb").write_text("### " + "BEGIN SOLUTION\nx = 1\n")
    for entry, _ in bundle.CONTENTS[1:]:
        target = fake / entry
        if "." in Path(entry).name:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("{}")
        else:
            target.mkdir(parents=True, exist_ok=True)
    with pytest.raises(ValueError, match="lab09_x.ipynb: holds"):
        bundle.build(tmp_path / "out.zip", repo=fake)
    assert not (tmp_path / "out.zip").exists()


def _unpack(shipped: dict[str, bytes], into: Path) -> Path:
    for name, data in shipped.items():
        path = into / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return into / bundle.ROOT_NAME


def test_unpacked_bundle_imports_the_lab_contracts(shipped, tmp_path):
    root = _unpack(shipped, tmp_path)
    labs = sorted(".".join(p.relative_to(REPO / "perflab" / "labs").with_suffix("").parts).removesuffix(".__init__")
                  for p in (REPO / "perflab" / "labs").glob("lab0*/*.py"))  # contracts and their parts
    assert len([lab for lab in labs if re.fullmatch(r"lab0\d", lab)]) == 6 and "lab04.probes" in labs
    imports = ", ".join(f"perflab.labs.{lab}" for lab in labs)
    code = (f"import sys; sys.path.insert(0, '.'); import perflab, perflab.labs.common, perflab.verify, {imports};"
            "print(perflab.__file__)")
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert Path(out.stdout.strip()).resolve().is_relative_to(root.resolve())


@pytest.mark.slow
def test_nbgrader_validate_from_the_kit_root_finds_its_settings(shipped, tmp_path):
    """`nbgrader validate labs/...` as the README says, from the unpacked kit's root: nbgrader finds the
    kit's settings (no "No nbgrader_config.py file found") and gives a cell as long as the grader does."""
    from traitlets.config.loader import PyFileConfigLoader

    from perflab.grading.nbgrader_api import DEFAULT_CELL_TIMEOUT

    root = _unpack(shipped, tmp_path)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    assert config.Execute.timeout == DEFAULT_CELL_TIMEOUT
    notebook = root / "labs" / "lab01_measure" / "check.ipynb"
    notebook.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": "a", "metadata": {}, "source": "x = 1", "outputs": [], "execution_count": None}]}))
    nbgrader = Path(sys.executable).parent / "nbgrader"
    run = subprocess.run([str(nbgrader), "validate", "labs/lab01_measure/check.ipynb"], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert "Success! Your notebook passes all the tests." in run.stdout, run.stdout + run.stderr
    assert "No nbgrader_config.py" not in run.stdout + run.stderr


# The answer key (reference configurations and decisions, calibration pairs) is the grader's: the kit
# holds each lab's contract only (tests/test_answer_keys.py holds the package in the checkout to it).
ANSWER_KEYS = ("reference_best", "reference_final", "reference_decisions", "calibration_pair", "plan_changes")


def test_no_shipped_file_defines_an_answer_key(shipped):
    from test_answer_keys import defined_answer_keys

    found = {name: keys for name, data in shipped.items()
             if name.endswith(".py") and (keys := defined_answer_keys(data.decode("utf-8")))}
    assert found == {}, f"the student's kit defines answer keys: {found}"
    defining = [name for name, data in shipped.items() if name.endswith(".py")
                and re.search(rb"^\s*def (" + "|".join(ANSWER_KEYS).encode() + rb")\(", data, re.M)]
    assert defining == [], defining


def test_in_the_unpacked_kit_a_cell_copying_the_answer_key_fails_and_calibration_says_why(shipped, tmp_path):
    root = _unpack(shipped, tmp_path)
    cells = [("BEST = lab02.reference_best()", "AttributeError"),
             ("FINAL = lab06.reference_final()", "AttributeError"),
             ("_DECIDED = lab06.reference_decisions(None)", "AttributeError"),
             ("from perflab.labs.lab03 import reference_best", "ImportError"),
             ("from perflab.labs.lab06 import calibration_pair", "ImportError"),
             ("from perflab.labs.lab06 import judges", "ImportError")]
    code = ("import sys; sys.path.insert(0, '.')\nfrom perflab.labs import lab02, lab03, lab06\n"
            + "".join(f"try:\n    {cell}\nexcept Exception as exc:\n    print(type(exc).__name__)\nelse:\n"
                      f"    print('ran')\n" for cell, _ in cells))
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [error for _, error in cells], out.stdout
    calibrate = ("import sys; sys.path.insert(0, '.')\nfrom perflab.cli import main\n"
                 "sys.exit(main(['calibrate', '--out', 'bars']))")
    run = subprocess.run([sys.executable, "-I", "-c", calibrate], cwd=root, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr[-2000:]
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert "calibration is the instructor's" in run.stderr and "not in this kit" in run.stderr, run.stderr
    assert not (root / "bars").exists()


def test_in_the_unpacked_kit_the_mystery_pipeline_is_written_and_its_truth_is_not_there(shipped, tmp_path):
    """Lab 1's kit writes each id's pipeline and holds no account of it: `for_student` gives the source and
    the run, nothing planted; the old truth (`Planted`, `draw`, `light_dose`, the catalogue's prose) is
    gone, the grader's module is not there, and no shipped file holds a bug's symptom or fix."""
    from perflab import mystery
    from perflab.labs.lab01.judges.mystery_truth import CATALOGUE

    root = _unpack(shipped, tmp_path)
    code = ("import sys, dataclasses; sys.path.insert(0, '.')\n"
            "from perflab import mystery\nimport perflab.mystery.catalogue as cat\n"
            "case = mystery.for_student('bob')\n"
            "print(sorted(f.name for f in dataclasses.fields(case)))\n"
            "print([n for n in ('Planted', 'draw', 'light_dose', 'CATALOGUE', 'BY_KEY') if hasattr(mystery, n)])\n"
            "print(sorted({f.name for s in cat.SNIPPETS for f in dataclasses.fields(s)}))\n"
            "print(len(case.source))\n"
            "try:\n    import perflab.labs.lab01.judges.mystery_truth\nexcept ImportError as exc:\n"
            "    print(type(exc).__name__)\n")
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    fields, old, snippet_fields, length, missing = out.stdout.split("\n")[:5]
    assert fields == "['run_id', 'source', 'student']" and old == "[]", out.stdout
    assert not {"kind", "tool", "symptom", "fix", "accepts", "helpers", "costs_time"} & set(ast.literal_eval(snippet_fields))
    assert int(length) == len(mystery.for_student("bob").source) and missing == "ModuleNotFoundError"
    prose = {text for bug in CATALOGUE for text in (bug.symptom, bug.fix)}
    holding = [name for name, data in shipped.items()
               if name.endswith((".py", ".ipynb", ".md", ".json", ".txt")) and any(p in _text(name, data) for p in prose)]
    assert holding == [], holding
