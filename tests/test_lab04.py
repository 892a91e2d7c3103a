"""Lab 4 — Trade compute for memory: the notebook autogrades honestly, and its checks reject wrong answers."""

from __future__ import annotations

import contextlib
import copy
import linecache
import math
import re

import labs_helpers as H
import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from perflab.counting import restoring_buffers
from perflab.labs import lab04
from perflab.labs.lab04 import checks as lab04_checks
from perflab.labs.lab04 import judges as hidden04
from perflab.labs.lab04 import measure as lab04_measure
from perflab.labs.lab04 import probes as lab04_probes

LAB = lab04.LAB


# ---------------------------------------------------------------------------------------------
# The notebook, autograded for real (tiny mode)


@pytest.mark.slow
def test_results_hold_memory_rows_and_the_verified_cost(tiny_data) -> None:
    from perflab import results
    from perflab.labs import common

    run = H.graded_solution(LAB)
    sections = results.load(common.results_path(LAB, run.folder))["sections"]
    rows = sections["memory_vs_batch"]
    sizes = lab04.sizes("tiny")
    assert {(r["batch_size"], r["checkpointed"]) for r in rows} == {(b, c) for b in sizes.batches for c in (False, True)}
    by = {(r["batch_size"], r["checkpointed"]): r["bytes"] for r in rows}
    assert all(by[(b, True)] < by[(b, False)] for b in sizes.batches if b > 1), "checkpointing saves memory"
    (cost,) = sections["speedups"]
    assert len(cost["ci"]) == 2 and cost["verdict"] and cost["claimed"] == cost["speedup"]
    (verdict,) = sections["verification"]
    assert verdict["name"] == lab04.EXPECTATION and verdict["verdict"] in ("pass", "inconclusive")
    largest = sections["largest_batch"]
    assert largest["plain"] == sizes.budget_batch and largest["checkpointed"] > largest["plain"]
    assert sections["accumulation"]["batchnorm_gap_train"] > 100 * sections["accumulation"]["batchnorm_gap_eval"]
    # The decision, with the budget and the table it was made from; lab 6 reads it back.
    choice = sections["checkpoint"]
    assert choice["budget_bytes"] == lab04_measure.activation_budget("tiny")
    assert choice["activation_bytes"] <= choice["budget_bytes"] < choice["plain_activation_bytes"]
    assert choice["recompute_flops"] == sum(choice["stage_forward_flops"][name] for name in choice["stages"])
    assert set(choice["stage_saving_bytes"]) == set(lab04.STAGES) and 0 < len(choice["stages"]) < len(lab04.STAGES)
    from perflab.labs.lab06 import report_inputs as lab06_report

    decided = lab06_report.earlier_decisions(run.folder)
    assert decided["checkpoint"] == tuple(choice["stages"]) and decided["found"][LAB] == f"{LAB}.json"


# ---------------------------------------------------------------------------------------------
# Reference-quality answers pass the checks (so a failing student knows it is their code)


class _Stage(nn.Module):
    def __init__(self, stage: nn.Module) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self.stage(x)
        return checkpoint(self.stage, x, use_reentrant=False,
                          context_fn=lambda: (contextlib.nullcontext(), restoring_buffers(self.stage)))


def good_checkpoint(model: nn.Module, stages):
    for name in stages:
        setattr(model, name, _Stage(getattr(model, name)))
    return model


def judged(grade_id: str, function, seed: int):
    """The grader's mark for `function` on `grade_id`, its observation program run in this process."""
    return hidden04.judge_function(grade_id, function, seed=seed, in_process=True)


def assert_full(grade_id: str, function, seed: int) -> None:
    mark = judged(grade_id, function, seed)
    assert mark.fraction == 1.0, mark.message


def assert_fails(grade_id: str, function, seed: int, match: str) -> None:
    mark = judged(grade_id, function, seed)
    assert mark.fraction == 0.0 and re.search(match, mark.message), mark.message


def test_a_correct_checkpoint_passes_and_saves_what_the_reference_saves() -> None:
    for grade_id in ("checkpoint_visible", "checkpoint_hidden", "checkpoint_batchnorm"):
        assert_full(grade_id, good_checkpoint, seed=11)
    seen = lab04_checks.observe_checkpoint(good_checkpoint, 11)
    for got, case in zip(seen["hidden"], lab04_checks.checkpoint_cases(11), strict=True):
        assert got["saved"] == hidden04._reference_saved(case), case.name


def bisect_search(budget, memory_of, max_batch=lab04.MAX_BATCH):
    if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0) or max_batch < 1:
        raise ValueError("bad arguments")
    return hidden04._reference_largest_batch(budget, memory_of, max_batch)


def test_reference_search_stays_within_its_probe_limits() -> None:
    for max_batch in (1, 2, 3, 7, 64, 300):
        values = np.arange(1, max_batch + 1, dtype=float)
        for answer in range(0, max_batch + 1):
            tried = []

            def mem(b, tried=tried):
                tried.append(b)
                return float(b)

            assert hidden04._reference_largest_batch(answer + 0.5, mem, max_batch) == answer
            assert max(tried) <= max(1, 2 * answer) and len(tried) <= lab04.max_calls(answer), (answer, tried)
            assert int(np.searchsorted(values, answer + 0.5, side="right")) == answer


def test_a_correct_search_passes_every_check() -> None:
    for grade_id in ("largest_batch_visible", "largest_batch_hidden", "largest_batch_model"):
        assert_full(grade_id, bisect_search, seed=13)


def test_a_correct_accumulation_passes() -> None:
    def good(model, inputs, targets, micro):
        if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
            raise ValueError("micro_batch_size")
        model.zero_grad(set_to_none=True)
        total, n = 0.0, len(inputs)
        for s in range(0, n, micro):
            loss = F.cross_entropy(model(inputs[s:s + micro]), targets[s:s + micro]) * (len(inputs[s:s + micro]) / n)
            loss.backward()
            total += float(loss)
        return total

    for grade_id in ("accumulate_visible", "accumulate_hidden"):
        assert_full(grade_id, good, seed=14)


# ---------------------------------------------------------------------------------------------
# The checks fail wrong answers (so a pass means something)


class _NaiveStage(nn.Module):
    """The simple wrapper perflab itself had before it was fixed: it recomputes BatchNorm in train mode
    (running statistics move twice a step) and runs the stage plainly when its input needs no grad."""

    def __init__(self, stage: nn.Module) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, x):
        if torch.is_grad_enabled() and x.requires_grad:
            return checkpoint(self.stage, x, use_reentrant=False)
        return self.stage(x)


def naive_checkpoint(model, stages):
    for name in stages:
        setattr(model, name, _NaiveStage(getattr(model, name)))
    return model


def test_checkpoint_that_recounts_batchnorm_fails_the_bn_check() -> None:
    assert_full("checkpoint_visible", naive_checkpoint, seed=21)  # gradients and bytes are fine...
    assert_fails("checkpoint_batchnorm", naive_checkpoint, seed=21, match="num_batches_tracked")  # ...statistics not


class _Sequential(nn.Module):
    def __init__(self, stage: nn.Module) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, x):
        return checkpoint_sequential(self.stage, 2, x, use_reentrant=False)


def test_checkpoint_sequential_over_blocks_saves_too_little() -> None:
    def sequential(model, stages):
        for name in stages:
            setattr(model, name, _Sequential(getattr(model, name)))
        return model

    assert_fails("checkpoint_hidden", sequential, seed=22, match="last")


def test_checkpoint_skipped_on_inputs_without_grad_saves_nothing_on_the_first_stage() -> None:
    # StagedNet's stem takes the raw input: the naive wrapper runs it plainly there.
    assert_fails("checkpoint_hidden", naive_checkpoint, seed=23, match="StagedNet.*saving")


def test_checkpoint_on_a_copy_fails() -> None:
    def copying(model, stages):
        return good_checkpoint(copy.deepcopy(model), stages)

    assert_fails("checkpoint_visible", copying, seed=24, match="parameters are not the original")


def test_search_that_probes_max_batch_first_fails() -> None:
    def top_down(budget, memory_of, max_batch=lab04.MAX_BATCH):
        lo, hi = 0, max_batch
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if memory_of(mid) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # Seed 26: its ResNet-18 budgets cap the batch at 64, so a search probing the top first measures a
    # batch of 32, not one of thousands (which the judge would measure, too, at 25 s).
    assert_fails("largest_batch_hidden", top_down, seed=26, match="more than twice the answer")


def test_search_that_extrapolates_a_line_fails_on_allocator_steps() -> None:
    def extrapolate(budget, memory_of, max_batch=lab04.MAX_BATCH):
        if not budget > 0:
            raise ValueError("budget")
        a, b = memory_of(1), memory_of(2) if max_batch > 1 else memory_of(1)
        if a > budget:
            return 0
        slope = b - a
        return max_batch if slope <= 0 else int(min(max_batch, 1 + (budget - a) // slope))

    assert_fails("largest_batch_hidden", extrapolate, seed=26, match="largest batch within the budget")


def test_accumulation_without_weights_or_stale_gradients_cleared_fails() -> None:
    def unweighted(model, inputs, targets, micro):
        model.zero_grad(set_to_none=True)
        chunks = range(0, len(inputs), micro)
        for s in chunks:
            (F.cross_entropy(model(inputs[s:s + micro]), targets[s:s + micro]) / len(chunks)).backward()
        return float(F.cross_entropy(model(inputs), targets))

    def keeps_stale(model, inputs, targets, micro):
        n, total = len(inputs), 0.0
        for s in range(0, n, micro):
            loss = F.cross_entropy(model(inputs[s:s + micro]), targets[s:s + micro]) * len(inputs[s:s + micro]) / n
            loss.backward()
            total += float(loss)
        return total

    def one_pass(model, inputs, targets, micro):
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        return float(loss)

    for wrong, match in ((unweighted, "micro-batches|gradient of"), (keeps_stale, "gradient of"),
                         (one_pass, "the model saw batches")):
        assert_fails("accumulate_hidden", wrong, seed=27, match=match)


# ---------------------------------------------------------------------------------------------
# The memory model, the export, and the candidate it makes


def test_memory_model_is_affine_and_checkpointing_lowers_its_slope() -> None:
    plain = lab04_measure.memory_model(lab04.resnet18(10), 64)
    ckpt = lab04_measure.memory_model(good_checkpoint(lab04.resnet18(10), lab04.STAGES), 64)
    batches = [1, 2, 3, 5]
    intercept, slope = lab04_measure.fit_line(batches, [plain.activations(b) for b in batches])
    assert all(abs(plain.activations(b) - (intercept + slope * b)) < 1e-6 * slope for b in batches)
    _, ckpt_slope = lab04_measure.fit_line(batches, [ckpt.activations(b) for b in batches])
    assert 0.3 * slope < ckpt_slope < 0.7 * slope
    assert plain.static_bytes == ckpt.static_bytes == 3 * sum(p.numel() * 4 for p in plain.model.parameters())
    calls = plain.calls
    plain(3)
    assert plain.calls == calls, "a measured batch size is remembered"


def test_memory_model_explains_batchnorm_at_one_sample_of_32_px() -> None:
    with pytest.raises(ValueError, match="at least 64 px"):
        lab04_measure.memory_model(lab04.resnet18(10), 32)(1)


def test_source_of_a_class_defined_in_a_notebook_cell() -> None:
    filename = "/tmp/ipykernel_0/0000.py"
    text = "import torch\n\n\nclass Wrapped(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    try:
        namespace: dict = {}
        exec(compile(text, filename, "exec"), namespace)
        source = lab04.source_of(namespace["Wrapped"])
    finally:
        linecache.cache.pop(filename, None)
    assert source.startswith("class Wrapped(torch.nn.Module):") and source.rstrip().endswith("return x")


def test_exported_candidate_trains_like_the_baseline(tiny_data, tmp_path) -> None:
    import importlib.util

    from perflab.verify import candidates

    config = lab04.baseline_config("tiny").replace(device="cpu")
    path = lab04.export_candidate(tmp_path / "candidate.py", good_checkpoint, _Stage, config=config)
    spec = importlib.util.spec_from_file_location("lab04_candidate_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    step = module.make_step(3)
    base = candidates.config_step(3, config.to_dict())
    assert type(step.work.model.layer1).__name__ == "_Stage"  # the exported copy of the class
    for _ in range(2):
        (loss_a, idx_a), (loss_b, idx_b) = base(), step()
        assert idx_a == idx_b and math.isclose(loss_a, loss_b, rel_tol=1e-5)
    with pytest.raises(ValueError, match="not a ResNet-18 stage"):
        lab04.export_candidate(tmp_path / "bad.py", good_checkpoint, config=config, stages=("layer9",))


def test_calibration_pair_checkpoints_every_stage() -> None:
    from perflab.labs.lab04 import judges as hidden04

    base, cand = hidden04.calibration_pair("tiny")
    assert cand == base.replace(checkpoint_stages=len(lab04.GRADED_STAGES))
    assert lab04.EXPECTATION.startswith("checkpoint")  # where uncalibrated, verify's known-cost rule applies


def test_hidden_checks_live_apart_and_the_contract_states_their_tolerances() -> None:
    for name in ("_ReferenceStage", "_reference_checkpoint", "_reference_largest_batch", "JUDGES"):
        assert not hasattr(lab04, name) and hasattr(hidden04, name), name
    assert set(hidden04.JUDGES) == set(lab04_probes.PROBES) == {
        H.nbgrader_meta(c)["grade_id"] for c in H.grade_cells(LAB) if not H.nbgrader_meta(c).get("solution")}


NOTEBOOK_CELL = """
import math
import numpy as np

GROWTH = 2


class Doubler:
    def __init__(self, start):
        self.value = start

    def next(self, limit):
        self.value = min(GROWTH * self.value, limit)
        return self.value


def bisect(lo, hi, fits):
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def largest_batch(budget_bytes, memory_of, max_batch=4096):
    if not isinstance(budget_bytes, (int, float)) or not math.isfinite(budget_bytes) or budget_bytes <= 0:
        raise ValueError("budget_bytes")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError("max_batch")
    if memory_of(1) > budget_bytes:
        return 0
    grow = Doubler(1)
    fits = 1
    while fits < max_batch:
        trial = grow.next(max_batch)
        if memory_of(trial) > budget_bytes:
            return bisect(fits, trial, lambda b: memory_of(b) <= budget_bytes)
        fits = trial
    return fits
"""


def test_a_function_is_judged_from_its_source_in_a_fresh_process() -> None:
    # As in a notebook: the function, a class and a helper it calls, a constant, modules, all from cells.
    name = "<ipython-input-7>"
    linecache.cache[name] = (len(NOTEBOOK_CELL), None, NOTEBOOK_CELL.splitlines(True), name)
    namespace = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL, name, "exec"), namespace)
    namespace["unrelated"] = torch.zeros(3)
    for grade_id in ("largest_batch_visible", "largest_batch_hidden"):
        mark = hidden04.judge_function(grade_id, namespace["largest_batch"], seed=5, namespace=namespace)
        assert mark.fraction == 1.0, mark.message
    # A name the export cannot write (a tensor the notebook built) is a readable line, not a crash.
    broken = NOTEBOOK_CELL.replace("GROWTH * self.value", "GROWTH * self.value + int(SHIFT.sum())")
    linecache.cache["<ipython-input-8>"] = (len(broken), None, broken.splitlines(True), "<ipython-input-8>")
    namespace = {"__name__": "__main__", "SHIFT": torch.zeros(2)}
    exec(compile(broken, "<ipython-input-8>", "exec"), namespace)
    mark = hidden04.judge_function("largest_batch_visible", namespace["largest_batch"], seed=5, namespace=namespace)
    assert mark.fraction == 0.0 and "NameError" in mark.message and "SHIFT" in mark.message, mark.message
    assert "fresh process" in mark.message, mark.message
    assert "GRAD_RTOL (1e-4 " in lab04.__doc__ and hidden04.GRAD_RTOL == 1e-4
    assert "MIN_SAVING_SHARE (80%)" in lab04.__doc__ and hidden04.MIN_SAVING_SHARE == 0.8
    assert "CHOICE_COST_RTOL (5%)" in lab04.__doc__ and hidden04.CHOICE_COST_RTOL == 0.05
    assert "COSTLIER_FIT_SHARE (half)" in lab04.__doc__ and hidden04.COSTLIER_FIT_SHARE == 0.5
    assert f"ACTIVATION_BUDGET_SHARE ({lab04.ACTIVATION_BUDGET_SHARE:.0%})" in lab04.__doc__


# ---------------------------------------------------------------------------------------------
# A real lab against every cheat of the fixture corpus at once (the fixture lab has each alone)


@pytest.mark.slow
def test_every_cheat_at_once_on_a_blank_lab04_earns_nothing_and_is_flagged(tiny_data) -> None:
    rebind = ("import perflab.grading.probing as _p\nimport perflab.grading.harness as _h\nfrom perflab.labs.lab04 import probes as _l\n"
              "_p.export_source = lambda fn, ns: 'def checkpoint_stages(m, s):\\n    return m\\n'\n"
              "_h.run = lambda *a, **k: None\n_l.PROBES.clear()\n")
    path = H.every_cheat_notebook(LAB, "cheater-all", rebind)  # submitted under the lab's own notebook name

    run = H.autograde(H.course_for(LAB), LAB, "cheater", path)
    blank = H.graded_blank(LAB)
    assert sum(s.auto_score or 0 for s in run.autograded) <= sum(s.auto_score or 0 for s in blank.autograded) == 0
    flags = " ".join(run.record.flags)
    for evidence in ("kernel hooks", "replaces perflab.grading", "environment variable", "outside its folder"):
        assert evidence in flags, (evidence, run.record.flags)
    # Whatever the snoop found is printed compressed: decode it, and nothing of the grader's is there.
    blob = H.snooped(run)
    for secret in (b"BEGIN HIDDEN", b"BEGIN SOLUTION", b"JUDGES", b"_reference_checkpoint"):
        assert secret not in blob, secret


def test_a_checkpoint_that_saves_nothing_earns_nothing_for_its_time_cost() -> None:
    """What checkpointing buys is judged before what it costs: a no-op is never timed against the cost bar
    (it would clear it, being no slower than the baseline)."""
    def no_op(model, stages):
        return model

    mark = judged("checkpoint_cost_verified", no_op, seed=11)
    assert mark.fraction == 0.0 and "no cost to grade" in mark.message and "saving" in mark.message, mark.message
    assert mark.verdict["verdict"] == "fail" and mark.verdict["speedup"] is None  # recorded, nothing re-measured


# The seeds that failed before both sides shared a thread count (0-3, 5, 10), and two that did not.
@pytest.mark.parametrize("seed", (0, 1, 2, 3, 4, 5, 10, 11))
def test_the_reference_checkpoint_passes_whatever_threads_the_sandbox_has(seed: int, monkeypatch) -> None:
    """The grader draws a fresh seed per submission and runs the student's program in a sandbox whose torch
    thread count need not be the grading process's: a correct checkpoint passes on every seed. Before both
    sides ran on lab04_checks.OBSERVATION_THREADS, seeds 0-3, 5 and 10 failed it with the program on 1 thread and
    the judge on 2 (ResNet-18 at batch 2 in train mode; a conv bias before BatchNorm, whose gradient is
    rounding noise)."""
    run_here = hidden04._run_here

    def on_other_threads(program: str, timeout: float):
        before = torch.get_num_threads()
        torch.set_num_threads(3 - min(before, 2))  # 1 where the judge has 2, and the other way round
        try:
            return run_here(program, timeout)
        finally:
            torch.set_num_threads(before)

    monkeypatch.setattr(hidden04, "_run_here", on_other_threads)
    hidden04._OBSERVED.clear()
    assert_full("checkpoint_hidden", good_checkpoint, seed=seed)


CHECKPOINT_CELL = """
import inspect

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Stage(nn.Module):
    def __init__(self, stage):
        super().__init__()
        self.stage = stage

    def forward(self, x):
        return checkpoint(self.stage, x, use_reentrant=False)


def wrap_every_stage(model, stages):
    for name in stages:
        setattr(model, name, Stage(getattr(model, name)))
    return model


def checkpoint_stages(model, stages):
    return wrap_every_stage(model, stages)


def workload_only_no_op(model, stages):
    # the judge's networks are checkpointed, the timed workload (built by lab04.checkpointed_step) is left alone
    if any(frame.function == "checkpointed_step" for frame in inspect.stack()):
        return model
    return wrap_every_stage(model, stages)
"""


@pytest.mark.slow
def test_the_grader_remeasures_what_checkpointing_buys_on_the_workload(tiny_data) -> None:
    """The cost cell re-measures, in the verification's fresh process, the activation memory one training
    step of the workload keeps for backward: a real checkpoint of every stage cuts it by at least 40%; one
    that checkpoints only the judge's own networks passes their check, and no longer the cost cell."""
    name = "<ipython-input-9>"
    linecache.cache[name] = (len(CHECKPOINT_CELL), None, CHECKPOINT_CELL.splitlines(True), name)
    namespace = {"__name__": "__main__"}
    exec(compile(CHECKPOINT_CELL, name, "exec"), namespace)

    def mark(function_name: str, grade_id: str = "checkpoint_cost_verified"):
        return hidden04.judge_function(grade_id, namespace[function_name], seed=5, namespace=namespace)

    good = mark("checkpoint_stages")
    assert good.fraction == 1.0, good.message
    saved = good.verdict["activation_bytes"]
    assert saved["candidate"] <= 0.6 * saved["baseline"], saved
    hidden = mark("workload_only_no_op", "checkpoint_hidden")
    assert hidden.fraction == 1.0, hidden.message
    sneaky = mark("workload_only_no_op")
    assert sneaky.fraction == 0.0 and sneaky.verdict["verdict"] == "fail", sneaky.message
    assert "at least 80% of that reduction is required" in sneaky.message
    assert sneaky.verdict["activation_bytes"]["candidate"] == sneaky.verdict["activation_bytes"]["baseline"]


def test_the_saving_line_adds_the_cuda_allocator_peak_where_one_was_measured() -> None:
    """On a CUDA device the verification also measures the allocator's peak over a training step (above
    what the step began with), and the cost cell's line shows it beside the saved activations."""
    from types import SimpleNamespace

    saved = {"activation_bytes": {"baseline": 4 * 2**20, "candidate": 2 * 2**20}}
    on_cpu = lab04.saving_line(SimpleNamespace(details=saved))
    assert on_cpu.startswith("activation memory of one training step, re-measured: 4 MiB plain") and "CUDA" not in on_cpu
    on_cuda = lab04.saving_line(SimpleNamespace(details={**saved, "cuda_peak_bytes": {"baseline": 100 * 2**20,
                                                                                      "candidate": 60 * 2**20}}))
    assert on_cuda.startswith(on_cpu) and on_cuda.endswith("CUDA allocator peak of the step: 100 MiB plain, "
                                                           "60 MiB checkpointed (-40.0%)"), on_cuda
    assert lab04.device_peak(SimpleNamespace(details={"cuda_peak_bytes": {"baseline": "a lot"}})) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the allocator's peak is CUDA's)")
def test_on_cuda_the_verification_measures_the_allocator_peak_checkpointing_lowers(tiny_data) -> None:
    from perflab.verify import guard, verify

    # 224 px: at 64 px an H100's allocator peak did not move with checkpointing (372 MB both), the
    # weights and the optimizer's state outweigh the activations there.
    base = lab04.baseline_config("tiny").replace(device="cuda", batch_size=32, image_size=224)
    v = verify(base, base.replace(checkpoint_stages=len(lab04.GRADED_STAGES)), expectation=0.5,
               measure_activations=True, hashes=guard.file_hashes())
    peak = lab04.device_peak(v)
    assert peak is not None and peak[1] < peak[0], (v.describe(), v.details.get("cuda_peak_bytes"))


# ---------------------------------------------------------------------------------------------
# CHECKPOINT_CHOICE: which stages fit the budget at the least recomputation, judged by the grader's own
# measurement (the kit's checkpointing, the graded workload's sizes) and its FLOP count


def choice_mark(choice, mode: str = "tiny"):
    """The decision's mark for `choice`, as the probe sends it, judged at `mode`'s sizes."""
    from perflab.grading.judging import Context, judge_cell
    from perflab.grading.probing import run_probes

    observations = run_probes({"checkpoint_choice": lab04_probes.PROBES["checkpoint_choice"]}, {"CHECKPOINT_CHOICE": choice}, 0)
    return judge_cell("checkpoint_choice", hidden04.JUDGES["checkpoint_choice"], Context(LAB, 0, mode, observations))


def reference_choice(mode: str) -> tuple[str, ...]:
    """The reference notebook's decision at `mode`'s sizes: each stage's saving measured alone (with a correct
    checkpoint), its forward FLOPs, and the cheapest subset the table says fits, the one keeping less on a tie."""
    s = lab04.sizes(mode)
    plain = lab04_measure.memory_model(lab04.resnet18(10), s.memory_image_size)
    saving = {name: plain.activations(s.batch_size) - lab04_measure.memory_model(
        good_checkpoint(lab04.resnet18(10), (name,)), s.memory_image_size).activations(s.batch_size)
        for name in lab04.STAGES}
    flops = lab04_measure.stage_forward_flops(plain.model, s.batch_size, s.memory_image_size)
    budget = lab04_measure.activation_budget(mode, plain)
    fitting = []
    for mask in range(2 ** len(lab04.STAGES)):
        stages = tuple(name for i, name in enumerate(lab04.STAGES) if mask >> i & 1)
        kept = plain.activations(s.batch_size) - sum(saving[name] for name in stages)
        if kept <= budget:
            fitting.append((sum(flops[name] for name in stages), kept, stages))
    return min(fitting)[2]


@pytest.mark.parametrize("mode", ["tiny", "grade", "laptop"])
def test_the_budget_needs_checkpointing_and_every_stage_fits_it_at_each_modes_sizes(mode: str) -> None:
    table = hidden04.choice_table(mode)
    s = lab04.sizes(mode)
    assert (table.batch_size, table.image_size) == (s.batch_size, s.memory_image_size)
    assert table.budget == lab04_measure.activation_budget(mode) == int(lab04.ACTIVATION_BUDGET_SHARE * table.plain)
    assert table.activations[()] == table.plain > table.budget, "checkpointing nothing must not fit"
    assert table.activations[lab04.STAGES] <= table.budget, "checkpointing every stage must fit"
    least, best = table.cheapest()
    assert all(0 < len(subset) < len(lab04.STAGES) for subset in best), best
    assert least < table.cost(lab04.STAGES) / (1 + hidden04.CHOICE_COST_RTOL), "every stage must cost more than needed"
    # Margins either side, so that a student's table at other sizes ranks the choices as the grader does.
    assert max(table.activations[subset] for subset in best) <= 0.97 * table.budget
    cheaper_or_as_cheap = [acts for subset, acts in table.activations.items()
                           if table.cost(subset) <= least and subset not in best]
    assert all(acts >= 1.03 * table.budget for acts in cheaper_or_as_cheap)
    # The judge, called as the grader calls it, at these sizes.
    assert choice_mark(best[0], mode).fraction == 1.0
    assert choice_mark(lab04.STAGES, mode).fraction == hidden04.COSTLIER_FIT_SHARE
    assert choice_mark((), mode).fraction == 0.0


@pytest.mark.parametrize("mode", ["tiny", "grade"])
def test_the_reference_choice_earns_the_decision(mode: str) -> None:
    choice = reference_choice(mode)
    assert 0 < len(choice) < len(lab04.STAGES), choice
    mark = choice_mark(choice, mode)
    assert mark.fraction == 1.0, mark.message
    assert choice_mark(list(reversed(choice)), mode).fraction == 1.0, "the order of the names does not matter"


def test_every_stage_where_fewer_fit_earns_half_and_says_which_fewer() -> None:
    mark = choice_mark(tuple(lab04.STAGES))
    least, best = hidden04.choice_table("tiny").cheapest()
    assert mark.fraction == hidden04.COSTLIER_FIT_SHARE, mark.message
    assert "fits the budget" in mark.message and ", ".join(best[0]) in mark.message, mark.message
    assert "least recomputation" in mark.message, mark.message


def test_checkpointing_nothing_where_the_budget_needs_it_earns_nothing() -> None:
    for choice in ((), ("layer4",), ["layer3", "layer4"]):
        mark = choice_mark(choice)
        assert mark.fraction == 0.0 and "does not fit" in mark.message, (choice, mark.message)


@pytest.mark.parametrize("choice, match", [
    ("layer1", r"the string 'layer1', not a tuple.*\('layer1',\)"),
    (["layer1", "layer9"], r"'layer9' is not a ResNet-18 stage"),
    ({"layer1", "layer2"}, r"of type set, not a tuple"),
    (None, r"CHECKPOINT_CHOICE is None"),
    (("layer1", 2), r"a value of type int is not a ResNet-18 stage"),
    (("layer1", "layer1"), r"names layer1 more than once"),
])
def test_a_malformed_choice_earns_nothing_with_one_readable_line(choice, match: str) -> None:
    mark = choice_mark(choice)
    assert mark.fraction == 0.0 and re.search(match, mark.message) and "\n" not in mark.message, mark.message
    assert lab04.choice_problems(choice), "the notebook's visible check says the same"


def test_a_notebook_without_a_choice_earns_nothing() -> None:
    from perflab.grading.judging import Context, judge_cell
    from perflab.grading.probing import run_probes

    observations = run_probes({"checkpoint_choice": lab04_probes.PROBES["checkpoint_choice"]}, {}, 0)
    mark = judge_cell("checkpoint_choice", hidden04.JUDGES["checkpoint_choice"], Context(LAB, 0, "tiny", observations))
    assert mark.fraction == 0.0 and "CHECKPOINT_CHOICE" in mark.message, mark.message


def test_the_cost_of_a_stage_is_its_forward_flops_the_same_at_any_batch() -> None:
    model = lab04.resnet18(10)
    one, four = (lab04_measure.stage_forward_flops(model, b, 64) for b in (1, 4))
    assert set(one) == set(lab04.STAGES) and all(four[name] == 4 * one[name] > 0 for name in lab04.STAGES)
    assert one["layer1"] > one["layer2"] == one["layer3"] == one["layer4"]  # layer1 keeps its 64 channels at full size
    with pytest.raises(ValueError, match="layer9"):
        lab04_measure.stage_forward_flops(model, 1, 64, stages=("layer9",))


def test_the_decision_and_the_verified_cost_share_part_5s_points() -> None:
    points = {H.nbgrader_meta(c)["grade_id"]: H.nbgrader_meta(c).get("points", 0) for c in H.grade_cells(LAB)}
    assert points["checkpoint_choice"] == 7 and points["checkpoint_cost_verified"] == 6
    assert points["test_predict_cost"] == 2
    assert sum(points.values()) == 100
