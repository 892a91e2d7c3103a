"""Lab 4 — Trade compute for memory: the contract between the notebook, its tests and the grader.

The student writes three functions in `labs/lab04_memory/lab04_memory.ipynb`. Their tests (visible
in the notebook, hidden ones when graded, on random inputs) call the `check_*` functions below
with the student's function, so what is asked and what is checked are stated once, here.

Gradient checkpointing
    checkpoint_stages(model, stages) -> nn.Module
        Make each direct child of `model` named in `stages` (e.g. ("layer1", "layer3") of a
        torchvision ResNet) run as ONE segment under
        `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` whenever autograd records
        (`torch.is_grad_enabled()`), whether or not its input requires grad; with grad disabled it
        runs plainly. Works in place and returns `model`: `list(model.parameters())` are the same
        tensors, in the same order, before and after. Against the plain model on the same input:
          - outputs are equal (train and eval mode);
          - gradients of a loss are equal within GRAD_RTOL (of each tensor's largest entry);
          - saved activation bytes (`perflab.memory.activation_bytes` with the loss, train mode)
            fall by at least MIN_SAVING_SHARE of what the reference saves by checkpointing the same
            stages, each as one segment (saved bytes depend on shapes, not on the machine's speed,
            so the reference is measured by the check itself, on the same model and input);
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

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
# A correct checkpoint saves what the reference saves; 0.8 leaves room for a wrapper that keeps a
# little more (an extra view of a stage's input), while a stage split by checkpoint_sequential,
# whose last segment is NOT checkpointed, saves about half as much and fails.
MIN_SAVING_SHARE = 0.8
# Recomputation repeats the same operations on the same inputs, so gradients agree to rounding;
# 1e-4 of a tensor's largest entry allows other kernel choices on a GPU, a wrong graph misses by far more.
GRAD_RTOL = 1e-4
# Micro-batch gradients summed in another order than one large batch's: fp32 rounding only.
ACCUM_RTOL = 1e-4
# Outputs of the checkpointed model against the plain one (same operations: equal up to rounding).
OUTPUT_RTOL, OUTPUT_ATOL = 1e-5, 1e-6
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
                 verify_seconds=6.0),
    "laptop": dict(memory_image_size=64, batches=(1, 2, 4, 8, 16, 32, 64, 128), budget_batch=64, compare_blocks=8,
                   verify_max_pairs=None, verify_seconds=None),
    "grade": dict(memory_image_size=64, batches=(1, 2, 4, 8, 16, 32), budget_batch=16, compare_blocks=4, verify_max_pairs=None,
                  verify_seconds=None),
    "full": dict(memory_image_size=224, batches=(8, 16, 32, 64, 128, 256), budget_batch=128, compare_blocks=10,
                 verify_max_pairs=None, verify_seconds=None),
}


def sizes(mode: str | None = None) -> LabSizes:
    """The lab's sizes in `mode` (default: the mode in force), built on `perflab.env.mode_sizes`."""
    base = env.mode_sizes(mode)
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
# References (what the checks measure the student's functions against)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Library warnings in a check must not reach stderr (nbgrader scores a cell that writes stderr 0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


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
    for name in stages:
        setattr(model, name, _ReferenceStage(getattr(model, name)))
    return model


def _reference_largest_batch(budget: float, memory_of: Callable[[int], float], max_batch: int) -> int:
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


# ---------------------------------------------------------------------------------------------
# Models the checks use


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


def _warm_bn(model: nn.Module, x: torch.Tensor) -> None:
    """Give BatchNorm running statistics that are not the initial 0/1, so eval mode tests something."""
    was = model.training
    model.train()
    with torch.no_grad():
        model(x * 1.7 + 0.3)
    model.train(was)


# ---------------------------------------------------------------------------------------------
# Checks (the tests call these with the student's functions)


@dataclass(frozen=True)
class CheckpointCase:
    """One model, input and stage choice the checkpoint checks run on."""

    name: str
    model: nn.Module
    stages: tuple[str, ...]
    x: torch.Tensor
    y: torch.Tensor


def checkpoint_cases(seed: int = 0, cases: int = 3) -> list[CheckpointCase]:
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
        _warm_bn(model, x)
        out.append(CheckpointCase(name, model, stages, x, y))
    return out


def _apply(checkpoint_stages: Callable[..., nn.Module], case: CheckpointCase) -> nn.Module:
    model = copy.deepcopy(case.model)
    before = list(model.parameters())
    with _quiet():
        got = checkpoint_stages(model, case.stages)
    assert isinstance(got, nn.Module), f"{case.name}: checkpoint_stages returned {type(got).__name__}, not the model"
    after = list(got.parameters())
    assert len(after) == len(before) and all(a is b for a, b in zip(after, before, strict=True)), (
        f"{case.name}: the returned model's parameters are not the original tensors in their order "
        "(wrap the stages in place; do not copy the model)")
    return got


def _train_step(model: nn.Module, case: CheckpointCase) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    model.train()
    model.zero_grad(set_to_none=True)
    with _quiet():
        out = model(case.x)
        F.cross_entropy(out, case.y).backward()
    return out.detach(), [p.grad for p in model.parameters()]


def _check_grads(where: str, got: Sequence[torch.Tensor | None], want: Sequence[torch.Tensor | None],
                 rtol: float, names: Sequence[str]) -> None:
    for name, g, w in zip(names, got, want, strict=True):
        if w is None:
            continue
        assert g is not None, (f"{where}: no gradient reached {name} (a reentrant checkpoint, or one "
                               "skipped when its input does not require grad, cuts the graph)")
        scale = float(w.abs().max())
        err = float((g - w).abs().max())
        assert err <= rtol * scale + 1e-9, (
            f"{where}: the gradient of {name} differs from the plain model's by {err:.3g} "
            f"(largest entry {scale:.3g})")


def check_checkpoint_stages(checkpoint_stages: Callable[..., nn.Module], seed: int = 0, cases: int = 2) -> list[dict[str, Any]]:
    """Outputs, gradients and saved activation bytes of the student's checkpointing against the plain model
    and the reference; returns one row per case (bytes plain, student, reference)."""
    rows = []
    for case in checkpoint_cases(seed, cases):
        names = [n for n, _ in case.model.named_parameters()]
        plain = copy.deepcopy(case.model)
        got = _apply(checkpoint_stages, case)
        reference = _reference_checkpoint(copy.deepcopy(case.model), case.stages)
        loss_of = cross_entropy_on(case.y)
        # Eval mode first: a train-mode step moves the running statistics, which check_checkpoint_bn grades.
        plain.eval()
        got.eval()
        with torch.no_grad(), _quiet():
            same = torch.allclose(got(case.x), plain(case.x), rtol=OUTPUT_RTOL, atol=OUTPUT_ATOL)
        assert same, f"{case.name}: in eval mode (no grad) the outputs differ from the plain model's"
        with _quiet():
            saved = {key: memory.activation_bytes(m.train(), case.x, loss_of).bytes
                     for key, m in (("plain", plain), ("student", got), ("reference", reference))}
        out_p, grads_p = _train_step(plain, case)
        out_s, grads_s = _train_step(got, case)
        assert torch.allclose(out_s, out_p, rtol=OUTPUT_RTOL, atol=OUTPUT_ATOL), \
            f"{case.name}: in train mode the checkpointed model's outputs differ from the plain model's"
        _check_grads(case.name, grads_s, grads_p, GRAD_RTOL, names)
        want_saving = saved["plain"] - saved["reference"]
        got_saving = saved["plain"] - saved["student"]
        assert got_saving >= MIN_SAVING_SHARE * want_saving, (
            f"{case.name}: saved activations fall from {saved['plain']} to {saved['student']} bytes, "
            f"a saving of {got_saving}; checkpointing each stage as one segment saves {want_saving} "
            f"(at least {MIN_SAVING_SHARE:.0%} of it is required; checkpoint_sequential leaves its last "
            "segment un-checkpointed, and a stage skipped when its input needs no grad saves nothing)")
        rows.append({"case": case.name, **saved})
    return rows


def _bn_buffers(model: nn.Module) -> list[torch.Tensor]:
    return [b.detach().clone() for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
            for b in m.buffers()]


def check_checkpoint_bn(checkpoint_stages: Callable[..., nn.Module], seed: int = 0, cases: int = 2) -> None:
    """After train-mode forward and backward, BatchNorm statistics are the plain model's (updated once)."""
    for case in checkpoint_cases(seed, cases):
        plain = copy.deepcopy(case.model)
        got = _apply(checkpoint_stages, case)
        for step in range(2):
            _train_step(plain, case)
            _train_step(got, case)
            want, have = _bn_buffers(plain), _bn_buffers(got)
            assert len(want) == len(have), f"{case.name}: the checkpointed model has other BatchNorm buffers"
            for i, (w, h) in enumerate(zip(want, have, strict=True)):
                if w.dtype == torch.long:
                    assert torch.equal(w, h), (
                        f"{case.name}, step {step + 1}: num_batches_tracked is {int(h)}, the plain model's "
                        f"{int(w)}: the recomputed forward counted the batch again")
                else:
                    assert torch.allclose(h, w, rtol=1e-5, atol=1e-6), (
                        f"{case.name}, step {step + 1}: BatchNorm running statistics (buffer {i}) differ from the "
                        "plain model's: the recomputed forward in backward updated them a second time "
                        "(or not at all); give the recomputation a context that leaves them alone")


def _affine(a: float, c: float) -> Callable[[int], float]:
    return lambda b: a + c * b


def _staircase(a: float, c: float, block: float) -> Callable[[int], float]:
    return lambda b: math.ceil((a + c * b) / block) * block


def _table_fn(values: np.ndarray) -> Callable[[int], float]:
    return lambda b: float(values[b - 1])


def _brute(budget: float, values: np.ndarray) -> int:
    return int(np.searchsorted(values, budget, side="right"))


class _Counted:
    """Wraps a memory function: counts calls and remembers every batch size tried."""

    def __init__(self, fn: Callable[[int], float], max_batch: int) -> None:
        self.fn, self.max_batch, self.tried = fn, max_batch, []

    def __call__(self, b: int) -> float:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)):
            raise AssertionError(f"memory_of was called with {b!r}: batch sizes are integers")
        if not 1 <= b <= self.max_batch:
            raise AssertionError(f"memory_of was called with batch size {b}, outside 1..max_batch={self.max_batch}")
        self.tried.append(int(b))
        return self.fn(int(b))


def _check_search(largest_batch: Callable[..., int], fn: Callable[[int], float], budget: float,
                  max_batch: int, want: int, where: str) -> None:
    counted = _Counted(fn, max_batch)
    got = largest_batch(budget, counted, max_batch=max_batch)
    assert got == want, f"{where}: the largest batch within the budget is {want}, you said {got}"
    top = max(counted.tried, default=0)
    assert top <= max(1, 2 * want), (
        f"{where}: you tried batch size {top}, more than twice the answer {want}: on a real device "
        "that is an out-of-memory error (grow by doubling from 1)")
    assert len(counted.tried) <= max_calls(want), (
        f"{where}: {len(counted.tried)} calls of memory_of; doubling then bisection needs at most "
        f"{max_calls(want)} for an answer of {want}")


def check_largest_batch(largest_batch: Callable[..., int], seed: int = 0, cases: int = 24) -> None:
    """Exact answers on random non-decreasing memory functions (affine, allocator-like steps, plateaus)."""
    rng = np.random.default_rng(seed)
    for case in range(cases):
        max_batch = int(rng.choice([1, int(rng.integers(2, 64)), int(rng.integers(64, 5000))]))
        kind = case % 3
        batches = np.arange(1, max_batch + 1)
        if kind == 0:
            a, c = float(rng.uniform(1e6, 1e9)), float(rng.uniform(1e3, 1e7))
            fn = _affine(a, c)
        elif kind == 1:
            a, c = float(rng.uniform(1e6, 1e9)), float(rng.uniform(1e3, 1e7))
            fn = _staircase(a, c, float(2 ** int(rng.integers(20, 23))))
        else:
            steps = rng.exponential(1e5, size=max_batch) * (rng.random(max_batch) < 0.6)
            fn = _table_fn(np.cumsum(steps) + 1e6)
        values = np.array([fn(int(b)) for b in batches])
        where_budget = rng.random()
        if where_budget < 0.1:
            budget = float(values[0] * rng.uniform(0.5, 0.99))  # nothing fits
        elif where_budget < 0.2:
            budget = float(values[-1] * rng.uniform(1.0, 2.0))  # everything fits
        else:
            budget = float(values[int(rng.integers(0, max_batch))])  # exactly on a value
            if rng.random() < 0.5:
                budget += float(rng.uniform(0, 1)) * 1e3
        want = _brute(budget, values)
        kinds = ("affine", "allocator steps", "plateaus")
        _check_search(largest_batch, fn, budget, max_batch, want,
                      f"case {case} ({kinds[kind]}, max_batch={max_batch}, budget={budget:.6g})")
    for bad in ({"budget_bytes": 0}, {"budget_bytes": -5.0}, {"budget_bytes": float("nan")},
                {"budget_bytes": 1e9, "max_batch": 0}):
        budget = bad["budget_bytes"]
        kwargs = {"max_batch": bad["max_batch"]} if "max_batch" in bad else {}
        try:
            largest_batch(budget, lambda b: 1.0, **kwargs)
        except ValueError:
            continue
        raise AssertionError(f"largest_batch with {bad} should raise ValueError")


def check_largest_batch_model(largest_batch: Callable[..., int], seed: int = 0, budgets: int = 3,
                              image_size: int = MIN_MEMORY_IMAGE_SIZE) -> list[dict[str, Any]]:
    """Hidden budgets on the reference's own memory model of ResNet-18, plain and checkpointed."""
    rng = np.random.default_rng(seed)
    rows = []
    plain_net = resnet18(int(rng.integers(2, 20)), seed=int(rng.integers(1000)))
    models = {"plain": memory_model(plain_net, image_size),
              "checkpointed": memory_model(_reference_checkpoint(copy.deepcopy(plain_net), STAGES), image_size)}
    for i in range(budgets):
        kind = list(models)[i % 2]
        model = models[kind]
        per_sample = model(2) - model(1)
        if i == budgets - 1:
            budget = model(1) - 1.0
        else:
            budget = model(int(rng.integers(1, 13))) + float(rng.uniform(0, 1)) * per_sample
        max_batch = int(rng.choice([64, 1024, MAX_BATCH]))
        want = _reference_largest_batch(budget, model, max_batch)
        _check_search(largest_batch, model, budget, max_batch, want,
                      f"ResNet-18 {kind} at {image_size} px, budget {memory.format_bytes(budget)}")
        rows.append({"model": kind, "budget": budget, "answer": want})
    return rows


def _full_batch_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list[torch.Tensor | None]]:
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return float(loss.detach()), [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def check_accumulate_gradients(accumulate_gradients: Callable[..., float], seed: int = 0, cases: int = 3) -> None:
    """Accumulated gradients equal the large batch's (BN-free CNN, ResNet-18 in eval mode), uneven last
    micro-batches, stale gradients discarded, micro-batches no larger than asked, mode kept."""
    rng = np.random.default_rng(seed)
    for case in range(cases):
        gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
        if case % 2 == 0:
            classes, side = int(rng.integers(2, 9)), int(rng.choice([8, 12, 16]))
            model = plain_cnn(int(rng.choice([4, 8])), classes, seed=int(rng.integers(1000)))
            label = "CNN without BatchNorm (train mode)"
        else:
            classes, side = int(rng.integers(2, 12)), 32
            model = resnet18(classes, seed=int(rng.integers(1000)))
            label = "ResNet-18 with BatchNorm in eval mode"
        n = int(rng.integers(5, 19)) if case % 2 == 0 else int(rng.integers(5, 11))
        smallest = 1 if case % 2 == 0 else 2  # ResNet-18 at batch 1 costs time and teaches nothing more
        micro = int(rng.choice([smallest, int(rng.integers(2, n)), n, n + int(rng.integers(1, 4))]))
        x = torch.randn(n, 3, side, side, generator=gen)
        y = torch.randint(0, classes, (n,), generator=gen)
        if case % 2 == 1:
            _warm_bn(model, x)
            model.eval()
        else:
            model.train()
        ref = copy.deepcopy(model)
        want_loss, want_grads = _full_batch_grads(ref, x, y)
        for p in model.parameters():  # stale gradients the function must not add to
            p.grad = torch.randn(p.shape, generator=gen)
        seen: list[int] = []
        handle = model.register_forward_pre_hook(lambda m, args, seen=seen: seen.append(int(args[0].shape[0])))
        mode = model.training
        where = f"case {case}: {label}, batch {n} in micro-batches of {micro}"
        try:
            with _quiet():
                got_loss = accumulate_gradients(model, x, y, micro)
        finally:
            handle.remove()
        assert model.training == mode, f"{where}: the model came back in {'train' if model.training else 'eval'} mode"
        want_sizes = [min(micro, n - start) for start in range(0, n, micro)]
        assert seen == want_sizes, (f"{where}: the model saw batches of {seen}; expected consecutive "
                                    f"micro-batches of {want_sizes}")
        assert isinstance(got_loss, float) or (torch.is_tensor(got_loss) and got_loss.numel() == 1), \
            f"{where}: return the mean loss as a float, got {type(got_loss).__name__}"
        assert math.isclose(float(got_loss), want_loss, rel_tol=1e-5, abs_tol=1e-7), \
            f"{where}: the mean loss over the batch is {want_loss:.6f}, you returned {float(got_loss):.6f}"
        names = [name for name, _ in model.named_parameters()]
        _check_grads(where, [p.grad for p in model.parameters()], want_grads, ACCUM_RTOL, names)
    for bad in (0, -2, 1.5):
        try:
            accumulate_gradients(plain_cnn(), torch.randn(4, 3, 8, 8), torch.zeros(4, dtype=torch.long), bad)
        except ValueError:
            continue
        raise AssertionError(f"accumulate_gradients with micro_batch_size={bad!r} should raise ValueError")


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
    parts = [CANDIDATE_HEADER]
    parts += [source_of(obj) for obj in (*helpers, checkpoint_stages)]
    if checkpoint_stages.__name__ != "checkpoint_stages":
        parts.append(f"checkpoint_stages = {checkpoint_stages.__name__}\n")
    parts.append(f"CONFIG = {json.dumps(config.to_dict())!r}\nSTAGES = {tuple(stages)!r}\n\n\n"
                 "def make_step(seed):\n"
                 "    import json as _json\n\n"
                 "    from perflab.labs import lab04 as _lab04\n\n"
                 "    return _lab04.checkpointed_step(seed, _json.loads(CONFIG), checkpoint_stages, STAGES)\n")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(parts), encoding="utf-8")
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
    """Re-measure the exported candidate against the plain baseline in a fresh interpreter, held to the
    bar of this hardware. Returns (verdict, expectation)."""
    from perflab.grading.timelock import timed_section
    from perflab.verify import Budget, Side, load_expectation, verify

    s = sizes(mode)
    expectation = load_expectation(EXPECTATION)
    budget = None
    if s.verify_max_pairs is not None:
        budget = Budget(max_pairs=s.verify_max_pairs, max_timed_seconds=s.verify_seconds or 30.0)
    with timed_section():
        verdict = verify(baseline_config(mode), Side.module(candidate, label="checkpoint_stages"),
                         expectation=expectation.threshold, claim=claim, budget=budget)
    return verdict, expectation


def accepted(outcome: str) -> bool:
    """Whether a verification outcome earns the cell's points under the instructor's policy
    (the same policy, PERFLAB_INCONCLUSIVE, as every lab)."""
    from perflab.labs.common import accepted as policy

    return policy(outcome)


def report(verdict: Any, expectation: Any) -> dict[str, Any]:
    """Show the verdict's record to the autograder (and the student) and return it."""
    from perflab.grading.timelock import report_verdict

    outcome = verdict.outcome if verdict.outcome != "error" else "fail"
    return report_verdict(EXPECTATION, outcome, speedup=verdict.speedup, ci=verdict.ci, claimed=verdict.claim,
                          hardware_class=expectation.hardware_class, reason=verdict.reason)
