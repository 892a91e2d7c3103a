"""Keep solutions/ and labs/ honest: sync the notebook twins, generate the student copies, run a lab.

    python -m perflab.labs.build sync [--from-ipynb] [--lab L]   # .py twin -> .ipynb (or back)
    python -m perflab.labs.build generate [--lab L]              # solutions/ -> labs/ via nbgrader
    python -m perflab.labs.build check                           # both of the above are up to date
    python -m perflab.labs.build run LAB [--mode M] [--student]  # execute a notebook top to bottom

Each lab lives in `solutions/<lab>/` as an nbgrader source notebook `<lab>.ipynb` and its jupytext
percent twin `<lab>.py` (the file reviews diff; cell metadata, nbgrader's included, sits on the
`# %%` lines). Both are written canonically — outputs cleared, fixed notebook metadata, cell ids
derived from position and grade_id — so the same source always gives the same bytes. Student
copies are what nbgrader's generate_assignment writes, made canonical the same way.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perflab.mystery import STUDENT_ENV

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
LABS = REPO / "labs"
LAB_NAME = re.compile(r"^lab\d\d_[a-z0-9_]+$")
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
# Notebook metadata every lab notebook carries, nothing more (no run-dependent fields).
NOTEBOOK_METADATA = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
# The header jupytext writes at the top of a .py twin.
JUPYTEXT_FORMAT = "py:percent"
NBFORMAT_MINOR = 5

# The student id a solution runs as outside the grader (`make lab`), unless PERFLAB_STUDENT_ID is set.
RUN_STUDENT = "reference"


# ---------------------------------------------------------------------------------------------
# Finding labs


def lab_names(solutions: Path = SOLUTIONS) -> list[str]:
    """Every lab in `solutions/`: folders named labNN_name holding <name>.ipynb or its .py twin."""
    if not solutions.is_dir():
        return []
    return sorted(p.name for p in solutions.iterdir()
                  if p.is_dir() and LAB_NAME.match(p.name)
                  and ((p / f"{p.name}.ipynb").is_file() or (p / f"{p.name}.py").is_file()))


def source_notebook(lab: str, solutions: Path = SOLUTIONS) -> Path:
    return solutions / lab / f"{lab}.ipynb"


def source_twin(lab: str, solutions: Path = SOLUTIONS) -> Path:
    return solutions / lab / f"{lab}.py"


def student_notebook(lab: str, labs: Path = LABS) -> Path:
    return labs / lab / f"{lab}.ipynb"


def _check_lab(lab: str, solutions: Path = SOLUTIONS) -> None:
    if lab not in lab_names(solutions):
        known = ", ".join(lab_names(solutions)) or "none"
        raise ValueError(f"lab: {lab!r} is not a lab in {solutions} (known: {known})")


# ---------------------------------------------------------------------------------------------
# Canonical notebooks


def canonical(nb: Any) -> Any:
    """The notebook with outputs cleared, fixed metadata and deterministic cell ids (in place)."""
    nb.nbformat, nb.nbformat_minor = 4, NBFORMAT_MINOR
    nb.metadata = _copy(NOTEBOOK_METADATA)
    used: set[str] = set()
    for i, cell in enumerate(nb.cells):
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        base = re.sub(r"[^A-Za-z0-9_-]", "-", grade_id) if grade_id else f"cell-{i:03d}"
        cell_id = base[:64]
        while cell_id in used:  # a duplicate grade_id is reported by the checks, not here
            cell_id = f"{base[:56]}-{i:03d}"
        used.add(cell_id)
        cell["id"] = cell_id
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata = {k: v for k, v in cell.get("metadata", {}).items()
                         if k in ("nbgrader", "deletable", "editable", "tags")}
        if isinstance(cell.source, list):
            cell.source = "".join(cell.source)
    return nb


def dumps(nb: Any) -> str:
    """Notebook JSON as every lab file is written: nbformat's layout, one trailing newline."""
    import nbformat

    return nbformat.writes(nb) + "\n"


def notebook_from_py(text: str) -> Any:
    import jupytext

    return canonical(jupytext.reads(text, fmt=JUPYTEXT_FORMAT))


def py_from_notebook(nb: Any) -> str:
    import jupytext

    nb = canonical(_copy(nb))
    text = jupytext.writes(nb, fmt=JUPYTEXT_FORMAT)
    # jupytext's own block in the header names its version; leave it out so upgrades change nothing.
    return re.sub(r"^#   jupytext:\n(?:#     .*\n)+", "", text, count=1, flags=re.MULTILINE)


def read_notebook(path: Path) -> Any:
    import nbformat

    try:
        return nbformat.read(path, as_version=4)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such notebook") from None


def _copy(value: Any) -> Any:
    import copy

    return copy.deepcopy(value)


# ---------------------------------------------------------------------------------------------
# sync: the .ipynb and its .py twin


def sync(labs: Sequence[str] | None = None, *, from_ipynb: bool = False,
         solutions: Path = SOLUTIONS) -> list[Path]:
    """Rewrite each lab's .ipynb from its .py twin (or the twin from the .ipynb); returns changed files."""
    changed = []
    for lab in labs or lab_names(solutions):
        _check_lab(lab, solutions)
        ipynb, twin = source_notebook(lab, solutions), source_twin(lab, solutions)
        if from_ipynb:
            nb = read_notebook(ipynb)
            changed += _write_if_changed(twin, py_from_notebook(nb))
            changed += _write_if_changed(ipynb, dumps(canonical(nb)))
        else:
            if not twin.is_file():
                raise FileNotFoundError(f"{twin}: no .py twin (make it with: "
                                        f"python -m perflab.labs.build sync --from-ipynb --lab {lab})")
            nb = notebook_from_py(twin.read_text(encoding="utf-8"))
            changed += _write_if_changed(ipynb, dumps(nb))
            changed += _write_if_changed(twin, py_from_notebook(nb))
    return changed


def twin_problems(lab: str, solutions: Path = SOLUTIONS) -> list[str]:
    """Why the .ipynb and the .py of `lab` disagree, or are not canonical (empty when all is well)."""
    ipynb, twin = source_notebook(lab, solutions), source_twin(lab, solutions)
    for path in (ipynb, twin):
        if not path.is_file():
            return [f"{path}: missing (run `make sync`)"]
    problems = []
    text = ipynb.read_text(encoding="utf-8")
    from_py = dumps(notebook_from_py(twin.read_text(encoding="utf-8")))
    if text != from_py:
        problems.append(f"{ipynb}: differs from its twin {twin.name} (edit the .py and run `make sync`, "
                        "or after editing in Jupyter run `python -m perflab.labs.build sync --from-ipynb`)")
    if dumps(canonical(read_notebook(ipynb))) != text:
        problems.append(f"{ipynb}: not canonical (outputs or metadata left in; run `make sync`)")
    return problems


def _write_if_changed(path: Path, text: str) -> list[Path]:
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return [path]


# ---------------------------------------------------------------------------------------------
# generate: student copies through nbgrader


def generated_notebooks(labs: Sequence[str] | None = None, *,
                        solutions: Path = SOLUTIONS) -> dict[str, str]:
    """What nbgrader's generate_assignment makes of each lab's source notebook, canonical JSON by lab."""
    from perflab.grading import nbgrader_api

    labs = list(labs or lab_names(solutions))
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="perflab-labs-") as tmp:
        course = nbgrader_api.make_course(Path(tmp) / "course")
        for lab in labs:
            _check_lab(lab, solutions)
            nbgrader_api.add_source(course, lab, source_notebook(lab, solutions))
            release = nbgrader_api.generate_assignment(course, lab)
            out[lab] = dumps(canonical(read_notebook(release / f"{lab}.ipynb")))
    return out


def generate(labs: Sequence[str] | None = None, *, solutions: Path = SOLUTIONS,
             dest: Path = LABS) -> list[Path]:
    """Write each lab's student copy to labs/<lab>/<lab>.ipynb; returns the files that changed."""
    changed = []
    for lab, text in generated_notebooks(labs, solutions=solutions).items():
        changed += _write_if_changed(student_notebook(lab, dest), text)
    return changed


def check(*, solutions: Path = SOLUTIONS, dest: Path = LABS) -> list[str]:
    """Every reason solutions/ and labs/ are out of step (empty when both are up to date)."""
    labs = lab_names(solutions)
    problems = [p for lab in labs for p in twin_problems(lab, solutions)]
    for lab, text in generated_notebooks(labs, solutions=solutions).items():
        path = student_notebook(lab, dest)
        if not path.is_file():
            problems.append(f"{path}: missing (run `make labs`)")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path}: not what nbgrader generates from solutions/ (run `make labs`)")
    return problems


# ---------------------------------------------------------------------------------------------
# run: execute a lab top to bottom


def run_notebook(path: Path, *, mode: str | None = None, timeout: int = 900,
                 workdir: Path | None = None, allow_errors: bool = False) -> tuple[Any, float]:
    """Execute a notebook with nbclient in `workdir` (a fresh temporary folder by default), with a
    copy of the notebook there as Jupyter has it (lab 6 reads its own analysis cell from the file).

    Returns the executed notebook and the wall time in seconds. Raises nbclient's
    CellExecutionError naming the failing cell on the first error, unless `allow_errors` (then every
    cell runs and an error stays in its cell's outputs, as in Jupyter).
    """
    import nbclient

    nb = read_notebook(path)
    changes = {"PERFLAB_MODE": mode} if mode else {}
    if not os.environ.get(STUDENT_ENV):  # lab 1's mystery pipeline is drawn for a student id
        changes[STUDENT_ENV] = RUN_STUDENT
    with tempfile.TemporaryDirectory(prefix="perflab-run-") as tmp:
        cwd = workdir or Path(tmp)
        cwd.mkdir(parents=True, exist_ok=True)
        if not (cwd / path.name).exists() or not (cwd / path.name).samefile(path):
            shutil.copyfile(path, cwd / path.name)
        client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                                         resources={"metadata": {"path": str(cwd)}})
        saved = {k: os.environ.get(k) for k in changes}
        os.environ.update(changes)
        start = time.perf_counter()
        try:
            client.execute()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return nb, time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# Command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perflab.labs.build", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sync", help="rewrite each solutions/ notebook from its .py twin")
    p.add_argument("--from-ipynb", action="store_true", help="the other way: rewrite the .py from the .ipynb")
    p.add_argument("--lab", action="append", help="only this lab (repeatable)")
    p = sub.add_parser("generate", help="write the student copies in labs/ with nbgrader")
    p.add_argument("--lab", action="append", help="only this lab (repeatable)")
    sub.add_parser("check", help="fail if solutions/ twins or labs/ are out of date")
    p = sub.add_parser("run", help="execute a lab notebook top to bottom and report the time")
    p.add_argument("lab")
    p.add_argument("--mode", choices=("tiny", "laptop", "full", "grade"), help="PERFLAB_MODE for the run")
    p.add_argument("--student", action="store_true", help="run the student copy in labs/ instead of the solution")
    p.add_argument("--out", type=Path, help="folder to run in and keep the executed notebook and results")
    p.add_argument("--timeout", type=int, default=900, help="seconds one cell may run (default 900)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "sync":
            for path in sync(args.lab, from_ipynb=args.from_ipynb):
                print(f"wrote {path.relative_to(REPO)}")
        elif args.command == "generate":
            for path in generate(args.lab):
                print(f"wrote {path.relative_to(REPO)}")
        elif args.command == "check":
            problems = check()
            for line in problems:
                print(line, file=sys.stderr)
            if problems:
                return 1
            print(f"{len(lab_names())} lab(s) up to date")
        else:
            _check_lab(args.lab)
            path = student_notebook(args.lab) if args.student else source_notebook(args.lab)
            nb, seconds = run_notebook(path, mode=args.mode, timeout=args.timeout, workdir=args.out)
            if args.out:
                import nbformat

                nbformat.write(nb, args.out / path.name)
            print(f"{path.relative_to(REPO)} ran in {seconds:.1f} s (mode {args.mode or 'default'})")
    except (ValueError, FileNotFoundError) as exc:
        print(f"perflab.labs.build {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
