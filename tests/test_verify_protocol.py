"""The real protocol: a fresh child interpreter per verification, on perflab's toy reference and on tiny
TrainConfigs; honest candidates with known ratios, cheats, and crashes (bench/candidates holds them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perflab.verify import Budget, Side, guard, verify
from perflab.workload import TrainConfig

CANDIDATES = Path(__file__).resolve().parents[1] / "bench" / "candidates"
TOY = Side.reference("perflab.verify.candidates:toy_step", repeats=10)
# Short budgets: these tests check what is caught, not how finely the speedup is resolved.
QUICK = Budget(min_pairs=6, max_pairs=24, max_timed_seconds=6.0)

pytestmark = pytest.mark.slow


def _verify(name: str, factory: str = "make_step", *, bar: float = 1.1, **kwargs):
    kwargs.setdefault("budget", QUICK)
    # Fresh hashes: the tree may change between test collection and this call during development.
    return verify(TOY, Side.module(CANDIDATES / f"{name}.py", factory), expectation=bar, threads=1,
                  hashes=guard.file_hashes(), **kwargs)


def test_known_2x_passes_and_known_1x_does_not():
    fast = _verify("honest", "make_step_5", bar=1.2, claim=2.0, budget=Budget(max_timed_seconds=15.0))
    assert fast.outcome == "pass", fast.describe()
    assert 1.4 < fast.speedup < 2.6 and not fast.claim_far_off
    assert fast.details["gate"]["candidate_losses"] == fast.details["gate"]["baseline_losses"]
    assert fast.timed_seconds < fast.elapsed_seconds
    same = _verify("honest", "make_step_10", bar=1.1, claim=3.0)
    assert same.outcome in ("fail", "inconclusive"), same.describe()
    assert same.claim_far_off and "claimed 3.00x" in same.reason


@pytest.mark.parametrize(("name", "code"), [
    ("patch_clock", "clock_tampered"),
    ("patch_reference", "runtime_patched"),
    ("shrink_batch", "loss_mismatch"),
    ("skip_steps", "samples_differ"),
    ("cache", "cached_outputs"),
    ("nan_loss", "loss_not_finite"),
    ("defer_thread", "deferred_work"),
    # Honest through the gate, then less work in the timed steps: held to the loss trajectory there.
    ("forward_after_gate", "loss_mismatch"),
    ("skip_every_other_update", "loss_mismatch"),
    ("frozen_optimizer", "loss_mismatch"),
    ("shrink_after_warmup", "loss_mismatch"),
])
def test_cheats_are_caught_with_a_named_reason(name, code):
    v = _verify(name)
    assert (v.outcome, v.code) == ("fail", code), v.describe()
    if name in ("forward_after_gate", "skip_every_other_update", "frozen_optimizer", "shrink_after_warmup"):
        assert "(timed steps)" in v.reason and "every timed step" in v.reason, v.reason


def test_a_student_baseline_is_never_timed():
    with pytest.raises(ValueError, match="baseline"):
        verify(Side.module(CANDIDATES / "sleepy_baseline.py", "make_baseline_step"),
               Side.module(CANDIDATES / "sleepy_baseline.py"), expectation=1.1)
    v = _verify("sleepy_baseline")  # against perflab's reference it is the same work: no speedup
    assert v.outcome in ("fail", "inconclusive"), v.describe()


@pytest.mark.parametrize(("name", "code", "limits"), [
    ("raises", "raised", {}),
    ("hangs", "timeout", {"time_limit": 6.0}),
    ("kills_itself", "killed", {}),
    ("exhausts_memory", None, {"memory_limit": 4 * 2**30 + 2**29}),
])
def test_failures_become_error_verdicts(name, code, limits):
    v = _verify(name, **limits)
    assert v.outcome == "error", v.describe()
    if code:
        assert v.code == code, v.describe()
    else:  # out of memory surfaces as an allocation error or as the process being killed
        assert v.code in ("out_of_memory", "killed"), v.describe()
    assert v.elapsed_seconds < limits.get("time_limit", 60.0) + 10


def test_bad_candidate_module_is_an_error(tmp_path):
    module = tmp_path / "empty.py"
    module.write_text("x = 1\n")
    v = verify(TOY, Side.module(module), expectation=1.1, hashes=guard.file_hashes())
    assert (v.outcome, v.code) == ("error", "bad_candidate") and "make_step" in v.reason


def test_train_configs(tiny_data):
    base = TrainConfig(data="tiny", batch_size=8, image_size=32, threads=1)
    budget = Budget(min_pairs=6, max_pairs=12, max_timed_seconds=8.0)
    # Only the knob that feeds the step differently: the gate runs, and the samples must agree.
    smaller = verify(base, base.replace(batch_size=4), expectation=1.1, budget=budget, hashes=guard.file_hashes())
    assert (smaller.outcome, smaller.code) == ("fail", "samples_differ"), smaller.describe()


@pytest.mark.parametrize(("bar", "outcome"), [(1.1, "fail"), (0.9, "pass")])
def test_an_unchanged_configuration_is_no_change_and_never_timed(bar, outcome):
    """Changing nothing is "no change", never "faster": it fails a bar that asks for a gain, and passes
    one that asks only for no regression (the hardware has no gain to give, so keeping the baseline is
    the right decision). Nothing is run to find that out."""
    def runner(*args, **kwargs):
        raise AssertionError("an unchanged configuration must not be timed")

    base = TrainConfig(data="tiny", batch_size=8, image_size=32)
    v = verify(base, TrainConfig(data="tiny", batch_size=8, image_size=32), expectation=bar, claim=1.0,
               runner=runner)
    assert (v.outcome, v.code) == (outcome, "no_change") and v.reason.startswith("no change")
    assert "faster" not in v.describe() and v.speedup is None
    typed = verify(base, base, expectation=bar, claim=9.0, runner=runner)  # the demo cheater's typed-in claim
    assert (typed.outcome, typed.code) == ("fail", "claim_contradicted") and typed.claim_far_off, typed.reason
    noisy = verify(base, base, expectation=bar, claim=1.4, runner=runner)  # an honest, noisy A/A figure
    assert noisy.outcome == outcome and not noisy.claim_far_off


def test_a_knob_that_does_nothing_on_this_device_is_no_change():
    """pin_memory pins host memory for copies to a CUDA device: on a CPU the "near-lazy" candidate that sets
    it does the baseline's work, and is judged as no change rather than timed against a gain bar (where
    noise on a busy machine could carry it). On CUDA it is a real change, and timed."""
    def runner(*args, **kwargs):
        raise AssertionError("a candidate doing the baseline's work must not be timed")

    base = TrainConfig(data="tiny", batch_size=8, image_size=32, device="cpu")
    near_lazy = verify(base, base.replace(pin_memory=True), expectation=1.12, runner=runner)
    assert (near_lazy.outcome, near_lazy.code) == ("fail", "no_change"), near_lazy.reason
    assert verify(base, base.replace(pin_memory=True), expectation=0.9, runner=runner).outcome == "pass"
    assert base.replace(pin_memory=True).effective() == base
    with pytest.raises(AssertionError, match="must not be timed"):  # any other knob is timed
        verify(base, base.replace(channels_last=True), expectation=1.12, runner=runner)


def test_the_child_times_with_the_verifiers_thread_count_unless_told_otherwise():
    """The child runs VERIFY_THREADS torch threads (what the bars are calibrated at), so another process
    holding a core cannot stall its steps; a caller may still name a count."""
    from perflab.verify.protocol import VERIFY_THREADS

    jobs = []

    def runner(job, **limits):
        jobs.append(job)
        return None, "stopped: the test only reads the job", 0.0

    base = TrainConfig(data="tiny", batch_size=8, image_size=32, device="cpu")
    verify(base, base.replace(channels_last=True), expectation=1.1, runner=runner)
    verify(base, base.replace(channels_last=True), expectation=1.1, threads=3, runner=runner)
    assert VERIFY_THREADS == 1 and [job["threads"] for job in jobs] == [1, 3]
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="threads: must be a whole number"):
            verify(base, base.replace(channels_last=True), expectation=1.1, threads=bad, runner=runner)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_honest_precision_and_layout_changes_pass_the_gate_at_grade_sizes(tiny_data, seed):
    """At the sizes the autograder runs (grade mode), bf16 autocast with channels_last, the change
    that moves the losses most, passes the correctness gate. (Its losses drift from fp32's after the
    first update, 42% by step 3 with seed 0: a configuration is compared on its first step only.)"""
    from perflab import env

    s = env.mode_sizes("grade")
    base = TrainConfig(data=s.data, batch_size=s.batch_size, image_size=s.image_size)
    budget = Budget(min_pairs=2, max_pairs=2, max_timed_seconds=2.0, block_steps=1)
    v = verify(base, base.replace(amp_dtype="bf16", channels_last=True), expectation=1.1, budget=budget,
               seed=seed, hashes=guard.file_hashes())
    assert v.outcome != "error" and v.code != "loss_mismatch", v.describe()
    gate = v.details["gate"]
    assert len(gate["candidate_losses"]) == len(gate["baseline_losses"]) >= 3
    first = abs(gate["candidate_losses"][0] - gate["baseline_losses"][0])
    assert first <= gate["atol"] + gate["rtol"] * abs(gate["baseline_losses"][0]), "the first step is still compared"


def test_a_placed_thread_runs_its_children_on_its_own_cores_and_gpu(monkeypatch):
    """A local pool's job re-measures on the cores or GPU it was given (`protocol.placed`), not on the
    grader's first GPU beside another job's notebook; outside `placed`, the child gets the process's own."""
    import os
    import subprocess
    import sys

    from perflab.verify import protocol

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this OS")
    real = subprocess.Popen
    probe = ("import os, sys; sys.stderr.write(f\"gpu={os.environ.get('CUDA_VISIBLE_DEVICES')} "
             "cores={sorted(os.sched_getaffinity(0))}\")")
    monkeypatch.setattr(protocol.subprocess, "Popen", lambda args, **kw: real([sys.executable, "-c", probe], **kw))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    mine = sorted(os.sched_getaffinity(0))

    with protocol.placed((mine[-1],), "3"):
        _, why, _ = protocol.run_child({"nonce": "n"}, time_limit=60, memory_limit=None)
    assert why.endswith(f"gpu=3 cores=[{mine[-1]}]"), why
    _, why, _ = protocol.run_child({"nonce": "n"}, time_limit=60, memory_limit=None)
    assert why.endswith(f"gpu=None cores={mine}"), why
    with protocol.placed((max(mine) + 4096,), "GPU-1f2e"):  # cores the OS no longer allows: run unpinned
        _, why, _ = protocol.run_child({"nonce": "n"}, time_limit=60, memory_limit=None)
    assert why.endswith(f"gpu=GPU-1f2e cores={mine}"), why


def test_a_pool_slot_is_mapped_through_the_graders_own_gpu_mask(monkeypatch):
    """A grader started under CUDA_VISIBLE_DEVICES=2,3 gives its slot 0 GPU 2, not physical GPU 0."""
    from perflab.grading.run import visible_gpu

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert (visible_gpu(0), visible_gpu(1)) == ("0", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert (visible_gpu(0), visible_gpu(1)) == ("2", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-a1,MIG-b2")
    assert visible_gpu(1) == "MIG-b2"
