"""perflab.verify statistics, sequential decision, verdicts and expectations, on synthetic block times."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from perflab.verify import Budget, Verdict, decide, expectations, judge, load_expectation
from perflab.verify.protocol import CLAIM_TOLERANCE, VERIFY_THREADS


class NoisyBlocks:
    """Block times a shared machine would give: a base cost plus interference that only ever adds time."""

    def __init__(self, seed: int, base_a: float, base_b: float, noise: float = 0.02, spike_p: float = 0.2,
                 spike: float = 0.5) -> None:
        self.rng = np.random.default_rng(seed)
        self.base = (base_a, base_b)
        self.noise, self.spike_p, self.spike = noise, spike_p, spike

    def block(self, side: int) -> float:
        t = self.base[side] * (1 + self.rng.exponential(self.noise))
        if self.rng.random() < self.spike_p:
            t += self.base[side] * self.rng.uniform(0, self.spike)
        return float(t)

    def pairs(self, n: int) -> tuple[list[float], list[float]]:
        a, b = [], []
        for i in range(n):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            got = {side: self.block(side) for side in order}
            a.append(got[0])
            b.append(got[1])
        return a, b


def test_speedup_is_the_ratio_of_20th_percentiles():
    a = [10.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    b = [0.5, 1.0, 1.5, 2.0, 2.5, 30.0]
    assert decide.speedup(a, b) == pytest.approx(np.quantile(a, 0.2) / np.quantile(b, 0.2))


def test_bootstrap_ci_is_deterministic_and_brackets_the_estimate():
    a, b = NoisyBlocks(1, 1.0, 0.8).pairs(20)
    ci1 = decide.bootstrap_ratio_ci(a, b, seed=3)
    assert ci1 == decide.bootstrap_ratio_ci(a, b, seed=3)
    assert ci1[0] <= decide.speedup(a, b) <= ci1[1]
    with pytest.raises(ValueError, match="equal-length"):
        decide.bootstrap_ratio_ci(a, b[:-1])


def test_ci_covers_the_true_ratio_at_about_the_nominal_rate():
    # With the noise added to both sides alike, the 20th percentiles' ratio centres on the true ratio.
    true = 1.25
    covered = 0
    trials = 120
    for seed in range(trials):
        a, b = NoisyBlocks(seed, 1.0, 1.0 / true, spike_p=0.3).pairs(16)
        lo, hi = decide.bootstrap_ratio_ci(a, b, seed=seed)
        covered += lo <= true <= hi
    assert covered / trials >= 0.85, covered


@pytest.mark.parametrize(("true", "bar", "expected"), [(2.0, 1.5, "pass"), (1.0, 1.5, "fail"), (1.25, 1.25, "undecided")])
def test_decide(true, bar, expected):
    a, b = NoisyBlocks(7, 1.0, 1.0 / true, noise=0.01, spike_p=0.1).pairs(24)
    d = decide.decide(a, b, bar)
    assert d.outcome == expected
    assert d.pairs == 24
    assert d.ci[0] <= d.speedup <= d.ci[1]


def test_sequential_stops_at_the_first_decisive_look():
    budget = Budget(min_pairs=8, max_pairs=64, look_every=2)
    a, b = NoisyBlocks(3, 1.0, 0.5, noise=0.01, spike_p=0.1).pairs(64)
    d = decide.sequential(a, b, 1.2, budget)
    assert d.outcome == "pass" and d.pairs == 8  # a clear 2x is decided at the first look


def test_sequential_runs_out_of_pairs_undecided():
    budget = Budget(min_pairs=8, max_pairs=20, look_every=4, max_timed_seconds=1000.0)
    a, b = NoisyBlocks(5, 1.0, 1.0, noise=0.05, spike_p=0.3).pairs(40)
    d = decide.sequential(a, b, 1.0, budget)  # a true 1.0x at a 1.0 bar can never be decided
    assert d.outcome == "undecided" and d.pairs == 20


def test_sequential_runs_out_of_time():
    budget = Budget(min_pairs=4, max_pairs=64, look_every=100, max_timed_seconds=10.0)
    a, b = NoisyBlocks(5, 1.0, 1.0).pairs(64)
    d = decide.sequential(a, b, 1.0, budget)
    assert d.pairs < 10  # each pair costs ~2 s of the 10 s budget


def test_budget_rejects_nonsense():
    with pytest.raises(ValueError, match="max_pairs"):
        Budget(min_pairs=10, max_pairs=5)
    with pytest.raises(ValueError, match="min_pairs"):
        Budget(min_pairs=1)
    assert Budget.from_dict(Budget().to_dict()) == Budget()


def _result(a, b, **extra):
    d = decide.decide(a, b, extra.pop("expectation", 1.1))
    out = {"baseline_times": a, "candidate_times": b, "timed_seconds": sum(a) + sum(b), "block_steps": 4,
           "problems": [], "decision": {"outcome": d.outcome, "speedup": d.speedup, "ci": list(d.ci)}}
    out.update(extra)
    return out


def _judge(result, expectation=1.1, claim=None, elapsed=None):
    elapsed = elapsed if elapsed is not None else result.get("timed_seconds", 0) + 5
    return judge(result, budget=Budget(), expectation=expectation, claim=claim, seed=0, elapsed_seconds=elapsed)


def test_judge_outcomes_and_claim_check():
    a, b = NoisyBlocks(1, 1.0, 0.5, noise=0.01, spike_p=0.1).pairs(12)
    v = _judge(_result(a, b), claim=1.9)
    assert (v.outcome, v.code, v.claim_far_off) == ("pass", "clears_bar", False)
    assert v.speedup == pytest.approx(decide.speedup(a, b))
    far = _judge(_result(a, b), claim=2.0 * (1 + 2 * CLAIM_TOLERANCE) * 1.2)
    assert far.passed and far.claim_far_off and "claimed" in far.reason
    # a typed-in figure far above anything measured fails the candidate, whatever it re-measures at
    typed = _judge(_result(a, b), claim=9.0 * 2.0)
    assert (typed.outcome, typed.code, typed.claim_far_off) == ("fail", "claim_contradicted", True)
    assert "claimed 18.00x" in typed.reason and "own measurement" in typed.reason
    low = _judge(_result(a, b), claim=0.5)  # an under-claim is noted, not failed
    assert low.passed and low.claim_far_off

    assert "faster" in v.reason  # a 2x change: the whole CI is above 1
    a, b = NoisyBlocks(2, 1.0, 1.0, noise=0.01, spike_p=0.1).pairs(12)
    assert _judge(_result(a, b, expectation=1.5), expectation=1.5).outcome == "fail"
    same = _judge(_result(a, b, expectation=0.9), expectation=0.9)  # A/A against a parity bar
    assert same.passed and "no difference detected" in same.reason and "faster" not in same.reason, same.reason
    slower = _judge(_result(*NoisyBlocks(2, 1.0, 2.0, noise=0.01, spike_p=0.1).pairs(12), expectation=0.3),
                    expectation=0.3)
    assert slower.passed and ": slower)" in slower.reason, slower.reason
    a, b = NoisyBlocks(2, 1.0, 1.0 / 1.1, noise=0.05, spike_p=0.3).pairs(12)
    assert _judge(_result(a, b)).outcome == "inconclusive"


def test_judge_catches_problems_tampering_and_errors():
    a, b = NoisyBlocks(1, 1.0, 0.5).pairs(12)
    v = _judge(_result(a, b, problems=[{"code": "cached_outputs", "detail": "same loss"},
                                       {"code": "deferred_work", "detail": "thread"}]))
    assert (v.outcome, v.code) == ("fail", "cached_outputs") and "deferred_work" in v.reason
    # the child's timed blocks cannot outlast the whole run as the parent saw it
    v = _judge(_result(a, b), elapsed=1.0)
    assert (v.outcome, v.code) == ("fail", "clock_tampered")
    forged = _result(a, b)
    forged["decision"]["outcome"] = "pass" if forged["decision"]["outcome"] != "pass" else "fail"
    assert _judge(forged).code == "results_tampered"
    v = _judge({"error": {"code": "raised", "detail": "ValueError: boom"}})
    assert (v.outcome, v.code) == ("error", "raised") and "boom" in v.reason and v.speedup is None


def test_verdict_json_round_trip():
    a, b = NoisyBlocks(1, 1.0, 0.8).pairs(10)
    v = _judge(_result(a, b, gate={"steps": 4}), claim=1.2)
    back = Verdict.from_json(v.to_json())
    assert back == v
    assert back.ci == v.ci
    row = v.to_row("channels_last")
    assert row["verdict"] == v.outcome and len(row["ci"]) == 2
    json.dumps(row)
    with pytest.raises(ValueError, match="outcome"):
        Verdict("maybe", "x", "y", expectation=1.0)


@pytest.mark.parametrize(("low", "high", "kind", "bar"), [
    (1.5, 1.9, "gain", 0.8 * 1.5), (1.2, 1.4, "gain", expectations.GAIN_BAR_FLOOR),
    (1.06, 1.2, "parity", expectations.PARITY_BAR),  # too small a gain to grade apart from noise
    (0.97, 1.04, "parity", expectations.PARITY_BAR), (0.7, 0.8, "cost", 0.8 * 0.7),
    (0.5, 1.6, "parity", 0.8 * 0.5)])  # a noisy reference: the bar never asks more than it shows
def test_threshold_rule(low, high, kind, bar):
    got_kind, got_bar, rule = expectations.threshold_rule(low, high)
    assert got_kind == kind and got_bar == pytest.approx(bar) and rule


@pytest.mark.parametrize("low", [expectations.GAIN_MIN, 1.2, 1.3, 1.5, 2.0, 3.0])
def test_a_gain_bar_is_above_what_changing_nothing_reaches(low):
    """Where the reference gains, the bar is above 1.0 by the floor, and below the reference's own lower bound."""
    kind, bar, _ = expectations.threshold_rule(low, low + 0.2)
    assert kind == "gain" and 1.0 < expectations.GAIN_BAR_FLOOR <= bar < low


def test_a_calibration_holds_only_at_the_sizes_it_measured(tmp_path):
    from perflab.workload import TrainConfig

    measured = TrainConfig(data="small", image_size=64, batch_size=32)
    runs = [{"speedup": 1.4, "ci": [1.3, 1.5]}]
    doc = {"schema": expectations.SCHEMA, "version": expectations.VERSION, "hardware_class": "cpu-x",
           "verify_threads": VERIFY_THREADS,
           "optimisations": {"amp_bf16": {"baseline": measured.to_dict(), "runs": runs,
                                          **expectations.summarise(runs)}}}
    (tmp_path / "cpu-x.json").write_text(json.dumps(doc))
    same = load_expectation("amp_bf16", "cpu-x", directory=tmp_path, workload=measured.replace(amp_dtype="bf16"))
    assert same.calibrated and same.kind == "gain" and same.threshold > 1.0
    other = load_expectation("amp_bf16", "cpu-x", directory=tmp_path,
                             workload=TrainConfig(data="tiny", image_size=32, batch_size=8))
    assert not other.calibrated and other.threshold == expectations.PARITY_BAR
    assert "calibrated on resnet18 at 64 px, batch 32, small data, this run is resnet18 at 32 px, batch 8, tiny data" in other.reason


def test_a_calibration_timed_at_another_thread_count_does_not_hold(tmp_path):
    runs = [{"speedup": 1.4, "ci": [1.3, 1.5]}]
    for threads, holds in ((VERIFY_THREADS, True), (VERIFY_THREADS + 1, False), (None, False)):
        doc = {"schema": expectations.SCHEMA, "version": expectations.VERSION, "hardware_class": "cpu-x",
               "optimisations": {"amp_bf16": {"runs": runs, **expectations.summarise(runs)}}}
        if threads is not None:  # None: a file written before the count was recorded, at torch's default
            doc["verify_threads"] = threads
        (tmp_path / "cpu-x.json").write_text(json.dumps(doc))
        e = load_expectation("amp_bf16", "cpu-x", directory=tmp_path)
        assert e.calibrated is holds, e.reason
        if not holds:
            assert "calibrated with" in e.reason and "re-run perflab calibrate" in e.reason, e.reason
            assert e.threshold == expectations.PARITY_BAR


def test_load_expectation_calibrated_and_fallbacks(tmp_path):
    runs = [{"speedup": 1.6, "ci": [1.5, 1.7]}, {"speedup": 1.7, "ci": [1.55, 1.8]}]
    doc = {"schema": expectations.SCHEMA, "version": expectations.VERSION, "hardware_class": "cuda-x",
           "verify_threads": VERIFY_THREADS, "optimisations": {"amp_bf16": {"runs": runs, **expectations.summarise(runs)}}}
    (tmp_path / "cuda-x.json").write_text(json.dumps(doc))
    e = load_expectation("amp_bf16", "cuda-x", directory=tmp_path)
    assert e.calibrated and e.kind == "gain" and e.threshold == pytest.approx(0.8 * 1.525)  # median of lows
    e = load_expectation("channels_last", "cuda-x", directory=tmp_path)
    assert not e.calibrated and e.threshold == expectations.PARITY_BAR and "no entry" in e.reason
    e = load_expectation("amp_bf16", "tpu-unknown", directory=tmp_path)
    assert not e.calibrated and "no calibration for hardware class 'tpu-unknown'" in e.reason
    e = load_expectation("checkpoint", "tpu-unknown", directory=tmp_path)
    assert e.kind == "cost" and e.threshold == expectations.COST_FLOOR
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="perflab calibrate"):
        load_expectation("amp_bf16", "bad", directory=tmp_path)


def test_committed_expectations_load():
    # Every committed file parses, and each entry gives a bar between the cost floor and the best reference
    # at the workload its lab grades on that file's device: an entry measured at other sizes (or thread
    # counts) would fall back to the conservative rules exactly where the grade reads it.
    from perflab import env
    from perflab.verify import calibrate

    files = sorted(expectations.default_dir().glob("*.json"))
    assert files, "autograder/expectations holds no calibration (run perflab calibrate)"
    lab_of = {**{change: calibrate.graded_in(change) for change in calibrate.REFERENCE_CHANGES},
              **{m.EXPECTATION: m.LAB for m in calibrate._lab_modules()}}
    for path in files:
        doc = expectations.load_file(path)
        assert doc["hardware_class"] == path.stem
        device = "cuda" if path.stem.startswith("cuda") else path.stem.split("-")[0]
        for name, entry in doc["optimisations"].items():
            if "threshold" in entry:
                sizes = env.mode_sizes("grade", lab=lab_of[name], device=device)
                workload = SimpleNamespace(data=sizes.data, image_size=sizes.image_size, batch_size=sizes.batch_size)
                e = load_expectation(name, doc["hardware_class"], workload=workload)
                assert e.calibrated, f"{path.name}: {name}: {e.reason}"
                assert 0 < e.threshold <= max(entry["reference"], expectations.PARITY_BAR)


def test_too_few_pairs_is_inconclusive_not_a_fail():
    # An identical candidate whose few blocks happen to read slow must not fail on them.
    a, b = NoisyBlocks(3, 1.0, 1.4, noise=0.01, spike_p=0.0).pairs(3)
    v = _judge(_result(a, b))
    assert (v.outcome, v.code) == ("inconclusive", "too_few_pairs")
    assert "3 timed pairs" in v.reason


def test_activation_bytes_from_the_child_are_kept_only_when_well_formed():
    a, b = NoisyBlocks(3, 1.0, 0.5, noise=0.01, spike_p=0.1).pairs(12)
    kept = _judge(_result(a, b, activation_bytes={"baseline": 3_722_436, "candidate": 1_795_268}))
    assert kept.details["activation_bytes"] == {"baseline": 3_722_436, "candidate": 1_795_268}
    for bad in ({"baseline": "3 MB", "candidate": 1}, {"baseline": -1, "candidate": 1}, [1, 2],
                {"baseline": True, "candidate": 1}, {"baseline": 1.5, "candidate": 1}):
        assert "activation_bytes" not in _judge(_result(a, b, activation_bytes=bad)).details, bad
    assert "activation_bytes" not in _judge(_result(a, b)).details
