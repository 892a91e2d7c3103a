"""A machine whose training step takes a known time for each configuration: the verifier's real child
(`perflab.verify.child.run`, its blocks, lead-ins, sequential looks and checks) run in this process on a
simulated clock, so a judge's verdict is a function of the cost model, not of the host's noise.

Like the simulated CUDA event clock (`tests/test_verify_cuda_events.py`), it exists only inside a test
process that patches it in (`SimulatedMachine.install`, with pytest's monkeypatch): nothing a student's
code or a grading sandbox can set reaches it. What a real machine costs is measured by
`bench/bench_decisions.py`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from perflab.verify import candidates, child, guard, machine_load, protocol
from perflab.workload import TrainConfig

# The simulated step's time without any change (seconds): the order of a tiny ResNet-18 step on one core.
STEP_SECONDS = 0.02
# Each step takes up to this fraction longer, drawn from a seeded stream: interference on a shared
# machine only adds time, and a CI of width zero would test nothing of the estimator. At NOISY a worker
# at 0.88x re-measures with a CI as wide as a shared 2-core host's (0.85-0.92x); QUIET is a quiet host's;
# at SHARED a worker at 0.89x re-measures as wide as one run of `make bench-decisions` read one worker
# over lab 6's baseline on such a host (0.86x, CI 0.79-0.96x): straddling the parity bar.
NOISY = 0.4
QUIET = 0.1
SHARED = 1.0


class SimulatedClock:
    """A nanosecond clock that moves only when a simulated step advances it."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1e9)


class SimulatedClocks(guard.Clocks):
    """The child's clocks with `perf_counter_ns` simulated: every other clock is still checked for tampering."""

    def problems(self) -> list[str]:
        return [p for p in super().problems() if not p.startswith("time.perf_counter_ns ")]


@dataclass(frozen=True)
class SimulatedMachine:
    """`speedup(config)`: how much faster than `STEP_SECONDS` a configuration's step runs here (a loader
    worker on one core: below 1). The sides train the toy reference's exact work (same losses, same samples,
    microseconds a step), so the correctness gate holds and only the clock says how fast each side is."""

    speedup: Callable[[TrainConfig], float]
    jitter: float = NOISY

    def install(self, monkeypatch: Any) -> None:
        """Every `perflab.verify.verify` of a configuration in this test runs on this machine (whose load
        nothing else shares: the host's is not read)."""
        monkeypatch.setattr(protocol, "run_child", self.run_child)
        monkeypatch.setattr(machine_load, "sample", lambda root=None: None)

    def run_child(self, job: dict[str, Any], *, time_limit: float, memory_limit: int | None) -> tuple[dict[str, Any], str, float]:
        """`protocol.run_child`'s contract: the child's result, no failure, and its (simulated) wall seconds."""
        clock = SimulatedClock()
        saved = (child.CLOCKS, child._thread_ids, child._apply_compile_patches, candidates.config_step,
                 torch.get_num_threads())
        child.CLOCKS = SimulatedClocks(perf_counter_ns=clock)
        child._thread_ids = lambda: None  # no idle probe: it sleeps in real time and reads real CPU clocks
        child._apply_compile_patches = lambda: None  # nothing is compiled: the simulated step stands in for it
        candidates.config_step = self._config_step(clock)
        try:
            result = child.run(job)
        finally:
            (child.CLOCKS, child._thread_ids, child._apply_compile_patches, candidates.config_step,
             threads) = saved
            torch.set_num_threads(threads)
        result["nonce"] = job["nonce"]
        result["child_wall_seconds"] = clock() / 1e9
        return result, "", clock() / 1e9

    def _config_step(self, clock: SimulatedClock) -> Callable[..., candidates.StepFn]:
        def config_step(seed: int, config: dict[str, Any]) -> candidates.StepFn:
            cfg = TrainConfig.from_dict(config)
            seconds = STEP_SECONDS / self.speedup(cfg)
            work = candidates.toy_step(seed, repeats=1, batch=cfg.batch_size, features=16, samples=256)
            # One stream per side, drawn from the knobs the cases were chosen on: the model's name (one
            # value in every case) stays out, so a TrainConfig field added later keeps each case's stream.
            knobs = sorted((k, v) for k, v in config.items() if k != "model")
            noise = random.Random(f"{seed}|{knobs}")

            def step() -> tuple[float, list[int]]:
                clock.advance(seconds * (1.0 + self.jitter * noise.random()))
                return work()

            return step

        return config_step


def one_core(worker_speedup: float = 1.0, compile_speedup: float = 1.0, jitter: float = NOISY,
             amp_speedup: float = 1.0) -> SimulatedMachine:
    """A machine of one core: each configuration with loader workers runs at `worker_speedup` (the workers
    compete with training for the core), one that compiles at `compile_speedup`, one under autocast at
    `amp_speedup`, the rest at 1.0."""
    def speedup(config: TrainConfig) -> float:
        return ((worker_speedup if config.num_workers else 1.0)
                * (compile_speedup if config.compile_mode else 1.0)
                * (amp_speedup if config.amp_dtype else 1.0))

    return SimulatedMachine(speedup, jitter)
