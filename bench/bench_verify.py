"""How accurate is perflab.verify? Grade candidates whose true speedup is known, many times, half of
them with another process keeping one core busy; then cheats and crashes, each of which must be caught.

    python bench/bench_verify.py                 # the full study (about an hour on an idle 2-core machine)
    python bench/bench_verify.py --trials 10 --lab-trials 10   # a quick look
    python bench/bench_verify.py --only-lab      # the graded-workload study alone (100 trials: 43 min)

Honest candidates (bench/candidates/honest.py) run perflab's toy reference with a known number of
gradient repeats per step against the reference's 10: 10 (1.0x), 8 (1.25x), 5 (2x). Each is graded
at a bar: 1.0x at 1.1 (must never pass), 1.25x at 1.1 and 2x at 1.5 (must pass; false fails <= 1%).
The lab study holds a near-lazy choice and the reference's bf16 to the bar calibrated at lab 3's grade
workload, where that bar asks for a gain: the first must never pass, the second fail in at most 1%.
Every child runs the verifier's own torch thread count; --threads changes it for the honest and
adversarial candidates only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from perflab.verify import Side, guard, verify

CANDIDATES = Path(__file__).resolve().parent / "candidates"
REFERENCE = Side.reference("perflab.verify.candidates:toy_step", repeats=10)
# (label, factory in honest.py, true speedup, bar it is graded at)
HONEST = (("1.0x", "make_step_10", 1.0, 1.1), ("1.25x", "make_step_8", 1.25, 1.1), ("2x", "make_step_5", 2.0, 1.5))
# (module, what it does, the named reason that must catch it or the error it must end in, limits)
ADVERSARIAL = (
    ("patch_clock", "patches time.perf_counter/_ns at import", "clock_tampered", {}),
    ("patch_event", "patches torch.cuda.Event.elapsed_time at import", "clock_tampered", {}),
    ("patch_reference", "slows the reference's matmul at import", "runtime_patched", {}),
    ("defer_thread", "computes steps ahead in a background thread", "deferred_work", {}),
    ("defer_setup", "precomputes every step in make_step", "deferred_work", {}),
    ("cache", "honest first, then returns cached outputs", "cached_outputs", {}),
    ("skip_steps", "skips every other step's update", "samples_differ", {}),
    ("shrink_batch", "trains on half of each batch", "loss_mismatch", {}),
    ("nan_loss", "its losses turn NaN during timing", "loss_not_finite", {}),
    ("sleepy_baseline", "exports a sleeping baseline (ignored)", "below_bar|undecided", {}),
)
ERRORS = (
    ("raises", "raises in step()", "raised", {}),
    ("hangs", "never returns", "timeout", {"time_limit": 20.0}),
    ("exhausts_memory", "allocates without end", "out_of_memory|killed", {"memory_limit": 5 * 2**30}),
    ("kills_itself", "SIGKILLs its own process", "killed", {}),
)


def busy_loop() -> subprocess.Popen:
    """Another process keeping core 0 busy (pinned there where the OS allows)."""
    code = ("import os\ntry:\n    os.sched_setaffinity(0, {0})\nexcept (AttributeError, OSError):\n    pass\n"
            "while True:\n    pass\n")
    return subprocess.Popen([sys.executable, "-c", code])


def grade(factory: str, bar: float, threads: int | None, **kwargs):
    # Hashes are taken fresh for each run so that editing the tree while the bench runs is not "tampering".
    return verify(REFERENCE, Side.module(CANDIDATES / "honest.py", factory), expectation=bar, threads=threads,
                  hashes=guard.file_hashes(), **kwargs)


def honest_study(trials: int, threads: int | None, save: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
    rows: list[dict] = []
    for i in range(trials):
        busy = busy_loop() if i % 2 == 1 else None
        try:
            for label, factory, true, bar in HONEST:
                v = grade(factory, bar, threads, seed=i)
                rows.append({"label": label, "true": true, "bar": bar, "busy": busy is not None,
                             "outcome": v.outcome, "code": v.code, "speedup": v.speedup, "ci": v.ci,
                             "pairs": v.pairs, "seconds": v.elapsed_seconds})
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        save(rows)
        done = rows[-3:]
        print(f"  trial {i + 1:3d}/{trials} {'busy ' if busy else 'quiet'} "
              + "  ".join(f"{r['label']}:{r['outcome'][:4]}" for r in done)
              + f"  load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    return rows


def honest_table(rows: list[dict]) -> str:
    # edited: failed because perflab's files changed during the run (someone editing the tree the
    # bench runs from); counted apart, since they say nothing about the statistics.
    lines = [f"{'true':>6s} {'bar':>5s} {'load':>6s} {'n':>4s} {'pass':>5s} {'fail':>5s} {'inconc':>6s} "
             f"{'error':>5s} {'edited':>6s} {'wrong':>6s} {'med est':>8s} {'med pairs':>9s} {'med s':>6s}"]
    for label, _, true, bar in HONEST:
        for busy in (None, False, True):
            sel = [r for r in rows if r["label"] == label and (busy is None or r["busy"] == busy)]
            if not sel:
                continue
            edited = sum(r["code"] == "perflab_modified" for r in sel)
            c = Counter(r["outcome"] for r in sel if r["code"] != "perflab_modified")
            # wrong: a pass below the bar, or a measured fail at or above it
            wrong = c["pass"] if true < bar else c["fail"]
            est = [r["speedup"] for r in sel if r["speedup"] is not None]
            lines.append(f"{label:>6s} {bar:5.2f} {('all' if busy is None else 'busy' if busy else 'quiet'):>6s} "
                         f"{len(sel):4d} {c['pass']:5d} {c['fail']:5d} {c['inconclusive']:6d} {c['error']:5d} {edited:6d} "
                         f"{wrong / max(len(sel) - edited, 1):6.1%} {statistics.median(est) if est else float('nan'):8.3f} "
                         f"{statistics.median(r['pairs'] for r in sel):9.0f} "
                         f"{statistics.median(r['seconds'] for r in sel):6.1f}")
    return "\n".join(lines)


def adversarial_study(threads: int | None) -> tuple[list[dict], bool]:
    rows, ok = [], True
    for name, what, expected, limits in ADVERSARIAL + ERRORS:
        start = time.perf_counter()
        v = verify(REFERENCE, Side.module(CANDIDATES / f"{name}.py"), expectation=1.1, threads=threads,
                   hashes=guard.file_hashes(), **limits)
        seconds = time.perf_counter() - start
        caught = v.code in expected.split("|") and not v.passed
        ok &= caught
        rows.append({"name": name, "what": what, "outcome": v.outcome, "code": v.code, "caught": caught,
                     "seconds": seconds, "reason": v.reason})
    return rows, ok


def lab_study(trials: int, save: Callable[[list[dict]], None] = lambda rows: None) -> tuple[list[dict], float]:
    """At lab 3's grade workload and the bar calibrated there: a near-lazy choice (channels_last in fp32:
    real work, no gain on a CPU) and the reference's bf16, half of the trials with one core busy. An
    unchanged configuration, or one that changes only a knob without effect on this device (pin_memory
    on a CPU), is not timed at all ("no change"); this is the closest a student gets to it while timed."""
    from perflab.labs import lab03
    from perflab.verify import load_expectation

    base = lab03.baseline_config("grade")
    bar = load_expectation(lab03.expectation_name(base.device_type), workload=base)
    cases = (("near-lazy", base.replace(channels_last=True)), ("reference", base.replace(amp_dtype="bf16")))
    rows: list[dict] = []
    for i in range(trials):
        busy = busy_loop() if i % 2 == 1 else None
        try:
            for label, candidate in cases:
                v = verify(base, candidate, expectation=bar.threshold, seed=i, hashes=guard.file_hashes())
                rows.append({"label": label, "busy": busy is not None, "outcome": v.outcome, "code": v.code,
                             "speedup": v.speedup, "ci": v.ci, "pairs": v.pairs, "seconds": v.elapsed_seconds})
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        save(rows)
        print(f"  lab trial {i + 1:3d}/{trials} {'busy ' if busy else 'quiet'} "
              + "  ".join(f"{r['label']}:{r['outcome'][:4]}" for r in rows[-2:]), file=sys.stderr, flush=True)
    return rows, bar.threshold


def lab_table(rows: list[dict], bar: float) -> str:
    lines = [f"{'choice':>10s} {'bar':>5s} {'load':>6s} {'n':>4s} {'pass':>5s} {'fail':>5s} {'inconc':>6s} "
             f"{'error':>5s} {'med est':>8s} {'med s':>6s}"]
    for label in ("near-lazy", "reference"):
        for busy in (None, False, True):
            sel = [r for r in rows if r["label"] == label and (busy is None or r["busy"] == busy)]
            if not sel:
                continue
            c = Counter(r["outcome"] for r in sel)
            est = [r["speedup"] for r in sel if r["speedup"] is not None]
            lines.append(f"{label:>10s} {bar:5.2f} {('all' if busy is None else 'busy' if busy else 'quiet'):>6s} "
                         f"{len(sel):4d} {c['pass']:5d} {c['fail']:5d} {c['inconclusive']:6d} {c['error']:5d} "
                         f"{statistics.median(est) if est else float('nan'):8.3f} "
                         f"{statistics.median(r['seconds'] for r in sel):6.1f}")
    return "\n".join(lines)


def grade_mode_times(runs: int) -> list[float]:
    """Seconds per verification of a real TrainConfig pair at grade sizes (baseline vs channels_last)."""
    from perflab import env
    from perflab.workload import TrainConfig

    sizes = env.mode_sizes("grade")
    base = TrainConfig(data=sizes.data, image_size=sizes.image_size, batch_size=sizes.batch_size)
    out = []
    for i in range(runs):
        v = verify(base, base.replace(channels_last=True), expectation=1.1, seed=i, hashes=guard.file_hashes())
        out.append(v.elapsed_seconds)
        print(f"  grade-mode run {i + 1}/{runs}: {v.outcome} ({v.code}) {v.elapsed_seconds:.1f} s",
              file=sys.stderr, flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=100, help="gradings of each honest candidate (default 100)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads in the honest and adversarial children (default: the verifier's own, "
                             "perflab.verify.protocol.VERIFY_THREADS)")
    parser.add_argument("--grade-runs", type=int, default=5, help="grade-mode TrainConfig verifications to time")
    parser.add_argument("--skip-honest", action="store_true")
    parser.add_argument("--lab-trials", type=int, default=100,
                        help="trials of the near-lazy / reference study at lab 3's grade workload (default 100)")
    parser.add_argument("--only-lab", action="store_true", help="run only the lab-workload study")
    parser.add_argument("--json", type=Path, help="also write every row here")
    args = parser.parse_args()
    start = time.perf_counter()
    print(f"perflab.verify bench: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start", flush=True)
    report: dict = {"load_start": os.getloadavg()}

    def saving(key: str) -> Callable[[list[dict]], None]:
        """Write the report so far after every trial: a long study that is stopped keeps its rows."""
        def save(rows: list[dict]) -> None:
            if args.json:
                args.json.write_text(json.dumps({**report, key: rows}, indent=1, default=list))
        return save

    passed = True
    if args.lab_trials > 0:
        lab_rows, bar = lab_study(args.lab_trials, saving("lab"))
        report["lab"] = lab_rows
        print("\nLab 3's grade workload, held to its calibrated bar (busy: another process spins on one core):")
        print(lab_table(lab_rows, bar))
        if bar > 1.0:  # a gain to grade here: changing nothing that matters never passes, the reference does
            passed &= not any(r["outcome"] == "pass" for r in lab_rows if r["label"] == "near-lazy")
            ref = [r for r in lab_rows if r["label"] == "reference"]
            passed &= sum(r["outcome"] == "fail" for r in ref) <= 0.01 * len(ref)
    if args.only_lab:
        print(f"\nbench took {(time.perf_counter() - start) / 60:.1f} min; "
              f"{'all criteria met' if passed else 'SOME CRITERIA NOT MET'}")
        return 0 if passed else 1
    if not args.skip_honest and args.trials > 0:
        rows = honest_study(args.trials, args.threads, saving("honest"))
        report["honest"] = rows
        print("\nHonest candidates (busy: another process spins on one core):")
        print(honest_table(rows))
        for label, _, true, bar in HONEST:
            sel = [r for r in rows if r["label"] == label and r["code"] != "perflab_modified"]
            if true < bar:
                passed &= not any(r["outcome"] == "pass" for r in sel)
            else:
                passed &= sum(r["outcome"] == "fail" for r in sel) <= 0.01 * len(sel)
        print(f"median seconds per decision: {statistics.median(r['seconds'] for r in rows):.1f}")
    adv, caught = adversarial_study(args.threads)
    report["adversarial"] = adv
    passed &= caught
    print("\nCheats and crashes (each must be caught with its named reason, never a pass):")
    for r in adv:
        print(f"  {r['name']:16s} {r['what']:48s} {r['outcome']:6s} {r['code']:16s} "
              f"{'caught' if r['caught'] else 'MISSED'}  {r['seconds']:5.1f} s")
    if args.grade_runs > 0:
        times = grade_mode_times(args.grade_runs)
        report["grade_mode_seconds"] = times
        print(f"\nGrade-mode verification (ResNet-18, tiny data, baseline vs channels_last): "
              f"median {statistics.median(times):.1f} s over {len(times)} runs (limit 60 s)")
        passed &= statistics.median(times) < 60
    report["load_end"] = os.getloadavg()
    print(f"\nload at end {os.getloadavg()[0]:.1f}; bench took {(time.perf_counter() - start) / 60:.1f} min; "
          f"{'all criteria met' if passed else 'SOME CRITERIA NOT MET'}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=list))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
