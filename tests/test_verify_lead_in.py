"""A side whose loader workers run ahead is timed at the pace its loader sustains, not from its queue.

Timed blocks alternate between the two sides; while one side runs, the other side's loader workers
keep working and fill their prefetch queue (num_workers x prefetch_factor batches). A block of fewer
steps than the queue holds would then take every batch from the queue at no cost: on an H100, whose
loader could not keep up, that made workers look far faster than they trained. The child runs those
queued batches untimed before each block (`Side.lead_in`).
"""

from __future__ import annotations

import queue
import threading
import time

import torch

from perflab.verify import Side as SideSpec
from perflab.verify import child

LOADER_PERIOD = 0.05  # seconds the simulated loader needs per batch (the bottleneck)
COMPUTE = 0.001  # seconds of the simulated step itself
DEPTH = 4  # batches the loader holds ready


def _loader_bound_step():
    """A training step fed by a background loader that sustains one batch per LOADER_PERIOD."""
    ready: queue.Queue = queue.Queue(maxsize=DEPTH)
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            time.sleep(LOADER_PERIOD)
            ready.put([i])
            i += 1

    threading.Thread(target=produce, daemon=True).start()

    def step():
        idx = ready.get()
        time.sleep(COMPUTE)
        return torch.tensor(1.0), idx

    return step, stop


def _block_after_the_other_side_ran(lead_in: int, steps: int = DEPTH) -> float:
    step, stop = _loader_bound_step()
    side = child.Side("candidate", step, lead_in=lead_in)
    try:
        side.run(2)  # warm
        time.sleep(LOADER_PERIOD * (DEPTH + 2))  # the other side's block: this loader fills its queue
        return side.time_block(steps) / steps
    finally:
        stop.set()


def test_a_block_is_timed_at_the_loaders_pace_not_from_its_queue():
    from_queue = _block_after_the_other_side_ran(lead_in=0)
    sustained = _block_after_the_other_side_ran(lead_in=DEPTH)
    assert from_queue < LOADER_PERIOD / 2  # the bias: the queued batches cost nothing
    assert sustained > 3 * from_queue and sustained > 0.5 * LOADER_PERIOD


def test_the_lead_in_is_what_a_configurations_loader_prefetches():
    from perflab.workload import TrainConfig

    base = TrainConfig()
    assert child._prefetched_batches(SideSpec.from_config(base)) == 0
    assert child._prefetched_batches(SideSpec.from_config(base.replace(num_workers=4))) == 8
    assert child._prefetched_batches(SideSpec.from_config(base.replace(num_workers=2, prefetch_factor=5))) == 10
    assert child._prefetched_batches(SideSpec.reference("perflab.verify.candidates:toy_step")) == 0
