"""Throughput as users count it: samples over the wall time of the steps, the median step beside it."""

from __future__ import annotations

import pytest

from perflab.throughput import Throughput


def _h100_optimized_run(epochs: int = 6) -> Throughput:
    """The H100's optimized profile: 13.4 ms steps, and every 7th step (an epoch of 1,000 images at
    batch 128) waiting 370-600 ms while the loader restarts."""
    stalls = [370e-3, 450e-3, 520e-3, 600e-3, 410e-3, 560e-3]
    steps = []
    for epoch in range(epochs):
        steps += [stalls[epoch % len(stalls)]] + [13.4e-3] * 6
    return Throughput(tuple(steps), 128, batches_per_epoch=7, num_workers=8, persistent_workers=False)


def test_the_wall_figure_counts_the_stalls_the_median_hides():
    rate = _h100_optimized_run()
    assert rate.median_samples_per_second == pytest.approx(128 / 13.4e-3)  # the 9,552 the median gives
    assert rate.samples_per_second == pytest.approx(128 * 42 / rate.wall_seconds)
    assert 1_500 < rate.samples_per_second < 2_000  # what the run trained: 5.5x below the median figure
    low, high = rate.ci()
    assert low <= rate.samples_per_second <= high


def test_the_stalls_are_named_with_their_cause():
    rate = _h100_optimized_run()
    assert rate.stalls() == [0, 7, 14, 21, 28, 35] and rate.stall_period() == 7
    line = rate.stall_line()
    assert line.startswith("1 step in 7 waits 370-600 ms")
    assert "the loader restarts each epoch (7 batches)" in line and "persistent_workers=True" in line
    persistent = Throughput(rate.step_seconds, 128, batches_per_epoch=7, num_workers=8, persistent_workers=True)
    assert "a larger data set" in persistent.stall_line()
    text = "\n".join(rate.describe())
    assert "samples/s over the wall time of 42 steps" in text and "median step 13.4 ms" in text


def test_a_steady_run_has_no_stall_and_both_figures_agree():
    rate = Throughput((0.101, 0.099, 0.1, 0.102, 0.098, 0.1), 32, batches_per_epoch=31)
    assert rate.stalls() == [] and rate.stall_line() is None
    assert rate.samples_per_second == pytest.approx(rate.median_samples_per_second, rel=0.01)


def test_too_few_steps_to_see_an_epoch_end_are_said():
    rate = Throughput((0.01,) * 5, 64, batches_per_epoch=78, num_workers=4)
    assert any("not in this figure" in line for line in rate.describe())


def test_bad_step_times_are_refused():
    with pytest.raises(ValueError, match="step_seconds"):
        Throughput((), 8)
    with pytest.raises(ValueError, match="step_seconds"):
        Throughput((0.1, float("nan")), 8)
