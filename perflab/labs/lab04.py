"""Lab 4 — Trade compute for memory: the contract between the notebook, its tests and the grader.

The student writes three functions in `labs/lab04_memory/lab04_memory.ipynb`. What is asked and
what is checked are stated once, here; the visible tests are in the notebook, and the hidden ones
(run when graded, on random inputs) call the `check_*` functions of `perflab/labs/hidden/lab04.py`
(grader-only, with the tolerances named below) with the student's function.

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
from collections.abc import Callable, Iterator, Sequence
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
    from perflab.labs.common import verify_against_bar
    from perflab.verify import Side

    s = sizes(mode)
    return verify_against_bar(baseline_config(mode), Side.module(candidate, label="checkpoint_stages"), EXPECTATION,
                              claim=claim, max_pairs=s.verify_max_pairs, max_seconds=s.verify_seconds)


def accepted(outcome: str) -> bool:
    """Whether a verification outcome earns the cell's points under the instructor's policy
    (the same policy, PERFLAB_INCONCLUSIVE, as every lab)."""
    from perflab.labs.common import accepted as policy

    return policy(outcome)


def report(verdict: Any, expectation: Any) -> dict[str, Any]:
    """Show the verdict's record to the autograder (and the student) and return it."""
    from perflab.labs.common import report as show

    return show(verdict, expectation)
