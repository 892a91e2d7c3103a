"""Lab 1, part 10: the mystery pipeline. What the notebook calls, the contract of its answers, and the
probes that hand those answers to the grader.

The notebook writes the student's own pipeline (`write_pipeline`), profiles it with lab 1's tools
(`line_costs` is line_profiler over every function of the script; cProfile, torch.profiler and the
memory tools are used directly), and answers in five names:

    DIAGNOSIS       a list with one finding per bug found, each a dict:
                      line      int, the line of the pipeline file where the bug is
                      function  str, the function (or method, "Class.method") holding that line
                      kind      the bottleneck type: "data", "sync", "compute" or "memory"
                      tool      which tool showed it (one of TOOLS)
                      evidence  str, what that tool showed (your numbers)
                      fix       str, what you changed
                      saves     float, what fixing this bug alone saves of the planted pipeline's step
                                time, as this notebook measured it: 1 - t(fixed alone) / t(planted),
                                e.g. 0.25, what `saving(PIPELINE, copy_with_only_this_fix)` returned (it
                                measures as the grader does), or the mean or median of several such
                                readings; about 0 for a bug that costs memory, not time (such a bug
                                earns no share of the diagnosis: no step time tells finding it from
                                reading it)
    FIXED_PIPELINE  the path of your fixed copy of the pipeline, written by a cell of this notebook
                    (only the notebook is submitted): it must train exactly as the planted one
    FIX_SPEEDUP     the fixed copy's speedup over the planted pipeline, as you measured it
    TRACE_FILE      the Chrome trace (torch.profiler's export_chrome_trace) of the *planted* pipeline
    TRACE_ANSWERS   what you read off that trace: {"step_ms": mean ProfilerStep duration in ms,
                    "data_share": the "data" label's share of the step time, "backward_share": the
                    "backward" label's share, "top_backward": the backward node
                    (autograd::engine::evaluate_function: <Node>) with the most total time, as <Node>}

The grader scores the findings against what was planted for the id it grades (a finding at a line with
no bug costs points), shares the marks among the planted bugs that cost step time, gives a located
finding its line's share, and counts its type only with a saving this notebook's run measured (`savings`
logs what it timed, and the diagnosis probe sends that log: a saving typed in is no measurement): it
measures what each such bug costs its own copy of the pipeline, and the saving must agree (within a
factor of SAVING_FACTOR, neither tied with nor clearly below a bug whose cost is clearly smaller). It re-measures the fixed copy against the planted pipeline in its own process
(it must be faster and train the same way), and parses the trace file itself.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
import os
import re
import statistics
import time
import types
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perflab import mystery
from perflab.grading.probing import Answers
from perflab.mystery import KINDS, TOOLS

PIPELINE_FILE = mystery.FILENAME
TRACE_KEYS = ("step_ms", "data_share", "backward_share", "top_backward")
PHASES = ("data", "forward", "backward", "optimizer")
BACKWARD_NODE = "autograd::engine::evaluate_function: "
# Interleaved rounds of `savings`, the student's and the grader's alike, after SAVING_WARMUP steps of each
# side. A round's saving spreads over about 0.3 of a step on a shared 2-core machine, so its median over
# 8 rounds still moved 0.035 between calls (sd over 6 calls of one pipeline); and after one warm-up step
# the first round read high for every copy (0.22-0.45 against medians near 0.1), the planted side's
# second step still being slower than its later ones: two warm-up steps removed that bias.
SAVING_ROUNDS = 12
SAVING_WARMUP = 2
SAVING_FACTOR = 2.0  # how far a finding's measured saving may sit from the grader's (see perflab/labs/lab01/judges/mystery.py)
RUN_LABEL = "run "  # the pipeline labels its data phase "run <RUN_ID>": whose pipeline a trace shows
# What the probes send up: a fixed pipeline and a trace's events are small, but bounded.
MAX_SOURCE_CHARS = 256 * 1024
MAX_TRACE_EVENTS = 50_000
_counter = itertools.count()
# What `savings` measured in this process, one entry per copy timed: the digest of the planted text it
# timed against, the lines of that text the copy changed, and the saving. The diagnosis probe sends them
# with the findings: a finding's `saves` counts as measured only where this run timed a copy that
# changes its bug alone and read that saving (a number typed into the notebook has no such entry).
_MEASURED: list[dict[str, Any]] = []
MAX_MEASURED = 128


def write_pipeline(student: str, path: str | os.PathLike[str] = PIPELINE_FILE) -> Path:
    """Write `student`'s mystery pipeline to `path` (beside the notebook) and return the path; the data
    set it trains on is built first if it is not (once, offline). ValueError in one line where that data
    set holds less than one batch."""
    from perflab import dataset

    data, _, batch_size = mystery.sizes_for()
    if not dataset.is_built(data):
        print(f"building the {data} data set the pipeline trains on (once)...")
        dataset.build(data, progress=False)
    images = sum(1 for f in dataset.split_folder(data).rglob("*") if dataset.is_image_file(f.name))
    if images < batch_size:  # its loader drops the incomplete batch: every epoch would be empty
        raise ValueError(f"data: {data} holds {images} training image(s), fewer than one batch of {batch_size} "
                         "of the mystery pipeline: add images")
    return mystery.for_student(student).write(path)


def load_pipeline(path: str | os.PathLike[str]) -> types.ModuleType:
    """Import a pipeline file as a fresh module (every call re-reads the file)."""
    from perflab.verify.candidates import import_file

    return import_file(path, f"mystery_pipeline_{next(_counter)}")


@dataclass(frozen=True)
class LineCost:
    """One line of the pipeline as line_profiler timed it."""

    line: int
    function: str
    hits_per_step: float
    ms_per_step: float
    share: float  # of the time of one whole step
    text: str


def line_costs(path: str | os.PathLike[str], steps: int = 10, seed: int = 0) -> list[LineCost]:
    """line_profiler over every function and method the pipeline file defines, for `steps` training
    steps after one warm-up step: its lines by time, most first. A line's time includes the calls it
    makes, so a call line and the lines of the function it calls both count that time."""
    from line_profiler import LineProfiler

    module = load_pipeline(path)
    profiler = LineProfiler()
    for _name, fn in _functions(module):
        profiler.add_function(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = module.make_step(seed)
        step()
        start = time.perf_counter()
        profiler.enable_by_count()
        try:
            for _ in range(steps):
                step()
        finally:
            profiler.disable_by_count()
        wall = (time.perf_counter() - start) / steps
    stats = profiler.get_stats()
    text = Path(path).read_text(encoding="utf-8").splitlines()
    names = {fn.__code__.co_firstlineno: name for name, fn in _functions(module)}
    rows = []
    for (_file, first, _name), timings in stats.timings.items():
        for line, hits, t in timings:
            seconds = t * stats.unit / steps
            rows.append(LineCost(line, names.get(first, _name), hits / steps, seconds * 1e3,
                                 seconds / wall if wall > 0 else 0.0, text[line - 1].strip() if line <= len(text) else ""))
    return sorted(rows, key=lambda r: r.ms_per_step, reverse=True)


def _functions(module: types.ModuleType) -> list[tuple[str, Any]]:
    """(qualified name, function) for every function and method the module itself defines."""
    out = []
    for name, value in vars(module).items():
        if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            out.append((name, value))
        elif isinstance(value, type) and value.__module__ == module.__name__:
            for attr, member in vars(value).items():
                if isinstance(member, types.FunctionType):
                    out.append((f"{name}.{attr}", member))
    return out


# ---------------------------------------------------------------------------------------------
# Visible checks: the form of the answers (never whether they are right)


def diagnosis_problems(diagnosis: Any, n_lines: int) -> list[str]:
    """Why `diagnosis` of a pipeline of `n_lines` lines does not follow the contract (empty when its
    form is right)."""
    if not isinstance(diagnosis, (list, tuple)) or not diagnosis:
        return ["DIAGNOSIS should be a non-empty list of findings (dicts)"]
    problems = []
    for i, finding in enumerate(diagnosis):
        where = f"finding {i}"
        if not isinstance(finding, Mapping):
            problems.append(f"{where}: a dict with line, function, kind, tool, evidence and fix")
            continue
        line = finding.get("line")
        if not isinstance(line, int) or isinstance(line, bool) or not 1 <= line <= max(n_lines, 1):
            problems.append(f"{where}: line should be a line number of the pipeline (1 to {n_lines}), "
                            f"got {line!r}")
        if finding.get("kind") not in KINDS:
            problems.append(f"{where}: kind should be one of {', '.join(KINDS)}, got {finding.get('kind')!r}")
        if finding.get("tool") not in TOOLS:
            problems.append(f"{where}: tool should be one of {', '.join(TOOLS)}, got {finding.get('tool')!r}")
        for key in ("function", "evidence", "fix"):
            if not isinstance(finding.get(key), str) or not finding[key].strip():
                problems.append(f"{where}: {key} should say something (a non-empty string)")
        saves = finding.get("saves")
        if (not isinstance(saves, (int, float)) or isinstance(saves, bool) or not math.isfinite(saves)
                or not -1.0 <= saves < 1.0):
            problems.append(f"{where}: saves should be the share of the planted step time that fixing this bug "
                            f"alone saves, as you measured it (a number below 1, e.g. 0.25), got {saves!r}")
    return problems


def check_diagnosis(diagnosis: Any, path: str | os.PathLike[str] = PIPELINE_FILE) -> None:
    """AssertionError naming the first problem with the form of `diagnosis` of the pipeline at `path`."""
    n_lines = len(Path(path).read_text(encoding="utf-8").splitlines()) if Path(path).is_file() else 0
    problems = diagnosis_problems(diagnosis, n_lines)
    assert not problems, problems[0]


def trace_answer_problems(answers: Any) -> list[str]:
    """Why `answers` does not follow the contract (empty when its form is right)."""
    if not isinstance(answers, Mapping):
        return [f"TRACE_ANSWERS should be a dict with {', '.join(TRACE_KEYS)}"]
    problems = [f"TRACE_ANSWERS has no {key!r}" for key in TRACE_KEYS if key not in answers]
    for key in ("step_ms", "data_share", "backward_share"):
        value = answers.get(key)
        if key in answers and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                   and math.isfinite(value) and value >= 0):
            problems.append(f"TRACE_ANSWERS[{key!r}] should be a number, got {value!r}")
    for key in ("data_share", "backward_share"):
        value = answers.get(key)
        if isinstance(value, (int, float)) and value > 1:
            problems.append(f"TRACE_ANSWERS[{key!r}] is a share of the step: between 0 and 1, got {value}")
    top = answers.get("top_backward")
    if "top_backward" in answers and not (isinstance(top, str) and top.strip()):
        problems.append("TRACE_ANSWERS['top_backward'] should be a backward node's name, e.g. 'AddmmBackward0'")
    return problems


def check_trace_answers(answers: Any) -> None:
    problems = trace_answer_problems(answers)
    assert not problems, problems[0]


def check_fixed(fixed: str | os.PathLike[str], planted: str | os.PathLike[str] = PIPELINE_FILE,
                steps: int = 3, seed: int = 0) -> list[float]:
    """Run both pipelines `steps` steps from `seed`: AssertionError when the fixed one trains
    differently (other samples, or losses beyond float noise); returns the losses."""
    runs = []
    for path in (planted, fixed):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step = load_pipeline(path).make_step(seed)
            runs.append([step() for _ in range(steps)])
    for i, ((loss_a, idx_a), (loss_b, idx_b)) in enumerate(zip(*runs, strict=True)):
        assert list(idx_a) == list(idx_b), f"step {i}: the fixed pipeline trained on other samples"
        a, b = float(loss_a), float(loss_b)
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5), \
            f"step {i}: loss {b:.6f} where the planted pipeline has {a:.6f}: the fix changed the training"
    return [float(loss) for loss, _ in runs[1]]


# ---------------------------------------------------------------------------------------------
# A trace as data (what the probe sends; the grader reads its own answers off it)


def load_trace(path: str | os.PathLike[str]) -> Any:
    """A Chrome trace file's JSON document (None where it cannot be read as JSON)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def trace_events(path: str | os.PathLike[str] | dict[str, Any]) -> list[list[Any]]:
    """[name, ts, dur] of the complete events of a Chrome trace (a file, or its loaded document) that the
    trace questions need: the profiled steps, the pipeline's phase and run labels and the backward nodes."""
    doc = path if isinstance(path, dict) else json.loads(Path(path).read_text(encoding="utf-8"))
    events = doc.get("traceEvents", doc) if isinstance(doc, dict) else doc
    out = []
    for event in events if isinstance(events, list) else []:
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        name = str(event.get("name", ""))
        if (name.startswith(("ProfilerStep#", RUN_LABEL, BACKWARD_NODE)) or name in PHASES):
            out.append([name, event.get("ts"), event.get("dur")])
            if len(out) >= MAX_TRACE_EVENTS:
                break
    return out


# What torch.profiler writes at the top of every Chrome trace it exports (the grader checks them).
PROFILER_META = ("schemaVersion", "deviceProperties", "trace_id", "baseTimeNanoseconds", "displayTimeUnit")
# The ops a trace summary counts per profiled step: the model's convolutions, and ops that planted bugs
# add or remove (histograms of the gradients, a tensor op per few image rows, the copies of a weight snapshot,
# the default collate's stack).
COUNTED_OPS = ("aten::convolution", "aten::histc", "aten::sub", "aten::clone", "aten::stack")
CONV_NODE = BACKWARD_NODE + "ConvolutionBackward0"
_TRACE_ID = re.compile(r"[0-9A-F]{32}")
# Complete events outside the op nesting: the profiler's own span, and the Python tracer's frames
# (with_stack=True), which a record_function's span starts inside of and outlasts.
_NOT_NESTED = ("Trace", "python_function")


def trace_summary(path: str | os.PathLike[str] | dict[str, Any] | None) -> dict[str, Any]:
    """What the grader needs to believe a trace (a file, or its loaded document) is torch.profiler's
    record of the pipeline, not a file written or edited by hand: the profiler's metadata, and per
    profiled step the labels, ops and backward nodes nested in it, as the profiler nests them (same
    thread, inside the parent's span)."""
    doc = path if isinstance(path, dict) or path is None else load_trace(path)
    if not isinstance(doc, dict):
        return {"meta": {}, "steps": []}
    meta: dict[str, Any] = {key: type(doc[key]).__name__ for key in PROFILER_META if key in doc}
    meta["trace_id_form"] = isinstance(doc.get("trace_id"), str) and bool(_TRACE_ID.fullmatch(doc["trace_id"]))
    raw = doc.get("traceEvents")
    events = [e for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []
    meta["span"] = any(e.get("cat") == "Trace" and str(e.get("name", "")).startswith("PyTorch Profiler")
                       for e in events)
    meta["flows"] = [sum(1 for e in events if e.get("cat") == "fwdbwd" and e.get("ph") == ph) for ph in "sf"]
    complete = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), int | float)
                and isinstance(e.get("dur"), int | float) and e["dur"] >= 0
                and e.get("cat") not in _NOT_NESTED]
    meta["ops_without_ids"] = sum(1 for e in complete if e.get("cat") == "cpu_op"
                                  and not (isinstance(e.get("args"), dict) and "External id" in e["args"]))
    steps: list[dict[str, Any]] = []
    crossing = outside = 0
    by_thread: dict[Any, list[dict[str, Any]]] = {}
    for e in complete:
        by_thread.setdefault((str(e.get("pid")), str(e.get("tid"))), []).append(e)
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[tuple[float, str, dict[str, Any] | None, str | None]] = []  # (end, name, step, phase)
        for e in thread:
            name, start, end = str(e.get("name", "")), float(e["ts"]), float(e["ts"]) + float(e["dur"])
            while stack and start >= stack[-1][0]:
                stack.pop()
            if stack and end > stack[-1][0] + 1.0:  # a child that outlasts its parent: never the profiler's
                crossing += 1
            step, phase = (stack[-1][2], stack[-1][3]) if stack else (None, None)
            if name.startswith("ProfilerStep#"):
                step = {"name": name, "dur": float(e["dur"]), "nested_in_step": step is not None,
                        "labels": dict.fromkeys(PHASES, 0), "runs_in_data": 0, "forward_convs": 0,
                        "backward_conv_nodes": 0, "ops": 0, "counted": dict.fromkeys(COUNTED_OPS, 0)}
                steps.append(step)
                phase = None
            elif step is None:
                outside += name in PHASES or name.startswith((BACKWARD_NODE, RUN_LABEL))
            else:
                if name in PHASES:
                    step["labels"][name] += 1
                    phase = name
                elif name.startswith(RUN_LABEL) and phase == "data":
                    step["runs_in_data"] += 1
                elif name == CONV_NODE and phase == "backward":
                    step["backward_conv_nodes"] += 1
                if e.get("cat") == "cpu_op":
                    step["ops"] += 1
                if name in step["counted"]:
                    step["counted"][name] += 1
                    step["forward_convs"] += name == "aten::convolution" and phase == "forward"
            stack.append((end, name, step, phase))
    meta.update(crossing=crossing, outside=outside)
    return {"meta": meta, "steps": steps[:MAX_TRACE_STEPS]}


MAX_TRACE_STEPS = 64


# ---------------------------------------------------------------------------------------------
# Probes (the grader's judges live in perflab/labs/lab01/judges/mystery.py)


def probe_diagnosis(answers: Answers, seed: int) -> dict[str, Any]:
    return {"findings": answers["DIAGNOSIS"], "measured": [dict(e) for e in _MEASURED[-MAX_MEASURED:]]}


def probe_fix(answers: Answers, seed: int) -> dict[str, Any]:
    path = Path(str(answers["FIXED_PIPELINE"]))
    source = path.read_text(encoding="utf-8")[:MAX_SOURCE_CHARS] if path.is_file() else None
    return {"source": source, "claim": answers.get("FIX_SPEEDUP"), "path": str(path)}


def probe_trace(answers: Answers, seed: int) -> dict[str, Any]:
    answered = answers["TRACE_ANSWERS"]
    path = Path(str(answers["TRACE_FILE"]))
    doc = load_trace(path) if path.is_file() else None
    if not isinstance(doc, dict):  # a bare list of events is a Chrome trace too, but never torch.profiler's
        return {"answers": answered, "events": trace_events(path) if path.is_file() else None,
                "summary": trace_summary(None)}
    return {"answers": answered, "events": trace_events(doc), "summary": trace_summary(doc)}


PROBES = {
    "mystery_diagnosis": probe_diagnosis,
    "mystery_fix": probe_fix,
    "mystery_trace": probe_trace,
}

__all__ = ["LineCost", "PIPELINE_FILE", "PROBES", "TRACE_KEYS", "check_diagnosis", "check_fixed",
           "check_trace_answers", "diagnosis_problems", "line_costs", "load_pipeline", "trace_answer_problems",
           "load_trace", "quick_speedup", "saving", "savings", "savings_here", "trace_events", "trace_summary", "write_pipeline"]



# ---------------------------------------------------------------------------------------------
# The student's own measurements (the grader re-measures with perflab.verify in its own process)


def quick_speedup(planted: str | os.PathLike[str], fixed: str | os.PathLike[str], steps: int = 4,
                  rounds: int = 5, seed: int = 0) -> float:
    """The fixed pipeline's speedup over the planted one on this machine: `rounds` interleaved pairs of
    `steps`-step blocks after a warm-up step each, the ratio of the fastest blocks (noise only adds
    time). Timed as `savings` times: on the verifier's torch thread count, in this thread's CPU time, so
    other programs sharing the machine do not inflate one side's blocks (a neighbour's burst once made a
    reference's own reading 17x where the grader re-measured 1.46x)."""
    import torch

    from perflab.verify.protocol import VERIFY_THREADS

    threads = torch.get_num_threads()
    torch.set_num_threads(VERIFY_THREADS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sides = [load_pipeline(path).make_step(seed) for path in (planted, fixed)]
            for step in sides:
                step()
            best = [math.inf, math.inf]
            for r in range(rounds):
                for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                    start = time.thread_time()
                    for _ in range(steps):
                        sides[i]()
                    best[i] = min(best[i], time.thread_time() - start)
    finally:
        torch.set_num_threads(threads)
    return best[0] / best[1]


def savings(planted: str | os.PathLike[str], fixed: list[str | os.PathLike[str]], steps: int = 1,
            rounds: int = SAVING_ROUNDS, seed: int = 0) -> list[float]:
    """What each copy in `fixed` saves of the planted pipeline's step time: 1 - t(copy) / t(planted),
    the planted pipeline timed beside all the copies in `rounds` interleaved rounds of one `steps`-step
    block each (after SAVING_WARMUP warm-up steps each), the saving the median over rounds of each round's
    1 - t(copy) / t(planted): a slowdown that lasts a round hits both sides of that round, and one
    that hits a single block moves a single round. Timed on the torch thread count the grader
    measures the planted bugs at (`perflab.verify.protocol.VERIFY_THREADS`), in the measuring thread's
    CPU time: on one torch thread that is the step's work, which other programs and threads sharing the
    machine do not inflate as they do wall time. Give it one copy per fix, each with only that fix, to
    measure each bug alone.

    It measures in a process of its own (`perflab.labs.measuring_server`: a fork of a server that
    imported torch and ran no torch op), the very kind the grader measures in, so what this notebook's
    earlier cells left behind (torch's thread pool, a grown allocator, a profiler still on) is not in
    the reading. In the grader's measuring process it holds the grading run's timing lock (no other
    re-measurement runs beside it); in a graded notebook it holds none, since no submission may hold
    up another's, so CPU time is what keeps a neighbour's work out of the student's reading."""
    from perflab.labs import measuring_server

    paths = [str(Path(path).resolve()) for path in (planted, *fixed)]
    got = measuring_server.call(f"{__name__}:savings_here", {"planted": paths[0], "fixed": paths[1:], "steps": steps,
                                                            "rounds": rounds, "seed": seed}, SAVINGS_TIMEOUT_S)
    saved = [float(value) for value in got["savings"]]
    MEASURED_STATE.clear()
    MEASURED_STATE.update(got["state"])
    MEASURED_ROUNDS[:] = got.get("rounds", [])
    _remember(planted, fixed, saved)
    return saved


# How long one `savings` call may take in its measuring process (a few copies of a pipeline: a minute).
SAVINGS_TIMEOUT_S = 1800.0
# The state the last `savings` of this process measured in (`measuring_server.measuring_state`), and each
# copy's saving round by round (what its median is taken over), for a reading to be checked.
MEASURED_STATE: dict[str, Any] = {}
MEASURED_ROUNDS: list[list[float]] = []


def savings_here(planted: str, fixed: list[str], steps: int = 1, rounds: int = SAVING_ROUNDS,
                 seed: int = 0) -> dict[str, Any]:
    """`savings` measured in this process, which is the measuring process (`measuring_server`): {"savings":
    what each copy saves, "state": the process's state as the timing started}. Not for a notebook: there,
    the state of the kernel would be in the reading."""
    import torch

    from perflab.grading.timelock import timed_section
    from perflab.labs.measuring_server import measuring_state
    from perflab.verify.protocol import VERIFY_THREADS

    threads = torch.get_num_threads()
    torch.set_num_threads(VERIFY_THREADS)
    try:
        with warnings.catch_warnings(), timed_section():
            warnings.simplefilter("ignore")
            sides = [load_pipeline(path).make_step(seed) for path in (planted, *fixed)]
            for step in sides:
                for _ in range(SAVING_WARMUP):
                    step()
            state = measuring_state()
            times: list[list[float]] = [[] for _ in sides]
            order = list(range(len(sides)))
            for r in range(rounds):
                for i in order if r % 2 == 0 else order[::-1]:
                    start = time.thread_time()
                    for _ in range(steps):
                        sides[i]()
                    times[i].append(time.thread_time() - start)
    finally:
        torch.set_num_threads(threads)
    rounds = [[1.0 - t / base for t, base in zip(copy, times[0], strict=True)] for copy in times[1:]]
    return {"savings": [statistics.median(ratios) for ratios in rounds], "state": state, "rounds": rounds}


def changed_lines(planted: str, copy: str) -> list[int]:
    """The lines (1-based) of the text `planted` that `copy` changes or deletes, and for an insertion the
    lines either side of it."""
    old, new = planted.splitlines(), copy.splitlines()
    out: set[int] = set()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag != "equal":
            out.update(range(i1 + 1, i2 + 1) if i2 > i1 else (i1, i1 + 1))
    return sorted(n for n in out if 1 <= n <= len(old))


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _remember(planted: str | os.PathLike[str], fixed: list[str | os.PathLike[str]], saved: list[float]) -> None:
    """Log what `savings` measured (`_MEASURED`, for the diagnosis probe)."""
    base = Path(planted).read_text(encoding="utf-8")
    digest = text_digest(base)
    for path, value in zip(fixed, saved, strict=True):
        _MEASURED.append({"planted": digest, "lines": changed_lines(base, Path(path).read_text(encoding="utf-8")),
                          "saves": float(value)})
    del _MEASURED[:-MAX_MEASURED]


def saving(planted: str | os.PathLike[str], fixed: str | os.PathLike[str], steps: int = 1,
           rounds: int = SAVING_ROUNDS, seed: int = 0) -> float:
    """What one copy saves of the planted pipeline's step time (`savings` of one copy)."""
    return savings(planted, [fixed], steps=steps, rounds=rounds, seed=seed)[0]


def memory_growth(path: str | os.PathLike[str], steps: int = 12, seed: int = 0) -> tuple[list[float], Any]:
    """The process's resident memory (MiB) after each of `steps` training steps of the pipeline, and the
    trainer object the steps ran on (to look at what it holds)."""
    import psutil

    process = psutil.Process()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = load_pipeline(path).make_step(seed)
        rss = []
        for _ in range(steps):
            step()
            rss.append(process.memory_info().rss / 2**20)
    return rss, getattr(step, "__self__", None)
