"""The Profiler façade on a small model: each method agrees with closed forms and leaves the model as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from perflab import roofline, timing
from perflab.profiler import Profiler

SHAPE = (2, 3, 16, 16)
# conv 3->8 3x3 (216 weights + 8 bias), BatchNorm 8 (16), Linear 8->4 (32 + 4).
PARAMS = 216 + 8 + 16 + 36
CONV_FLOPS = 2 * 2 * 8 * 16 * 16 * 3 * 9  # 2 * N * C_out * H * W * C_in * kH * kW
LINEAR_FLOPS = 2 * 2 * 8 * 4


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


@pytest.fixture
def profiler() -> Profiler:
    return Profiler(warmup=1, repeats=5)


def test_parameters_and_flops_match_the_closed_forms(profiler: Profiler) -> None:
    model = small_model()
    assert profiler.count_parameters(model) == PARAMS
    flops = profiler.count_flops(model, SHAPE)
    assert flops.forward == CONV_FLOPS + LINEAR_FLOPS
    # Backward: the first conv only needs its weight gradient (1x), the linear layer 2x.
    assert flops.train == flops.forward + CONV_FLOPS + 2 * LINEAR_FLOPS


def test_measurements_leave_the_model_untouched(profiler: Profiler) -> None:
    model = small_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profiler.measure_latency(model, SHAPE, train=True)
    profiler.profile_backward_pass(model, SHAPE)
    profiler.quick_profile(model, SHAPE)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "BatchNorm statistics or weights moved"
    assert all(p.grad is None for p in model.parameters())


def test_memory_budget_counts_static_memory_exactly(profiler: Profiler) -> None:
    report = profiler.measure_memory(small_model(), SHAPE, optimizer="adam", peak=False)
    assert report.budget.parameters == PARAMS * 4
    assert report.budget.gradients == PARAMS * 4
    assert report.budget.optimizer_state >= 2 * PARAMS * 4  # exp_avg and exp_avg_sq (+ step counters)
    assert report.budget.activations > 0
    assert report.peak is None and "peak" not in report.to_dict()


@pytest.mark.slow
def test_peak_memory_of_a_pass_is_measured_in_a_child_on_cpu(profiler: Profiler) -> None:
    report = profiler.measure_memory(small_model(), (64, 3, 64, 64), peak=True)
    assert report.peak is not None
    assert report.peak.peak_bytes >= report.peak.baseline_bytes > 0
    assert report.to_dict()["peak"] == report.peak.peak_bytes


def test_latency_is_a_measurement_of_the_asked_calls(profiler: Profiler) -> None:
    measured = profiler.measure_latency(small_model(), SHAPE, repeats=7)
    assert isinstance(measured, timing.Measurement)
    assert measured.n == 7 and measured.median > 0 and "forward" in measured.label


def test_layer_profile_gives_flops_bytes_intensity_and_verdict(profiler: Profiler) -> None:
    layer = nn.Linear(64, 32)
    peaks = roofline.DevicePeaks("test device", {"float32": 1e12}, 1e11, "spec")  # ridge: 10 FLOP/B
    result = profiler.profile_layer(layer, (4, 64), name="fc", peaks=peaks)
    assert result.flops == 2 * 4 * 64 * 32
    assert result.bytes == (4 * 64 + 64 * 32 + 32 + 4 * 32) * 4
    assert result.intensity == pytest.approx(result.flops / result.bytes)
    assert result.verdict == roofline.MEMORY_BOUND  # about 1.7 FLOP/B, far below the ridge
    assert result.parameters == 64 * 32 + 32 and result.latency.n == 5
    assert "fc on (4, 64)" in str(result)
    relu = profiler.profile_layer(nn.ReLU(), (4, 64))
    assert relu.flops == 0 and relu.bytes == 2 * 4 * 64 * 4 and relu.verdict is None


def test_forward_and_backward_pass_profiles(profiler: Profiler) -> None:
    model = small_model()
    fwd = profiler.profile_forward_pass(model, SHAPE)
    assert fwd.flops == CONV_FLOPS + LINEAR_FLOPS
    assert fwd.activation_bytes and fwd.activation_bytes > 0
    assert fwd.seconds == fwd.latency.median and fwd.flops_per_s > 0
    bwd = profiler.profile_backward_pass(model, SHAPE)
    assert bwd.flops == CONV_FLOPS + 2 * LINEAR_FLOPS
    assert bwd.forward_latency is not None
    assert bwd.seconds == pytest.approx(max(bwd.latency.median - bwd.forward_latency.median, 0.0))
    assert bwd.to_dict()["kind"] == "backward"


def test_quick_profile_is_a_dict_that_prints(profiler: Profiler) -> None:
    summary = profiler.quick_profile(small_model(), SHAPE)
    assert isinstance(summary, dict)
    assert summary["parameters"] == PARAMS
    assert summary["flops_forward"] == CONV_FLOPS + LINEAR_FLOPS
    assert summary["latency_ci_s"][0] <= summary["latency_s"] <= summary["latency_ci_s"][1]
    assert summary["samples_per_s"] == pytest.approx(SHAPE[0] / summary["latency_s"])
    text = str(summary)
    assert "parameters" in text and f"{PARAMS:,}" in text and "FLOP" in text


def test_weight_distribution_statistics_and_histograms(profiler: Profiler) -> None:
    layer = nn.Linear(10, 10)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(100, dtype=torch.float32).reshape(10, 10))
        layer.bias.zero_()
    report = profiler.analyze_weight_distribution(layer, plot=True)
    w = report.layer("weight")
    assert (w.numel, w.min, w.max, w.mean) == (100, 0.0, 99.0, pytest.approx(49.5))
    assert w.sparsity == pytest.approx(0.01)  # the single exact zero
    assert w.percentiles[50] == pytest.approx(49.5) and w.percentiles[25] == pytest.approx(24.75)
    assert report.layer("bias").sparsity == 1.0
    assert report.sparsity == pytest.approx(11 / 110)
    loose = profiler.analyze_weight_distribution(layer, zero_tolerance=4.5)
    assert loose.layer("weight").sparsity == pytest.approx(0.05)
    from matplotlib.figure import Figure

    assert isinstance(report.figure, Figure) and report.figure.axes
    assert "weight" in report.table()


def test_bad_input_shapes_are_refused(profiler: Profiler) -> None:
    with pytest.raises(ValueError, match="input_shape"):
        profiler.count_flops(small_model(), (2, 3, -16, 16))
