"""Lab 4's check machinery: what the grader's sandboxed observation programs and its judges run.

Each function cell is judged from what the student's function does on inputs drawn from the grader's
seed, in a fresh sandboxed process the notebook's kernel cannot reach: the contract's probe exports the
function's source, the grader runs it in `observation_program(...)`, which calls an `observe_*` here
and prints what it saw, and the grader-only judges (perflab/labs/lab04/judges/) compare that with
their reference. The cases (`visible_*_case(s)`, `*_cases(seed)`, the bad arguments), the models they
run on (`StagedNet`), and the compact traces compared (`projections`, `bn_state`, `trace_checkpoint`)
live here. Nothing here decides anything.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from perflab import memory, workload
from perflab.labs.lab04 import MAX_BATCH, MIN_MEMORY_IMAGE_SIZE, STAGES, plain_cnn, resnet18
from perflab.labs.lab04.measure import MemoryModel, cross_entropy_on, memory_model, quiet

NUM_PROJECTIONS = 2  # random directions each gradient or buffer is projected on


class StagedNet(nn.Module):
    """A small CNN with named stages and BatchNorm, so the checks do not only see ResNet-18."""

    def __init__(self, width: int = 8, num_classes: int = 5) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        self.block1 = nn.Sequential(nn.Conv2d(w, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                                    nn.Conv2d(w, 2 * w, 3, stride=2, padding=1, bias=False),
                                    nn.BatchNorm2d(2 * w), nn.ReLU())
        self.block2 = nn.Sequential(nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * w, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block2(self.block1(self.stem(x))))


STAGED_NET_STAGES = ("stem", "block1", "block2", "head")


def warm_bn(model: nn.Module, x: torch.Tensor) -> None:
    """Give BatchNorm running statistics that are not the initial 0/1, so eval mode tests something."""
    was = model.training
    model.train()
    with torch.no_grad():
        model(x * 1.7 + 0.3)
    model.train(was)


@dataclass(frozen=True)
class CheckpointCase:
    """One model, input and stage choice the checkpoint checks run on."""

    name: str
    model: nn.Module
    stages: tuple[str, ...]
    x: torch.Tensor
    y: torch.Tensor


def visible_checkpoint_case() -> CheckpointCase:
    """The notebook's visible test: ResNet-18 (10 classes), 4 images of 32 px, every stage."""
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 32, 32, generator=gen), torch.randint(0, 10, (4,), generator=gen)
    return CheckpointCase("resnet18(num_classes=10) on 4x3x32x32, every stage", resnet18(10, seed=1), STAGES, x, y)


def checkpoint_cases(seed: int = 0, cases: int = 2) -> list[CheckpointCase]:
    """ResNet-18 (random classes, image size, batch, stages) and StagedNet (its first stage included)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(cases):
        gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
        if i % 2 == 0:
            classes, side, n = int(rng.integers(2, 20)), int(rng.choice([32, 40])), int(rng.integers(2, 4))
            model = resnet18(classes, seed=int(rng.integers(1000)))
            pick = rng.random(len(STAGES)) < 0.6
            if not pick.any():
                pick[int(rng.integers(len(STAGES)))] = True
            stages = tuple(s for s, p in zip(STAGES, pick, strict=True) if p)
            name = f"resnet18(num_classes={classes}) on {n}x3x{side}x{side}, stages {stages}"
        else:
            classes, side, n = int(rng.integers(2, 9)), int(rng.choice([8, 12, 16])), int(rng.integers(2, 6))
            width = int(rng.choice([4, 8, 12]))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(rng.integers(1000)))
                model = StagedNet(width, classes)
            stages = ("stem",) + tuple(s for s in STAGED_NET_STAGES[1:] if rng.random() < 0.5)
            name = f"StagedNet(width={width}) on {n}x3x{side}x{side}, stages {stages}"
        x = torch.randn(n, 3, side, side, generator=gen)
        y = torch.randint(0, classes, (n,), generator=gen)
        warm_bn(model, x)
        out.append(CheckpointCase(name, model, stages, x, y))
    return out


def projections(tensors: Sequence[torch.Tensor | None]) -> list[list[float] | None]:
    """Each tensor as [norm, largest |entry|, and its dot products with NUM_PROJECTIONS fixed random
    directions] (None stays None): enough to tell a wrong gradient from a right one, in a few numbers."""
    out: list[list[float] | None] = []
    for i, t in enumerate(tensors):
        if t is None:
            out.append(None)
            continue
        flat = t.detach().double().reshape(-1).cpu()
        gen = torch.Generator().manual_seed(10_007 * (i + 1))
        dirs = torch.randn(NUM_PROJECTIONS, flat.numel(), generator=gen, dtype=torch.float64)
        out.append([float(flat.norm()), float(flat.abs().max()) if flat.numel() else 0.0, *map(float, dirs @ flat)])
    return out


def bn_state(model: nn.Module) -> tuple[list[torch.Tensor], list[int]]:
    """BatchNorm running statistics (float buffers) and num_batches_tracked values of `model`."""
    floats, counts = [], []
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            floats += [m.running_mean.detach().clone(), m.running_var.detach().clone()]
            counts.append(int(m.num_batches_tracked))
    return floats, counts


def train_step_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """One train-mode forward and backward from cleared gradients: (outputs, gradients)."""
    model.train()
    model.zero_grad(set_to_none=True)
    with quiet():
        out = model(x)
        F.cross_entropy(out, y).backward()
    return out.detach(), [p.grad for p in model.parameters()]


def trace_checkpoint(model: nn.Module, case: CheckpointCase) -> dict[str, Any]:
    """What a (checkpointed or plain) copy of the case's model does, in a fixed order: eval outputs,
    saved activation bytes, then two training steps (outputs and gradients of the first, BatchNorm
    state after each). The grader runs the same sequence on the plain model."""
    from perflab.grading.probing import encode

    model.eval()
    with torch.no_grad(), quiet():
        eval_out = model(case.x)
    with quiet():
        saved = memory.activation_bytes(model.train(), case.x, cross_entropy_on(case.y)).bytes
    train_out, grads = train_step_of(model, case.x, case.y)
    bn: list[dict[str, Any]] = []
    for step in range(2):
        if step:
            train_step_of(model, case.x, case.y)
        floats, counts = bn_state(model)
        bn.append({"running": projections(floats), "counts": counts})
    return {"eval_out": encode(eval_out), "saved": int(saved), "train_out": encode(train_out),
            "grads": projections(grads), "bn": bn}


def raised(exc: BaseException) -> dict[str, Any]:
    """An exception as data: its type and (the start of) its message."""
    return {"raised": type(exc).__name__, "message": str(exc)[:400]}


def observe_checkpoint(checkpoint_stages: Callable[..., nn.Module], seed: int) -> dict[str, Any]:
    """The student's checkpoint_stages on the visible case and on the hidden cases of `seed`."""
    def one(case: CheckpointCase) -> dict[str, Any]:
        model = copy.deepcopy(case.model)
        before = [id(p) for p in model.parameters()]
        try:
            with quiet():
                got = checkpoint_stages(model, case.stages)
            if not isinstance(got, nn.Module):
                return {"returned": type(got).__name__}
            in_place = [id(p) for p in got.parameters()] == before
            return {"in_place": in_place, **trace_checkpoint(got, case)}
        except Exception as exc:
            return raised(exc)

    return {"visible": one(visible_checkpoint_case()), "hidden": [one(c) for c in checkpoint_cases(seed)]}


# The budget search: memory functions described as data, so the grader builds the same ones.

def memory_function(desc: Mapping[str, Any]) -> Callable[[int], float]:
    """A non-decreasing memory function from its description (see `largest_batch_cases`)."""
    kind = desc["kind"]
    if kind == "affine":
        a, c = float(desc["a"]), float(desc["c"])
        return lambda b: a + c * b
    if kind == "steps":
        a, c, block = float(desc["a"]), float(desc["c"]), float(desc["block"])
        return lambda b: math.ceil((a + c * b) / block) * block
    if kind == "table":
        values = np.cumsum(np.random.default_rng(int(desc["seed"])).exponential(1e5, size=int(desc["length"]))
                           * (np.random.default_rng(int(desc["seed"]) + 1).random(int(desc["length"])) < 0.6)) + 1e6
        return lambda b: float(values[b - 1])
    if kind in ("resnet18", "resnet18-checkpointed"):
        return resnet_memory(int(desc["classes"]), int(desc["model_seed"]), kind.endswith("checkpointed"))
    raise ValueError(f"unknown memory function kind {kind!r}")


_RESNET_MEMORY: dict[tuple[int, int, bool], MemoryModel] = {}


def resnet_memory(classes: int, seed: int, checkpointed: bool) -> MemoryModel:
    """The memory model of ResNet-18 at MIN_MEMORY_IMAGE_SIZE, every stage checkpointed or none; cached."""
    key = (classes, seed, checkpointed)
    if key not in _RESNET_MEMORY:
        model = resnet18(classes, seed=seed)
        if checkpointed:
            for name in STAGES:
                setattr(model, name, workload.CheckpointedStage(getattr(model, name)))
        _RESNET_MEMORY[key] = memory_model(model, MIN_MEMORY_IMAGE_SIZE)
    return _RESNET_MEMORY[key]


def visible_largest_batch_cases() -> list[dict[str, Any]]:
    """The notebook's visible test: a straight line, nothing fits, everything fits, allocator steps."""
    line = {"kind": "affine", "a": 1000.0, "c": 10.0}
    steps = {"kind": "steps", "a": 3e6, "c": 1e5, "block": float(2**20)}
    return [{"fn": line, "budget": 1370.0, "max_batch": MAX_BATCH}, {"fn": line, "budget": 1005.0, "max_batch": MAX_BATCH},
            {"fn": line, "budget": 1e9, "max_batch": 100},
            {"fn": steps, "budget": float(2**20 * math.ceil((3e6 + 1e5 * 50) / 2**20)), "max_batch": MAX_BATCH}]


def largest_batch_cases(seed: int, cases: int = 24) -> list[dict[str, Any]]:
    """Random non-decreasing memory functions (affine, allocator-like steps, plateaus) and budgets below,
    between, on and above their values."""
    rng = np.random.default_rng(seed)
    out = []
    for case in range(cases):
        max_batch = int(rng.choice([1, int(rng.integers(2, 64)), int(rng.integers(64, 5000))]))
        kind = case % 3
        a, c = float(rng.uniform(1e6, 1e9)), float(rng.uniform(1e3, 1e7))
        if kind == 0:
            desc: dict[str, Any] = {"kind": "affine", "a": a, "c": c}
        elif kind == 1:
            desc = {"kind": "steps", "a": a, "c": c, "block": float(2 ** int(rng.integers(20, 23)))}
        else:
            desc = {"kind": "table", "seed": int(rng.integers(1 << 30)), "length": max_batch}
        fn = memory_function(desc)
        first, last = fn(1), fn(max_batch)
        where = rng.random()
        if where < 0.1:
            budget = float(first * rng.uniform(0.5, 0.99))  # nothing fits
        elif where < 0.2:
            budget = float(last * rng.uniform(1.0, 2.0))  # everything fits
        else:
            budget = float(fn(int(rng.integers(1, max_batch + 1))))  # exactly on a value
            if rng.random() < 0.5:
                budget += float(rng.uniform(0, 1)) * 1e3
        out.append({"fn": desc, "budget": budget, "max_batch": max_batch})
    return out


def model_budget_cases(seed: int, budgets: int = 3) -> list[dict[str, Any]]:
    """Hidden budgets on the memory model of ResNet-18 at MIN_MEMORY_IMAGE_SIZE, plain and checkpointed."""
    rng = np.random.default_rng(seed)
    classes, model_seed = int(rng.integers(2, 20)), int(rng.integers(1000))
    out = []
    for i in range(budgets):
        desc = {"kind": "resnet18" if i % 2 == 0 else "resnet18-checkpointed", "classes": classes,
                "model_seed": model_seed}
        fn = memory_function(desc)
        per_sample = fn(2) - fn(1)
        budget = fn(1) - 1.0 if i == budgets - 1 else fn(int(rng.integers(1, 13))) + float(rng.uniform(0, 1)) * per_sample
        out.append({"fn": desc, "budget": float(budget), "max_batch": int(rng.choice([64, 1024, MAX_BATCH]))})
    return out


LARGEST_BATCH_BAD = ({"budget_bytes": 0}, {"budget_bytes": -5.0}, {"budget_bytes": float("nan")},
                     {"budget_bytes": 1e9, "max_batch": 0})


def observe_largest_batch(largest_batch: Callable[..., int], seed: int) -> dict[str, Any]:
    """The student's answers and the batch sizes it tried, on the visible, hidden and model cases."""
    from perflab.grading.probing import encode

    def one(case: Mapping[str, Any]) -> dict[str, Any]:
        fn = memory_function(case["fn"])
        tried: list[Any] = []

        def memory_of(b: int) -> float:
            tried.append(b if isinstance(b, (int, np.integer)) and not isinstance(b, bool) else repr(b))
            if not isinstance(b, (int, np.integer)) or isinstance(b, bool) or not 1 <= b <= case["max_batch"]:
                raise ValueError(f"memory_of was called with batch size {b!r}, outside 1..max_batch")
            return fn(int(b))

        try:
            with quiet():
                got = largest_batch(case["budget"], memory_of, max_batch=case["max_batch"])
        except Exception as exc:
            return {**raised(exc), "tried": encode(tried)}
        return {"value": encode(got), "tried": encode([int(t) if not isinstance(t, str) else t for t in tried])}

    bad = []
    for args in LARGEST_BATCH_BAD:
        kwargs = {"max_batch": args["max_batch"]} if "max_batch" in args else {}
        try:
            with quiet():
                value = largest_batch(args["budget_bytes"], lambda b: 1.0, **kwargs)
            bad.append({"value": encode(value)})
        except Exception as exc:
            bad.append(raised(exc))
    return {"visible": [one(c) for c in visible_largest_batch_cases()],
            "hidden": [one(c) for c in largest_batch_cases(seed)],
            "model": [one(c) for c in model_budget_cases(seed + 1)], "bad": bad}


# Gradient accumulation: models and batches described as data.

def visible_accumulate_case() -> dict[str, Any]:
    """The notebook's visible test: a CNN without BatchNorm, 10 samples in micro-batches of 4."""
    return {"model": "cnn", "width": 8, "classes": 5, "model_seed": 3, "side": 8, "n": 10, "micro": 4,
            "data_seed": 3, "train": True}


def accumulate_cases(seed: int, cases: int = 3) -> list[dict[str, Any]]:
    """BN-free CNNs in train mode and ResNet-18 with BatchNorm in eval mode; uneven last micro-batches,
    one sample, the whole batch, more than the batch."""
    rng = np.random.default_rng(seed)
    out = []
    for case in range(cases):
        if case % 2 == 0:
            desc = {"model": "cnn", "width": int(rng.choice([4, 8])), "classes": int(rng.integers(2, 9)),
                    "side": int(rng.choice([8, 12, 16])), "n": int(rng.integers(5, 19)), "train": True}
            smallest = 1
        else:
            desc = {"model": "resnet18", "classes": int(rng.integers(2, 12)), "side": 32,
                    "n": int(rng.integers(5, 11)), "train": False}
            smallest = 2  # ResNet-18 at batch 1 costs time and teaches nothing more
        n = desc["n"]
        desc["model_seed"] = int(rng.integers(1000))
        desc["micro"] = int(rng.choice([smallest, int(rng.integers(2, n)), n, n + int(rng.integers(1, 4))]))
        desc["data_seed"] = int(rng.integers(1 << 30))
        out.append(desc)
    return out


def accumulate_setup(desc: Mapping[str, Any]) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The case's model (in its mode, BatchNorm warmed) and batch."""
    gen = torch.Generator().manual_seed(int(desc["data_seed"]))
    n, side, classes = int(desc["n"]), int(desc["side"]), int(desc["classes"])
    x = torch.randn(n, 3, side, side, generator=gen)
    y = torch.randint(0, classes, (n,), generator=gen)
    if desc["model"] == "cnn":
        model = plain_cnn(int(desc["width"]), classes, seed=int(desc["model_seed"]))
    else:
        model = resnet18(classes, seed=int(desc["model_seed"]))
        warm_bn(model, x)
    model.train(bool(desc["train"]))
    return model, x, y


ACCUMULATE_BAD = (0, -2, 1.5)


def observe_accumulate(accumulate_gradients: Callable[..., float], seed: int) -> dict[str, Any]:
    """The student's loss, gradients, the micro-batches the model saw and its mode after, per case."""
    from perflab.grading.probing import encode

    def one(desc: Mapping[str, Any]) -> dict[str, Any]:
        model, x, y = accumulate_setup(desc)
        mode = model.training
        gen = torch.Generator().manual_seed(int(desc["data_seed"]) + 1)
        for p in model.parameters():  # stale gradients the function must not add to
            p.grad = torch.randn(p.shape, generator=gen)
        seen: list[int] = []
        handle = model.register_forward_pre_hook(lambda m, args: seen.append(int(args[0].shape[0])))
        try:
            with quiet():
                loss = accumulate_gradients(model, x, y, int(desc["micro"]))
        except Exception as exc:
            return raised(exc)
        finally:
            handle.remove()
        is_number = isinstance(loss, float) or (torch.is_tensor(loss) and loss.numel() == 1)
        return {"loss": encode(float(loss)) if is_number else {"type": type(loss).__name__}, "seen": seen,
                "mode_kept": model.training == mode, "grads": projections([p.grad for p in model.parameters()])}

    bad = []
    for micro in ACCUMULATE_BAD:
        try:
            with quiet():
                accumulate_gradients(plain_cnn(), torch.randn(4, 3, 8, 8), torch.zeros(4, dtype=torch.long), micro)
            bad.append({"value": None})
        except Exception as exc:
            bad.append(raised(exc))
    return {"visible": one(visible_accumulate_case()), "hidden": [one(d) for d in accumulate_cases(seed)], "bad": bad}


# How the grader runs the observations.

OBSERVERS = {"checkpoint_stages": "observe_checkpoint", "largest_batch": "observe_largest_batch",
             "accumulate_gradients": "observe_accumulate"}
# Torch threads of the grader's observations (in its sandbox) and of the references it compares them with
# (in the grading process): one count on both sides, so both run the same kernels and round alike. With 1
# thread against 2, ResNet-18 at batch 2 in train mode (BatchNorm over 2 values) gave gradients 3e-4 apart.
OBSERVATION_THREADS = 1


@contextlib.contextmanager
def observation_threads() -> Iterator[None]:
    """Run the block on OBSERVATION_THREADS torch threads, then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(OBSERVATION_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def observation_program(function: str, source: str, seed: int) -> str:
    """The program the grader runs (in its sandbox) to observe the student's `function` from its source."""
    return (f"import json as _json\nfrom perflab.labs.lab04 import checks as _checks\n"
            f"_observe = _checks.{OBSERVERS[function]}\n\n"
            f"{source}\n\n\nwith _checks.observation_threads():\n    _seen = _observe({function}, {int(seed)})\n"
            "print('PERFLAB-OBSERVED ' + _json.dumps(_seen, allow_nan=False))\n")
