"""The bottleneck verdict on synthetic measurements: each rule, its threshold, and the next step it picks."""

from __future__ import annotations

import pytest

from perflab import diagnose as dg

# A step of 100 ms split by phase; each test moves time between phases.
COMPUTE_STEP = {"data": 0.05, "h2d": 0.0, "forward": 0.30, "backward": 0.55, "optimizer": 0.10}
DATA_STEP = {"data": 0.60, "h2d": 0.0, "forward": 0.15, "backward": 0.20, "optimizer": 0.05}

# Peaks of 1 TFLOP/s and 100 GB/s: the ridge point is at 10 FLOPs per byte.
PEAKS = {"peak_flops": 1e12, "peak_bandwidth": 1e11}


def roofline(*layers: tuple[str, float, float, str]) -> dict:
    return {**PEAKS, "layers": [{"name": n, "flops": f, "bytes": b, "verdict": v} for n, f, b, v in layers]}


COMPUTE_LAYERS = roofline(("conv1", 1e9, 1e6, "compute-bound"), ("bn1", 1e6, 1e6, "memory-bound"))
MEMORY_LAYERS = roofline(("conv1", 1e9, 1e6, "compute-bound"), ("bn1", 1e7, 1e9, "memory-bound"))


def test_data_bound_names_the_loader_and_suggests_workers() -> None:
    d = dg.diagnose(DATA_STEP, phase_top_ops={"data": "enumerate(DataLoader)#next"},
                    config={"num_workers": 0})
    assert d.verdict == dg.DATA
    assert d.component == "data"
    assert d.operation == "enumerate(DataLoader)#next"
    assert "--num-workers" in d.next_step and d.lab == "lab02"
    assert "60%" in d.reason


def test_data_bound_with_workers_on_cuda_suggests_gpu_augmentation() -> None:
    d = dg.diagnose(DATA_STEP, device="cuda", config={"num_workers": 8})
    assert d.verdict == dg.DATA and "--gpu-augment" in d.next_step


def test_data_share_just_below_threshold_is_not_data_bound() -> None:
    below = dg.DATA_BOUND_SHARE - 0.01
    phases = {"data": below, "forward": 0.3, "backward": 1 - below - 0.3}
    assert dg.diagnose(phases).verdict == dg.COMPUTE
    phases = {"data": dg.DATA_BOUND_SHARE + 0.01, "forward": 0.3, "backward": 0.69 - dg.DATA_BOUND_SHARE}
    assert dg.diagnose(phases).verdict == dg.DATA


def test_starved_gpu_makes_a_moderate_data_share_the_bottleneck() -> None:
    phases = {"data": 0.2, "h2d": 0.0, "forward": 0.3, "backward": 0.5}
    assert dg.diagnose(phases, device="cuda", gpu_utilization=0.95).verdict == dg.COMPUTE
    d = dg.diagnose(phases, device="cuda", gpu_utilization=0.30)
    assert d.verdict == dg.DATA and "30%" in d.reason
    assert d.to_dict()["gpu_utilization"] == 0.30


def test_copy_bound_suggests_pinned_memory_then_uint8() -> None:
    phases = {"data": 0.1, "h2d": 0.4, "forward": 0.2, "backward": 0.3}
    d = dg.diagnose(phases, device="cuda", config={"pin_memory": False})
    assert d.verdict == dg.COPY and d.component == "h2d" and "--pin-memory" in d.next_step
    d = dg.diagnose(phases, device="cuda", config={"pin_memory": True})
    assert "uint8" in d.next_step


def test_augment_bound_names_the_augmentation_not_the_copy() -> None:
    """The set on the device: nothing is copied, and the step's time goes to augmenting it there."""
    phases = {"data": 0.01, "h2d": 0.0, "augment": 0.36, "forward": 0.23, "backward": 0.37, "optimizer": 0.03}
    d = dg.diagnose(phases, device="cuda", phase_top_ops={"augment": "aten::grid_sampler_2d"},
                    config={"gpu_augment": True, "data_on_device": True})
    assert d.verdict == dg.AUGMENT and d.component == "augment" and d.operation == "aten::grid_sampler_2d"
    assert "augment" in d.reason and "36%" in d.reason and "host-to-device" not in d.reason
    assert "batch" in d.next_step and "pin" not in d.next_step and d.lab == "lab02"
    below = {**phases, "augment": dg.AUGMENT_BOUND_SHARE * 0.5}
    assert dg.diagnose(below, device="cuda").verdict == dg.COMPUTE


def test_an_old_file_with_augmentation_counted_in_h2d_says_so() -> None:
    phases = {"data": 0.01, "h2d": 0.36, "forward": 0.23, "backward": 0.37, "optimizer": 0.03}
    d = dg.diagnose(phases, device="cuda", config={"gpu_augment": True, "data_on_device": True})
    assert d.verdict == dg.COPY and "augment phase" in d.next_step


def test_compute_bound_names_the_dominant_phase_and_its_top_op() -> None:
    d = dg.diagnose(COMPUTE_STEP, roofline=COMPUTE_LAYERS,
                    phase_top_ops={"backward": "aten::convolution_backward", "forward": "aten::conv"},
                    config={"amp_dtype": None}, cpu_bf16=False)
    assert d.verdict == dg.COMPUTE
    assert d.component == "backward" and d.operation == "aten::convolution_backward"
    # No bf16 hardware on this CPU: mixed precision would promise a gain it cannot give.
    assert "--amp-dtype" not in d.next_step and d.lab == "lab05"


def test_compute_bound_suggests_amp_where_the_hardware_has_it() -> None:
    for kwargs in ({"device": "cuda"}, {"device": "cpu", "cpu_bf16": True}):
        d = dg.diagnose(COMPUTE_STEP, roofline=COMPUTE_LAYERS, **kwargs)
        assert d.verdict == dg.COMPUTE and "--amp-dtype" in d.next_step and d.lab == "lab03"
    done = {"amp_dtype": "bf16", "compile_mode": "default"}
    d = dg.diagnose(COMPUTE_STEP, roofline=COMPUTE_LAYERS, device="cuda", config=done)
    assert d.lab == "lab06"


def test_memory_bound_from_roofline_time_share() -> None:
    assert dg.memory_bound_time_share(COMPUTE_LAYERS) == pytest.approx(1e-5 / (1e-3 + 1e-5))
    # bn1 moves 1 GB at 100 GB/s (10 ms) against conv1's 1 ms of arithmetic.
    assert dg.memory_bound_time_share(MEMORY_LAYERS) == pytest.approx(10 / 11)
    d = dg.diagnose(COMPUTE_STEP, roofline=MEMORY_LAYERS, config={"channels_last": False})
    assert d.verdict == dg.MEMORY and d.component == "backward"
    assert "--channels-last" in d.next_step and d.lab == "lab03"
    d = dg.diagnose(COMPUTE_STEP, roofline=MEMORY_LAYERS, config={"channels_last": True})
    assert "--compile-mode" in d.next_step and d.lab == "lab05"


def test_ridge_point_decides_when_no_verdict_is_stored() -> None:
    layers = roofline(("a", 1e9, 1e6, ""), ("b", 1e7, 1e9, ""))
    assert dg.memory_bound_time_share(layers) == pytest.approx(10 / 11)


def test_optimizer_dominated_step_is_memory_bound() -> None:
    phases = {"data": 0.0, "forward": 0.2, "backward": 0.3, "optimizer": 0.5}
    d = dg.diagnose(phases, config={"accumulation_steps": 1})
    assert d.verdict == dg.MEMORY and d.component == "optimizer" and "--accumulation-steps" in d.next_step


def test_bad_phases_are_refused() -> None:
    with pytest.raises(ValueError, match="phases"):
        dg.diagnose({"forward": 0.0, "backward": 0.0})
    with pytest.raises(ValueError, match="negative"):
        dg.diagnose({"forward": -1.0, "backward": 2.0})


def test_saved_results_are_diagnosed_again_to_the_same_verdict() -> None:
    d = dg.diagnose(DATA_STEP, device="cuda", gpu_utilization=0.4,
                    phase_top_ops={"data": "enumerate(DataLoader)#next"}, config={"num_workers": 0})
    doc = {"machine": {"device": "cuda", "cpu_bf16": False}, "config": {"num_workers": 0},
           "sections": {"phases": {"before": DATA_STEP}, "bottleneck": d.to_dict(),
                        "top_ops": [{"name": "aten::conv", "self_time_s": 1.0}]}}
    again = dg.diagnose_results(doc)
    assert again == d
    assert "bottleneck    data loading" in d.describe()


def test_a_set_kept_on_the_device_is_not_told_to_add_workers() -> None:
    from perflab import diagnose

    step, _ = diagnose._next_for_data({"data_on_device": True, "gpu_augment": True}, "cuda")
    assert "--num-workers" not in step and "already decoded on the device" in step
    step, _ = diagnose._next_for_copy({"data_on_device": True})
    assert "--pin-memory" not in step
