from __future__ import annotations

import itertools

import pytest

from perflab.phases import PHASES, Breakdown, PhaseTimer


def test_phase_timer_charges_each_phase_with_a_fake_clock() -> None:
    ticks = itertools.count(0.0, 0.5)  # every clock read advances 0.5 s
    timer = PhaseTimer(clock=lambda: next(ticks))
    for _ in range(2):
        for name in PHASES:
            with timer.phase(name):
                pass
    breakdown = timer.breakdown(steps=2)
    assert breakdown.seconds == {name: 0.5 for name in PHASES}
    assert breakdown.total == pytest.approx(2.5)
    assert breakdown.share("forward") == pytest.approx(0.2)
    assert "forward" in breakdown.table()


def test_disabled_timer_records_nothing() -> None:
    timer = PhaseTimer.disabled()
    with timer.phase("data"):
        pass
    assert not timer.samples


def test_dominant_phase_and_bad_steps() -> None:
    b = Breakdown(seconds={"data": 3.0, "forward": 1.0}, steps=1)
    assert b.dominant == "data"
    with pytest.raises(ValueError, match="steps"):
        PhaseTimer().breakdown(0)


def test_measure_phases_on_the_real_workload(tiny_data) -> None:  # noqa: ANN001
    from perflab.phases import measure_phases
    from perflab.workload import TrainConfig

    b = measure_phases(TrainConfig(batch_size=4), steps=2, warmup=1)
    assert set(PHASES) <= set(b.seconds)
    assert all(v > 0 for k, v in b.seconds.items() if k != "h2d")
    assert b.seconds["forward"] + b.seconds["backward"] > 0
