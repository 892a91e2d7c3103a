"""The child's CUDA-event check, on a CPU with a simulated event clock, and on a real GPU where there is one.

On an H100 every timed verification ended `clock_tampered`: the gate's warm-up runs (the first holding
cuDNN's autotuning) left event times that were paired with the timed blocks' wall times. The simulated
device below does what a GPU does there: its first step is slow (autotuning) and its events time the
queued work between two records. The check must compare each timed block with itself only.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest
import torch

from perflab.verify import Budget, Side, child, guard

AUTOTUNE_SECONDS = 0.3  # the first step's one-off cost on the simulated device (cuDNN autotuning: ~1.8 s)


class SimulatedEvent:
    """A stand-in for torch.cuda.Event on a device that runs each queued step at once (the CPU)."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.stamp_ns: int | None = None

    def record(self) -> None:
        self.stamp_ns = time.perf_counter_ns()

    def elapsed_time(self, end: SimulatedEvent) -> float:
        assert self.stamp_ns is not None and end.stamp_ns is not None
        return (end.stamp_ns - self.stamp_ns) / 1e6


def _slow_first_step_module(tmp_path: Path) -> Path:
    """A candidate doing the toy reference's exact work whose first step autotunes (is slow) once."""
    path = tmp_path / "autotuned.py"
    path.write_text(
        "import time\n"
        "from perflab.verify.candidates import toy_step\n\n"
        "def make_step(seed, **kwargs):\n"
        "    step = toy_step(seed, repeats=5, **kwargs)\n"
        "    first = [True]\n\n"
        "    def run():\n"
        "        if first[0]:\n"
        f"            time.sleep({AUTOTUNE_SECONDS})\n"
        "            first[0] = False\n"
        "        return step()\n"
        "    return run\n", encoding="utf-8")
    return path


@pytest.fixture
def simulated_cuda_events(monkeypatch):
    """Bind the child's clocks to the simulated event clock, as `bind_torch` binds CUDA's on a GPU."""
    monkeypatch.setattr(torch.cuda, "Event", SimulatedEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(child, "_cuda_in_use", lambda: True)
    monkeypatch.setattr(child, "CLOCKS", guard.Clocks())
    monkeypatch.setattr(child, "_REST_THREADS", None)
    return SimulatedEvent


def _job(candidate: Side) -> dict:
    baseline = Side.reference("perflab.verify.candidates:toy_step", repeats=10)
    return {"nonce": secrets.token_hex(8), "seed": 0, "threads": 1, "expectation": 1.2,
            "budget": Budget(min_pairs=4, max_pairs=6, max_timed_seconds=3.0).to_dict(),
            "baseline": baseline.to_dict(), "candidate": candidate.to_dict(),
            "hashes": guard.file_hashes(), "activation_bytes": False}


def test_gate_warm_up_events_are_not_paired_with_timed_blocks(simulated_cuda_events, tmp_path):
    """An honest 2x candidate with a slow (autotuning) first step passes: before the fix, the warm-up's
    event time was held against the first timed block's wall time and the run read 'clock_tampered'."""
    result = child.run(_job(Side.module(_slow_first_step_module(tmp_path))))
    assert result["problems"] == [], result["problems"]
    assert result["decision"]["outcome"] == "pass", result["decision"]
    events, walls = result["event_ms"], (result["baseline_times"], result["candidate_times"])
    # One event time per timed block, and each within its own block's wall time.
    assert [len(events["baseline"]), len(events["candidate"])] == [len(w) for w in walls]
    for side, wall in zip(("baseline", "candidate"), walls, strict=True):
        for ms, seconds in zip(events[side], wall, strict=True):
            assert ms / 1e3 <= seconds * child.EVENT_WALL_SLACK + 1e-3
    assert max(events["candidate"]) < AUTOTUNE_SECONDS * 1e3  # the autotuning run is no timed block


def test_an_event_clock_that_runs_fast_is_still_caught(simulated_cuda_events, monkeypatch, tmp_path):
    """The check still does its job: event times inflated above their own block's wall time fail."""

    class InflatedEvent(SimulatedEvent):
        def elapsed_time(self, end: SimulatedEvent) -> float:
            return 3 * super().elapsed_time(end)

    monkeypatch.setattr(torch.cuda, "Event", InflatedEvent)
    honest = tmp_path / "honest.py"
    honest.write_text("from perflab.verify.candidates import toy_step\n\n"
                      "def make_step(seed, **kwargs):\n    return toy_step(seed, repeats=5, **kwargs)\n",
                      encoding="utf-8")
    result = child.run(_job(Side.module(honest)))
    codes = [p["code"] for p in result["problems"]]
    assert codes == ["clock_tampered"] and "exceeds the wall time of its block" in result["problems"][0]["detail"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_passes_over_fp32_on_a_fed_gpu_workload():
    """On a GPU, with the data on the device, bf16 autocast with channels_last clears a gain bar."""
    from perflab import dataset
    from perflab.labs import lab03
    from perflab.verify import verify

    base = lab03.baseline_config("grade")  # the CUDA grade workload: full set, 224 px, batch 128, fed
    assert base.data_on_device and base.device_type == "cuda"
    if not dataset.is_built(base.data):
        dataset.build(base.data, progress=False)
    verdict = verify(base, base.replace(amp_dtype="bf16", channels_last=True), expectation=1.2)
    assert verdict.outcome == "pass", verdict.describe()
