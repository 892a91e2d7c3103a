"""Lab 1 — Measure first: the notebook autogrades honestly, and its checks reject wrong answers."""

from __future__ import annotations

import re
import time
from typing import Any

import labs_helpers as H
import numpy as np
import pytest
import torch
from torch import nn

from perflab.grading import judging
from perflab.grading.probing import run_probes
from perflab.labs import lab01
from perflab.labs.lab01 import checks as lab01_checks
from perflab.labs.lab01 import judges as hidden01
from perflab.labs.lab01 import probes as lab01_probes

LAB = lab01.LAB


# ---------------------------------------------------------------------------------------------
# The notebook, autograded for real (tiny mode)


@pytest.mark.slow
def test_results_and_trace_written(tiny_data) -> None:
    from perflab import results
    from perflab.labs import common

    run = H.graded_solution(LAB)
    sections = results.load(common.results_path(LAB, run.folder))["sections"]
    assert {"counts", "memory_budget", "roofline", "top_ops", "phases", "bottleneck", "baseline"} <= set(sections)
    assert sections["counts"]["parameters"] > 11_000_000
    lab01_checks.check_trace(common.results_path(LAB, run.folder).with_suffix(".trace.json"), 2)


def test_no_layer_is_shown_above_its_roof(tiny_data) -> None:
    """On any machine the roofline table the student reads puts every layer at or below 100% of its roof:
    a layer faster than the micro-benchmarks raises the peak before the table is printed."""
    run = H.graded_solution(LAB)
    text = "".join(o.get("text", "") for c in run.notebook.cells for o in c.get("outputs", [])
                   if "roofline.measure_peaks" in c.source)
    shares = [int(m) for m in re.findall(r"achieved +[\d.]+ GFLOP/s \((\d+)%\)", text)]
    assert len(shares) == 6 and max(shares) <= 100, text


# ---------------------------------------------------------------------------------------------
# The grading contract: a probe per autograded cell returns raw outputs, a grader-side judge decides

SOLUTION_CELLS = ("time_callable", "counting", "memory_budget", "find_leak", "profile_training", "roofline",
                  "bottleneck_verdict")
PREAMBLE = """
import cProfile, inspect, io, math, pstats, time, tracemalloc
import numpy as np
import torch
from torch import nn
from torch.profiler import ProfilerActivity, record_function
from perflab import counting, dataset, env, memory, phases, roofline, timing, workload
from perflab.labs import common, lab01
from perflab.labs.lab01 import FakeDevice
"""
# Cells whose judge needs more than a pure function: a training run (the profiler), the grader's own
# measurement, or files the notebook writes.
# The mystery pipeline's cells are tested in tests/test_mystery.py.
HEAVY = {"profile_training_hidden", "profile_training_visible", "bottleneck_here", "mystery_diagnosis", "mystery_fix",
         "mystery_trace"}


@pytest.fixture(scope="module")
def solution() -> dict[str, Any]:
    """The reference answers: the solution notebook's answer cells, run here."""
    namespace: dict[str, Any] = {}
    exec(PREAMBLE, namespace)
    for cell in H.source_cells(LAB):
        if H.nbgrader_meta(cell).get("grade_id") in SOLUTION_CELLS:
            exec(compile(cell.source, f"<{LAB} solution>", "exec"), namespace)
    return namespace


def _mark(grade_id: str, namespace: dict[str, Any], seed: int = 11, judge_seed: int | None = None) -> judging.Mark:
    observations = run_probes({grade_id: lab01_probes.PROBES[grade_id]}, namespace, seed)
    ctx = judging.Context(LAB, seed if judge_seed is None else judge_seed, "tiny", observations)
    return judging.judge_cell(grade_id, hidden01.JUDGES[grade_id], ctx)


def test_every_autograded_code_cell_has_a_probe_and_a_judge() -> None:
    cells = {H.nbgrader_meta(c)["grade_id"] for c in H.grade_cells(LAB)
             if c.cell_type == "code" and not H.nbgrader_meta(c).get("solution")}
    assert set(lab01_probes.PROBES) == set(hidden01.JUDGES) == cells


@pytest.mark.parametrize("grade_id", sorted(set(lab01_probes.PROBES) - HEAVY))
def test_reference_answers_pass_every_judge(solution: dict[str, Any], grade_id: str) -> None:
    for seed in (11, 12):
        mark = _mark(grade_id, solution, seed)
        assert mark.fraction == 1.0, (grade_id, seed, mark.message)


def test_bottleneck_here_reads_the_students_verdict_at_the_graders_measurement(solution, monkeypatch) -> None:
    far = {"data": 0.9, "h2d": 0.0, "forward": 0.05, "backward": 0.04, "optimizer": 0.01}
    config = lab01.lab_config("tiny")
    layers = lab01_checks.lab_layers(config)
    measured = {"phase_seconds": far, "layers": layers, "peak_flops": 1e11, "peak_bandwidth": 1e10}
    monkeypatch.setattr(hidden01, "machine_measurement", lambda mode: measured)
    assert _mark("bottleneck_here", solution).fraction == 1.0

    def always_model(phase_seconds, layers, peak_flops, peak_bandwidth):
        return {"stage": "model", "bound": "compute"}

    mark = _mark("bottleneck_here", {"bottleneck_verdict": always_model})
    assert mark.fraction == 0.0 and "the stage is data, you said model" in mark.message


def test_the_grader_measures_the_machine_once_per_grading_run(monkeypatch) -> None:
    from perflab.verify import protocol

    calls = []
    # The kit's own memo, not the suite's (tests/conftest.py keeps the machine's measurement per session).
    monkeypatch.setattr(protocol, "once_per_run", getattr(protocol.once_per_run, "__wrapped__", protocol.once_per_run))
    monkeypatch.setattr(hidden01, "grader_measurement", lambda config, steps=3: calls.append(config) or {"n": 1})
    with protocol.shared_measurements():
        assert hidden01.machine_measurement("tiny") is hidden01.machine_measurement("tiny")
        hidden01.machine_measurement("grade")
    assert [c.image_size for c in calls] == [lab01.lab_config("tiny").image_size, lab01.lab_config("grade").image_size]
    hidden01.machine_measurement("tiny")  # outside a grading run (a solution notebook's own check): measured again
    assert len(calls) == 3


def test_the_machine_is_measured_again_once_quiet_where_other_work_shared_its_cores(caplog) -> None:
    """Every student's verdict is judged against one measurement of the machine: one that another program
    shared the cores of is taken again once the machine is quiet. Here the other program is a real one,
    outside the grader's own processes, busy on a core until the first measurement ends."""
    import os
    import signal
    import subprocess
    import sys

    from perflab.verify import machine_load

    program = ("import os, time\nif os.fork():\n    os._exit(0)\nprint(os.getpid(), flush=True)\n"
               "end = time.time() + 60\nwhile time.time() < end:\n    pass\n")
    starter = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    busy = int(starter.stdout.readline())  # an orphan: not the grader's child, so its load is other work
    starter.wait()
    calls: list[int] = []

    def measure() -> int:
        calls.append(len(calls))
        time.sleep(0.6)
        if len(calls) == 1:
            os.kill(busy, signal.SIGKILL)
        return len(calls)

    try:
        with caplog.at_level("WARNING"):
            assert machine_load.measured_when_quiet(measure, "lab 1's grader measured the machine") == 2
    finally:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.kill(busy, signal.SIGKILL)
    assert "busy with other work while lab 1's grader measured the machine" in caplog.text


def test_a_grading_run_measures_the_machine_before_its_first_notebook_and_survives_a_failure(monkeypatch,
                                                                                          caplog) -> None:
    """`judging.warm_up`, which a grading run calls before its first notebook: lab 1's machine measurement
    is taken then (into the run's memo the judges read), and where preparing fails the run goes on (the
    judges meet the fault per cell, and say so there)."""
    from perflab.labs.lab01.judges import mystery
    from perflab.verify import protocol

    monkeypatch.setattr(protocol, "once_per_run", getattr(protocol.once_per_run, "__wrapped__", protocol.once_per_run))
    calls = []
    monkeypatch.setattr(hidden01, "grader_measurement", lambda config, steps=3: calls.append(config) or {"n": 1})
    monkeypatch.setattr(mystery, "warm_up", lambda: calls.append("server"))
    with protocol.shared_measurements():
        judging.warm_up(lab01.LAB, "tiny")
        assert hidden01.machine_measurement("tiny") == {"n": 1}
    assert [c if c == "server" else c.image_size for c in calls] == [lab01.lab_config("tiny").image_size, "server"]

    def broken(config, steps=3):
        raise RuntimeError("CUDA error: no kernel image is available")

    monkeypatch.setattr(hidden01, "grader_measurement", broken)
    with caplog.at_level("WARNING"):
        judging.warm_up(lab01.LAB, "tiny")
    assert "preparing its judges failed (RuntimeError: CUDA error" in caplog.text


def test_bottleneck_reference_accepts_both_answers_near_a_threshold() -> None:
    layers = [{"flops": 1e9, "bytes": 1e7}]
    near = {"data": lab01.DATA_SHARE + 0.01, "forward": 1 - lab01.DATA_SHARE - 0.01}
    far = {"data": 0.9, "forward": 0.1}
    assert hidden01.reference_verdict(near, layers, 1e11, 1e10)["stages_accepted"] == ("data", "model")
    assert hidden01.reference_verdict(far, layers, 1e11, 1e10)["stages_accepted"] == ("data",)


def test_profile_training_probe_and_judges(solution, tiny_data, tmp_path) -> None:
    mark = _mark("profile_training_hidden", solution)
    assert mark.fraction == 1.0, mark.message
    trace = tmp_path / "t.trace.json"
    solution["profile_training"](lab01.lab_config("tiny"), 1, trace)
    assert _mark("profile_training_visible", {"TRACE": trace, "ACTIVE": 1}).fraction == 1.0
    mark = _mark("profile_training_visible", {"TRACE": trace, "ACTIVE": 2})
    assert mark.fraction == 0.0 and "profiler steps" in mark.message
    mark = _mark("profile_training_visible", {"TRACE": tmp_path / "none.json", "ACTIVE": 1})
    assert mark.fraction == 0.0 and "no trace" in mark.message


@pytest.mark.parametrize("grade_id", ["time_callable_hidden", "counting_hidden_layers", "memory_budget_hidden",
                                      "find_leak_hidden",
                                      "roofline_hidden", "bottleneck_rule_hidden"])
def test_forged_observations_earn_nothing(solution: dict[str, Any], grade_id: str) -> None:
    judge = hidden01.JUDGES[grade_id]
    for forged in ({"problems": []}, True, {"verdict": "pass"}, [], None):
        ctx = judging.Context(LAB, 11, "tiny", {grade_id: {"observed": forged}})
        assert judging.judge_cell(grade_id, judge, ctx).fraction == 0.0, forged
    assert _mark(grade_id, solution, seed=11, judge_seed=12).fraction == 0.0, "outputs for another seed"


@pytest.mark.parametrize("grade_id", sorted(lab01_probes.PROBES))
def test_missing_answers_earn_nothing(grade_id: str) -> None:
    mark = _mark(grade_id, {})
    assert mark.fraction == 0.0 and "the notebook defines no" in mark.message


# ---------------------------------------------------------------------------------------------
# The judges fail wrong answers (so a pass means something)


def _fails(grade_id: str, namespace: dict[str, Any], match: str) -> None:
    with pytest.raises(AssertionError, match=match):
        hidden01.check(grade_id, namespace, seed=1)


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
    _fails("time_callable_hidden", {"time_callable": _timer_without_sync}, "sync")
    _fails("time_callable_visible", {"time_callable": _timer_without_sync}, "sync")


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
    assert "".join(dev.log) == "ctstcst", dev.log
    with pytest.raises(AssertionError, match="more than the 2 times"):
        fn()


def test_conv_formula_ignoring_groups_and_dilation_fails(solution: dict[str, Any]) -> None:
    def naive(conv, shape):
        n, c, h, w = shape
        k, s, p = conv.kernel_size[0], conv.stride[0], conv.padding[0]
        out = (h + 2 * p - k) // s + 1
        return 2 * n * conv.out_channels * out * out * c * k * k

    _fails("counting_hidden_layers", {**solution, "conv2d_flops": naive}, "FlopCounterMode counts")


def test_leaky_preprocessing_fails_and_reset_frees_it() -> None:
    with pytest.raises(AssertionError, match="still kept"):
        lab01_checks.check_preprocess_fixed(lab01.preprocess_leaky, seed=3)
    lab01.reset_leak()
    _fails("preprocess_fixed_check", {"preprocess_fixed": lab01.preprocess_leaky}, "still kept")
    lab01.reset_leak()
    assert lab01.reset_leak() == 0


def test_leak_finder_that_returns_the_wrong_line_fails() -> None:
    def first_line(fn, make_input, calls=50):
        return fn.__code__.co_filename, fn.__code__.co_firstlineno

    _fails("find_leak_hidden", {"find_leak": first_line}, "keeps what line")


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

    _fails("memory_budget_hidden", {"training_memory_budget": no_dedup}, "activations")


def test_roofline_verdict_with_the_ridge_upside_down_fails(solution: dict[str, Any]) -> None:
    def flipped(flops, nbytes, peak, bandwidth):
        intensity = flops / nbytes
        return ("memory-bound" if intensity >= peak / bandwidth else "compute-bound"), min(peak, bandwidth * intensity)

    _fails("roofline_hidden", {**solution, "roofline_verdict": flipped}, "you said")
    _fails("roofline_visible", {**solution, "roofline_verdict": flipped}, "you said")


def test_bottleneck_rule_without_the_copy_threshold_fails(solution: dict[str, Any]) -> None:
    def no_copy(phase_seconds, layers, peak_flops, peak_bandwidth):
        got = solution["bottleneck_verdict"](phase_seconds, layers, peak_flops, peak_bandwidth)
        total = sum(phase_seconds.values())
        return {**got, "stage": "data" if phase_seconds.get("data", 0) / total >= lab01.DATA_SHARE else "model"}

    _fails("bottleneck_rule_hidden", {"bottleneck_verdict": no_copy}, "expected")


def test_layer_calls_sees_every_conv_and_linear_of_resnet18() -> None:
    import torchvision

    model = torchvision.models.resnet18(num_classes=10)
    calls = lab01.layer_calls(model, (2, 3, 32, 32))
    assert len(calls) == 21  # 20 convolutions (3 of them 1x1 downsamples) and the fc layer
    assert calls[0].name == "conv1" and calls[0].input_shape == (2, 3, 32, 32)
    assert calls[-1].name == "fc" and isinstance(calls[-1].module, nn.Linear) and calls[-1].input_shape == (2, 512)
    assert model.training, "layer_calls restores the model's mode"


def test_the_model_flops_reference_handles_a_batch_of_one_at_32_px() -> None:
    # A grade seed may draw batch 1 at 32 px: ResNet-18's last stage is then 1x1, which BatchNorm
    # cannot normalise in train mode; the reference counts in eval mode (the same FLOPs).
    seed = next(s for s in range(10_000) if lab01_checks.model_flops_case(s)["shape"][:1] == [1]
                and lab01_checks.model_flops_case(s)["shape"][2] == 32)
    case = lab01_checks.model_flops_case(seed)
    resnet = lab01_checks.build_flops_models(case)[0]
    assert hidden01._flop_counter(resnet, torch.zeros(case["shape"])) > 0
    assert resnet.training, "the model comes back in the mode it was in"
