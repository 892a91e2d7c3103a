"""The per-step phase timer: data wait, host-to-device copy, augmentation on the device, forward, backward,
optimizer.

`PhaseTimer.phase(name)` wraps a place in the training loop. When enabled it synchronises the
device at both ends of the phase so that asynchronous GPU work is charged to the phase that
queued it (which costs some overlap: the breakdown answers "where does time go", the throughput
figure comes from unsynchronised timing).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from perflab import env

# Each phase is named for what it times: `data` the wait for the loader's batch, `h2d` its copy to the device
# (nothing where the batch is already there), `augment` the augmentation on the device and the conversion to
# the memory format (`Workload.augment_on_device`), then the model's forward, backward and optimizer step.
# Results files written before `augment` was timed apart hold no `augment` (their `h2d` includes it).
PHASES = ("data", "h2d", "augment", "forward", "backward", "optimizer")


@dataclass
class PhaseTimer:
    """Accumulates wall-clock seconds per named phase; one list entry per call."""

    device: torch.device | None = None
    enabled: bool = True
    clock: Callable[[], float] = time.perf_counter
    samples: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def disabled(cls) -> PhaseTimer:
        return cls(enabled=False)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self.device is not None:
            env.synchronize(self.device)
        start = self.clock()
        try:
            yield
        finally:
            if self.device is not None:
                env.synchronize(self.device)
            self.samples[name].append(self.clock() - start)

    def reset(self) -> None:
        self.samples = defaultdict(list)

    def breakdown(self, steps: int) -> Breakdown:
        """Mean seconds per optimizer step for each phase over `steps` steps."""
        if steps < 1:
            raise ValueError(f"steps: must be at least 1, got {steps}")
        per_step = {name: sum(self.samples.get(name, [])) / steps for name in PHASES}
        for name, values in self.samples.items():
            if name not in per_step:
                per_step[name] = sum(values) / steps
        return Breakdown(seconds=per_step, steps=steps)


@dataclass(frozen=True)
class Breakdown:
    """Mean seconds per step for each phase, and the shares they make of the step."""

    seconds: dict[str, float]
    steps: int

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def share(self, name: str) -> float:
        total = self.total
        return self.seconds.get(name, 0.0) / total if total > 0 else 0.0

    @property
    def dominant(self) -> str:
        return max(self.seconds, key=lambda k: self.seconds[k])

    def table(self) -> str:
        lines = [f"{'phase':<10} {'ms/step':>9} {'share':>7}"]
        for name, sec in self.seconds.items():
            lines.append(f"{name:<10} {sec * 1e3:>9.2f} {self.share(name):>7.1%}")
        lines.append(f"{'total':<10} {self.total * 1e3:>9.2f} {1:>7.1%}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {"seconds": dict(self.seconds), "steps": self.steps}
