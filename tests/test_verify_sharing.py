"""A grading run measures two configurations once (`protocol.shared_measurements`): students who decided
the same configuration share one re-measurement, judged for each one's claim; student code, failed
runs and calls outside a grading run are measured every time."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from perflab.verify import Side, machine_load, protocol
from perflab.workload import TrainConfig

BASE = TrainConfig(data="tiny", image_size=32, batch_size=8, threads=1)
BF16 = BASE.replace(amp_dtype="bf16")


@pytest.fixture()
def child(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The verify child, replaced by one that reports a 1.5x candidate over 12 pairs; a crash for
    channels_last, a flagged run for a compiled candidate, 3 pairs for accumulation."""
    jobs: list[dict] = []

    def fake_run_child(job, *, time_limit, memory_limit):
        jobs.append(job)
        config = job["candidate"]["kwargs"].get("config", {})
        if config.get("channels_last"):
            return {"error": {"code": "out_of_memory", "detail": "killed"}}, "", 1.0
        a = [0.100 + 0.001 * (i % 5) for i in range(3 if config.get("accumulation_steps") == 2 else 12)]
        result = {"baseline_times": a, "candidate_times": [t / 1.5 for t in a], "block_steps": 1,
                  "timed_seconds": 0.5}
        if config.get("compile_mode"):
            result["problems"] = [{"code": "loss_mismatch", "detail": "the losses differ"}]
        return result, "", 2.0

    monkeypatch.setattr(protocol, "run_child", fake_run_child)
    monkeypatch.setattr(machine_load, "sample", lambda root=None: None)  # the host's load never measures twice here
    return jobs


def test_the_same_two_configurations_are_measured_once_per_grading_run(child) -> None:
    with protocol.shared_measurements():
        first = protocol.verify(BASE, BF16, expectation=1.2, claim=1.5)
        second = protocol.verify(BASE, BF16, expectation=1.2, claim=9.0)
        other_bar = protocol.verify(BASE, BF16, expectation=1.3)
    assert len(child) == 2  # the same job once; another bar is another job (the child stops by it)
    assert first.outcome == "pass" and first.speedup == pytest.approx(1.5)
    assert second.code == "claim_contradicted"  # one measurement, judged for each student's own claim
    assert second.baseline_times == first.baseline_times
    assert other_bar.outcome == "pass"
    protocol.verify(BASE, BF16, expectation=1.2)
    assert len(child) == 3  # outside a grading run, every call measures


def test_student_code_and_failed_runs_are_never_shared(child, tmp_path: Path) -> None:
    module = tmp_path / "fixed.py"
    module.write_text("def make_step(seed):\n    return lambda: 0.0\n", encoding="utf-8")
    toy = Side.reference("perflab.verify.candidates:toy_step", repeats=10)
    with protocol.shared_measurements():
        for _ in range(2):
            protocol.verify(toy, Side.module(module), expectation=1.1)
        crashed = [protocol.verify(BASE, BASE.replace(channels_last=True), expectation=1.1) for _ in range(2)]
        flagged = [protocol.verify(BASE, BASE.replace(compile_mode="default"), expectation=1.1) for _ in range(2)]
        short = [protocol.verify(BASE, BASE.replace(accumulation_steps=2), expectation=1.1) for _ in range(2)]
    assert len(child) == 8  # each of them measured again for the next student
    assert all(v.outcome == "error" for v in crashed)
    assert all(v.code == "loss_mismatch" for v in flagged)
    assert all(v.code == "too_few_pairs" for v in short)


def test_two_jobs_asking_at_once_share_the_first_ones_measurement(child) -> None:
    verdicts = []
    with protocol.shared_measurements():
        threads = [threading.Thread(target=lambda: verdicts.append(protocol.verify(BASE, BF16, expectation=1.2)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert len(child) == 1 and len(verdicts) == 4
    assert len({v.speedup for v in verdicts}) == 1
