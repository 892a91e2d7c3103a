"""Counting work: parameters, and FLOPs forward and forward+backward.

FLOPs follow `torch.utils.flop_counter.FlopCounterMode`, so a closed form and the counter can be
compared exactly. Its convention, checked by experiment on torch 2.14 and by reading its formulas:

* one multiply-add is 2 FLOPs (``2 * M * N * K`` for a matmul, not ``2K - 1``);
* only matrix products and convolutions are counted (mm, addmm, bmm, convolution, attention);
  BatchNorm, ReLU, pooling, additions and losses count 0;
* **bias is ignored**: ``Linear`` with bias runs ``addmm``, counted as the bare ``mm``; a
  convolution's bias add is not counted either. The `bias` arguments below are accepted for
  readability and change nothing;
* a convolution counts ``2 * N * C_out * H_out * W_out * (C_in / groups) * kH * kW``; padding,
  stride and dilation enter only through the output size;
* backward counts each gradient it computes as a forward-like product: a conv or linear layer whose
  input needs a gradient costs 2x its forward (grad input + grad weight); the first layer, whose
  input is data, costs 1x (grad weight only).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

IntOr2 = int | tuple[int, int]

# ---------------------------------------------------------------------------------------------
# Presentation helpers


def format_count(n: float, unit: str = "") -> str:
    """A count with an SI prefix: 3.63 G, 11.7 M."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for j, row in enumerate(cells):
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(parts).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Parameters


@dataclass(frozen=True)
class ParameterCount:
    """Parameters per module (each parameter counted once, at the first module that owns it)."""

    rows: tuple[tuple[str, int, int], ...]  # (module name, parameters, trainable parameters)

    @property
    def total(self) -> int:
        return sum(r[1] for r in self.rows)

    @property
    def trainable(self) -> int:
        return sum(r[2] for r in self.rows)

    def table(self) -> str:
        rows = [(name or "(model)", f"{n:,}", f"{t:,}") for name, n, t in self.rows if n]
        rows.append(("total", f"{self.total:,}", f"{self.trainable:,}"))
        return _table(("module", "parameters", "trainable"), rows)

    def __str__(self) -> str:
        return self.table()


def parameter_counts(model: nn.Module) -> ParameterCount:
    """Per-module parameter counts of `model` (its own parameters, not its children's)."""
    seen: set[int] = set()
    rows = []
    for name, module in model.named_modules():
        total = trainable = 0
        for p in module.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            total += p.numel()
            trainable += p.numel() if p.requires_grad else 0
        rows.append((name, total, trainable))
    return ParameterCount(tuple(rows))


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters in `model` (shared parameters once); only those with requires_grad if asked."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# ---------------------------------------------------------------------------------------------
# Closed forms


def _pair(value: IntOr2, name: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, Sequence) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return int(value[0]), int(value[1])
    raise ValueError(f"{name}: expected an int or a pair of ints, got {value!r}")


def conv2d_output_shape(
    in_shape: Sequence[int],
    out_channels: int,
    kernel_size: IntOr2,
    stride: IntOr2 = 1,
    padding: IntOr2 | str = 0,
    dilation: IntOr2 = 1,
) -> tuple[int, int, int, int]:
    """Output shape (N, C_out, H_out, W_out) of a Conv2d on an (N, C_in, H, W) input."""
    if len(in_shape) != 4:
        raise ValueError(f"in_shape: expected (N, C, H, W), got {tuple(in_shape)}")
    n, _, h, w = in_shape
    kh, kw = _pair(kernel_size, "kernel_size")
    sh, sw = _pair(stride, "stride")
    dh, dw = _pair(dilation, "dilation")
    if padding == "same":
        return n, out_channels, h, w
    ph, pw = (0, 0) if padding == "valid" else _pair(padding, "padding")  # type: ignore[arg-type]
    h_out = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    w_out = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if h_out < 1 or w_out < 1:
        raise ValueError(f"in_shape: {tuple(in_shape)} is smaller than the dilated kernel ({kh}x{kw}, dilation {dh}x{dw})")
    return n, out_channels, h_out, w_out


def conv2d_flops(
    in_shape: Sequence[int],
    out_channels: int,
    kernel_size: IntOr2,
    stride: IntOr2 = 1,
    padding: IntOr2 | str = 0,
    dilation: IntOr2 = 1,
    groups: int = 1,
    bias: bool = True,
) -> int:
    """Forward FLOPs of a Conv2d in FlopCounterMode's convention (2 per multiply-add, bias not counted)."""
    del bias  # FlopCounterMode does not count the bias add; see the module docstring.
    c_in = in_shape[1]
    if groups < 1 or c_in % groups or out_channels % groups:
        raise ValueError(f"groups: {groups} must divide in_channels ({c_in}) and out_channels ({out_channels})")
    n, c_out, h_out, w_out = conv2d_output_shape(in_shape, out_channels, kernel_size, stride, padding, dilation)
    kh, kw = _pair(kernel_size, "kernel_size")
    return 2 * n * c_out * h_out * w_out * (c_in // groups) * kh * kw


def linear_flops(batch: int, in_features: int, out_features: int, bias: bool = True) -> int:
    """Forward FLOPs of a Linear layer on `batch` rows (the product of all leading dims); bias not counted."""
    del bias  # addmm is counted as its mm alone; see the module docstring.
    return 2 * batch * in_features * out_features


# ---------------------------------------------------------------------------------------------
# Closed forms over a model, from shapes captured with forward hooks


@dataclass(frozen=True)
class LayerShape:
    """One call of a conv or linear layer: its shapes, parameter count and closed-form FLOPs."""

    name: str
    kind: str  # "conv2d" | "linear"
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    weight_numel: int  # weight plus bias elements
    flops: int

    @property
    def in_numel(self) -> int:
        return math.prod(self.in_shape)

    @property
    def out_numel(self) -> int:
        return math.prod(self.out_shape)


def _layer_flops(module: nn.Module, in_shape: tuple[int, ...]) -> tuple[str, int] | None:
    if isinstance(module, nn.Conv2d):
        return "conv2d", conv2d_flops(in_shape, module.out_channels, module.kernel_size, module.stride,
                                      module.padding, module.dilation, module.groups, module.bias is not None)
    if isinstance(module, nn.Linear):
        batch = math.prod(in_shape[:-1])
        return "linear", linear_flops(batch, module.in_features, module.out_features, module.bias is not None)
    return None


def layer_shapes(model: nn.Module, input_shape: Sequence[int]) -> list[LayerShape]:
    """Run `model` once on zeros of `input_shape` (no grad, eval mode, then restored) and record every
    Conv2d and Linear call in order, with its closed-form FLOPs."""
    try:
        param = next(model.parameters())
        device, dtype = param.device, param.dtype
    except StopIteration:
        device, dtype = torch.device("cpu"), torch.float32
    records: list[LayerShape] = []

    def hook_for(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            in_shape = tuple(args[0].shape)
            kind_flops = _layer_flops(module, in_shape)
            assert kind_flops is not None
            weight = sum(p.numel() for p in module.parameters(recurse=False))
            records.append(LayerShape(name, kind_flops[0], in_shape, tuple(output.shape), weight,
                                      kind_flops[1]))
        return hook

    handles = [m.register_forward_hook(hook_for(name)) for name, m in model.named_modules()
               if isinstance(m, (nn.Conv2d, nn.Linear))]
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(tuple(input_shape), device=device, dtype=dtype))
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.train(training)
    return records


def formula_flops(model: nn.Module, input_shape: Sequence[int]) -> int:
    """Forward FLOPs of `model` at `input_shape` from the closed forms of its conv and linear layers."""
    return sum(layer.flops for layer in layer_shapes(model, input_shape))


# ---------------------------------------------------------------------------------------------
# FlopCounterMode


@dataclass(frozen=True)
class FlopCount:
    """FLOPs counted by FlopCounterMode: per module (FlopCounterMode's names, 'Global' = whole run) and per op.

    `forward_by_module` holds the forward pass; `train_by_module` forward+backward (empty when
    backward was not run).
    """

    forward_by_module: Mapping[str, Mapping[str, int]]
    train_by_module: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def forward(self) -> int:
        return sum(self.forward_by_module.get("Global", {}).values())

    @property
    def has_backward(self) -> bool:
        return bool(self.train_by_module)

    @property
    def train(self) -> int:
        """Forward plus backward FLOPs (one training step without the optimizer)."""
        if not self.has_backward:
            raise ValueError("backward: these FLOPs were counted without backward; call count_flops(..., backward=True)")
        return sum(self.train_by_module.get("Global", {}).values())

    @property
    def backward(self) -> int:
        return self.train - self.forward

    def module_forward(self, name: str) -> int:
        return sum(self.forward_by_module.get(name, {}).values())

    def module_backward(self, name: str) -> int:
        return sum(self.train_by_module.get(name, {}).values()) - self.module_forward(name)

    def table(self, depth: int = 2) -> str:
        """Modules down to `depth` dots in their name, forward (and backward) FLOPs and share of the total."""
        names = sorted(n for n in self.forward_by_module if n != "Global" and n.count(".") < depth)
        total = self.train if self.has_backward else self.forward
        rows = []
        for name in names:
            fwd = self.module_forward(name)
            row = [name, format_count(fwd, "FLOP")]
            if self.has_backward:
                row.append(format_count(self.module_backward(name), "FLOP"))
            own = fwd + (self.module_backward(name) if self.has_backward else 0)
            row.append(f"{100 * own / total:.1f}%" if total else "-")
            rows.append(row)
        last = ["total", format_count(self.forward, "FLOP")]
        if self.has_backward:
            last.append(format_count(self.backward, "FLOP"))
        rows.append(last + ["100.0%"])
        header = ["module", "forward"] + (["backward"] if self.has_backward else []) + ["share"]
        return _table(header, rows)

    def to_dict(self) -> dict[str, int]:
        """The `counts` section of a results file, less the parameters."""
        out = {"flops_forward": self.forward}
        if self.has_backward:
            out["flops_train"] = self.train
        return out

    def __str__(self) -> str:
        return self.table()


@contextlib.contextmanager
def restoring_buffers(model: nn.Module) -> Iterator[None]:
    """Put the model's buffers (e.g. BatchNorm running statistics) back as they were on exit."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def _as_tuple(inputs: Any) -> tuple[Any, ...]:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def _plain(counts: Mapping[str, Mapping[Any, int]]) -> dict[str, dict[str, int]]:
    return {mod: {str(op): n for op, n in ops.items()} for mod, ops in counts.items()}


def count_flops(
    model: nn.Module,
    inputs: Any,
    backward: bool = False,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> FlopCount:
    """Count FLOPs of `model(*inputs)` with FlopCounterMode, and of its backward if asked.

    Backward differentiates `loss_fn(output)` (default: the output's sum) with respect to the
    trainable parameters through `torch.autograd.grad`, so `.grad` is left untouched; buffers
    (BatchNorm running statistics) are restored afterwards.
    """
    args = _as_tuple(inputs)
    with restoring_buffers(model), FlopCounterMode(display=False) as counter:
        output = model(*args)
        forward = _plain(counter.get_flop_counts())
        train: dict[str, dict[str, int]] = {}
        if backward:
            loss = loss_fn(output) if loss_fn is not None else output.sum()
            params = [p for p in model.parameters() if p.requires_grad]
            if not params:
                raise ValueError("backward: the model has no trainable parameters to differentiate")
            torch.autograd.grad(loss, params, allow_unused=True)
            train = _plain(counter.get_flop_counts())
    return FlopCount(forward, train)
