"""Seeds named by what they seed: a sample's augmentation in an epoch, an epoch's order, a step's device
augmentation. Each is a hash of (seed, epoch, index), so it depends on nothing but those: not on worker
count, prefetching or the order in which anything else drew."""

from __future__ import annotations

import hashlib


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for (seed, epoch, index): sample `index` of `epoch`, an epoch's order (index -1), or a
    step's device augmentation (epoch -1, index the step)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF
