"""Per-step phase breakdown of real training steps: `measure_phases(config)`.

The timer itself (`PhaseTimer`, `Breakdown`, `PHASES`) lives in `perflab.phase_timer`, which the
training loop (`perflab.workload`) uses; this module drives the loop with it, so it sits above both.
"""

from __future__ import annotations

from perflab.phase_timer import PHASES, Breakdown, PhaseTimer

__all__ = ["PHASES", "Breakdown", "PhaseTimer", "measure_phases"]


def measure_phases(config: object, steps: int = 10, warmup: int = 2) -> Breakdown:
    """Run the workload of `config` and return its per-step phase breakdown (device-synchronised)."""
    from perflab import workload

    if not isinstance(config, workload.TrainConfig):
        raise TypeError("measure_phases: config must be a perflab.workload.TrainConfig")
    work = workload.build(config)
    timer = PhaseTimer(device=work.device)
    try:
        for _ in range(warmup):
            workload.train_step(work, PhaseTimer.disabled())
        for _ in range(steps):
            workload.train_step(work, timer)
    finally:
        work.close()
    return timer.breakdown(steps)
