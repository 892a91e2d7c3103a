"""What `tests/test_decisions.py` simulates, measured on this machine: the rule of thumb's change re-measured
by the grader, at tiny sizes, where it should cost time.

    python bench/bench_decisions.py [--cases workers compile] [--repeats 1] [--max-pairs N] [--all-cores]

Two cases. `workers`: one loader worker (persistent, prefetching 2) over lab 2's and lab 6's baseline on one
core (this process and the verifier's children pinned to the last core), where the worker competes with
training for it; the tests assume 0.80x, 0.88x (straddling the parity bar) and 0.92x. `compile`: lab 5's
`CHOICE = "default"` on ResNet-18 at 32 px, batch 8 (the tests assume 0.56x, cpu-bf16's calibration). Each
row is one re-measurement through `common.verify_against_bar` as the judges call it, held to the decision
bar this host loads: the speedup with its 95% CI, the verifier's outcome against the bar, what the keep rule
made of it (`common.judge_decision`: measurably slower fails; straddling the bar, kept or dropped by
`common.keep_rule`) and whether the cell is earned.
Noise only adds time: run it on a machine as quiet as the one the numbers are for. About 40 s a row for
the workers, 70 s for compiling, on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from perflab.labs import common, lab02, lab05, lab06
from perflab.workload import TrainConfig

BY_RULE = {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 2}
TINY_CPU = TrainConfig(data="tiny", image_size=32, batch_size=8, device="cpu")


@contextlib.contextmanager
def one_core(enabled: bool) -> Iterator[str]:
    """This process (and so every verifier child it starts) on its last core; yields the cores in words."""
    allowed = os.sched_getaffinity(0)
    if not enabled:
        yield f"{len(allowed)} cores"
        return
    os.sync()  # written data flushed first: the kernel's write-back lands on a core too
    os.sched_setaffinity(0, {max(allowed)})
    try:
        yield f"core {max(allowed)} of {len(allowed)}"
    finally:
        os.sched_setaffinity(0, allowed)


def rows(cases: list[str]) -> list[tuple[str, Any, Any, str]]:
    """(what, baseline, candidate, expectation name) per re-measurement, in the order measured."""
    out = []
    if "workers" in cases:
        for lab in (lab02, lab06):
            base = lab.baseline_config("tiny")
            out.append((f"{lab.LAB}: one worker", base, base.replace(**BY_RULE), lab.EXPECTATION))
    if "compile" in cases:
        out.append(("lab05 resnet18: compile default", TINY_CPU, TINY_CPU.replace(compile_mode=lab05.REFERENCE_MODE),
                    lab05.EXPECTATION_RESNET))
    return out


def measure(baseline: Any, candidate: Any, expectation: str, max_pairs: int | None) -> tuple[Any, Any, float]:
    start = time.perf_counter()
    verdict, bar = common.verify_against_bar(baseline, candidate, expectation, max_pairs=max_pairs,
                                             max_seconds=60.0 if max_pairs else None, decision=True)
    return verdict, bar, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["workers", "compile"], choices=("workers", "compile"))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-pairs", type=int, default=None,
                        help="cap the verifier's pairs (default: its own budget, as the grader grades)")
    parser.add_argument("--all-cores", action="store_true", help="do not pin to one core")
    args = parser.parse_args()
    print(f"keep rule: kept above {common.KEEP_ABOVE}, slower below {common.SLOWER_BELOW} (fails); a decision "
          f"straddling its bar is judged by it; policy for any other inconclusive verdict: "
          f"{common.inconclusive_policy()}")
    print(f"{'what':34} {'cores':12} {'bar':>5} {'speedup':>8} {'95% CI':>13} {'verifier':>12} "
          f"{'decision':>26} {'cell':>5} {'s':>5}")
    for _ in range(args.repeats):
        for what, baseline, candidate, name in rows(args.cases):
            with one_core(not args.all_cores and "worker" in what) as cores:
                verdict, bar, seconds = measure(baseline, candidate, name, args.max_pairs)
            verifier = verdict.details.get("decision", {}).get("outcome", verdict.outcome)
            ci = f"{verdict.ci[0]:.3f}-{verdict.ci[1]:.3f}" if verdict.ci else "-"
            speedup = f"{verdict.speedup:.3f}x" if verdict.speedup else "-"
            earned = "yes" if common.accepted(verdict.outcome) else "no"
            print(f"{what:34} {cores:12} {bar.threshold:5.2f} {speedup:>8} {ci:>13} {verifier:>12} "
                  f"{verdict.outcome + ' ' + verdict.code:>26} {earned:>5} {seconds:5.0f}", flush=True)


if __name__ == "__main__":
    main()
