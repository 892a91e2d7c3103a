"""`perflab grade`: the instructor's autograding workflow over a course folder.

    perflab grade setup                     course folder (autograder/course/) from solutions/
    perflab grade release                   student copies + a bundle zip without solutions
    perflab grade collect DOWNLOAD.zip      submissions from a folder or an LMS zip
    perflab grade grade [--lab L] [--student S] [--backend local|ray] [--jobs N] [--unisolated]
                        [--no-calibration | --require-calibration]
    perflab grade feedback                  HTML feedback (hidden tests never shown)
    perflab grade export [--lms canvas|moodle]  grades.csv and grades.json [and a file the LMS imports]
    perflab grade status                    graded, failed, inconclusive, flagged, pending, copy pairs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

GiB = 1024**3
MiB = 1024**2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grade", help="autograde submissions with nbgrader, sandboxed (instructors)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", metavar="STEP", required=True)

    def verb(name: str, helptext: str) -> argparse.ArgumentParser:
        v = verbs.add_parser(name, help=helptext)
        v.add_argument("--course", type=Path, default=None, help="course folder (default: autograder/course)")
        v.set_defaults(func=run)
        return v

    v = verb("setup", "make the course folder from solutions/ and generate the student copies; writes its course "
                       "file (labs, model, data set) where it has none")
    v.add_argument("--solutions", type=Path, default=None, help="source notebooks (default: solutions/)")
    v.add_argument("--lab", action="append", help="only this lab (repeatable)")

    v = verb("release", "zip the student copies (no solutions, no hidden tests) into a bundle")
    v.add_argument("--bundle", type=Path, default=None, help="zip to write (default: <course>/bundle/...)")
    v.add_argument("--to", type=Path, default=None, help="also copy the student notebooks to TO/<lab>/")
    v.add_argument("--lab", action="append", help="only this lab (repeatable)")

    v = verb("collect", "copy submissions from a folder or an LMS zip into the course folder")
    v.add_argument("source", type=Path, help="a folder of notebooks or a zip download")
    v.add_argument("--lab", help="the lab, when file names do not say it")
    v.add_argument("--pattern", help="regex with (?P<student>...) [and (?P<lab>...)] for file names")

    v = verb("grade", "autograde collected submissions (only those not graded yet)")
    v.add_argument("--lab", action="append", help="only this lab (repeatable)")
    v.add_argument("--student", action="append", help="only this student (repeatable)")
    v.add_argument("--backend", choices=("local", "ray"), default="local")
    v.add_argument("--jobs", type=int, default=None,
                   help="submissions at once (local; default: 1 below 4 cores, else one per 2 cores)")
    v.add_argument("--ray-address", default=None, help="Ray cluster address (default: RAY_ADDRESS or auto)")
    v.add_argument("--gpus", type=int, default=None,
                   help="GPUs grading uses, one per job or Ray task (default: every GPU this machine shows, "
                        "CUDA_VISIBLE_DEVICES respected; 0 hides them and grades for the CPU)")
    v.add_argument("--wall", type=float, default=900.0, help="seconds one submission may take in all")
    v.add_argument("--cell-timeout", type=int, default=600, help="seconds one cell may run")
    v.add_argument("--memory-gb", type=float, default=8.0,
                   help="memory of one submission, all its processes together where cgroups allow, and the "
                        "address space of each process on a CPU (not on CUDA, which that limit stops; 0: none)")
    v.add_argument("--disk-mb", type=float, default=2048.0,
                   help="what one submission may write: the size of its private work folder and /tmp (0: no limit)")
    v.add_argument("--unisolated", action="store_true",
                   help="grade even where the sandbox has no Linux namespaces (student code then runs as you, "
                        "with the network); recorded in the grades. Without it such a machine refuses to grade")
    v.add_argument("--require-isolation", action="store_true",
                   help="also refuse where per-submission cgroups are not available (namespaces are always "
                        "required unless --unisolated)")
    v.add_argument("--processes", type=int, default=512, help="process and thread limit per submission")
    v.add_argument("--file-mb", type=float, default=256.0, help="largest file a submission may write")
    v.add_argument("--solutions", type=Path, default=None, help="solutions folder to hide (default: solutions/)")
    v.add_argument("--force", action="store_true", help="grade again even what was graded")
    v.add_argument("--no-calibration", action="store_true",
                   help="do not calibrate, before grading, the bars of this machine that the graded labs read and "
                        "no folder has (by default they are measured first and kept in <course>/calibration/): "
                        "such a cell takes the conservative rule (no gain required), said once and recorded in "
                        "the grades")
    v.add_argument("--require-calibration", action="store_true",
                   help="refuse to grade a lab whose re-measured cell has no bar calibrated on this machine "
                        "(after calibrating what is missing, unless --no-calibration)")

    v = verb("feedback", "write HTML feedback for graded submissions")
    v.add_argument("--lab", action="append")
    v.add_argument("--student", action="append")

    v = verb("export", "write grades.csv and grades.json (per cell, lab, student, with verdicts)")
    v.add_argument("--out", type=Path, default=None, help="folder (default: <course>/export)")
    v.add_argument("--lab", action="append")
    v.add_argument("--lms", choices=("canvas", "moodle"), default=None,
                   help="also write one row per student, a column (Canvas) or file (Moodle) per lab, in that "
                        "LMS's grade import layout, with the LMS ids collect read from its download")

    verb("status", "what is graded, failed, inconclusive, flagged or pending")


def run(args: argparse.Namespace) -> int:
    from perflab.grading import pipeline

    course = args.course or pipeline.COURSE_DIR
    if args.verb == "setup":
        from perflab import course as course_file

        labs = pipeline.setup(course, args.solutions or pipeline.SOLUTIONS_DIR, args.lab)
        print(f"set up {len(labs)} lab(s) in {course}: {', '.join(labs)}")
        kept = course_file.read(Path(course) / course_file.FILE_NAME)
        data = kept.data or "each mode's own"
        print(f"course file {Path(course) / course_file.FILE_NAME}: model {kept.model}, data {data} "
              "(edit it to change them)")
    elif args.verb == "release":
        bundle = pipeline.release(course, args.bundle, args.lab, args.to)
        print(f"student bundle: {bundle}")
    elif args.verb == "collect":
        from perflab.grading import collect

        report = collect.collect(course, args.source, lab=args.lab, pattern=args.pattern)
        print("\n".join(report.lines()))
        return 1 if report.unmatched and not report.collected else 0
    elif args.verb == "grade":
        from perflab.grading import sandbox

        if args.require_isolation and args.unisolated:
            raise ValueError("--require-isolation and --unisolated contradict each other: pass one")
        missing = sandbox.missing_isolation()
        if args.require_isolation and missing:
            print("perflab grade grade: --require-isolation: " + "; ".join(missing))
            return 2
        limits = sandbox.Limits(
            wall_s=args.wall, memory_bytes=int(args.memory_gb * GiB) if args.memory_gb > 0 else None,
            processes=args.processes or None, file_bytes=int(args.file_mb * MiB) if args.file_mb > 0 else None,
            disk_bytes=int(args.disk_mb * MiB) if args.disk_mb > 0 else None)
        settings = pipeline.Settings(limits=limits, cell_timeout=args.cell_timeout, jobs=args.jobs, gpus=args.gpus,
                                     unisolated=args.unisolated, require_calibration=args.require_calibration,
                                     self_calibrate=not args.no_calibration)
        try:
            pipeline.check_isolation(settings)
        except pipeline.Unisolated as exc:
            print(f"perflab grade grade: {exc}", file=sys.stderr)
            return 2

        def progress(record) -> None:
            flag = "  FLAGGED" if record.flagged else ""
            print(f"{record.lab}/{record.student}: {record.score:g}/{record.max_score:g} {record.outcome}"
                  f" ({record.wall_s:.0f} s){flag}", flush=True)

        try:
            summary = pipeline.grade(course, settings, labs=args.lab, students=args.student, backend=args.backend,
                                     ray_address=args.ray_address, force=args.force, solutions=args.solutions,
                                     progress=progress)
        except pipeline.Uncalibrated as exc:
            print(f"perflab grade grade: {exc}", file=sys.stderr)
            return 2
        for path in summary.removed:
            print(f"removed {path}: a work folder left by a grading run that was stopped")
        print(summary.line())
        for fault in summary.machine_faults:
            print(f"NOT GRADED {fault}", file=sys.stderr)
        if summary.machine_faults:  # the machine, not a submission, failed: a script must hear of it
            return 3
    elif args.verb == "feedback":
        done = pipeline.feedback(course, args.lab, args.student,
                                 on_problem=lambda line: print(f"feedback {line}", flush=True))
        print(f"{done.line()}, under {Path(course) / 'feedback'}")
        return 1 if done.failed else 0
    elif args.verb == "export":
        from perflab.grading import export

        csv_path, json_path = export.export(course, args.out, args.lab)
        print(f"{csv_path}\n{json_path}")
        if args.lms:
            print("\n".join(export.export_lms(course, args.lms, args.out, args.lab).lines(args.lms)))
    elif args.verb == "status":
        from perflab.grading import copies, export, sandbox

        for name, keys in export.status(course).items():
            print(f"{name:13s}{len(keys):4d}  {' '.join(keys[:12])}{' ...' if len(keys) > 12 else ''}")
        for pair in copies.pairs(course):  # each pair in full: whom, and what the two share
            print(f"  copy pair  {copies.pair_line(pair)}")
        print("\n".join(sandbox.describe()))
        if sandbox.isolation().kind == "none":
            print("grading      refused here unless `perflab grade grade --unisolated` (or in the container)")
    return 0
