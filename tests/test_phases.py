from __future__ import annotations

import itertools
import time

import pytest
import torch

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
    assert breakdown.total == pytest.approx(0.5 * len(PHASES))
    assert breakdown.share("forward") == pytest.approx(1 / len(PHASES))
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
    assert all(v > 0 for k, v in b.seconds.items() if k not in ("h2d", "augment"))
    assert b.seconds["forward"] + b.seconds["backward"] > 0


def test_each_phase_is_named_for_what_it_times() -> None:
    """The copy, the augmentation on the device, then the model: `augment` apart from `h2d`."""
    assert PHASES == ("data", "h2d", "augment", "forward", "backward", "optimizer")


def test_augmentation_time_lands_in_augment_and_none_in_h2d_when_the_data_is_on_the_device(
        tiny_data) -> None:  # noqa: ANN001
    """A set kept on the device is copied nowhere: a slow augmentation there is charged to `augment`, not `h2d`."""
    from perflab import workload
    from perflab.workload import TrainConfig

    delay = 0.05

    class SlowAugment(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, images: torch.Tensor, step: int) -> torch.Tensor:
            time.sleep(delay)
            return self.inner(images, step)

    config = TrainConfig(batch_size=4, gpu_augment=True, data_on_device=True, device="cpu")
    work = workload.build(config)
    try:
        work.augment = SlowAugment(work.augment)
        timer = PhaseTimer(device=work.device)
        steps = 3
        for _ in range(steps):
            workload.train_step(work, timer)
    finally:
        work.close()
    b = timer.breakdown(steps)
    assert b.seconds["augment"] >= delay
    assert b.seconds["h2d"] < delay / 10, b.table()
