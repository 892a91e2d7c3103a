"""`Profiler`: the classic teaching API over perflab's measurement modules.

Each method is a thin, documented wrapper: counting comes from `perflab.counting`, memory from
`perflab.memory`, timing from `perflab.timing`, bytes moved and verdicts from `perflab.roofline`. A method builds
a seeded random input of `input_shape` (batch included) on the model's own device, so the model
is never moved, and returns plain data (a dataclass, a `Measurement`, or a dict that prints
itself) that a notebook can show and a test can check.

    p = Profiler()
    p.count_parameters(model)                  # 11,689,512 for ResNet-18
    p.count_flops(model, (1, 3, 224, 224))     # FlopCount: .forward, .train, .table()
    print(p.quick_profile(model, (8, 3, 64, 64)))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from perflab import counting, memory, roofline, timing
from perflab.stats import format_time

# Percentiles reported per layer by `analyze_weight_distribution`: the median, the quartiles and
# both tails, which show clipped or heavy-tailed initialisations at a glance.
WEIGHT_PERCENTILES = (1, 5, 25, 50, 75, 95, 99)
# Exact zeros count as sparse by default; pruning tutorials pass a tolerance instead.
DEFAULT_ZERO_TOLERANCE = 0.0
# Above this many values a layer's percentiles are taken on a seeded sample of them
# (torch.quantile refuses inputs beyond 2**24 elements; a sample of 1M puts percentiles within
# about 0.1 percentile point).
QUANTILE_SAMPLE = 1_000_000
# The default optimizer of a memory budget: what TrainConfig's "sgd" is (SGD with momentum).
DEFAULT_OPTIMIZER = "sgd-momentum"


def _device_of(model: nn.Module) -> torch.device:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def _check_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(input_shape)
    if not shape or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
        raise ValueError(f"input_shape: expected positive integers with the batch first, got {input_shape!r}")
    return shape


@dataclass(frozen=True)
class MemoryReport:
    """`measure_memory`'s answer: the training budget (static + activations) and, when measured, the peak."""

    budget: memory.MemoryBudget
    peak: memory.PeakMemory | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.budget.to_dict())
        if self.peak is not None:
            out["peak"] = self.peak.peak_bytes
            out["peak_delta"] = self.peak.delta
        return out

    def __str__(self) -> str:
        return self.budget.table() + (f"\n{self.peak}" if self.peak is not None else "")


@dataclass(frozen=True)
class LayerProfile:
    """One layer: parameters, FLOPs, bytes it must move at least once, and its measured latency."""

    name: str
    input_shape: tuple[int, ...]
    parameters: int
    flops: int
    bytes: int
    latency: timing.Measurement
    verdict: str | None = None  # roofline verdict when device peaks were given

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved (inputs, outputs and parameters read or written once)."""
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.latency.median if self.latency.median > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "input_shape": list(self.input_shape), "parameters": self.parameters,
                "flops": self.flops, "bytes": self.bytes, "intensity": self.intensity,
                "latency": self.latency.as_stat(), "flops_per_s": self.flops_per_s,
                "verdict": self.verdict}

    def __str__(self) -> str:
        return (f"{self.name} on {self.input_shape}: {self.parameters:,} parameters, "
                f"{counting.format_count(self.flops, 'FLOP')}, {memory.format_bytes(self.bytes)} moved, "
                f"intensity {self.intensity:.1f} FLOP/B, median {format_time(self.latency.median)} "
                f"({counting.format_count(self.flops_per_s, 'FLOP/s')})"
                + (f", {self.verdict}" if self.verdict else ""))


@dataclass(frozen=True)
class PassProfile:
    """A timed forward (or forward+backward) pass with the FLOPs it does; rates are derived."""

    kind: str  # "forward" or "backward"
    input_shape: tuple[int, ...]
    flops: int
    latency: timing.Measurement
    forward_latency: timing.Measurement | None = None  # set for "backward": time(fwd+bwd) - time(fwd)
    activation_bytes: int | None = None

    @property
    def seconds(self) -> float:
        """Median seconds of this pass alone (backward: forward+backward median minus forward median)."""
        if self.forward_latency is None:
            return self.latency.median
        return max(self.latency.median - self.forward_latency.median, 0.0)

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds if self.seconds > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.input_shape[0] / self.latency.median if self.latency.median > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, "input_shape": list(self.input_shape), "flops": self.flops,
               "seconds": self.seconds, "flops_per_s": self.flops_per_s,
               "latency": self.latency.as_stat(), "samples_per_s": self.samples_per_s}
        if self.activation_bytes is not None:
            out["activation_bytes"] = self.activation_bytes
        return out

    def __str__(self) -> str:
        what = "forward" if self.kind == "forward" else "backward (forward+backward minus forward)"
        lines = [f"{what} on {self.input_shape}: {counting.format_count(self.flops, 'FLOP')} in "
                 f"{format_time(self.seconds)} = {counting.format_count(self.flops_per_s, 'FLOP/s')}"]
        if self.activation_bytes is not None:
            lines.append(f"activations saved for backward: {memory.format_bytes(self.activation_bytes)}")
        lines.append(str(self.latency))
        return "\n".join(lines)


class Summary(dict):
    """A plain dict of figures that prints as a short aligned summary."""

    title = "profile"

    def __str__(self) -> str:
        width = max((len(k) for k in self), default=0)
        lines = [self.title]
        for key, value in self.items():
            lines.append(f"  {key:<{width}}  {_format_value(key, value)}")
        return "\n".join(lines)


def _format_value(key: str, value: Any) -> str:
    if isinstance(value, float):
        if key.endswith("_s") and not key.endswith("per_s"):
            return format_time(value)
        if key.endswith("per_s") and "flop" in key:
            return counting.format_count(value, "FLOP/s")
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        if key.endswith("bytes"):
            return memory.format_bytes(value)
        if "flops" in key:
            return counting.format_count(value, "FLOP")
        return f"{value:,}"
    if isinstance(value, (list, tuple)) and len(value) == 2 and key.endswith("ci_s"):
        return f"{format_time(value[0])} to {format_time(value[1])}"
    return str(value)


@dataclass(frozen=True)
class LayerWeights:
    """Statistics of one parameter tensor's values."""

    name: str
    shape: tuple[int, ...]
    numel: int
    mean: float
    std: float
    min: float
    max: float
    sparsity: float
    percentiles: dict[int, float]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "numel": self.numel, "mean": self.mean,
                "std": self.std, "min": self.min, "max": self.max, "sparsity": self.sparsity,
                "percentiles": {str(k): v for k, v in self.percentiles.items()}}


@dataclass(frozen=True)
class WeightReport:
    """Per-layer weight statistics; `figure` holds histograms when asked for."""

    layers: tuple[LayerWeights, ...]
    figure: Any = field(default=None, compare=False, repr=False)

    def layer(self, name: str) -> LayerWeights:
        for row in self.layers:
            if row.name == name:
                return row
        raise KeyError(f"{name}: no such parameter; known: {', '.join(r.name for r in self.layers[:5])}…")

    @property
    def sparsity(self) -> float:
        """Share of all parameter values that count as zero."""
        total = sum(r.numel for r in self.layers)
        return sum(r.sparsity * r.numel for r in self.layers) / total if total else 0.0

    def table(self) -> str:
        rows = [(r.name, f"{r.numel:,}", f"{r.mean:+.4f}", f"{r.std:.4f}", f"{r.min:+.3f}", f"{r.max:+.3f}",
                 f"{r.sparsity:.1%}") for r in self.layers]
        return counting._table(("parameter", "values", "mean", "std", "min", "max", "zeros"), rows)

    def to_dict(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.layers]

    def __str__(self) -> str:
        return self.table()


class Profiler:
    """The teaching façade: count, time and measure a model with one object.

    `warmup`, `repeats` and `min_run_time` go to `perflab.timing.benchmark`; `seed` fixes the random
    inputs. Models stay where they are: inputs are made on the model's device.
    """

    def __init__(self, *, warmup: int = timing.DEFAULT_WARMUP, repeats: int | None = None,
                 min_run_time: float = timing.DEFAULT_MIN_RUN_TIME, seed: int = 0) -> None:
        self.warmup = warmup
        self.repeats = repeats
        self.min_run_time = min_run_time
        self.seed = seed

    # -- inputs and timing ---------------------------------------------------------------------

    def make_input(self, model: nn.Module, input_shape: Sequence[int]) -> torch.Tensor:
        """A seeded standard-normal input of `input_shape` on `model`'s device."""
        shape = _check_shape(input_shape)
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randn(shape, generator=generator).to(_device_of(model))

    def _time(self, fn: Callable[[], Any], device: torch.device, label: str, **overrides: Any
              ) -> timing.Measurement:
        options = {"warmup": self.warmup, "repeats": self.repeats, "min_run_time": self.min_run_time}
        options.update({k: v for k, v in overrides.items() if v is not None})
        return timing.benchmark(fn, device=device, label=label, **options)

    # -- the teaching API ----------------------------------------------------------------------

    def count_parameters(self, model: nn.Module, trainable_only: bool = False) -> int:
        """Number of parameters (shared ones once); `counting.parameter_counts` has the per-module table."""
        return counting.count_parameters(model, trainable_only=trainable_only)

    def count_flops(self, model: nn.Module, input_shape: Sequence[int], backward: bool = True
                    ) -> counting.FlopCount:
        """FLOPs of one forward (and forward+backward) pass on `input_shape`, per module, by FlopCounterMode."""
        x = self.make_input(model, input_shape)
        with _preserve_buffers(model):
            return counting.count_flops(model, x, backward=backward)

    def measure_memory(self, model: nn.Module, input_shape: Sequence[int],
                       optimizer: str = DEFAULT_OPTIMIZER, peak: bool = True) -> MemoryReport:
        """Training memory on `input_shape`: parameters, gradients, optimizer state, activations; and the peak.

        The peak is one forward+backward pass measured by `memory.peak_memory` (allocator on
        CUDA/MPS; on CPU a child process, which costs a few seconds to start).
        """
        x = self.make_input(model, input_shape)
        budget = memory.memory_budget(model, optimizer, x)
        measured = None
        if peak:
            device = _device_of(model)
            if device.type == "cpu":
                measured = memory.peak_memory(_forward_backward, device, model, x)
            else:
                measured = memory.peak_memory(lambda: _forward_backward(model, x), device)
                _drop_grads(model)
        return MemoryReport(budget, measured)

    def measure_latency(self, model: nn.Module, input_shape: Sequence[int], *, warmup: int | None = None,
                        repeats: int | None = None, min_run_time: float | None = None,
                        train: bool = False) -> timing.Measurement:
        """Seconds per forward pass (inference, no grad) on `input_shape`; `train=True` times forward+backward."""
        x = self.make_input(model, input_shape)
        device = _device_of(model)
        if train:
            fn, label = (lambda: _forward_backward(model, x)), "forward+backward"
        else:
            def fn() -> Any:
                with torch.no_grad():
                    return model(x)
            label = "forward"
        with _preserve_buffers(model):
            measured = self._time(fn, device, f"{type(model).__name__} {label} {tuple(x.shape)}",
                                  warmup=warmup, repeats=repeats, min_run_time=min_run_time)
        if train:
            _drop_grads(model)
        return measured

    def profile_layer(self, layer: nn.Module, input_shape: Sequence[int], name: str | None = None,
                      peaks: roofline.DevicePeaks | None = None) -> LayerProfile:
        """One layer's parameters, forward FLOPs, bytes moved, latency and arithmetic intensity.

        FLOPs come from FlopCounterMode; bytes from the roofline's traffic model (input, weights and
        output once each) for conv/linear layers, the same model from the tensors for any other
        layer. With `peaks` the layer also gets its roofline verdict on that device.
        """
        x = self.make_input(layer, input_shape)
        with _preserve_buffers(layer), torch.no_grad():
            flops = counting.count_flops(layer, x).forward
            costs = roofline.layer_intensity(layer, x.shape, x.dtype)
            out = layer(x)
        if costs:
            nbytes = sum(c.bytes for c in costs)
        else:
            nbytes = (x.numel() * x.element_size() + _output_bytes(out)
                      + sum(p.numel() * p.element_size() for p in layer.parameters()))
        verdict = None
        if peaks is not None and flops > 0:
            verdict = roofline.point(name or "layer", flops, nbytes, peaks, x.dtype).verdict
        latency = self.measure_latency(layer, input_shape)
        return LayerProfile(name or type(layer).__name__, tuple(x.shape), counting.count_parameters(layer),
                            flops, nbytes, latency, verdict)

    def profile_forward_pass(self, model: nn.Module, input_shape: Sequence[int]) -> PassProfile:
        """Forward FLOPs, latency, FLOP/s and the activations it saves for backward."""
        x = self.make_input(model, input_shape)
        flops = self.count_flops(model, input_shape, backward=False).forward
        activations = memory.activation_bytes(model, x).bytes
        latency = self.measure_latency(model, input_shape)
        return PassProfile("forward", tuple(x.shape), flops, latency, activation_bytes=activations)

    def profile_backward_pass(self, model: nn.Module, input_shape: Sequence[int]) -> PassProfile:
        """Backward FLOPs and time: forward+backward is timed, the forward median subtracted."""
        counted = self.count_flops(model, input_shape, backward=True)
        both = self.measure_latency(model, input_shape, train=True)
        forward = self._forward_with_grad(model, input_shape)
        return PassProfile("backward", _check_shape(input_shape), counted.backward, both, forward)

    def _forward_with_grad(self, model: nn.Module, input_shape: Sequence[int]) -> timing.Measurement:
        """Forward timed with autograd recording (what backward's timing includes), graph then dropped."""
        x = self.make_input(model, input_shape)
        with _preserve_buffers(model):
            return self._time(lambda: model(x), _device_of(model),
                              f"{type(model).__name__} forward (grad) {tuple(x.shape)}")

    def quick_profile(self, model: nn.Module, input_shape: Sequence[int]) -> Summary:
        """The headline figures of a model on `input_shape` as a dict that prints as a summary."""
        shape = _check_shape(input_shape)
        flops = self.count_flops(model, shape, backward=True)
        latency = self.measure_latency(model, shape)
        ci = latency.ci()
        acts = memory.activation_bytes(model, self.make_input(model, shape)).bytes
        params = self.count_parameters(model)
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        summary = Summary(
            model=type(model).__name__,
            input_shape=shape,
            device=str(_device_of(model)),
            parameters=params,
            parameter_bytes=param_bytes,
            flops_forward=flops.forward,
            flops_train=flops.train,
            activation_bytes=acts,
            latency_s=latency.median,
            latency_ci_s=[ci.low, ci.high],
            samples_per_s=shape[0] / latency.median if latency.median > 0 else 0.0,
            achieved_flops_per_s=flops.forward / latency.median if latency.median > 0 else 0.0,
            timed_calls=latency.n,
        )
        summary.title = f"quick profile of {type(model).__name__} on {shape} ({summary['device']})"
        return summary

    def analyze_weight_distribution(self, model: nn.Module, *, plot: bool = False,
                                    zero_tolerance: float = DEFAULT_ZERO_TOLERANCE,
                                    percentiles: Sequence[int] = WEIGHT_PERCENTILES,
                                    max_plots: int = 12) -> WeightReport:
        """Per-parameter mean, std, min, max, sparsity and percentiles; histograms in `.figure` if `plot`."""
        if zero_tolerance < 0:
            raise ValueError(f"zero_tolerance: must be 0 or more, got {zero_tolerance}")
        rows = []
        for name, p in model.named_parameters():
            values = p.detach().float().flatten().cpu()
            if values.numel() == 0:
                continue
            qs = _percentiles(values, percentiles, self.seed)
            rows.append(LayerWeights(
                name=name, shape=tuple(p.shape), numel=values.numel(),
                mean=float(values.mean()), std=float(values.std()) if values.numel() > 1 else 0.0,
                min=float(values.min()), max=float(values.max()),
                sparsity=float((values.abs() <= zero_tolerance).float().mean()),
                percentiles=qs,
            ))
        if not rows:
            raise ValueError("model: has no parameters to analyse")
        figure = _weight_figure(model, rows, max_plots) if plot else None
        return WeightReport(tuple(rows), figure)


def _percentiles(values: torch.Tensor, percentiles: Sequence[int], seed: int) -> dict[int, float]:
    if values.numel() > QUANTILE_SAMPLE:
        generator = torch.Generator().manual_seed(seed)
        values = values[torch.randint(values.numel(), (QUANTILE_SAMPLE,), generator=generator)]
    qs = torch.quantile(values, torch.tensor([p / 100 for p in percentiles]))
    return {int(p): float(q) for p, q in zip(percentiles, qs, strict=True)}


def _weight_figure(model: nn.Module, rows: Sequence[LayerWeights], max_plots: int) -> Any:
    """Histograms of the largest weight tensors (biases and norms left out when there are enough weights)."""
    from matplotlib.figure import Figure

    params = dict(model.named_parameters())
    chosen = [r for r in rows if len(r.shape) > 1] or list(rows)
    chosen = chosen[:max_plots]
    cols = min(4, len(chosen))
    nrows = math.ceil(len(chosen) / cols)
    fig = Figure(figsize=(3.2 * cols, 2.4 * nrows), layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False)
    for ax, row in zip(axes.flat, chosen, strict=False):
        ax.hist(params[row.name].detach().float().flatten().cpu().numpy(), bins=60, color="#4C72B0")
        ax.set_title(f"{row.name}\nstd {row.std:.3g}, zeros {row.sparsity:.1%}", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(chosen):]:
        ax.set_visible(False)
    fig.suptitle(f"weight distribution of {type(model).__name__}", fontsize=10)
    return fig


def _forward_backward(model: nn.Module, x: torch.Tensor) -> None:
    """One forward and backward pass (the loss is the output's sum); module-level so a child process can run it."""
    model(x).sum().backward()


def _drop_grads(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


def _output_bytes(out: Any) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel() * out.element_size()
    if isinstance(out, (list, tuple)):
        return sum(_output_bytes(o) for o in out)
    return 0


class _preserve_buffers:
    """Restore buffers (BatchNorm running statistics) after measuring: profiling must not train the model."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.saved = {name: b.detach().clone() for name, b in self.model.named_buffers()}

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for name, b in self.model.named_buffers():
                if name in self.saved:
                    b.copy_(self.saved[name])


__all__ = ["LayerProfile", "LayerWeights", "MemoryReport", "PassProfile", "Profiler", "Summary",
           "WeightReport"]
