"""The classic way of grading, kept only for a lab that has no judges yet: nbgrader runs the restored
test cells, hidden tests included, in the student's own kernel, and the sandbox reads their scores.

This is what "the grader decides" (`perflab.grading.judging`) replaces, because a kernel the student
controls can change what its tests report (hooks, rebinding). `perflab grade status` names every lab
still graded this way, and `pipeline.grade` logs it; a lab moves off it as soon as it has `PROBES`
and `JUDGES`. Both halves live here:

    prepare(job, info, tmpl, workdir, settings)   the parent: a work folder with this lab's gradebook
    grade(job_dir)                                 the sandboxed worker: nbgrader's autograde, scores
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def prepare(job: Any, info: Any, tmpl: Path, workdir: Path, settings: Any) -> dict[str, str]:
    """Lay out the sandbox's work folder the classic way; returns the environment the worker runs with."""
    from perflab.grading import nbgrader_api as nbapi

    course = workdir / "course"
    for name in nbapi.COURSE_FOLDERS:
        (course / name).mkdir(parents=True, exist_ok=True)
    shutil.copy2(tmpl / "gradebook.db", course / "gradebook.db")
    shutil.copytree(tmpl / "release" / job.lab, course / "release" / job.lab)
    (course / "source" / job.lab).mkdir(parents=True, exist_ok=True)
    dest = course / "submitted" / job.student / job.lab
    dest.mkdir(parents=True)
    shutil.copyfile(job.path, dest / info.notebook)
    for name in ("home", "runtime", "cache"):
        (workdir / name).mkdir()
    env = {"HOME": str(workdir / "home"), "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
           "IPYTHONDIR": str(workdir / "home" / ".ipython"), "MPLCONFIGDIR": str(workdir / "cache" / "mpl"),
           "XDG_CACHE_HOME": str(workdir / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(workdir / "cache" / "inductor"),
           "PYTHONDONTWRITEBYTECODE": "1", **settings.env}
    (workdir / "job.json").write_text(json.dumps({
        "classic": True, "lab": job.lab, "student": job.student, "notebook": info.notebook, "sha256": job.sha256,
        "cell_timeout": settings.cell_timeout, "env": env,
        "cells": [{"grade_id": c["grade_id"], "max_score": c["max_score"]} for c in info.cells],
    }), encoding="utf-8")
    return env


def verdict_of(cell: Any) -> dict[str, Any] | None:
    """The last verification record a grade cell displayed, if any."""
    from perflab.grading.timelock import VERDICT_MIME

    found = None
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if VERDICT_MIME in data and isinstance(data[VERDICT_MIME], dict):
            found = dict(data[VERDICT_MIME])
    return found


def score_cells(nb: Any, expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Score every graded cell the lab has, in the lab's order, from the executed notebook."""
    from nbgrader.utils import determine_grade, is_grade

    from perflab.grading.checks import grade_id
    from perflab.grading.worker import first_error

    first = {}
    for cell in nb.cells:
        gid = grade_id(cell)
        if gid and gid not in first:
            first[gid] = cell
    rows = []
    for spec in expected:
        gid, max_score = spec["grade_id"], float(spec["max_score"])
        row = {"grade_id": gid, "max_score": max_score, "score": 0.0, "needs_manual_grade": False,
               "error": None, "verdict": None}
        cell = first.get(gid)
        if cell is None or not is_grade(cell):
            row["error"] = "the cell was deleted; scored 0"
            rows.append(row)
            continue
        score, meta_max = determine_grade(cell, log)
        if score is None:
            row["score"], row["needs_manual_grade"] = None, True
        else:
            fraction = (float(score) / meta_max) if meta_max else 0.0
            row["score"] = round(max(0.0, min(1.0, fraction)) * max_score, 6)
        error = first_error(cell) if cell.cell_type == "code" else None
        if error:
            row["error"] = f"{error[0]}: {error[1]}"[:300]
        row["verdict"] = verdict_of(cell)
        rows.append(row)
    return rows


def _zeros(expected: list[dict[str, Any]], reason: str) -> list[dict[str, Any]]:
    return [{"grade_id": c["grade_id"], "max_score": float(c["max_score"]), "score": 0.0,
             "needs_manual_grade": False, "error": reason, "verdict": None} for c in expected]


def grade(job_dir: Path) -> dict[str, Any]:
    """The sandboxed worker's classic run: nbgrader's autograde, scored from the executed notebook."""
    import nbformat
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        IgnorePattern,
        LimitOutput,
        SaveAutoGrades,
    )

    from perflab.grading import checks, nbgrader_api, worker

    job = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
    lab, student, name = job["lab"], job["student"], job["notebook"]
    course = job_dir / "course"
    result: dict[str, Any] = {"schema": worker.RESULT_SCHEMA, "version": 1, "lab": lab, "events": [], "cells": [],
                              "notebook": None, "error": None, "classic": True}
    release = nbformat.read(course / "release" / lab / name, as_version=4)
    submitted = course / "submitted" / student / lab / name
    nb, findings = checks.inspect_submission(submitted.read_bytes(), release)
    if nb is None:
        result["error"] = next(f.message for f in findings if f.fatal)
        result["cells"] = _zeros(job["cells"], "not graded: " + result["error"])
        return result
    nbformat.write(nb, submitted)
    preprocessors = [worker.SandboxExecute, IgnorePattern, ClearMetadataPreprocessor, worker.CapOutput, LimitOutput,
                     SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
    try:
        nbgrader_api.autograde(course, lab, student, timeout=int(job["cell_timeout"]), env=job.get("env") or {},
                               config={"Autograde__autograde_preprocessors": preprocessors})
    except Exception as exc:
        worker._kill_stragglers()
        text = str(exc).strip().splitlines()
        reason = next((line for line in reversed(text) if "rror" in line), text[-1] if text else "")
        reason = reason.replace("see the above traceback for details", "").replace("see the above traceback", "")
        result["error"] = f"nbgrader could not run the notebook ({reason.strip()[:300]})"
        result["cells"] = _zeros(job["cells"], result["error"])
        result["events"] = list(worker._EVENTS)
        return result
    graded = nbformat.read(nbgrader_api.autograded_notebook(course, lab, student, Path(name).stem), as_version=4)
    worker.cap_total_outputs(graded, worker.NOTEBOOK_CAP_BYTES)
    result["cells"] = score_cells(graded, job["cells"])
    result["events"] = list(worker._EVENTS) + worker._error_events(graded)
    result["notebook"] = nbformat.writes(graded)
    result["files"] = worker.results_files(course / "autograded" / student / lab, lab)
    return result
