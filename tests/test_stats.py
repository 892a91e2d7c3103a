"""perflab.stats: quantiles, seeded bootstrap intervals, time units."""

from __future__ import annotations

import numpy as np
import pytest

from perflab import stats
from perflab.stats import Interval


def test_quantile_and_percentile_interpolate_linearly():
    x = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert stats.quantile(x, 0.0) == 1.0
    assert stats.quantile(x, 0.5) == 3.0
    assert stats.quantile(x, 1.0) == 5.0
    assert stats.quantile(x, 0.125) == pytest.approx(1.5)
    assert stats.percentile(x, 25) == 2.0
    assert stats.quantile_of(0.25)(np.array([[1.0, 2.0, 3.0, 4.0, 5.0]]), axis=-1)[0] == 2.0


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: stats.quantile([1.0], 1.5), "q"),
        (lambda: stats.percentile([1.0], -1), "p"),
        (lambda: stats.quantile([], 0.5), "samples"),
        (lambda: stats.quantile([1.0, float("nan")], 0.5), "samples"),
        (lambda: stats.bootstrap_ci([1.0, 2.0], level=95), "level"),
        (lambda: stats.bootstrap_ci([1.0, 2.0], n_resamples=10), "n_resamples"),
        (lambda: stats.bootstrap_ratio_ci([1.0, 2.0], [1.0], paired=True), "paired"),
        (lambda: stats.bootstrap_ratio_ci([1.0, 2.0], [0.0, 0.0]), "b"),
    ],
)
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        call()


def test_bootstrap_is_reproducible_with_its_seed():
    x = np.random.default_rng(1).exponential(size=60)
    first = stats.bootstrap_ci(x, np.median, seed=7)
    assert stats.bootstrap_ci(x, np.median, seed=7) == first
    assert stats.bootstrap_ci(x, np.median, seed=8) != first
    assert first.estimate == float(np.median(x))
    assert first.low < first.estimate < first.high


def test_bootstrap_ci_covers_the_true_median_about_as_often_as_it_claims():
    # Exponential(1) has median ln 2; 200 seeded experiments of 50 samples each.
    rng = np.random.default_rng(0)
    true_median = np.log(2)
    hits = sum(
        stats.bootstrap_ci(rng.exponential(size=50), np.median, 0.95, 500, seed=i).contains(true_median)
        for i in range(200)
    )
    assert 0.88 <= hits / 200 <= 0.99


def test_ci_narrows_with_more_samples():
    rng = np.random.default_rng(3)
    small = stats.bootstrap_ci(rng.normal(10, 1, 20), np.mean)
    large = stats.bootstrap_ci(rng.normal(10, 1, 2000), np.mean)
    assert large.width < small.width / 4
    assert large.contains(10.0)


def test_ratio_ci_brackets_a_known_ratio():
    rng = np.random.default_rng(5)
    b = 1.0 + rng.exponential(0.2, size=40)
    a = 2.0 * (1.0 + rng.exponential(0.2, size=40))
    ci = stats.bootstrap_ratio_ci(a, b, stats.quantile_of(0.2), seed=1)
    assert ci.contains(2.0)
    assert ci.low > 1.7 and ci.high < 2.3


def test_paired_resampling_removes_shared_noise():
    # A and B share the same slow drift: pairing cancels it, independent resampling does not.
    drift = 1.0 + np.random.default_rng(2).uniform(0, 1, size=30)
    a, b = 1.5 * drift, drift
    paired = stats.bootstrap_ratio_ci(a, b, np.median, paired=True)
    unpaired = stats.bootstrap_ratio_ci(a, b, np.median, paired=False)
    assert paired.low == pytest.approx(1.5) and paired.high == pytest.approx(1.5)
    assert unpaired.width > 0.1 and unpaired.contains(1.5)


def test_large_samples_bootstrap_in_bounded_chunks():
    x = np.random.default_rng(0).normal(size=20_000)  # 2000 x 20000 values would be 320 MB at once
    ci = stats.bootstrap_ci(x, np.median, n_resamples=200)
    assert ci.contains(0.0)


def test_interval_round_trips():
    ci = Interval(1.5, 1.2, 1.9, 0.95)
    assert Interval.from_dict(ci.to_dict()) == ci
    assert ci.contains(1.2) and not ci.contains(2.0)
    assert ci.width == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (1.5e-9, "1.50 ns"),
        (1.234e-6, "1.23 µs"),
        (0.0123, "12.3 ms"),
        (0.25, "250 ms"),
        (2.5, "2.50 s"),
        (125.0, "125 s"),
        (0.0009997, "1.00 ms"),
        (0.0, "0 ns"),
    ],
)
def test_format_time_picks_the_readers_unit(seconds, text):
    assert stats.format_time(seconds) == text


def test_format_time_in_a_given_unit():
    assert stats.format_time(0.0123, "us") == "12300 µs"
    assert stats.format_time(5e-7, "ms") == "0.000500 ms"
    with pytest.raises(ValueError, match="^unit:"):
        stats.format_time(1.0, "min")
