"""Lab 4 — Trade compute for memory: the contract between the notebook, its tests and the grader.

The student writes three functions in `labs/lab04_memory/lab04_memory.ipynb`. What is asked and
what is checked are stated once, here; the visible tests are in the notebook. When graded, each
function's source (with what of the notebook it uses) is run by the grader in a fresh sandboxed
process on inputs drawn from its seed (`observe_*` in `perflab.labs.lab04.checks` print what the
function did), and the judges of `perflab/labs/lab04/judges/` (grader-only, with the tolerances
named below) compare that with their reference.

Gradient checkpointing
    checkpoint_stages(model, stages) -> nn.Module
        Make each direct child of `model` named in `stages` (e.g. ("layer1", "layer3") of a
        torchvision ResNet) run as ONE segment under
        `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` whenever autograd records
        (`torch.is_grad_enabled()`), whether or not its input requires grad; with grad disabled it
        runs plainly. Works in place and returns `model`: `list(model.parameters())` are the same
        tensors, in the same order, before and after. Against the plain model on the same input:
          - outputs are equal (train and eval mode);
          - gradients of a loss are equal within GRAD_RTOL (1e-4 of each tensor's largest entry);
          - saved activation bytes (`perflab.memory.activation_bytes` with the loss, train mode)
            fall by at least MIN_SAVING_SHARE (80%) of what the reference saves by checkpointing
            the same stages, each as one segment (saved bytes depend on shapes, not on the
            machine's speed, so the reference is measured by the check itself, on the same model
            and input);
          - BatchNorm running statistics and `num_batches_tracked` after one train-mode forward and
            backward are the plain model's: updated once, not a second time by the forward that
            backward recomputes (`checkpoint`'s `context_fn` gives the recomputation its own context).

The memory model, and the budget search
    The training memory of a model at batch size b is, by definition here
    (`perflab.labs.lab04.measure.memory_model` builds it):
        static       parameters + gradients + optimizer state (`perflab.memory.static_memory`,
                     OPTIMIZER by default: TrainConfig's SGD with momentum)
      + activations  the storages saved for backward by one train-mode forward of b random images
                     and the cross-entropy loss (`perflab.memory.activation_bytes`), each counted once
    It is non-decreasing in b (for ResNet-18 exactly affine: a fixed cost plus a per-sample cost).

    largest_batch(budget_bytes, memory_of, max_batch=MAX_BATCH) -> int
        The largest b in 1..max_batch with memory_of(b) <= budget_bytes, or 0 when memory_of(1)
        already exceeds it. `memory_of` is any non-decreasing function of the batch size (a
        memory model, an allocator's peak). One call may cost a forward pass, or an out-of-memory
        error on a real device, so never call it with a batch size above max(1, 2 x the answer),
        and at most `max_calls(answer)` times: doubling from 1, then bisection, fits both.
        budget_bytes not a positive finite number, or max_batch not an integer >= 1: ValueError.

Gradient accumulation
    accumulate_gradients(model, inputs, targets, micro_batch_size) -> float
        Leave in every trainable parameter's `.grad` the gradient of the MEAN cross-entropy over
        the whole batch (`inputs` (N, ...), integer `targets` (N,)), computed in consecutive
        micro-batches of at most `micro_batch_size` samples, in order (the last one smaller when
        it does not divide N); whatever `.grad` held before is discarded. The model stays in the
        mode it is in. Returns the mean loss over the whole batch as a float. micro_batch_size not
        an integer >= 1: ValueError. A BatchNorm model in train mode normalises each micro-batch by
        its own statistics, so its gradient is not the large batch's: the checks use models
        without BatchNorm, or with it in eval mode.

Which stages to checkpoint: the decision
    The budget: ACTIVATION_BUDGET_SHARE (64%) of the activations the plain ResNet-18 saves in one
    training step at the lab's sizes (`sizes(mode).batch_size` images of `memory_image_size` px), in
    bytes `lab04_measure.activation_budget(mode)`: more than checkpointing every stage keeps, less than
    no checkpointing keeps. The cost of checkpointing a stage is one more forward pass of it in
    backward: its forward FLOPs (`lab04_measure.stage_forward_flops`), counted, not timed.
    CHECKPOINT_CHOICE: tuple[str, ...]
        The stages of STAGES to checkpoint (possibly none), decided from the notebook's own table of
        what each stage saves alone and what it costs: the step's activations must fit the budget
        first, at the least recomputation second. The grader measures the activations of the chosen
        stages with its own correct checkpointing at the graded workload, and counts their cost:
        full marks where it fits and costs at most CHOICE_COST_RTOL (5%) more than the cheapest
        choice that fits; COSTLIER_FIT_SHARE (half) where it fits at a higher cost; nothing where it
        does not fit, or where it is not a tuple or list of stage names (`choice_problems`).

The graded cost
    `export_candidate` writes the student's `checkpoint_stages` into a module that follows the
    `perflab.verify` contract; the grader re-measures a training step with GRADED_STAGES
    checkpointed against the plain baseline, in a fresh interpreter. Checkpointing is expected to
    be SLOWER: the speedup (baseline time / candidate time, below 1) must stay above the bar
    `load_expectation(EXPECTATION)` gives, calibrated on the grading hardware from the reference
    (the grader's `calibration_pair`), or without calibration the conservative cost rule (COST_FLOOR).
    PREDICT_COST, WHY_COST (PREDICTIONS): written before the cost is measured, the expected speedup
    (a positive number) and one line of why; graded on being there, never on being right
    (`perflab.labs.predict`).

This module holds what the notebook, its tests and the grader share: the sizes of each mode, the
baseline, the lab's constants (`STAGES`, `GRADED_STAGES`, `MAX_BATCH`, `max_calls`,
`ACTIVATION_BUDGET_SHARE`, `choice_problems`), the models the
notebook and the checks use (`plain_cnn`, `resnet18`), the graded re-measurement
(`export_candidate`, `candidate_source`, `checkpointed_step`, `verify_checkpoint`,
`with_saving_checked`, `reference_activation_bytes`: the verify child and the grader import them
from here), and `PROBES`, what the grader reads from a notebook.

Elsewhere, each importing this module and never imported by it: the memory model and the notebook's
measurements in `perflab.labs.lab04.measure`; the observation programs, cases and traces in
`perflab.labs.lab04.checks`; the judges, references and tolerances, and the pair calibration times
(`calibration_pair`), in the grader-only `perflab/labs/lab04/judges/`.
"""

from __future__ import annotations

import ast
import inspect
import json
import linecache
import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from perflab import env, memory, workload
from perflab.labs import homework
from perflab.workload import TrainConfig

# What the core (env, grading, the report, the demo) knows of this lab: data, read by
# perflab.labs.registry without importing this module (perflab.labs.manifest says what each field holds).
MANIFEST = {
    "lab": "lab04_memory",
    "title": "Lab 4 — Trade compute for memory",
    "workloads": {"grade": {"cuda": ("full", 224, 128)}, "laptop": {"cuda": ("small", 128, 64)}},
    "fed": True,
    "bars": "graded_bars",
    "graded_changes": ("checkpoint",),
    "report_sections": ("speedups", "memory"),
    "hints": ("checkpointing",),
}
LAB = MANIFEST["lab"]
# The entry of autograder/expectations/<hardware_class>.json that holds this lab's bar. Its name
# starts with "checkpoint" so that, uncalibrated, perflab.verify applies its rule for known costs.
EXPECTATION = "checkpoint_stages"
STAGES = workload.RESNET_STAGES
# What the graded candidate checkpoints: every stage, the configuration the grader's `calibration_pair`
# times (perflab/labs/lab04/judges/).
GRADED_STAGES = STAGES
# The optimizer of the memory model: TrainConfig's default "sgd" keeps one momentum buffer.
OPTIMIZER = "sgd-momentum"
# ResNet-18 leaves a 32-pixel image 1x1 in its last stage, where BatchNorm in train mode cannot
# normalise a batch of one (a single value per channel): the memory model needs 64 px or more.
MIN_MEMORY_IMAGE_SIZE = 64
# Upper end of the budget search when the caller gives none.
MAX_BATCH = 4096
# The activation budget the checkpointing decision must fit, as a share of what the plain step saves at
# the lab's sizes (`lab04_measure.activation_budget`): checkpointing nothing does not fit, every stage
# fits, and a proper subset fits for less. What each stage saves is nearly the same share of the plain
# activations at every batch and image size the modes use, so the decision is the same on every machine
# (the grader's side says why this value; tests/test_lab04.py holds it at each mode's sizes).
ACTIVATION_BUDGET_SHARE = 0.64
# What this lab can promise on each device kind (printed by common.hardware_statement).
HARDWARE_NOTES = {
    "cuda": "memory is counted two ways: tensors saved for backward (the lab's memory model) and the CUDA "
            "caching allocator's real peak over a training step; checkpointing costs GPU time.",
    "mps": "memory is counted as tensors saved for backward (the lab's memory model); the MPS allocator "
           "has no exact peak counter, so no device peaks are drawn.",
    "cpu": "memory is counted as tensors saved for backward (the lab's memory model), what a GPU would "
           "hold too; checkpointing's recomputation costs CPU time as it would cost GPU time.",
}


def max_calls(answer: int) -> int:
    """Calls `largest_batch` may make when the answer is `answer`: doubling from 1, then bisection."""
    return 2 * math.ceil(math.log2(max(answer, 1) + 1)) + 2


def _kind(value: Any) -> str:
    """The type name of a value, or of the one a probe sent as {"type": name}."""
    if isinstance(value, dict) and set(value) == {"type"} and isinstance(value["type"], str):
        return value["type"]
    return type(value).__name__


def choice_problems(choice: Any) -> list[str]:
    """What is wrong with CHECKPOINT_CHOICE as a tuple (or list) of distinct names of STAGES; [] if nothing.
    Also reads the grader's copy of it (a probe sends another type as {"type": its name})."""
    if isinstance(choice, str):
        return [f"CHECKPOINT_CHOICE is the string {choice!r}, not a tuple of stage names (one stage is "
                f"written ({choice!r},), with the comma)"]
    if not isinstance(choice, (list, tuple)):
        what = "None" if choice is None else f"of type {_kind(choice)}"
        return [f"CHECKPOINT_CHOICE is {what}, not a tuple of stage names from {', '.join(STAGES)} "
                "(() to checkpoint none)"]
    for name in choice:
        if not isinstance(name, str) or name not in STAGES:
            shown = repr(name) if isinstance(name, str) else f"a value of type {_kind(name)}"
            return [f"CHECKPOINT_CHOICE: {shown} is not a ResNet-18 stage ({', '.join(STAGES)})"]
    twice = sorted({name for name in choice if list(choice).count(name) > 1})
    if twice:
        return [f"CHECKPOINT_CHOICE names {', '.join(twice)} more than once"]
    return []


# ---------------------------------------------------------------------------------------------
# Sizes of each mode, and the baseline


@dataclass(frozen=True)
class LabSizes:
    """What one mode runs: the workload, the batch sizes swept, the budget, the timing and its budget."""

    mode: str
    data: str
    image_size: int
    batch_size: int
    memory_image_size: int  # image side of the memory sweep (at least MIN_MEMORY_IMAGE_SIZE)
    batches: tuple[int, ...]  # batch sizes of the memory sweep
    budget_batch: int  # the budget is the plain model's training memory at this batch size
    compare_blocks: int
    verify_max_pairs: int | None  # None: the protocol's own budget
    verify_seconds: float | None


_LAB_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(memory_image_size=64, batches=(1, 2, 4, 8, 16, 32), budget_batch=16, compare_blocks=4, verify_max_pairs=12,
                 verify_seconds=30.0),
    "laptop": dict(memory_image_size=64, batches=(1, 2, 4, 8, 16, 32, 64, 128), budget_batch=64, compare_blocks=8,
                   verify_max_pairs=None, verify_seconds=None),
    "grade": dict(memory_image_size=64, batches=(1, 2, 4, 8, 16, 32), budget_batch=16, compare_blocks=4, verify_max_pairs=None,
                  verify_seconds=None),
    "full": dict(memory_image_size=224, batches=(8, 16, 32, 64, 128, 256), budget_batch=128, compare_blocks=10,
                 verify_max_pairs=None, verify_seconds=None),
}


# The notebook's own timing budgets in the grading kernel: the smallest that still runs its code.
GRADING_BUDGET = dict(compare_blocks=2)


def sizes(mode: str | None = None) -> LabSizes:
    """The lab's sizes in `mode` (default: the mode in force), built on `perflab.env.mode_sizes`."""
    base = env.mode_sizes(mode, lab=LAB)
    s = LabSizes(base.mode, base.data, base.image_size, base.batch_size, **_LAB_SIZES[base.mode])
    # Called with no mode, in a notebook: the grading kernel runs the notebook's own timing at
    # GRADING_BUDGET (the grade reads the grader's re-measurements and the home run's record).
    return s if mode is not None else homework.smallest(s, replayed=None, **GRADING_BUDGET)


def graded_bars(mode: str) -> list[tuple[str, TrainConfig]]:
    """This lab's cell re-measured against a calibrated bar: (its entry, its baseline at `mode`)."""
    return [(EXPECTATION, baseline_config(mode))]


def baseline_config(mode: str | None = None) -> TrainConfig:
    """The plain training run this lab measures and the grader times, on the best device here."""
    s = sizes(mode)
    config = TrainConfig(data=s.data, batch_size=s.batch_size, image_size=s.image_size,
                         device=str(env.pick_device()), **env.baseline_loader(LAB, mode=s.mode))
    return workload.require_stages(LAB, config)  # the lesson checkpoints ResNet's stages


# ---------------------------------------------------------------------------------------------
# Models the notebook uses


def plain_cnn(width: int = 8, num_classes: int = 5, seed: int = 0) -> nn.Module:
    """A small CNN without BatchNorm: its accumulated gradient equals the large batch's exactly."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
                             nn.Conv2d(width, width, 3, stride=2, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4 * width, num_classes))


def resnet18(num_classes: int = 10, seed: int = 0) -> nn.Module:
    """torchvision's ResNet-18, randomly initialised from `seed`, on the CPU (the checks' model, whatever the course's)."""
    return workload.build_model(TrainConfig(model="resnet18", seed=seed, device="cpu"), num_classes)


# ---------------------------------------------------------------------------------------------
# The graded cost: export, re-measure, report

CANDIDATE_HEADER = '''"""Candidate exported from lab04_memory: the student's checkpoint_stages, timed by perflab.verify."""
import contextlib
import copy
import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from perflab.counting import restoring_buffers
'''


def source_of(obj: Any) -> str:
    """The source of a function or class, also for a class defined in a notebook cell (where
    `inspect.getsource` fails before Python 3.13): found through its methods' cell file."""
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        if not inspect.isclass(obj):
            raise
    files = {f.__code__.co_filename for f in vars(obj).values() if inspect.isfunction(f)}
    for filename in files:
        text = "".join(linecache.getlines(filename))
        if not text:
            continue
        found = [node for node in ast.walk(ast.parse(text))
                 if isinstance(node, ast.ClassDef) and node.name == obj.__name__]
        if found:
            node = found[-1]
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = text.splitlines(keepends=True)[start - 1: node.end_lineno]
            return textwrap.dedent("".join(lines))
    raise ValueError(f"cannot find the source of class {obj.__name__}: define it in a notebook cell "
                     "and run that cell before exporting")


def export_candidate(path: str | Path, checkpoint_stages: Callable[..., nn.Module], *helpers: Any,
                     config: TrainConfig, stages: Sequence[str] = GRADED_STAGES) -> Path:
    """Write `checkpoint_stages` (and the functions and classes it uses) into a module that follows the
    `perflab.verify` contract: its `make_step(seed)` trains `config` with `stages` checkpointed.

    The module starts with CANDIDATE_HEADER's imports; anything else the code uses must be passed
    in `helpers`.
    """
    for name in stages:
        if name not in STAGES:
            raise ValueError(f"stages: {name!r} is not a ResNet-18 stage ({', '.join(STAGES)})")
    parts = [source_of(obj) for obj in (*helpers, checkpoint_stages)]
    if checkpoint_stages.__name__ != "checkpoint_stages":
        parts.append(f"checkpoint_stages = {checkpoint_stages.__name__}\n")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(candidate_source("\n\n".join(parts), config, stages), encoding="utf-8")
    return path


def checkpointed_step(seed: int, config: dict[str, Any], checkpoint_stages: Callable[..., nn.Module],
                      stages: Sequence[str]) -> Callable[[], tuple[float, list[int]]]:
    """The verify contract's step: perflab's training loop on `config`, the model's `stages`
    checkpointed by the given function (in place: the optimizer keeps the same parameters)."""
    from perflab.verify import CandidateError

    cfg = TrainConfig.from_dict(config).replace(seed=seed)
    work = workload.build(cfg)
    params = list(work.model.parameters())
    model = checkpoint_stages(work.model, tuple(stages))
    if not isinstance(model, nn.Module) or [id(p) for p in model.parameters()] != [id(p) for p in params]:
        raise CandidateError("checkpoint_stages must return the model it was given, its parameters unchanged")
    work.model = work.train_model = model

    def step() -> tuple[float, list[int]]:
        return workload.train_step(work)

    step.work = work  # type: ignore[attr-defined]
    return step


def verify_checkpoint(candidate: str | Path, claim: float | None = None, mode: str | None = None) -> tuple[Any, Any]:
    """Re-measure the exported candidate against the plain baseline in a fresh interpreter: its time
    held to the bar of this hardware, and the activation memory its training step saves held to what
    checkpointing buys (`with_saving_checked`). Returns (verdict, expectation)."""
    from perflab.labs.common import verify_against_bar
    from perflab.verify import Side

    s = sizes(mode)
    config = baseline_config(mode)
    verdict, expectation = verify_against_bar(config, Side.module(candidate, label="checkpoint_stages"), EXPECTATION,
                                              claim=claim, max_pairs=s.verify_max_pairs, max_seconds=s.verify_seconds,
                                              measure_activations=True)
    return with_saving_checked(verdict, config), expectation


# What checkpointing buys, re-measured beside its time cost: the candidate's training step (the
# workload itself, at the graded size) must save at least this share of the activation memory that
# perflab's own checkpointing of GRADED_STAGES saves, the same rule as the hidden checkpoint check.
MIN_WORKLOAD_SAVING_SHARE = 0.8


def reference_activation_bytes(config: TrainConfig) -> int:
    """Activation bytes one training step of `config` saves for backward with perflab's own
    checkpointing of every stage, measured here (`perflab.verify.saved`, as the verify child does)."""
    from perflab.verify import Side, candidates
    from perflab.verify.saved import SavedBytes, bind

    side = Side.from_config(config.replace(checkpoint_stages=len(GRADED_STAGES)))
    step = candidates.load_factory(side)(config.seed, **side.kwargs)
    step()  # the first step builds what is lazily built (optimizer state), like the child's first gate step
    with SavedBytes(bind()) as seen:
        step()
    return seen.bytes


def activation_saving(verdict: Any) -> tuple[int, int] | None:
    """(plain, candidate) activation bytes of one training step, re-measured by the verification, or None."""
    seen = (getattr(verdict, "details", None) or {}).get("activation_bytes")
    if not isinstance(seen, dict) or not all(isinstance(seen.get(k), int) for k in ("baseline", "candidate")):
        return None
    return seen["baseline"], seen["candidate"]


def device_peak(verdict: Any) -> tuple[int, int] | None:
    """(plain, candidate) CUDA allocator peak of one training step above what it began with, re-measured
    by the verification on a CUDA device, or None (no CUDA device, or no memory measured)."""
    seen = (getattr(verdict, "details", None) or {}).get("cuda_peak_bytes")
    if not isinstance(seen, dict) or not all(isinstance(seen.get(k), int) for k in ("baseline", "candidate")):
        return None
    return seen["baseline"], seen["candidate"]


def saving_line(verdict: Any) -> str | None:
    """What the verification re-measured of the memory one training step needs (activations saved for
    backward; on CUDA also the allocator's peak), or None when it measured none."""
    seen = activation_saving(verdict)
    if seen is None:
        return None
    plain, got = seen
    line = (f"activation memory of one training step, re-measured: {memory.format_bytes(plain)} plain, "
            f"{memory.format_bytes(got)} checkpointed ({(got - plain) / max(plain, 1):+.1%})")
    peak = device_peak(verdict)
    if peak is not None:
        line += (f"; CUDA allocator peak of the step: {memory.format_bytes(peak[0])} plain, "
                 f"{memory.format_bytes(peak[1])} checkpointed ({(peak[1] - peak[0]) / max(peak[0], 1):+.1%})")
    return line


def with_saving_checked(verdict: Any, config: TrainConfig) -> Any:
    """`verdict`, failed with code "no_saving" when its re-measured training step does not save at least
    MIN_WORKLOAD_SAVING_SHARE of what perflab's checkpoint of every stage saves on `config` (a check
    that saves nothing has no cost worth grading). Unchanged when no memory was measured."""
    import dataclasses

    seen = activation_saving(verdict)
    if seen is None or verdict.outcome in ("error", "deferred"):
        return verdict
    plain, got = seen
    reference = reference_activation_bytes(config)
    want = plain - reference
    if plain - got >= MIN_WORKLOAD_SAVING_SHARE * want:
        return verdict
    reason = (f"the checkpointed training step keeps {memory.format_bytes(got)} of activations for backward "
              f"against {memory.format_bytes(plain)} plain ({(got - plain) / max(plain, 1):+.1%}); checkpointing "
              f"every stage keeps {memory.format_bytes(reference)} ({(reference - plain) / max(plain, 1):+.1%}), and "
              f"at least {MIN_WORKLOAD_SAVING_SHARE:.0%} of that reduction is required")
    return dataclasses.replace(verdict, outcome="fail", code="no_saving", reason=reason)


def accepted(outcome: str) -> bool:
    """Whether a verification outcome earns the cell's points under the instructor's policy
    (the same policy, PERFLAB_INCONCLUSIVE, as every lab)."""
    from perflab.labs.common import accepted as policy

    return policy(outcome)


def report(verdict: Any, expectation: Any) -> dict[str, Any]:
    """Show the verdict's record to the autograder (and the student), with the re-measured activation
    memory, and return it."""
    from perflab.labs.common import report as show

    line = saving_line(verdict)
    if line:
        print(line)
    return show(verdict, expectation)


def candidate_source(source: str, config: TrainConfig, stages: Sequence[str] = GRADED_STAGES) -> str:
    """A `perflab.verify` candidate module from the source of checkpoint_stages (and what it uses)."""
    return (f"{CANDIDATE_HEADER}\n\n{source}\n\n\nCONFIG = {json.dumps(config.to_dict())!r}\nSTAGES = {tuple(stages)!r}\n\n\n"
            "def make_step(seed):\n"
            "    import json as _json\n\n"
            "    from perflab.labs import lab04 as _lab04\n\n"
            "    return _lab04.checkpointed_step(seed, _json.loads(CONFIG), checkpoint_stages, STAGES)\n")


# The predictions written before a headline measurement, by the key of their graded cell
# (`test_predict_<key>`): the value's name and its one line of why.
PREDICTIONS = {"cost": ("PREDICT_COST", "WHY_COST")}
