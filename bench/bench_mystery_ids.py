"""Does an honest diagnosis of lab 1's mystery pipeline earn every mark, whatever the id draws?

    python bench/bench_mystery_ids.py [--ids 40] [--repeats 2] [--mode grade]

Picks `--ids` fresh ids by enumerating draws (`perflab.mystery._plan` and `_amounts`), greedily, so that
together they hold every pair of the catalogue's bugs, every pair of (bug, dose), and every bug at every
amount it can draw (`catalogue.AMOUNTS`), then as many pairs of (bug, dose, amount) as the count
allows; the first id holds the held-out pairing (the accuracy bug on 8 images beside the histograms
and the per-step `append` of the batch). Each id is graded `--repeats` times:

1. the notebook's side: the solution's part 10 (the reference investigation, from `MY_ID` to the
   diagnosis's grade cell, its hidden blocks left out) runs in a fresh interpreter, as a grading
   kernel runs it, and its diagnosis probe's observation comes back (findings and the log of what
   `lab01_mystery.savings` measured); for each further grading the same interpreter measures the
   savings of its copies again as the cell does (the lines found do not vary, the savings do);
2. the grader's side: lab 1's diagnosis judge (`perflab.labs.lab01.judges.mystery.judge_diagnosis`) judges
   that observation in this process, measuring the savings through its savings server.

It prints each grading's marks (of the cell's 8) and, per planted bug that costs time, the notebook's
saving beside the grader's (a second grader reading where the judge took one), then the worst
agreement: the largest gap, the largest ratio where both read 0.1 or more, and the bugs whose
notebook reading fell outside the judge's band (`saving_agrees`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LAB = "lab01_measure"
POINTS = 8  # the diagnosis cell's points
CANDIDATES = 20_000  # ids enumerated to choose from
ID_PREFIX = "bench-id-"
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", re.S)


# ---------------------------------------------------------------------------------------------
# Which ids


def variants(student: str) -> tuple[tuple[str, ...], ...]:
    """(bug, dose, the amounts its code takes...) of each bug planted for `student`."""
    from perflab import mystery
    from perflab.mystery.catalogue import SNIPPET_BY_KEY

    amounts = mystery._amounts(student)
    out = []
    for key, dose in mystery._plan(student):
        names = sorted({n for line in SNIPPET_BY_KEY[key].code(dose) for n in re.findall(r"<<(\w+)>>", line)})
        out.append((key, dose, *(amounts[n] for n in names)))
    return tuple(out)


def _covers(drawn: tuple[tuple[str, ...], ...]) -> tuple[set[Any], set[Any]]:
    """What one draw covers: (must: bug pairs, (bug, dose) pairs, single variants; then: variant pairs)."""
    pairs = list(itertools.combinations(drawn, 2))
    must = ({("bugs", frozenset((a[0], b[0]))) for a, b in pairs}
            | {("doses", frozenset((a[:2], b[:2]))) for a, b in pairs} | {("variant", v) for v in drawn})
    return must, {("variants", frozenset(p)) for p in pairs}


def is_held_out_pairing(drawn: tuple[tuple[str, ...], ...]) -> bool:
    keys = {v[0]: v for v in drawn}
    return (set(keys) == {"eval_accuracy", "grad_histograms", "batch_history"}
            and keys["eval_accuracy"][2:] == ("8",))


def choose_ids(count: int) -> list[str]:
    """`count` ids covering every bug pair, (bug, dose) pair and variant (then variant pairs, greedily), where
    `count` is enough for that (40 is)."""
    drawn = {f"{ID_PREFIX}{i}": variants(f"{ID_PREFIX}{i}") for i in range(CANDIDATES)}
    covers = {student: _covers(d) for student, d in drawn.items()}
    must_left = set().union(*(must for must, _ in covers.values()))
    then_left = set().union(*(then for _, then in covers.values()))
    chosen: list[str] = []
    while len(chosen) < count:
        if chosen:
            best = max((s for s in covers if s not in chosen),
                       key=lambda s: (len(covers[s][0] & must_left), len(covers[s][1] & then_left)))
        else:
            best = next(s for s, d in drawn.items() if is_held_out_pairing(d))
        chosen.append(best)
        must_left -= covers[best][0]
        then_left -= covers[best][1]
    if must_left:
        print(f"note: {count} ids leave {len(must_left)} bug pairs, dose pairs or amounts uncovered "
              "(40 cover them all)", flush=True)
    return chosen


# ---------------------------------------------------------------------------------------------
# The notebook's side (a fresh interpreter, as a grading kernel)


def notebook_side(student: str, mode: str, repeats: int) -> list[dict[str, Any]]:
    """Run part 10 of the solution up to the diagnosis's grade cell here, then measure its savings again
    `repeats - 1` times as its investigation cell does (`lab01_mystery.savings` of its copies, each
    finding's `saves` that reading rounded, the log holding only that reading); each time, the diagnosis
    probe's observation. The lines the investigation finds do not vary; what varies is measured again."""
    import matplotlib

    matplotlib.use("Agg")
    from perflab.grading.probing import run_probes
    from perflab.labs import build
    from perflab.labs.lab01 import mystery as lab01_mystery

    os.environ["PERFLAB_STUDENT_ID"] = student
    os.environ["PERFLAB_MODE"] = mode
    cells = [c for c in build.read_notebook(build.source_notebook(LAB)).cells if c.cell_type == "code"]
    start = next(i for i, c in enumerate(cells) if "MY_ID = " in c.source)
    stop = next(i for i, c in enumerate(cells)
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "mystery_diagnosis")
    namespace: dict[str, Any] = {"__name__": "__main__"}
    probe = {"mystery_diagnosis": lab01_mystery.PROBES["mystery_diagnosis"]}
    out = []
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(cells[0].source.replace("common.setup_notebook()", ""), "setup", "exec"), namespace)
        for repeat in range(repeats):
            started = time.perf_counter()
            if repeat == 0:
                for cell in cells[start:stop + 1]:
                    exec(compile(HIDDEN.sub("", re.sub(r"(?m)^%.*$", "", cell.source)), "cell", "exec"), namespace)
            else:
                lab01_mystery._MEASURED.clear()
                saved = lab01_mystery.savings(namespace["PIPELINE"], namespace["copies"])
                for finding, value in zip(namespace["DIAGNOSIS"], saved, strict=True):
                    finding["saves"] = round(value, 3)
            out.append(json.loads(json.dumps({"observations": run_probes(probe, namespace, 0),
                                              "state": dict(lab01_mystery.MEASURED_STATE),
                                              "rounds": {f["line"]: [round(r, 3) for r in ratios] for f, ratios
                                                         in zip(namespace["DIAGNOSIS"], lab01_mystery.MEASURED_ROUNDS,
                                                                strict=False)},
                                              "seconds": time.perf_counter() - started})))
    return out


def run_notebook_side(student: str, mode: str, repeats: int) -> list[dict[str, Any]]:
    """`notebook_side` in a fresh interpreter (a grading kernel is one)."""
    with tempfile.TemporaryDirectory(prefix="perflab-bench-nb-") as tmp:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--notebook", student, "--mode", mode,
                               "--repeats", str(repeats)], cwd=tmp, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    if done.returncode or not lines:
        raise RuntimeError(f"{student}: the notebook's side failed: {done.stderr.strip()[-600:]}")
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------
# The grader's side


def grade(student: str, mode: str, notebook: dict[str, Any]) -> dict[str, Any]:
    """The diagnosis judge on the notebook's observation, with the grader's readings it measured."""
    from perflab.grading import judging
    from perflab.labs.lab01.judges import mystery as judges
    from perflab.labs.lab01.judges import mystery_truth, savings_server
    from perflab.labs.lab01.judges.mystery_truth import BY_KEY

    readings: list[dict[str, float]] = []
    measure = savings_server.measure

    def recorded(*args: Any, **kwargs: Any) -> dict[str, float]:
        got = measure(*args, **kwargs)
        readings.append(got)
        return got

    judges.measured_savings.cache_clear()
    savings_server.measure = recorded
    try:
        ctx = judging.Context(LAB, 0, mode, notebook["observations"], student=student)
        mark = judging.judge_cell("mystery_diagnosis", judges.judge_diagnosis, ctx)
    finally:
        savings_server.measure = measure
        judges.measured_savings.cache_clear()
    case = mystery_truth.truth(student, mode)
    findings = notebook["observations"]["mystery_diagnosis"]["observed"]["findings"]
    bugs = []
    for planted in case.planted:
        if not BY_KEY[planted.key].costs_time:
            continue
        said = next((f.get("saves") for f in findings if f.get("line") in planted.accepted_lines), None)
        bugs.append({"key": planted.key, "dose": planted.dose, "notebook": said,
                     "grader": [r.get(planted.key) for r in readings]})
    return {"marks": POINTS * mark.fraction, "message": mark.message, "bugs": bugs,
            "grader_state": dict(savings_server.LAST_STATE)}


# ---------------------------------------------------------------------------------------------
# The table


def _label(student: str) -> str:
    return ", ".join("/".join(v[:2]) + (f"={v[2][:12]}" if len(v) > 2 else "") for v in variants(student))


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The worst notebook/grader agreement over every timed bug of `rows`."""
    from perflab.labs.lab01.judges.mystery import saving_agrees

    gaps, ratios, outside = [], [], []
    for row in rows:
        for bug in row["bugs"]:
            if bug["notebook"] is None or not bug["grader"]:
                continue
            nb, g = max(float(bug["notebook"]), 0.0), float(bug["grader"][0])
            where = f"{row['id']} #{row['repeat']} {bug['key']} ({bug['dose']})"
            gaps.append((abs(nb - g), where, nb, g))
            if min(nb, g) >= 0.1:  # a ratio to a reading near 0 says nothing
                ratios.append((max(nb, g) / max(min(nb, g), 1e-9), where, nb, g))
            if not saving_agrees(nb, g):
                outside.append((where, nb, g))
    return {"gap": max(gaps, default=None), "ratio": max(ratios, default=None), "outside": outside,
            "readings": len(gaps)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=40, help="how many ids (at least the 28 bug pairs need)")
    parser.add_argument("--repeats", type=int, default=2, help="gradings of each id")
    parser.add_argument("--mode", default="grade", help="the run mode the grader grades in")
    parser.add_argument("--notebook", metavar="ID", help=argparse.SUPPRESS)  # the notebook's side, one id
    args = parser.parse_args(argv)
    if args.notebook:
        print(json.dumps(notebook_side(args.notebook, args.mode, args.repeats)))
        return 0
    if args.ids < 1 or args.repeats < 1:
        parser.error("--ids and --repeats: at least 1")

    from tqdm import tqdm

    from perflab import env, mystery
    from perflab.labs.lab01.judges import savings_server

    ids = choose_ids(args.ids)
    print(f"{env.machine_info().hardware_class}; mode {args.mode} ({'/'.join(map(str, mystery.sizes_for(args.mode)))}); "
          f"{len(ids)} ids x {args.repeats} gradings; the first holds the held-out pairing", flush=True)
    savings_server.warm_up()
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    bar = tqdm(total=len(ids) * args.repeats, unit="grading", file=sys.stderr, mininterval=5)
    for student in ids:
        for repeat, notebook in enumerate(run_notebook_side(student, args.mode, args.repeats)):
            graded = grade(student, args.mode, notebook)
            row = {"id": student, "repeat": repeat + 1, **graded, "notebook_state": notebook["state"]}
            rows.append(row)
            print(_row_line(row), flush=True)
            if row["marks"] < POINTS - 1e-6:  # what each finding's median was taken over
                print(f"    notebook's rounds by finding line: {notebook.get('rounds')}", flush=True)
            if row["notebook_state"] != row["grader_state"]:
                print(f"    states differ: notebook {row['notebook_state']}, grader {row['grader_state']}", flush=True)
            bar.update(1)
    bar.close()
    full = sum(row["marks"] >= POINTS - 1e-6 for row in rows)
    worst = agreement(rows)
    print(f"\n{full} of {len(rows)} gradings earned all {POINTS} points "
          f"({len({r['id'] for r in rows if r['marks'] < POINTS - 1e-6})} ids lost marks); "
          f"{worst['readings']} notebook/grader pairs of readings; {(time.perf_counter() - started) / 60:.1f} min")
    if worst["gap"]:
        gap, where, nb, g = worst["gap"]
        print(f"largest gap: {gap:.3f} ({where}: notebook {nb:.3f}, grader {g:.3f})")
    if worst["ratio"]:
        ratio, where, nb, g = worst["ratio"]
        print(f"largest ratio where both read 0.1 or more: {ratio:.2f}x ({where}: notebook {nb:.3f}, "
              f"grader {g:.3f})")
    print(f"readings outside the judge's band (first grader reading): {len(worst['outside'])}"
          + "".join(f"\n  {where}: notebook {nb:.3f}, grader {g:.3f}" for where, nb, g in worst["outside"]))
    return 0 if full == len(rows) else 1


def _row_line(row: dict[str, Any]) -> str:
    parts = []
    for bug in row["bugs"]:
        nb = "  -  " if bug["notebook"] is None else f"{bug['notebook']:.3f}"
        grader = " / ".join(f"{g:.3f}" for g in bug["grader"] if g is not None) or "-"
        parts.append(f"{bug['key']}({bug['dose']}) nb {nb} | grader {grader}")
    line = f"{row['id']:16s} #{row['repeat']}  {row['marks']:4.1f}/{POINTS}  [{_label(row['id'])}]\n    " + "; ".join(parts)
    if row["marks"] < POINTS - 1e-6:
        line += f"\n    lost: {row['message']}"
    return line


if __name__ == "__main__":
    sys.exit(main())
