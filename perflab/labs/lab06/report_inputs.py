"""Lab 6's report inputs: the student's written analysis read back from the saved notebook
(`read_analysis`) and every lab's results file found beside this one (`find_results`), from which
the notebook renders the optimization report.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from perflab.labs.lab06 import ANALYSIS_GRADE_ID, NOTEBOOK

# What nbgrader leaves in an unanswered written cell.
UNANSWERED = "YOUR ANSWER HERE"


def read_analysis(notebook: str | os.PathLike[str] = NOTEBOOK, grade_id: str = ANALYSIS_GRADE_ID) -> str:
    """The text of the notebook's written-analysis cell as last saved ('' if unanswered).

    The kernel cannot see a cell's text, only the file: in Jupyter, save the notebook first.
    """
    path = Path(notebook)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: the notebook is not in the working folder; run it from its own "
                                "folder (Jupyter does) so its analysis cell can be read") from None
    except ValueError as exc:
        raise ValueError(f"{path}: not a readable notebook ({exc})") from None
    for cell in doc.get("cells", []):
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            source = cell.get("source", "")
            text = "".join(source) if isinstance(source, list) else str(source)
            text = text.strip()
            return "" if text == UNANSWERED else text
    raise ValueError(f"{path}: no cell with grade_id {grade_id!r} (the analysis cell)")


def find_results(folder: str | os.PathLike[str] | None = None) -> list[Path]:
    """Results files of every lab the student has run, one per lab, valid ones only, in lab order.

    Looks in `folder`/results (this lab's own) and in the results folder of each sibling lab folder
    (`../lab0*/results/lab0*.json`: the labs sit side by side in labs/). A file that fails validation is
    left out (perflab.results says why in the log); this lab's own file wins over a copy elsewhere.
    """
    import logging

    from perflab import results

    here = Path(folder or Path.cwd()).resolve()
    candidates = sorted(here.glob("results/lab0*.json"))
    candidates += sorted(here.parent.glob("lab0*/results/lab0*.json"))
    found: dict[str, Path] = {}
    for path in candidates:
        if not re.fullmatch(r"lab\d\d_\w+\.json", path.name):  # not a results file: a trace, a candidate, a temp
            continue
        try:
            doc = results.load(path)
        except results.ResultsError as exc:
            logging.getLogger(__name__).warning("left out of the report: %s", exc)
            continue
        found.setdefault(doc["lab"], path)
    return [found[lab] for lab in sorted(found)]


# The earlier labs whose decisions lab 6 starts from, and where each keeps it in its results file.
DECISION_LABS = ("lab02_feed", "lab03_amp", "lab05_compile")


def earlier_decisions(folder: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """What labs 2-5 decided, read from their results files beside this lab (`find_results`):
    {"loader": the loader fields lab 2's BEST changed, "precision": the fields lab 3's AMP_CONFIG changed,
    "checkpoint": the stages of lab 4's CHECKPOINT_CHOICE (a tuple, () for none), "compile_mode": lab 5's
    CHOICE, "found": {lab: file name or None}}. A lab not run yet (or lab 4's file saved before it recorded
    its choice) gives None for its decision: re-enter it by hand."""
    from perflab import results
    from perflab.labs.lab06 import LOADER_FIELDS, PRECISION_FIELDS, decided_fields

    checkpoint_lab = "lab04_memory"  # lab 4's decision is memory's, not one lab 6 screens for speed
    labs = tuple(sorted((*DECISION_LABS, checkpoint_lab)))
    docs = {}
    for path in find_results(folder):
        doc = results.load(path)
        if doc["lab"] in labs:
            docs[doc["lab"]] = (path, doc)
    out: dict[str, Any] = {"loader": None, "precision": None, "checkpoint": None, "compile_mode": None,
                           "found": {lab: docs[lab][0].name if lab in docs else None for lab in labs}}
    if "lab02_feed" in docs:
        out["loader"] = decided_fields(docs["lab02_feed"][1].get("config"), LOADER_FIELDS)
    if "lab03_amp" in docs:
        out["precision"] = decided_fields(docs["lab03_amp"][1].get("config"), PRECISION_FIELDS)
    if checkpoint_lab in docs:
        stages = (docs[checkpoint_lab][1]["sections"].get("checkpoint") or {}).get("stages")
        out["checkpoint"] = tuple(stages) if isinstance(stages, list) else None
    if "lab05_compile" in docs:
        out["compile_mode"] = (docs["lab05_compile"][1]["sections"].get("compile") or {}).get("choice")
    return out
