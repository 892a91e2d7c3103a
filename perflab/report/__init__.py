"""Optimization reports: one self-contained HTML page per student (from results JSON) or per class.

    report = build_report(["lab01.json", "lab06.json"])     # -> Report(html, figures, warnings)
    write_report(["lab01.json"], "report.html", png_dir="figs")

The data comes from `perflab.results` files (validated: a bad file is a ResultsError naming the
file and the field); the figures from `figures`; the page from `html`; the class report, and
the `ClassExport` format it reads, from `classreport`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from perflab.report.classreport import ClassExport, Submission, load_export, render_class
from perflab.report.html import NOT_MEASURED, SECTION_IDS, Report, render
from perflab.report.model import LabResults, ResultsSet

__all__ = [
    "NOT_MEASURED", "SECTION_IDS", "ClassExport", "LabResults", "Report", "ResultsSet", "Submission",
    "build_class_report", "build_report", "load_export", "write",
    "write_class_report", "write_report",
]


def build_report(paths: Iterable[str | os.PathLike[str]], title: str | None = None) -> Report:
    """Load and validate results files, then render the student's report."""
    return render(ResultsSet.load(paths), title)


def build_class_report(source: str | os.PathLike[str], title: str | None = None) -> Report:
    """Load a ClassExport (CSV, JSON or a directory of results) and render the class report."""
    return render_class(load_export(source), title)


def write(report: Report, out: str | os.PathLike[str],
          png_dir: str | os.PathLike[str] | None = None) -> Path:
    """Write the page (atomically) and, if asked, each figure as `<png_dir>/<name>.png`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(report.html, encoding="utf-8")
    os.replace(tmp, out)
    if png_dir is not None:
        folder = Path(png_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in report.figures.items():
            (folder / f"{name}.png").write_bytes(data)
    return out


def write_report(paths: Iterable[str | os.PathLike[str]], out: str | os.PathLike[str],
                 png_dir: str | os.PathLike[str] | None = None, title: str | None = None) -> Report:
    report = build_report(paths, title)
    write(report, out, png_dir)
    return report


def write_class_report(source: str | os.PathLike[str], out: str | os.PathLike[str],
                       png_dir: str | os.PathLike[str] | None = None,
                       title: str | None = None) -> Report:
    report = build_class_report(source, title)
    write(report, out, png_dir)
    return report
