"""Lab 4's memory measurements: the memory model the contract defines, and what the notebook measures.

`memory_model` (a `MemoryModel`: static bytes plus the activations one train-mode forward and loss
save, memoised per batch size) is the training memory `largest_batch` is judged on; `cross_entropy_on`
is the loss it includes, `fit_line` the fixed and per-sample bytes of a sweep, and `batchnorm_gap`
how far accumulated gradients of a BatchNorm model stray from the large batch's. The checkpointing
decision's budget (`activation_budget`) and the cost of checkpointing each stage, its forward FLOPs
(`stage_forward_flops`), are here too. `quiet` keeps library
warnings off stderr, where they would fail a graded cell. The notebook, the checks in
`perflab.labs.lab04.checks` and the grader-only judges use them.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from perflab import memory
from perflab.counting import count_flops, restoring_buffers
from perflab.labs import lab04
from perflab.labs.lab04 import MIN_MEMORY_IMAGE_SIZE, OPTIMIZER


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Library warnings in a check must not reach stderr (nbgrader scores a cell that writes stderr 0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


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
                with quiet():
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


def activation_budget(mode: str | None = None, plain: MemoryModel | None = None) -> int:
    """The activation budget of lab 4's checkpointing decision in `mode` (default: the mode in force), in
    bytes: `lab04.ACTIVATION_BUDGET_SHARE` of the activations the plain ResNet-18 saves in one training
    step of `sizes(mode).batch_size` images of `memory_image_size` px. `plain`: that plain model's memory
    model, where the caller has one (the notebook's, on its device); else one is built on the CPU."""
    s = lab04.sizes(mode)
    if plain is None:
        plain = memory_model(lab04.resnet18(), s.memory_image_size)
    elif plain.image_size != s.memory_image_size:
        raise ValueError(f"plain: measures {plain.image_size} px images; the budget of {s.mode} mode is set at "
                         f"{s.memory_image_size} px")
    return int(lab04.ACTIVATION_BUDGET_SHARE * plain.activations(s.batch_size))


def stage_forward_flops(model: nn.Module, batch_size: int, image_size: int,
                        stages: Sequence[str] = lab04.STAGES) -> dict[str, int]:
    """FLOPs of one forward pass of each of `stages` (direct children of `model`, e.g. a plain ResNet-18's
    layer1..layer4) on `batch_size` random images of `image_size` px: what checkpointing the stage adds to
    a training step, its forward run once more in backward. Counted by FlopCounterMode (convolutions and
    matrix products), so the same on every machine; the model's buffers are left as they were."""
    device = next(model.parameters()).device
    x = torch.randn(batch_size, 3, image_size, image_size, generator=torch.Generator().manual_seed(0)).to(device)
    root = type(model).__name__
    with torch.no_grad(), quiet():
        counted = count_flops(model, x)
    missing = [name for name in stages if f"{root}.{name}" not in counted.forward_by_module]
    if missing:
        raise ValueError(f"stages: {', '.join(missing)} ran no counted operation in {root} (not a child of the model?)")
    return {name: counted.module_forward(f"{root}.{name}") for name in stages}


def fit_line(batches: Sequence[int], values: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of `values` against `batches`: fixed bytes and bytes per sample."""
    if len(batches) < 2 or len(batches) != len(values):
        raise ValueError(f"batches/values: need two or more pairs, got {len(batches)} and {len(values)}")
    slope, intercept = np.polyfit(np.asarray(batches, float), np.asarray(values, float), 1)
    return float(intercept), float(slope)


def full_batch_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list[torch.Tensor | None]]:
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
        _, want = full_batch_grads(ref, x, y)
    acc = copy.deepcopy(model)
    with restoring_buffers(acc), quiet():
        accumulate_gradients(acc, x, y, micro_batch_size)
    gaps = [float((p.grad - w).abs().max() / w.abs().max().clamp_min(1e-12))
            for p, w in zip(acc.parameters(), want, strict=True) if w is not None and p.grad is not None]
    return max(gaps)
