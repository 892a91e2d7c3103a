"""Memory of training: what is static (parameters, gradients, optimizer state), what backward keeps
(activations saved for it), and the peak a step reaches on the device.

Static memory is measured from the real tensors (the optimizer's `state` after one step), with a
closed form beside it to check against: SGD keeps nothing, SGD with momentum one buffer per
parameter, Adam two (plus a scalar step counter per parameter tensor). Activation bytes come from
`torch.autograd.graph.saved_tensors_hooks` during the forward pass, counting each storage once.
Peak memory comes from the allocator on CUDA and MPS, and on CPU from the resident set of a child
process that runs only the function (the parent's own history cannot pollute it).
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch import nn

from perflab import env
from perflab.counting import _table, restoring_buffers

log = logging.getLogger(__name__)

# Optimizer state per trainable parameter element, in units of the parameter's size.
OPTIMIZER_STATE_FACTORS: dict[str, int] = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}
# The momentum used for "sgd-momentum" (the value TrainConfig uses: its "sgd" is this one).
SGD_MOMENTUM = 0.9
# How long to wait for a CPU peak-memory child before giving up (it starts a fresh interpreter).
CHILD_TIMEOUT_S = 600.0


def format_bytes(n: float) -> str:
    """Bytes with a binary prefix: 44.6 MiB."""
    for scale, prefix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}"
    return f"{n:.0f} B"


def _unique_params(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    out = []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# ---------------------------------------------------------------------------------------------
# Static memory: parameters, gradients, optimizer state


def make_optimizer(name: str, params: Iterable[torch.Tensor], lr: float = 1e-3) -> torch.optim.Optimizer:
    """An optimizer by name: 'sgd' (plain), 'sgd-momentum' (momentum 0.9, TrainConfig's 'sgd'), 'adam', 'adamw'."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    raise ValueError(f"optimizer: {name!r} is not one of {', '.join(map(repr, OPTIMIZER_STATE_FACTORS))}")


def optimizer_name(config: Any) -> str:
    """The memory module's optimizer name for a TrainConfig ('sgd' there means SGD with momentum)."""
    if config.optimizer == "sgd":
        return "sgd-momentum" if config.momentum else "sgd"
    return config.optimizer


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in `optimizer.state` (each storage once). Empty until the first step."""
    seen: dict[tuple[str, int], int] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.numel():
                storage = value.untyped_storage()
                seen[(str(value.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def expected_optimizer_bytes(model: nn.Module, name: str) -> int:
    """Closed form: state factor (0, 1 or 2) times trainable parameter bytes; Adam's per-tensor step
    counters (a few bytes each) are left out."""
    if name not in OPTIMIZER_STATE_FACTORS:
        raise ValueError(f"optimizer: {name!r} is not one of {', '.join(map(repr, OPTIMIZER_STATE_FACTORS))}")
    trainable = [p for p in _unique_params(model.parameters()) if p.requires_grad]
    return OPTIMIZER_STATE_FACTORS[name] * sum(_tensor_bytes(p) for p in trainable)


@dataclass(frozen=True)
class StaticMemory:
    """Memory a training step holds whatever the batch: parameters, their gradients, optimizer state."""

    optimizer: str
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int

    @property
    def total(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_bytes

    def table(self) -> str:
        rows = [("parameters", format_bytes(self.parameter_bytes)),
                ("gradients", format_bytes(self.gradient_bytes)),
                (f"optimizer ({self.optimizer})", format_bytes(self.optimizer_bytes)),
                ("total", format_bytes(self.total))]
        return _table(("static memory", "bytes"), rows)

    def __str__(self) -> str:
        return self.table()


def static_memory(model: nn.Module, optimizer: str) -> StaticMemory:
    """Measure static training memory of `model` under the named optimizer.

    The optimizer is built on the model's trainable parameters and takes one real step with
    all-zero gradients, which creates its full state without moving any weight (plain SGD,
    momentum and Adam all give a zero update for a zero gradient and no weight decay); the
    temporary gradients are removed afterwards and existing ones are kept.
    """
    params = _unique_params(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    opt = make_optimizer(optimizer, trainable)
    created = []
    for p in trainable:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
            created.append(p)
    saved = [p.grad.clone() for p in trainable]  # type: ignore[union-attr]
    try:
        for p in trainable:
            p.grad.zero_()  # type: ignore[union-attr]
        opt.step()
        state = optimizer_state_bytes(opt)
    finally:
        for p, g in zip(trainable, saved, strict=True):
            p.grad.copy_(g)  # type: ignore[union-attr]
        for p in created:
            p.grad = None
    return StaticMemory(
        optimizer=optimizer,
        parameter_bytes=sum(_tensor_bytes(p) for p in params),
        gradient_bytes=sum(_tensor_bytes(p) for p in trainable),
        optimizer_bytes=state,
    )


# ---------------------------------------------------------------------------------------------
# Activations saved for backward


@dataclass(frozen=True)
class ActivationMemory:
    """Tensors the forward pass saved for backward, each storage counted once, parameters left out.

    `by_module` attributes each storage to the innermost module running when it was first saved
    ('' for the top level, '(loss)' for the loss function).
    """

    count: int
    bytes: int
    parameter_count: int
    parameter_bytes: int
    by_module: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # name -> (count, bytes)

    def table(self, top: int | None = None) -> str:
        items = sorted(self.by_module.items(), key=lambda kv: -kv[1][1])
        if top is not None:
            items = items[:top]
        rows = [(name or "(top level)", n, format_bytes(b)) for name, (n, b) in items]
        rows.append(("total", self.count, format_bytes(self.bytes)))
        return _table(("module", "tensors", "saved bytes"), rows)

    def __str__(self) -> str:
        return self.table()


def _as_tuple(inputs: Any) -> tuple[Any, ...]:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def activation_bytes(
    model: nn.Module,
    inputs: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> ActivationMemory:
    """Run `model(*inputs)` (and `loss_fn(output)` if given) and measure what it saves for backward.

    The model runs in its current mode; buffers (BatchNorm running statistics) are restored after,
    and no backward is run. A storage saved several times (views, a tensor saved by two ops) counts
    once, at its full size; storages of parameters are counted apart, not as activations.
    """
    params = _unique_params(model.parameters())
    param_keys = {(str(p.device), p.untyped_storage().data_ptr()) for p in params}
    saved: dict[tuple[str, int], tuple[str, torch.UntypedStorage]] = {}
    stack: list[str] = [""]

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.nbytes():
            saved.setdefault((str(t.device), storage.data_ptr()), (stack[-1], storage))
        return t

    def enter(name: str) -> Callable[..., None]:
        return lambda module, args: stack.append(name)

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        stack.pop()

    handles = []
    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(enter(name)))
            handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        with restoring_buffers(model), torch.enable_grad(), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            output = model(*_as_tuple(inputs))
            if loss_fn is not None:
                stack.append("(loss)")
                loss_fn(output)
    finally:
        for h in handles:
            h.remove()
    by_module: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    count = nbytes = pcount = pbytes = 0
    for key, (owner, storage) in saved.items():
        if key in param_keys:
            pcount += 1
            pbytes += storage.nbytes()
            continue
        count += 1
        nbytes += storage.nbytes()
        by_module[owner][0] += 1
        by_module[owner][1] += storage.nbytes()
    return ActivationMemory(count, nbytes, pcount, pbytes,
                            {k: (v[0], v[1]) for k, v in by_module.items()})


# ---------------------------------------------------------------------------------------------
# Peak memory of a function


@dataclass(frozen=True)
class PeakMemory:
    """Memory before a function ran and the highest it reached while running; `delta` is its cost."""

    device: str
    method: str
    baseline_bytes: int
    peak_bytes: int

    @property
    def delta(self) -> int:
        return max(self.peak_bytes - self.baseline_bytes, 0)

    def __str__(self) -> str:
        return (f"peak {format_bytes(self.peak_bytes)} on {self.device} "
                f"(baseline {format_bytes(self.baseline_bytes)}, step cost {format_bytes(self.delta)}; "
                f"{self.method})")


def peak_memory(fn: Callable[..., Any], device: torch.device | str, *args: Any) -> PeakMemory:
    """Peak memory of `fn(*args)` on `device`.

    CUDA: the caching allocator's `max_memory_allocated` after `reset_peak_memory_stats`, the
    baseline being `memory_allocated` before. MPS: the driver's allocation after the call (the
    allocator keeps freed blocks, so this is a high-water estimate), baseline before. CPU: `fn`
    runs in a fresh child process (spawn), so `fn` and `args` must be picklable (a module-level
    function); the baseline is its resident set after imports, the peak its high-water mark.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        env.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        baseline = torch.cuda.memory_allocated(dev)
        fn(*args)
        env.synchronize(dev)
        return PeakMemory(str(dev), "cuda allocator max_memory_allocated", baseline,
                          torch.cuda.max_memory_allocated(dev))
    if dev.type == "mps":
        env.synchronize(dev)
        torch.mps.empty_cache()
        baseline = torch.mps.driver_allocated_memory()
        fn(*args)
        env.synchronize(dev)
        peak = max(torch.mps.driver_allocated_memory(), torch.mps.current_allocated_memory())
        return PeakMemory(str(dev), "mps driver_allocated_memory after the call (estimate)",
                          baseline, peak)
    if dev.type == "cpu":
        return _cpu_peak_in_child(fn, args)
    raise ValueError(f"device: {str(device)!r} is not one of {', '.join(env.DEVICE_KINDS)}")


def _current_rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _reset_high_water() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux >= 4.0); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _high_water() -> tuple[int, str]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024, "VmHWM"
    except OSError:
        pass
    import resource

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in kilobytes on Linux, bytes on macOS.
    return (maxrss if sys.platform == "darwin" else maxrss * 1024), "ru_maxrss"


def _child_entry(conn: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Runs in the child: baseline after imports (unpickling `fn` imported its module), then the peak."""
    try:
        import psutil  # noqa: F401 - imported before the baseline is read

        baseline = _current_rss()
        reset = _reset_high_water()
        fn(*args)
        peak, source = _high_water()
        method = f"child process RSS, {source}" + (" reset at baseline" if reset else " over the child's life")
        conn.send(("ok", baseline, max(peak, baseline), method))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent as text
        conn.send(("error", traceback.format_exc(), 0, ""))
    finally:
        conn.close()


def _cpu_peak_in_child(fn: Callable[..., Any], args: tuple[Any, ...]) -> PeakMemory:
    try:  # check before starting a child that would be left waiting for them
        ForkingPickler.dumps((fn, args))
    except Exception as exc:
        raise ValueError(f"fn: cannot be sent to a child process ({exc}); pass a module-level function "
                         "and picklable arguments") from exc
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    # Not a daemon: a daemonic process may not start children, and `fn` may (a DataLoader's workers:
    # `perflab profile --num-workers 2` failed on a CPU). The `finally` below ends it in every case.
    proc = ctx.Process(target=_child_entry, args=(child_conn, fn, args), daemon=False)
    proc.start()
    child_conn.close()
    try:
        if not parent_conn.poll(CHILD_TIMEOUT_S):
            raise RuntimeError(f"peak_memory: the child did not answer within {CHILD_TIMEOUT_S:.0f} s")
        status, first, peak, method = parent_conn.recv()
    except EOFError:
        proc.join(5)
        raise RuntimeError(f"peak_memory: the child process died (exit code {proc.exitcode}); "
                           "was it killed for memory?") from None
    finally:
        proc.join(CHILD_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent_conn.close()
    if status != "ok":
        raise RuntimeError(f"peak_memory: the function failed in the child process:\n{first}")
    log.debug("cpu peak in child pid %s: baseline %d, peak %d (%s)", proc.pid, first, peak, method)
    return PeakMemory("cpu", method, int(first), int(peak))


# ---------------------------------------------------------------------------------------------
# The budget of a training step


@dataclass(frozen=True)
class MemoryBudget:
    """What one training step needs: static memory plus the activations saved for backward."""

    optimizer: str
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.activations

    def shares(self) -> dict[str, float]:
        total = self.total or 1
        return {k: v / total for k, v in self.to_dict().items()}

    def to_dict(self) -> dict[str, int]:
        """The `memory_budget` section of a results file."""
        return {"parameters": self.parameters, "gradients": self.gradients,
                "optimizer": self.optimizer_state, "activations": self.activations}

    def table(self) -> str:
        shares = self.shares()
        rows = [(("optimizer (" + self.optimizer + ")") if k == "optimizer" else k,
                 format_bytes(v), f"{100 * shares[k]:.1f}%") for k, v in self.to_dict().items()]
        rows.append(("total", format_bytes(self.total), "100.0%"))
        return _table(("memory budget", "bytes", "share"), rows)

    def __str__(self) -> str:
        return self.table()


def memory_budget(
    model: nn.Module,
    optimizer_name: str,
    inputs: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> MemoryBudget:
    """The memory budget of training `model` on `inputs` with the named optimizer (see `make_optimizer`)."""
    static = static_memory(model, optimizer_name)
    acts = activation_bytes(model, inputs, loss_fn)
    return MemoryBudget(optimizer_name, static.parameter_bytes, static.gradient_bytes,
                        static.optimizer_bytes, acts.bytes)


__all__ = [
    "OPTIMIZER_STATE_FACTORS", "ActivationMemory", "MemoryBudget", "PeakMemory", "StaticMemory",
    "activation_bytes", "expected_optimizer_bytes", "format_bytes", "make_optimizer", "memory_budget",
    "optimizer_name", "optimizer_state_bytes", "peak_memory", "static_memory",
]
