"""`perflab report`: the optimization report (per student from results JSON, or per class)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="render a self-contained HTML optimization report from results JSON",
        description="Render one self-contained HTML page (figures embedded) from lab results files "
                    "or a `perflab profile --json` run; with --class, the instructor's class report.")
    p.add_argument("results", nargs="*", metavar="RESULTS", help="results JSON files (any of the six labs)")
    p.add_argument("--class", dest="class_source", metavar="EXPORT",
                   help="a class export (CSV or JSON from `perflab grade export`) or a directory "
                        "of <student>/*.json results files")
    p.add_argument("-o", "--output", default="report.html", help="the HTML file to write (default: report.html)")
    p.add_argument("--png-dir", help="also write each figure as a PNG file into this folder")
    p.add_argument("--title", help="the page title")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from perflab import report
    from perflab.cli import UserError

    if args.class_source and args.results:
        raise UserError("give either results files or --class EXPORT, not both")
    if args.class_source:
        rendered = report.write_class_report(args.class_source, args.output, args.png_dir, args.title)
    elif args.results:
        rendered = report.write_report(args.results, args.output, args.png_dir, args.title)
    else:
        raise UserError("give results JSON files (e.g. results/lab*.json) or --class EXPORT")
    for warning in rendered.warnings:
        print(f"warning: {warning}")
    size = len(rendered.html.encode("utf-8"))
    print(f"wrote {args.output} ({size / 1e6:.2f} MB, {len(rendered.figures)} figures)"
          + (f"; PNGs in {args.png_dir}" if args.png_dir else ""))
    return 0
