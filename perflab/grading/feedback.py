"""Feedback a student may see: the graded notebook without hidden tests, and one line per problem.

`scrub(nb, hidden)` removes every hidden-test region from the executed notebook and reduces the
outputs of cells that held hidden tests to the error's name (a traceback or a print there could
quote a hidden test). The pipeline stores only scrubbed notebooks in `autograded/`, with a
"Grading notes" cell on top, so nbgrader's own feedback renders nothing hidden. A submission
that could not be run at all gets a short HTML page of its own with the same notes.
`assert_nothing_hidden` is the last guard before anything is written for a student.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from perflab.grading.checks import grade_id

BEGIN_HIDDEN = "BEGIN HIDDEN TESTS"
END_HIDDEN = "END HIDDEN TESTS"
_HIDDEN_REGION = re.compile(r"^[ \t]*#+[ \t]*BEGIN HIDDEN TESTS.*?^[ \t]*#+[ \t]*END HIDDEN TESTS[^\n]*\n?",
                            re.MULTILINE | re.DOTALL)
NOTES_CELL_ID = "perflab-grading-notes"
# Hidden-test lines shorter than this are too generic to police (`pass`, `assert ok`).
MIN_GUARDED_LINE = 12


class HiddenTestLeak(RuntimeError):
    """Feedback would have shown a hidden test; nothing was written."""


def hidden_lines(source_cells: Iterable[Any]) -> dict[str, list[str]]:
    """grade_id -> the non-trivial lines of its hidden-test regions, from the source notebook."""
    out: dict[str, list[str]] = {}
    for cell in source_cells:
        gid = grade_id(cell)
        if not gid or BEGIN_HIDDEN not in cell.source:
            continue
        lines = []
        for region in _HIDDEN_REGION.findall(cell.source):
            lines += [ln.strip() for ln in region.splitlines()[1:-1] if len(ln.strip()) >= MIN_GUARDED_LINE]
        out[gid] = lines
    return out


def scrub(nb: Any, hidden: Iterable[str]) -> Any:
    """Remove hidden tests (sources, and outputs that could quote them) from `nb` in place."""
    from nbformat.v4 import new_output

    hidden = set(hidden)
    for cell in nb.cells:
        if BEGIN_HIDDEN in cell.get("source", ""):
            cell.source = _HIDDEN_REGION.sub("", cell.source)
        if cell.cell_type != "code" or grade_id(cell) not in hidden:
            continue
        kept = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                ename = output.get("ename", "Error")
                kept.append(new_output("error", ename=ename, evalue="",
                                       traceback=[f"{ename}: a test in this cell failed (it holds hidden "
                                                  "tests, so the details are not shown)"]))
            elif output.get("output_type") in ("display_data", "execute_result") and any(
                    k.startswith("application/vnd.perflab") for k in output.get("data", {})):
                kept.append(output)  # verification records: the student's own numbers
        cell.outputs = kept
    return nb


def add_notes(nb: Any, notes: Sequence[str], title: str) -> Any:
    """Put a markdown "Grading notes" cell at the top of `nb` (replacing an earlier one)."""
    from nbformat.v4 import new_markdown_cell

    nb.cells = [c for c in nb.cells if c.get("id") != NOTES_CELL_ID]
    body = "\n".join(f"- {_md_escape(line)}" for line in notes) or "- nothing to report"
    cell = new_markdown_cell(f"## Grading notes: {title}\n\n{body}")
    cell["id"] = NOTES_CELL_ID
    nb.cells.insert(0, cell)
    return nb


def assert_nothing_hidden(text: str, guarded: dict[str, list[str]], what: str) -> None:
    if BEGIN_HIDDEN in text or END_HIDDEN in text:
        raise HiddenTestLeak(f"{what}: would show a hidden-test marker; not written")
    for gid, lines in guarded.items():
        for line in lines:
            if line in text:
                raise HiddenTestLeak(f"{what}: would show a hidden test of cell {gid!r}; not written")


def failure_page(student: str, lab: str, notes: Sequence[str], cells: Sequence[Any]) -> str:
    """A self-contained HTML page for a submission that could not be run."""
    total = sum(c.score or 0.0 for c in cells)
    out_of = sum(c.max_score for c in cells)
    rows = "".join(f"<tr><td>{html.escape(c.grade_id)}</td><td>{_num(c.score)} / {_num(c.max_score)}</td></tr>"
                   for c in cells)
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(lab)}: {html.escape(student)}"
            f"</title></head><body><h1>{html.escape(lab)}: feedback for {html.escape(student)}</h1>"
            f"<h2>Grading notes</h2><ul>{items}</ul><p>Score: {_num(total)} / {_num(out_of)}</p>"
            f"<table><tr><th>cell</th><th>score</th></tr>{rows}</table></body></html>\n")


def write_page(folder: Path, name: str, page: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.html"
    path.write_text(page, encoding="utf-8")
    return path


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def _md_escape(text: str) -> str:
    return text.replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")
