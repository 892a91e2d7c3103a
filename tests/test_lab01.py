"""Lab 1 — Measure first: the notebook autogrades honestly, and its checks reject wrong answers."""

from __future__ import annotations

import time

import labs_helpers as H
import numpy as np
import pytest
import torch
from torch import nn

from perflab.labs import lab01
from perflab.labs.hidden import lab01 as hidden01

LAB = lab01.LAB
MANUAL = {"answer_timing", "answer_profilers", "answer_bottleneck"}


# ---------------------------------------------------------------------------------------------
# The notebook, autograded for real (tiny mode)


@pytest.mark.slow
def test_solution_gets_full_autograded_marks(tiny_data) -> None:
    run = H.graded_solution(LAB)
    assert run.errors() == []
    short = {s.grade_id: (s.auto_score, s.max_score) for s in run.autograded if s.auto_score != s.max_score}
    assert short == {}, f"autograded cells below full marks: {short}"
    assert sum(s.max_score for s in run.autograded) == 83
    assert {s.grade_id for s in run.manual} == MANUAL
    assert all(s.needs_manual_grade for s in run.manual), "answered written cells wait for a person"


@pytest.mark.slow
def test_blank_copy_runs_and_scores_zero(tiny_data) -> None:
    run = H.graded_blank(LAB)
    assert len(run.scores) == len(H.graded_solution(LAB).scores)
    scored = {s.grade_id: s.auto_score for s in run.scores if s.auto_score}
    assert scored == {}, f"an unanswered notebook earned points: {scored}"
    assert all(not s.needs_manual_grade for s in run.manual), "unchanged written cells are scored 0 outright"
    assert any("NotImplementedError" in e for e in run.errors())


@pytest.mark.slow
def test_results_and_trace_written(tiny_data) -> None:
    from perflab import results
    from perflab.labs import common

    run = H.graded_solution(LAB)
    sections = results.load(common.results_path(LAB, run.folder))["sections"]
    assert {"counts", "memory_budget", "roofline", "top_ops", "phases", "bottleneck", "baseline"} <= set(sections)
    assert sections["counts"]["parameters"] > 11_000_000
    lab01.check_trace(common.results_path(LAB, run.folder).with_suffix(".trace.json"), 2)


# ---------------------------------------------------------------------------------------------
# The checks fail wrong answers (so a pass means something)


def _timer_without_sync(fn, warmup=3, repeats=20, clock=time.perf_counter, sync=None):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = clock()
        fn()
        samples.append(clock() - start)
    p = np.percentile(samples, [25, 50, 75, 95, 99])
    return {"samples": samples, "median": p[1], "p95": p[3], "p99": p[4], "spread": (p[2] - p[0]) / p[1]}


def test_timer_that_forgets_sync_fails() -> None:
    with pytest.raises(AssertionError, match="sync"):
        hidden01.check_time_callable(_timer_without_sync, seed=1)


def test_fake_device_charges_queued_work_at_sync() -> None:
    dev = lab01.FakeDevice(launch=0.5)
    fn = dev.work([2.0, 3.0])
    fn()
    assert dev.clock() == 0.5
    dev.sync()
    assert dev.clock() == 2.5
    fn()
    dev.sync()
    assert dev.clock() == 6.0 and dev.syncs == 2
    with pytest.raises(AssertionError, match="more than the 2 times"):
        fn()


def test_conv_formula_ignoring_groups_and_dilation_fails() -> None:
    def naive(conv, shape):
        n, c, h, w = shape
        k, s, p = conv.kernel_size[0], conv.stride[0], conv.padding[0]
        out = (h + 2 * p - k) // s + 1
        return 2 * n * conv.out_channels * out * out * c * k * k

    with pytest.raises(AssertionError, match="FlopCounterMode counts"):
        hidden01.check_conv2d_flops(naive, seed=2)


def test_leaky_preprocessing_fails_and_reset_frees_it() -> None:
    with pytest.raises(AssertionError, match="still kept"):
        lab01.check_preprocess_fixed(lab01.preprocess_leaky, seed=3)
    lab01.reset_leak()
    assert lab01.reset_leak() == 0


def test_leak_finder_that_returns_the_wrong_line_fails() -> None:
    def first_line(fn, make_input, calls=50):
        return fn.__code__.co_filename, fn.__code__.co_firstlineno

    with pytest.raises(AssertionError, match="keeps what line"):
        hidden01.check_find_leak(first_line, seed=4)


def test_memory_budget_counting_saved_tensors_twice_fails() -> None:
    def no_dedup(model, optimizer, input_shape):
        params = list(model.parameters())
        nbytes = sum(p.numel() * p.element_size() for p in params)
        grads = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                      lambda t: t):
            model(torch.randn(input_shape))
        return {"parameters": nbytes, "gradients": grads,
                "optimizer": {"sgd": 0, "sgd-momentum": 1, "adam": 2}[optimizer] * grads, "activations": sum(saved)}

    with pytest.raises(AssertionError, match="activations"):
        hidden01.check_memory_budget(no_dedup, seed=5)


def test_roofline_verdict_with_the_ridge_upside_down_fails() -> None:
    def flipped(flops, nbytes, peak, bandwidth):
        intensity = flops / nbytes
        return ("memory-bound" if intensity >= peak / bandwidth else "compute-bound"), min(peak, bandwidth * intensity)

    with pytest.raises(AssertionError, match="you said"):
        hidden01.check_roofline_verdict(flipped, seed=6)


def test_bottleneck_reference_accepts_both_answers_near_a_threshold() -> None:
    layers = [{"flops": 1e9, "bytes": 1e7}]
    near = {"data": lab01.DATA_SHARE + 0.01, "forward": 1 - lab01.DATA_SHARE - 0.01}
    far = {"data": 0.9, "forward": 0.1}
    assert hidden01.reference_verdict(near, layers, 1e11, 1e10)["stages_accepted"] == ("data", "model")
    assert hidden01.reference_verdict(far, layers, 1e11, 1e10)["stages_accepted"] == ("data",)

    def always_model(phase_seconds, layers, peak_flops, peak_bandwidth):
        return {"stage": "model", "bound": "compute"}

    measured = {"phase_seconds": far, "layers": layers, "peak_flops": 1e11, "peak_bandwidth": 1e10}
    with pytest.raises(AssertionError, match="the stage is data, you said model"):
        hidden01.check_bottleneck_here(always_model, None, measured=measured)


def test_layer_calls_sees_every_conv_and_linear_of_resnet18() -> None:
    import torchvision

    model = torchvision.models.resnet18(num_classes=10)
    calls = lab01.layer_calls(model, (2, 3, 32, 32))
    assert len(calls) == 21  # 20 convolutions (3 of them 1x1 downsamples) and the fc layer
    assert calls[0].name == "conv1" and calls[0].input_shape == (2, 3, 32, 32)
    assert calls[-1].name == "fc" and isinstance(calls[-1].module, nn.Linear) and calls[-1].input_shape == (2, 512)
    assert model.training, "layer_calls restores the model's mode"
