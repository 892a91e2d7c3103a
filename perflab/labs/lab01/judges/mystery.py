"""Lab 1's mystery pipeline, judged: the diagnosis against what was planted for the graded id, the
fixed copy re-measured against the planted pipeline, the trace answers against the grader's own
parse of the student's trace. Grader-only (the student bundle and the sandbox leave it out).

The planted truth comes from the submission's student id as the grader knows it (`Context.student`),
never from the notebook: answers copied from another id's pipeline point at lines where this one has
no bug, and each such finding costs what a right one earns. It is recomputed here, by rendering the id's
pipeline with line tracking (`mystery_truth.truth`); the student's kit writes the pipeline but holds
no account of what was planted.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perflab import mystery
from perflab.env import course_model
from perflab.grading.judging import Context, Mark, Suspicious
from perflab.grading.probing import decode_float
from perflab.labs.lab01 import mystery as lab01_mystery
from perflab.labs.lab01.judges import mystery_truth, savings_server
from perflab.labs.lab01.judges.mystery_truth import BY_KEY, Planted, Truth
from perflab.labs.lab01.judges.savings_server import SavingsUnmeasured
from perflab.labs.lab01.mystery import (
    BACKWARD_NODE,
    PHASES,
    RUN_LABEL,
    TRACE_KEYS,
    diagnosis_problems,
)
from perflab.mystery.catalogue import AMOUNTS

# A finding's worth: half for the location, half for the bottleneck type at that location, the type only
# with a saving the notebook's own run measured (`measured_in_run`) that agrees with the grader's own
# measurement of that bug: what only a measurement gives. Reading the planted lines, or diffing one's
# pipeline with a classmate's, gives the locations at most: a typed saving, a constant or a catalogue's
# typical cost has no measurement behind it. A finding that points at no planted bug takes away what a
# located one earns, so listing every line earns nothing.
LOCATION_WORTH = 0.5
KIND_WORTH = 0.5
# A finding's saving agrees with the grader's g when it lies in [g / SAVING_FACTOR - SAVING_SLACK,
# g * SAVING_FACTOR + SAVING_SLACK_ABOVE]. The notebook re-runs on the grading machine and measures with the
# grader's own function (`lab01_mystery.savings`: the median over SAVING_ROUNDS interleaved rounds of one step, one
# torch thread, CPU time), so an honest saving is measured where and as the grader measures. Over 10 ids
# (30 bugs) here, the student's helper against two grader runs differed by at most 0.065 and 2.2x
# (a bug costing 0.04-0.08 of a step): all 30 agree within 2.0x plus 0.05, and a saving of 0 agrees
# only with a bug costing under 0.1 of a step.
SAVING_FACTOR = lab01_mystery.SAVING_FACTOR
SAVING_SLACK = 0.05
# Above, more slack: a bug planted at a light dose costs about nothing, and the notebook's process read
# carol's light row loop at 0.067-0.069 in three runs where the grader's fresh child read 0.00-0.07 (the
# reference investigation lost that finding in 2 of 4 test runs at 0.05). Typing 0 for a full bug still
# fails (g / 2 - 0.05 > 0 for every full dose, 0.13 or more), and a constant still ties a light bug
# with a full one. A notebook's reading is taken beside whatever else the grading machine runs (its kernel
# holds no timing lock): over 40 ids graded twice each (`make bench-mystery-ids`), the one honest finding
# out of a 0.10 band was a light Python collate the notebook read at 0.152 while other work ran, the
# grader 0.007 and 0.002; that pipeline's savings taken five times beside a 2-thread matmul read the
# light bug at 0.03-0.14, at 0.01-0.06 alone. Only an upper bound moves: a saving must still be one
# this run measured, on a copy that changes that bug's lines.
SAVING_SLACK_ABOVE = 0.15
# Two located bugs whose savings the grader reads clearly apart (the larger above SAVING_FACTOR times the
# smaller plus the slack) must not be tied in the diagnosis, nor read clearly apart the other way round:
# either loses both.
# Whether a finding's type counts only with a measured, agreeing saving. Measured in the grader's own
# process, the savings were not reliable while it graded two notebooks at once (an honest part 10 lost
# 2.7 to 8 of 8 in three demo runs), so the grader measures in a process of its own (`measured_savings`),
# under the run's timing lock (the notebook's side holds none: CPU time on one thread is what keeps a
# neighbour out of it), and a finding that disagrees is measured a second time
# before it loses its count (`judge_diagnosis`).
GATE_ON_SAVINGS = True
# How long one measuring process may take (tiny mode: about 4 s here, once the server has imported torch).
SAVING_TIMEOUT_S = 180.0
# The fixed copy must be a measured gain over the planted pipeline: the CI's lower bound above this.
# Every pipeline holds at least one bug planted at a full dose, which costs 1.3-1.8x the clean step on
# the verifier's one thread at the graded sizes (`make bench-mystery`), so fixing them all gains about
# 1.3x or more (1.47-2.19x over eight ids); an unchanged copy is 1.0x.
FIX_BAR = 1.10
# The trace answers: how close to the grader's parse of the same file a number must be.
STEP_MS_REL = 0.02
SHARE_ABS = 0.02
# Caps of the re-measurement in the kit's tiny mode (the protocol's own budget otherwise).
TINY_MAX_PAIRS, TINY_SECONDS = 8, 8.0


def _student(ctx: Context) -> str:
    assert ctx.student, "the grader has no student id for this submission, so it cannot draw its pipeline"
    return ctx.student


def truth(ctx: Context) -> Truth:
    return mystery_truth.truth(_student(ctx), ctx.mode)


# ---------------------------------------------------------------------------------------------
# The diagnosis


@functools.lru_cache(maxsize=64)
def measured_savings(student: str, mode: str | None, attempt: int = 0) -> dict[str, float]:
    """What fixing each planted bug alone saves of `student`'s planted pipeline's step time, measured in
    a process of its own (`savings_server`): the grader's own process grades several notebooks on
    threads, and torch's thread count is one per process, so a measurement taken there read 0.00 for bugs
    that cost 0.2-0.3 of a step while another notebook was graded beside it. It times under the run's
    timing lock (`lab01_mystery.savings` takes it), one timed measurement at a time across the run's
    jobs. `attempt` numbers independent measurements (each is cached apart)."""
    from perflab.grading.timelock import TIMING_LOCK_ENV

    return savings_server.measure(student, mode, os.environ.get(TIMING_LOCK_ENV, ""), SAVING_TIMEOUT_S)


# Started before the first notebook runs (`judging.warm_up`): the server imports torch meanwhile.
warm_up = savings_server.warm_up


def saving_agrees(measured: float, truth: float) -> bool:
    """A finding's measured saving against the grader's for the same bug (SAVING_FACTOR, SAVING_SLACK below,
    SAVING_SLACK_ABOVE above)."""
    return truth / SAVING_FACTOR - SAVING_SLACK <= measured <= truth * SAVING_FACTOR + SAVING_SLACK_ABOVE


def _clearly_apart(a: float, b: float) -> bool:
    return max(a, b) > min(a, b) * SAVING_FACTOR + SAVING_SLACK


# How near a finding's `saves` must sit to what this run measured of its bug (a saving rounded to two
# places, or the mean or median of several readings, is still that measurement).
MEASURED_TOLERANCE = 0.0051


def measured_in_run(saves: float, bug: Planted, others: Sequence[Planted], measured: Sequence[Mapping[str, Any]],
                    digest: str) -> bool:
    """Whether `saves` is what the notebook's own run measured of `bug` alone: `lab01_mystery.savings`
    timed, against this id's planted pipeline (its `digest`), a copy that changes lines of `bug` and of no
    other planted bug, and read this saving (or, over several such copies, their mean or median). A number
    typed in, a reading of a copy that fixes several bugs at once, or one against another pipeline is not."""
    touched = bug.accepted_lines | frozenset(bug.lines)
    readings = []
    for entry in measured:
        if not isinstance(entry, Mapping) or entry.get("planted") != digest:
            continue
        lines = entry.get("lines")
        value = entry.get("saves")
        if (not isinstance(lines, list) or not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value)):
            continue
        changed = {n for n in lines if isinstance(n, int)}
        if changed & touched and not any(changed & (o.accepted_lines | frozenset(o.lines)) for o in others):
            readings.append(float(value))
    if not readings:
        return False
    summaries = [*readings, sum(readings) / len(readings), statistics.median(readings)]
    return any(abs(saves - r) <= MEASURED_TOLERANCE or abs(max(saves, 0.0) - max(r, 0.0)) <= MEASURED_TOLERANCE
               for r in summaries)


@dataclass(frozen=True)
class DiagnosisScore:
    fraction: float
    located: int
    typed: int
    stray: list[int]
    planted: int  # the planted bugs the marks are shared among: those that cost step time
    unmeasured: list[str]  # located bugs whose `saves` no measurement of this run gave
    disagreeing: list[str] = ()  # located bugs whose measured saving disagrees with the grader's (or misorders)

    @property
    def uncounted(self) -> list[str]:
        """Located bugs whose type does not count: their saving unmeasured or disagreeing."""
        return [*self.unmeasured, *self.disagreeing]


def score_diagnosis(findings: Sequence[Mapping[str, Any]], planted: Sequence[Planted],
                    savings: Mapping[str, float] | None = None, measured: Sequence[Mapping[str, Any]] = (),
                    digest: str = "") -> DiagnosisScore:
    """Each planted bug is matched by at most one finding at one of its lines (more findings on the same
    bug count once), and a located bug earns LOCATION_WORTH. Its type earns KIND_WORTH where the kind is
    right and, with `savings` (the grader's measurement, bug key -> saving), only where the finding's
    `saves` was measured in the notebook's own run (`measured`: what `lab01_mystery.savings` logged,
    against the planted text of `digest`; see `measured_in_run`), agrees with the bug's, and is in the
    bug's order against the other measured findings where the grader's savings differ clearly or the
    two were planted at different doses (`Planted.dose`). The marks are shared among the bugs that cost
    step time: a bug that only holds memory (`Bug.costs_time=False`) saves no step time the grader can
    measure, so the planted truth alone would earn its share; a finding at it neither earns nor costs.
    Findings at no planted line each take LOCATION_WORTH + KIND_WORTH off."""
    unmatched = list(planted)
    matched: list[tuple[Planted, Mapping[str, Any]]] = []
    stray: list[int] = []
    for finding in findings:
        line = finding.get("line")
        hit = next((p for p in unmatched if isinstance(line, int) and line in p.accepted_lines), None)
        if hit is None:
            if not any(isinstance(line, int) and line in p.accepted_lines for p in planted):
                stray.append(line if isinstance(line, int) else -1)
            continue  # another line of a bug already found: neither credit nor cost
        unmatched.remove(hit)
        if BY_KEY[hit.key].costs_time:
            matched.append((hit, finding))
    scored = [p for p in planted if BY_KEY[p.key].costs_time]
    unmeasured: list[str] = []
    disagreeing: list[str] = []
    if savings is not None:
        # A fix cannot make a step slower: a negative reading is noise around a bug that costs little.
        said = {p.key: max(float(f.get("saves", math.nan)), 0.0) for p, f in matched}  # NaN stays NaN
        for p, f in matched:
            others = [q for q in planted if q.key != p.key]
            if not measured_in_run(float(f.get("saves", math.nan)), p, others, measured, digest):
                unmeasured.append(p.key)
        timed = [key for key in said if key not in unmeasured]
        for key in timed:
            truth, own = savings[key], said[key]
            # Two bugs whose savings the grader reads clearly apart may not be tied in the diagnosis (a
            # typed constant orders neither), nor read clearly apart the other way round. A reading merely
            # the other way round is noise: each saving is already bound to that bug's own measured copy
            # (`measured_in_run`), and honest notebooks read the order of two near costs both ways: a
            # light bug at 0.2 beside a full one's 0.164 (grader 0.07 and 0.13, beside other work), and a
            # light snapshot at 0.107 beside a full pixel list's 0.097 (grader 0.005 and 0.106, then 0.075
            # and 0.224: `make bench-mystery-ids`, bench-id-44).
            misordered = any(_clearly_apart(truth, savings[q])
                             and (own == said[q] or (_clearly_apart(own, said[q]) and (truth > savings[q]) != (own > said[q])))
                             for q in timed if q != key)
            if not saving_agrees(own, truth) or misordered:
                disagreeing.append(key)
    located = len(matched)
    typed = sum(f.get("kind") in BY_KEY[p.key].kinds for p, f in matched
                if p.key not in unmeasured and p.key not in disagreeing)
    earned = located * LOCATION_WORTH + typed * KIND_WORTH - len(stray) * (LOCATION_WORTH + KIND_WORTH)
    fraction = max(0.0, earned / ((LOCATION_WORTH + KIND_WORTH) * max(len(scored), 1)))
    return DiagnosisScore(min(fraction, 1.0), located, typed, stray, len(scored), unmeasured, disagreeing)


def judge_diagnosis(observed: Any, ctx: Context) -> Mark | None:
    case = truth(ctx)
    findings = observed.get("findings") if isinstance(observed, dict) else None
    problems = diagnosis_problems(findings, len(case.source.splitlines()))
    assert not problems, problems[0]
    measured = observed.get("measured") if isinstance(observed.get("measured"), list) else []
    digest = lab01_mystery.text_digest(case.source)
    located = score_diagnosis(findings, case.planted)
    savings, unmeasured_why = None, ""
    if located.located and GATE_ON_SAVINGS:
        try:
            savings = measured_savings(case.student, ctx.mode)
            first = score_diagnosis(findings, case.planted, savings, measured, digest)
            if first.disagreeing:
                # Before a measured finding loses its type, a second independent measurement: the
                # diagnosis is judged against whichever of the two it agrees with better.
                again = measured_savings(case.student, ctx.mode, 1)
                if score_diagnosis(findings, case.planted, again, measured, digest).fraction > first.fraction:
                    savings = again
        except SavingsUnmeasured as exc:  # the grader's fault, not the student's: judged on line and type
            unmeasured_why = f"savings not checked: the grader could not measure this pipeline ({exc})"
    score = score_diagnosis(findings, case.planted, savings, measured, digest)
    if score.fraction >= 1.0:
        return Mark(1.0, unmeasured_why) if unmeasured_why else None
    parts = [f"{score.located} of the {score.planted} planted bugs that cost step time located"]
    said = {p.key: f for f in findings for p in case.planted
            if isinstance(f.get("line"), int) and f["line"] in p.accepted_lines}
    if score.unmeasured:
        parts.append(f"{len(score.unmeasured)} of them with a saving this run of your notebook did not measure ("
                     + "; ".join(f"your finding at line {said[k]['line']}: saves {said[k].get('saves')!r}"
                                 for k in score.unmeasured if k in said)
                     + "), so its type does not count: time a copy with only that fix against your pipeline "
                     "with lab01_mystery.saving or savings, and put what it returns in saves")
    if score.disagreeing:
        parts.append(f"{len(score.disagreeing)} of them with a saving that disagrees with the grader's measurement "
                     "of this pipeline (" + "; ".join(
                         f"your finding at line {said[k]['line']}: saves {said[k].get('saves')!r}, measured here "
                         f"{savings[k]:.2f}" for k in score.disagreeing if k in said) + "), so its type does not "
                     "count: measure each fix alone, one copy per bug")
    counted = score.located - len(score.uncounted)
    if counted:
        parts.append(f"the bottleneck type right for {score.typed} of "
                     + ("them" if not score.uncounted else f"the {counted} measured"))
    if score.stray:
        parts.append(f"{len(score.stray)} finding(s) at lines with no planted bug "
                     f"({', '.join(str(n) for n in score.stray[:6])}), each costing what a right one earns")
    return Mark(round(score.fraction, 6), "; ".join(parts + ([unmeasured_why] if unmeasured_why else [])))


# ---------------------------------------------------------------------------------------------
# The fix, re-measured


def fix_expectation() -> Any:
    from perflab import env
    from perflab.verify.expectations import Expectation

    return Expectation("lab01_mystery_fix", FIX_BAR, "gain", env.machine_info().hardware_class, False,
                       f"rule: the fixed pipeline's speedup CI must clear {FIX_BAR:.2f}x over the planted one")


def judge_fix(observed: Any, ctx: Context) -> Mark:
    from perflab.labs import common
    from perflab.verify import Side

    assert isinstance(observed, dict), "FIXED_PIPELINE: no answer"
    source = observed.get("source")
    assert isinstance(source, str) and source.strip(), (
        f"FIXED_PIPELINE: {observed.get('path')!r} does not exist when the notebook runs: write the fixed copy "
        "from a cell of the notebook (only the notebook is submitted)")
    claim = decode_float(observed.get("claim"))
    claim = claim if claim is not None and claim > 0 and math.isfinite(claim) else None
    student = _student(ctx)
    planted = truth(ctx)
    expectation = fix_expectation()
    data = mystery.sizes_for(ctx.mode)[0]
    if _normalised(source) == _normalised(planted.source):
        from perflab.verify.protocol import no_change

        return common.mark_of(no_change(FIX_BAR, claim=claim, baseline="planted pipeline",
                                        candidate="your copy"), expectation)
    baseline = Side.reference("perflab.mystery:planted_step", label="planted pipeline", student=student,
                              data=data, mode=ctx.mode)
    tiny = ctx.mode == "tiny"
    verdict, expectation = ctx.verify_module(baseline, source, expectation, label="your fixed pipeline",
                                             claim=claim, max_pairs=TINY_MAX_PAIRS if tiny else None,
                                             max_seconds=TINY_SECONDS if tiny else None, data=data)
    return common.mark_of(verdict, expectation)


def _normalised(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


# ---------------------------------------------------------------------------------------------
# The trace


@dataclass(frozen=True)
class TraceFacts:
    steps: int
    step_ms: float
    data_share: float
    backward_share: float
    backward_totals: dict[str, float]  # node -> total µs
    runs: frozenset[str] = frozenset()  # the "run <id>" labels it holds


def trace_facts(events: Any) -> TraceFacts:
    """The grader's reading of a trace's events ([name, ts, dur], as the probe sends them)."""
    assert isinstance(events, list), "TRACE_FILE: the file does not exist, or is not a Chrome trace"
    steps: list[float] = []
    phases = {name: 0.0 for name in PHASES}
    nodes: dict[str, float] = {}
    runs: set[str] = set()
    for event in events:
        if not (isinstance(event, list) and len(event) == 3 and isinstance(event[0], str)):
            continue
        name, dur = event[0], decode_float(event[2])
        if dur is None or dur < 0:
            continue
        if name.startswith("ProfilerStep#"):
            steps.append(dur)
        elif name in phases:
            phases[name] += dur
        elif name.startswith(BACKWARD_NODE):
            node = name[len(BACKWARD_NODE):]
            nodes[node] = nodes.get(node, 0.0) + dur
        elif name.startswith(RUN_LABEL):
            runs.add(name)
    assert steps and sum(steps) > 0, "TRACE_FILE holds no profiled step (ProfilerStep#): call prof.step() each step"
    assert phases["forward"] > 0 and phases["backward"] > 0 and nodes, (
        "TRACE_FILE holds no forward and backward labels of the pipeline: profile the pipeline's own steps")
    total = sum(steps)
    return TraceFacts(len(steps), total / len(steps) / 1e3, phases["data"] / total, phases["backward"] / total,
                      nodes, frozenset(runs))


def trace_mistakes(answers: Any, facts: TraceFacts) -> list[str]:
    """One line per trace answer that does not match the trace (empty when all do)."""
    assert isinstance(answers, dict), f"TRACE_ANSWERS should be a dict with {', '.join(TRACE_KEYS)}"
    wrong = []
    step_ms = decode_float(answers.get("step_ms"))
    if step_ms is None or not math.isclose(step_ms, facts.step_ms, rel_tol=STEP_MS_REL):
        wrong.append(f"step_ms: {answers.get('step_ms')!r} is not the mean ProfilerStep duration of your trace")
    for key, want in (("data_share", facts.data_share), ("backward_share", facts.backward_share)):
        got = decode_float(answers.get(key))
        if got is None or abs(got - want) > SHARE_ABS:
            label = key.split("_")[0]
            wrong.append(f"{key}: {answers.get(key)!r} is not the {label!r} label's share of your trace's step time")
    top = answers.get("top_backward")
    best = max(facts.backward_totals.values())
    near = {n for n, t in facts.backward_totals.items() if t >= best * 0.98}  # a tie within 2% counts
    if not (isinstance(top, str) and top.removeprefix(BACKWARD_NODE).strip() in near):
        wrong.append(f"top_backward: {top!r} is not the backward node with the most total time in your trace")
    return wrong


@functools.cache
def model_counts(model: str) -> tuple[int, int]:
    """(convolutions, parameter tensors) of torchvision's `model`: what torch.profiler records in every step
    of a mystery pipeline on it, one convolution op a Conv2d in the "forward" label and one
    ConvolutionBackward0 node in "backward" (ResNet-18: 20 and 62 parameter tensors)."""
    import torch.nn as nn

    from perflab.workload import network

    net = network(model, num_classes=2)
    return sum(isinstance(m, nn.Conv2d) for m in net.modules()), sum(1 for _ in net.parameters())


# Fewer cpu ops than a ResNet-18 step's forward alone records: not a trace of a training step.
MIN_STEP_OPS = 200


# The most rows one operation of a light row loop takes, over the amounts an id can draw.
_MOST_ROWS = max(int(rows) for rows in AMOUNTS["row_block"])


def _signatures(image_size: int, batch: int, convs: int, params: int) -> dict[str, tuple[str, Any, bool]]:
    """Per planted bug that leaves its own ops in a step's trace: (what shows, a test of a step's summary
    that holds when the bug is there and fails when it is not, whether the test holds at the bug's light
    dose too), measured on traces of each bug alone at each dose; `convs` and `params`: `model_counts`."""
    return {
        "grad_histograms": ("aten::histc over the gradients", lambda s: s["counted"]["aten::histc"] >= 1, True),
        # A tensor op per part of a row, or per few rows at a light dose: at least 3 * ceil(IMAGE_SIZE / the
        # most rows an id's light dose takes) an image (`catalogue.AMOUNTS`, exactly the bound at that
        # amount); the clean pipeline subtracts once.
        "row_loop": ("an aten::sub per few image rows",
                     lambda s: s["counted"]["aten::sub"] >= 3 * -(-image_size // _MOST_ROWS) * batch, True),
        "eval_accuracy": ("a second forward's convolutions",
                          lambda s: s["counted"]["aten::convolution"] >= 2 * convs, True),
        # A light dose copies two tensors, fewer than the clones any step records: no test there.
        "snapshot": ("a clone of every weight", lambda s: s["counted"]["aten::clone"] >= params, False),
        "python_collate": ("no aten::stack of the default collate", lambda s: s["counted"]["aten::stack"] == 0, True),
    }


def trace_not_genuine(summary: Any, planted: Truth, mode: str | None) -> str | None:
    """Why a trace's summary (`lab01_mystery.trace_summary`) is not what torch.profiler writes for this
    pipeline (None when it is): the profiler's metadata, its nesting, the pipeline's labels and ops in
    every step, and the planted bugs' own ops, each consistent with the others."""
    if not isinstance(summary, dict) or not isinstance(summary.get("meta"), dict):
        return "it could not be read as torch.profiler's Chrome trace"
    meta, steps = summary["meta"], summary.get("steps")
    types = {"schemaVersion": "int", "deviceProperties": "list", "trace_id": "str", "baseTimeNanoseconds": "int",
             "displayTimeUnit": "str"}
    missing = [k for k, t in types.items() if meta.get(k) != t]
    if missing or meta.get("trace_id_form") is not True or meta.get("span") is not True:
        return f"it lacks the metadata torch.profiler writes ({', '.join(missing) or 'trace_id, profiler span'})"
    flows = meta.get("flows")
    if not (isinstance(flows, list) and len(flows) == 2 and flows[0] == flows[1] and flows[0] > 0):
        return "it holds no forward-to-backward links (fwdbwd flows) as torch.profiler records them"
    if meta.get("crossing") or meta.get("ops_without_ids"):
        return ("its events overlap in ways torch.profiler never nests them, or its ops lack the profiler's ids: "
                "an edited trace")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, dict) for s in steps):
        return "it holds no profiled step (ProfilerStep#)"
    image_size, batch = mystery.sizes_for(mode)[1:]
    model = course_model()
    convs, params = model_counts(model)
    signatures = _signatures(image_size, batch, convs, params)
    planted_keys = {p.key for p in planted.planted}
    untested = {p.key for p in planted.planted if p.dose == "light" and not signatures.get(p.key, ("", None, True))[2]}
    for step in steps:
        try:
            name = step["name"]
            if step["nested_in_step"] or any(step["labels"][label] != 1 for label in PHASES):
                return f"{name} does not hold the pipeline's data/forward/backward/optimizer labels once each"
            if step["runs_in_data"] != 1:
                return f"{name} does not hold the pipeline's run label inside its data label"
            if step["forward_convs"] != convs or step["backward_conv_nodes"] != convs:
                return (f"{name} does not hold {model}'s {convs} convolutions in its forward label and "
                        f"{convs} ConvolutionBackward0 nodes in its backward label")
            if step["ops"] < MIN_STEP_OPS:
                return f"{name} holds {step['ops']} ops, fewer than one training step of the pipeline records"
            for key, (shows, test, _) in signatures.items():
                if key not in untested and bool(test(step)) != (key in planted_keys):
                    return (f"{name} {'lacks' if key in planted_keys else 'holds'} {shows}, which your pipeline "
                            f"{'has' if key in planted_keys else 'does not have'}: a trace of another pipeline")
        except (KeyError, TypeError):
            return "its steps could not be read as torch.profiler records them"
    return None


def judge_trace(observed: Any, ctx: Context) -> Mark | None:
    assert isinstance(observed, dict), "TRACE_ANSWERS: no answer"
    why = trace_not_genuine(observed.get("summary"), truth(ctx), ctx.mode)
    if why is not None:
        raise Suspicious(f"TRACE_FILE is not torch.profiler's trace of your pipeline: {why}")
    facts = trace_facts(observed.get("events"))
    run = f"{RUN_LABEL}{truth(ctx).run_id}"
    assert run in facts.runs, (
        f"TRACE_FILE is not a trace of your pipeline (its data phase is labelled {run!r}): profile the pipeline "
        "the notebook wrote for you")
    wrong = trace_mistakes(observed.get("answers"), facts)
    if not wrong:
        return None
    return Mark(round(1 - len(wrong) / len(TRACE_KEYS), 6), "; ".join(wrong))


JUDGES = {
    "mystery_diagnosis": judge_diagnosis,
    "mystery_fix": judge_fix,
    "mystery_trace": judge_trace,
}
