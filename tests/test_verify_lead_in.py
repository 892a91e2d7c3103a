"""A side whose loader workers run ahead is timed at the pace its loader sustains, not from its queue.

Timed blocks alternate between the two sides; while one side runs, the other side's loader workers
keep working and fill their prefetch queue (num_workers x prefetch_factor batches). A block of fewer
steps than the queue holds would then take every batch from the queue at no cost: on an H100, whose
loader could not keep up, that made workers look far faster than they trained. The child runs those
queued batches untimed before each block (`Side.lead_in`), and a block long enough that workers
started together, which deliver in bursts, are timed over several rounds (`child.block_steps`).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time

import torch

from perflab.verify import Side as SideSpec
from perflab.verify import child, pace

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
    assert child._lead_in(SideSpec.from_config(base.replace(num_workers=4))) == pace.LEAD_IN_QUEUES * 8
    assert child._prefetched_batches(SideSpec.from_config(base.replace(num_workers=4))) == 8
    assert child._prefetched_batches(SideSpec.from_config(base.replace(num_workers=2, prefetch_factor=5))) == 10
    assert child._prefetched_batches(SideSpec.reference("perflab.verify.candidates:toy_step")) == 0


def _workers(n: int, period: float, compute: float, prefetch: int = 2):
    """A step fed by `n` loader workers that together sustain one batch per `period` (each needs n x
    period a batch, at most n x prefetch batches outstanding, like a DataLoader's), computing `compute`."""
    slots = threading.Semaphore(n * prefetch)
    ready: queue.Queue = queue.Queue()
    stop = threading.Event()

    def work(k: int) -> None:
        while not stop.is_set():
            slots.acquire()
            time.sleep(n * period)
            ready.put([k])

    for k in range(n):
        threading.Thread(target=work, args=(k,), daemon=True).start()

    def step():
        idx = ready.get()
        slots.release()
        end = time.perf_counter() + compute
        while time.perf_counter() < end:
            pass
        return torch.tensor(1.0), idx

    return step, stop, n * prefetch


def _timed_pace(lead_in: int, steps: int, compute_share: float, workers: int = 4, period: float = 0.01) -> float:
    """Seconds a step in timed blocks over the loader's sustained seconds a step (1.0: its true pace)."""
    step, stop, _ = _workers(workers, period, compute_share * period)
    side = child.Side("candidate", step, lead_in=lead_in)
    try:
        side.run(3 * workers * 2)  # warm, and past the first fill
        paces = []
        for _ in range(4):
            time.sleep(0.3)  # the other side's block: every worker fills its share of the queue
            paces.append(side.time_block(steps) / steps)
        return statistics.median(paces) / period
    finally:
        stop.set()


def test_workers_that_deliver_in_bursts_are_timed_at_their_sustained_pace():
    """The H200 case: 8 workers fed bf16 + channels_last at about half the pace its GPU could step; 2-step
    blocks after the queue's lead-in timed it at 1.9x over FP32 where training sustained 1.02x. Here 4
    simulated workers feed a step whose compute takes 30% or 70% of a batch's loading time."""
    queue_depth = 4 * 2
    lead_in = pace.LEAD_IN_QUEUES * queue_depth
    steps = child.block_steps(0.003, (0, queue_depth))
    assert steps >= 2 * queue_depth
    for share in (0.3, 0.7):
        timed = _timed_pace(lead_in, steps, share)
        assert 0.85 < timed < 1.2, f"compute {share:.0%} of loading: timed at {timed:.2f}x the sustained step time"
    # Before: a lead-in of the queue and a 40 ms block (one or two steps) read the queue or a burst.
    assert not 0.85 < _timed_pace(queue_depth, 1, 0.3) < 1.2


def test_blocks_follow_the_clock_without_workers_and_the_queue_with_them():
    assert child.block_steps(0.1) == 1 and child.block_steps(0.001) == child.MAX_BLOCK_STEPS
    assert child.block_steps(0.1, (0, 16)) == pace.LOADER_BLOCK_QUEUES * 16
    assert child.block_steps(0.1, (16, 4), fixed=3) == 3


def test_blocks_made_longer_for_a_loader_get_the_time_for_a_decision():
    """Lab 2 on a GPU: a starved 340 ms step against a fed 40 ms one in blocks of 8 (2 workers) needs
    about 3 s a pair; the default 20 s would end after 7 pairs, "too few" for a decision."""
    from perflab.verify import decide

    budget = decide.Budget()
    paced = child.paced_budget(budget, 8, 0.34, 0.04)
    assert paced.max_timed_seconds >= budget.min_pairs * 8 * (0.34 + 0.04)
    assert paced.max_timed_seconds <= child.PACE_MAX_TIMED_SECONDS and paced.min_pairs == budget.min_pairs
    assert child.paced_budget(budget, 1, 0.34, 0.04) is budget  # the clock's own block: nothing to add
    assert child.paced_budget(budget, 8, 0.001, 0.001) is budget  # fits already
    assert child.paced_budget(budget, 800, 1.0, 1.0).max_timed_seconds == child.PACE_MAX_TIMED_SECONDS
