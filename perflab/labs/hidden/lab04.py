"""Lab 04's hidden checks and the reference answers they compare against; grader-only: the student
bundle leaves this module out.

The contract these checks enforce is stated in `perflab.labs.lab04`; the hidden test cells of
`solutions/lab04_memory` call the `check_*` functions below with the student's functions.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from perflab import memory
from perflab.counting import restoring_buffers
from perflab.labs.lab04 import (
    MAX_BATCH,
    MIN_MEMORY_IMAGE_SIZE,
    STAGES,
    _full_batch_grads,
    _quiet,
    cross_entropy_on,
    max_calls,
    memory_model,
    plain_cnn,
    resnet18,
)

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


def _warm_bn(model: nn.Module, x: torch.Tensor) -> None:
    """Give BatchNorm running statistics that are not the initial 0/1, so eval mode tests something."""
    was = model.training
    model.train()
    with torch.no_grad():
        model(x * 1.7 + 0.3)
    model.train(was)


# ---------------------------------------------------------------------------------------------
# Checks (the hidden tests call these with the student's functions)


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
    """The student's checkpointing of a copy of the case's model, checked to work in place."""
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
    """The largest batch within `budget` when `values[b - 1]` is the memory at batch size b."""
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
