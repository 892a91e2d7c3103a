"""Changing nothing earns nothing: each lab's re-measured speedup cell, decided by the grader's own judge
at grade sizes, for a choice left at the baseline (lazy) and one that changed nothing that matters
(near-lazy), against the reference's choice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import simulated_machine as simulated

from perflab import env
from perflab.grading.judging import Context
from perflab.labs import lab02, lab03, lab06
from perflab.labs.lab02 import judges as hidden02
from perflab.labs.lab03 import judges as hidden03
from perflab.labs.lab06 import judges as hidden06
from perflab.verify import load_expectation
from perflab.workload import TrainConfig


def _plain(config: TrainConfig) -> dict[str, Any]:
    # With the one line of why a decision carries (lab 2's WHY_BEST; without one it earns half its cell).
    return {"config": config.to_dict(), "claim": 1.0, "why": "my interleaved comparison decided this choice"}


def _final(config: TrainConfig) -> dict[str, Any]:
    return {"final": {"config": config.to_dict()}, "claim": 1.0}


# (lab module, the grader's judge of its re-measured cell, what the probe observes for a choice)
LABS: list[tuple[Any, Callable[..., Any], Callable[[TrainConfig], dict[str, Any]]]] = [
    (lab02, hidden02.judge_best_verified, _plain),
    (lab03, hidden03.judge_verified, _plain),
    (lab06, hidden06.judge_final_verified, _final),
]


def _expectation_name(module: Any, config: TrainConfig) -> str:
    return module.expectation_name(config.device_type) if module is lab03 else module.EXPECTATION


@pytest.mark.parametrize(("module", "judge", "observe"), LABS, ids=lambda v: getattr(v, "LAB", ""))
def test_a_choice_left_at_the_baseline_earns_the_points_only_where_there_is_no_gain(module, judge, observe):
    base = module.baseline_config("grade")
    bar = load_expectation(_expectation_name(module, base), workload=base)
    mark = judge(observe(base), Context(module.LAB, 0, "grade"))
    assert "no change" in mark.message and "faster" not in mark.message, mark.message
    if bar.threshold > 1.0:  # the reference gains here: keeping the baseline is not the lesson
        assert mark.fraction == 0.0, mark.message
    else:  # nothing to gain here: keeping the baseline is the right decision
        assert mark.fraction == 1.0, mark.message


def test_the_committed_calibration_grades_a_gain_where_this_kind_of_machine_has_one() -> None:
    """On the 2-core AVX-512-BF16 class the kit is calibrated on, labs 2, 3 and 6 hold a choice to a bar
    above 1.0 at their own grade sizes (loader workers on photo-sized JPEGs 1.4x, bf16 1.6x), while the
    tiny sizes of the kit's own tests get no bar from that calibration."""
    for module in (lab02, lab03, lab06):
        base = module.baseline_config("grade").replace(device="cpu")
        bar = load_expectation(_expectation_name(module, base), "cpu-bf16", workload=base)
        assert bar.calibrated and bar.kind == "gain" and bar.threshold > 1.0, bar.reason
        tiny = module.baseline_config("tiny").replace(device="cpu")
        assert not load_expectation(_expectation_name(module, tiny), "cpu-bf16", workload=tiny).calibrated


@pytest.mark.parametrize(("module", "judge", "observe"), LABS, ids=lambda v: getattr(v, "LAB", ""))
def test_near_lazy_fails_and_the_reference_passes_where_the_hardware_gains(module, judge, observe, monkeypatch):
    """A choice that changes only a knob without effect here (pin_memory on a CPU) is "no change", which
    fails a gain bar without being timed (noise cannot carry it); the reference's choice clears the bar.
    The reference is re-measured by the verifier's real child on a simulated machine that gains what this
    class's calibration found (a quarter above its bar), so the verdict is not the host's load of the moment
    (on a busy 2-core host lab 2's reference once re-measured 0.91x); what a real machine gains is
    `perflab calibrate`'s and `make bench-decisions`'s to measure."""
    base = module.baseline_config("grade")
    bar = load_expectation(_expectation_name(module, base), workload=base)
    if bar.threshold <= 1.0 or env.pick_device().type != "cpu":
        pytest.skip(f"no calibrated CPU gain to grade on this machine ({bar.reason})")
    reference = {lab02: lambda: hidden02.reference_best("grade"), lab03: lambda: base.replace(amp_dtype="bf16"),
                 lab06: lambda: hidden06.reference_final("grade")}[module]()
    assert reference != base
    gain = 1.25 * bar.threshold
    simulated.SimulatedMachine(lambda c: gain if (c.num_workers or c.amp_dtype or c.channels_last) else 1.0,
                               simulated.QUIET).install(monkeypatch)
    mark = judge(observe(reference), Context(module.LAB, 0, "grade"))
    assert mark.fraction == 1.0, mark.message
    if module is not lab03:  # lab 3's AMP_CONFIG may change only precision knobs
        near = judge(observe(base.replace(pin_memory=True)), Context(module.LAB, 0, "grade"))
        assert near.fraction == 0.0 and near.verdict["verdict"] == "fail", near.message
        assert near.verdict["speedup"] is None and "no change" in near.message, near.message
