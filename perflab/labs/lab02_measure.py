"""Lab 2's measuring helpers: how the notebook times two loader configurations against each other.

`loader_pace` gives `timing.compare` the block size and lead-in that time each side at the pace its
loader sustains, as the grader's re-measurement does (`perflab.verify.pace`). It needs nothing of the
contract `perflab.labs.lab02`, which answers the name too for a notebook released before.
"""

from __future__ import annotations

from typing import Any

from perflab.workload import TrainConfig


def loader_pace(baseline: TrainConfig, candidate: TrainConfig, block_size: int) -> dict[str, Any]:
    """`timing.compare`'s `block_size` and `lead_in` that time two loader configurations at the pace
    their loaders sustain (`perflab.verify.pace`, as the grader's re-measurement does): while one runs,
    the other's workers fill their queue, which a short block would read at no cost (docs/DESIGN.md
    gives what short blocks timed against the sustained pace)."""
    from perflab.verify import pace

    queues = [pace.queued_batches(c.num_workers, c.prefetch_factor) for c in (baseline, candidate)]
    return {"block_size": max(block_size, pace.min_block_steps(*queues)),
            "lead_in": (pace.lead_in(queues[0]), pace.lead_in(queues[1]))}

