"""Copies flagged for a person (`perflab.grading.copies`): what two honest runs of a lab share, and what a
copier's notebook shares with the classmate's, whatever the copier does to the numbers next.

The fixtures (tests/fixtures/copies/, made by its record.py) are what two real home runs of each lab's
reference carried to the grader: two honest students on one machine, with the same code, seeds,
configurations and worker counts, and their own timing.
"""

from __future__ import annotations

import copy
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest

from perflab.grading import copies
from perflab.labs import build, homework

FIXTURES = Path(__file__).parent / "fixtures" / "copies"
LABS = homework.LABS


def records(lab: str, run: str) -> list[dict[str, Any]]:
    return json.loads((FIXTURES / f"{lab}-{run}.json").read_text(encoding="utf-8"))


def fingerprint(entries: list[dict[str, Any]], student: str, lab: str, nb: Any = None) -> copies.Fingerprint:
    return copies.fingerprint(entries, nb, student=student, lab=lab, sha256=f"sha-{student}")


def retimed(entries: list[dict[str, Any]], change: Callable[[float], float]) -> list[dict[str, Any]]:
    """`entries` with every float of every record changed by `change`, as a copier edits the numbers (the
    decision and accuracy records too: they are not compared anyway)."""
    def walk(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, key) for v in value]
        if isinstance(value, float) and key not in ("quantile",):
            return change(value)
        return value
    return [{**e, "value": walk(copy.deepcopy(e["value"]))} for e in entries]


def shuffled(entries: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """`entries` with every list of numbers in a new order (the blocks of a comparison reordered)."""
    rng = random.Random(seed)

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            if value and all(isinstance(v, float) for v in value):
                return rng.sample(value, len(value))
            return [walk(v) for v in value]
        return value
    return [{**e, "value": walk(copy.deepcopy(e["value"]))} for e in entries]


def pair(a: list[dict[str, Any]], b: list[dict[str, Any]], lab: str) -> copies.Pair:
    return copies.compare(fingerprint(a, "ann", lab), fingerprint(b, "ben", lab))


# ---------------------------------------------------------------------------------------------
# honest runs and plain copies


@pytest.mark.parametrize("lab", LABS)
def test_two_honest_runs_of_a_lab_share_no_timing_and_are_not_copies(lab: str) -> None:
    honest = pair(records(lab, "a"), records(lab, "b"), lab)
    assert honest.shared == 0, honest
    assert not copies.is_copy(honest), honest.why()
    assert honest.correlation is None or honest.correlation < copies.MIN_CORRELATION


@pytest.mark.parametrize("lab", LABS)
def test_a_classmates_records_handed_in_unchanged_are_a_copy_naming_both(lab: str) -> None:
    mine = records(lab, "a")
    found = pair(mine, copy.deepcopy(mine), lab)
    samples = {x for v in fingerprint(mine, "ann", lab).series.values() for x in v if copies._precise(x)}
    assert copies.is_copy(found) and found.shared == len(samples) >= copies.MIN_SHARED, found
    assert "ben's submission" in found.flag("ann") and "ann's submission" in found.flag("ben")
    assert found.flag("ann").startswith(copies.FLAG_PREFIX)


def test_what_honest_students_share_is_never_compared() -> None:
    """Same seeds, same configurations, same worker counts: lab 6's accuracy run trains the same losses in
    both honest runs, and the decisions are the same; none of it is a timing sample."""
    a, b = records("lab06_together", "a"), records("lab06_together", "b")
    accuracy = [e["value"] for e in a + b if e["kind"] == "lab06.accuracy"]
    assert len(accuracy) == 2 and accuracy[0] == accuracy[1], "fixed-seed losses: the same in both runs"
    for lab in LABS:
        a, b = records(lab, "a"), records(lab, "b")
        # What an honest student may share with another: the decisions and the fixed-seed accuracy run,
        # and every field that says how a measurement was taken (its block size, threads, quantile...).
        shared = [e for e in a if e["kind"] in copies.NOT_TIMED_KINDS]
        assert not copies.is_copy(pair(a, [e for e in b if e["kind"] not in copies.NOT_TIMED_KINDS] + shared, lab))
        assert not fingerprint(shared, "ann", lab).series, lab


# ---------------------------------------------------------------------------------------------
# what a copier does next


def _jitter(sigma: float, seed: int = 0) -> Callable[[float], float]:
    rng = random.Random(seed)
    return lambda x: x * math.exp(rng.gauss(0.0, sigma))


EDITS: dict[str, Callable[[list[dict[str, Any]]], list[dict[str, Any]]]] = {
    "scaled by a constant": lambda e: retimed(e, lambda x: x * 1.083),
    "scaled and rounded to 4 digits": lambda e: retimed(e, lambda x: float(f"{x * 0.91:.4g}")),
    "jittered by 1% noise": lambda e: retimed(e, _jitter(0.01)),
    "scaled and jittered by 0.5%": lambda e: retimed(retimed(e, _jitter(0.005, 1)), lambda x: x * 1.2),
    "offset by 5 ms": lambda e: retimed(e, lambda x: x + 0.005),
    "reordered": lambda e: shuffled(e, 3),
    "scaled and reordered": lambda e: shuffled(retimed(e, lambda x: x / 1.3), 4),
}


# Edits that keep every sample's digits or its shape up to one scale: caught in any lab, any class.
EXACT = ("scaled by a constant", "reordered", "scaled and reordered")


def _repeated(lab: str) -> int:
    """Samples of `lab`'s record that repeat one measurement, each sequence counted less one (`copies._repeats`)."""
    series = fingerprint(records(lab, "a"), "ann", lab).series
    return sum(len(v) - 1 for k, v in series.items() if copies._repeats(k))


@pytest.mark.parametrize(("lab", "edit"), [(lab, edit) for lab in LABS for edit in EDITS
                                           if edit in EXACT or _repeated(lab) >= copies.MIN_ALIGNED])
def test_a_copy_whose_numbers_were_edited_is_still_a_copy(lab: str, edit: str) -> None:
    """Noise added (jittered, rounded) is caught by the correlation of samples that repeat one measurement.
    Lab 2's home run in tiny mode times too few of those (its sweeps are one figure per worker count), so
    there a noisy copy is caught only beside a class that shows what every run shares (`class_pattern`)."""
    mine = records(lab, "a")
    edited = EDITS[edit](mine)
    assert edited != mine
    found = pair(mine, edited, lab)
    assert copies.is_copy(found), (edit, found)
    honest = pair(records(lab, "b"), edited, lab)  # the edited copy is not the other honest run's copy
    assert not copies.is_copy(honest), (edit, honest)


@pytest.mark.parametrize("lab", [lab for lab in LABS if len([e for e in records(lab, "a")
                                                             if e["kind"] not in copies.NOT_TIMED_KINDS]) > 1])
def test_a_copy_that_ran_one_measuring_cell_again_still_shares_the_others(lab: str) -> None:
    """The copier runs one of the lab's measuring cells again (its own timing there), keeps the rest."""
    mine, own = records(lab, "a"), records(lab, "b")
    timed = [i for i, e in enumerate(mine) if e["kind"] not in copies.NOT_TIMED_KINDS]
    for i in timed:
        again = [e for e in own if e["kind"] == mine[i]["kind"]]
        assert again, mine[i]["kind"]
        partly = [again[0] if j == i else e for j, e in enumerate(mine)]
        assert copies.is_copy(pair(mine, partly, lab)), mine[i]["kind"]


def test_a_copy_that_ran_every_measuring_cell_again_is_its_own_measurement() -> None:
    """Lab 3 measures in one cell: a copier who runs it again hands in a measurement of their own, and only
    the code signal (reported beside a flag, never one) remains; its decision is judged on that measurement."""
    mine, own = records("lab03_amp", "a"), records("lab03_amp", "b")
    assert [e["kind"] for e in mine] == [e["kind"] for e in own] == ["lab03.compare_precisions"]
    assert not copies.is_copy(pair(mine, own, "lab03_amp"))


# ---------------------------------------------------------------------------------------------
# the solution code, names and comments aside


def _solution(lab: str) -> nbformat.NotebookNode:
    return build.read_notebook(build.source_notebook(lab))


def _cosmetic(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """`nb` with every answer cell recommented, its docstrings reworded, its own names renamed and its code
    laid out again, and its written answers reworded: what a copier does to a classmate's notebook."""
    import ast

    class Rename(ast.NodeTransformer):
        def __init__(self, names: set[str]) -> None:
            self.names = names

        def visit_Name(self, node: ast.Name) -> ast.Name:
            return ast.Name(f"my_{node.id}", node.ctx) if node.id in self.names else node

        def visit_arg(self, node: ast.arg) -> ast.arg:
            node.arg = f"my_{node.arg}"
            return node

        def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body[0].value = ast.Constant("Reworded in my own words.")
            self.names |= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
            return self.generic_visit(node)

    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if not (cell.get("metadata", {}).get("nbgrader") or {}).get("solution"):
            continue
        if cell.cell_type == "markdown":
            cell.source = "In my own words: " + cell.source[::-1]
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        mine = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                and not n.id.isupper()}  # the names the grader reads (BEST, CHOICE) stay
        cell.source = "# my own work\n" + ast.unparse(Rename(mine).visit(tree)) + "\n# done\n"
    return nb


@pytest.mark.parametrize("lab", LABS)
def test_solution_code_is_compared_names_and_comments_aside(lab: str) -> None:
    nb = _solution(lab)
    statements = copies.solution_statements(nb)
    assert statements, "the solution has statements worth comparing"
    assert copies.solution_statements(_cosmetic(nb)) == statements


def test_the_same_solution_code_is_reported_beside_a_flag_and_is_never_one() -> None:
    lab = "lab03_amp"
    nb = _solution(lab)
    honest = copies.compare(fingerprint(records(lab, "a"), "ann", lab, nb), fingerprint(records(lab, "b"), "ben", lab, nb))
    assert not copies.is_copy(honest) and honest.code[0] == honest.code[1] > 0
    copied = copies.compare(fingerprint(records(lab, "a"), "ann", lab, nb),
                            fingerprint(records(lab, "a"), "ben", lab, _cosmetic(nb)))
    assert copies.is_copy(copied)
    assert f"solution code: {copied.code[1]} of {copied.code[1]} written statement(s) the same" in copied.why()


# ---------------------------------------------------------------------------------------------
# a class


def test_a_class_flags_exactly_its_copy_pairs() -> None:
    lab = "lab06_together"
    a, b = records(lab, "a"), records(lab, "b")
    class_ = [fingerprint(a, "ann", lab), fingerprint(b, "ben", lab), fingerprint(retimed(a, lambda x: x * 1.1), "cy", lab),
              fingerprint([], "dee", lab), fingerprint(a[:0] + [e for e in b if e["kind"] in copies.NOT_TIMED_KINDS], "eve", lab)]
    assert [p.students for p in copies.copies(class_)] == [("ann", "cy")]


def test_a_kept_fingerprint_reads_back_and_a_bad_id_is_one_line(tmp_path: Path) -> None:
    fp = fingerprint(records("lab03_amp", "a"), "ann", "lab03_amp", _solution("lab03_amp"))
    copies.keep(tmp_path, fp)
    assert copies.kept(tmp_path, "lab03_amp") == [fp]
    with pytest.raises(ValueError, match="not a lab and student id"):
        copies.keep(tmp_path, copies.Fingerprint("../x", "lab03_amp", "s", {}))


def test_the_demo_says_its_students_are_copies_of_one_run_and_lists_the_pairs(tmp_path: Path) -> None:
    from perflab import demo

    pairs = ("lab03_amp: cheater ~ reference (24 identical raw timing sample(s); ...)",)
    made = demo.Demo(tmp_path, tmp_path / "course", ("lab03_amp",), ("reference", "cheater"), tmp_path / "g.csv",
                     tmp_path / "g.json", (), {}, tmp_path / "class.html", {}, {}, 60.0, copies=pairs)
    text = demo.summary(made)
    assert demo.COPIES_NOTE in text and pairs[0] in text
    assert demo.COPIES_NOTE not in demo.summary(demo.Demo(**{**made.__dict__, "copies": ()}))
