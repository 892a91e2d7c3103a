"""The training set decoded once into device memory: one copy per (data, image size, device) a process
shares between the workloads it builds (`TrainConfig.data_on_device`; `workload.DeviceBatches` reads it).
"""

from __future__ import annotations

import weakref

import torch

from perflab import env


class DecodedSet:
    """A training split decoded into uint8 squares on a device, with its labels."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels


# One decoded copy per (data, image size, device) while any workload holds it (the verifier's two sides,
# lab 6's chain), and the last one decoded kept besides, so that the workloads a notebook builds one
# after another (screening, chain, accuracy) do not decode the set again each time.
_DECODED: weakref.WeakValueDictionary[tuple[str, int, str], DecodedSet] = weakref.WeakValueDictionary()
_LAST_DECODED: list[DecodedSet] = []
# Seconds this process has spent decoding sets into device memory: the verifier leaves them out of
# each side's setup time (whichever side decodes first pays them).
DECODE_SECONDS = [0.0]
# Images a batch of the decoding loader: small, so that its shared-memory queue stays small too.
DECODE_BATCH = 32


def _device_key(device: torch.device) -> str:
    """`device` with its index (cuda and cuda:0 are one device)."""
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def _free_device_bytes(device: torch.device) -> int:
    """Bytes a new tensor can take on a CUDA `device`: the driver's free memory and what PyTorch's
    caching allocator holds reserved but unused."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def decoded_on_device(data: str, image_size: int, device: torch.device) -> DecodedSet:
    """The training split of `data` decoded once into `device` memory (`dataset.square_transform`)."""
    import time

    from perflab import dataset as ds

    key = (data, image_size, _device_key(device))
    found = _DECODED.get(key)
    if found is not None:
        return found
    start_time = time.perf_counter()
    squares = ds.load(data, image_size=image_size, train=True, squares=True)
    side = ds.device_side_size(image_size)
    need = len(squares) * 3 * side * side
    if device.type == "cuda":
        free = _free_device_bytes(device)
        if need > free // 2:
            raise ValueError(f"data_on_device: the training set needs {need / 2**30:.1f} GiB decoded, over half of "
                             f"the {free / 2**30:.1f} GiB free on {device}: load it with workers instead")
    _LAST_DECODED.clear()  # the previous set's memory goes back before this one takes its own
    images = torch.empty((len(squares), 3, side, side), dtype=torch.uint8, device=device)
    labels = torch.empty(len(squares), dtype=torch.long, device=device)
    workers = env.fed_workers() if len(squares) > 2048 else 0
    start = 0
    for batch, targets in torch.utils.data.DataLoader(squares, batch_size=DECODE_BATCH, num_workers=workers):
        images[start:start + len(batch)] = batch.to(device)
        labels[start:start + len(targets)] = targets.to(device)
        start += len(batch)
    decoded = DecodedSet(images, labels)
    _DECODED[key] = decoded
    _LAST_DECODED.append(decoded)
    DECODE_SECONDS[0] += time.perf_counter() - start_time
    return decoded
