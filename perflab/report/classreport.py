"""The class report: what an instructor reads after grading a lab or a term.

`ClassExport` is the interchange format between the autograder (`perflab grade export`
writes it) and this report (`perflab report --class` reads it). One row per submission,
that is per (student, lab):

    column          type    meaning
    student         str     the student id, as in the gradebook
    lab             str     lab01_measure ... lab06_together
    score           float   points awarded; blank while not graded
    max_score       float   points possible; blank if unknown
    verdict         str     the lab's re-measurement verdict: pass | fail | inconclusive | blank
                            (fail if any check failed, else inconclusive if any was, else pass)
    speedup         float   the autograder's re-measured speedup; blank if the lab has none
    hardware_class  str     `perflab.env.MachineInfo.hardware_class` of the grading machine
    flagged         bool    held for instructor review: true/false, 1/0, yes/no; blank is false
    isolation       str     optional: the grader's sandbox (root | userns | none, where none means
                            graded with --unisolated: no namespaces); blank if unknown

Four spellings are read:

- CSV with a header row naming these columns (any order; extra columns ignored);
- JSON: `{"schema": "perflab.class_export", "version": 1, "rows": [{column: value, ...}, ...]}`;
- the autograder's per-cell export from `perflab grade export` (`grades.csv`, the same columns
  plus `cell`; or `grades.json`, schema "perflab.grades", its "rows"): the cells of a
  submission are merged into one row: scores and max_scores summed over the cells that have
  one, the verdict combined as above, the largest speedup, the grading machine, flagged if
  any cell is;
- a directory of per-student results files, `DIR/<student>/*.json` (`perflab.results`
  files): score and max_score are blank, verdict is derived from the `verification`
  rows as above, speedup is the largest re-measured speedup among them, and a submission
  is flagged when its verdict is inconclusive.
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perflab.report import figures
from perflab.report.layout import (
    NOT_MEASURED,
    Report,
    badge,
    esc,
    figure_html,
    fmt_num,
    page,
    section,
    table,
)
from perflab.report.model import LAB_ORDER, LabResults

EXPORT_SCHEMA = "perflab.class_export"
EXPORT_VERSION = 1
GRADES_SCHEMA = "perflab.grades"  # the per-cell JSON `perflab grade export` writes (same version)
UNKNOWN_HARDWARE = "unknown"
COLUMNS = ("student", "lab", "score", "max_score", "verdict", "speedup", "hardware_class", "flagged")
VERDICTS = ("pass", "fail", "inconclusive", "")
_TRUE = {"true", "1", "yes", "y"}
_FALSE = {"false", "0", "no", "n", ""}

CLASS_SECTIONS = (
    ("class-summary", "Summary"),
    ("class-speedups", "Verified speedups per lab"),
    ("class-scores", "Scores"),
    ("class-review", "Inconclusive and flagged submissions"),
    ("class-hardware", "Grading hardware"),
    ("class-students", "Per student"),
)
CLASS_SECTION_IDS = tuple(s[0] for s in CLASS_SECTIONS)


@dataclass(frozen=True)
class Submission:
    """One row of a ClassExport."""

    student: str
    lab: str
    score: float | None
    max_score: float | None
    verdict: str
    speedup: float | None
    hardware_class: str
    flagged: bool
    isolation: str = ""

    @property
    def fraction(self) -> float | None:
        if self.score is None or not self.max_score:
            return None
        return self.score / self.max_score


@dataclass(frozen=True)
class ClassExport:
    """Every submission of a class, whatever file it was read from."""

    source: str
    rows: tuple[Submission, ...]
    # (lab, student, student, what they share): submissions whose home measurements one run made
    # (`perflab.grading.copies`; grades.json's "copies"), both flagged for review.
    copies: tuple[tuple[str, str, str, str], ...] = ()

    def labs(self) -> list[str]:
        found = {r.lab for r in self.rows}
        return [lab for lab in LAB_ORDER if lab in found] + sorted(found - set(LAB_ORDER))

    def hardware(self) -> list[str]:
        return sorted({r.hardware_class for r in self.rows})


def _number(where: str, name: str, value: Any) -> float | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ValueError(f"{where}, field {name!r}: expected a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}, field {name!r}: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{where}, field {name!r}: expected a finite number, got {value!r}")
    return number


def _row(where: str, data: dict[str, Any]) -> Submission:
    for name in ("student", "lab", "hardware_class"):
        if not str(data.get(name) or "").strip():
            raise ValueError(f"{where}, field {name!r}: missing")
    verdict = str(data.get("verdict") or "").strip().lower()
    if verdict not in VERDICTS:
        raise ValueError(f"{where}, field 'verdict': expected one of pass, fail, inconclusive or "
                         f"blank, got {data.get('verdict')!r}")
    flag = data.get("flagged")
    if isinstance(flag, bool):
        flagged = flag
    else:
        text = str(flag if flag is not None else "").strip().lower()
        if text not in _TRUE | _FALSE:
            raise ValueError(f"{where}, field 'flagged': expected true or false, got {flag!r}")
        flagged = text in _TRUE
    return Submission(str(data["student"]).strip(), str(data["lab"]).strip(),
                      _number(where, "score", data.get("score")),
                      _number(where, "max_score", data.get("max_score")), verdict,
                      _number(where, "speedup", data.get("speedup")),
                      str(data["hardware_class"]).strip(), flagged, str(data.get("isolation") or "").strip())


def _from_csv(path: Path) -> list[Submission]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: column {missing[0]!r} missing (a ClassExport CSV has columns "
                             f"{', '.join(COLUMNS)})")
        rows = [(f"{path} line {n}", row) for n, row in enumerate(reader, start=2)]
        return _submissions(rows, per_cell="cell" in (reader.fieldnames or []))


def _from_json(path: Path) -> list[Submission]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema not in (EXPORT_SCHEMA, GRADES_SCHEMA):
        raise ValueError(f"{path}: field 'schema': expected {EXPORT_SCHEMA!r} (a ClassExport) or "
                         f"{GRADES_SCHEMA!r} (perflab grade export), got {schema!r}")
    if doc.get("version") != EXPORT_VERSION:
        raise ValueError(f"{path}: field 'version': this perflab reads version {EXPORT_VERSION}, "
                         f"the file has {doc.get('version')!r}")
    if not isinstance(doc.get("rows"), list):
        raise ValueError(f"{path}: field 'rows': expected a list")
    rows = []
    for i, row in enumerate(doc["rows"]):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: field 'rows[{i}]': expected an object")
        rows.append((f"{path}: rows[{i}]", row))
    return _submissions(rows, per_cell=schema == GRADES_SCHEMA or any("cell" in r for _, r in rows))


def _submissions(rows: list[tuple[str, dict[str, Any]]], per_cell: bool) -> list[Submission]:
    """One Submission per row, or per (student, lab) when the rows are the grader's cells."""
    if not per_cell:
        return [_row(where, row) for where, row in rows]
    groups: dict[tuple[str, str], list[Submission]] = {}
    for where, row in rows:
        # A cell that times nothing may not name the machine; the submission's other cells do.
        cell = _row(where, {**row, "hardware_class": row.get("hardware_class") or UNKNOWN_HARDWARE})
        groups.setdefault((cell.student, cell.lab), []).append(cell)
    out = []
    for (student, lab), cells in groups.items():
        scores = [c.score for c in cells if c.score is not None]
        maxima = [c.max_score for c in cells if c.max_score is not None]
        speeds = [c.speedup for c in cells if c.speedup is not None]
        machines = [c.hardware_class for c in cells if c.hardware_class != UNKNOWN_HARDWARE]
        out.append(Submission(student, lab, sum(scores) if scores else None,
                              sum(maxima) if maxima else None, _overall([c.verdict for c in cells]),
                              max(speeds) if speeds else None,
                              machines[0] if machines else UNKNOWN_HARDWARE,
                              any(c.flagged for c in cells),
                              next((c.isolation for c in cells if c.isolation), "")))
    return out


def _overall(verdicts: list[str]) -> str:
    for v in ("fail", "inconclusive", "pass"):
        if v in verdicts:
            return v
    return ""


def _from_directory(path: Path) -> list[Submission]:
    out = []
    for student_dir in sorted(p for p in path.iterdir() if p.is_dir()):
        for file in sorted(student_dir.glob("*.json")):
            item = LabResults.load(file)
            checks = item.sections.get("verification", [])
            verdict = _overall([c["verdict"] for c in checks])
            speeds = [c["speedup"] for c in checks if isinstance(c.get("speedup"), (int, float))]
            out.append(Submission(student_dir.name, item.lab, None, None,
                                  verdict if verdict in VERDICTS else "",
                                  max(speeds) if speeds else None,
                                  str(item.machine.get("hardware_class", "")),
                                  verdict == "inconclusive"))
    if not out:
        raise ValueError(f"{path}: no results files found (expected {path}/<student>/*.json)")
    return out


def load_export(source: str | os.PathLike[str]) -> ClassExport:
    """Read a ClassExport from a CSV, a JSON export or a directory of per-student results."""
    path = Path(source)
    if path.is_dir():
        rows = _from_directory(path)
    elif not path.exists():
        raise FileNotFoundError(f"{path}: no such class export (a CSV, a JSON export or a directory)")
    elif path.suffix.lower() == ".csv":
        rows = _from_csv(path)
    else:
        rows = _from_json(path)
    if not rows:
        raise ValueError(f"{path}: the class export holds no submissions")
    pairs = _copy_pairs(path) if path.is_file() and path.suffix.lower() != ".csv" else ()
    return ClassExport(str(path.name), tuple(rows), pairs)


def _copy_pairs(path: Path) -> tuple[tuple[str, str, str, str], ...]:
    """The copy pairs of a grades.json (`copies`); none where it has none (a malformed entry is skipped)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for pair in (doc.get("copies") or ()) if isinstance(doc, dict) else ():
        students = pair.get("students") if isinstance(pair, dict) else None
        if isinstance(students, list) and len(students) == 2:
            out.append((str(pair.get("lab", "")), str(students[0]), str(students[1]), str(pair.get("why", ""))))
    return tuple(out)


def render_class(export: ClassExport, title: str | None = None) -> Report:
    """Render the instructor's class report."""
    labs = export.labs()
    figs: dict[str, bytes] = {}

    def fig(name: str, figure: Any, alt: str) -> str:
        figs[name] = figures.png(figure)
        return figure_html(name, figs[name], alt)

    rows = export.rows
    students = sorted({r.student for r in rows})
    hardware = export.hardware()
    body = []

    # summary
    counts = {v: sum(1 for r in rows if r.verdict == v) for v in ("pass", "fail", "inconclusive")}
    flagged = sum(1 for r in rows if r.flagged)
    graded = [r.fraction for r in rows if r.fraction is not None]
    kpis = [(str(len(students)), "students"), (str(len(rows)), "submissions"),
            (str(len(labs)), "labs"), (str(counts["pass"]), "verified pass"),
            (str(counts["inconclusive"]), "inconclusive"), (str(flagged), "flagged for review")]
    if graded:
        kpis.append((f"{statistics.median(graded):.0%}", "median score"))
    summary = "".join(f'<div class="kpi"><b>{esc(v)}</b><span>{esc(k)}</span></div>' for v, k in kpis)
    if len(hardware) > 1:
        summary += (f'<div class="banner" id="mixed-hardware" role="note"><strong>Graded on '
                    f"{len(hardware)} kinds of hardware</strong> ({esc(', '.join(hardware))}): "
                    "speedups are shown per hardware class, since they are not comparable "
                    "across machines.</div>")
    unisolated = sorted(f"{r.lab}/{r.student}" for r in rows if r.isolation == "none")
    if unisolated:
        summary += (f'<div class="banner" id="unisolated" role="note"><strong>{len(unisolated)} submission(s) '
                    "graded with --unisolated</strong>: their code ran without Linux namespaces, as the "
                    f"instructor and with the network ({esc(', '.join(unisolated[:12]))}"
                    f"{' ...' if len(unisolated) > 12 else ''}).</div>")
    body.append(section("class-summary", "Summary", summary, f"from {esc(export.source)}"))

    # speedups per lab, one figure per hardware class
    parts = []
    for hw in hardware:
        points = [(r.lab, r.speedup, r.verdict) for r in rows
                  if r.hardware_class == hw and r.speedup is not None]
        if points:
            parts.append(fig(f"class-speedups-{_slug(hw)}",
                             figures.class_speedups(labs, points, f"Re-measured speedups on {hw}"),
                             f"Distribution of re-measured speedups per lab on {hw}"))
    stat_rows = []
    for lab in labs:
        for hw in hardware:
            vals = [r.speedup for r in rows if r.lab == lab and r.hardware_class == hw
                    and r.speedup is not None]
            if vals:
                passed = sum(1 for r in rows if r.lab == lab and r.hardware_class == hw
                             and r.verdict == "pass")
                stat_rows.append([lab, hw, str(len(vals)), f"{statistics.median(vals):.2f}×",
                                  f"{min(vals):.2f}×", f"{max(vals):.2f}×", str(passed)])
    if stat_rows:
        parts.append(table(["lab", "hardware", "measured", "median", "min", "max", "passed"],
                           stat_rows, numeric=(2, 3, 4, 5, 6)))
    body.append(section("class-speedups", "Verified speedups per lab",
                        "".join(parts) or _nm("the export has no re-measured speedups")))

    # scores
    fractions = {lab: [r.fraction for r in rows if r.lab == lab and r.fraction is not None]
                 for lab in labs}
    if any(fractions.values()):
        score_rows = []
        for lab in labs:
            vals = [r for r in rows if r.lab == lab and r.score is not None]
            if vals:
                pts = [r.score for r in vals]
                score_rows.append([lab, str(len(vals)), fmt_num(statistics.mean(pts)),
                                   fmt_num(statistics.median(pts)), fmt_num(min(pts)),
                                   fmt_num(max(pts)), fmt_num(vals[0].max_score or 0)])
        scores = (fig("class-scores", figures.class_scores(labs, fractions),
                      "Histogram of scores as a percentage of each lab's points")
                  + table(["lab", "graded", "mean", "median", "min", "max", "out of"], score_rows,
                          numeric=(1, 2, 3, 4, 5, 6)))
    else:
        scores = _nm("no scores in the export yet (grade the submissions first)")
    body.append(section("class-scores", "Scores", scores))

    # review list
    review = [r for r in rows if r.flagged or r.verdict == "inconclusive"]
    if review:
        rev = table(["student", "lab", "verdict", "speedup", "score", "hardware", "flagged"],
                    [[esc(r.student), esc(r.lab), badge(r.verdict or None),
                      f"{r.speedup:.2f}×" if r.speedup is not None else "–",
                      esc(_score(r)), esc(r.hardware_class), "⚑ yes" if r.flagged else "no"]
                     for r in sorted(review, key=lambda r: (r.lab, r.student))],
                    numeric=(3, 4), raw=True)
    else:
        rev = "<p>No submission is inconclusive or flagged.</p>"
    if export.copies:
        rev += ("<p>Pairs of submissions whose home measurements one run made (two runs never time alike): both "
                "are flagged and held for review; nothing was deducted, and the students' pages name no one.</p>"
                + table(["lab", "student", "student", "what they share"],
                        [list(pair) for pair in sorted(export.copies)]))
    body.append(section("class-review", "Inconclusive and flagged submissions", rev))

    # hardware
    hw_rows = [[hw] + [str(sum(1 for r in rows if r.hardware_class == hw and r.lab == lab))
                       for lab in labs] for hw in hardware]
    body.append(section("class-hardware", "Grading hardware",
                        table(["hardware class"] + labs, hw_rows, numeric=range(1, len(labs) + 1))))

    # per student matrix
    by = {(r.student, r.lab): r for r in rows}
    matrix = []
    for s in students:
        cells = [esc(s)]
        for lab in labs:
            r = by.get((s, lab))
            cells.append("–" if r is None else
                         f"{esc(_score(r))} {badge(r.verdict) if r.verdict else ''}"
                         + (" ⚑" if r.flagged else ""))
        matrix.append(cells)
    body.append(section("class-students", "Per student",
                        table(["student"] + labs, matrix, raw=True)))

    title = title or "Class report"
    subtitle = esc(f"{len(students)} students, {len(rows)} submissions, "
                   f"hardware: {', '.join(hardware)}")
    notes = (f"graded on {len(hardware)} hardware classes",) if len(hardware) > 1 else ()
    if unisolated:
        notes += (f"{len(unisolated)} submission(s) graded with --unisolated (no namespaces)",)
    return Report(page(title, subtitle, CLASS_SECTIONS, "".join(body)), figs, notes)


def _score(r: Submission) -> str:
    if r.score is None:
        return "not graded"
    return f"{fmt_num(r.score)}/{fmt_num(r.max_score)}" if r.max_score else fmt_num(r.score)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _nm(why: str) -> str:
    return f'<p class="not-measured">{NOT_MEASURED} — {esc(why)}.</p>'
