"""Timing a step fed by DataLoader workers at the pace its loader sustains.

When two configurations are timed in alternating blocks, the workers of the one waiting keep working and
fill their queue (num_workers x prefetch_factor batches); started together, they also deliver in bursts
of one batch per worker. A short block then reads the queue or a burst, not the pace training sustains.
So each block of a side with workers follows LEAD_IN_QUEUES x its queue of untimed steps (the queue and
what the workers refill while it drains) and lasts at least LOADER_BLOCK_QUEUES x the larger queue of the
sides compared (several rounds of every worker).

Measured: a simulated loader of 4 workers (tests/test_verify_lead_in.py) is timed within 5% of its
sustained pace this way at any ratio of loader to compute, where a lead-in of one queue and 40 ms blocks
read 0.3x to 2.8x of it. On an H200, 2-step blocks timed bf16 + channels_last at 1.9x over FP32 where
training sustained 1.02x, both at the pace of their 8 loader workers (`perflab profile`, 160 steps).

Standard library only: the verifier's child imports it before any candidate code.
"""

from __future__ import annotations

LEAD_IN_QUEUES = 2
LOADER_BLOCK_QUEUES = 2
# torch.utils.data.DataLoader's prefetch_factor when None is given and workers are used.
DEFAULT_PREFETCH_FACTOR = 2


def queued_batches(num_workers: int | None, prefetch_factor: int | None = None) -> int:
    """Batches a DataLoader holds ready when its workers have run ahead (0 without workers)."""
    workers = int(num_workers or 0)
    return workers * int(prefetch_factor or DEFAULT_PREFETCH_FACTOR) if workers > 0 else 0


def lead_in(queue: int) -> int:
    """Untimed steps before each timed block of a side whose loader queues `queue` batches."""
    return LEAD_IN_QUEUES * queue


def min_block_steps(*queues: int) -> int:
    """The fewest steps a timed block may have when the sides compared queue `queues` batches."""
    return LOADER_BLOCK_QUEUES * max(queues, default=0)
