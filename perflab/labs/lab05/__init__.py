"""Lab 5 — Compile: the one contract between the notebook, its tests and the grader.

The student writes these in `solutions/lab05_compile` (the notebook); the tests call nothing else:

    measure_compile(build, steps, *, clock=time.perf_counter, sync=None) -> CompileTiming
        Calls `torch._dynamo.reset()` (so nothing compiled by an earlier experiment is reused),
        then `step = build()` (untimed), then times `steps + 1` calls of `step()` one by one:
        read `clock()`, call `step()`, call `sync()` (if given), read `clock()`. The first call
        pays for compilation (torch.compile compiles lazily, on the first call); the others are the
        steady state. Returns `CompileTiming(first, steady)`. `steps < 1`: ValueError naming `steps`.

    graph_breaks(fn, *args) -> list[tuple[int, str]]
        One (line, reason) per graph break `torch._dynamo.explain(fn)(*args)` reports, in its
        order: `line` the line number of the user code where tracing broke (the innermost frame of
        the break's user stack), `reason` a non-empty sentence saying why. No breaks: [].

    FixedBlock(BrokenBlock)
        `BrokenBlock` with its `forward` rewritten so that dynamo traces it in ONE graph (zero graph
        breaks) while computing the same outputs AND the same gradients: a value that left torch in
        the original (`.item()`, a numpy round trip) carried no gradient there, so it must carry none
        in the rewrite either. Same parameters (subclass it and override `forward` only); printing
        is not an output.

    break_even_steps(compile_seconds, eager_step, compiled_step) -> int | float
        The smallest whole number of steps n >= 0 for which compiling pays for itself:
        compile_seconds + n * compiled_step <= n * eager_step. `math.inf` when the compiled step
        saves nothing (compiled_step >= eager_step) and compile_seconds > 0 — it never pays.
        0 when compile_seconds is 0. Negative or non-finite compile_seconds, or step times that
        are not positive and finite: ValueError naming the argument.

    no_recompile_setup(model, dataset, batch_size, *, seed=0, backend="inductor") -> (compiled, loader)
        `compiled`: `model` compiled with `torch.compile(..., backend=backend)` (same parameters),
        callable on a batch of inputs; `loader`: a DataLoader over `dataset` (items `(x, y)`) in
        batches of `batch_size`, shuffled by `seed`, no sample twice in an epoch. Two epochs of
        forward+backward of `compiled` over `loader` must compile ONE graph: no recompilation on the
        smaller last batch. Drop it (`drop_last=True`), or compile for dynamic batch sizes
        (`dynamic=True`, or `torch._dynamo.mark_dynamic` on each batch's dimension 0).

    CHOICE: str | None, CLAIM: float
        What your measurements say to run on the graded workload: the compile mode (one of
        `COMPILE_MODES`) whose steady-state speedup over eager the kit's keep rule keeps
        (`common.keep_rule`: measurably faster), or None (do not compile) when it keeps none; CLAIM is
        the steady-state speedup you measured for it (1.0 for None).
        The grader re-measures CHOICE against eager with `perflab.verify` and holds it to the bar
        calibrated for the grading hardware (parity where compiling gives nothing): on a CUDA GPU in
        full or grade mode on ResNet-18 (`TrainConfig(compile_mode=CHOICE)`), everywhere else on
        the lab's small model (`small_step`), which keeps grading time bounded on CPUs.

    WHY_CHOICE: str
        One line (at least three words) of why the notebook's measurements support CHOICE: a person
        reads it; without one the re-measured cell earns half (`predict.with_reason`).

    PREDICT_BREAK_EVEN, WHY_BREAK_EVEN (PREDICTIONS)
        Written before the modes are measured: the default mode's break-even in steps (math.inf for
        never) and one line of why. Graded on being there, never on being right (`perflab.labs.predict`).

This module holds what the notebook, its tests and the grader share: the models (`PlainBlock`,
`BrokenBlock`, `SmallNet`, `IndexedFeatures`), the sizes of each mode, the verifier's reference workload
`small_step`, `CompileTiming`, the visible cells' fixtures (`FakeClock`, `ScriptedBuild`, and from
`perflab.labs.lab05.dynamo`, re-exported: `CountingBackend`, `quiet`, `quiet_compile_logs`,
`recompile_reasons`), `verify_choice`, and what carries the home run to the grader (`measured_modes`, the
compile of each mode; `as_decided`, CHOICE).

Elsewhere, each importing this module and never imported by it: the visible gate
`check_compiled_matches_eager` with the checks' inputs, observations and tolerances in
`perflab.labs.lab05.checks`; `PROBES`, what the grader reads from a notebook, in
`perflab.labs.lab05.probes`; the judges and reference
answers in the grader-only `perflab/labs/lab05/judges/`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from perflab import env
from perflab.labs import homework
from perflab.labs.common import (  # noqa: F401
    INCONCLUSIVE_ENV,
    INCONCLUSIVE_POLICIES,
    FakeClock,
    accepted,
    inconclusive_policy,
    keep_rule,
    report,
    verify_against_bar,
)
from perflab.labs.lab05.dynamo import CountingBackend as CountingBackend
from perflab.labs.lab05.dynamo import quiet as quiet
from perflab.labs.lab05.dynamo import quiet_compile_logs as quiet_compile_logs
from perflab.labs.lab05.dynamo import recompile_reasons as recompile_reasons
from perflab.workload import COMPILE_MODES, TrainConfig

# What the core (env, grading, the report, the demo) knows of this lab: data, read by
# perflab.labs.registry without importing this module (perflab.labs.manifest says what each field holds).
MANIFEST = {
    "lab": "lab05_compile",
    "title": "Lab 5 — Compile",
    "workloads": {"grade": {"cuda": ("full", 224, 128)}, "laptop": {"cuda": ("small", 128, 64)}},
    "fed": True,
    "bars": "graded_bars",
    "graded_changes": ("compile",),
    "decides_at_home": True,
    "untimed_records": ("lab05.choice",),
    "report_sections": ("speedups",),
    "lazy_choices": {"CHOICE": "CHOICE = None"},
    "hints": ("compile",),
}
LAB = MANIFEST["lab"]
# What this lab can show on each kind of device (read by perflab.labs.common.hardware_statement).
HARDWARE_NOTES = {
    "cuda": "torch.compile generates Triton kernels here: fusion can save memory traffic and reduce-overhead "
            "replays a step as one CUDA graph; the first compiled step of ResNet-18 training is long (longer "
            "with max-autotune), which your break-even weighs. The graded speedup is ResNet-18's.",
    "mps": "torch.compile's Metal backend is young: whether its compile repays itself here is what you "
           "measure; only the default mode is timed. The graded speedup is the small model's.",
    "cpu": "torch.compile generates C++/OpenMP code here, while the heavy convolutions and matmuls already "
           "run in oneDNN/BLAS: how much is left for it to gain is what this lab measures. Compiling ResNet-18 "
           "training on a few cores is long, so this lab compiles a small model, and the graded speedup is the "
           "small model's. reduce-overhead (CUDA graphs) needs a GPU.",
}
# The entries of autograder/expectations/<hardware_class>.json that hold this lab's bar: ResNet-18
# compiled against eager at grade sizes is what `perflab calibrate` measures as "compile"; the small
# model has its own entry (until calibrated, the conservative rule applies: parity, no gain required).
EXPECTATION_RESNET = "compile"
EXPECTATION_SMALL = "lab05_compile_small"
# The mode the reference solution compiles with when calibrating: the one that works on every device.
REFERENCE_MODE = "default"


# ---------------------------------------------------------------------------------------------
# Models


class PlainBlock(nn.Module):
    """A pre-norm residual MLP block: x + fc2(gelu(fc1(norm(x))))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


class BrokenBlock(PlainBlock):
    """The same block with four habits that break a torch.compile graph planted in its forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(self.norm(x))
        peak = h.detach().abs().amax().item()              # a Python float leaves the graph
        h = nn.functional.gelu(h) / max(peak, 1.0)
        print(f"BrokenBlock: peak activation {peak:.3f}")  # a side effect dynamo cannot trace
        h = self.fc2(h)
        if h.mean() > 0:                                   # Python control flow on tensor data
            h = h - h.mean(dim=0)
        gate = np.interp(h.detach().numpy(), [-2.0, 2.0], [0.0, 1.0])  # numpy dynamo cannot trace
        return x + h * torch.from_numpy(gate.astype(np.float32))


class SmallNet(nn.Module):
    """A small residual MLP classifier: the lab's model for the mechanics of compiling."""

    def __init__(self, block: type[nn.Module] = PlainBlock, features: int = 64, width: int = 64,
                 depth: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Linear(features, width)
        self.blocks = nn.Sequential(*[block(width) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.stem(x))))


class IndexedFeatures(torch.utils.data.Dataset):
    """`samples` feature vectors with learnable labels; item i is `(x_i, y_i)`, and `x_i[0] == i / samples`
    says which sample a row is (`index_of`) while staying on the scale of the other features."""

    def __init__(self, samples: int, features: int = 64, classes: int = 10, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(samples, features, generator=gen)
        self.x[:, 0] = torch.arange(samples, dtype=torch.float32) / samples
        self.y = (self.x @ torch.randn(features, classes, generator=gen)).argmax(dim=1)
        self.classes = classes

    def index_of(self, x: torch.Tensor) -> list[int]:
        """The sample index of each row of a batch of inputs."""
        return [int(i) for i in (x[:, 0] * len(self.x)).round().long().tolist()]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


# ---------------------------------------------------------------------------------------------
# Sizes


@dataclass(frozen=True)
class LabSizes:
    """What one mode runs: the small model and its batch, steps timed, the ragged data set, the grader's budget."""

    mode: str
    features: int
    width: int
    depth: int
    batch_size: int
    samples: int
    steps: int
    ragged_samples: int
    compare_blocks: int
    modes_cpu: tuple[str, ...]
    modes_cuda: tuple[str, ...]
    modes_resnet: tuple[str, ...]
    verify_max_pairs: int | None  # None: the protocol's own budget
    verify_seconds: float | None

    def small_kwargs(self) -> dict[str, int]:
        """Keyword arguments of `small_step` for this mode's model."""
        return {"batch_size": self.batch_size, "features": self.features, "width": self.width,
                "depth": self.depth, "samples": self.samples}


# modes_cpu / modes_cuda: the compile modes timed on the small model. max-autotune benchmarks candidate
# kernels while it compiles (a minute or more on 2 cores, minutes on a GPU), so the kit's tiny runs and
# grading leave it out.
# Tiny mode caps the re-measurement's pairs (the suite must stay fast: 12 pairs of small-model steps
# take about a second on a quiet machine) but not its time: on a loaded test machine a step can take
# a hundred times longer, and a run cut off before the protocol's minimum of pairs cannot decide.
# Features, width and batch differ in every mode: Dynamo gives equal sizes one symbol ("duck shaping"),
# so a batch equal to a weight's fixed size would be pinned by it and defeat dynamic=True.
# modes_resnet: the modes timed on ResNet-18 on a CUDA GPU; grading leaves out max-autotune, whose
# autotuning of every convolution takes minutes.
_LAB_SIZES = {
    "tiny": dict(features=24, width=64, depth=1, batch_size=32, samples=512, steps=15, ragged_samples=84,
                 compare_blocks=10, modes_cpu=("default",), modes_cuda=("default", "reduce-overhead"),
                 modes_resnet=("default",),
                 verify_max_pairs=12, verify_seconds=60.0),
    "grade": dict(features=24, width=64, depth=1, batch_size=32, samples=512, steps=15, ragged_samples=84,
                  compare_blocks=12, modes_cpu=("default",), modes_cuda=("default", "reduce-overhead"),
                  modes_resnet=("default", "reduce-overhead"),
                  verify_max_pairs=None, verify_seconds=None),
    "laptop": dict(features=48, width=256, depth=3, batch_size=64, samples=4096, steps=40, ragged_samples=680,
                   compare_blocks=16, modes_cpu=("default", "max-autotune"), modes_cuda=COMPILE_MODES,
                   modes_resnet=COMPILE_MODES,
                   verify_max_pairs=None, verify_seconds=None),
    "full": dict(features=48, width=512, depth=4, batch_size=256, samples=16384, steps=60, ragged_samples=2600,
                 compare_blocks=20, modes_cpu=("default", "max-autotune"), modes_cuda=COMPILE_MODES,
                 modes_resnet=COMPILE_MODES,
                 verify_max_pairs=None, verify_seconds=None),
}


# The graded notebook compiles with Inductor on the CPU (its correctness gate, `check_compiled_matches_eager`):
# the grader starts each job from a warm cache (perflab.grading.compile_cache).
COMPILES_WHEN_GRADED = True
# The notebook's own timing budgets in the grading kernel where its compile of each mode is replayed: the
# smallest that still runs its code (every figure CHOICE is decided from is in that record).
GRADING_BUDGET = dict(steps=3, compare_blocks=2)


def sizes(mode: str | None = None) -> LabSizes:
    """The lab's sizes in `mode` (default: the mode in force)."""
    named = mode or env.run_mode()
    if named not in _LAB_SIZES:
        raise ValueError(f"mode: {named!r} is not one of {', '.join(_LAB_SIZES)}")
    s = LabSizes(named, **_LAB_SIZES[named])  # type: ignore[arg-type]
    # Called with no mode, in a notebook: the grading kernel runs the notebook's own timing at
    # GRADING_BUDGET (the grade reads the grader's re-measurements and the home run's record).
    return s if mode is not None else homework.smallest(s, replayed="lab05.modes", **GRADING_BUDGET)


def available_modes(device: torch.device | str, mode: str | None = None) -> tuple[str, ...]:
    """The compile modes worth timing on `device`: reduce-overhead only on CUDA (it is CUDA graphs)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return sizes(mode).modes_cuda
    if kind == "mps":
        return ("default",)
    return sizes(mode).modes_cpu


def graded_workload(mode: str | None = None, device: torch.device | str | None = None) -> str:
    """"resnet18" on a CUDA GPU in full or grade mode, else "small": what the grader re-measures."""
    mode = mode or env.run_mode()
    kind = torch.device(device).type if device is not None else env.pick_device().type
    return "resnet18" if kind == "cuda" and mode in ("full", "grade") else "small"


def resnet_config(mode: str | None = None) -> TrainConfig:
    """The ResNet-18 baseline of `mode` (eager), on the best device."""
    s = env.mode_sizes(mode, lab=LAB)
    return TrainConfig(data=s.data, image_size=s.image_size, batch_size=s.batch_size, device=str(env.pick_device()),
                       **env.baseline_loader(LAB, mode=s.mode))


# ---------------------------------------------------------------------------------------------
# The verifier's reference workload


def small_step(seed: int, compile_mode: str | None = None, batch_size: int = 32, features: int = 24,
               width: int = 64, depth: int = 1, samples: int = 512, classes: int = 10, lr: float = 0.05,
               device: str | None = None) -> Callable[[], tuple[float, list[int]]]:
    """`perflab.verify`'s contract for the small model: build it from `seed` and return `step()`.

    Each step trains SmallNet (compiled with `compile_mode`, or eager when None) on one batch of
    IndexedFeatures in an order set by `seed` and the epoch, and returns (loss, sample indices).
    """
    if compile_mode is not None and compile_mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode: {compile_mode!r} is not one of None, {', '.join(COMPILE_MODES)}")
    if samples < batch_size:
        raise ValueError(f"samples: need at least one batch ({batch_size}), got {samples}")
    dev = env.pick_device(device)
    data = IndexedFeatures(samples, features, classes, seed=0)
    x_all, y_all = data.x.to(dev), data.y.to(dev)
    torch.manual_seed(seed)
    model = SmallNet(PlainBlock, features, width, depth, classes).to(dev)
    forward = model if compile_mode is None else torch.compile(model, mode=compile_mode)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    state = {"epoch": 0, "pos": samples, "order": torch.empty(0, dtype=torch.long)}

    def next_indices() -> torch.Tensor:
        if state["pos"] + batch_size > samples:  # full batches only: one shape, no recompiles
            gen = torch.Generator().manual_seed(seed * 1_000_003 + state["epoch"])
            state.update(order=torch.randperm(samples, generator=gen), pos=0, epoch=state["epoch"] + 1)
        idx = state["order"][state["pos"]: state["pos"] + batch_size]
        state["pos"] += batch_size
        return idx

    def step() -> tuple[float, list[int]]:
        idx = next_indices()
        on_device = idx.to(dev)
        loss = nn.functional.cross_entropy(forward(x_all[on_device]), y_all[on_device])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach()), idx.tolist()

    step.model = model  # type: ignore[attr-defined]
    return step


# ---------------------------------------------------------------------------------------------
# What measure_compile returns


@dataclass(frozen=True)
class CompileTiming:
    """Raw seconds of one compile experiment: the first call (it compiles) and the steady calls after it.

    Everything else is derived: the steady-state step (median), and the compile cost, the first
    call's excess over a steady step.
    """

    first: float
    steady: tuple[float, ...]
    label: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "first", float(self.first))
        object.__setattr__(self, "steady", tuple(float(x) for x in self.steady))
        if not self.steady:
            raise ValueError("steady: need at least one steady-state call")
        if min(self.first, *self.steady) < 0:
            raise ValueError("first/steady: seconds cannot be negative")

    @property
    def steady_median(self) -> float:
        return statistics.median(self.steady)

    @property
    def compile_seconds(self) -> float:
        """The first call's time beyond a steady step (never negative)."""
        return max(0.0, self.first - self.steady_median)

    def describe(self) -> str:
        name = f"{self.label}: " if self.label else ""
        return (f"{name}first call {_fmt(self.first)}, steady step {_fmt(self.steady_median)} (median of "
                f"{len(self.steady)}), compile cost {_fmt(self.compile_seconds)}")

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "steady": list(self.steady), "steady_median": self.steady_median,
                "compile_seconds": self.compile_seconds}


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def break_even_here(steps: float, speedup_ci: tuple[float, float]) -> tuple[int | None, str]:
    """What a break-even step count says, given the steady-state speedup's 95% CI: (the steps after which
    compiling pays, or None when it never measurably does; the words to show). A step count is only
    stated where the kit's keep rule keeps compiling (`common.keep_rule`: the CI above KEEP_ABOVE): a saving
    the measurement does not confirm has no break-even point."""
    low, high = speedup_ci
    if steps == math.inf:
        return None, "never pays off here (the compiled step is no faster)"
    if not keep_rule(speedup_ci).keep:
        return None, f"no measurable gain: never pays off here (speedup CI {low:.2f}-{high:.2f}x includes 1)"
    return int(steps), f"pays off after {int(steps):,} steps"


def total_seconds(timing: CompileTiming, steps: int) -> float:
    """Wall time of a run of `steps` steps: the compile cost once, then steady steps."""
    return timing.compile_seconds + steps * timing.steady_median


# ---------------------------------------------------------------------------------------------
# A scripted clock and build: what the visible measure_compile test runs against


class ScriptedBuild:
    """`build()` costs `build_cost`; the step it returns costs `costs[k]` on call k (0: the compiling call)."""

    def __init__(self, clock: FakeClock, build_cost: float, costs: list[float]) -> None:
        self.clock, self.build_cost, self.costs = clock, build_cost, list(costs)
        self.builds = 0
        self.calls = 0
        self.syncs = 0

    def __call__(self) -> Callable[[], None]:
        self.builds += 1
        self.clock.advance(self.build_cost)

        def step() -> None:
            if self.calls >= len(self.costs):
                raise AssertionError(f"step() was called more than the {len(self.costs)} times asked for")
            self.clock.advance(self.costs[self.calls])
            self.calls += 1

        return step

    def sync(self) -> None:
        self.syncs += 1


# ---------------------------------------------------------------------------------------------
# The graded re-measurement


def choice_problems(choice: Any) -> list[str]:
    if choice is not None and choice not in COMPILE_MODES:
        return [f"CHOICE: {choice!r} is not None or one of {', '.join(map(repr, COMPILE_MODES))} (the compile "
                "mode with a real steady-state gain in your measurements, or None)"]
    return []


def measured_modes(measure: Callable[[], tuple[dict[str, Any], dict[str, Any]]], workload: str, device: Any,
                   s: LabSizes | None = None, *, code: Any = None) -> tuple[dict[str, CompileTiming], dict[str, Any]]:
    """(`TIMINGS`, `COMPARISONS`) of the compile experiment on `workload` ("small" or "resnet18"): what
    `measure()` returns, {"eager" and each mode: CompileTiming} and {mode: Comparison against eager}.

    At home `measure()` runs and its raw figures are recorded in the cell's output (`homework.measured`).
    In the grading kernel they are the home run's, made on the same kind of `device`, whatever modes the
    home run's mode timed (a laptop-mode run also times max-autotune): nothing is compiled again only to
    be timed, since the grader re-measures `CHOICE` itself. The record belongs to `measure` and the
    student's `code` (their `measure_compile`, `homework.code_digest`): either edited after the saved run
    times again.
    A notebook that carries none runs `measure()` at the budgets in force (`sizes`)."""
    s = s or sizes()
    kind = getattr(device, "type", str(device))

    def encode(result: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any] | None:
        timings, comparisons = result
        try:
            return {"timings": {name: {**t.to_dict(), "label": str(t.label)} for name, t in timings.items()},
                    "comparisons": {mode: homework.comparison_value(c) for mode, c in comparisons.items()}}
        except (AttributeError, TypeError, ValueError):  # not the kit's types: nothing the grader could replay
            return None

    def decode(value: Any) -> tuple[dict[str, CompileTiming], dict[str, Any]]:
        modes = list(value["comparisons"])
        if "eager" not in value["timings"] or set(value["timings"]) != {"eager", *modes} or \
                any(mode not in COMPILE_MODES for mode in modes):
            raise ValueError("compile record: not eager and compile modes")
        timings = {name: CompileTiming(t["first"], tuple(t["steady"]), str(t.get("label", "")))
                   for name, t in value["timings"].items()}
        if not all(math.isfinite(x) for t in timings.values() for x in (t.first, *t.steady)):
            raise ValueError("compile record: seconds not finite")
        return timings, {mode: homework.comparison_from(value["comparisons"][mode]) for mode in modes}

    digest = homework.code_digest(measure, code) if code is not None else None
    if code is not None and digest is None:  # no source to bind a record to (a functools.partial): measure
        return measure()
    key = {"workload": workload, "device": kind, "code": digest}
    return homework.measured("lab05.modes", key, measure, quick=measure,
                             encode=encode, decode=decode, what=f"compile of each mode ({workload} model)",
                             quick_budget=f"{s.steps} steady steps and {s.compare_blocks} blocks a comparison")


def as_decided(choice: Any, why: Any, device: Any) -> tuple[Any, Any]:
    """(`CHOICE`, `WHY_CHOICE`) as this run of the notebook decided them (`homework.decided`): recorded in
    the cell's output at home; in the grading kernel what the submitted code decided in this run from the
    replayed comparisons, never the record."""
    def encode(decision: tuple[Any, Any]) -> dict[str, Any]:
        mode, line = decision
        return {"choice": mode if mode is None or isinstance(mode, str) else repr(mode),
                "why": line if isinstance(line, str) else None}

    def decode(value: Any) -> tuple[Any, Any]:
        if not isinstance(value, dict) or choice_problems(value.get("choice")):
            raise ValueError("not a compile mode")
        line = value.get("why")
        return value.get("choice"), (line if isinstance(line, str) else why)

    return homework.decided("lab05.choice", (choice, why), device=getattr(device, "type", str(device)),
                            encode=encode, decode=decode, what="CHOICE", show=lambda d: repr(d[0]))


def graded_bars(mode: str) -> list[tuple[str, Any]]:
    """The cell re-measured against a calibrated bar at `mode` on this device: (its entry, its baseline);
    none where the small model (a CPU's or a Mac's) is held to parity by design."""
    name = expectation_name(mode)
    return [] if name == EXPECTATION_SMALL else [(name, sides(None, mode)[0])]


def expectation_name(mode: str | None = None, device: torch.device | str | None = None) -> str:
    """The expectations entry the graded workload is held to (see EXPECTATION_RESNET / EXPECTATION_SMALL)."""
    return EXPECTATION_RESNET if graded_workload(mode, device) == "resnet18" else EXPECTATION_SMALL


def sides(choice: str | None, mode: str | None = None, device: torch.device | str | None = None) -> tuple[Any, Any]:
    """(baseline, candidate) for `perflab.verify`: eager against `choice` (None: eager again), on the graded workload."""
    from perflab.verify import Side

    problems = choice_problems(choice)
    if problems:
        raise ValueError(problems[0])
    if graded_workload(mode, device) == "resnet18":
        base = resnet_config(mode)
        return base, base.replace(compile_mode=choice)
    kwargs = sizes(mode).small_kwargs()
    target = "perflab.labs.lab05:small_step"
    baseline = Side.reference(target, label="SmallNet eager", **kwargs)
    if choice is None:  # "do not compile" is the baseline itself: the verifier's no-change verdict, untimed
        return baseline, Side.reference(target, label="SmallNet eager (not compiled)", **kwargs)
    return baseline, Side.reference(target, label=f"SmallNet compile {choice}", compile_mode=choice, **kwargs)


def verify_choice(choice: str | None, claim: float | None = None, mode: str | None = None) -> tuple[Any, Any]:
    """Re-measure `choice` against eager in a fresh interpreter, held to this machine's calibrated bar.

    Returns (verdict, expectation): a `perflab.verify.Verdict` and the `Expectation` it was held to.
    Compilation happens in the verifier's warm-up and is reported apart from the timed blocks. Judged as the
    grader judges a decision (`common.verify_against_bar(decision=True)`: the keep rule).
    """
    baseline, candidate = sides(choice, mode)
    s = sizes(mode)
    return verify_against_bar(baseline, candidate, expectation_name(mode), claim=claim,
                              max_pairs=s.verify_max_pairs, max_seconds=s.verify_seconds, decision=True)


# The predictions written before a headline measurement, by the key of their graded cell
# (`test_predict_<key>`): the value's name and its one line of why.
PREDICTIONS = {"break_even": ("PREDICT_BREAK_EVEN", "WHY_BREAK_EVEN")}
