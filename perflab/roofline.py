"""The roofline: device peaks, per-layer arithmetic intensity, and compute- vs memory-bound verdicts.

A layer doing F FLOPs while moving B bytes has intensity I = F / B. On a device with peak compute
P (FLOP/s) and memory bandwidth W (bytes/s) it can reach at most min(P, W * I); the ridge point
I* = P / W separates memory-bound layers (I < I*) from compute-bound ones (I >= I*).

The traffic model is the simple one, stated once: a layer reads its input and its weights (and
bias) once and writes its output once, each element at the dtype's size; no cache reuse across
layers, no im2col buffers, no re-reads. That is a lower bound on traffic, so the intensity is an
upper bound and "memory-bound" verdicts are conservative. FLOPs are the closed forms of
`perflab.counting` (FlopCounterMode's convention); only Conv2d and Linear layers appear, since
FlopCounterMode counts nothing else.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from perflab import env
from perflab.counting import _table, format_count, layer_shapes

log = logging.getLogger(__name__)

COMPUTE_BOUND = "compute-bound"
MEMORY_BOUND = "memory-bound"

# Colour-blind-safe colours (Okabe & Ito, 2008), with distinct markers so the plot reads in grey too.
_VERDICT_STYLE = {COMPUTE_BOUND: ("#0072B2", "o"), MEMORY_BOUND: ("#D55E00", "^")}

_T = 1e12
_GB = 1e9

# ---------------------------------------------------------------------------------------------
# Vendor peaks: dense (no 2:4 sparsity) tensor-core rates, FP32 on CUDA cores, memory bandwidth.
# Datasheets quote sparse tensor rates with an asterisk; the dense rate is half of it.
# (pattern on the lower-cased torch.cuda.get_device_name, name, FLOP/s per dtype, bytes/s);
# the first pattern that matches wins, so specific ones come first.
_KNOWN_GPUS: tuple[tuple[str, str, dict[str, float], float], ...] = (
    # NVIDIA H200 datasheet (SXM): FP32 67 TF; TF32 989 TF*, BF16/FP16 1,979 TF* (* sparse); HBM3e 4.8 TB/s.
    (r"h200.*nvl", "NVIDIA H200 NVL",
     {"float32": 60 * _T, "tf32": 417.5 * _T, "bfloat16": 835.5 * _T, "float16": 835.5 * _T}, 4800 * _GB),
    (r"h200", "NVIDIA H200 SXM",
     {"float32": 67 * _T, "tf32": 494.5 * _T, "bfloat16": 989.5 * _T, "float16": 989.5 * _T}, 4800 * _GB),
    # NVIDIA H100 datasheet: NVL FP32 60, TF32 835*, BF16 1,671*, 3.9 TB/s; PCIe FP32 51, TF32 756*,
    # BF16 1,513*, 2 TB/s; SXM FP32 67, TF32 989*, BF16 1,979*, 3.35 TB/s (* sparse).
    (r"h100.*nvl", "NVIDIA H100 NVL",
     {"float32": 60 * _T, "tf32": 417.5 * _T, "bfloat16": 835.5 * _T, "float16": 835.5 * _T}, 3900 * _GB),
    (r"h100.*pcie", "NVIDIA H100 PCIe",
     {"float32": 51 * _T, "tf32": 378 * _T, "bfloat16": 756.5 * _T, "float16": 756.5 * _T}, 2000 * _GB),
    (r"h100", "NVIDIA H100 SXM",
     {"float32": 67 * _T, "tf32": 494.5 * _T, "bfloat16": 989.5 * _T, "float16": 989.5 * _T}, 3350 * _GB),
    # NVIDIA A100 datasheet: FP32 19.5 TF, TF32 156 TF, BF16/FP16 312 TF (dense);
    # HBM2e 80GB PCIe 1,935 GB/s, 80GB SXM 2,039 GB/s; HBM2 40GB 1,555 GB/s.
    (r"a100.*(80gb.*pcie|pcie.*80gb)", "NVIDIA A100 80GB PCIe",
     {"float32": 19.5 * _T, "tf32": 156 * _T, "bfloat16": 312 * _T, "float16": 312 * _T}, 1935 * _GB),
    (r"a100.*80gb", "NVIDIA A100 80GB SXM",
     {"float32": 19.5 * _T, "tf32": 156 * _T, "bfloat16": 312 * _T, "float16": 312 * _T}, 2039 * _GB),
    (r"a100", "NVIDIA A100 40GB",
     {"float32": 19.5 * _T, "tf32": 156 * _T, "bfloat16": 312 * _T, "float16": 312 * _T}, 1555 * _GB),
    # NVIDIA A10 datasheet: FP32 31.2 TF, TF32 62.5 TF, BF16/FP16 125 TF (dense); 600 GB/s. Not A10G.
    (r"\ba10\b", "NVIDIA A10",
     {"float32": 31.2 * _T, "tf32": 62.5 * _T, "bfloat16": 125 * _T, "float16": 125 * _T}, 600 * _GB),
    # NVIDIA L40S datasheet: FP32 91.6 TF, TF32 366 TF*, BF16/FP16 733 TF* (* sparse); 864 GB/s.
    (r"l40s", "NVIDIA L40S",
     {"float32": 91.6 * _T, "tf32": 183 * _T, "bfloat16": 366.5 * _T, "float16": 366.5 * _T}, 864 * _GB),
    # NVIDIA L4 datasheet: FP32 30.3 TF, TF32 120 TF*, BF16/FP16 242 TF* (* sparse); 300 GB/s.
    (r"\bl4\b", "NVIDIA L4",
     {"float32": 30.3 * _T, "tf32": 60 * _T, "bfloat16": 121 * _T, "float16": 121 * _T}, 300 * _GB),
    # NVIDIA T4 datasheet: FP32 8.1 TF, mixed FP16/FP32 65 TF; no BF16; 320 GB/s.
    (r"\bt4\b", "NVIDIA T4", {"float32": 8.1 * _T, "float16": 65 * _T}, 320 * _GB),
    # NVIDIA Ada whitepaper, GeForce RTX 4090: FP32 82.6 TF; TF32 82.6 TF; FP16/BF16 tensor with
    # FP32 accumulate (what training uses) 165.2 TF dense; GDDR6X 1,008 GB/s.
    (r"rtx 4090", "NVIDIA GeForce RTX 4090",
     {"float32": 82.6 * _T, "tf32": 82.6 * _T, "bfloat16": 165.2 * _T, "float16": 165.2 * _T}, 1008 * _GB),
    # NVIDIA V100 datasheet: PCIe FP32 14 TF, tensor 112 TF; SXM2 FP32 15.7 TF, tensor 125 TF;
    # HBM2 900 GB/s; no BF16.
    (r"v100.*pcie", "NVIDIA V100 PCIe", {"float32": 14 * _T, "float16": 112 * _T}, 900 * _GB),
    (r"v100", "NVIDIA V100 SXM2", {"float32": 15.7 * _T, "float16": 125 * _T}, 900 * _GB),
)


def _dtype_key(dtype: torch.dtype | str) -> str:
    """'float32', 'tf32', 'bfloat16', 'float16' from a torch dtype or one of those names."""
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    return aliases.get(dtype, dtype)


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes per element; 'tf32' is stored as float32."""
    key = _dtype_key(dtype)
    if key == "tf32":
        return 4
    torch_dtype = getattr(torch, key, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"dtype: {dtype!r} is not a torch dtype or 'tf32'")
    return torch.empty((), dtype=torch_dtype).element_size()


# ---------------------------------------------------------------------------------------------
# Peaks


@dataclass(frozen=True)
class PeakBenchmark:
    """Raw samples of the peak micro-benchmarks: an n x n matmul and a tensor copy."""

    device: str
    dtype: str
    matmul_n: int
    matmul_seconds: tuple[float, ...]  # per matmul
    copy_bytes: int  # bytes of the copied tensor (moved twice: read and write)
    copy_seconds: tuple[float, ...]  # per copy
    conv_flops: float = 0.0  # FLOPs of one 3x3 convolution of a ResNet-like shape (0: not measured)
    conv_seconds: tuple[float, ...] = ()  # per convolution

    @property
    def matmul_flops_per_s(self) -> float:
        return 2 * self.matmul_n**3 / min(self.matmul_seconds)

    @property
    def conv_flops_per_s(self) -> float:
        return self.conv_flops / min(self.conv_seconds) if self.conv_seconds and self.conv_flops else 0.0

    @property
    def flops_per_s(self) -> float:
        """Best observed rate of the kernels the workload uses (matmul and convolution, each through the
        library torch calls): a peak is what the device can do, so interference is filtered by the
        minimum time, and the faster kernel sets the roof (convolutions often beat a square matmul)."""
        return max(self.matmul_flops_per_s, self.conv_flops_per_s)

    @property
    def bytes_per_s(self) -> float:
        return 2 * self.copy_bytes / min(self.copy_seconds)

    def __str__(self) -> str:
        conv = (f"; 3x3 conv {self.dtype}: {format_count(self.conv_flops_per_s, 'FLOP/s')} (best of "
                f"{len(self.conv_seconds)})" if self.conv_seconds else "")
        return (f"matmul {self.matmul_n}x{self.matmul_n} {self.dtype}: {format_count(self.matmul_flops_per_s, 'FLOP/s')} "
                f"(best of {len(self.matmul_seconds)}){conv}; copy {self.copy_bytes / 2**20:.0f} MiB: "
                f"{format_count(self.bytes_per_s, 'B/s')} (best of {len(self.copy_seconds)}) on {self.device}")


@dataclass(frozen=True)
class DevicePeaks:
    """Peak FLOP/s per dtype and memory bandwidth of a device, from a spec sheet or measured."""

    name: str
    flops: Mapping[str, float]  # dtype key ('float32', 'tf32', 'bfloat16', 'float16') -> FLOP/s
    bandwidth: float  # bytes/s
    source: str  # "spec" or "measured"
    benchmark: PeakBenchmark | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.flops or any(not (v > 0 and math.isfinite(v)) for v in self.flops.values()):
            raise ValueError(f"flops: every peak must be a positive finite FLOP/s, got {dict(self.flops)}")
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise ValueError(f"bandwidth: must be positive finite bytes/s, got {self.bandwidth!r}")

    def peak_flops(self, dtype: torch.dtype | str = torch.float32) -> float:
        key = _dtype_key(dtype)
        if key not in self.flops:
            raise ValueError(f"dtype: {self.name} has no peak for {key!r} (known: {', '.join(self.flops)})")
        return self.flops[key]

    def ridge(self, dtype: torch.dtype | str = torch.float32) -> float:
        """Intensity (FLOP/byte) where the roof turns from bandwidth to compute."""
        return self.peak_flops(dtype) / self.bandwidth

    def attainable(self, intensity: float, dtype: torch.dtype | str = torch.float32) -> float:
        return min(self.peak_flops(dtype), self.bandwidth * intensity)

    def table(self) -> str:
        rows = [(k, format_count(v, "FLOP/s"), f"{v / self.bandwidth:.1f}") for k, v in self.flops.items()]
        return (f"{self.name} ({self.source}), memory bandwidth {format_count(self.bandwidth, 'B/s')}\n"
                + _table(("dtype", "peak", "ridge FLOP/B"), rows))

    def __str__(self) -> str:
        return self.table()


def lookup_peaks(device_name: str) -> DevicePeaks | None:
    """Spec-sheet peaks of a known GPU from its name (as torch.cuda.get_device_name gives it), else None."""
    lowered = device_name.lower()
    for pattern, name, flops, bandwidth in _KNOWN_GPUS:
        if re.search(pattern, lowered):
            return DevicePeaks(name, dict(flops), bandwidth, "spec")
    return None


def known_gpus() -> list[DevicePeaks]:
    """Every GPU in the spec table."""
    return [DevicePeaks(name, dict(flops), bw, "spec") for _, name, flops, bw in _KNOWN_GPUS]


# Micro-benchmark sizes per device type: (largest matmul side, copy elements, seconds per benchmark,
# shortest sample). The CPU sizes keep the whole measurement under ~3 s on a 2-core laptop; GPU
# sizes saturate the device. A sample shorter than the last figure is dominated by thread wake-up
# (16 ms per call measured on a busy 2-core machine; back-to-back calls in one sample amortise it) or kernel launch, not by the work.
_BENCH_SIZES = {"cpu": (1024, 2**25, 0.6, 0.05), "mps": (4096, 2**26, 0.5, 0.02),
                "cuda": (8192, 2**28, 0.5, 0.02)}
# (batch, channels, side) of the convolution micro-benchmark: a ResNet stage's 3x3 conv.
_CONV_SHAPES = {"cpu": (8, 128, 28), "mps": (32, 256, 28), "cuda": (128, 256, 28)}
_MIN_REPEATS = 3
_MAX_REPEATS = 200


def _time_best(fn: Callable[[], Any], device: torch.device, budget_s: float, min_sample_s: float) -> tuple[float, ...]:
    """Seconds per call of `fn`, from samples of at least `min_sample_s`; at least _MIN_REPEATS samples."""
    fn()
    env.synchronize(device)
    start = time.perf_counter()
    fn()
    env.synchronize(device)
    once = max(time.perf_counter() - start, 1e-9)
    inner = max(1, math.ceil(min_sample_s / once))
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < _MIN_REPEATS or (time.perf_counter() < deadline and len(samples) < _MAX_REPEATS):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        env.synchronize(device)
        samples.append((time.perf_counter() - start) / inner)
    return tuple(samples)


def _matmul_operands(device: torch.device, dtype: torch.dtype, max_n: int,
                     min_sample_s: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Square operands, doubled from 256 until one product takes `min_sample_s` or the side reaches `max_n`."""
    n = 256
    while True:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        torch.mm(a, b)
        env.synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        env.synchronize(device)
        if time.perf_counter() - start >= min_sample_s or n >= max_n:
            return a, b, torch.empty(n, n, device=device, dtype=dtype)
        n *= 2


def measure_peaks(device: torch.device | str | None = None, dtype: torch.dtype | str = torch.float32) -> DevicePeaks:
    """Measure peak matmul FLOP/s (in `dtype`) and copy bandwidth on `device` with micro-benchmarks.

    On CUDA, float32 counts as 'tf32' when TF32 matmuls are allowed. Measured peaks are what this
    software reaches, usually below the spec sheet.
    """
    dev = env.pick_device(str(device) if device is not None else None)
    key = _dtype_key(dtype)
    torch_dtype = torch.float32 if key == "tf32" else getattr(torch, key, None)
    if not isinstance(torch_dtype, torch.dtype) or not torch_dtype.is_floating_point:
        raise ValueError(f"dtype: {dtype!r} is not a floating-point torch dtype")
    if dev.type == "cuda" and key == "float32" and torch.backends.cuda.matmul.allow_tf32:
        key = "tf32"
    max_n, copy_numel, budget, min_sample = _BENCH_SIZES[dev.type]

    a, b, out = _matmul_operands(dev, torch_dtype, max_n, min_sample)
    matmul = _time_best(functools.partial(torch.mm, a, b, out=out), dev, budget, min_sample)
    n = a.shape[0]
    del a, b, out

    batch, channels, side = _CONV_SHAPES[dev.type]
    x = torch.randn(batch, channels, side, side, device=dev, dtype=torch_dtype)
    w = torch.randn(channels, channels, 3, 3, device=dev, dtype=torch_dtype)
    with torch.no_grad():
        conv = _time_best(functools.partial(torch.nn.functional.conv2d, x, w, padding=1), dev, budget / 2,
                          min_sample / 5)
    conv_flops = 2.0 * batch * channels * channels * 9 * side * side
    del x, w

    src = torch.ones(copy_numel, device=dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy = _time_best(functools.partial(dst.copy_, src), dev, budget / 2, min_sample / 5)
    bench = PeakBenchmark(str(dev), key, n, matmul, src.numel() * src.element_size(), copy, conv_flops, conv)
    log.info("measured peaks: %s", bench)
    return DevicePeaks(env.machine_info(dev).device_name, {key: bench.flops_per_s}, bench.bytes_per_s,
                       "measured", bench)


def raised_to_fit(peaks: DevicePeaks, points: Sequence[LayerPoint],
                  dtype: torch.dtype | str = torch.float32) -> tuple[DevicePeaks, list[LayerPoint]]:
    """`peaks` with its compute peak raised to the fastest measured layer where a layer ran above its
    roof, and `points` placed again under it: a peak is the most this device was seen to do, and a
    micro-benchmark can miss what a tuned kernel reaches. Unchanged when every layer is under its roof."""
    top = max((p.achieved for p in points if p.achieved is not None), default=0.0)
    if not any(p.achieved is not None and p.achieved > p.attainable for p in points):
        return peaks, list(points)
    key = _dtype_key(dtype)
    raised = DevicePeaks(peaks.name, {**peaks.flops, key: max(peaks.flops.get(key, 0.0), top)}, peaks.bandwidth,
                         f"{peaks.source}, compute raised to the fastest layer", peaks.benchmark)
    bandwidth_floor = max((p.achieved / p.intensity for p in points if p.achieved is not None), default=0.0)
    if bandwidth_floor > raised.bandwidth:
        raised = DevicePeaks(raised.name, raised.flops, bandwidth_floor,
                             f"{raised.source}, bandwidth raised to the fastest layer", raised.benchmark)
    return raised, [point(p.name, p.flops, p.bytes, raised, seconds=p.seconds, dtype=dtype) for p in points]


def device_peaks(device: torch.device | str | None = None, dtype: torch.dtype | str = torch.float32) -> DevicePeaks:
    """Spec-sheet peaks for a known GPU, else measured ones (CPU, MPS, unknown GPUs)."""
    dev = env.pick_device(str(device) if device is not None else None)
    if dev.type == "cuda":
        known = lookup_peaks(torch.cuda.get_device_name(dev))
        if known is not None and _dtype_key(dtype) in known.flops:
            return known
    return measure_peaks(dev, dtype)


# ---------------------------------------------------------------------------------------------
# Layers on the roofline


@dataclass(frozen=True)
class LayerCost:
    """A layer's work and traffic under the simple model in the module docstring."""

    name: str
    kind: str
    flops: int
    bytes: int

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def layer_intensity(model: nn.Module, input_shape: Sequence[int],
                    dtype: torch.dtype | str = torch.float32) -> list[LayerCost]:
    """FLOPs, bytes moved (input + weights + output at `dtype`'s size) and their ratio for each conv and
    linear call of `model` at `input_shape`, in call order."""
    size = dtype_bytes(dtype)
    return [LayerCost(s.name, s.kind, s.flops, (s.in_numel + s.weight_numel + s.out_numel) * size)
            for s in layer_shapes(model, input_shape)]


@dataclass(frozen=True)
class LayerPoint:
    """A layer placed against a device's roof; `seconds`, if measured, gives its achieved FLOP/s."""

    name: str
    flops: float
    bytes: float
    peak_flops: float
    bandwidth: float
    seconds: float | None = None

    def __post_init__(self) -> None:
        if not (self.flops > 0 and self.bytes > 0):
            raise ValueError(f"{self.name}: flops and bytes must be positive, got {self.flops!r} and {self.bytes!r}")

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def ridge(self) -> float:
        return self.peak_flops / self.bandwidth

    @property
    def verdict(self) -> str:
        return COMPUTE_BOUND if self.intensity >= self.ridge else MEMORY_BOUND

    @property
    def attainable(self) -> float:
        """The roof above this layer: min(peak FLOP/s, bandwidth * intensity)."""
        return min(self.peak_flops, self.bandwidth * self.intensity)

    @property
    def min_seconds(self) -> float:
        """The fastest this layer can run on the roof."""
        return self.flops / self.attainable

    @property
    def achieved(self) -> float | None:
        return self.flops / self.seconds if self.seconds else None

    def to_dict(self) -> dict[str, Any]:
        """One entry of the `roofline.layers` list of a results file."""
        return {"name": self.name, "flops": float(self.flops), "bytes": float(self.bytes), "verdict": self.verdict}


def point(name: str, flops: float, nbytes: float, peaks: DevicePeaks,
          dtype: torch.dtype | str = torch.float32, seconds: float | None = None) -> LayerPoint:
    """A LayerPoint from raw numbers (a layer measured elsewhere, or a synthetic one)."""
    return LayerPoint(name, flops, nbytes, peaks.peak_flops(dtype), peaks.bandwidth, seconds)


def roofline_verdicts(model: nn.Module, input_shape: Sequence[int], peaks: DevicePeaks,
                      dtype: torch.dtype | str = torch.float32) -> list[LayerPoint]:
    """Each conv/linear layer of `model` at `input_shape` against `peaks` (in `dtype`), with its verdict."""
    return [point(c.name, c.flops, c.bytes, peaks, dtype) for c in layer_intensity(model, input_shape, dtype)]


def verdict_table(points: Sequence[LayerPoint]) -> str:
    rows = [(p.name, format_count(p.flops, "FLOP"), format_count(p.bytes, "B"), f"{p.intensity:.1f}",
             p.verdict, format_count(p.attainable, "FLOP/s")) for p in points]
    return _table(("layer", "flops", "bytes", "FLOP/B", "verdict", "roof"), rows)


# Points within a factor 10**(1/8) (about 1.33x) of each other in both axes share one label.
_LABEL_BINS = 8


def _y(p: LayerPoint) -> float:
    return p.achieved or p.attainable


def plot_roofline(points: Sequence[LayerPoint], peaks: DevicePeaks, ax: Any = None,
                  dtype: torch.dtype | str = torch.float32, max_labels: int = 6) -> Any:
    """Draw the roof of `peaks` (log-log), its ridge, and `points` coloured by verdict.

    Points sit at their achieved FLOP/s when measured, else on the roof (hollow). The `max_labels`
    layers with the most FLOPs are named. Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    peak, bw = peaks.peak_flops(dtype), peaks.bandwidth
    ridge = peak / bw
    intensities = [p.intensity for p in points] + [ridge]
    x = torch.logspace(math.log10(min(intensities) / 4), math.log10(max(intensities) * 4), 200).tolist()
    ax.loglog(x, [min(peak, bw * i) for i in x], color="black", linewidth=2,
              label=f"roof: {format_count(peak, 'FLOP/s')}, {format_count(bw, 'B/s')}")
    ax.axvline(ridge, color="0.4", linestyle="--", linewidth=1)
    ax.text(ridge, 0.03, f" ridge {ridge:.1f} FLOP/B", transform=ax.get_xaxis_transform(), fontsize=9,
            color="0.3", ha="left", va="bottom")
    for verdict, (colour, marker) in _VERDICT_STYLE.items():
        chosen = [p for p in points if p.verdict == verdict]
        if not chosen:
            continue
        measured = [p.achieved is not None for p in chosen]
        ax.scatter([p.intensity for p in chosen], [_y(p) for p in chosen], marker=marker, s=44,
                   linewidths=1.5, edgecolors=colour, facecolors=[colour if m else "none" for m in measured],
                   label=f"{verdict} ({len(chosen)})", zorder=3)
    # Layers of the same shape land on (nearly) the same spot: label each spot once, "name +k".
    spots: dict[tuple[float, float], list[LayerPoint]] = {}
    for p in points:
        spot = (round(math.log10(p.intensity) * _LABEL_BINS), round(math.log10(_y(p)) * _LABEL_BINS))
        spots.setdefault(spot, []).append(p)
    busiest = sorted(spots.values(), key=lambda group: -sum(p.flops for p in group))[:max_labels]
    for i, group in enumerate(sorted(busiest, key=lambda group: group[0].intensity)):
        text = group[0].name + (f" +{len(group) - 1}" if len(group) > 1 else "")
        ax.annotate(text, (group[0].intensity, _y(group[0])), xytext=(4, 6 if i % 2 else -12),
                    textcoords="offset points", fontsize=8)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel(f"FLOP/s ({_dtype_key(dtype)})")
    ax.set_title(f"Roofline: {peaks.name}")
    ax.grid(True, which="major", linestyle=":", linewidth=0.6)
    ax.legend(fontsize=8, loc="upper left")  # the roof leaves that corner empty
    return ax
