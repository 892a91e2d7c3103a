"""The statistics of a verification: a robust speedup estimate, its bootstrap CI, the sequential decision.

Everything here is a pure function of raw block times, so a test can drive it with synthetic
numbers and a fake clock, and the parent process can recompute from the child's raw samples
exactly what the child decided.

Why the 20th percentile: interference on a shared machine (another process, a page fault, a
frequency dip) only ever *adds* time to a block, so the low tail of block times is the part
that reflects the code rather than the machine. Measured on a 2-core machine with a busy loop
on one core in half of the trials, the median of per-pair ratios falsely passed a true 1.0x
candidate at a 1.1x bar once in 20 and left 15% of true 1.25x cases undecided, while the ratio
of 20th-percentile block times, bootstrapped over blocks, passed every true 1.25x and no true
1.0x (`bench/bench_verify.py` re-runs that study).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perflab import stats

# The block-time percentile the estimator compares (see the module docstring for the measurement).
QUANTILE = 0.2
# Fewer pairs than this and the 20th percentile of a resample is the minimum of a handful of
# blocks: the interval is too optimistic to decide on.
MIN_PAIRS = 8
# Pairs after which the run stops undecided (inconclusive) if the CI still straddles the bar.
MAX_PAIRS = 64
# Look at the data after every this many new pairs: fewer looks keep the sequential error rate
# close to the nominal one and the bootstrap cost small.
LOOK_EVERY = 2
# Timed seconds (both sides together) after which the run stops undecided: with building, warm-up
# and the child's start, keeps a grade-size ResNet-18 verification under a minute on 2 CPU cores.
MAX_TIMED_SECONDS = 20.0

OUTCOMES = ("pass", "fail", "undecided")


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile of `values` with linear interpolation."""
    return stats.quantile(values, q)


def speedup(baseline: Sequence[float], candidate: Sequence[float], q: float = QUANTILE) -> float:
    """Baseline block time over candidate block time, each at its `q` quantile (>1: candidate faster)."""
    return quantile(baseline, q) / quantile(candidate, q)


def bootstrap_ratio_ci(baseline: Sequence[float], candidate: Sequence[float], *, q: float = QUANTILE,
                       confidence: float = stats.DEFAULT_LEVEL, resamples: int = stats.DEFAULT_RESAMPLES,
                       seed: int = stats.DEFAULT_SEED) -> tuple[float, float]:
    """Percentile-bootstrap CI of `speedup`, resampling *pairs* of blocks (a pair shares its moment's noise).

    `baseline[i]` and `candidate[i]` are the two blocks of pair i. Deterministic for a given seed. The
    level and resample count default to those of every CI in the kit (`perflab.stats`).
    """
    if len(baseline) != len(candidate) or len(baseline) < 2:
        raise ValueError(f"bootstrap_ratio_ci: need two equal-length lists of at least 2 block times, "
                         f"got {len(baseline)} and {len(candidate)}")
    interval = stats.bootstrap_ratio_ci(baseline, candidate, stats.quantile_of(q), level=confidence,
                                        n_resamples=resamples, seed=seed, paired=True)
    return interval.low, interval.high


@dataclass(frozen=True)
class Budget:
    """How long the sequential test may run before it must stop undecided."""

    min_pairs: int = MIN_PAIRS
    max_pairs: int = MAX_PAIRS
    look_every: int = LOOK_EVERY
    max_timed_seconds: float = MAX_TIMED_SECONDS
    block_steps: int | None = None  # steps per timed block; None: chosen from the warm-up step times

    def __post_init__(self) -> None:
        if self.min_pairs < 2:
            raise ValueError(f"min_pairs: must be at least 2, got {self.min_pairs}")
        if self.max_pairs < self.min_pairs:
            raise ValueError(f"max_pairs: must be at least min_pairs ({self.min_pairs}), got {self.max_pairs}")
        if self.look_every < 1:
            raise ValueError(f"look_every: must be at least 1, got {self.look_every}")
        if not self.max_timed_seconds > 0:
            raise ValueError(f"max_timed_seconds: must be positive, got {self.max_timed_seconds}")
        if self.block_steps is not None and self.block_steps < 1:
            raise ValueError(f"block_steps: must be at least 1, got {self.block_steps}")

    def to_dict(self) -> dict[str, float | int | None]:
        return {"min_pairs": self.min_pairs, "max_pairs": self.max_pairs, "look_every": self.look_every,
                "max_timed_seconds": self.max_timed_seconds, "block_steps": self.block_steps}

    @classmethod
    def from_dict(cls, data: dict) -> Budget:
        return cls(**data)


@dataclass(frozen=True)
class Decision:
    """One look at the data: the estimate, its CI, and what it says about the bar."""

    outcome: str  # pass | fail | undecided
    speedup: float
    ci: tuple[float, float]
    pairs: int
    expectation: float


def decide(baseline: Sequence[float], candidate: Sequence[float], expectation: float, *,
           seed: int = stats.DEFAULT_SEED, q: float = QUANTILE, confidence: float = stats.DEFAULT_LEVEL) -> Decision:
    """Pass if the CI's lower bound clears `expectation`, fail if its upper bound is below it, else undecided."""
    low, high = bootstrap_ratio_ci(baseline, candidate, q=q, confidence=confidence, seed=seed)
    if low >= expectation:
        outcome = "pass"
    elif high < expectation:
        outcome = "fail"
    else:
        outcome = "undecided"
    return Decision(outcome, speedup(baseline, candidate, q), (low, high), len(baseline), expectation)


def should_look(pairs: int, budget: Budget) -> bool:
    """Whether the sequential test looks at the data after `pairs` pairs."""
    return pairs >= budget.min_pairs and ((pairs - budget.min_pairs) % budget.look_every == 0
                                          or pairs >= budget.max_pairs)


def out_of_budget(pairs: int, timed_seconds: float, budget: Budget) -> bool:
    return pairs >= budget.max_pairs or timed_seconds >= budget.max_timed_seconds


def sequential(baseline: Sequence[float], candidate: Sequence[float], expectation: float,
               budget: Budget, *, seed: int = stats.DEFAULT_SEED) -> Decision | None:
    """Replay the sequential rule over recorded pairs: the first decisive look, or the last look, or None.

    The child runs the same rule live (`run_pairs`); the parent replays it on the raw samples to
    confirm the child stopped where the rule says it should have.
    """
    last = None
    timed = 0.0
    for n in range(1, len(baseline) + 1):
        timed += baseline[n - 1] + candidate[n - 1]
        if should_look(n, budget) or (n >= budget.min_pairs and out_of_budget(n, timed, budget)):
            last = decide(baseline[:n], candidate[:n], expectation, seed=seed)
            if last.outcome != "undecided" or out_of_budget(n, timed, budget):
                return last
    return last
