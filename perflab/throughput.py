"""Training throughput as users count it: samples over the wall time of the steps, stalls included.

The median step hides the steps that wait: on an H100 an optimized run's median step was 13.4 ms
(9,576 samples/s) while it trained 1,737 samples/s, because one step in seven waited 370-600 ms when an
epoch of a 1,000-image set ended and the loader restarted. `Throughput` keeps the raw step times and
derives the figure that counts (samples over their sum), the median step beside it, and the stalls,
named with their likely cause.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from perflab import stats

# A step this many times the median step, and at least STALL_MIN_SECONDS above it, waits on something
# the steady steps do not (a loader restart, a collection): 3x keeps a noisy CPU step out.
STALL_RATIO = 3.0
STALL_MIN_SECONDS = 0.005


@dataclass(frozen=True)
class Throughput:
    """Raw seconds of consecutive training steps and the samples each consumed; rates are derived.

    batches_per_epoch  the loader's batches in one epoch (None if unknown): a stall period that matches it
                       is the loader restarting at each epoch
    num_workers, persistent_workers  the loader's knobs, for naming the cause of a stall
    """

    step_seconds: tuple[float, ...]
    samples_per_step: int
    batches_per_epoch: int | None = None
    num_workers: int = 0
    persistent_workers: bool = False

    def __post_init__(self) -> None:
        times = tuple(float(t) for t in self.step_seconds)
        if not times:
            raise ValueError("step_seconds: a throughput needs at least one timed step")
        if not all(math.isfinite(t) and t > 0 for t in times):
            raise ValueError("step_seconds: every step time must be a finite, positive number of seconds")
        if self.samples_per_step < 1:
            raise ValueError(f"samples_per_step: must be at least 1, got {self.samples_per_step}")
        object.__setattr__(self, "step_seconds", times)

    @property
    def steps(self) -> int:
        return len(self.step_seconds)

    @property
    def wall_seconds(self) -> float:
        return float(sum(self.step_seconds))

    @property
    def samples_per_second(self) -> float:
        """The figure that counts: every sample trained over the wall time it took."""
        return self.samples_per_step * self.steps / self.wall_seconds

    @property
    def median_step(self) -> float:
        return stats.quantile(self.step_seconds, 0.5)

    @property
    def median_samples_per_second(self) -> float:
        """What the median step alone would give: a steady step's rate, stalls left out."""
        return self.samples_per_step / self.median_step

    def ci(self) -> tuple[float, float]:
        """Bootstrap 95% CI of the wall throughput (resampling steps; periodic stalls make it optimistic)."""
        interval = stats.bootstrap_ci(self.step_seconds, np.mean)
        return self.samples_per_step / interval.high, self.samples_per_step / interval.low

    def stalls(self) -> list[int]:
        """Indices of the steps that waited (see STALL_RATIO)."""
        median = self.median_step
        bar = max(STALL_RATIO * median, median + STALL_MIN_SECONDS)
        return [i for i, t in enumerate(self.step_seconds) if t > bar]

    def stall_period(self) -> float | None:
        """Steps between consecutive stalls (the median gap), or None with fewer than two stalls."""
        found = self.stalls()
        if len(found) < 2:
            return None
        return stats.quantile([b - a for a, b in zip(found, found[1:], strict=False)], 0.5)

    def stall_cause(self) -> str:
        """The likely cause of the stalls, and what to try."""
        period = self.stall_period()
        per_epoch = self.batches_per_epoch
        at_epochs = per_epoch is not None and period is not None and abs(period - per_epoch) <= 1
        if at_epochs and self.num_workers > 0:
            fix = ("a larger data set or a longer epoch" if self.persistent_workers
                   else "persistent_workers=True, or a larger data set")
            return f"the loader restarts each epoch ({per_epoch} batches): {fix}"
        if at_epochs:
            return f"they fall at each epoch's start ({per_epoch} batches)"
        if self.num_workers > 0:
            return "the loader's workers fall behind the step: more workers, or lighter decoding/augmentation"
        return "something outside the steady step (a collection, another process, an epoch's start)"

    def stall_line(self) -> str | None:
        """'1 step in 7 waits 370-600 ms: ...', or None when no step stalled."""
        found = self.stalls()
        if not found:
            return None
        waits = sorted(self.step_seconds[i] for i in found)
        span = (f"{waits[0] * 1e3:.0f} ms" if len(waits) == 1 or waits[-1] - waits[0] < 0.5e-3
                else f"{waits[0] * 1e3:.0f}-{waits[-1] * 1e3:.0f} ms")
        every = self.steps / len(found)
        share = sum(waits) / self.wall_seconds
        return (f"1 step in {every:.0f} waits {span} ({share:.0%} of the wall time): {self.stall_cause()}")

    def epochs_spanned(self) -> float | None:
        """Epochs the timed steps cover (None if the epoch's length is unknown)."""
        return None if not self.batches_per_epoch else self.steps / self.batches_per_epoch

    def describe(self) -> list[str]:
        """Lines for a terminal or a notebook: the wall figure first, the median step beside it, the stalls."""
        low, high = self.ci()
        lines = [f"{self.samples_per_second:,.1f} samples/s over the wall time of {self.steps} steps "
                 f"({self.wall_seconds:.2f} s; 95% CI {low:,.1f} to {high:,.1f})",
                 f"median step {stats.format_time(self.median_step)}: {self.median_samples_per_second:,.1f} "
                 "samples/s if every step were a median one"]
        stall = self.stall_line()
        if stall:
            lines.append(stall)
        spanned = self.epochs_spanned()
        if spanned is not None and spanned < 1 and self.num_workers > 0:
            lines.append(f"the timed steps cover {spanned:.2f} of an epoch ({self.batches_per_epoch} batches): "
                         "the loader's restart at an epoch's end is not in this figure; time more steps")
        return lines

    def as_stat(self) -> dict[str, Any]:
        """The results schema's STAT shape for the wall throughput (samples: the raw step seconds)."""
        low, high = self.ci()
        return {"median": self.samples_per_second, "ci": [low, high], "unit": "samples/s",
                "statistic": "samples over wall time", "samples": list(self.step_seconds)}


__all__ = ["STALL_RATIO", "Throughput"]
