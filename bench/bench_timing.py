"""perflab.timing against torch.utils.benchmark, on the same functions in one run.

For a no-op, a small matmul and a conv forward it times each function with
`perflab.timing.benchmark` and with `torch.utils.benchmark.Timer.blocked_autorange` and
`.adaptive_autorange`, then prints one table: median and IQR per call, samples taken, wall
time spent, and the ratio of each harness's median to perflab's. The no-op row is each
harness's own per-call overhead: perflab times every call on its own (clock read, device sync),
torch.utils.benchmark amortises its timer over many calls per sample.

A shared machine adds time at random moments, so every harness runs `--rounds` times, in
rotated order, and the table keeps each one's fastest round (noise only adds time) and shows
how far its rounds disagreed.

    python bench/bench_timing.py [--device cpu|cuda|mps] [--threads N] [--min-run-time S] [--rounds R]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.benchmark import Timer

from perflab import env, timing
from perflab.stats import format_time


@dataclass(frozen=True)
class Row:
    function: str
    harness: str
    median: float
    iqr: float
    samples: int
    calls_per_sample: int
    wall: float
    round_spread: float = 0.0  # slowest round's median / fastest round's, minus 1


def workloads(device: torch.device) -> dict[str, Callable[[], Any]]:
    """A no-op, a matmul and a conv forward sized to take micro- to milliseconds on `device`."""
    gpu = device.type != "cpu"
    n = 2048 if gpu else 256
    x = torch.randn(n, n, device=device)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(device).eval()
    image = torch.randn(32 if gpu else 1, 64, 56, 56, device=device)

    def noop() -> None:
        return None

    def matmul() -> torch.Tensor:
        return x @ x

    def conv_forward() -> torch.Tensor:
        with torch.no_grad():
            return conv(image)

    return {
        "no-op": noop,
        f"matmul {n}x{n}": matmul,
        f"conv3x3 64ch {tuple(image.shape)}": conv_forward,
    }


def run_perflab(name: str, fn: Callable[[], Any], device: torch.device, threads: int, min_run_time: float) -> Row:
    start = time.perf_counter()
    m = timing.benchmark(fn, min_run_time=min_run_time, device=device, threads=threads, label=name)
    return Row(name, f"perflab ({m.timer})", m.median, m.iqr, m.n, 1, time.perf_counter() - start)


def run_torch(name: str, fn: Callable[[], Any], threads: int, min_run_time: float, adaptive: bool) -> Row:
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads, label=name)
    start = time.perf_counter()
    if adaptive:
        m = timer.adaptive_autorange(threshold=0.1, min_run_time=min_run_time / 10, max_run_time=3 * min_run_time)
        harness = "torch adaptive_autorange"
    else:
        m = timer.blocked_autorange(min_run_time=min_run_time)
        harness = "torch blocked_autorange"
    wall = time.perf_counter() - start
    return Row(name, harness, m.median, m.iqr, len(m.times), m.number_per_run, wall)


def best_of_rounds(rounds: list[list[Row]]) -> list[Row]:
    """For each (function, harness), its fastest round, with the spread of its rounds' medians."""
    out = []
    for i in range(len(rounds[0])):
        tries = [r[i] for r in rounds]
        best = min(tries, key=lambda row: row.median)
        spread = max(t.median for t in tries) / best.median - 1 if best.median > 0 else 0.0
        out.append(dataclasses.replace(best, wall=sum(t.wall for t in tries), round_spread=spread))
    return out


def table(rows: list[Row]) -> str:
    header = (f"{'function':<30} {'harness':<25} {'median':>9} {'IQR':>9} {'samples':>12} "
              f"{'rounds':>7} {'wall':>6} {'vs perflab':>10}")
    lines = [header, "-" * len(header)]
    reference: dict[str, float] = {}
    for row in rows:
        if row.harness.startswith("perflab"):
            reference[row.function] = row.median
        ratio = row.median / reference[row.function] if reference.get(row.function) else float("nan")
        samples = f"{row.samples}" + (f" x{row.calls_per_sample}" if row.calls_per_sample > 1 else "")
        lines.append(
            f"{row.function:<30} {row.harness:<25} {format_time(row.median):>9} {format_time(row.iqr):>9} "
            f"{samples:>12} {row.round_spread:>+6.0%} {row.wall:>5.1f}s {ratio:>9.3f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda or mps (default: the best available)")
    # One thread by default: with two threads on a busy 2-core machine a 256x256 matmul was seen to
    # jump from 0.3 ms to 16 ms (one thread waiting a scheduler tick for the busy core), which
    # measures the neighbours, not the harnesses.
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--min-run-time", type=float, default=0.3, help="seconds per harness, function and round")
    parser.add_argument("--rounds", type=int, default=3, help="times each harness runs each function")
    args = parser.parse_args(argv)

    device = env.pick_device(args.device)
    threads = env.set_threads(args.threads)
    print(env.machine_info(device).describe())
    print(f"\nper harness and function: {args.rounds} rounds of min_run_time {args.min_run_time} s, "
          f"{threads} thread(s), device {device}\n")

    started = time.perf_counter()
    harnesses: list[Callable[[str, Callable[[], Any]], Row]] = [
        lambda name, fn: run_perflab(name, fn, device, threads, args.min_run_time),
        lambda name, fn: run_torch(name, fn, threads, args.min_run_time, adaptive=False),
        lambda name, fn: run_torch(name, fn, threads, args.min_run_time, adaptive=True),
    ]
    functions = workloads(device)
    rounds = []
    for r in range(args.rounds):
        by_key: dict[tuple[str, int], Row] = {}
        for name, fn in functions.items():
            for k in range(len(harnesses)):
                h = (r + k) % len(harnesses)  # rotate which harness goes first
                by_key[(name, h)] = harnesses[h](name, fn)
        rounds.append([by_key[(name, h)] for name in functions for h in range(len(harnesses))])
    rows = best_of_rounds(rounds)
    print(table(rows))
    overhead = {r.harness: r.median for r in rows if r.function == "no-op"}
    print("\nper-call overhead (no-op median): " + ", ".join(f"{h} {format_time(t)}" for h, t in overhead.items()))
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
