"""Lab 5's checks: what the visible gate, the grader's probes and its judges run.

For each thing the student writes, the inputs drawn from a seed (`*_cases`, `break_cases`) and an
`observe_*` that runs the student's answer and returns what it gave as data; `compiled_from` decides
the compiled-against-eager gate from such data, and `check_compiled_matches_eager` is that gate as the
notebook's visible cell runs it. This module imports the contract `perflab.labs.lab05`, never the
reverse; the probes (`perflab.labs.lab05.probes`) run the `observe_*` functions, and the grader-only
`perflab/labs/lab05/judges/` draws the same inputs, computes the references and judges.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from perflab.labs.common import FakeClock
from perflab.labs.lab05 import BrokenBlock, CompileTiming, IndexedFeatures, ScriptedBuild
from perflab.labs.lab05.dynamo import CountingBackend, quiet, recompile_reasons
from perflab.workload import COMPILE_MODES

# Compiled against eager: inductor fuses and reorders float32 reductions (LayerNorm, means, the
# matmul blocking of max-autotune's templates); measured differences stay below 1e-5 relative here.
COMPILED_RTOL, COMPILED_ATOL = 1e-3, 1e-4


# ---------------------------------------------------------------------------------------------
# The compiled-against-eager gate (`check_compiled_matches_eager`, and its probe)


def _gate_draws(seed: int, draws: int) -> tuple[int, int, list[dict[str, Any]]]:
    """(width, batch, draws) of the compiled-matches-eager gate: each draw's parameters, branch shift,
    input and output weights, all from `seed` (a generator of its own, not the global RNG)."""
    rng = np.random.default_rng(seed)
    width, batch = int(rng.integers(8, 33)), int(rng.integers(4, 17))
    gen = torch.Generator().manual_seed(seed)
    shapes = [tuple(p.shape) for p in BrokenBlock(width).parameters()]
    out = []
    for k in range(draws):
        params = [torch.randn(shape, generator=gen) * 0.3 for shape in shapes]
        shift = (2.0 if k % 2 == 0 else -2.0) * float(rng.uniform(0.5, 2))
        x = torch.randn(batch, width, generator=gen) * float(rng.uniform(0.5, 3))
        out.append({"params": params, "shift": shift, "x": x, "weights": torch.randn(batch, width, generator=gen)})
    return width, batch, out


def _gate_run(model: nn.Module, params_of: nn.Module, draw: dict[str, Any]) -> dict[str, Any]:
    """One draw through `model` (whose parameters are `params_of`'s): output, input and parameter gradients."""
    with torch.no_grad():
        for p, value in zip(params_of.parameters(), draw["params"], strict=True):
            p.copy_(value)
        params_of.fc2.bias.add_(draw["shift"])
    params_of.zero_grad(set_to_none=True)
    xi = draw["x"].clone().requires_grad_(True)
    out = model(xi)
    (out * draw["weights"]).sum().backward()
    return {"output": out.detach(), "input_grad": xi.grad,
            "param_grads": [p.grad for p in params_of.parameters()]}


def observe_compiled(fixed_cls: type[nn.Module], mode: str | None = "default", seed: int = 0, draws: int = 3,
                     backend: str = "inductor") -> dict[str, Any]:
    """`torch.compile(FixedBlock, mode=mode)` on the gate's draws, as data (one compile, both branches)."""
    from perflab.grading.probing import encode

    if mode is not None and mode not in COMPILE_MODES:
        raise ValueError(f"mode: {mode!r} is not one of None, {', '.join(COMPILE_MODES)}")
    width, _, planned = _gate_draws(seed, draws)
    try:
        assert isinstance(fixed_cls, type) and issubclass(fixed_cls, BrokenBlock), \
            "FixedBlock should subclass BrokenBlock (same parameters, forward rewritten)"
        fixed = fixed_cls(width)
        with quiet():
            torch._dynamo.reset()
            compiled = torch.compile(fixed, mode=mode) if backend == "inductor" else torch.compile(fixed, backend=backend)
            runs = [_gate_run(compiled, fixed, draw) for draw in planned]
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"runs": encode(runs)}


def compiled_from(observed: Any, mode: str | None = "default", seed: int = 0, draws: int = 3) -> dict[str, float]:
    """Compare `observe_compiled`'s data with eager BrokenBlock on the same draws (AssertionError on the first
    difference); the largest differences seen."""
    if not isinstance(observed, dict) or "runs" not in observed:
        raised = observed.get("raised", "no result") if isinstance(observed, dict) else "no result"
        raise AssertionError(f"compiling FixedBlock raised {raised}: "
                             f"{observed.get('message', '') if isinstance(observed, dict) else ''}")
    width, batch, planned = _gate_draws(seed, draws)
    runs = observed["runs"]
    assert isinstance(runs, list) and len(runs) == draws, "no result for every draw"
    original = BrokenBlock(width)
    worst = {"output": 0.0, "input_grad": 0.0, "param_grad": 0.0}
    names = [n for n, _ in original.named_parameters()]
    hint = (" (a value that left torch in the original, by .item() or numpy, carried no gradient there: "
            ".detach() it in yours)")
    with quiet():
        for k, (draw, got) in enumerate(zip(planned, runs, strict=True)):
            want = _gate_run(original, original, draw)
            where = f"draw {k + 1} (width {width}, batch {batch}, mode {mode})"
            _close_or_fail(decoded_tensor(got.get("output")), want["output"], f"{where}: compiled outputs", worst, "output")
            _close_or_fail(decoded_tensor(got.get("input_grad")), want["input_grad"], f"{where}: gradient of the input",
                           worst, "input_grad", hint)
            grads = got.get("param_grads") or []
            assert len(grads) == len(names), f"{where}: expected gradients of {len(names)} parameters"
            for name, g, w in zip(names, grads, want["param_grads"], strict=True):
                _close_or_fail(decoded_tensor(g), w, f"{where}: gradient of {name}", worst, "param_grad", hint)
    return worst


def check_compiled_matches_eager(fixed_cls: type[nn.Module], mode: str | None = "default", seed: int = 0,
                                 draws: int = 3, backend: str = "inductor") -> dict[str, float]:
    """`torch.compile(FixedBlock, mode=mode)` against eager BrokenBlock: outputs, input and parameter gradients.

    One compile (random values, one shape per check) keeps it fast; both branches are drawn.
    Returns the largest differences seen. (`backend` is for the kit's own tests: a mode applies to
    Inductor only.)
    """
    return compiled_from(observe_compiled(fixed_cls, mode, seed, draws, backend), mode, seed, draws)


def decoded_tensor(data: Any) -> torch.Tensor | None:
    """A tensor as `perflab.grading.probing.encode` wrote it (None for None or a summary)."""
    if not isinstance(data, dict) or "tensor" not in data or "values" not in data["tensor"]:
        return None
    t = data["tensor"]
    values = [v if isinstance(v, (int, float)) else float(v.get("float", "nan")) for v in t["values"]]
    return torch.tensor(values, dtype=torch.float32).reshape(t["shape"])


def _close_or_fail(got: torch.Tensor | None, want: torch.Tensor | None, what: str, worst: dict[str, float],
                   key: str, hint: str = "") -> None:
    assert got is not None and want is not None, f"{what}: missing (got {got is not None}, eager {want is not None})"
    diff = (got - want).abs().max().item()
    worst[key] = max(worst[key], diff)
    assert torch.allclose(got, want, rtol=COMPILED_RTOL, atol=COMPILED_ATOL), \
        f"{what} differ from eager BrokenBlock's by up to {diff:.3g}{hint}"


# ---------------------------------------------------------------------------------------------
# graph_breaks: functions with known breaks (one, two, none, prints), then BrokenBlock


def break_one_item(x: torch.Tensor) -> torch.Tensor:
    y = x.relu()
    n = y.sum().item()
    return y / (n + 1)


def break_branch_and_numpy(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    if y.sum() > 0:
        y = y + 1
    z = np.interp(y.numpy(), [0.0, 1.0], [1.0, 3.0])
    return torch.from_numpy(z) + y


def break_none(x: torch.Tensor) -> torch.Tensor:
    y = torch.where(x.sum() > 0, x + 1, x)
    return y.clamp(0, 1) * 2 + 1


def break_print_twice(x: torch.Tensor) -> torch.Tensor:
    y = x.exp()
    print("first", y.shape)
    y = y * 3
    print("second")
    return y.sum(0)


BREAK_PROBES = (break_one_item, break_branch_and_numpy, break_none, break_print_twice)


def break_cases(seed: int) -> list[tuple[Callable[..., Any], torch.Tensor]]:
    """(function, input) pairs the hidden graph-break check runs, in an order drawn from `seed`, then a
    BrokenBlock of a random width."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    out: list[tuple[Callable[..., Any], torch.Tensor]] = []
    for index in rng.permutation(len(BREAK_PROBES)):
        fn = BREAK_PROBES[int(index)]
        x = torch.randn(int(rng.integers(2, 6)), int(rng.integers(2, 6)), generator=gen)
        if fn is break_branch_and_numpy:
            x = x.abs() * float(rng.choice([-1.0, 1.0]))
        out.append((fn, x))
    width = int(rng.integers(4, 12))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = BrokenBlock(width)
    out.append((block, torch.randn(int(rng.integers(2, 8)), width, generator=gen)))
    return out


# ---------------------------------------------------------------------------------------------
# FixedBlock: BrokenBlock's weights with a branch shift each way, random widths and batches


def fixed_cases(rng: np.random.Generator, n: int) -> Iterator[tuple[int, int, float]]:
    """(width, batch, branch shift) of `n` fixed-block cases, the shift's sign alternating."""
    for k in range(n):
        yield int(rng.integers(4, 24)), int(rng.integers(2, 12)), (3.0 if k % 2 == 0 else -3.0) * float(rng.uniform(0.5, 2))


def fixed_block_cases(seed: int, cases: int = 4) -> list[dict[str, Any]]:
    """Random widths, batches and branch shifts for the fixed-block check, with their BrokenBlock
    weights' seed and input (drawn without the global RNG)."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for width, batch, bias in fixed_cases(rng, cases):
        out.append({"width": width, "batch": batch, "bias": bias, "init": int(rng.integers(0, 2**31)),
                    "x": torch.randn(batch, width, generator=gen) * float(rng.uniform(0.5, 4))})
    return out


VISIBLE_FIXED_CASES = ({"width": 16, "batch": 8, "bias": 3.0, "init": 0, "x_seed": 1},
                       {"width": 16, "batch": 8, "bias": -3.0, "init": 0, "x_seed": 2})


def paired_for(fixed_cls: type[nn.Module], case: Mapping[str, Any]) -> tuple[nn.Module, nn.Module]:
    """A BrokenBlock with `case`'s weights and branch shift, and a `fixed_cls` holding the same parameters."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case["init"])
        original = BrokenBlock(case["width"])
    with torch.no_grad():
        original.fc2.bias.add_(case["bias"])
    fixed = fixed_cls(case["width"])
    fixed.load_state_dict(original.state_dict())
    return original, fixed


def case_input(case: Mapping[str, Any]) -> torch.Tensor:
    """A fixed-block case's input: drawn with the case (hidden) or from its `x_seed` (visible)."""
    if "x" in case:
        return case["x"]
    return torch.randn(case["batch"], case["width"], generator=torch.Generator().manual_seed(case["x_seed"]))


def observe_fixed(fixed_cls: type[nn.Module], cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """FixedBlock on each case, as data: its output and dynamo's graph breaks (count and reasons)."""
    from perflab.grading.probing import encode

    out = []
    for case in cases:
        try:
            assert isinstance(fixed_cls, type) and issubclass(fixed_cls, BrokenBlock), \
                "FixedBlock should subclass BrokenBlock (same parameters, forward rewritten)"
            _, fixed = paired_for(fixed_cls, case)
            x = case_input(case)
            with quiet():
                got = fixed(x)
                explained = torch._dynamo.explain(fixed)(x)
            out.append({"output": encode(got), "breaks": explained.graph_break_count,
                        "reasons": [str(r.reason).splitlines()[0] for r in explained.break_reasons]})
        except Exception as exc:
            out.append({"raised": type(exc).__name__, "message": str(exc)[:300]})
    return out


# ---------------------------------------------------------------------------------------------
# measure_compile: scripted builds on a fake clock, and a reset that must forget earlier compiles


def measure_compile_cases(seed: int, cases: int = 4) -> list[dict[str, Any]]:
    """Scripted builds for measure_compile: steps, clock start, build cost, call costs (the first with the
    compile), from `seed`; the first is the visible test's."""
    rng = np.random.default_rng(seed)
    out = [{"steps": 3, "start": 100.0, "build_cost": 0.25, "costs": [4.0, 0.5, 0.25, 0.75]}]
    for _ in range(cases):
        steps = int(rng.integers(1, 12))
        start = float(rng.uniform(0, 1e4))
        costs = [float(rng.integers(1, 4000)) / 1024 for _ in range(steps + 1)]
        costs[0] += float(rng.integers(1000, 40000)) / 1024
        out.append({"steps": steps, "start": start, "build_cost": float(rng.integers(1, 500)) / 1024, "costs": costs})
    return out


def observe_measure_compile(fn: Callable[..., Any], case: Mapping[str, Any]) -> dict[str, Any]:
    """`fn` on one scripted build, as data: the CompileTiming it returned and the builds, calls and syncs made."""
    clock = FakeClock(case["start"])
    build = ScriptedBuild(clock, case["build_cost"], list(case["costs"]))
    try:
        got = fn(build, case["steps"], clock=clock, sync=build.sync)
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    timing = {"first": got.first, "steady": list(got.steady)} if isinstance(got, CompileTiming) else None
    return {"type": type(got).__name__, "timing": timing, "builds": build.builds, "calls": build.calls,
            "syncs": build.syncs}


def _reset_probe(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + 1


def observe_reset(fn: Callable[..., Any], seed: int) -> dict[str, Any]:
    """How many graphs reached a counting backend when an already-compiled function is measured twice."""
    counter = CountingBackend()
    x = torch.randn(int(np.random.default_rng(seed).integers(2, 9)), 3)

    def build() -> Callable[[], torch.Tensor]:
        compiled = torch.compile(_reset_probe, backend=counter)
        return lambda: compiled(x)

    try:
        with quiet():
            torch._dynamo.reset()
            build()()
            for _ in range(2):
                fn(build, 1)
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"count": counter.count}


# ---------------------------------------------------------------------------------------------
# break_even_steps: fixed edge cases, random ones, and arguments it must refuse (with the one named)

BREAK_EVEN_FIXED = ((30.0, 0.2, 0.1), (12.5, 0.05, 0.05), (90.0, 0.3, 0.31), (0.0, 0.2, 0.1), (0.0, 0.1, 0.2))
BREAK_EVEN_VISIBLE = ((30.0, 0.2, 0.1), (31.0, 0.2, 0.1), (10.0, 0.1, 0.1), (10.0, 0.1, 0.12), (0.0, 0.1, 0.12))
BREAK_EVEN_BAD = (((-1.0, 0.2, 0.1), "compile_seconds"), ((math.nan, 0.2, 0.1), "compile_seconds"),
                  ((5.0, 0.0, 0.1), "eager_step"), ((5.0, -0.2, 0.1), "eager_step"),
                  ((5.0, 0.2, 0.0), "compiled_step"), ((5.0, 0.2, math.inf), "compiled_step"))


def break_even_cases(seed: int, cases: int = 40) -> list[tuple[float, float, float]]:
    """BREAK_EVEN_FIXED, then `cases` (compile seconds, eager step, compiled step) drawn from `seed`."""
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(cases):
        e = float(10 ** rng.uniform(-4, 0))
        draws.append((float(10 ** rng.uniform(-1, 2.5)), e, e * float(rng.uniform(0.3, 1.3))))
    return list(BREAK_EVEN_FIXED) + draws


# ---------------------------------------------------------------------------------------------
# no_recompile_setup: ragged data sets, two epochs each


def no_recompile_cases(seed: int, cases: int = 3) -> list[dict[str, int]]:
    """Data sets whose size does not divide by the batch (a ragged tail of at least 2), from `seed`."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(cases):
        batch = int(rng.integers(3, 12))
        size = batch * int(rng.integers(2, 6)) + int(rng.integers(2, batch))
        # Features never equal the batch: dynamo gives equal sizes one symbol ("duck shaping").
        out.append({"batch": batch, "size": size, "features": int(rng.integers(13, 20)),
                    "classes": int(rng.integers(2, 5)), "data_seed": int(rng.integers(0, 1000)),
                    "model_seed": int(rng.integers(0, 1000)), "seed": int(rng.integers(0, 1000))})
    return out


def observe_no_recompile(setup: Callable[..., Any], case: Mapping[str, int]) -> dict[str, Any]:
    """`setup` on one ragged data set, as data: graphs compiled over two epochs, the recompile reasons,
    each epoch's batches of sample indices, and the compiled model's output on the first samples."""
    from perflab.grading.probing import encode

    data = IndexedFeatures(case["size"], case["features"], case["classes"], seed=case["data_seed"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case["model_seed"])
        model = nn.Sequential(nn.Linear(case["features"], 16), nn.GELU(), nn.Linear(16, case["classes"]))
    counter = CountingBackend()
    try:
        with quiet():
            torch._dynamo.reset()
            compiled, loader = setup(model, data, case["batch"], seed=case["seed"], backend=counter)
            seen = []
            for _ in range(2):
                batches = []
                for batch in loader:
                    x, y = batch[0], batch[1]
                    nn.functional.cross_entropy(compiled(x), y).backward()
                    batches.append(data.index_of(x))
                seen.append(batches)
            reasons = recompile_reasons()
            probe = compiled(data.x[:case["batch"]])
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"count": counter.count, "reasons": reasons[:3], "epochs": seen, "output": encode(probe)}
