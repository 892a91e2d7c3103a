"""Lab 05's hidden checks and the reference answers they compare against; grader-only: the student
bundle leaves this module out.

The contract these checks enforce is stated in `perflab.labs.lab05`; the hidden test cells of
`solutions/lab05_compile` call the `check_*` functions below with the student's functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from perflab.labs.lab05 import (
    BrokenBlock,
    CompileTiming,
    CountingBackend,
    FakeClock,
    IndexedFeatures,
    ScriptedBuild,
    _paired_blocks,
    quiet,
    recompile_reasons,
)

# Outputs of the fixed block against the original, both eager: the rewrite computes the same
# float32 operations, so only np.interp (float64, then rounded) differs, by an ulp or so.
FIXED_RTOL, FIXED_ATOL = 1e-5, 1e-5


# ---------------------------------------------------------------------------------------------
# Checks: measure_compile


def _as_timing(result: Any) -> CompileTiming:
    assert isinstance(result, CompileTiming), \
        f"measure_compile should return a CompileTiming, got {type(result).__name__}"
    return result


def check_measure_compile(measure_compile: Callable[..., CompileTiming], seed: int = 0, cases: int = 4) -> None:
    """Exact against a scripted clock; build untimed; a sync after every call; a reset before building."""
    rng = np.random.default_rng(seed)
    for _ in range(cases):
        steps = int(rng.integers(1, 12))
        clock = FakeClock(float(rng.uniform(0, 1e4)))
        costs = [float(rng.integers(1, 4000)) / 1024 for _ in range(steps + 1)]
        costs[0] += float(rng.integers(1000, 40000)) / 1024  # the compile
        build = ScriptedBuild(clock, float(rng.integers(1, 500)) / 1024, costs)
        got = _as_timing(measure_compile(build, steps, clock=clock, sync=build.sync))
        assert build.builds == 1, f"build() should be called once, it was called {build.builds} times"
        assert build.calls == steps + 1, f"steps={steps}: step() should run {steps + 1} times (the first, then "\
                                         f"{steps} steady), it ran {build.calls} times"
        assert build.syncs >= steps + 1, f"sync() should follow every timed call ({steps + 1}), it ran {build.syncs} times"
        assert abs(got.first - costs[0]) < 1e-9, (
            f"first: expected {costs[0]:.6f} s (the first call only; build() is not timed), got {got.first:.6f}")
        assert len(got.steady) == steps and all(abs(a - b) < 1e-9 for a, b in zip(got.steady, costs[1:], strict=True)), \
            f"steady: expected {costs[1:]}, got {list(got.steady)}"
    for bad in (0, -2):
        try:
            measure_compile(ScriptedBuild(FakeClock(), 0.0, [1.0]), bad, clock=FakeClock())
        except ValueError as exc:
            assert "steps" in str(exc), f"the error should name steps: {exc}"
        else:
            raise AssertionError(f"steps={bad} should raise ValueError")
    _check_reset(measure_compile, seed)


def _reset_probe(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + 1


def _check_reset(measure_compile: Callable[..., CompileTiming], seed: int) -> None:
    """Measuring the same compiled function twice must compile twice: dynamo's caches reset first."""
    counter = CountingBackend()
    x = torch.randn(int(np.random.default_rng(seed).integers(2, 9)), 3)

    def build() -> Callable[[], torch.Tensor]:
        compiled = torch.compile(_reset_probe, backend=counter)
        return lambda: compiled(x)

    with quiet():
        torch._dynamo.reset()
        build()()  # compiled once before the measurements: a cache they must not reuse
        for _ in range(2):
            measure_compile(build, 1)
    assert counter.count == 3, (
        f"measuring an already-compiled function twice compiled it {counter.count - 1} time(s) instead of 2: "
        "call torch._dynamo.reset() before build(), or the first call reuses earlier compiled code")


# ---------------------------------------------------------------------------------------------
# Checks: graph breaks


def _one_item(x: torch.Tensor) -> torch.Tensor:
    y = x.relu()
    n = y.sum().item()
    return y / (n + 1)


def _branch_and_numpy(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    if y.sum() > 0:
        y = y + 1
    z = np.interp(y.numpy(), [0.0, 1.0], [1.0, 3.0])
    return torch.from_numpy(z) + y


def _no_break(x: torch.Tensor) -> torch.Tensor:
    y = torch.where(x.sum() > 0, x + 1, x)
    return y.clamp(0, 1) * 2 + 1


def _print_twice(x: torch.Tensor) -> torch.Tensor:
    y = x.exp()
    print("first", y.shape)
    y = y * 3
    print("second")
    return y.sum(0)


_BREAK_PROBES = (_one_item, _branch_and_numpy, _no_break, _print_twice)


def reference_breaks(fn: Callable[..., Any], *args: Any) -> list[tuple[int, str]]:
    """The grader's (line, reason) list for `fn(*args)`, from torch._dynamo.explain."""
    with quiet():
        out = torch._dynamo.explain(fn)(*args)
    return [(int(r.user_stack[-1].lineno) if r.user_stack else -1, str(r.reason).splitlines()[0])
            for r in out.break_reasons]


def _breaks_of(graph_breaks: Callable[..., Any], fn: Callable[..., Any], *args: Any) -> list[tuple[int, str]]:
    with quiet():
        got = graph_breaks(fn, *args)
    assert isinstance(got, list), f"graph_breaks should return a list, got {type(got).__name__}"
    rows = []
    for row in got:
        assert isinstance(row, tuple) and len(row) == 2, f"each break should be a (line, reason) tuple, got {row!r}"
        line, reason = row
        assert isinstance(reason, str) and reason.strip(), f"each break needs a reason in words, got {reason!r}"
        rows.append((int(line), reason))
    return rows


def check_graph_breaks(graph_breaks: Callable[..., list[tuple[int, str]]], seed: int = 0) -> None:
    """The student's break finder names the lines dynamo broke at, in functions it has never seen."""
    rng = np.random.default_rng(seed)
    for index in rng.permutation(len(_BREAK_PROBES)):
        fn = _BREAK_PROBES[int(index)]
        x = torch.randn(int(rng.integers(2, 6)), int(rng.integers(2, 6)))
        if fn is _branch_and_numpy:
            x = x.abs() * float(rng.choice([-1.0, 1.0]))
        want = [line for line, _ in reference_breaks(fn, x)]
        got = [line for line, _ in _breaks_of(graph_breaks, fn, x)]
        assert got == want, f"{fn.__name__}: dynamo breaks at lines {want}, you found {got}"
    block = BrokenBlock(int(rng.integers(4, 12)))
    x = torch.randn(int(rng.integers(2, 8)), block.norm.normalized_shape[0])
    want = [line for line, _ in reference_breaks(block, x)]
    got = [line for line, _ in _breaks_of(graph_breaks, block, x)]
    assert got == want, f"BrokenBlock: dynamo breaks at lines {want}, you found {got}"


# ---------------------------------------------------------------------------------------------
# Checks: the fixed block


def _cases(rng: np.random.Generator, n: int) -> Iterator[tuple[int, int, float]]:
    for k in range(n):
        yield int(rng.integers(4, 24)), int(rng.integers(2, 12)), (3.0 if k % 2 == 0 else -3.0) * float(rng.uniform(0.5, 2))


def check_fixed_block(fixed_cls: type[nn.Module], seed: int = 0, cases: int = 4) -> None:
    """Zero graph breaks (torch._dynamo.explain) and the original's outputs, on random shapes and both branches."""
    rng = np.random.default_rng(seed)
    for width, batch, bias in _cases(rng, cases):
        original, fixed = _paired_blocks(fixed_cls, width, rng, bias)
        x = torch.randn(batch, width) * float(rng.uniform(0.5, 4))
        with quiet():
            want = original(x)
            got = fixed(x)
            explained = torch._dynamo.explain(fixed)(x)
        where = f"width {width}, batch {batch}, fc2.bias shifted by {bias:+.2f}"
        assert explained.graph_break_count == 0, (
            f"{where}: FixedBlock still has {explained.graph_break_count} graph break(s): "
            + "; ".join(str(r.reason).splitlines()[0] for r in explained.break_reasons))
        assert isinstance(got, torch.Tensor) and got.shape == want.shape, \
            f"{where}: output shape {tuple(getattr(got, 'shape', ()))}, expected {tuple(want.shape)}"
        assert torch.allclose(got, want, rtol=FIXED_RTOL, atol=FIXED_ATOL), (
            f"{where}: outputs differ from BrokenBlock's by up to {(got - want).abs().max().item():.3g}")


# ---------------------------------------------------------------------------------------------
# Checks: break-even


def reference_break_even(compile_seconds: float, eager_step: float, compiled_step: float) -> float:
    """The grader's answer: ceil(compile / saving), 0 without compile cost, inf without a saving."""
    if compile_seconds == 0:
        return 0
    saving = eager_step - compiled_step
    if saving <= 0:
        return math.inf
    return math.ceil(compile_seconds / saving)


def _break_even_ok(got: Any, c: float, e: float, k: float) -> bool:
    """Whether `got` is the reference's answer (within one of it when c / (e - k) is a whole number)."""
    want = reference_break_even(c, e, k)
    if want == math.inf:
        return got == math.inf
    if not isinstance(got, (int, float, np.integer, np.floating)) or not math.isfinite(got) or got != int(got):
        return False
    ratio = c / (e - k)
    if abs(ratio - round(ratio)) <= 1e-9 * max(1.0, ratio):  # on an integer: rounding may go either way
        return abs(int(got) - want) <= 1
    return int(got) == want


def check_break_even(break_even_steps: Callable[..., float], seed: int = 0, cases: int = 40) -> None:
    """Random measurements, about a quarter of them without any saving, the edges, and bad arguments."""
    rng = np.random.default_rng(seed)
    fixed = [(30.0, 0.2, 0.1), (12.5, 0.05, 0.05), (90.0, 0.3, 0.31), (0.0, 0.2, 0.1), (0.0, 0.1, 0.2)]
    draws = []
    for _ in range(cases):
        e = float(10 ** rng.uniform(-4, 0))
        draws.append((float(10 ** rng.uniform(-1, 2.5)), e, e * float(rng.uniform(0.3, 1.3))))
    for c, e, k in fixed + draws:
        got = break_even_steps(c, e, k)
        want = reference_break_even(c, e, k)
        assert _break_even_ok(got, c, e, k), (
            f"break_even_steps({c!r}, {e!r}, {k!r}) = {got!r}, expected {want!r}"
            + (" (no saving per step: it never pays, math.inf)" if want == math.inf else ""))
    for args, name in (((-1.0, 0.2, 0.1), "compile_seconds"), ((math.nan, 0.2, 0.1), "compile_seconds"),
                       ((5.0, 0.0, 0.1), "eager_step"), ((5.0, -0.2, 0.1), "eager_step"),
                       ((5.0, 0.2, 0.0), "compiled_step"), ((5.0, 0.2, math.inf), "compiled_step")):
        try:
            break_even_steps(*args)
        except ValueError as exc:
            assert name in str(exc), f"break_even_steps{args}: the error should name {name}: {exc}"
        else:
            raise AssertionError(f"break_even_steps{args} should raise ValueError naming {name}")


# ---------------------------------------------------------------------------------------------
# Checks: recompiles over a ragged epoch


def _tiny_mlp(features: int, classes: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, 16), nn.GELU(), nn.Linear(16, classes))


def ragged_epochs(compiled: Callable[[torch.Tensor], torch.Tensor], loader: Any, data: IndexedFeatures,
                  epochs: int = 2) -> list[list[list[int]]]:
    """Train `compiled` (forward + backward) over `epochs` passes of `loader`; the sample indices of each batch."""
    seen = []
    for _ in range(epochs):
        batches = []
        for batch in loader:
            x, y = batch[0], batch[1]
            loss = nn.functional.cross_entropy(compiled(x), y)
            loss.backward()
            batches.append(data.index_of(x))
        seen.append(batches)
    return seen


def check_no_recompile(no_recompile_setup: Callable[..., Any], seed: int = 0, cases: int = 3) -> None:
    """One graph over two ragged epochs, on data sets whose size does not divide by the batch."""
    rng = np.random.default_rng(seed)
    for _ in range(cases):
        batch = int(rng.integers(3, 12))
        size = batch * int(rng.integers(2, 6)) + int(rng.integers(2, batch))  # a ragged tail of at least 2
        # Features never equal the batch: dynamo gives equal sizes one symbol ("duck shaping"), and the
        # feature size, fixed by the weights, would then pin the batch size too.
        features, classes = int(rng.integers(13, 20)), int(rng.integers(2, 5))
        data = IndexedFeatures(size, features, classes, seed=int(rng.integers(0, 1000)))
        model = _tiny_mlp(features, classes, int(rng.integers(0, 1000)))
        counter = CountingBackend()
        where = f"{size} samples in batches of {batch}"
        with quiet():
            torch._dynamo.reset()
            compiled, loader = no_recompile_setup(model, data, batch, seed=int(rng.integers(0, 1000)), backend=counter)
            seen = ragged_epochs(compiled, loader, data)
            reasons = recompile_reasons()
            probe = data.x[:batch]
            same = torch.allclose(compiled(probe), model(probe), atol=1e-6)
        assert counter.count >= 1, (
            f"{where}: no graph reached the backend you were given: compile with torch.compile(..., backend=backend)")
        assert counter.count == 1, (
            f"{where}: {counter.count} graphs were compiled over two epochs, one expected. Dynamo recompiled because: "
            + "; ".join(reasons[:3]))
        assert same, f"{where}: the compiled model's outputs differ from the model's"
        for e, batches in enumerate(seen):
            flat = [i for b in batches for i in b]
            assert len(flat) == len(set(flat)), f"{where}: epoch {e + 1} repeats samples"
            assert set(flat) <= set(range(size)), f"{where}: epoch {e + 1} yields samples not in the data set"
            assert len(flat) > size - batch, (
                f"{where}: epoch {e + 1} trained on {len(flat)} samples; at most the ragged tail "
                f"({size % batch}) may be dropped")
            assert all(len(b) == batch for b in batches[:-1]), f"{where}: epoch {e + 1} has a short batch before the last"
        assert seen[0] != seen[1] or len(seen[0]) == 1, f"{where}: both epochs came in the same order; shuffle"
