"""A student's decision (lab 2's BEST, lab 5's CHOICE, lab 6's FINAL) is graded on what the grading
machine measures, not on a rule: keeping a change that costs time there loses the cell, even where the
calibration file holds a "cost" bar for that change (right for checkpointing, which trades time for
memory on purpose; wrong for a decision, where the right answer on such a machine is to leave it out)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perflab import env
from perflab.grading.judging import Context
from perflab.labs import common, lab02, lab05, lab06, lab06_probes
from perflab.labs.hidden import lab02 as hidden02
from perflab.labs.hidden import lab05 as hidden05
from perflab.labs.hidden import lab06 as hidden06
from perflab.verify import Verdict, load_expectation, verify
from perflab.verify.expectations import EXPECTATIONS_ENV, PARITY_BAR, Expectation
from perflab.workload import TrainConfig

CALIBRATED = Path(__file__).resolve().parents[1] / "autograder" / "expectations" / "cpu-bf16.json"
# ResNet-18 compiled on a CPU at the kit's tiny size: compiling costs time here (cpu-bf16 calibrated
# the reference compile at 0.56x, CI 0.54-0.59, and wrote a "cost" bar of 0.43 for it).
TINY_CPU = TrainConfig(data="tiny", image_size=32, batch_size=8, device="cpu")


def test_a_decision_is_never_held_to_a_cost_bar() -> None:
    cost = Expectation("compile", 0.434, "cost", "cpu-bf16", True, "calibrated on cpu-bf16: reference 0.56x")
    held = common.decision_bar(cost)
    assert held.threshold == PARITY_BAR and held.kind == "parity" and "costs time" in held.reason
    for kept in (Expectation("num_workers", 1.1, "gain", "x", True, ""),
                 Expectation("channels_last", PARITY_BAR, "parity", "x", True, "")):
        assert common.decision_bar(kept) is kept


def test_the_verifiers_bar_for_a_decision_is_raised_but_checkpointings_cost_bar_is_not(monkeypatch) -> None:
    """Through `verify_against_bar` as the judges call it (in a grading kernel, which defers the timing)."""
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setenv(common.REMEASURED_ENV, "1")
    bar = load_expectation("compile", "cpu-bf16", workload=TINY_CPU, directory=CALIBRATED.parent)
    assert bar.kind == "cost" and bar.threshold < PARITY_BAR  # the committed file's bar for compile here
    monkeypatch.setattr("perflab.verify.load_expectation", lambda name, workload=None: bar)
    _, decided = common.verify_against_bar(TINY_CPU, TINY_CPU.replace(compile_mode="default"), "compile",
                                           decision=True)
    _, measured = common.verify_against_bar(TINY_CPU, TINY_CPU.replace(checkpoint_stages=2), "compile")
    assert decided.threshold == PARITY_BAR and measured.threshold == bar.threshold


@pytest.fixture()
def compile_costs_here(tmp_path, monkeypatch) -> Expectation:
    """This machine, with the committed CPU calibration (compile a cost) as its own, grading lab 5 on
    ResNet-18 at the tiny size (as it would on a GPU in grade mode)."""
    doc = json.loads(CALIBRATED.read_text())
    hw = env.machine_info().hardware_class
    (tmp_path / f"{hw}.json").write_text(json.dumps({**doc, "hardware_class": hw}))
    monkeypatch.setenv(EXPECTATIONS_ENV, str(tmp_path))
    monkeypatch.setattr(lab05, "graded_workload", lambda mode=None, device=None: "resnet18")
    monkeypatch.setattr(lab05, "resnet_config", lambda mode=None: TINY_CPU)
    bar = load_expectation(lab05.EXPECTATION_RESNET, workload=TINY_CPU)
    assert bar.kind == "cost", bar
    return bar


def test_compiling_by_rule_where_compiling_costs_time_loses_and_measuring_earns(compile_costs_here) -> None:
    """The rule of thumb (compile: it is faster) on a machine where it is not, against the reference's
    measured decision (None: do not compile), both re-measured by the grader."""
    ctx = Context(lab05.LAB, 0, "tiny")
    by_rule = hidden05.judge_choice({"choice": lab05.REFERENCE_MODE, "claim": 1.3}, ctx)
    assert by_rule.fraction == 0.0 and by_rule.verdict["verdict"] == "fail", by_rule.message
    assert by_rule.verdict["speedup"] < PARITY_BAR, by_rule.verdict
    measured = hidden05.judge_choice({"choice": None, "claim": 1.0, "why": "compile's CI sat below parity here"}, ctx)
    assert measured.fraction == 1.0, measured.message


@pytest.fixture()
def one_core(monkeypatch):
    """A machine of one core (this process and the verifier's children pinned to one): loader workers
    compete with training for it, so adding them costs time (measured here in tiny mode: one worker
    0.89x, CI 0.87-0.92x; two 0.96x, CI 0.93-0.97x)."""
    # The grader's own budget of pairs, as it grades for real, not tiny mode's cap of 16: after the data set
    # tests a minute of this machine is noisy enough that 16 pairs of the one-core worker straddled the
    # bar (0.88x, CI 0.84-0.96x) in two runs of two.
    for lab in (lab02, lab06):
        monkeypatch.setattr(lab, "sizes", lambda mode=None, _sizes=lab.sizes: dataclasses.replace(
            _sizes(mode), verify_max_pairs=None))
    allowed = os.sched_getaffinity(0)
    # Written data flushed first (the data set tests before these leave JPEGs for the kernel to write
    # back), and the last core, which the kernel's own work lands on less than the first.
    os.sync()
    os.sched_setaffinity(0, {max(allowed)})
    yield
    os.sched_setaffinity(0, allowed)


def _unless_noise(judge: Callable[[], Any]) -> Any:
    """The judge's mark, judged once more where the first re-measurement straddled the bar: on a shared
    machine a noisy minute widens the CI (a clean-clone CI read the one-core worker at 0.88x, CI
    0.85-0.96x, where quiet runs read 0.87-0.92x), and the protocol credits a straddle by design. A
    second straddle, or a pass, fails the test."""
    mark = judge()
    return judge() if (mark.verdict or {}).get("verdict") == "inconclusive" else mark


def test_adding_workers_by_rule_where_they_cost_time_loses_and_measuring_earns(one_core) -> None:
    """Lab 2's rule of thumb (add a loader worker: it overlaps decoding with training) on a machine where
    it is wrong, against the measured decision there (the baseline loader), both re-measured by the
    grader: the rule loses the cell, the measured decision earns it."""
    ctx = Context(lab02.LAB, 0, "tiny")
    base = lab02.baseline_config("tiny")
    why = "my interleaved comparison showed no gain from workers here"

    def judged(best: TrainConfig) -> object:
        return hidden02.judge_best_verified({"type": "TrainConfig", "config": best.to_dict(), "claim": 1.2,
                                             "why": why}, ctx)

    # Below the parity bar, or straddling it (undecided, which the default policy credits) and still
    # measurably slower than leaving the worker out: a fail either way.
    by_rule = _unless_noise(lambda: judged(base.replace(num_workers=1, persistent_workers=True, prefetch_factor=2)))
    assert by_rule.fraction == 0.0 and by_rule.verdict["verdict"] == "fail", by_rule.message
    assert by_rule.verdict["ci"][1] < common.SLOWER_BELOW, by_rule.message
    measured = judged(base)
    assert measured.fraction == 1.0, measured.message


def test_keeping_a_loader_worker_in_lab_6_by_rule_where_it_costs_time_loses_and_measuring_earns(one_core) -> None:
    """Lab 6's FINAL built by the rule "keep every earlier lab's change" (a loader worker), on the machine
    where that change costs time, against the measured FINAL there (nothing kept: the baseline)."""
    ctx = Context(lab06.LAB, 0, "tiny")
    base = lab06.baseline_config("tiny")

    def judged(final: TrainConfig) -> object:
        return hidden06.judge_final_verified(lab06_probes.PROBES["test_final_verified"]({"FINAL": final, "CLAIM": 1.2}, 0),
                                             ctx)

    by_rule = _unless_noise(lambda: judged(base.replace(num_workers=1, persistent_workers=True, prefetch_factor=2)))
    assert by_rule.fraction == 0.0 and by_rule.verdict["verdict"] == "fail", by_rule.message
    assert by_rule.verdict["ci"][1] < common.SLOWER_BELOW, by_rule.message
    measured = judged(base)
    assert measured.fraction == 1.0, measured.message


def test_a_decision_measurably_slower_fails_whatever_its_bar_and_changing_nothing_never_does() -> None:
    times = (1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01)
    slower = Verdict("pass", "clears_bar", "clears the expected 0.90x", 0.9, baseline_times=times,
                     candidate_times=tuple(t * 1.1 for t in times), block_steps=1)
    assert slower.ci[1] < common.SLOWER_BELOW
    failed = common.slower_than_leaving_it_out(slower)
    assert failed.outcome == "fail" and failed.code == "slower_than_without" and "0.91x" in failed.reason
    # A few per cent slower, as a student's process and the grader's disagree by (the reference's lab 6
    # FINAL re-measured 0.96x, CI 0.95-0.99x, after its own screening kept it): not a wrong decision.
    slightly = Verdict("pass", "clears_bar", "clears the expected 0.90x", 0.9, baseline_times=times,
                       candidate_times=tuple(t * 1.04 for t in times), block_steps=1)
    assert slightly.ci[1] < 1.0 and slightly.ci[1] >= common.SLOWER_BELOW
    assert common.slower_than_leaving_it_out(slightly) is slightly
    noisy = (1.0, 1.2, 0.9, 1.1, 0.95, 1.05, 1.0, 0.92)
    straddles = Verdict("inconclusive", "undecided", "", 0.9, baseline_times=times, candidate_times=noisy,
                        block_steps=1)
    assert straddles.ci[0] < 1.0 < straddles.ci[1]
    assert common.slower_than_leaving_it_out(straddles) is straddles
    # Changing nothing (lab 2's BEST = BASELINE; lab 5's "do not compile", eager against eager) is the
    # verifier's no-change verdict, untimed: no CI an A/A could put below 1.0 by chance.
    base = lab02.baseline_config("tiny")
    for same in ((base, base), lab05.sides(None, "tiny")):
        unchanged = verify(*same, expectation=PARITY_BAR)
        assert unchanged.code == "no_change" and unchanged.ci is None, unchanged
        assert common.slower_than_leaving_it_out(unchanged) is unchanged
    assert verify(*lab05.sides("default", "tiny"), expectation=PARITY_BAR,
                  runner=lambda job, **_: (None, "stopped: not timed here", 0.0)).code == "stopped"
