"""Lab 5 — Compile: the notebook autogrades honestly, and its checks reject wrong answers."""

from __future__ import annotations

import math
import time

import labs_helpers as H
import pytest
import torch
from torch import nn

from perflab.labs import lab05
from perflab.labs.lab05 import BrokenBlock, CompileTiming
from perflab.labs.lab05 import checks as lab05_checks
from perflab.labs.lab05 import judges as hidden05

LAB = lab05.LAB


# ---------------------------------------------------------------------------------------------
# Reference answers (what the solution notebook writes) and wrong ones


def measure_compile(build, steps, *, clock=time.perf_counter, sync=None, reset=True):
    if steps < 1:
        raise ValueError(f"steps: must be at least 1, got {steps}")
    if reset:
        torch._dynamo.reset()
    step = build()
    seconds = []
    for _ in range(steps + 1):
        start = clock()
        step()
        if sync is not None:
            sync()
        seconds.append(clock() - start)
    return CompileTiming(seconds[0], tuple(seconds[1:]))


def graph_breaks(fn, *args):
    out = torch._dynamo.explain(fn)(*args)
    return [(int(b.user_stack[-1].lineno), str(b.reason).splitlines()[0]) for b in out.break_reasons]


class FixedBlock(BrokenBlock):
    def forward(self, x):
        h = self.fc1(self.norm(x))
        h = nn.functional.gelu(h) / h.detach().abs().amax().clamp(min=1.0)
        h = self.fc2(h)
        h = torch.where(h.mean() > 0, h - h.mean(dim=0), h)
        return x + h * ((h.detach() + 2.0) / 4.0).clamp(0.0, 1.0)


class GradientLeak(BrokenBlock):
    """Same outputs, zero breaks, but gradients flow through what the original detached."""

    def forward(self, x):
        h = self.fc1(self.norm(x))
        h = nn.functional.gelu(h) / h.abs().amax().clamp(min=1.0)
        h = self.fc2(h)
        h = torch.where(h.mean() > 0, h - h.mean(dim=0), h)
        return x + h * ((h + 2.0) / 4.0).clamp(0.0, 1.0)


class AlwaysCentre(BrokenBlock):
    """Zero breaks, but drops the branch: wrong whenever the mean is negative."""

    def forward(self, x):
        h = self.fc1(self.norm(x))
        h = nn.functional.gelu(h) / h.detach().abs().amax().clamp(min=1.0)
        h = self.fc2(h)
        h = h - h.mean(dim=0)
        return x + h * ((h.detach() + 2.0) / 4.0).clamp(0.0, 1.0)


def break_even_steps(compile_seconds, eager_step, compiled_step):
    if not (math.isfinite(compile_seconds) and compile_seconds >= 0):
        raise ValueError(f"compile_seconds: bad {compile_seconds!r}")
    for name, value in (("eager_step", eager_step), ("compiled_step", compiled_step)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name}: bad {value!r}")
    if compile_seconds == 0:
        return 0
    saving = eager_step - compiled_step
    return math.inf if saving <= 0 else math.ceil(compile_seconds / saving)


def _loader(dataset, batch_size, seed, **kw):
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                       generator=torch.Generator().manual_seed(seed), **kw)


def setup_drop_last(model, dataset, batch_size, *, seed=0, backend="inductor"):
    return torch.compile(model, backend=backend), _loader(dataset, batch_size, seed, drop_last=True)


def setup_dynamic(model, dataset, batch_size, *, seed=0, backend="inductor"):
    return torch.compile(model, backend=backend, dynamic=True), _loader(dataset, batch_size, seed)


def setup_mark_dynamic(model, dataset, batch_size, *, seed=0, backend="inductor"):
    compiled = torch.compile(model, backend=backend)

    def call(x):
        torch._dynamo.mark_dynamic(x, 0)
        return compiled(x)

    return call, _loader(dataset, batch_size, seed)


def setup_naive(model, dataset, batch_size, *, seed=0, backend="inductor"):
    return torch.compile(model, backend=backend), _loader(dataset, batch_size, seed)


def setup_ignores_backend(model, dataset, batch_size, *, seed=0, backend="inductor"):
    return torch.compile(model, backend="eager"), _loader(dataset, batch_size, seed, drop_last=True)


# ---------------------------------------------------------------------------------------------
# The notebook, autograded for real (tiny mode)


@pytest.mark.slow
def test_results_hold_compile_numbers_and_the_verdict() -> None:
    from perflab import results
    from perflab.labs import common

    run = H.graded_solution(LAB)
    sections = results.load(common.results_path(LAB, run.folder))["sections"]
    compiled = sections["compile"]
    assert compiled["workload"] == "small" or torch.cuda.is_available()
    assert {"eager", "default"} <= set(compiled["modes"])
    assert compiled["modes"]["default"]["compile_seconds"] > compiled["modes"]["default"]["steady_median"]
    assert sections["graph_breaks"] == {**sections["graph_breaks"], "before": 4, "after": 0}
    assert sections["recompiles"]["ragged_graphs"] == 2 and sections["recompiles"]["fixed_graphs"] == 1
    assert sections["verification"][0]["name"] == lab05.expectation_name("tiny")
    for mode, steps in compiled["break_even_steps"].items():
        assert (steps is None) == (mode in compiled["never_pays"])


# ---------------------------------------------------------------------------------------------
# The checks pass right answers and fail wrong ones (so a pass means something)


def test_measure_compile_checks() -> None:
    hidden05.check("test_measure_compile_hidden", {"measure_compile": measure_compile}, seed=1)
    with pytest.raises(AssertionError, match="reset"):
        hidden05.check("test_measure_compile_hidden", {"measure_compile": lambda *a, **k: measure_compile(*a, **k, reset=False)}, seed=1)

    def no_sync(build, steps, *, clock=time.perf_counter, sync=None):
        return measure_compile(build, steps, clock=clock)

    with pytest.raises(AssertionError, match="sync"):
        hidden05.check("test_measure_compile_hidden", {"measure_compile": no_sync}, seed=2)

    def times_build(build, steps, *, clock=time.perf_counter, sync=None):
        start = clock()
        timing = measure_compile(build, steps, clock=clock, sync=sync)
        return CompileTiming(clock() - start - sum(timing.steady), timing.steady)

    with pytest.raises(AssertionError, match="build"):
        hidden05.check("test_measure_compile_hidden", {"measure_compile": times_build}, seed=3)


def test_compile_timing_derives_its_statistics() -> None:
    t = CompileTiming(5.0, (0.5, 0.25, 0.75))
    assert t.steady_median == 0.5 and t.compile_seconds == 4.5
    assert CompileTiming(0.1, (0.5,)).compile_seconds == 0.0
    assert lab05.total_seconds(t, 10) == 4.5 + 10 * 0.5
    with pytest.raises(ValueError, match="steady"):
        CompileTiming(1.0, ())
    with pytest.raises(ValueError, match="negative"):
        CompileTiming(-1.0, (0.1,))


def test_graph_break_checks() -> None:
    hidden05.check("test_graph_breaks_hidden", {"graph_breaks": graph_breaks}, seed=2)

    def first_line(fn, *args):
        return [(1, reason) for _, reason in graph_breaks(fn, *args)]

    with pytest.raises(AssertionError, match="dynamo breaks at lines"):
        hidden05.check("test_graph_breaks_hidden", {"graph_breaks": first_line}, seed=2)

    def counts_graphs(fn, *args):
        out = torch._dynamo.explain(fn)(*args)
        return [(int(b.user_stack[-1].lineno), "x") for b in out.break_reasons] + [(0, "one more")]

    with pytest.raises(AssertionError, match="you found"):
        hidden05.check("test_graph_breaks_hidden", {"graph_breaks": counts_graphs}, seed=3)


def test_fixed_block_checks() -> None:
    hidden05.check("test_fixed_hidden", {"FixedBlock": FixedBlock}, seed=3)
    with pytest.raises(AssertionError, match="graph break"):
        hidden05.check("test_fixed_hidden", {"FixedBlock": BrokenBlock}, seed=3)
    with pytest.raises(AssertionError, match="outputs differ"):
        hidden05.check("test_fixed_hidden", {"FixedBlock": AlwaysCentre}, seed=3)
    with pytest.raises(AssertionError, match="subclass"):
        hidden05.check("test_fixed_hidden", {"FixedBlock": lab05.PlainBlock}, seed=3)


def test_compiled_gate_catches_gradients_that_the_original_did_not_have() -> None:
    worst = lab05_checks.check_compiled_matches_eager(FixedBlock, seed=4, backend="aot_eager")
    assert max(worst.values()) < 1e-4
    with pytest.raises(AssertionError, match="detach"):
        lab05_checks.check_compiled_matches_eager(GradientLeak, seed=4, backend="aot_eager")


def test_break_even_checks() -> None:
    hidden05.check("test_break_even_hidden", {"break_even_steps": break_even_steps}, seed=4)
    assert hidden05.reference_break_even(30.0, 0.2, 0.1) == 300
    assert hidden05.reference_break_even(5.0, 0.1, 0.1) == math.inf

    def ratio(c, e, k):
        return c / (e - k) if e != k else 0

    with pytest.raises(AssertionError, match="expected"):
        hidden05.check("test_break_even_hidden", {"break_even_steps": ratio}, seed=4)

    def big_number(c, e, k):
        out = break_even_steps(c, e, k)
        return 10**9 if out == math.inf else out

    with pytest.raises(AssertionError, match="never pays"):
        hidden05.check("test_break_even_hidden", {"break_even_steps": big_number}, seed=5)

    def no_validation(c, e, k):
        return hidden05.reference_break_even(c, e, k)

    with pytest.raises(AssertionError, match="ValueError"):
        hidden05.check("test_break_even_hidden", {"break_even_steps": no_validation}, seed=6)


@pytest.mark.parametrize("setup", [setup_drop_last, setup_dynamic, setup_mark_dynamic])
def test_every_recompile_fix_passes(setup) -> None:
    hidden05.check("test_no_recompile_hidden", {"no_recompile_setup": setup}, seed=6)


@pytest.mark.parametrize(("setup", "words"), [(setup_naive, "2 graphs"), (setup_ignores_backend, "no graph reached")])
def test_recompile_check_fails_wrong_setups(setup, words) -> None:
    with pytest.raises(AssertionError, match=words):
        hidden05.check("test_no_recompile_hidden", {"no_recompile_setup": setup}, seed=6)


def test_recompile_reasons_name_the_guard() -> None:
    model = nn.Linear(5, 3)
    torch._dynamo.reset()
    with lab05.quiet():
        compiled = torch.compile(model, backend=lab05.CountingBackend())
        compiled(torch.randn(4, 5))
        compiled(torch.randn(2, 5))
    assert any("size mismatch" in r for r in lab05.recompile_reasons())


def test_small_step_follows_the_verify_contract() -> None:
    kwargs = lab05.sizes("tiny").small_kwargs()
    a, b = lab05.small_step(3, **kwargs), lab05.small_step(3, **kwargs)
    first = [a() for _ in range(36)]  # over two epochs (512 samples, batches of 32)
    assert first[:18] == [b() for _ in range(18)], "the same seed gives the same losses and samples"
    loss, idx = first[0]
    assert isinstance(loss, float) and math.isfinite(loss) and len(idx) == kwargs["batch_size"]
    epoch1 = sorted(i for _, ix in first[:16] for i in ix)
    assert epoch1 == list(range(kwargs["samples"])), "an epoch is every sample once"
    assert first[16][1] != first[0][1], "the next epoch is reshuffled"
    losses = [loss for loss, _ in first]
    assert sum(losses[-8:]) < 0.8 * sum(losses[:8]), f"it learns: {losses[:8]} ... {losses[-8:]}"
    with pytest.raises(ValueError, match="compile_mode"):
        lab05.small_step(0, compile_mode="fast")


def test_sides_and_choice() -> None:
    baseline, candidate = lab05.sides(None, "tiny", "cpu")
    assert baseline.target == candidate.target == "perflab.labs.lab05:small_step"
    assert candidate.kwargs.get("compile_mode") is None
    _, compiled = lab05.sides("default", "tiny", "cpu")
    assert compiled.kwargs["compile_mode"] == "default" and compiled.kwargs["width"] == lab05.sizes("tiny").width
    assert lab05.choice_problems(None) == [] and lab05.choice_problems("max-autotune") == []
    assert lab05.choice_problems("fast")
    with pytest.raises(ValueError, match="CHOICE"):
        lab05.sides("fast", "tiny", "cpu")
    assert lab05.graded_workload("full", "cuda") == "resnet18"
    assert lab05.graded_workload("tiny", "cuda") == lab05.graded_workload("full", "cpu") == "small"
    assert lab05.expectation_name("grade", "cuda") == lab05.EXPECTATION_RESNET
    assert lab05.available_modes("cpu", "tiny") == ("default",)
    assert "reduce-overhead" in lab05.available_modes("cuda", "tiny")
    for mode in ("tiny", "laptop", "full", "grade"):
        s = lab05.sizes(mode)
        assert len({s.features, s.width, s.batch_size, s.ragged_samples % s.batch_size}) == 4, \
            f"{mode}: equal sizes would share a dynamic-shape symbol"
        assert s.ragged_samples % s.batch_size >= 2


def test_hardware_notes_are_read_by_the_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab.labs import common

    monkeypatch.setenv("PERFLAB_MODE", "tiny")
    assert common.lab_hardware_notes(LAB) == lab05.HARDWARE_NOTES
    assert "this lab" in common.hardware_statement(LAB)


@pytest.mark.slow
def test_a_compiling_candidate_is_verified_not_called_tampering() -> None:
    """torch.compile patches nn.Module and the optimizers on first use; the verifier must not take that for tampering."""
    from perflab.verify import Budget, guard, verify

    baseline, candidate = lab05.sides("default", "tiny", "cpu")
    # Hashes taken now: this test is about compile's patches, not about files edited since import.
    verdict = verify(baseline, candidate, expectation=0.5, budget=Budget(min_pairs=2, max_pairs=2),
                     hashes=guard.file_hashes())
    assert verdict.code in ("clears_bar", "below_bar", "undecided"), verdict.reason
    gate = verdict.details["gate"]
    assert gate["candidate_losses"][0] == pytest.approx(gate["baseline_losses"][0], rel=1e-3)
    assert verdict.details["warmup_seconds"]["candidate"] > verdict.details["warmup_seconds"]["baseline"]


def test_hidden_checks_live_apart() -> None:
    for name in ("reference_break_even", "reference_breaks", "JUDGES"):
        assert not hasattr(lab05, name) and hasattr(hidden05, name), name


def test_a_break_even_is_stated_only_from_a_gain_whose_ci_excludes_1() -> None:
    assert lab05.break_even_here(175_616, (1.02, 1.09)) == (175_616, "pays off after 175,616 steps")
    steps, words = lab05.break_even_here(175_616, (0.97, 1.09))  # a point estimate the CI does not confirm
    assert steps is None and words.startswith("no measurable gain: never pays off here") and "0.97-1.09x" in words
    assert lab05.break_even_here(math.inf, (0.8, 0.9)) == (None, "never pays off here (the compiled step is no faster)")


@pytest.mark.slow
@pytest.mark.parametrize("cold", [False, True])
def test_a_fresh_process_times_its_first_calls_with_caches_on_or_off(cold: bool) -> None:
    from perflab.labs.lab05 import dynamo as lab05_dynamo

    calls = lab05_dynamo.first_calls_in_fresh_process(None, lab05.sizes("tiny").small_kwargs(), cold=cold)
    assert calls["caches_off"] == float(cold)
    assert calls["first"] > 0 and calls["second"] > 0


def test_a_failing_fresh_process_says_why() -> None:
    from perflab.labs.lab05 import dynamo as lab05_dynamo

    with pytest.raises(RuntimeError, match=r"fresh process failed \(exit 1\): RuntimeError: .*negative dimension"):
        lab05_dynamo.first_calls_in_fresh_process(None, {"features": -1}, cold=True)
