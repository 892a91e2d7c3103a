"""Lab 6's A/A test on real training steps: the ablation of two identical configurations, repeated.

    python bench/bench_aa.py [--mode tiny] [--trials 20] [--unprimed] [--rounds N] [--threads N]

Times the baseline against a second copy of itself exactly as lab 6's ablation does
(`lab06_measure.measure_chain`: interleaved rounds, every block primed by one untimed step of its own
configuration) and prints each trial's speedup with its 95% CI, then how often the CI held 1.0 and the
median speedup. `--unprimed` times without priming (PRIME_STEPS = 0), the order that made an A/A look
like a gain, and `--rounds 4` the former 4 blocks of grade and tiny mode, `--threads 2` the
former thread count (torch's default on 2 cores). Noise only adds time, so run it on a machine as quiet as the one the numbers are for.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from perflab.labs import lab06
from perflab.labs.lab06 import measure as lab06_measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="tiny", choices=("tiny", "laptop", "grade", "full"))
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--unprimed", action="store_true", help="time without priming (the former order)")
    parser.add_argument("--rounds", type=int, default=None, help="blocks of each (default: the mode's chain_blocks)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the lab's TRAIN_THREADS)")
    args = parser.parse_args()
    if args.unprimed:
        lab06_measure.PRIME_STEPS = 0
        lab06_measure.interleaved_blocks.__kwdefaults__["prime"] = 0  # perflab.timing's, as the lab calls it
    s = lab06.sizes(args.mode)
    if args.rounds:
        s = dataclasses.replace(s, chain_blocks=args.rounds)
    base = lab06.baseline_config(args.mode)
    if args.threads:
        base = base.replace(threads=args.threads)
    print(f"{args.mode} mode: {base.data} set, {base.image_size} px, batch {base.batch_size}, "
          f"{s.chain_blocks} rounds of {s.block_steps}-step blocks, primed by {lab06_measure.PRIME_STEPS}, "
          f"{base.threads} torch thread(s)")
    held, speedups, start = 0, [], time.perf_counter()
    for trial in range(args.trials):
        times = lab06_measure.measure_chain([("baseline", base), ("A/A", base)], s)
        a, b = times["baseline"], times["A/A"]
        speedup = float(np.quantile(a, lab06.QUANTILE) / np.quantile(b, lab06.QUANTILE))
        low, high = lab06.ratio_ci(a, b)
        held += low <= 1.0 <= high
        speedups.append(speedup)
        print(f"trial {trial + 1:3d}: {speedup:.3f}x  95% CI [{low:.3f}, {high:.3f}]", flush=True)
    print(f"CI held 1.0 in {held}/{args.trials} trials ({held / args.trials:.0%}); median speedup "
          f"{float(np.median(speedups)):.3f}x; {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
