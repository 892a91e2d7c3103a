"""What lab 1's planted bugs cost, and whether fixing a student's pipeline is a verified gain.

    python bench/bench_mystery.py [--ids alice bob carol] [--rounds 6]

1. Each bug of the catalogue alone against the clean pipeline, at each of its doses, at the mystery's
   graded sizes, in one process: interleaved rounds of a few steps each, the ratio of the fastest rounds
   (noise only adds time), on the verifier's torch thread count. A full dose must cost a large share of
   a step, a light one a small share (each pipeline plants one bug light, so the savings of its bugs
   are clearly apart); a memory bug may cost none.
2. For each id: its planted pipeline against the same pipeline with every bug fixed, re-measured by
   `perflab.verify` in a fresh process with the grader's bar (`perflab.labs.lab01.judges.mystery.FIX_BAR`).
3. For each id: its bugs' doses and drawn amounts, what the grader measures each bug that costs time to
   save (`measured_savings`, in a process forked from its measuring server), and the most of the diagnosis a truth reader earns there:
   one that types the planted lines and types with one constant saving (the best constant of 0 to 0.6)
   or with the catalogue's typical cost of each dose, judged against the better of the grader's two
   measurements. Typed, such savings earn the locations only (no measurement of the notebook's run is
   behind them); the bench shows beside it what they would earn had the run read them.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path


def bug_costs(rounds: int, steps: int) -> dict[str | None, float]:
    """Seconds a step of the clean pipeline (key None) and of each bug alone at each of its doses
    ("key" at its full dose, "key (light)" at its light one)."""
    import torch

    from perflab.labs.lab01.judges import mystery_truth
    from perflab.labs.lab01.judges.mystery_truth import CATALOGUE
    from perflab.mystery.catalogue import AMOUNTS
    from perflab.verify.protocol import VERIFY_THREADS

    torch.set_num_threads(VERIFY_THREADS)  # what the grader's re-measurement runs the pipelines on
    # Each dose at each amount an id can draw (`catalogue.AMOUNTS`), rendered for an id that drew it.
    variants: dict[str | None, tuple[str, tuple[str, ...], str | None]] = {None: ("bench", (), None)}
    for bug in CATALOGUE:
        for dose in (("light",) if bug.always_light else ("full", "light") if bug.light else ("full",)):
            names = sorted({n for line in bug.code(dose) for n in re.findall(r"<<(\w+)>>", line)})
            label = bug.key + (" (light)" if dose == "light" else "")
            light = bug.key if dose == "light" and bug.light else None
            if not names:
                variants[label] = ("bench", (bug.key,), light)
            for name in names:
                for option in AMOUNTS[name]:
                    variants[f"{label} [{name}={option}]"] = (_id_drawing(name, option), (bug.key,), light)
    keys = list(variants)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fns = {k: mystery_truth.pipeline(student, bugs=bugs, light=light).module().make_step(0)
               for k, (student, bugs, light) in variants.items()}
        for fn in fns.values():
            fn()
            fn()
        best = {k: float("inf") for k in keys}
        for r in range(rounds):
            for k in (keys if r % 2 == 0 else keys[::-1]):
                start = time.perf_counter()
                for _ in range(steps):
                    fns[k]()
                best[k] = min(best[k], (time.perf_counter() - start) / steps)
    return best


def _id_drawing(name: str, option: str) -> str:
    """An id whose pipelines take `option` for the amount `name`."""
    from perflab import mystery

    return next(f"bench{i}" for i in range(10_000) if mystery._amounts(f"bench{i}")[name] == option)


def verified_fix(student: str) -> dict[str, object]:
    from perflab import mystery
    from perflab.labs.lab01.judges import mystery_truth
    from perflab.labs.lab01.judges.mystery import FIX_BAR
    from perflab.verify import Side, verify

    data = mystery.sizes_for()[0]
    with tempfile.TemporaryDirectory() as tmp:
        fixed = Path(tmp) / "mystery_fixed.py"
        mystery_truth.pipeline(student, bugs=()).write(fixed)
        baseline = Side.reference("perflab.mystery:planted_step", label="planted", student=student, data=data)
        verdict = verify(baseline, Side.module(fixed, label="fixed", data=data), expectation=FIX_BAR)
    return {"bugs": [p.key for p in mystery_truth.truth(student).planted], "verdict": verdict}


CONSTANTS = tuple(i / 100 for i in range(0, 61, 2))
# A catalogue reader's typical cost per dose: about the middle of the first table's full doses (0.16-0.52
# of a step here) and of its light ones (under 0.07).
TYPICAL = {"full": 0.30, "light": 0.03}


def truth_readers(student: str) -> dict[str, object]:
    """What the grader measures of `student`'s bugs, and the most of the diagnosis a reader of the planted
    truth (every planted line and type right) earns with a saving it did not measure: one constant for
    every bug (the best of 0 to 0.6), or the catalogue's typical cost of each bug's dose (TYPICAL). Each
    is judged as the grader judges it, typed ("typed", no measurement of the notebook's run behind it) and,
    to show what that check holds, as if the notebook's run had read those figures ("as if measured"),
    against the better of the grader's two measurements (the second is taken where the first disagrees).
    Returns {"savings", "amounts", "constant": (typed, as if measured, the constant), "typical": (typed,
    as if measured)}."""
    from perflab import mystery
    from perflab.labs.lab01.judges import mystery_truth
    from perflab.labs.lab01.judges.mystery import measured_savings, score_diagnosis

    planted = mystery_truth.truth(student).planted
    readings = [measured_savings(student, None, attempt) for attempt in (0, 1)]

    def earned(saves: dict[str, float], measured: bool) -> float:
        findings = [{"line": p.lines[-1], "kind": p.kind, "saves": saves[p.key]} for p in planted]
        log = [{"planted": "d", "lines": list(p.lines), "saves": saves[p.key]} for p in planted] if measured else []
        return max(score_diagnosis(findings, planted, savings, log, "d").fraction for savings in readings)

    keys = [p.key for p in planted]
    constant = max(((earned(dict.fromkeys(keys, c), True), c) for c in CONSTANTS), key=lambda pair: pair[0])
    typical = {p.key: TYPICAL[p.dose] for p in planted}
    drawn = mystery._amounts(student)
    amounts = {p.key: {n: drawn[n] for n in _amount_names(p.key, p.dose)} for p in planted}
    return {"savings": readings[0], "amounts": amounts, "doses": {p.key: p.dose for p in planted},
            "constant": (earned(dict.fromkeys(keys, constant[1]), False), constant[0], constant[1]),
            "typical": (earned(typical, False), earned(typical, True))}


def _amount_names(key: str, dose: str) -> list[str]:
    """The drawn amounts (`catalogue.AMOUNTS`) a bug's snippet at `dose` uses."""
    from perflab.labs.lab01.judges.mystery_truth import BY_KEY

    return sorted({n for line in BY_KEY[key].code(dose) for n in re.findall(r"<<(\w+)>>", line)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", nargs="+", default=["alice", "bob", "carol"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)

    from perflab import env, mystery
    from perflab.labs.lab01.judges.mystery import FIX_BAR
    from perflab.verify.protocol import VERIFY_THREADS

    data, image_size, batch = mystery.sizes_for()
    print(f"{env.machine_info().hardware_class}, torch threads {VERIFY_THREADS} (the verifier's); "
          f"mystery pipeline: {data} set, {image_size} px, batch {batch}")
    costs = bug_costs(args.rounds, args.steps)
    clean = costs.pop(None)
    print(f"\nclean step {clean * 1e3:.1f} ms; each bug alone at each dose (fastest of {args.rounds} rounds of "
          f"{args.steps} steps):")
    for key, seconds in costs.items():
        print(f"  {key:24s} {seconds * 1e3:7.1f} ms  {seconds / clean:5.2f}x the clean step  "
              f"(+{(seconds - clean) * 1e3:5.1f} ms)")
    print(f"\nplanted pipeline against its fixed copy, perflab.verify, bar {FIX_BAR:.2f}x:")
    for student in args.ids:
        got = verified_fix(student)
        v = got["verdict"]
        ci = f"CI {v.ci[0]:.2f}-{v.ci[1]:.2f}x" if v.ci else "no CI"
        print(f"  {student:10s} {', '.join(got['bugs']):45s} {v.outcome:5s} "
              f"{(v.speedup or 0):.2f}x ({ci}) in {v.elapsed_seconds:.0f} s")
    print("\neach id's bugs (dose, drawn amounts), the grader's measured saving of each, and the most of the "
          "diagnosis a reader of the planted truth earns with savings it typed (as if measured: what it would "
          "earn if the notebook's run had read them):")
    for student in args.ids:
        got = truth_readers(student)
        print(f"  {student}")
        for key, saved in got["savings"].items():
            drawn = ", ".join(f"{n}={v}" for n, v in got["amounts"][key].items()) or "no drawn amount"
            print(f"    {key:18s} {got['doses'][key]:5s} {drawn:24s} saves {saved:5.2f} of a step")
        typed, as_if, constant = got["constant"]
        print(f"    one constant ({constant:.2f}): {typed:4.0%} typed, {as_if:4.0%} as if measured; "
              f"typical cost per dose {TYPICAL}: {got['typical'][0]:4.0%} typed, {got['typical'][1]:4.0%} "
              "as if measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
