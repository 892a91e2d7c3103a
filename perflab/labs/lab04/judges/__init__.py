"""Lab 04's judges and the reference answers they compare against; grader-only: the student bundle
and the grading sandbox leave this module out.

The contract the judges enforce is stated in `perflab.labs.lab04`. The student's three functions are
judged from what they do on inputs drawn from the grader's seed: each probe exports a function's
source, `observe` runs it in a fresh sandboxed program (`Context.run_program`, once per function and
seed), and the judges below compare the numbers it prints (outputs, gradient projections, saved
bytes, BatchNorm state, the batch sizes tried) with the reference computed here. The decision
CHECKPOINT_CHOICE is data: the grader measures the activations of the chosen stages with its own
checkpointing at the graded workload and counts their recomputed FLOPs (`choice_table`). The cost of
checkpointing is re-measured from the same source by `perflab.verify` (`Context.verify_module`). A
solution notebook's hidden blocks run probe and judge in-process with `check(grade_id, globals())`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from perflab import memory
from perflab.counting import restoring_buffers
from perflab.grading.judging import Context, Mark, check_here
from perflab.grading.probing import decode_float
from perflab.labs import lab04, predict
from perflab.labs.lab04 import checks as lab04_checks
from perflab.labs.lab04 import max_calls
from perflab.labs.lab04 import measure as lab04_measure
from perflab.labs.lab04 import probes as lab04_probes
from perflab.labs.lab04.checks import CheckpointCase, memory_function
from perflab.labs.lab04.measure import cross_entropy_on, full_batch_grads
from perflab.workload import TrainConfig

# A correct checkpoint saves what the reference saves; 0.8 leaves room for a wrapper that keeps a
# little more (an extra view of a stage's input), while a stage split by checkpoint_sequential,
# whose last segment is NOT checkpointed, saves about half as much and fails.
MIN_SAVING_SHARE = 0.8
# Recomputation repeats the same operations on the same inputs, so gradients agree to rounding;
# 1e-4 of a tensor's largest entry allows other kernel choices on a GPU, a wrong graph misses by far more.
GRAD_RTOL = 1e-4
# Micro-batch gradients summed in another order than one large batch's: fp32 rounding only.
ACCUM_RTOL = 1e-4
# Outputs of the checkpointed model against the plain one (same operations: equal up to rounding). The
# student's program runs in the sandbox on its own thread count, the reference here on the grader's:
# other kernels, other rounding (measured: up to 9.4e-6 on ResNet-18 at 32 px, 1 thread against 2),
# while a wrong checkpoint misses by orders of magnitude more.
OUTPUT_RTOL, OUTPUT_ATOL = 1e-4, 1e-5


# ---------------------------------------------------------------------------------------------
# The reference pair calibration times (the student's kit holds the contract, `perflab.labs.lab04`, only)


def calibration_pair(mode: str = "grade") -> tuple[TrainConfig, TrainConfig]:
    """(baseline, candidate) that `perflab calibrate` times for `lab04.EXPECTATION`: perflab's own
    checkpointing of every stage (`TrainConfig.checkpoint_stages`) against the plain run."""
    base = lab04.baseline_config(mode)
    return base, base.replace(checkpoint_stages=len(lab04.GRADED_STAGES))


# ---------------------------------------------------------------------------------------------
# References (what the checks measure the student's functions against)


class _ReferenceStage(nn.Module):
    """One stage as one checkpointed segment; its recomputation leaves BatchNorm statistics alone."""

    def __init__(self, stage: nn.Module) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self.stage(x)
        return checkpoint(self.stage, x, use_reentrant=False,
                          context_fn=lambda: (contextlib.nullcontext(), restoring_buffers(self.stage)))


def _reference_checkpoint(model: nn.Module, stages: Sequence[str]) -> nn.Module:
    """The reference answer to checkpoint_stages: each named stage wrapped in place."""
    for name in stages:
        setattr(model, name, _ReferenceStage(getattr(model, name)))
    return model


def _reference_largest_batch(budget: float, memory_of: Callable[[int], float], max_batch: int) -> int:
    """The reference answer to largest_batch: doubling from 1, then bisection."""
    if memory_of(1) > budget:
        return 0
    good, bad = 1, None
    while bad is None and good < max_batch:
        trial = min(2 * good, max_batch)
        if memory_of(trial) <= budget:
            good = trial
        else:
            bad = trial
    if bad is None:
        return good
    while bad - good > 1:
        mid = (good + bad) // 2
        if memory_of(mid) <= budget:
            good = mid
        else:
            bad = mid
    return good




# Seconds the program that observes one function may run (ResNet-18 on a few small batches).
PROGRAM_TIMEOUT_S = 180.0
# A projection of a right answer is within this many standard deviations of the reference's, for
# element errors up to the tolerance; a wrong gradient misses by orders of magnitude more.
PROJECTION_SIGMAS = 6.0
# BatchNorm running statistics after the same steps as the plain model's (fp32 rounding only).
BN_RTOL, BN_ATOL = 1e-5, 1e-6


# ---------------------------------------------------------------------------------------------
# Running the student's function where the kernel cannot reach it

_OBSERVED: dict[tuple[str, str, int], dict[str, Any] | str] = {}


def observe(function: str, observed: Any, ctx: Context) -> dict[str, Any]:
    """What `function` (exported by the cell's probe) does on the grader's cases: run once per source and
    seed in a fresh program (`ctx.run_program`, the grading sandbox), then remembered."""
    assert isinstance(observed, dict), f"{function} could not be read from the notebook"
    source = observed.get("source")
    assert isinstance(source, str) and source.strip(), observed.get("why") or f"{function} could not be exported"
    key = (function, source, ctx.seed)
    if key not in _OBSERVED:
        if len(_OBSERVED) > 32:
            _OBSERVED.clear()
        nonce = secrets.token_hex(8)
        program = lab04_checks.observation_program(function, source, ctx.seed).replace(
            "'PERFLAB-OBSERVED '", f"'PERFLAB-OBSERVED {nonce} '")
        status, output = ctx.run_program(program, timeout=PROGRAM_TIMEOUT_S)
        marker = f"PERFLAB-OBSERVED {nonce} "
        line = next((ln for ln in reversed(output.splitlines()) if ln.startswith(marker)), None)
        if status == 0 and line is not None:
            try:
                _OBSERVED[key] = json.loads(line[len(marker):])
            except ValueError:
                _OBSERVED[key] = f"{function} printed an unreadable result"
        else:
            last = [ln for ln in output.strip().splitlines() if ln.strip()][-1:] or [f"exit status {status}"]
            why = "did not finish in time" if status == -9 else f"stopped: {last[0][:300]}"
            _OBSERVED[key] = f"{function} could not be run on the grader's cases ({why})"
    got = _OBSERVED[key]
    if isinstance(got, str):
        raise AssertionError(got)
    return got


def _tensor(value: Any) -> torch.Tensor | None:
    t = value.get("tensor") if isinstance(value, dict) else None
    if not isinstance(t, dict) or not isinstance(t.get("values"), list):
        return None
    return torch.tensor([decode_float(v) if decode_float(v) is not None else math.nan for v in t["values"]],
                        dtype=torch.float64).reshape(t["shape"])


def _raised(got: Any, where: str, function: str) -> None:
    assert isinstance(got, dict), f"{where}: no result"
    if "raised" in got:
        hint = (" (the grader runs your function from its source in a fresh process, with the notebook's imports, "
                "functions, classes and plain constants it uses: build any other object inside the function)"
                if got["raised"] == "NameError" else "")
        raise AssertionError(f"{where}: {function} raised {got['raised']}: {got.get('message', '')}{hint}")


def _close(got: Any, want: torch.Tensor, where: str, what: str) -> None:
    t = _tensor(got)
    assert t is not None and t.shape == want.shape, f"{where}: {what} have another shape than {tuple(want.shape)}"
    assert torch.allclose(t, want.double(), rtol=OUTPUT_RTOL, atol=OUTPUT_ATOL), (
        f"{where}: {what} differ from the plain model's by up to {float((t - want.double()).abs().max()):.3g}")


def _compare_tensors(got: Any, want: Sequence[torch.Tensor | None], names: Sequence[str], rtol: float, atol: float,
                     where: str, what: str) -> None:
    """Student projections against the reference tensors: norms, largest entries and random projections
    each within what element errors of rtol x the largest entry of all the tensors (+ atol) allow.

    The scale is the whole model's, not each tensor's: a conv bias followed by BatchNorm has a gradient
    that is zero in exact arithmetic, so what is left of it (1e-8 here) is rounding noise, which
    recomputation changes by its own size; held to its own scale it failed the reference itself."""
    assert isinstance(got, list) and len(got) == len(want), f"{where}: {what}: another number of tensors than the model has"
    reference = lab04_checks.projections(list(want))
    scale = max((ref[1] for ref in reference if ref is not None), default=0.0)
    for name, g, w, ref in zip(names, got, want, reference, strict=True):
        if w is None or ref is None:
            continue
        assert g is not None, (f"{where}: no gradient reached {name} (a reentrant checkpoint, or one skipped "
                               "when its input does not require grad, cuts the graph)")
        values = [decode_float(v) for v in g] if isinstance(g, list) else []
        assert len(values) == len(ref) and all(v is not None and math.isfinite(v) for v in values), \
            f"{where}: {what} of {name} could not be read"
        tol = rtol * max(ref[1], scale) + atol
        root = math.sqrt(max(w.numel(), 1))
        bounds = [root * tol + 1e-12, tol + 1e-12] + [PROJECTION_SIGMAS * root * tol + 1e-12] * lab04_checks.NUM_PROJECTIONS
        worst = max(abs(v - r) / b for v, r, b in zip(values, ref, bounds, strict=True))
        assert worst <= 1.0, (f"{where}: the {what} of {name} differs from the plain model's (norm {values[0]:.6g} "
                              f"against {ref[0]:.6g}, largest entry {values[1]:.6g} against {ref[1]:.6g})")


# ---------------------------------------------------------------------------------------------
# checkpoint_stages

def _plain(case: CheckpointCase) -> tuple[dict[str, Any], list[torch.Tensor | None], list[str], list[list[torch.Tensor]],
                                          list[list[int]]]:
    """The plain model through the same sequence as `lab04_checks.trace_checkpoint`: its trace, gradients,
    parameter names, and BatchNorm state after each of the two steps."""
    model = copy.deepcopy(case.model)
    names = [n for n, _ in model.named_parameters()]
    model.eval()
    with torch.no_grad(), lab04_measure.quiet():
        eval_out = model(case.x)
    with lab04_measure.quiet():
        saved = memory.activation_bytes(model.train(), case.x, cross_entropy_on(case.y)).bytes
    train_out, grads = lab04_checks.train_step_of(model, case.x, case.y)
    grads = [None if g is None else g.clone() for g in grads]
    floats, counts = [], []
    for step in range(2):
        if step:
            lab04_checks.train_step_of(model, case.x, case.y)
        f, c = lab04_checks.bn_state(model)
        floats.append(f)
        counts.append(c)
    return {"eval_out": eval_out, "train_out": train_out, "saved": saved}, grads, names, floats, counts


def _reference_saved(case: CheckpointCase) -> int:
    model = _reference_checkpoint(copy.deepcopy(case.model), case.stages)
    with lab04_measure.quiet():
        return memory.activation_bytes(model.train(), case.x, cross_entropy_on(case.y)).bytes


def _checkpoint_case(got: Any, case: CheckpointCase) -> tuple[dict[str, Any], dict[str, Any]]:
    """The common checks of one case (the model returned, in place, outputs, gradients): (got, plain)."""
    _raised(got, case.name, "checkpoint_stages")
    assert "returned" not in got, f"{case.name}: checkpoint_stages returned {got['returned']}, not the model"
    assert got.get("in_place") is True, (
        f"{case.name}: the returned model's parameters are not the original tensors in their order "
        "(wrap the stages in place; do not copy the model)")
    plain, grads, names, _, _ = _plain(case)
    _close(got.get("eval_out"), plain["eval_out"], case.name, "in eval mode (no grad) the outputs")
    _close(got.get("train_out"), plain["train_out"], case.name, "in train mode the outputs")
    _compare_tensors(got.get("grads"), grads, names, GRAD_RTOL, 1e-9, case.name, "gradient")
    return got, plain


def _on_observation_threads(judge: Callable[[Any, Context], None]) -> Callable[[Any, Context], None]:
    """`judge` computing its references on the threads the observations ran on (lab04_checks.observation_threads)."""
    def judged(observed: Any, ctx: Context) -> None:
        with lab04_checks.observation_threads():
            judge(observed, ctx)

    judged.__name__ = judged.__qualname__ = judge.__name__
    judged.__doc__ = judge.__doc__
    return judged


@_on_observation_threads
def judge_checkpoint_visible(observed: Any, ctx: Context) -> None:
    got = observe("checkpoint_stages", observed, ctx)["visible"]
    case = lab04_checks.visible_checkpoint_case()
    got, plain = _checkpoint_case(got, case)
    saved = got.get("saved")
    assert isinstance(saved, int) and saved < 0.6 * plain["saved"], (
        f"{case.name}: saved activations {saved} bytes against {plain['saved']} plain: checkpointing all four "
        "stages should save over 40% here")


@_on_observation_threads
def judge_checkpoint_hidden(observed: Any, ctx: Context) -> None:
    results = observe("checkpoint_stages", observed, ctx)["hidden"]
    cases = lab04_checks.checkpoint_cases(ctx.seed)
    assert isinstance(results, list) and len(results) == len(cases), "no result for every case"
    for got, case in zip(results, cases, strict=True):
        got, plain = _checkpoint_case(got, case)
        saved = got.get("saved")
        assert isinstance(saved, int), f"{case.name}: saved bytes could not be read"
        want_saving = plain["saved"] - _reference_saved(case)
        got_saving = plain["saved"] - saved
        assert got_saving >= MIN_SAVING_SHARE * want_saving, (
            f"{case.name}: saved activations fall from {plain['saved']} to {saved} bytes, a saving of "
            f"{got_saving}; checkpointing each stage as one segment saves {want_saving} (at least "
            f"{MIN_SAVING_SHARE:.0%} of it is required; checkpoint_sequential leaves its last segment "
            "un-checkpointed, and a stage skipped when its input needs no grad saves nothing)")


@_on_observation_threads
def judge_checkpoint_bn(observed: Any, ctx: Context) -> None:
    seen = observe("checkpoint_stages", observed, ctx)
    cases = [lab04_checks.visible_checkpoint_case(), *lab04_checks.checkpoint_cases(ctx.seed)]
    results = [seen["visible"], *seen["hidden"]]
    for got, case in zip(results, cases, strict=True):
        _raised(got, case.name, "checkpoint_stages")
        _, _, _, floats, counts = _plain(case)
        bn = got.get("bn")
        assert isinstance(bn, list) and len(bn) == 2, f"{case.name}: BatchNorm state could not be read"
        for step, (state, want_f, want_c) in enumerate(zip(bn, floats, counts, strict=True)):
            have_c = state.get("counts") if isinstance(state, dict) else None
            assert isinstance(have_c, list) and len(have_c) == len(want_c), (
                f"{case.name}: the checkpointed model has other BatchNorm layers than the plain one")
            for h, w in zip(have_c, want_c, strict=True):
                assert h == w, (f"{case.name}, step {step + 1}: num_batches_tracked is {h}, the plain model's {w}: "
                                "the recomputed forward counted the batch again")
            names = [f"running statistics {i}" for i in range(len(want_f))]
            try:
                _compare_tensors(state.get("running"), want_f, names, BN_RTOL, BN_ATOL, f"{case.name}, step {step + 1}",
                                 "BatchNorm")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: the recomputed forward in backward updated them a second time (or not "
                                     "at all); give the recomputation a context that leaves them alone") from None


def judge_cost(observed: Any, ctx: Context) -> Mark:
    from perflab.labs import common

    assert isinstance(observed, dict), "checkpoint_stages could not be read from the notebook"
    source = observed.get("source")
    assert isinstance(source, str) and source.strip(), observed.get("why") or "checkpoint_stages could not be exported"
    claim = decode_float(observed.get("claim"))
    claim = claim if claim is not None and math.isfinite(claim) and claim > 0 else None
    s = lab04.sizes(ctx.mode)
    baseline = lab04.baseline_config(ctx.mode)
    try:  # what checkpointing buys comes first: a checkpoint that saves no memory has no cost worth grading
        judge_checkpoint_hidden(observed, ctx)
    except AssertionError as exc:
        from perflab.verify import Verdict, load_expectation

        why = f"no cost to grade: checkpoint_stages does not save the activation memory that checkpointing buys ({exc})"
        expectation = load_expectation(lab04.EXPECTATION, workload=baseline)
        return common.mark_of(Verdict("fail", "no_saving", why, expectation.threshold, claim=claim), expectation)
    verdict, expectation = ctx.verify_module(baseline, lab04.candidate_source(source, baseline), lab04.EXPECTATION,
                                             label="checkpoint_stages", claim=claim, max_pairs=s.verify_max_pairs,
                                             max_seconds=s.verify_seconds, measure_activations=True)
    # What it buys, on the workload itself: the activation memory its step saves, from the same fresh process.
    return common.mark_of(lab04.with_saving_checked(verdict, baseline), expectation)


# ---------------------------------------------------------------------------------------------
# CHECKPOINT_CHOICE: which stages to checkpoint under the budget

# Why lab04.ACTIVATION_BUDGET_SHARE is 0.64 (measured with this module's checkpointing, ResNet-18 at 64 px,
# batches 8 to 128, and at 96 to 224 px within 0.2 points): alone, layer1 saves 25% of the plain step's
# activations, layer2 14%, layer3 7%, layer4 4%, and the savings add up; layer1 recomputes 1.125 times the
# forward FLOPs of each other stage. Every stage keeps 49%: it fits. Layer1 with layer2 keeps 60%, the
# cheapest choice that fits; layer1 with layer3, as cheap, keeps 67% and does not; no cheaper choice
# keeps less than 75%. 0.64 sits midway between 60% and 67%, so a student's table at any mode's sizes
# ranks the choices as the grader's measurement does.
# A choice that fits earns full marks when it recomputes at most this share more than the cheapest choice
# that fits. FLOPs are counted exactly; the slack only spares a student whose own table ranked two stages
# of nearly equal cost the other way.
CHOICE_COST_RTOL = 0.05
# The share of the decision's points a choice earns that fits the budget at a higher cost than needed
# (every stage, where fewer fit).
COSTLIER_FIT_SHARE = 0.5


@dataclass(frozen=True)
class ChoiceTable:
    """Every subset of lab04.STAGES at one workload, measured by the grader: the activations one training
    step keeps with the subset checkpointed by the kit's own correct checkpointing (`_reference_checkpoint`),
    the budget, and each stage's forward FLOPs (what checkpointing it recomputes)."""

    batch_size: int
    image_size: int
    budget: int
    plain: int
    activations: Mapping[tuple[str, ...], int]
    flops: Mapping[str, int]

    def cost(self, stages: Sequence[str]) -> int:
        return sum(self.flops[name] for name in stages)

    def fitting(self) -> list[tuple[str, ...]]:
        return [subset for subset, acts in self.activations.items() if acts <= self.budget]

    def cheapest(self) -> tuple[int, list[tuple[str, ...]]]:
        """(least cost of a subset that fits, the subsets that fit at that cost)."""
        fits = self.fitting()
        least = min(self.cost(subset) for subset in fits)
        return least, [subset for subset in fits if self.cost(subset) == least]


_CHOICE_TABLES: dict[tuple[int, int], ChoiceTable] = {}


def choice_table(mode: str) -> ChoiceTable:
    """The grader's measurement of every choice at `mode`'s sizes (memoised per workload: sixteen forward
    passes of ResNet-18, on the CPU, where the bytes a step saves depend on shapes only)."""
    s = lab04.sizes(mode)
    key = (s.batch_size, s.memory_image_size)
    if key not in _CHOICE_TABLES:
        base = lab04.resnet18()
        plain = lab04_measure.memory_model(base, s.memory_image_size)
        activations = {}
        for mask in range(2 ** len(lab04.STAGES)):
            subset = tuple(name for i, name in enumerate(lab04.STAGES) if mask >> i & 1)
            model = _reference_checkpoint(copy.deepcopy(base), subset)
            activations[subset] = lab04_measure.memory_model(model, s.memory_image_size).activations(s.batch_size)
        _CHOICE_TABLES[key] = ChoiceTable(
            s.batch_size, s.memory_image_size, lab04_measure.activation_budget(mode, plain),
            plain.activations(s.batch_size), activations,
            lab04_measure.stage_forward_flops(base, s.batch_size, s.memory_image_size))
    return _CHOICE_TABLES[key]


def _stages_text(stages: Sequence[str]) -> str:
    return ", ".join(stages) if stages else "no stage"


def judge_checkpoint_choice(observed: Any, ctx: Context) -> Mark | None:
    """CHECKPOINT_CHOICE, measured at the graded workload: it must fit the budget (else 0), at the least
    recomputation within CHOICE_COST_RTOL (else COSTLIER_FIT_SHARE)."""
    assert isinstance(observed, dict) and "choice" in observed, "CHECKPOINT_CHOICE could not be read from the notebook"
    choice = observed["choice"]
    problems = lab04.choice_problems(choice)
    assert not problems, problems[0]
    stages = tuple(name for name in lab04.STAGES if name in choice)
    table = choice_table(ctx.mode)
    kept = table.activations[stages]
    where = (f"at the graded workload (batch {table.batch_size}, {table.image_size} px) the grader measured "
             f"{memory.format_bytes(kept)} of activations with {_stages_text(stages)} checkpointed "
             f"({kept / table.plain:.0%} of the plain step's {memory.format_bytes(table.plain)})")
    assert kept <= table.budget, (
        f"{where}: over the budget of {memory.format_bytes(table.budget)} "
        f"({lab04.ACTIVATION_BUDGET_SHARE:.0%}): this choice does not fit")
    least, best = table.cheapest()
    cost = table.cost(stages)
    decision = {"checkpoint": list(stages)}  # what lab 6 starts from
    if cost <= (1 + CHOICE_COST_RTOL) * least:
        return Mark(1.0, decision=decision)
    return Mark(COSTLIER_FIT_SHARE, (
        f"{where}: it fits the budget of {memory.format_bytes(table.budget)}, but recomputes "
        f"{cost / 1e9:.2f} GFLOP in backward, where checkpointing {_stages_text(best[0])} also fits and recomputes "
        f"{least / 1e9:.2f} GFLOP: fitting comes first, the least recomputation second"), decision=decision)


# ---------------------------------------------------------------------------------------------
# largest_batch

def _search(got: Any, case: Mapping[str, Any], where: str) -> None:
    fn = memory_function(case["fn"])
    want = _reference_largest_batch(case["budget"], fn, case["max_batch"])
    _raised(got, where, "largest_batch")
    value = got.get("value")
    assert value == want, f"{where}: the largest batch within the budget is {want}, you said {value!r}"
    tried = got.get("tried")
    assert isinstance(tried, list) and all(isinstance(t, int) for t in tried), f"{where}: memory_of was called with {tried!r}"
    top = max(tried, default=0)
    assert top <= max(1, 2 * want), (
        f"{where}: you tried batch size {top}, more than twice the answer {want}: on a real device that is an "
        "out-of-memory error (grow by doubling from 1)")
    assert len(tried) <= max_calls(want), (
        f"{where}: {len(tried)} calls of memory_of; doubling then bisection needs at most {max_calls(want)} "
        f"for an answer of {want}")


def _describe(case: Mapping[str, Any]) -> str:
    fn = case["fn"]
    kind = {"affine": "a straight line", "steps": "allocator steps", "table": "plateaus"}.get(fn["kind"], fn["kind"])
    return f"{kind}, max_batch={case['max_batch']}, budget={case['budget']:.6g}"


def judge_largest_batch_visible(observed: Any, ctx: Context) -> None:
    got = observe("largest_batch", observed, ctx)["visible"]
    cases = lab04_checks.visible_largest_batch_cases()
    assert isinstance(got, list) and len(got) == len(cases), "no result for every case"
    for one, case in zip(got, cases, strict=True):
        _search(one, case, f"visible case ({_describe(case)})")


def judge_largest_batch_hidden(observed: Any, ctx: Context) -> None:
    seen = observe("largest_batch", observed, ctx)
    cases = lab04_checks.largest_batch_cases(ctx.seed)
    got = seen["hidden"]
    assert isinstance(got, list) and len(got) == len(cases), "no result for every case"
    for i, (one, case) in enumerate(zip(got, cases, strict=True)):
        _search(one, case, f"case {i} ({_describe(case)})")
    for args, one in zip(lab04_checks.LARGEST_BATCH_BAD, seen["bad"], strict=True):
        assert isinstance(one, dict) and one.get("raised") == "ValueError", (
            f"largest_batch with {args} should raise ValueError")


def judge_largest_batch_model(observed: Any, ctx: Context) -> None:
    got = observe("largest_batch", observed, ctx)["model"]
    cases = lab04_checks.model_budget_cases(ctx.seed + 1)
    assert isinstance(got, list) and len(got) == len(cases), "no result for every budget"
    for one, case in zip(got, cases, strict=True):
        kind = "checkpointed" if case["fn"]["kind"].endswith("checkpointed") else "plain"
        _search(one, case, f"ResNet-18 {kind} at {lab04.MIN_MEMORY_IMAGE_SIZE} px, budget "
                           f"{memory.format_bytes(case['budget'])}")


# ---------------------------------------------------------------------------------------------
# accumulate_gradients

def _accumulate(got: Any, desc: Mapping[str, Any], where: str) -> None:
    _raised(got, where, "accumulate_gradients")
    model, x, y = lab04_checks.accumulate_setup(desc)
    names = [n for n, _ in model.named_parameters()]
    want_loss, want_grads = full_batch_grads(model, x, y)
    assert got.get("mode_kept") is True, f"{where}: the model came back in the other mode (train/eval)"
    n, micro = int(desc["n"]), int(desc["micro"])
    want_sizes = [min(micro, n - start) for start in range(0, n, micro)]
    assert got.get("seen") == want_sizes, (f"{where}: the model saw batches of {got.get('seen')}; expected "
                                          f"consecutive micro-batches of {want_sizes}")
    loss = decode_float(got.get("loss"))
    assert loss is not None, f"{where}: return the mean loss as a float, got {got.get('loss')!r}"
    assert math.isclose(loss, want_loss, rel_tol=1e-5, abs_tol=1e-7), (
        f"{where}: the mean loss over the batch is {want_loss:.6f}, you returned {loss:.6f}")
    _compare_tensors(got.get("grads"), want_grads, names, ACCUM_RTOL, 1e-9, where, "gradient")


def _accumulate_where(desc: Mapping[str, Any], label: str) -> str:
    model = "CNN without BatchNorm (train mode)" if desc["model"] == "cnn" else "ResNet-18 with BatchNorm in eval mode"
    return f"{label}: {model}, batch {desc['n']} in micro-batches of {desc['micro']}"


@_on_observation_threads
def judge_accumulate_visible(observed: Any, ctx: Context) -> None:
    desc = lab04_checks.visible_accumulate_case()
    _accumulate(observe("accumulate_gradients", observed, ctx)["visible"], desc, _accumulate_where(desc, "visible case"))


@_on_observation_threads
def judge_accumulate_hidden(observed: Any, ctx: Context) -> None:
    seen = observe("accumulate_gradients", observed, ctx)
    cases = lab04_checks.accumulate_cases(ctx.seed)
    got = seen["hidden"]
    assert isinstance(got, list) and len(got) == len(cases), "no result for every case"
    for i, (one, desc) in enumerate(zip(got, cases, strict=True)):
        _accumulate(one, desc, _accumulate_where(desc, f"case {i}"))
    for micro, one in zip(lab04_checks.ACCUMULATE_BAD, seen["bad"], strict=True):
        assert isinstance(one, dict) and one.get("raised") == "ValueError", (
            f"accumulate_gradients with micro_batch_size={micro!r} should raise ValueError")


JUDGES = {
    "checkpoint_visible": judge_checkpoint_visible,
    "checkpoint_hidden": judge_checkpoint_hidden,
    "checkpoint_batchnorm": judge_checkpoint_bn,
    "largest_batch_visible": judge_largest_batch_visible,
    "largest_batch_hidden": judge_largest_batch_hidden,
    "largest_batch_model": judge_largest_batch_model,
    "checkpoint_choice": judge_checkpoint_choice,
    "checkpoint_cost_verified": judge_cost,
    "accumulate_visible": judge_accumulate_visible,
    "accumulate_hidden": judge_accumulate_hidden,
    **{f"test_predict_{key}": predict.judger(name, why) for key, (name, why) in lab04.PREDICTIONS.items()},
}


def check(grade_id: str, namespace: Mapping[str, Any], seed: int = 0) -> None:
    """A solution notebook's hidden block: this cell's probe and judge, in this process."""
    check_here(lab04.LAB, grade_id, namespace, seed)


def judge_function(grade_id: str, function: Callable[..., Any], seed: int = 0,
                   namespace: Mapping[str, Any] | None = None, in_process: bool = False) -> Mark:
    """The mark `function` earns on cell `grade_id`: probe, program and judge as when grading, the program
    run in a local process (or, `in_process`, in this one: quicker, for the kit's tests of the judges)."""
    from perflab.grading.judging import judge_cell
    from perflab.grading.probing import run_probes

    name = {"checkpoint": "checkpoint_stages", "largest": "largest_batch", "accumulate": "accumulate_gradients"}[
        grade_id.split("_")[0]]
    ns = {**(namespace if namespace is not None else getattr(function, "__globals__", {})), name: function}
    observations = run_probes({grade_id: lab04_probes.PROBES[grade_id]}, ns, seed)
    ctx = Context(lab04.LAB, seed, "tiny", observations, program_runner=_run_here if in_process else None)
    return judge_cell(grade_id, JUDGES[grade_id], ctx)


def _run_here(program: str, timeout: float) -> tuple[int, str]:
    """Run an observation program in this process: (0 or 1, what it printed)."""
    import io

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(program, "<observation>", "exec"), {"__name__": "__observation__"})
    except Exception as exc:
        return 1, f"{out.getvalue()}\n{type(exc).__name__}: {exc}"
    return 0, out.getvalue()
