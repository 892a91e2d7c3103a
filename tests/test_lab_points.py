"""A lab's points are kept in one place, its graded cells' nbgrader metadata; every points figure its
prose states must equal the metadata it describes. Where a figure sits says which cells it describes:

- a row of the points table (a markdown table whose last column is `points`): the graded cells its
  `<!-- grade_id ... -->` comment names, and every graded cell is named by exactly one row;
- a heading's "(N points)": every graded cell under it, to the next heading of the same or a higher level;
- any other "N points" in a graded cell: that cell; in another markdown cell: the graded cells after it,
  its first figure the first of them, its second the second, and so on.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import labs_helpers as H
import pytest

from perflab.labs import build

# "8 points", "**4\npoints**", "1 point", "6 pts": a figure the prose states.
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\**\s+\**(?:points?|pts|marks?)\b", re.IGNORECASE)
HEADING = re.compile(r"^(#{1,6})\s")
# The last column of a points-table row: a figure and the grade_ids it adds up, or a dash for none.
ROW_POINTS = re.compile(r"^(?:(\d+(?:\.\d+)?)\s*<!--(.*?)-->|(\d+(?:\.\d+)?)|—|-)$")
SEPARATOR = re.compile(r"^:?-+:?$")


@dataclass(frozen=True)
class Graded:
    index: int
    grade_id: str
    points: float


def _graded(cells: list[Any]) -> list[Graded]:
    return [Graded(i, meta["grade_id"], float(meta.get("points", 0)))
            for i, cell in enumerate(cells) if (meta := H.nbgrader_meta(cell)).get("grade")]


def _listed(cells: list[Graded]) -> str:
    return " + ".join(f"{c.grade_id} ({c.points:g})" for c in cells) or "no graded cell"


def _lines(markdown: str) -> list[tuple[str, bool]]:
    """Each line of `markdown`, and whether it is a heading (a `#` line outside a fenced code block)."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        fenced ^= line.lstrip().startswith("```")
        lines.append((line, not fenced and bool(HEADING.match(line))))
    return lines


def _table_problems(where: str, rows: list[list[str]], by_id: dict[str, Graded],
                    named: Counter[str]) -> list[str]:
    problems = []
    for row in rows[1:]:
        if all(SEPARATOR.match(column) for column in row):
            continue
        label = " | ".join(row[:-1])[:48]
        m = ROW_POINTS.match(row[-1])
        if not m:
            problems.append(f"{where}: points-table row '{label}' ends in {row[-1]!r}, not a figure or —")
            continue
        figure = m[1] or m[3]
        if figure is None:
            continue
        ids = (m[2] or "").split()
        if not ids:
            problems.append(f"{where}: points-table row '{label}' says {figure} but names no graded cell "
                            "(end it with <!-- grade_id ... -->)")
            continue
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            problems.append(f"{where}: points-table row '{label}' names {', '.join(unknown)}, not graded cells")
            continue
        named.update(ids)
        cells = [by_id[i] for i in ids]
        if float(figure) != sum(c.points for c in cells):
            problems.append(f"{where}: points-table row '{label}' says {figure}, "
                            f"its cells {_listed(cells)} hold {sum(c.points for c in cells):g}")
    return problems


def points_problems(lab: str, cells: list[Any]) -> list[str]:
    """Every points figure in the prose of `cells` that disagrees with the nbgrader metadata (empty when all agree)."""
    graded = _graded(cells)
    by_index = {c.index: c for c in graded}
    by_id = {c.grade_id: c for c in graded}
    headings = [(i, len(HEADING.match(line)[1]), line) for i, cell in enumerate(cells)
                if cell.cell_type == "markdown" for line, heading in _lines(cell.source) if heading]
    named: Counter[str] = Counter()
    has_table = False
    problems = []
    for i, cell in enumerate(cells):
        if cell.cell_type != "markdown":
            continue
        where = f"{lab} cell {i}"
        body, table = [], []
        for line, heading in [*_lines(cell.source), ("", False)]:
            if line.lstrip().startswith("|"):
                table.append([column.strip() for column in line.strip().strip("|").split("|")])
                continue
            if table and table[0][-1].lower() == "points":
                has_table = True
                problems += _table_problems(where, table, by_id, named)
            elif table:
                body += [" ".join(row) for row in table]
            table = []
            if heading:
                problems += _heading_problems(where, i, line, headings, graded)
            else:
                body.append(line)
        figures = FIGURE.finditer("\n".join(body))
        own = by_index.get(i)
        following = [c for c in graded if c.index > i]
        for k, m in enumerate(figures):
            cell_of_figure = own or (following[k] if k < len(following) else None)
            if cell_of_figure is None:
                problems.append(f"{where}: '{m[0]}' has no graded cell after it to describe")
            elif float(m[1]) != cell_of_figure.points:
                problems.append(f"{where}: '{' '.join(m[0].split())}' says {m[1]}, "
                                f"the graded cell {cell_of_figure.grade_id} holds {cell_of_figure.points:g}")
    if has_table and named:  # a table naming no cell at all is reported row by row above
        for c in graded:
            if named[c.grade_id] != 1:
                problems.append(f"{lab}: {c.grade_id} ({c.points:g} points) is named by {named[c.grade_id]} "
                                "rows of the points table, not one")
    return problems


def _heading_problems(where: str, index: int, line: str, headings: list[tuple[int, int, str]],
                      graded: list[Graded]) -> list[str]:
    figures = FIGURE.findall(line)
    if not figures:
        return []
    position = next(p for p, h in enumerate(headings) if h[0] == index and h[2] == line)
    level = headings[position][1]
    end = next((h[0] for h in headings[position + 1:] if h[1] <= level), None)
    under = [c for c in graded if c.index >= index and (end is None or c.index < end)] if end != index else []
    total = sum(c.points for c in under)
    return [f"{where}: heading '{line.strip()}' says {figure}, the graded cells under it "
            f"{_listed(under)} hold {total:g}" for figure in figures if float(figure) != total]


def _twin_cells(path: Path) -> list[Any]:
    return list(build.notebook_from_py(path.read_text(encoding="utf-8")).cells)


@pytest.mark.parametrize("lab", H.lab_names())
def test_prose_points_equal_the_cells_metadata(lab: str) -> None:
    cells = H.source_cells(lab)
    problems = points_problems(lab, cells)
    assert problems == [], "\n".join(problems)
    assert any(FIGURE.search(c.source) for c in cells if c.cell_type == "markdown"), f"{lab}: no figure read"


def _changed(twin: str, grade_id: str, points: int) -> str:
    line = re.compile(rf'^(# %%.*"grade_id": "{grade_id}".*"points": )\d+', re.MULTILINE)
    text, count = line.subn(rf"\g<1>{points}", twin)
    assert count == 1, f"no # %% line of {grade_id} with points"
    return text


@pytest.mark.parametrize(("edit", "expected"), [
    # An instructor gives lab 2's pick_workers cell 9 points in its metadata and changes no prose.
    (lambda t: _changed(t, "test_pick_workers", 9),
     [("points-table row '`pick_workers(", "says 8, its cells test_pick_workers (9) hold 9"),
      ("heading '## 4. How many workers? (17 points)' says 17", "test_pick_workers (9)", "hold 18")]),
    # The prose of a question says 3 where the cell after it holds 2.
    (lambda t: t.replace("**Predict first (2 points).** Before the sweep", "**Predict first (3 points).** Before the sweep"),
     [("'3 points' says 3, the graded cell test_predict_workers holds 2",)]),
    # A table row forgets one of its cells.
    (lambda t: t.replace(" test_make_loader_order -->", " -->"),
     [("points-table row '`make_loader(", "says 18", "test_make_loader_visible (5) + test_make_loader_random (5) hold 10"),
      ("test_make_loader_order (8 points) is named by 0 rows of the points table, not one",)]),
])
def test_a_disagreement_is_one_line_naming_the_cell_and_both_figures(tmp_path: Path, edit: Any,
                                                                     expected: list[tuple[str, ...]]) -> None:
    lab = "lab02_feed"
    twin = build.source_twin(lab)
    assert points_problems(lab, _twin_cells(twin)) == []
    copy = tmp_path / twin.name
    copy.write_text(edit(twin.read_text(encoding="utf-8")), encoding="utf-8")
    problems = points_problems(lab, _twin_cells(copy))
    assert len(problems) == len(expected), "\n".join(problems)
    for line, fragments in zip(problems, expected, strict=True):
        assert "\n" not in line and all(f in line for f in fragments), line
