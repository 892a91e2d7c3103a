"""Copies flagged for a person: submissions of one lab whose home measurements two runs cannot share.

A notebook of labs 2, 3, 5 and 6 hands in the raw timing samples its home run measured
(`perflab.labs.homework`), and the grade replays them: a classmate's executed notebook handed in as one's
own would earn what the classmate measured. Two runs never time alike to the microsecond, so the samples
are a fingerprint. After a lab is graded, every pair of its graded submissions is compared
(`review`), and both of a pair whose samples only a copy could share are flagged, each naming the other;
nothing is deducted (a person decides). What is compared:

* **Timing samples only**: the raw seconds (or samples/s) of every recorded measurement, never its
  configuration, worker counts, losses or accuracies, which two honest students on identical lab machines
  with the kit's fixed seeds share.
* **The same values** (`MIN_SHARED`): a copy, unchanged or with comments and answers reworded. Only a
  value with a measurement's precision counts (`MIN_DIGITS`), so round numbers never meet by chance.
* **The same shape, rescaled or jittered** (`MIN_CORRELATION`, `SCALE_TOLERANCE`): samples of the same
  measurement (same kind and place in the record) whose logs, each sequence centred on its own mean, are
  the same up to order, or move together: a copy multiplied by a constant, reordered, or with a little
  noise added keeps the classmate's block-to-block pattern, which a second run does not. What every run
  shares (a first epoch slower) is taken out where the class shows it (`class_pattern`).
* **The solution code**, names, comments and docstrings aside, is reported beside a flag, never a flag
  on its own: honest students often write the same short solution.

The thresholds are named below with the measurements behind them (two honest tiny-mode home runs of each
lab's reference on one machine; tests/fixtures/copies/).
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import math
import re
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

from perflab.labs import registry

log = logging.getLogger(__name__)

FINGERPRINT_VERSION = 1
# Kept with the course, one file per graded submission: <course>/.perflab/copies/<lab>/<student>.json,
# and the pairs the last review found: <course>/.perflab/copies.json.
FOLDER = Path(".perflab") / "copies"
PAIRS_FILE = Path(".perflab") / "copies.json"

# Records whose numbers are not timing: a decision (its configuration) and lab 6's fixed-seed accuracy
# run (its losses and accuracies are the same for every honest student on the same software).
# Each lab lists its own in its manifest (`untimed_records`).
NOT_TIMED_KINDS = frozenset(kind for lab in registry.manifests() for kind in lab.untimed_records)
# Fields of a recorded measurement that say how it was taken, not what it measured.
NOT_TIMED_FIELDS = frozenset({"block_size", "threads", "warmup", "quantile", "labels", "device", "hardware_class",
                              "timer", "label", "steps", "n_eval", "args", "tuple", "where", "changes"})
# Significant digits a measured float carries: a perf_counter interval or a rate derived from one has
# 15-17; a number a person typed or chose (0.2, 9.0, 1e-3) has a few. Below this it is not a sample.
MIN_DIGITS = 8
# Two values are the same sample where they agree to this many significant digits (1e-9 relative):
# a notebook re-saved by Jupyter keeps every digit, and timer noise never repeats at this resolution.
SAME_DIGITS = 10
# Distinct samples two submissions must share to be a copy. Two honest tiny-mode runs of each lab's
# reference shared none of their 26-32 (lab 2), 24 (lab 3), 54 (lab 5) and 48 (lab 6) samples; the fixed-
# seed losses they share exactly (lab 6's accuracy run: 1.496796727180481 in both) are not samples. A copy
# that ran one cell again still shares the other cells' samples, each record holding more than this.
MIN_SHARED = 3
# Aligned samples (each sequence counted less one, for its own mean) a correlation needs before it flags:
# of independent runs, r >= 0.95 over 12 is a 5-sigma event (Fisher's z); over 4 it is not rare.
MIN_ALIGNED = 12
# Correlation of the centred log samples above which a pair is one run, rescaled or jittered. Two honest
# runs correlated at 0.06 (lab 3, 18 aligned samples), -0.04 (lab 5, 46) and -0.44 (lab 6, 44); a copy
# with 2% noise added kept r >= 0.988 (lab 3, 20 draws) and 0.989 (lab 6), with 5% 0.92-0.94: the runs'
# own spread there was 13-17% (a loaded 2-core host). Noise near the runs' own spread hides a copy.
MIN_CORRELATION = 0.95
# Submissions a class pattern (what all runs of a lab share at each position of a sequence) is estimated
# from before it is taken out: from fewer, a median is mostly the pair's own noise.
MIN_CLASS = 5
# Sorted centred log samples of two submissions equal to within this (relative 1e-6): the same values up
# to one scale, in any order. Honest runs differ by a percent or more.
SCALE_TOLERANCE = 1e-6
# A statement of a solution counts for the code signal where its syntax tree has this many nodes: an
# import or `x = y` is written alike by everyone.
MIN_STATEMENT_NODES = 12
# What a student's feedback says of a held submission (never whom it matched).
HELD_NOTE = ("this submission is held for an instructor's review before its grade is final (nothing has been "
             "deducted)")
# The place of a sequence across a table's settings (lab 2's throughput against worker count).
ACROSS = "[settings]"
# Sequences whose samples repeat one measurement in interleaved, primed blocks (a comparison's sides, a
# compile's steady calls, lab 6's rounds): their order is noise, so two runs' correlate only by copying
# (two honest lab 3 runs: r = 0.06). Any other sequence has a shape every run shares (throughput against
# worker count, a first epoch that starts the workers: two honest lab 2 runs correlate at 0.93 over 4
# epoch starts), and is correlated only beside the class's (`class_pattern`).
REPEATED = frozenset({"a_times", "b_times", "steady", "times"})
REPEATED_KINDS = frozenset(kind for lab in registry.manifests() for kind in lab.repeated_records)
# Each flag line this module writes starts so (a later review replaces them all).
FLAG_PREFIX = "copies: "
# What formgrader's comment shows for those lines: nbgrader's feedback renders it for the student, who is
# told only that the submission is held (`perflab grade status` and the export name the pair).
HELD_FLAG = "held for review: `perflab grade status` and the export say why"


@dataclass(frozen=True)
class Fingerprint:
    """What one graded submission of a lab measured at home, and its solution code, normalised."""

    student: str
    lab: str
    sha256: str
    series: dict[str, tuple[float, ...]]  # label (kind, its occurrence, place in the record) -> timing samples
    statements: tuple[str, ...] = ()  # digests of its written statements, names and comments aside

    def to_dict(self) -> dict[str, Any]:
        return {"version": FINGERPRINT_VERSION, "student": self.student, "lab": self.lab, "sha256": self.sha256,
                "series": {k: list(v) for k, v in self.series.items()}, "statements": list(self.statements)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        if data.get("version") != FINGERPRINT_VERSION:
            raise ValueError(f"fingerprint version {data.get('version')!r}, expected {FINGERPRINT_VERSION}")
        series = {str(k): tuple(float(x) for x in v) for k, v in data["series"].items()}
        return cls(str(data["student"]), str(data["lab"]), str(data["sha256"]), series,
                   tuple(str(s) for s in data.get("statements", ())))


@dataclass(frozen=True)
class Pair:
    """Two submissions of a lab whose home measurements one run made."""

    lab: str
    students: tuple[str, str]
    shared: int  # distinct timing samples both carry
    aligned: int  # aligned samples the correlation was taken over (0: none aligned)
    correlation: float | None
    rescaled: bool  # the same samples up to one scale, in any order
    code: tuple[int, int]  # (statements of the smaller solution the other also wrote, its statements)
    matched: int = 0  # aligned samples compared up to one scale (`aligned` and the tables' settings)

    def why(self) -> str:
        """What the two share, in words."""
        parts = []
        if self.shared:
            parts.append(f"{self.shared} identical raw timing sample(s)")
        if self.rescaled:
            parts.append(f"{self.matched} aligned timing samples the same up to one scale, in any order")
        elif self.correlation is not None and self.correlation >= MIN_CORRELATION:
            parts.append(f"{self.aligned} aligned timing samples correlated at r={self.correlation:.4f} "
                         "(one run, rescaled or jittered)")
        same, of = self.code
        parts.append(f"solution code: {same} of {of} written statement(s) the same, names and comments aside"
                     if of else "solution code: none to compare")
        return "; ".join(parts)

    def flag(self, student: str) -> str:
        """The flag line of `student`'s record, naming the other of the pair."""
        other = self.students[1] if student == self.students[0] else self.students[0]
        return (f"{FLAG_PREFIX}the home measurements match {other}'s submission of {self.lab} ({self.why()}): "
                "two runs never time alike; held for review, nothing deducted")

    def to_dict(self) -> dict[str, Any]:
        return {"lab": self.lab, "students": list(self.students), "shared": self.shared, "aligned": self.aligned,
                "correlation": self.correlation, "rescaled": self.rescaled, "code": list(self.code),
                "matched": self.matched, "why": self.why()}


# ---------------------------------------------------------------------------------------------
# fingerprints


def fingerprint(entries: Iterable[Mapping[str, Any]], nb: Any, *, student: str, lab: str, sha256: str) -> Fingerprint:
    """The fingerprint of a submission: the timing samples of its home records (`homework.from_notebook`),
    and the statements of its answer cells (`nb`, an nbformat notebook; None for none)."""
    return Fingerprint(student, lab, sha256, timing_series(entries), solution_statements(nb) if nb is not None else ())


def timing_series(entries: Iterable[Mapping[str, Any]]) -> dict[str, tuple[float, ...]]:
    """{label: samples} of every timing sequence in `entries`; a label names the record's kind, the place
    in the record and, for a kind recorded more than once (lab 6's screenings), which occurrence: not the
    record's key, which holds digests of the code a cosmetic edit changes. A sequence repeated inside a
    submission (lab 6's FINAL, in the ablation and in each leave-one-out) is kept once."""
    out: dict[str, tuple[float, ...]] = {}
    seen: set[tuple[float, ...]] = set()
    occurrences: dict[str, int] = {}
    for entry in entries:
        kind = str(entry.get("kind"))
        if kind in NOT_TIMED_KINDS:
            continue
        occurrences[kind] = occurrences.get(kind, 0) + 1
        for path, values in _walk(entry.get("value"), ()):
            if values and values not in seen:
                seen.add(values)
                out[f"{kind}#{occurrences[kind]} {'/'.join(path)}"] = values
    return out


def _walk(value: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], tuple[float, ...]]]:
    """(place, measured floats) of every sequence of numbers in `value`, and of every single number. A table
    of settings (lab 2's [[worker count, samples/s], ...]) is one sequence across its settings, its place
    ending in `ACROSS`; a setting measured several times is a sequence of its own too."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if str(k) not in NOT_TIMED_FIELDS:
                yield from _walk(v, (*path, str(k)))
    elif isinstance(value, (list, tuple)):
        if value and all(_is_number(x) for x in value):
            yield path, tuple(float(x) for x in value if _is_time(x))
        elif value and all(isinstance(x, (list, tuple)) and len(x) == 2 and _is_number(x[0]) for x in value):
            yield (*path, ACROSS), tuple(float(x[1]) for x in value if _is_time(x[1]))
            for i, (_, v) in enumerate(value):
                if isinstance(v, (list, tuple)):
                    yield from _walk(v, (*path, str(i)))
        else:
            for i, v in enumerate(value):
                yield from _walk(v, (*path, str(i)))
    elif _is_number(value) and _is_time(value):
        yield path, (float(value),)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_time(x: Any) -> bool:
    """A positive, finite float: a count (an int) is not a time."""
    return isinstance(x, float) and math.isfinite(x) and x > 0


def _precise(x: float) -> bool:
    """Whether `x` carries a measurement's precision (`MIN_DIGITS`), not a number a person chose or rounded."""
    return float(f"{x:.{MIN_DIGITS - 1}g}") != x


def _same(x: float) -> str:
    return f"{x:.{SAME_DIGITS - 1}e}"


# ---------------------------------------------------------------------------------------------
# solution code, names and comments aside


def solution_statements(nb: Any) -> tuple[str, ...]:
    """Sorted digests of the statements of `nb`'s answer cells (nbgrader `solution` cells), every name
    replaced by one placeholder and docstrings dropped (comments are not in the tree), so that renaming,
    recommenting, reordering or inserting statements changes no other statement's digest; statements too
    small to tell two authors apart (`MIN_STATEMENT_NODES`) and blank answers are left out."""
    out: set[str] = set()
    for cell in getattr(nb, "cells", []):
        if cell.get("cell_type") != "code" or not (cell.get("metadata", {}).get("nbgrader") or {}).get("solution"):
            continue
        source = "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line
                           for line in str(cell.get("source", "")).splitlines())
        try:
            tree = _Anonymous().visit(ast.parse(source))
        except (SyntaxError, ValueError, RecursionError):
            continue
        for statement in _statements(tree.body):
            if sum(1 for _ in ast.walk(statement)) >= MIN_STATEMENT_NODES and "NotImplementedError" not in ast.dump(statement):
                out.add(hashlib.sha256(ast.dump(statement).encode()).hexdigest()[:16])
    return tuple(sorted(out))


def _statements(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Each statement, and each statement inside a function or class (a whole function is one too)."""
    for statement in body:
        yield statement
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _statements(statement.body)


class _Anonymous(ast.NodeTransformer):
    """Every name one placeholder; docstrings and other bare strings dropped."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(id="_", ctx=node.ctx)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        return ast.arg(arg="_")

    def _named(self, node: Any) -> Any:
        node.name = "_"
        node.body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                                  and isinstance(s.value.value, str))] or [ast.Pass()]
        return self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _named

    def visit_Expr(self, node: ast.Expr) -> ast.AST | None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return None
        return self.generic_visit(node)


# ---------------------------------------------------------------------------------------------
# comparing two


# A label's pattern: each position's median centred log over a lab's submissions (`class_pattern`).
Pattern = dict[str, tuple[float, ...]]


def class_pattern(fingerprints: Sequence[Fingerprint]) -> Pattern:
    """What the submissions of a lab share at each position of each sequence (the first block slower, the
    alternation of an ABBA order), where `MIN_CLASS` of them time it: each position's median centred log
    over the sequences of the label's most common length (a median: a few copies among them move it little)."""
    by_label: dict[str, list[list[float]]] = {}
    for fp in fingerprints:
        for label, values in fp.series.items():
            if len(values) >= 2:
                by_label.setdefault(label, []).append(_centred_logs(values))
    out: Pattern = {}
    for label, rows in by_label.items():
        length = max({len(r) for r in rows}, key=lambda n: sum(1 for r in rows if len(r) == n))
        rows = [r for r in rows if len(r) == length]
        if len(rows) >= MIN_CLASS:
            out[label] = tuple(statistics.median(col) for col in zip(*rows, strict=True))
    return out


def compare(a: Fingerprint, b: Fingerprint, pattern: Pattern | None = None) -> Pair:
    """What `a` and `b` share (`Pair`); `is_copy` says whether it is what two runs cannot share. With the
    lab's `class_pattern`, what every run shares at each position is taken out before correlating: two
    honest runs then share only noise."""
    mine = {_same(x) for values in a.series.values() for x in values if _precise(x)}
    shared = len(mine & {_same(x) for values in b.series.values() for x in values if _precise(x)})
    resid_a: list[float] = []
    resid_b: list[float] = []
    gap = 0.0
    aligned = matched = 0
    moved = False
    for label, xs in a.series.items():
        ys = b.series.get(label)
        if ys is None or len(ys) != len(xs) or len(xs) < 2:
            continue
        ca, cb = _centred_logs(xs), _centred_logs(ys)
        gap = max(gap, max(abs(p - q) for p, q in zip(sorted(ca), sorted(cb), strict=True)))
        moved = moved or any(abs(x) > SCALE_TOLERANCE for x in ca)
        matched += len(xs) - 1
        shape = (pattern or {}).get(label, ())
        if len(shape) == len(xs):
            ca, cb = [p - o for p, o in zip(ca, shape, strict=True)], [q - o for q, o in zip(cb, shape, strict=True)]
        elif not _repeats(label):
            continue  # a shape every run shares (worker counts, first epoch and later): not alone
        resid_a += ca
        resid_b += cb
        aligned += len(xs) - 1
    correlation = _pearson(resid_a, resid_b) if aligned else None
    rescaled = matched >= MIN_ALIGNED and gap <= SCALE_TOLERANCE and moved
    sa, sb = set(a.statements), set(b.statements)
    code = (len(sa & sb), min(len(sa), len(sb)))
    first, second = sorted((a.student, b.student))
    return Pair(a.lab, (first, second), shared, aligned, correlation, rescaled, code, matched)


def is_copy(pair: Pair) -> bool:
    """Whether `pair` shares what two runs cannot: the same samples, or one run's rescaled or jittered."""
    return (pair.shared >= MIN_SHARED or pair.rescaled
            or (pair.aligned >= MIN_ALIGNED and pair.correlation is not None and pair.correlation >= MIN_CORRELATION))


def copies(fingerprints: Sequence[Fingerprint]) -> list[Pair]:
    """Every pair of `fingerprints` (one lab's) that `is_copy`, in student order. The pairs that share the
    same samples (or the same up to one scale) are found first; the others are correlated beside what the
    rest of the class shares (`class_pattern`, of the submissions found in no such pair: a classmate's
    samples handed in three times would otherwise be the pattern)."""
    prints = sorted(fingerprints, key=lambda f: f.student)
    plain = [(a, b, compare(a, b)) for a, b in combinations(prints, 2)]
    same = {s for _, _, p in plain if p.shared >= MIN_SHARED or p.rescaled for s in p.students}
    pattern = class_pattern([fp for fp in prints if fp.student not in same])
    found = [p if p.shared >= MIN_SHARED or p.rescaled or not pattern else compare(a, b, pattern) for a, b, p in plain]
    return [p for p in found if is_copy(p)]


def _repeats(label: str) -> bool:
    """Whether the sequence `label` names repeats one measurement (`REPEATED`)."""
    kind, _, path = label.partition(" ")
    return kind.rsplit("#", 1)[0] in REPEATED_KINDS or bool(REPEATED & set(path.split("/")))


def _centred_logs(values: Sequence[float]) -> list[float]:
    logs = [math.log(v) for v in values]
    mean = sum(logs) / len(logs)
    return [x - mean for x in logs]


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The correlation of two centred sequences; None where one does not vary."""
    sxx = sum(x * x for x in xs)
    syy = sum(y * y for y in ys)
    if sxx <= 0 or syy <= 0:
        return None
    return sum(x * y for x, y in zip(xs, ys, strict=True)) / math.sqrt(sxx * syy)


# ---------------------------------------------------------------------------------------------
# kept with the course, and reviewed after grading


def _path(course: Path, lab: str, student: str) -> Path:
    if not re.fullmatch(r"[\w.-]+", lab) or not re.fullmatch(r"[\w.@+-]+", student):
        raise ValueError(f"{lab}/{student}: not a lab and student id a file may be named after")
    return Path(course) / FOLDER / lab / f"{student}.json"


def keep(course: Path, fp: Fingerprint) -> Path:
    """Write `fp` with the course (replacing the student's earlier submission's)."""
    path = _path(course, fp.lab, fp.student)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fp.to_dict()), encoding="utf-8")
    return path


def kept(course: Path, lab: str) -> list[Fingerprint]:
    """Every fingerprint kept for `lab`; an unreadable one is logged and left out."""
    out = []
    for path in sorted((Path(course) / FOLDER / lab).glob("*.json")):
        try:
            out.append(Fingerprint.from_dict(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: not a fingerprint (%s); left out of the comparison", path, exc)
    return out


def keep_submission(course: Path, job: Any) -> Fingerprint | None:
    """The fingerprint of `job`'s submitted notebook (a `result.Job`), kept with the course; None where the
    file changed since it was collected or is not a notebook (nothing is kept)."""
    import nbformat

    from perflab.labs import homework

    try:
        data = Path(job.path).read_bytes()
        if hashlib.sha256(data).hexdigest() != job.sha256:
            log.warning("%s/%s: the submission changed since it was collected; not compared", job.lab, job.student)
            return None
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
    except (OSError, ValueError, UnicodeDecodeError, AttributeError, KeyError, TypeError):
        return None
    fp = fingerprint(homework.from_notebook(nb), nb, student=job.student, lab=job.lab, sha256=job.sha256)
    try:
        keep(course, fp)
    except ValueError as exc:
        log.warning("%s; not compared with the lab's other submissions", exc)
        return None
    return fp


@dataclass(frozen=True)
class _Submitted:
    """A graded submission's file, as `keep_submission` reads a `result.Job`."""

    student: str
    lab: str
    path: Path
    sha256: str


def review(course: Path, state: Any, labs: Iterable[str]) -> list[Pair]:
    """Compare every graded submission of each of `labs` with every other (`copies`), flag both of each
    pair in their records (`merge.review`: a flag line naming the other, and `HELD_NOTE` for the student),
    clear what an earlier review flagged and no longer holds, and keep the pairs with the course (`pairs`)."""
    from perflab.grading import merge

    labs = sorted(set(labs))
    found: list[Pair] = []
    for lab in labs:
        records = {r.student: r for r in state.records.values() if r.lab == lab}
        prints = [fp for fp in kept(course, lab) if fp.student in records and records[fp.student].sha256 == fp.sha256]
        have = {fp.student for fp in prints}
        for student, record in records.items():  # graded before fingerprints were kept: from the file graded
            if student not in have:
                for path in sorted((Path(course) / "submitted" / student / lab).glob("*.ipynb")):
                    fp = keep_submission(course, _Submitted(student, lab, path, record.sha256))
                    if fp is not None:
                        prints.append(fp)
                        break
        pairs = copies(prints)
        found += pairs
        lines: dict[str, list[str]] = {}
        for pair in pairs:
            for student in pair.students:
                lines.setdefault(student, []).append(pair.flag(student))
        for student, record in records.items():
            flags = [f for f in record.flags if not f.startswith(FLAG_PREFIX)] + lines.get(student, [])
            notes = [n for n in record.notes if n != HELD_NOTE] + ([HELD_NOTE] if student in lines else [])
            if tuple(flags) != record.flags or tuple(notes) != record.notes:
                shown = [HELD_FLAG if f.startswith(FLAG_PREFIX) else f for f in flags]
                merge.review(course, state, record, flags=flags, notes=notes, shown=list(dict.fromkeys(shown)))
    path = Path(course) / PAIRS_FILE
    doc = _read_pairs(path)
    doc.update({lab: [p.to_dict() for p in found if p.lab == lab] for lab in labs})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: v for k, v in sorted(doc.items()) if v}, indent=1), encoding="utf-8")
    return found


def pairs(course: Path) -> list[dict[str, Any]]:
    """The pairs the last review of each lab flagged: {"lab", "students", "why", ...}, by lab."""
    return [p for lab_pairs in _read_pairs(Path(course) / PAIRS_FILE).values() for p in lab_pairs]


def pair_line(pair: Mapping[str, Any]) -> str:
    """One pair in a line: `lab: a ~ b (what they share)`."""
    a, b = pair["students"]
    return f"{pair['lab']}: {a} ~ {b} ({pair['why']})"


def _read_pairs(path: Path) -> dict[str, list[dict[str, Any]]]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): [p for p in v if isinstance(p, dict)] for k, v in doc.items() if isinstance(v, list)} \
        if isinstance(doc, dict) else {}
