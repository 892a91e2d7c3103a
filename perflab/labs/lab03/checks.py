"""Lab 3's checks of amp_train_step and AMP_CONFIG: what the visible tests, the probes and the judges run.

Small random CNN problems drawn from a seed (`Problem`), the FP32 reference step, and for each thing
the student's step must do an `observe_*` (run the student's function, return what it did as data) and
a `*_from` (what is wrong with that data, in words), with the visible checks the notebook's test cells
call (`parity_problems`, `low_precision_problems`, `scaler_problems`, `check_config`). The census
check is `perflab.labs.lab03.census`'s. This module imports the contract `perflab.labs.lab03`, never
the reverse; the probes (`perflab.labs.lab03.probes`) run the `observe_*` functions and the grader-only
`perflab/labs/lab03/judges/` judges with the `*_from` ones. The tolerances below are the ones these
checks hold a student's step to.
"""

from __future__ import annotations

import functools
import math
import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from perflab.labs.lab03 import (
    DTYPES,
    StepFn,
    as_dtype,
    baseline_config,
    config_problems,
    dtype_name,
    make_scaler,
)
from perflab.verify.tolerance import LOSS_TOLERANCE, LOSS_TRAJECTORY_RTOL
from perflab.workload import TrainConfig

# Loss tolerances of the step checks, relative to the FP32 reference's loss, per precision.
# The first step is the same initial model on the same batch, so it differs by rounding alone:
# measured on the checks' small CNNs over 400 random problems on a CPU, bf16 (8-bit mantissa) stayed
# under 0.10% and fp16 (11-bit) under 0.02%; the bounds leave 10x room for other kernels (GPUs). FP32
# against FP32 differs by summation order only (TF32 or another cuDNN algorithm on a GPU).
FIRST_STEP_RTOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2, torch.float16: 2e-3}
# Later steps follow the updates, and SGD with momentum amplifies rounding: over PARITY_STEPS steps of
# the same 400 problems bf16 drifted by up to 1.2% and fp16 by up to 0.4%; the bounds leave 5x room.
# A wrong step (a skipped or doubled update, a scaled gradient applied, a forgotten zero_grad) moves
# the loss by far more.
TRAJECTORY_RTOL = {torch.float32: 1e-2, torch.bfloat16: 0.06, torch.float16: 0.02}
# The same gate for a whole TrainConfig (ResNet-18 on the lab's data), with perflab.verify's bounds: its
# first-step loss differs from FP32's by rounding (measured 0.8% for bf16 at batch 8), and BatchNorm
# over a small batch then amplifies the difference (up to 18% within four steps).
RESNET_FIRST_STEP_RTOL = {dtype: LOSS_TOLERANCE[name][0] for name, dtype in DTYPES.items()}
RESNET_TRAJECTORY_RTOL = LOSS_TRAJECTORY_RTOL
CONFIG_GATE_STEPS = 2
# Absolute slack on top of the relative bounds: a loss near zero has no relative scale.
LOSS_ATOL = 1e-3
# Steps of each fixed-seed parity check: enough for momentum to build up, few enough to be quick.
PARITY_STEPS = 6
# The GradScaler checks. A scale of 2**10 leaves fp16 gradients finite, so one good step with
# growth_interval=1 must double it; 2**60 overflows any fp16 gradient of these nets (fp16 tops out
# at 65504), so the step must be skipped, the parameters left untouched and the scale halved.
SAFE_SCALE = 2.0**10
OVERFLOW_SCALE = 2.0**60
# Relative tolerance of one scaled fp16 step's parameter update against the FP32 reference's: an
# update left scaled is SAFE_SCALE (1024x) too large; fp16 rounding moved it by under 0.3% over 200
# random problems.
UPDATE_RTOL = 0.05
# Steps of the "never NaN" run: fp16 with a GradScaler starting far too high, so it has to back off
# several times; each backoff halves the scale, from 2**24 that is a handful of skipped steps.
NAN_STEPS = 12
NAN_INIT_SCALE = 2.0**24
# An fp16 update without unscaling is 2**10 times too big; with lr 0.05 that diverges to inf/NaN.
CHECK_LR = 0.05
CHECK_MOMENTUM = 0.9
# torch threads the checks run on (see one_thread).
CHECK_THREADS = 1


# ---------------------------------------------------------------------------------------------
# Small problems for the checks: random shapes, fixed by a seed


@dataclass(frozen=True)
class Problem:
    """A small CNN classification problem whose shapes and data follow from `seed`.

    `model()` builds the same initial network every time; `batch(step)` gives step `step`'s batch.
    Widths are drawn both on and off multiples of 8, so nothing depends on tensor-core-friendly shapes.
    """

    seed: int
    batch_size: int
    side: int
    widths: tuple[int, ...]
    classes: int
    extra: tuple[str, ...] = ()   # extra leaf layers to vary the census: "maxpool", "dropout", "gelu"
    device: str = "cpu"

    @classmethod
    def draw(cls, seed: int, device: str = "cpu") -> Problem:
        rng = random.Random(seed)
        depth = rng.randint(1, 3)
        widths = tuple(rng.choice((6, 8, 12, 16, 20, 24, 32)) for _ in range(depth))
        extra = tuple(sorted(rng.sample(("maxpool", "dropout", "gelu"), rng.randint(0, 2))))
        return cls(seed=seed, batch_size=rng.choice((4, 6, 8, 12, 16)), side=rng.choice((12, 16, 20, 24)),
                   widths=widths, classes=rng.randint(3, 10), extra=extra, device=device)

    def model(self) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            layers: list[nn.Module] = []
            channels = 3
            for i, width in enumerate(self.widths):
                layers += [nn.Conv2d(channels, width, 3, stride=1 if i == 0 else 2, padding=1, bias=False),
                           nn.BatchNorm2d(width), nn.GELU() if "gelu" in self.extra else nn.ReLU()]
                if i == 0 and "maxpool" in self.extra:
                    layers.append(nn.MaxPool2d(2))
                channels = width
            layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
            if "dropout" in self.extra:
                layers.append(nn.Dropout(0.0))  # p=0: the same numbers with or without it
            layers.append(nn.Linear(channels, self.classes))
            model = nn.Sequential(*layers)
        return model.to(self.device).train()

    def batch(self, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000 + step)
        images = torch.randn(self.batch_size, 3, self.side, self.side, generator=gen)
        labels = torch.randint(0, self.classes, (self.batch_size,), generator=gen)
        return images.to(self.device), labels.to(self.device)

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=CHECK_LR, momentum=CHECK_MOMENTUM)

    def describe(self) -> str:
        extra = f", with {'+'.join(self.extra)}" if self.extra else ""
        return (f"Problem(seed={self.seed}): batch {self.batch_size}, {self.side}x{self.side} images, conv widths "
                f"{list(self.widths)}, {self.classes} classes{extra}, on {self.device}")


def fp32_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
              labels: torch.Tensor) -> float:
    """The FP32 reference step the checks compare against: forward, loss, backward, step, clear."""
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def _run(problem: Problem, step: StepFn | None, steps: int, dtype: torch.dtype,
         scaler: torch.amp.GradScaler | None = None) -> tuple[list[float], nn.Module]:
    """`steps` steps of `problem` through `step` (None: the FP32 reference); the losses and the model."""
    model = problem.model()
    optimizer = problem.optimizer(model)
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. GradScaler's note about devices: not the student's doing
        for k in range(steps):
            images, labels = problem.batch(k)
            if step is None:
                loss = fp32_step(model, optimizer, images, labels)
            else:
                loss = step(model, optimizer, images, labels, dtype=dtype, scaler=scaler)
            losses.append(loss_float(loss, f"step {k + 1}"))
    return losses, model


def loss_float(loss: Any, where: str) -> float:
    """What the student's step returned as a float; TypeError, saying `where`, for anything but one number."""
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise TypeError(f"amp_train_step returned a tensor of shape {tuple(loss.shape)} at {where}; "
                            "return the loss as a float")
        return float(loss.detach())
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return float(loss)
    raise TypeError(f"amp_train_step returned {type(loss).__name__} at {where}; return the loss as a float")


# ---------------------------------------------------------------------------------------------
# Checks (each returns the problems found, in words; empty when all is well)


def one_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a check on one torch thread, restored afterwards: the checks' networks are tiny, and on a busy
    machine a second thread only waits for a core (measured: 10x slower under load on 2 cores)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        threads = torch.get_num_threads()
        torch.set_num_threads(CHECK_THREADS)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return wrapper


@one_thread
def observe_parity(step: StepFn, seed: int, dtype: str | torch.dtype, *, device: str = "cpu",
                   steps: int = PARITY_STEPS) -> dict[str, Any]:
    """What `steps` fixed-seed steps of `step` at `dtype` give, as data: losses, parameter dtypes."""
    dtype = as_dtype(dtype)
    problem = Problem.draw(seed, device)
    scaler = make_scaler(torch.device(device).type, dtype)
    try:
        got, model = _run(problem, step, steps, dtype, scaler)
    except Exception as exc:  # the student's step may fail in any way: that is an answer too
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"losses": got, "param_dtypes": {name: dtype_name(p.dtype) for name, p in model.named_parameters()}}


@one_thread
def parity_from(observed: Any, seed: int, dtype: str | torch.dtype, *, device: str = "cpu",
                steps: int = PARITY_STEPS) -> list[str]:
    """What is wrong with `observe_parity`'s data: losses within tolerance of FP32, never NaN, FP32 parameters."""
    dtype = as_dtype(dtype)
    problem = Problem.draw(seed, device)
    where = f"{problem.describe()}, dtype {dtype_name(dtype)}"
    if not isinstance(observed, Mapping) or "losses" not in observed:
        raised = observed.get("raised", "no result") if isinstance(observed, Mapping) else "no result"
        return [f"{where}: amp_train_step raised {raised}: {observed.get('message', '') if isinstance(observed, Mapping) else ''}"]
    reference, _ = _run(problem, None, steps, torch.float32)
    got = [_number(v) for v in observed["losses"]]
    if len(got) != steps:
        return [f"{where}: expected {steps} losses, got {len(got)}"]
    for k, (a, b) in enumerate(zip(reference, got, strict=True)):
        if not math.isfinite(b):
            return [f"{where}: the loss of step {k + 1} is {b} (FP32 gives {a:.4f}); it must never be NaN or inf"]
        rtol = FIRST_STEP_RTOL[dtype] if k == 0 else TRAJECTORY_RTOL[dtype]
        if abs(a - b) > LOSS_ATOL + rtol * abs(a):
            hint = (" (the first step sees the same model and batch, so only rounding may differ: is the loss "
                    "returned unscaled, computed on this batch?)" if k == 0 else
                    " (is every step applied exactly once, and are gradients cleared after each step?)")
            return [f"{where}: step {k + 1} loss {b:.5g} differs from FP32's {a:.5g} by {abs(a - b):.3g}, more "
                    f"than {LOSS_ATOL + rtol * abs(a):.3g}{hint}; FP32 losses {_fmt(reference)}, yours {_fmt(got)}"]
    dtypes = observed.get("param_dtypes")
    names = [name for name, _ in problem.model().named_parameters()]
    if not isinstance(dtypes, Mapping) or sorted(dtypes) != sorted(names):
        return [f"{where}: the model's parameters could not be read after the steps"]
    bad = [name for name in names if dtypes[name] != "float32"]
    if bad:
        return [f"{where}: parameters {', '.join(bad[:3])} are {dtypes[bad[0]]} "
                "after the steps; keep the model in FP32 and let autocast cast on the fly"]
    return []


def _number(value: Any) -> float:
    from perflab.grading.probing import decode_float

    number = decode_float(value)
    if number is None:
        raise TypeError(f"expected a number, got {value!r:.60}")
    return number


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


@one_thread
def observe_low_precision(step: StepFn, seed: int, dtype: str | torch.dtype, *, device: str = "cpu") -> dict[str, Any]:
    """One step of `step` at `dtype`, as data: the output dtype of every convolution and linear call, and
    the parameters left with a non-zero gradient."""
    dtype = as_dtype(dtype)
    problem = Problem.draw(seed, device)
    model = problem.model()
    optimizer = problem.optimizer(model)
    seen: list[list[str]] = []

    def record(module: nn.Module, inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):  # convolutions and linear layers return one tensor
            seen.append([type(module).__name__, dtype_name(output.dtype)])

    handles = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    images, labels = problem.batch(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step(model, optimizer, images, labels, dtype=dtype, scaler=make_scaler(torch.device(device).type, dtype))
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    finally:
        for handle in handles:
            handle.remove()
    left = [name for name, p in model.named_parameters() if p.grad is not None and bool(p.grad.abs().sum() > 0)]
    return {"seen": seen, "grads_left": left}


def low_precision_from(observed: Any, seed: int, dtype: str | torch.dtype, *, device: str = "cpu") -> list[str]:
    """What is wrong with `observe_low_precision`'s data: every conv/linear call in `dtype`, no gradient left."""
    dtype = as_dtype(dtype)
    problem = Problem.draw(seed, device)
    where = f"{problem.describe()}, dtype {dtype_name(dtype)}"
    if not isinstance(observed, Mapping) or "seen" not in observed:
        raised = observed.get("raised", "no result") if isinstance(observed, Mapping) else "no result"
        return [f"{where}: amp_train_step raised {raised}"]
    seen = observed["seen"]
    expected = len(problem.widths) + 1
    if not isinstance(seen, list) or len(seen) != expected:
        return [f"{where}: {len(seen) if isinstance(seen, list) else 0} convolution/linear calls ran, expected "
                f"{expected} (one forward pass per step)"]
    wrong = [(name, got) for name, got in seen if got != dtype_name(dtype)]
    if wrong:
        name, got = wrong[0]
        return [f"{where}: a {name} produced {got}, not {dtype_name(dtype)}; run the forward pass "
                f"under torch.autocast(device_type=images.device.type, dtype=dtype)"
                + (" (and no autocast at all for float32)" if dtype == torch.float32 else "")]
    left = observed.get("grads_left")
    if not isinstance(left, list):
        return [f"{where}: the gradients could not be read after the step"]
    if left:
        return [f"{where}: gradients of {', '.join(map(str, left[:3]))} are still there after the step; end with "
                "optimizer.zero_grad(set_to_none=True)"]
    return []


@one_thread
def observe_scaler(step: StepFn, seed: int, *, device: str = "cpu") -> dict[str, Any]:
    """fp16 with a GradScaler, as data, in three parts: a safe scale (the loss returned, the norm of the
    update applied, the scale after), an overflowing one (the largest parameter change, the scale after,
    the loss) and a run from a large scale (its losses, parameters left non-finite)."""
    dtype = torch.float16
    device_type = torch.device(device).type
    problem = Problem.draw(seed, device)
    images, labels = problem.batch(0)

    def safe_scale() -> dict[str, Any]:
        model = problem.model()
        before = [p.detach().clone() for p in model.parameters()]
        scaler = torch.amp.GradScaler(device_type, init_scale=SAFE_SCALE, growth_interval=1)
        loss = loss_float(step(model, problem.optimizer(model), images, labels, dtype=dtype, scaler=scaler),
                          "the first step")
        update = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)])
        return {"loss": loss, "update_norm": float(update.float().norm()), "scale": scaler.get_scale()}

    def overflow() -> dict[str, Any]:
        model = problem.model()
        before = [p.detach().clone() for p in model.parameters()]
        scaler = torch.amp.GradScaler(device_type, init_scale=OVERFLOW_SCALE, growth_interval=1)
        loss = loss_float(step(model, problem.optimizer(model), images, labels, dtype=dtype, scaler=scaler),
                          "the overflow step")
        change = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before, strict=True))
        return {"loss": loss, "max_change": change, "scale": scaler.get_scale()}

    def never_nan() -> dict[str, Any]:
        scaler = torch.amp.GradScaler(device_type, init_scale=NAN_INIT_SCALE)
        losses, model = _run(problem, step, NAN_STEPS, dtype, scaler)
        return {"losses": losses, "nonfinite": sum(int((~torch.isfinite(p)).sum()) for p in model.parameters())}

    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, part in (("safe", safe_scale), ("overflow", overflow), ("never_nan", never_nan)):
            try:
                out[name] = part()
            except Exception as exc:  # the student's step failed in this part: that part's answer
                out[name] = {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return out


@one_thread
def scaler_from(observed: Any, seed: int, *, device: str = "cpu") -> list[str]:
    """What is wrong with `observe_scaler`'s data: scaled backward, unscaled update, skipped overflow,
    updated scale, never NaN. Each part is reported on its own."""
    dtype = torch.float16
    problem = Problem.draw(seed, device)
    where = f"{problem.describe()}, fp16 with a GradScaler"
    images, labels = problem.batch(0)
    if not isinstance(observed, Mapping):
        return [f"{where}: no result"]
    problems: list[str] = []
    names = {"safe": "from a scale of 2**10", "overflow": "from a scale of 2**60",
             "never_nan": f"over {NAN_STEPS} steps from a scale of 2**24"}
    parts = {}
    for key, name in names.items():
        part = observed.get(key)
        if not isinstance(part, Mapping) or "raised" in part:
            raised = part.get("raised", "no result") if isinstance(part, Mapping) else "no result"
            message = part.get("message", "") if isinstance(part, Mapping) else ""
            if "No inf checks were recorded" in str(message):  # torch's words for update() without step()
                message = ("scaler.update() ran, but no scaler.step(optimizer) before it: call "
                           "scaler.step(optimizer) instead of optimizer.step() (it unscales the gradients "
                           "and skips the step when they overflowed), then scaler.update()")
            problems.append(f"{where}, {name}: the step raised {raised}: {message}")
        else:
            parts[key] = part
    if "safe" in parts:
        part = parts["safe"]
        ref_model = problem.model()
        before = [p.detach().clone() for p in ref_model.parameters()]
        ref_loss = fp32_step(ref_model, problem.optimizer(ref_model), images, labels)
        ref_update = torch.cat([(p.detach() - b).flatten() for p, b in zip(ref_model.parameters(), before, strict=True)])
        loss, norm, scale = _number(part.get("loss")), _number(part.get("update_norm")), _number(part.get("scale"))
        if abs(loss - ref_loss) > LOSS_ATOL + FIRST_STEP_RTOL[dtype] * abs(ref_loss):
            scaled = abs(loss - ref_loss * SAFE_SCALE) < 0.05 * SAFE_SCALE * abs(ref_loss)
            problems.append(f"{where}: the step returned {loss:.5g} where FP32's loss is {ref_loss:.5g}"
                            + ("; that is the scaled loss: return the loss itself, not scaler.scale(loss)"
                               if scaled else ""))
        ratio = norm / float(ref_update.norm()) if float(ref_update.norm()) > 0 else math.nan
        if not (math.isfinite(ratio) and abs(ratio - 1) <= UPDATE_RTOL):
            if ratio == 0:
                why = "no update was applied"
            elif ratio > 10:
                why = (f"the update is {ratio:.3g} times FP32's: it is still scaled (step through "
                       "scaler.step(optimizer), which unscales the gradients first)")
            else:
                why = f"the update is {ratio:.3g} times FP32's"
            problems.append(f"{where}: {why}")
        if scale != SAFE_SCALE * 2:
            problems.append(f"{where}: after one good step with growth_interval=1 the scale is {scale:g}, "
                            f"expected {SAFE_SCALE * 2:g}: call scaler.update() after scaler.step(optimizer)")
    if "overflow" in parts:
        part = parts["overflow"]
        if _number(part.get("max_change")) != 0.0:
            problems.append(f"{where}: with a scale of 2**60 the fp16 gradients overflow, yet the parameters changed: "
                            "let scaler.step(optimizer) decide whether to step (it skips steps with inf/NaN gradients)")
        if _number(part.get("scale")) >= OVERFLOW_SCALE:
            problems.append(f"{where}: after an overflow the scale stayed {_number(part.get('scale')):g}; call "
                            "scaler.update()")
        if not math.isfinite(_number(part.get("loss"))):
            problems.append(f"{where}: the overflow step returned the loss {part.get('loss')}; the loss itself is "
                            "finite, only the scaled gradients overflow")
    if "never_nan" in parts:
        part = parts["never_nan"]
        losses = [_number(v) for v in part.get("losses") or []]
        if len(losses) != NAN_STEPS or not all(math.isfinite(v) for v in losses):
            problems.append(f"{where}: starting from a scale of 2**24, the losses went {_fmt(losses)}")
        elif _number(part.get("nonfinite")) != 0:
            problems.append(f"{where}: starting from a scale of 2**24, parameters became inf/NaN within {NAN_STEPS} steps")
    return problems


# ---------------------------------------------------------------------------------------------
# AMP_CONFIG's correctness gate (its field rule, `config_problems`, is in the contract)


def config_parity_problems(config: TrainConfig, mode: str | None = None, steps: int = CONFIG_GATE_STEPS) -> list[str]:
    """Does `config` train on the baseline's samples with losses within its precision's tolerance?"""
    from perflab import workload

    base = baseline_config(mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = workload.train(base, steps), workload.train(config, steps)
    dtype = as_dtype(config.amp_dtype)
    for k in range(steps):
        if a.indices[k] != b.indices[k]:
            return [f"AMP_CONFIG: step {k + 1} trained on other samples than the baseline"]
        rtol = RESNET_FIRST_STEP_RTOL[dtype] if k == 0 else RESNET_TRAJECTORY_RTOL
        if not math.isfinite(b.losses[k]) or abs(a.losses[k] - b.losses[k]) > LOSS_ATOL + rtol * abs(a.losses[k]):
            return [f"AMP_CONFIG: step {k + 1} loss {b.losses[k]:.5g} against the baseline's {a.losses[k]:.5g}, "
                    f"more than {dtype_name(dtype)} rounding explains"]
    return []


def check_config(config: Any, mode: str | None = None) -> None:
    """AMP_CONFIG changes only the AMP knobs of the baseline, and trains like it (same samples, close losses)."""
    found = config_problems(config, mode) or config_parity_problems(config, mode)
    assert not found, found[0]


# ---------------------------------------------------------------------------------------------
# The visible checks of amp_train_step: each returns the problems found, in words (empty when all is
# well). The hidden checks are the grader's.


def parity_problems(step: StepFn, seed: int, dtype: str | torch.dtype, *, device: str = "cpu",
                    steps: int | None = None) -> list[str]:
    """Do `steps` (default PARITY_STEPS) fixed-seed steps of `step` at `dtype` keep the losses within
    tolerance of FP32, never NaN, and the parameters in FP32?"""
    steps = PARITY_STEPS if steps is None else steps
    return parity_from(observe_parity(step, seed, dtype, device=device, steps=steps), seed, dtype,
                       device=device, steps=steps)


def low_precision_problems(step: StepFn, seed: int, dtype: str | torch.dtype, *, device: str = "cpu") -> list[str]:
    """Do the convolutions and linear layers really compute in `dtype`, with no gradient left behind?"""
    return low_precision_from(observe_low_precision(step, seed, dtype, device=device), seed, dtype, device=device)


def scaler_problems(step: StepFn, seed: int, *, device: str = "cpu") -> list[str]:
    """Is a GradScaler used right with fp16: scaled backward, unscaled update, skipped overflow, updated scale?"""
    return scaler_from(observe_scaler(step, seed, device=device), seed, device=device)
