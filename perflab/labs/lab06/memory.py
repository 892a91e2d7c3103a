"""Lab 6's memory model: the bytes of one training step against batch size, and whether it fits.

The memory of a training step by the memory model (`training_memory`: parameters, gradients, optimizer
state and the activations saved for backward), plain and checkpointed (`memory_vs_batch`), the largest
batch an affine fit keeps under a budget (`largest_batch`), the device's budget (`memory_budget_bytes`)
and whether the baseline needs checkpointing to fit it (`needs_checkpointing`). It imports nothing of
lab 6: the contract `perflab.labs.lab06` plans checkpointing with it, the notebook measures with it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from perflab import env
from perflab.workload import AMP_DTYPES, REFERENCE_CHECKPOINT_STAGES, TrainConfig

# Checkpointing is planned only when training at the baseline's batch size would need more than this
# share of the device's memory (the rest: the allocator's fragmentation, the loader's batches, CUDA
# context and workspaces).
MEMORY_BUDGET_SHARE = 0.8
# ResNet-18 leaves a 32-pixel image 1x1 in its last stage, where BatchNorm in train mode cannot
# normalise a batch of one: the memory sweep starts at two.
MIN_MEMORY_BATCH = 2
# The optimizer whose state the memory model counts: TrainConfig's SGD keeps one momentum buffer.
OPTIMIZER = "sgd-momentum"


def memory_budget_bytes(info: env.MachineInfo) -> int | None:
    """MEMORY_BUDGET_SHARE of the device's memory (the GPU's, else the machine's RAM); None if unknown."""
    if info.gpu_memory_bytes:
        return int(MEMORY_BUDGET_SHARE * info.gpu_memory_bytes)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return int(MEMORY_BUDGET_SHARE * ram)


def training_memory(config: TrainConfig, batch_sizes: Sequence[int], num_classes: int = 10) -> list[int]:
    """Bytes of one training step at each batch size, by the memory model: parameters, gradients,
    optimizer state, and the activations saved for backward by the forward and loss of that many
    random images (under `config`'s autocast, memory format and checkpointing)."""
    import torch
    from torch.nn import functional as F

    from perflab import memory, workload

    device = env.pick_device(config.device)
    model = workload.build_model(config.replace(compile_mode=None), num_classes)
    model.train()
    static = memory.static_memory(model, OPTIMIZER).total
    out = []
    for b in batch_sizes:
        if b < MIN_MEMORY_BATCH:
            raise ValueError(f"batch_sizes: {b} is below {MIN_MEMORY_BATCH} (BatchNorm in train mode needs two images)")
        images = torch.randn(b, 3, config.image_size, config.image_size, device=device)
        if config.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, num_classes, (b,), device=device)
        autocast = (torch.autocast(device_type=device.type, dtype=AMP_DTYPES[config.amp_dtype])
                    if config.amp_dtype else contextlib.nullcontext())
        with autocast:
            saved = memory.activation_bytes(model, images, lambda logits, y=labels: F.cross_entropy(logits, y))
        out.append(static + saved.bytes)
    return out


def memory_vs_batch(config: TrainConfig, batches: Sequence[int], num_classes: int = 10) -> list[dict[str, Any]]:
    """`memory_vs_batch` rows for `config`, plain and with every stage checkpointed."""
    rows = []
    for checkpointed in (False, True):
        cfg = config.replace(checkpoint_stages=REFERENCE_CHECKPOINT_STAGES if checkpointed else 0)
        for b, nbytes in zip(batches, training_memory(cfg, batches, num_classes), strict=True):
            rows.append({"batch_size": int(b), "bytes": int(nbytes), "checkpointed": checkpointed})
    return rows


def largest_batch(rows: Sequence[Mapping[str, Any]], budget: float, checkpointed: bool) -> int:
    """The largest batch the affine fit of `rows` (bytes = fixed + per_image * batch) keeps under `budget`."""
    pts = sorted((r["batch_size"], r["bytes"]) for r in rows if bool(r["checkpointed"]) == checkpointed)
    if len(pts) < 2:
        raise ValueError("rows: need at least two batch sizes to fit memory against batch size")
    x, y = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
    per_image, fixed = np.polyfit(x, y, 1)
    if per_image <= 0:
        return 0
    return max(0, int((budget - fixed) // per_image))


def needs_checkpointing(config: TrainConfig, info: env.MachineInfo | None = None) -> bool:
    """Whether training `config` at its batch size needs more than the device's memory budget."""
    info = info or env.machine_info()
    budget = memory_budget_bytes(info)
    if budget is None:
        return False
    return training_memory(config, [max(config.batch_size, MIN_MEMORY_BATCH)])[0] > budget
