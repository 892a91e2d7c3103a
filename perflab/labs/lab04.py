"""Lab 4 — Trade compute for memory: the contract between the notebook, its tests and the grader.

The student writes three functions in `labs/lab04_memory/lab04_memory.ipynb`. What is asked and
what is checked are stated once, here; the visible tests are in the notebook. When graded, each
function's source (with what of the notebook it uses) is run by the grader in a fresh sandboxed
process on inputs drawn from its seed (`observe_*` below print what the function did), and the
judges of `perflab/labs/hidden/lab04.py` (grader-only, with the tolerances named below) compare
that with their reference.

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
    The training memory of a model at batch size b is, by definition here (`memory_model` builds it):
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

The graded cost
    `export_candidate` writes the student's `checkpoint_stages` into a module that follows the
    `perflab.verify` contract; the grader re-measures a training step with GRADED_STAGES
    checkpointed against the plain baseline, in a fresh interpreter. Checkpointing is expected to
    be SLOWER: the speedup (baseline time / candidate time, below 1) must stay above the bar
    `load_expectation(EXPECTATION)` gives, calibrated on the grading hardware from the reference
    (`calibration_pair`), or without calibration the conservative cost rule (COST_FLOOR).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import inspect
import json
import linecache
import math
import textwrap
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from perflab import env, memory, workload
from perflab.counting import restoring_buffers
from perflab.workload import TrainConfig

LAB = "lab04_memory"
# The entry of autograder/expectations/<hardware_class>.json that holds this lab's bar. Its name
# starts with "checkpoint" so that, uncalibrated, perflab.verify applies its rule for known costs.
EXPECTATION = "checkpoint_stages"
STAGES = workload.RESNET_STAGES
# What the graded candidate checkpoints: every stage, the configuration `calibration_pair` times.
GRADED_STAGES = STAGES
# The optimizer of the memory model: TrainConfig's default "sgd" keeps one momentum buffer.
OPTIMIZER = "sgd-momentum"
# ResNet-18 leaves a 32-pixel image 1x1 in its last stage, where BatchNorm in train mode cannot
# normalise a batch of one (a single value per channel): the memory model needs 64 px or more.
MIN_MEMORY_IMAGE_SIZE = 64
# Upper end of the budget search when the caller gives none.
MAX_BATCH = 4096
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


def sizes(mode: str | None = None) -> LabSizes:
    """The lab's sizes in `mode` (default: the mode in force), built on `perflab.env.mode_sizes`."""
    base = env.mode_sizes(mode, lab=LAB)
    return LabSizes(base.mode, base.data, base.image_size, base.batch_size, **_LAB_SIZES[base.mode])


def baseline_config(mode: str | None = None) -> TrainConfig:
    """The plain training run this lab measures and the grader times, on the best device here."""
    s = sizes(mode)
    return TrainConfig(data=s.data, batch_size=s.batch_size, image_size=s.image_size,
                       device=str(env.pick_device()))


def calibration_pair(mode: str = "grade") -> tuple[TrainConfig, TrainConfig]:
    """(baseline, candidate) that `perflab calibrate` times for EXPECTATION: perflab's own
    checkpointing of every stage (`TrainConfig.checkpoint_segments`) against the plain run."""
    base = baseline_config(mode)
    return base, base.replace(checkpoint_segments=len(GRADED_STAGES))


# ---------------------------------------------------------------------------------------------
# The memory model


def cross_entropy_on(labels: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The loss the memory model includes: mean cross-entropy of the logits against `labels`."""
    return lambda logits: F.cross_entropy(logits, labels)


class MemoryModel:
    """Training memory of `model` at a batch size, as the contract defines it; memoised per batch size.

    `model(b)` is static + activations; `activations(b)` the saved-tensor bytes alone; `calls` counts
    measurements actually run (a batch size measured once is remembered).
    """

    def __init__(self, model: nn.Module, image_size: int, optimizer: str = OPTIMIZER,
                 in_channels: int = 3) -> None:
        if image_size < 1:
            raise ValueError(f"image_size: must be a positive number of pixels, got {image_size}")
        self.model = model
        self.image_size = image_size
        self.in_channels = in_channels
        self.static = memory.static_memory(model, optimizer)
        self.device = next(model.parameters()).device
        self._cache: dict[int, int] = {}
        self.calls = 0

    @property
    def static_bytes(self) -> int:
        return self.static.total

    def activations(self, batch_size: int) -> int:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size: must be an integer >= 1, got {batch_size!r}")
        b = int(batch_size)
        if b not in self._cache:
            self.calls += 1
            gen = torch.Generator().manual_seed(b)
            x = torch.randn(b, self.in_channels, self.image_size, self.image_size, generator=gen).to(self.device)
            labels = torch.zeros(b, dtype=torch.long, device=self.device)
            was_training = self.model.training
            try:
                self.model.train()
                with _quiet():
                    self._cache[b] = memory.activation_bytes(self.model, x, cross_entropy_on(labels)).bytes
            except ValueError as exc:
                if "value per channel" not in str(exc):
                    raise
                raise ValueError(f"batch_size: {b} images of {self.image_size} px leave BatchNorm one value per "
                                 f"channel in train mode; measure with images of at least "
                                 f"{MIN_MEMORY_IMAGE_SIZE} px") from None
            finally:
                self.model.train(was_training)
        return self._cache[b]

    def __call__(self, batch_size: int) -> int:
        return self.static_bytes + self.activations(batch_size)


def memory_model(model: nn.Module, image_size: int, optimizer: str = OPTIMIZER) -> MemoryModel:
    """The contract's training memory of `model` on square RGB images of `image_size` pixels."""
    return MemoryModel(model, image_size, optimizer)


def fit_line(batches: Sequence[int], values: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of `values` against `batches`: fixed bytes and bytes per sample."""
    if len(batches) < 2 or len(batches) != len(values):
        raise ValueError(f"batches/values: need two or more pairs, got {len(batches)} and {len(values)}")
    slope, intercept = np.polyfit(np.asarray(batches, float), np.asarray(values, float), 1)
    return float(intercept), float(slope)


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
    """torchvision's ResNet-18, randomly initialised from `seed`, on the CPU."""
    return workload.build_model(TrainConfig(seed=seed, device="cpu"), num_classes)


# ---------------------------------------------------------------------------------------------
# Helpers of the visible cells (the hidden checks in perflab/labs/hidden/lab04.py use them too)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Library warnings in a check must not reach stderr (nbgrader scores a cell that writes stderr 0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _full_batch_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list[torch.Tensor | None]]:
    """Mean cross-entropy over the whole batch in one pass, and the gradients it leaves (cloned)."""
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return float(loss.detach()), [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def batchnorm_gap(accumulate_gradients: Callable[..., float], model: nn.Module, x: torch.Tensor,
                  y: torch.Tensor, micro_batch_size: int) -> float:
    """Largest relative gap between accumulated and large-batch gradients of `model` in its current mode."""
    ref = copy.deepcopy(model)
    with restoring_buffers(ref):
        _, want = _full_batch_grads(ref, x, y)
    acc = copy.deepcopy(model)
    with restoring_buffers(acc), _quiet():
        accumulate_gradients(acc, x, y, micro_batch_size)
    gaps = [float((p.grad - w).abs().max() / w.abs().max().clamp_min(1e-12))
            for p, w in zip(acc.parameters(), want, strict=True) if w is not None and p.grad is not None]
    return max(gaps)


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

    side = Side.from_config(config.replace(checkpoint_segments=len(GRADED_STAGES)))
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


def saving_line(verdict: Any) -> str | None:
    """One line on the re-measured activation memory, or None when the verification measured none."""
    seen = activation_saving(verdict)
    if seen is None:
        return None
    plain, got = seen
    return (f"activation memory of one training step, re-measured: {memory.format_bytes(plain)} plain, "
            f"{memory.format_bytes(got)} checkpointed ({(got - plain) / max(plain, 1):+.1%})")


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


# ---------------------------------------------------------------------------------------------
# What the grader observes. Each function cell is judged from what the student's function does on
# inputs drawn from the grader's seed, in a fresh sandboxed process the notebook's kernel cannot
# reach: the probe below exports the function's source (`probing.export_source`), the grader runs it
# in a program that calls `observe(...)`, and compares the numbers it prints with its own reference
# (perflab/labs/hidden/lab04.py). Nothing here decides anything.

NUM_PROJECTIONS = 2  # random directions each gradient or buffer is projected on


class StagedNet(nn.Module):
    """A small CNN with named stages and BatchNorm, so the checks do not only see ResNet-18."""

    def __init__(self, width: int = 8, num_classes: int = 5) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        self.block1 = nn.Sequential(nn.Conv2d(w, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                                    nn.Conv2d(w, 2 * w, 3, stride=2, padding=1, bias=False),
                                    nn.BatchNorm2d(2 * w), nn.ReLU())
        self.block2 = nn.Sequential(nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * w, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block2(self.block1(self.stem(x))))


STAGED_NET_STAGES = ("stem", "block1", "block2", "head")


def warm_bn(model: nn.Module, x: torch.Tensor) -> None:
    """Give BatchNorm running statistics that are not the initial 0/1, so eval mode tests something."""
    was = model.training
    model.train()
    with torch.no_grad():
        model(x * 1.7 + 0.3)
    model.train(was)


@dataclass(frozen=True)
class CheckpointCase:
    """One model, input and stage choice the checkpoint checks run on."""

    name: str
    model: nn.Module
    stages: tuple[str, ...]
    x: torch.Tensor
    y: torch.Tensor


def visible_checkpoint_case() -> CheckpointCase:
    """The notebook's visible test: ResNet-18 (10 classes), 4 images of 32 px, every stage."""
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 32, 32, generator=gen), torch.randint(0, 10, (4,), generator=gen)
    return CheckpointCase("resnet18(num_classes=10) on 4x3x32x32, every stage", resnet18(10, seed=1), STAGES, x, y)


def checkpoint_cases(seed: int = 0, cases: int = 2) -> list[CheckpointCase]:
    """ResNet-18 (random classes, image size, batch, stages) and StagedNet (its first stage included)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(cases):
        gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
        if i % 2 == 0:
            classes, side, n = int(rng.integers(2, 20)), int(rng.choice([32, 40])), int(rng.integers(2, 4))
            model = resnet18(classes, seed=int(rng.integers(1000)))
            pick = rng.random(len(STAGES)) < 0.6
            if not pick.any():
                pick[int(rng.integers(len(STAGES)))] = True
            stages = tuple(s for s, p in zip(STAGES, pick, strict=True) if p)
            name = f"resnet18(num_classes={classes}) on {n}x3x{side}x{side}, stages {stages}"
        else:
            classes, side, n = int(rng.integers(2, 9)), int(rng.choice([8, 12, 16])), int(rng.integers(2, 6))
            width = int(rng.choice([4, 8, 12]))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(rng.integers(1000)))
                model = StagedNet(width, classes)
            stages = ("stem",) + tuple(s for s in STAGED_NET_STAGES[1:] if rng.random() < 0.5)
            name = f"StagedNet(width={width}) on {n}x3x{side}x{side}, stages {stages}"
        x = torch.randn(n, 3, side, side, generator=gen)
        y = torch.randint(0, classes, (n,), generator=gen)
        warm_bn(model, x)
        out.append(CheckpointCase(name, model, stages, x, y))
    return out


def projections(tensors: Sequence[torch.Tensor | None]) -> list[list[float] | None]:
    """Each tensor as [norm, largest |entry|, and its dot products with NUM_PROJECTIONS fixed random
    directions] (None stays None): enough to tell a wrong gradient from a right one, in a few numbers."""
    out: list[list[float] | None] = []
    for i, t in enumerate(tensors):
        if t is None:
            out.append(None)
            continue
        flat = t.detach().double().reshape(-1).cpu()
        gen = torch.Generator().manual_seed(10_007 * (i + 1))
        dirs = torch.randn(NUM_PROJECTIONS, flat.numel(), generator=gen, dtype=torch.float64)
        out.append([float(flat.norm()), float(flat.abs().max()) if flat.numel() else 0.0, *map(float, dirs @ flat)])
    return out


def bn_state(model: nn.Module) -> tuple[list[torch.Tensor], list[int]]:
    """BatchNorm running statistics (float buffers) and num_batches_tracked values of `model`."""
    floats, counts = [], []
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            floats += [m.running_mean.detach().clone(), m.running_var.detach().clone()]
            counts.append(int(m.num_batches_tracked))
    return floats, counts


def train_step_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """One train-mode forward and backward from cleared gradients: (outputs, gradients)."""
    model.train()
    model.zero_grad(set_to_none=True)
    with _quiet():
        out = model(x)
        F.cross_entropy(out, y).backward()
    return out.detach(), [p.grad for p in model.parameters()]


def trace_checkpoint(model: nn.Module, case: CheckpointCase) -> dict[str, Any]:
    """What a (checkpointed or plain) copy of the case's model does, in a fixed order: eval outputs,
    saved activation bytes, then two training steps (outputs and gradients of the first, BatchNorm
    state after each). The grader runs the same sequence on the plain model."""
    from perflab.grading.probing import encode

    model.eval()
    with torch.no_grad(), _quiet():
        eval_out = model(case.x)
    with _quiet():
        saved = memory.activation_bytes(model.train(), case.x, cross_entropy_on(case.y)).bytes
    train_out, grads = train_step_of(model, case.x, case.y)
    bn: list[dict[str, Any]] = []
    for step in range(2):
        if step:
            train_step_of(model, case.x, case.y)
        floats, counts = bn_state(model)
        bn.append({"running": projections(floats), "counts": counts})
    return {"eval_out": encode(eval_out), "saved": int(saved), "train_out": encode(train_out),
            "grads": projections(grads), "bn": bn}


def _raised(exc: BaseException) -> dict[str, Any]:
    return {"raised": type(exc).__name__, "message": str(exc)[:400]}


def observe_checkpoint(checkpoint_stages: Callable[..., nn.Module], seed: int) -> dict[str, Any]:
    """The student's checkpoint_stages on the visible case and on the hidden cases of `seed`."""
    def one(case: CheckpointCase) -> dict[str, Any]:
        model = copy.deepcopy(case.model)
        before = [id(p) for p in model.parameters()]
        try:
            with _quiet():
                got = checkpoint_stages(model, case.stages)
            if not isinstance(got, nn.Module):
                return {"returned": type(got).__name__}
            in_place = [id(p) for p in got.parameters()] == before
            return {"in_place": in_place, **trace_checkpoint(got, case)}
        except Exception as exc:
            return _raised(exc)

    return {"visible": one(visible_checkpoint_case()), "hidden": [one(c) for c in checkpoint_cases(seed)]}


# The budget search: memory functions described as data, so the grader builds the same ones.

def memory_function(desc: Mapping[str, Any]) -> Callable[[int], float]:
    """A non-decreasing memory function from its description (see `largest_batch_cases`)."""
    kind = desc["kind"]
    if kind == "affine":
        a, c = float(desc["a"]), float(desc["c"])
        return lambda b: a + c * b
    if kind == "steps":
        a, c, block = float(desc["a"]), float(desc["c"]), float(desc["block"])
        return lambda b: math.ceil((a + c * b) / block) * block
    if kind == "table":
        values = np.cumsum(np.random.default_rng(int(desc["seed"])).exponential(1e5, size=int(desc["length"]))
                           * (np.random.default_rng(int(desc["seed"]) + 1).random(int(desc["length"])) < 0.6)) + 1e6
        return lambda b: float(values[b - 1])
    if kind in ("resnet18", "resnet18-checkpointed"):
        return _resnet_memory(int(desc["classes"]), int(desc["model_seed"]), kind.endswith("checkpointed"))
    raise ValueError(f"unknown memory function kind {kind!r}")


_RESNET_MEMORY: dict[tuple[int, int, bool], MemoryModel] = {}


def _resnet_memory(classes: int, seed: int, checkpointed: bool) -> MemoryModel:
    key = (classes, seed, checkpointed)
    if key not in _RESNET_MEMORY:
        model = resnet18(classes, seed=seed)
        if checkpointed:
            for name in STAGES:
                setattr(model, name, workload.CheckpointedStage(getattr(model, name)))
        _RESNET_MEMORY[key] = memory_model(model, MIN_MEMORY_IMAGE_SIZE)
    return _RESNET_MEMORY[key]


def visible_largest_batch_cases() -> list[dict[str, Any]]:
    """The notebook's visible test: a straight line, nothing fits, everything fits, allocator steps."""
    line = {"kind": "affine", "a": 1000.0, "c": 10.0}
    steps = {"kind": "steps", "a": 3e6, "c": 1e5, "block": float(2**20)}
    return [{"fn": line, "budget": 1370.0, "max_batch": MAX_BATCH}, {"fn": line, "budget": 1005.0, "max_batch": MAX_BATCH},
            {"fn": line, "budget": 1e9, "max_batch": 100},
            {"fn": steps, "budget": float(2**20 * math.ceil((3e6 + 1e5 * 50) / 2**20)), "max_batch": MAX_BATCH}]


def largest_batch_cases(seed: int, cases: int = 24) -> list[dict[str, Any]]:
    """Random non-decreasing memory functions (affine, allocator-like steps, plateaus) and budgets below,
    between, on and above their values."""
    rng = np.random.default_rng(seed)
    out = []
    for case in range(cases):
        max_batch = int(rng.choice([1, int(rng.integers(2, 64)), int(rng.integers(64, 5000))]))
        kind = case % 3
        a, c = float(rng.uniform(1e6, 1e9)), float(rng.uniform(1e3, 1e7))
        if kind == 0:
            desc: dict[str, Any] = {"kind": "affine", "a": a, "c": c}
        elif kind == 1:
            desc = {"kind": "steps", "a": a, "c": c, "block": float(2 ** int(rng.integers(20, 23)))}
        else:
            desc = {"kind": "table", "seed": int(rng.integers(1 << 30)), "length": max_batch}
        fn = memory_function(desc)
        first, last = fn(1), fn(max_batch)
        where = rng.random()
        if where < 0.1:
            budget = float(first * rng.uniform(0.5, 0.99))  # nothing fits
        elif where < 0.2:
            budget = float(last * rng.uniform(1.0, 2.0))  # everything fits
        else:
            budget = float(fn(int(rng.integers(1, max_batch + 1))))  # exactly on a value
            if rng.random() < 0.5:
                budget += float(rng.uniform(0, 1)) * 1e3
        out.append({"fn": desc, "budget": budget, "max_batch": max_batch})
    return out


def model_budget_cases(seed: int, budgets: int = 3) -> list[dict[str, Any]]:
    """Hidden budgets on the memory model of ResNet-18 at MIN_MEMORY_IMAGE_SIZE, plain and checkpointed."""
    rng = np.random.default_rng(seed)
    classes, model_seed = int(rng.integers(2, 20)), int(rng.integers(1000))
    out = []
    for i in range(budgets):
        desc = {"kind": "resnet18" if i % 2 == 0 else "resnet18-checkpointed", "classes": classes,
                "model_seed": model_seed}
        fn = memory_function(desc)
        per_sample = fn(2) - fn(1)
        budget = fn(1) - 1.0 if i == budgets - 1 else fn(int(rng.integers(1, 13))) + float(rng.uniform(0, 1)) * per_sample
        out.append({"fn": desc, "budget": float(budget), "max_batch": int(rng.choice([64, 1024, MAX_BATCH]))})
    return out


LARGEST_BATCH_BAD = ({"budget_bytes": 0}, {"budget_bytes": -5.0}, {"budget_bytes": float("nan")},
                     {"budget_bytes": 1e9, "max_batch": 0})


def observe_largest_batch(largest_batch: Callable[..., int], seed: int) -> dict[str, Any]:
    """The student's answers and the batch sizes it tried, on the visible, hidden and model cases."""
    from perflab.grading.probing import encode

    def one(case: Mapping[str, Any]) -> dict[str, Any]:
        fn = memory_function(case["fn"])
        tried: list[Any] = []

        def memory_of(b: int) -> float:
            tried.append(b if isinstance(b, (int, np.integer)) and not isinstance(b, bool) else repr(b))
            if not isinstance(b, (int, np.integer)) or isinstance(b, bool) or not 1 <= b <= case["max_batch"]:
                raise ValueError(f"memory_of was called with batch size {b!r}, outside 1..max_batch")
            return fn(int(b))

        try:
            with _quiet():
                got = largest_batch(case["budget"], memory_of, max_batch=case["max_batch"])
        except Exception as exc:
            return {**_raised(exc), "tried": encode(tried)}
        return {"value": encode(got), "tried": encode([int(t) if not isinstance(t, str) else t for t in tried])}

    bad = []
    for args in LARGEST_BATCH_BAD:
        kwargs = {"max_batch": args["max_batch"]} if "max_batch" in args else {}
        try:
            with _quiet():
                value = largest_batch(args["budget_bytes"], lambda b: 1.0, **kwargs)
            bad.append({"value": encode(value)})
        except Exception as exc:
            bad.append(_raised(exc))
    return {"visible": [one(c) for c in visible_largest_batch_cases()],
            "hidden": [one(c) for c in largest_batch_cases(seed)],
            "model": [one(c) for c in model_budget_cases(seed + 1)], "bad": bad}


# Gradient accumulation: models and batches described as data.

def visible_accumulate_case() -> dict[str, Any]:
    """The notebook's visible test: a CNN without BatchNorm, 10 samples in micro-batches of 4."""
    return {"model": "cnn", "width": 8, "classes": 5, "model_seed": 3, "side": 8, "n": 10, "micro": 4,
            "data_seed": 3, "train": True}


def accumulate_cases(seed: int, cases: int = 3) -> list[dict[str, Any]]:
    """BN-free CNNs in train mode and ResNet-18 with BatchNorm in eval mode; uneven last micro-batches,
    one sample, the whole batch, more than the batch."""
    rng = np.random.default_rng(seed)
    out = []
    for case in range(cases):
        if case % 2 == 0:
            desc = {"model": "cnn", "width": int(rng.choice([4, 8])), "classes": int(rng.integers(2, 9)),
                    "side": int(rng.choice([8, 12, 16])), "n": int(rng.integers(5, 19)), "train": True}
            smallest = 1
        else:
            desc = {"model": "resnet18", "classes": int(rng.integers(2, 12)), "side": 32,
                    "n": int(rng.integers(5, 11)), "train": False}
            smallest = 2  # ResNet-18 at batch 1 costs time and teaches nothing more
        n = desc["n"]
        desc["model_seed"] = int(rng.integers(1000))
        desc["micro"] = int(rng.choice([smallest, int(rng.integers(2, n)), n, n + int(rng.integers(1, 4))]))
        desc["data_seed"] = int(rng.integers(1 << 30))
        out.append(desc)
    return out


def accumulate_setup(desc: Mapping[str, Any]) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The case's model (in its mode, BatchNorm warmed) and batch."""
    gen = torch.Generator().manual_seed(int(desc["data_seed"]))
    n, side, classes = int(desc["n"]), int(desc["side"]), int(desc["classes"])
    x = torch.randn(n, 3, side, side, generator=gen)
    y = torch.randint(0, classes, (n,), generator=gen)
    if desc["model"] == "cnn":
        model = plain_cnn(int(desc["width"]), classes, seed=int(desc["model_seed"]))
    else:
        model = resnet18(classes, seed=int(desc["model_seed"]))
        warm_bn(model, x)
    model.train(bool(desc["train"]))
    return model, x, y


ACCUMULATE_BAD = (0, -2, 1.5)


def observe_accumulate(accumulate_gradients: Callable[..., float], seed: int) -> dict[str, Any]:
    """The student's loss, gradients, the micro-batches the model saw and its mode after, per case."""
    from perflab.grading.probing import encode

    def one(desc: Mapping[str, Any]) -> dict[str, Any]:
        model, x, y = accumulate_setup(desc)
        mode = model.training
        gen = torch.Generator().manual_seed(int(desc["data_seed"]) + 1)
        for p in model.parameters():  # stale gradients the function must not add to
            p.grad = torch.randn(p.shape, generator=gen)
        seen: list[int] = []
        handle = model.register_forward_pre_hook(lambda m, args: seen.append(int(args[0].shape[0])))
        try:
            with _quiet():
                loss = accumulate_gradients(model, x, y, int(desc["micro"]))
        except Exception as exc:
            return _raised(exc)
        finally:
            handle.remove()
        is_number = isinstance(loss, float) or (torch.is_tensor(loss) and loss.numel() == 1)
        return {"loss": encode(float(loss)) if is_number else {"type": type(loss).__name__}, "seen": seen,
                "mode_kept": model.training == mode, "grads": projections([p.grad for p in model.parameters()])}

    bad = []
    for micro in ACCUMULATE_BAD:
        try:
            with _quiet():
                accumulate_gradients(plain_cnn(), torch.randn(4, 3, 8, 8), torch.zeros(4, dtype=torch.long), micro)
            bad.append({"value": None})
        except Exception as exc:
            bad.append(_raised(exc))
    return {"visible": one(visible_accumulate_case()), "hidden": [one(d) for d in accumulate_cases(seed)], "bad": bad}


# The probes: the functions' sources (run by the grader, see above) and the claimed cost.

OBSERVERS = {"checkpoint_stages": "observe_checkpoint", "largest_batch": "observe_largest_batch",
             "accumulate_gradients": "observe_accumulate"}
# Torch threads of the grader's observations (in its sandbox) and of the references it compares them with
# (in the grading process): one count on both sides, so both run the same kernels and round alike. With 1
# thread against 2, ResNet-18 at batch 2 in train mode (BatchNorm over 2 values) gave gradients 3e-4 apart.
OBSERVATION_THREADS = 1


@contextlib.contextmanager
def observation_threads() -> Iterator[None]:
    """Run the block on OBSERVATION_THREADS torch threads, then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(OBSERVATION_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _exported(answers: Any, name: str) -> dict[str, Any]:
    from perflab.grading.probing import export_source

    fn = answers[name]
    if not callable(fn):
        return {"source": None, "why": f"`{name}` is a {type(fn).__name__}, not a function"}
    try:
        source = export_source(fn, answers.namespace)
    except (OSError, TypeError, SyntaxError) as exc:
        return {"source": None, "why": f"the source of `{name}` could not be read ({exc})"}
    if getattr(fn, "__name__", name) != name:
        source += f"\n\n{name} = {fn.__name__}\n"
    return {"source": source}


def _probe_function(name: str) -> Callable[[Any, int], dict[str, Any]]:
    return lambda answers, seed: _exported(answers, name)


def _probe_cost(answers: Any, seed: int) -> dict[str, Any]:
    from perflab.grading.probing import encode

    return {**_exported(answers, "checkpoint_stages"), "claim": encode(answers.get("CLAIM"))}


def observation_program(function: str, source: str, seed: int) -> str:
    """The program the grader runs (in its sandbox) to observe the student's `function` from its source."""
    return (f"import json as _json\nfrom perflab.labs import lab04 as _lab04\n_observe = _lab04.{OBSERVERS[function]}\n\n"
            f"{source}\n\n\nwith _lab04.observation_threads():\n    _seen = _observe({function}, {int(seed)})\n"
            "print('PERFLAB-OBSERVED ' + _json.dumps(_seen, allow_nan=False))\n")


def candidate_source(source: str, config: TrainConfig, stages: Sequence[str] = GRADED_STAGES) -> str:
    """A `perflab.verify` candidate module from the source of checkpoint_stages (and what it uses)."""
    return (f"{CANDIDATE_HEADER}\n\n{source}\n\n\nCONFIG = {json.dumps(config.to_dict())!r}\nSTAGES = {tuple(stages)!r}\n\n\n"
            "def make_step(seed):\n"
            "    import json as _json\n\n"
            "    from perflab.labs import lab04 as _lab04\n\n"
            "    return _lab04.checkpointed_step(seed, _json.loads(CONFIG), checkpoint_stages, STAGES)\n")


PROBES = {
    "checkpoint_visible": _probe_function("checkpoint_stages"),
    "checkpoint_hidden": _probe_function("checkpoint_stages"),
    "checkpoint_batchnorm": _probe_function("checkpoint_stages"),
    "largest_batch_visible": _probe_function("largest_batch"),
    "largest_batch_hidden": _probe_function("largest_batch"),
    "largest_batch_model": _probe_function("largest_batch"),
    "checkpoint_cost_verified": _probe_cost,
    "accumulate_visible": _probe_function("accumulate_gradients"),
    "accumulate_hidden": _probe_function("accumulate_gradients"),
}
