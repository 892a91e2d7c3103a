"""Statistics shared by timing and grading: quantiles, bootstrap confidence intervals, time units.

One contract for every caller:

- samples are 1-D sequences of floats (seconds, ratios, anything);
- a *statistic* is a numpy-style reduction ``f(x, axis=-1) -> array`` so a bootstrap evaluates
  all resamples at once (``np.median``, ``np.mean``, or ``quantile_of(0.2)``);
- confidence intervals are percentile-bootstrap intervals from a seeded ``numpy`` generator,
  so the same inputs and seed give the same interval on every machine;
- an interval is an `Interval` (estimate, low, high, level), never a bare tuple.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

Statistic = Callable[..., "np.ndarray | float"]

DEFAULT_LEVEL = 0.95
# 2000 resamples put the Monte Carlo error of a 95% percentile bound well under the sampling
# error of the few dozen blocks or calls a timing has, and cost milliseconds.
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
# Resamples are drawn in chunks of at most this many values so a bootstrap of a long
# measurement never needs more than a few tens of MB.
_CHUNK_VALUES = 2_000_000

_UNITS = (("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0))


@dataclass(frozen=True)
class Interval:
    """A point estimate with its confidence interval at `level` (e.g. 0.95)."""

    estimate: float
    low: float
    high: float
    level: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def width(self) -> float:
        return self.high - self.low

    def to_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "level": self.level}

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> Interval:
        return cls(float(data["estimate"]), float(data["low"]), float(data["high"]), float(data["level"]))


def _as_samples(samples: Sequence[float] | np.ndarray, name: str = "samples") -> np.ndarray:
    x = np.asarray(samples, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of numbers, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{name}: empty; time at least one call")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name}: contains NaN or infinity")
    return x


def quantile(samples: Sequence[float] | np.ndarray, q: float) -> float:
    """The `q`-quantile (0 <= q <= 1) with linear interpolation between order statistics."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q: must lie in [0, 1], got {q}")
    return float(np.quantile(_as_samples(samples), q))


def percentile(samples: Sequence[float] | np.ndarray, p: float) -> float:
    """The `p`-th percentile (0 <= p <= 100); `quantile(samples, p / 100)`."""
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"p: must lie in [0, 100], got {p}")
    return quantile(samples, p / 100.0)


def quantile_of(q: float) -> Statistic:
    """A statistic (for `bootstrap_ci`) that takes the `q`-quantile along an axis."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q: must lie in [0, 1], got {q}")
    return partial(_quantile_axis, q=q)


def _quantile_axis(x: np.ndarray, axis: int = -1, *, q: float) -> np.ndarray:
    return np.quantile(x, q, axis=axis)


def _check(level: float, n_resamples: int) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: must lie strictly between 0 and 1 (e.g. 0.95), got {level}")
    if n_resamples < 100:
        raise ValueError(f"n_resamples: use at least 100 resamples, got {n_resamples}")


def _bounds(values: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return float(low), float(high)


def _resampled(
    x: np.ndarray, statistic: Statistic, n_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """`statistic` of `n_resamples` with-replacement resamples of `x`, in bounded-memory chunks."""
    chunk = max(1, _CHUNK_VALUES // x.size)
    out = []
    for start in range(0, n_resamples, chunk):
        rows = min(chunk, n_resamples - start)
        idx = rng.integers(0, x.size, size=(rows, x.size))
        out.append(np.asarray(statistic(x[idx], axis=-1), dtype=float))
    return np.concatenate(out)


def bootstrap_ci(
    samples: Sequence[float] | np.ndarray,
    statistic: Statistic = np.median,
    level: float = DEFAULT_LEVEL,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Interval:
    """Percentile-bootstrap CI of `statistic(samples)`; the estimate is the statistic of the samples."""
    _check(level, n_resamples)
    x = _as_samples(samples)
    estimate = float(statistic(x, axis=-1))
    rng = np.random.default_rng(seed)
    low, high = _bounds(_resampled(x, statistic, n_resamples, rng), level)
    return Interval(estimate, low, high, level)


def bootstrap_ratio_ci(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    statistic: Statistic = np.median,
    level: float = DEFAULT_LEVEL,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    paired: bool = False,
) -> Interval:
    """Percentile-bootstrap CI of `statistic(a) / statistic(b)`.

    Unpaired: `a` and `b` are resampled independently (two separate samples). Paired: `a[i]` and
    `b[i]` belong together (e.g. blocks timed side by side) and are resampled as pairs, which keeps
    what they share (slow drift of the machine) out of the interval.
    """
    _check(level, n_resamples)
    x, y = _as_samples(a, "a"), _as_samples(b, "b")
    denominator = float(statistic(y, axis=-1))
    if denominator == 0.0:
        raise ValueError("b: its statistic is zero, so the ratio is undefined")
    estimate = float(statistic(x, axis=-1)) / denominator
    rng = np.random.default_rng(seed)
    if paired:
        if x.size != y.size:
            raise ValueError(f"paired: a and b must have the same length, got {x.size} and {y.size}")
        both = np.stack([x, y])
        chunk = max(1, _CHUNK_VALUES // (2 * x.size))
        ratios = []
        for start in range(0, n_resamples, chunk):
            rows = min(chunk, n_resamples - start)
            idx = rng.integers(0, x.size, size=(rows, x.size))
            picked = both[:, idx]  # shape (2, rows, n)
            ratios.append(
                np.asarray(statistic(picked[0], axis=-1), dtype=float)
                / np.asarray(statistic(picked[1], axis=-1), dtype=float)
            )
        values = np.concatenate(ratios)
    else:
        values = _resampled(x, statistic, n_resamples, rng) / _resampled(y, statistic, n_resamples, rng)
    values = values[np.isfinite(values)]
    if values.size == 0:
        raise ValueError("b: every resample's statistic is zero, so the ratio is undefined")
    low, high = _bounds(values, level)
    return Interval(estimate, low, high, level)


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit a reader wants for `seconds` (ns, µs, ms, s) and its size in seconds."""
    magnitude = abs(seconds)
    for name, scale in _UNITS[:-1]:
        if magnitude < scale * 1000:
            return name, scale
    return _UNITS[-1]


def format_time(seconds: float, unit: str | None = None, digits: int = 3) -> str:
    """`seconds` with `digits` significant figures in a reader's unit, e.g. 0.00123 -> '1.23 ms'.

    Give `unit` ('ns', 'µs' or 'us', 'ms', 's') to print several numbers in one unit.
    """
    if not math.isfinite(seconds):
        return f"{seconds} s"
    if unit is None:
        # Round first so that 0.9997 ms reads '1.00 ms', not '1000 µs'.
        unit, scale = time_unit(float(f"{seconds:.{digits}g}"))
    else:
        unit = "µs" if unit == "us" else unit
        scales = dict(_UNITS)
        if unit not in scales:
            raise ValueError(f"unit: {unit!r} is not one of ns, µs, ms, s")
        scale = scales[unit]
    value = float(f"{seconds / scale:.{digits}g}")
    if value == 0:
        return f"0 {unit}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f} {unit}"
