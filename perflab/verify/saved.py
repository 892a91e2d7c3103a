"""The activation memory of one training step, as the verify child measures it: the bytes of the
distinct storages the forward pass saves for backward, parameters apart.

The step is an opaque closure (forward, loss, backward, optimizer), so the forward is told apart by
autograd itself: tensors packed before the first unpack are what forward saved; once backward starts
unpacking, later packs (a checkpoint's recomputation) are not held across the forward/backward
boundary and are not counted. A checkpointed region installs its own saved-tensor hooks, so what it
does not save never reaches this one: the count falls by what checkpointing buys.

`saved_tensors_hooks` is bound when the child starts (`bind`), before any student code exists, so a
candidate that replaces torch's attribute does not change the measurement.
"""

from __future__ import annotations

from typing import Any


class SavedBytes:
    """Context manager: `with SavedBytes(hooks) as m: step()`, then `m.bytes`."""

    def __init__(self, saved_tensors_hooks: Any) -> None:
        self._hooks_cls = saved_tensors_hooks
        self._storages: dict[tuple[str, int], int] = {}
        self._backward_started = False
        self._hooks: Any = None

    def _pack(self, tensor: Any) -> Any:
        if not self._backward_started and not (tensor.is_leaf and tensor.requires_grad):
            storage = tensor.untyped_storage()
            self._storages.setdefault((str(tensor.device), storage.data_ptr()), storage.nbytes())
        return tensor

    def _unpack(self, tensor: Any) -> Any:
        self._backward_started = True
        return tensor

    @property
    def bytes(self) -> int:
        return sum(self._storages.values())

    def __enter__(self) -> SavedBytes:
        self._hooks = self._hooks_cls(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)


def bind() -> Any:
    """torch's saved-tensor hooks context, bound now (call before importing a candidate)."""
    import torch

    return torch.autograd.graph.saved_tensors_hooks
