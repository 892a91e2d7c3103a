"""perflab.timing: benchmark and compare, tested exactly with a fake clock."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pytest
import torch

from perflab import timing
from perflab.labs.common import FakeClock
from perflab.timing import Comparison, Measurement


class LoggedClock(FakeClock):
    """The labs' fake clock, moved only by the fake functions it makes; logs every event in order."""

    def __init__(self) -> None:
        super().__init__(start=0.0)
        self.log: list[str] = []

    def __call__(self) -> float:
        self.log.append("clock")
        return super().__call__()

    def sync(self) -> None:
        self.log.append("sync")

    def fn(self, durations: Iterable[float], name: str = "fn"):
        it = iter(durations)

        def run() -> None:
            self.log.append(name)
            self.advance(next(it))

        return run


def fake_benchmark(durations, **kwargs) -> tuple[Measurement, LoggedClock]:
    clock = LoggedClock()
    m = timing.benchmark(clock.fn(durations), clock=clock, sync=clock.sync, device="cpu", **kwargs)
    return m, clock


def test_exact_statistics_from_a_fake_clock():
    m, _ = fake_benchmark([float(i) for i in range(1, 101)], warmup=0, repeats=100)
    assert m.times == tuple(float(i) for i in range(1, 101))
    assert m.n == 100
    assert m.median == 50.5
    assert m.mean == 50.5
    assert m.min == 1.0 and m.max == 100.0
    assert m.p5 == pytest.approx(5.95)
    assert m.p95 == pytest.approx(95.05)
    assert m.p99 == pytest.approx(99.01)
    assert m.iqr == pytest.approx(75.25 - 25.75)
    assert m.timer == "custom"


def test_warmup_calls_are_run_but_not_counted():
    m, clock = fake_benchmark([1000.0] * 3 + [2.0] * 10, warmup=3, repeats=10)
    assert m.times == (2.0,) * 10
    assert m.warmup == 3
    assert clock.log.count("fn") == 13


def test_sync_ends_every_timed_call_before_the_clock_is_read():
    _, clock = fake_benchmark([1.0] * 5, warmup=2, repeats=3)
    assert clock.log == ["fn", "fn", "sync"] + ["clock", "fn", "sync", "clock"] * 3


def test_adaptive_repeats_run_until_min_run_time():
    m, _ = fake_benchmark([0.25] * 100, warmup=0, min_run_time=2.0)
    assert m.n == 8  # 8 x 0.25 s = 2 s
    slow, _ = fake_benchmark([10.0] * 100, warmup=0, min_run_time=1.0)
    assert slow.n == timing.MIN_ADAPTIVE_REPEATS
    fast, _ = fake_benchmark([1e-9] * (timing.MAX_ADAPTIVE_REPEATS + 1), warmup=0, min_run_time=1.0)
    assert fast.n == timing.MAX_ADAPTIVE_REPEATS


def test_ci_of_the_median_contains_the_true_median():
    # Lognormal call times with median exactly 1 ms; seeded.
    durations = 1e-3 * np.random.default_rng(0).lognormal(0.0, 0.3, size=200)
    m, _ = fake_benchmark(durations.tolist(), warmup=0, repeats=200)
    ci = m.ci()
    assert ci.contains(1e-3)
    assert ci.low < m.median < ci.high
    assert m.ci(seed=0) == ci


def test_threads_are_set_for_the_run_and_restored():
    before = torch.get_num_threads()
    seen = []

    def fn() -> None:
        seen.append(torch.get_num_threads())

    m = timing.benchmark(fn, warmup=1, repeats=3, threads=1, device="cpu")
    assert seen == [1] * 4 and m.threads == 1
    assert torch.get_num_threads() == before

    def broken() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        timing.benchmark(broken, threads=1, device="cpu")
    assert torch.get_num_threads() == before
    assert timing.benchmark(fn, repeats=1, device="cpu").threads == before


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="^warmup:"):
        timing.benchmark(lambda: None, warmup=-1, device="cpu")
    with pytest.raises(ValueError, match="^repeats:"):
        timing.benchmark(lambda: None, repeats=0, device="cpu")
    with pytest.raises(ValueError, match="^fn:"):
        timing.benchmark(3, device="cpu")
    with pytest.raises(ValueError, match="^threads:"):
        timing.benchmark(lambda: None, threads=0, device="cpu")
    with pytest.raises(ValueError, match="^device:"):
        timing.benchmark(lambda: None, device="tpu")
    with pytest.raises(ValueError, match="^blocks:"):
        timing.compare(lambda: None, lambda: None, blocks=1, device="cpu")
    with pytest.raises(ValueError, match="^times:"):
        Measurement(times=())


def test_warnings_in_words():
    steady = Measurement(times=(1.0,) * 20)
    assert steady.warnings == ()
    noisy = Measurement(times=(1.0, 1.0, 1.15, 1.3) * 5)
    assert any("above 10%" in w for w in noisy.warnings)
    wild = Measurement(times=(1.0, 2.0) * 10)
    assert any("above 25%" in w for w in wild.warnings)
    few = Measurement(times=(1.0, 1.0, 1.0))
    assert any("only 3 timed calls" in w for w in few.warnings)


def test_str_reads_like_a_notebook_entry():
    m = Measurement(times=(1.2e-3, 1.25e-3, 1.3e-3) * 10, label="matmul 256", threads=2, warmup=3)
    text = str(m)
    assert text.splitlines()[0] == "matmul 256 (cpu, 2 threads)"
    assert "median 1.25 ms" in text
    assert "IQR" in text and "p99" in text
    assert "30 timed calls after 3 warm-up" in text
    assert "WARNING" not in text
    assert "µs" in str(Measurement(times=(3e-6,) * 3)) and "WARNING" in str(Measurement(times=(3e-6,) * 3))
    assert m.as_stat()["median"] == m.median and m.as_stat()["unit"] == "s"


def test_round_trip_and_merge():
    m = Measurement(times=(1.0, 2.0, 3.0), label="x", threads=2, warmup=3, hardware_class="cpu")
    assert Measurement.from_dict(m.to_dict()) == m
    other = Measurement(times=(4.0, 5.0), label="x", threads=2, warmup=1, hardware_class="cpu")
    merged = m.merge(other)
    assert merged.times == (1.0, 2.0, 3.0, 4.0, 5.0)
    assert merged.median == 3.0 and merged.warmup == 1
    with pytest.raises(ValueError, match="^threads:"):
        m.merge(Measurement(times=(1.0,), label="x", threads=4))


def test_real_cpu_call_is_timed():
    x = torch.randn(64, 64)
    m = timing.benchmark(lambda: x @ x, warmup=2, repeats=20, device="cpu", label="matmul 64")
    assert m.n == 20 and m.timer == "perf_counter" and m.device == "cpu"
    assert 0 < m.median < 1.0
    assert m.hardware_class.startswith("cpu")


# -- compare -----------------------------------------------------------------------------------


def fake_compare(a_durations, b_durations, **kwargs) -> tuple[Comparison, LoggedClock]:
    clock = LoggedClock()
    c = timing.compare(
        clock.fn(a_durations, "A"), clock.fn(b_durations, "B"),
        clock=clock, sync=clock.sync, device="cpu", **kwargs,
    )
    return c, clock


def test_compare_runs_blocks_in_abba_order():
    c, clock = fake_compare([1.0] * 100, [1.0] * 100, blocks=4, block_size=2, warmup=1)
    calls = [e for e in clock.log if e in ("A", "B")]
    assert calls == ["A", "B"] + ["A", "A", "B", "B", "B", "B", "A", "A"] * 2
    assert clock.log.count("sync") == 1 + 8  # after warm-up, then after every block
    assert c.a_times == (2.0,) * 4 and c.block_size == 2


def test_compare_recovers_a_known_ratio_under_interference():
    # A costs 3, B costs 2: true speedup 1.5. Interference only adds time (exponential, seeded).
    rng = np.random.default_rng(4)
    blocks = 30
    a = (3.0 + rng.exponential(0.6, size=blocks)).tolist()
    b = (2.0 + rng.exponential(0.4, size=blocks)).tolist()
    c, _ = fake_compare(a, b, blocks=blocks, block_size=1, warmup=0)
    ci = c.ci()
    assert ci.contains(1.5)
    assert 1.3 < c.speedup < 1.7
    assert c.verdict() == timing.B_FASTER
    assert "B is faster than A" in str(c)
    row = c.as_speedup("amp")
    assert row["name"] == "amp" and row["verdict"] == "B faster" and row["ci"] == [ci.low, ci.high]


def test_compare_exact_ratio_and_verdicts():
    c, _ = fake_compare([3.0] * 10, [2.0] * 10, blocks=5, block_size=2, warmup=0)
    assert c.speedup == 1.5 and c.a_per_call == 3.0 and c.b_per_call == 2.0
    same, _ = fake_compare([2.0] * 10, [2.0] * 10, blocks=5, block_size=2, warmup=0)
    assert same.speedup == 1.0 and same.verdict() == timing.NO_DIFFERENCE
    slower, _ = fake_compare([2.0] * 10, [3.0] * 10, blocks=5, block_size=2, warmup=0)
    assert slower.verdict() == timing.B_SLOWER


def test_compare_sizes_blocks_from_the_warmup():
    c, _ = fake_compare([0.001] * 10_000, [0.002] * 10_000, blocks=2, warmup=1)
    assert c.block_size == int(timing.TARGET_BLOCK_SECONDS // 0.002)


def test_comparison_round_trips():
    c = Comparison(a_times=(3.0, 3.1, 3.2), b_times=(2.0, 2.1, 2.0), block_size=4, labels=("fp32", "bf16"))
    assert Comparison.from_dict(c.to_dict()) == c
    assert "bf16" in str(c) and c.blocks == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_calls_are_timed_with_events():
    x = torch.randn(1024, 1024, device="cuda")
    m = timing.benchmark(lambda: x @ x, repeats=20, device="cuda")
    assert m.timer == "cuda-event" and m.device.startswith("cuda")
    assert m.hardware_class.startswith("cuda-")
    assert 0 < m.median < 0.1
    c = timing.compare(lambda: x @ x, lambda: None, blocks=4, device="cuda")
    assert c.timer == "cuda-event" and c.verdict() == timing.B_FASTER


def test_compare_runs_each_functions_lead_in_untimed_before_each_of_its_blocks() -> None:
    """A step fed by loader workers is timed after the queue its workers filled is drained."""
    calls: list[str] = []
    clock = FakeClock()

    def a() -> None:
        calls.append("a")
        clock.advance(0.01)

    def b() -> None:
        calls.append("b")
        clock.advance(0.01)

    c = timing.compare(a, b, blocks=2, block_size=1, warmup=0, lead_in=(0, 3), clock=clock)
    # A's block, then B's lead-in of 3 and its block; then B first (its lead-in again), then A.
    assert calls == ["a", "b", "b", "b", "b", "b", "b", "b", "b", "a"]
    assert all(t == pytest.approx(0.01) for t in (*c.a_times, *c.b_times))  # lead-in calls are not timed
    with pytest.raises(ValueError, match="lead_in"):
        timing.compare(a, b, blocks=2, lead_in=-1, clock=clock)
