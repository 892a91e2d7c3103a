"""Roofline: spec table, measured peaks, layer intensity and verdicts, the plot."""

from __future__ import annotations

import io
import math

import matplotlib
import pytest
import torch
import torchvision
from torch import nn

from perflab import roofline

matplotlib.use("Agg")

TOY = roofline.DevicePeaks("toy", {"float32": 1e12, "bfloat16": 4e12}, 1e11, "spec")  # ridge 10 FLOP/B


def test_verdict_flips_at_the_ridge() -> None:
    assert TOY.ridge() == pytest.approx(10.0)
    below = roofline.point("below", 9.9e6, 1e6, TOY)
    at = roofline.point("at", 10e6, 1e6, TOY)
    above = roofline.point("above", 10.1e6, 1e6, TOY)
    assert below.verdict == roofline.MEMORY_BOUND
    assert at.verdict == above.verdict == roofline.COMPUTE_BOUND
    assert below.attainable == pytest.approx(9.9e11)
    assert above.attainable == at.attainable == 1e12
    assert below.min_seconds == pytest.approx(1e-5)
    # A faster dtype moves the ridge right: the same layer becomes memory-bound.
    assert roofline.point("above", 10.1e6, 1e6, TOY, "bf16").verdict == roofline.MEMORY_BOUND
    assert above.to_dict() == {"name": "above", "flops": 10.1e6, "bytes": 1e6, "verdict": "compute-bound"}


def test_spec_table_lookup() -> None:
    h100 = roofline.lookup_peaks("NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100.name == "NVIDIA H100 SXM"
    assert h100.peak_flops(torch.bfloat16) == 989.5e12 and h100.bandwidth == 3.35e12
    expected = {
        "NVIDIA H100 PCIe": "NVIDIA H100 PCIe",
        "NVIDIA H200": "NVIDIA H200 SXM",
        "NVIDIA A100-SXM4-80GB": "NVIDIA A100 80GB SXM",
        "NVIDIA A100-SXM4-40GB": "NVIDIA A100 40GB",
        "NVIDIA A100 80GB PCIe": "NVIDIA A100 80GB PCIe",
        "NVIDIA L4": "NVIDIA L4",
        "Tesla T4": "NVIDIA T4",
        "NVIDIA GeForce RTX 4090": "NVIDIA GeForce RTX 4090",
        "Tesla V100-SXM2-16GB": "NVIDIA V100 SXM2",
        "NVIDIA A10": "NVIDIA A10",
    }
    for device_name, table_name in expected.items():
        found = roofline.lookup_peaks(device_name)
        assert found is not None and found.name == table_name, device_name
    assert roofline.lookup_peaks("NVIDIA A10G") is None  # a different chip from the A10
    assert roofline.lookup_peaks("AMD Instinct MI300X") is None
    a100 = roofline.lookup_peaks("NVIDIA A100-PCIE-40GB")
    assert a100 is not None and a100.ridge("bf16") == pytest.approx(312e12 / 1555e9)
    for gpu in roofline.known_gpus():  # dense tensor rates are never below plain FP32
        assert all(gpu.flops[k] >= gpu.flops["float32"] for k in gpu.flops), gpu.name


def test_missing_dtype_is_named() -> None:
    t4 = roofline.lookup_peaks("Tesla T4")
    assert t4 is not None
    with pytest.raises(ValueError, match="bfloat16"):
        t4.peak_flops(torch.bfloat16)
    with pytest.raises(ValueError, match="bandwidth"):
        roofline.DevicePeaks("bad", {"float32": 1.0}, 0.0, "spec")


def test_measured_cpu_peaks_are_positive_and_finite() -> None:
    peaks = roofline.measure_peaks("cpu", torch.float32)
    assert peaks.source == "measured" and peaks.benchmark is not None
    for value in (peaks.peak_flops(torch.float32), peaks.bandwidth, peaks.ridge()):
        assert value > 0 and math.isfinite(value)
    assert len(peaks.benchmark.matmul_seconds) >= 3 and len(peaks.benchmark.copy_seconds) >= 3
    assert "float32" in peaks.table()
    bench = peaks.benchmark  # the roof is the faster of the kernels a CNN uses, not the matmul alone
    assert len(bench.conv_seconds) >= 3 and bench.conv_flops_per_s > 0
    assert peaks.peak_flops() == max(bench.matmul_flops_per_s, bench.conv_flops_per_s)
    assert "3x3 conv" in str(bench)


def test_a_layer_above_its_roof_raises_the_peak_not_the_student() -> None:
    peaks = roofline.DevicePeaks("cpu", {"float32": 100e9}, 10e9, "measured")
    fast = roofline.point("conv", 1e9, 1e6, peaks, seconds=1e9 / 180e9)  # 180 GFLOP/s under a 100 roof
    copy = roofline.point("add", 1e6, 1e7, peaks, seconds=1e7 / 25e9)  # 25 GB/s under a 10 roof
    slow = roofline.point("fc", 1e9, 1e7, peaks, seconds=1.0)
    raised, points = roofline.raised_to_fit(peaks, [fast, copy, slow])
    assert raised.peak_flops() == pytest.approx(180e9) and raised.bandwidth == pytest.approx(25e9)
    assert "raised" in raised.source
    assert all(p.achieved <= p.attainable * (1 + 1e-12) for p in points)
    assert roofline.raised_to_fit(raised, points)[0] is raised  # nothing above the roof: unchanged


def test_layer_intensity_of_one_conv() -> None:
    conv = nn.Conv2d(3, 8, 3, padding=1)
    (cost,) = roofline.layer_intensity(conv, (1, 3, 16, 16), torch.float32)
    flops = 2 * 8 * 16 * 16 * 3 * 3 * 3
    moved = (3 * 16 * 16 + 8 * 3 * 3 * 3 + 8 + 8 * 16 * 16) * 4
    assert (cost.flops, cost.bytes) == (flops, moved)
    assert cost.intensity == pytest.approx(flops / moved)
    (half,) = roofline.layer_intensity(conv, (1, 3, 16, 16), torch.bfloat16)
    assert half.bytes * 2 == moved


def test_resnet18_verdicts_on_a_known_gpu() -> None:
    model = torchvision.models.resnet18(weights=None, num_classes=1000)
    h100 = roofline.lookup_peaks("NVIDIA H100 80GB HBM3")
    assert h100 is not None
    points = roofline.roofline_verdicts(model, (1, 3, 224, 224), h100, torch.bfloat16)
    assert len(points) == 21  # 20 convolutions and the classifier
    by_name = {p.name: p for p in points}
    assert by_name["fc"].verdict == roofline.MEMORY_BOUND  # a matrix-vector product at batch 1
    assert by_name["fc"].intensity == pytest.approx(1.0, rel=0.01)
    assert sum(p.flops for p in points) == 3_628_146_688
    assert {p.verdict for p in points} == {roofline.MEMORY_BOUND, roofline.COMPUTE_BOUND}
    assert "layer4.1.conv2" in roofline.verdict_table(points)


def test_plot_roofline_draws_a_log_log_roof_with_its_ridge() -> None:
    points = [roofline.point(f"l{i}", 10.0 ** (5 + i / 2), 1e6, TOY) for i in range(6)]
    points.append(roofline.point("measured", 5e7, 1e6, TOY, seconds=1e-3))
    ax = roofline.plot_roofline(points, TOY)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert any(list(line.get_xdata()) == [10.0, 10.0] for line in ax.get_lines()), "ridge line missing"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(text.startswith("compute-bound") for text in legend)
    assert any(text.startswith("memory-bound") for text in legend)
    buffer = io.BytesIO()
    ax.figure.savefig(buffer, format="png")
    assert buffer.getvalue()[:4] == b"\x89PNG"
    import matplotlib.pyplot as plt

    plt.close(ax.figure)
