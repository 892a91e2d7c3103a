"""`perflab calibrate`: time the reference optimisations on this machine and write its expectations."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    from perflab.verify.calibrate import CALIBRATION_PAIRS, DEFAULT_REPEATS, REFERENCE_CHANGES

    p = sub.add_parser("calibrate", help="measure reference speedups here and write autograder expectations")
    p.add_argument("--config", action="append", metavar="NAME",
                   help=f"an optimisation to calibrate (repeatable; default: all this device can run): "
                        f"{', '.join(REFERENCE_CHANGES)}, or a lab's own pair (its contract's EXPECTATION, e.g. "
                        "checkpoint_stages)")
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="verifications per optimisation")
    p.add_argument("--pairs", type=int, default=CALIBRATION_PAIRS, help="timed block pairs per verification")
    p.add_argument("--mode", default="grade", choices=("tiny", "laptop", "full", "grade"),
                   help="the sizes to calibrate at (default: grade, what the autograder verifies)")
    p.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    p.add_argument("--add", action="store_true",
                   help="keep the file's earlier runs beside this machine's: each bar becomes the lowest of the "
                        "calibrations (a class graded on several hosts: calibrate on each with --add)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for <hardware_class>.json (default: autograder/expectations)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from perflab.cli import UserError
    from perflab.verify import calibrate, expectations

    def show(name: str, i: int, verdict) -> None:  # noqa: ANN001
        if verdict.ci is None:
            print(f"  {name:14s} run {i + 1}: {verdict.outcome} ({verdict.code}): {verdict.reason}", flush=True)
            return
        lo, hi = verdict.ci
        print(f"  {name:14s} run {i + 1}: {verdict.speedup:.3f}x  95% CI [{lo:.3f}, {hi:.3f}]  "
              f"{verdict.pairs} pairs  {verdict.elapsed_seconds:.1f} s", flush=True)

    try:
        names = calibrate.available(args.config, args.device)
        print(f"calibrating {', '.join(names)} at {args.mode} sizes, {args.repeats} runs each", flush=True)
        path = calibrate.calibrate(args.config, repeats=args.repeats, mode=args.mode, device=args.device,
                                   pairs=args.pairs, out_dir=args.out, on_run=show, add=args.add)
    except calibrate.NoGraderSide as exc:  # a student's kit: the labs' reference answers are not in it
        raise UserError(str(exc)) from None
    doc = expectations.load_file(path)
    print(f"\n{'optimisation':14s} {'reference':>9s} {'low':>7s} {'kind':>8s} {'bar':>6s} calibrations")
    for name, entry in doc["optimisations"].items():
        if "threshold" not in entry:
            print(f"{name:14s} {'-':>9s} {'-':>7s} {entry['kind']:>8s} {'-':>6s}")
            continue
        print(f"{name:14s} {entry['reference']:9.3f} {entry['reference_low']:7.3f} {entry['kind']:>8s} "
              f"{entry['threshold']:6.3f} {entry.get('calibrations', 1):>12d}")
    print(f"\nwrote {path}")
    return 0
