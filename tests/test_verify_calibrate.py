"""`perflab calibrate`: argument checks and the reference pairs it would run (the real runs are in the
committed autograder/expectations files, checked by tests/test_verify_decide.py)."""

from __future__ import annotations

import pytest

from perflab.cli import main
from perflab.verify import calibrate
from perflab.workload import REFERENCE_CHECKPOINT_STAGES


def test_unknown_config_is_a_one_line_error(capsys):
    assert main(["calibrate", "--config", "turbo", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "unknown optimisation(s) turbo" in err and "amp_bf16" in err and err.count("\n") == 1


def test_bad_repeats_is_refused():
    with pytest.raises(ValueError, match="--repeats"):
        calibrate.calibrate(["channels_last"], repeats=0)


def test_cpu_calibrates_what_cpu_can_run():
    names = calibrate.available(None, "cpu")
    assert "amp_fp16" not in names  # fp16 autocast is not what a CPU lab teaches
    assert {"amp_bf16", "channels_last", "num_workers", "checkpoint", "compile"} <= set(names)
    with pytest.raises(ValueError, match="amp_fp16"):
        calibrate.available(["amp_fp16"], "cpu")
    base = calibrate.baseline_config("grade", "cpu")
    assert base.replace(**calibrate.REFERENCE_CHANGES["checkpoint"]).checkpoint_stages == REFERENCE_CHECKPOINT_STAGES


def test_labs_with_their_own_pair_are_calibrated_too():
    from perflab.labs import lab04, lab06
    from perflab.labs.lab04 import judges as hidden04

    names = calibrate.available(None, "cpu")
    assert {lab04.EXPECTATION, lab06.EXPECTATION} <= set(names)
    assert calibrate.available([lab04.EXPECTATION], "cpu") == [lab04.EXPECTATION]
    base, cand = calibrate.lab_pairs("tiny")[lab04.EXPECTATION]
    assert (base, cand) == hidden04.calibration_pair("tiny")  # the pair lives on the grader's side
    assert cand.checkpoint_stages > 0 and base.checkpoint_stages == 0


def test_lab_pairs_are_built_from_the_bars_just_written(tmp_path, monkeypatch):
    """Lab 6's final configuration keeps only gains calibrated here, lab 3's answer among them: each lab's
    pair is built after every bar before it is written (the generic ones, then the labs' in lab order),
    reading them from where they were written (also with --out). On an H200 a pair built before lab 3's
    bar existed timed the baseline against itself and left lab 6 "unmeasured"."""
    from perflab.labs import lab03, lab06
    from perflab.labs.lab03 import judges as hidden03
    from perflab.labs.lab06 import judges as hidden06
    from perflab.verify import expectations
    from perflab.workload import TrainConfig

    seen = {}

    def fake_measure(name, base, cand, repeats, budget, on_run, **_):
        return {"baseline": base.to_dict(), "candidate": cand.to_dict(), "runs": [],
                **expectations.summarise([{"speedup": 1.3, "ci": [1.2, 1.4]}])}

    def recording(module):
        def pair(mode):
            path = expectations.search_path()[0]  # the folder just written, read first
            seen[module.EXPECTATION] = (path, sorted(expectations.load_file(next(path.glob("*.json")))["optimisations"]))
            base = TrainConfig(data="tiny")
            return base, base.replace(amp_dtype="bf16")
        return pair

    monkeypatch.setattr(calibrate, "_measure", fake_measure)
    for module, side in ((lab03, hidden03), (lab06, hidden06)):
        monkeypatch.setattr(side, "calibration_pair", recording(module))
    monkeypatch.delenv(expectations.EXPECTATIONS_ENV, raising=False)
    path = calibrate.calibrate(["lab06_final", "num_workers", "lab03_amp"], repeats=1, out_dir=tmp_path, device="cpu")
    assert seen == {"lab03_amp": (tmp_path, ["num_workers"]), "lab06_final": (tmp_path, ["lab03_amp", "num_workers"])}
    assert sorted(expectations.load_file(path)["optimisations"]) == ["lab03_amp", "lab06_final", "num_workers"]
    assert expectations.EXPECTATIONS_ENV not in __import__("os").environ
    assert expectations.search_path() == (expectations.default_dir(),)  # the block's folder is read no more


def test_each_optimisation_is_calibrated_at_the_sizes_of_the_lab_that_grades_it(tmp_path, monkeypatch):
    """amp_bf16 at lab 3's grade workload, num_workers at lab 2's; calibrating one keeps the others,
    re-summarised from their raw runs under today's rules."""
    from perflab import env
    from perflab.verify import expectations

    seen = {}

    def fake_measure(name, base, cand, repeats, budget, on_run, **_):
        seen[name] = base
        return {"baseline": base.to_dict(), "candidate": cand.to_dict(), "runs": [{"speedup": 1.4, "ci": [1.3, 1.5]}],
                **expectations.summarise([{"speedup": 1.4, "ci": [1.3, 1.5]}])}

    monkeypatch.setattr(calibrate, "_measure", fake_measure)
    path = calibrate.calibrate(["num_workers"], repeats=1, out_dir=tmp_path, device="cpu")
    doc = expectations.load_file(path)
    doc["optimisations"]["num_workers"]["threshold"] = 0.5  # a bar written under older rules
    path.write_text(__import__("json").dumps(doc))
    calibrate.calibrate(["amp_bf16"], repeats=1, out_dir=tmp_path, device="cpu")
    amp = env.mode_sizes("grade", lab="lab03_amp", device="cpu")
    assert (seen["amp_bf16"].image_size, seen["amp_bf16"].batch_size) == (amp.image_size, amp.batch_size)
    feed = env.mode_sizes("grade", lab="lab02_feed", device="cpu")
    assert (seen["num_workers"].image_size, seen["num_workers"].batch_size) == (feed.image_size, feed.batch_size)
    kept = expectations.load_file(path)["optimisations"]
    assert sorted(kept) == ["amp_bf16", "num_workers"]
    assert kept["num_workers"]["threshold"] == expectations.threshold_rule(1.3, 1.5)[1] > 1.0


def test_calibrating_some_optimisations_drops_bars_timed_at_another_thread_count(tmp_path, monkeypatch):
    """A file timed with another verifier thread count holds no bar here: calibrating one optimisation
    starts a new file rather than keep the others' stale entries beside it."""
    from perflab.verify import expectations
    from perflab.verify.protocol import VERIFY_THREADS

    def fake_measure(name, base, cand, repeats, budget, on_run, **_):
        runs = [{"speedup": 1.4, "ci": [1.3, 1.5]}]
        return {"baseline": base.to_dict(), "candidate": cand.to_dict(), "runs": runs, **expectations.summarise(runs)}

    monkeypatch.setattr(calibrate, "_measure", fake_measure)
    path = calibrate.calibrate(["num_workers"], repeats=1, out_dir=tmp_path, device="cpu")
    doc = expectations.load_file(path)
    assert doc["verify_threads"] == VERIFY_THREADS
    doc["verify_threads"] = VERIFY_THREADS + 1
    path.write_text(__import__("json").dumps(doc))
    calibrate.calibrate(["amp_bf16"], repeats=1, out_dir=tmp_path, device="cpu")
    doc = expectations.load_file(path)
    assert sorted(doc["optimisations"]) == ["amp_bf16"] and doc["verify_threads"] == VERIFY_THREADS


def test_a_reference_answer_that_is_the_baseline_is_not_timed():
    """Lab 3's answer on a CPU without bf16 keeps FP32 (and lab 6's final, where nothing before it gains):
    nothing to time, no run 'fails', and the entry is a parity bar that says why."""
    from perflab.verify import expectations
    from perflab.workload import TrainConfig

    base = TrainConfig(data="tiny")
    entry = calibrate._measure("lab03_amp", base, base.replace(pin_memory=True), 3, None, None)
    assert entry["runs"] == [] and "no change is the right answer here" in entry["rule"]
    # A bar, not a missing one: keeping the baseline is the answer, and a regression still fails.
    assert (entry["kind"], entry["threshold"]) == ("parity", expectations.PARITY_BAR)


def test_runs_of_several_calibrations_are_pooled_each_and_the_lowest_bar_kept():
    """Two hosts of one class can differ (bf16 over fp32 at lab 3's sizes: 1.62x on one 2-core host,
    1.26x on another): the bar is one every calibrated host's reference clears, and one host's noisy run
    still cannot move its own calibration's median."""
    from perflab.verify import expectations

    fast = [{"calibration": "a", "speedup": s, "ci": [s - 0.04, s + 0.04]} for s in (1.70, 1.68, 1.10)]
    slow = [{"calibration": "b", "speedup": s, "ci": [s - 0.04, s + 0.04]} for s in (1.26, 1.25, 1.27)]
    alone = expectations.summarise(fast)
    assert alone["calibrations"] == 1 and alone["reference_low"] == pytest.approx(1.64)
    both = expectations.summarise(fast + slow)
    assert both["calibrations"] == 2 and both["reference_low"] == pytest.approx(1.22)
    assert both["threshold"] == expectations.summarise(slow)["threshold"] < alone["threshold"]
    assert "lowest of 2 calibrations" in both["rule"]
    untagged = [{k: v for k, v in r.items() if k != "calibration"} for r in fast]  # files written before tags
    assert expectations.summarise(untagged + slow)["reference_low"] == pytest.approx(1.22)
    one_run = [{"calibration": "c", "speedup": 1.02, "ci": [0.98, 1.06]}]  # its other runs failed
    assert expectations.summarise(fast + slow + one_run)["reference_low"] == pytest.approx(1.22)
    assert expectations.summarise(one_run)["reference_low"] == pytest.approx(0.98)  # alone, it is all there is


def test_calibrate_add_keeps_the_files_runs_beside_this_hosts(tmp_path, monkeypatch):
    """`perflab calibrate --add` on a second host keeps the first host's runs and lowers the bar to what
    the second host's reference clears; a faster host added later never raises it; without --add a
    calibration replaces the entry."""
    from types import SimpleNamespace

    from perflab.verify import expectations, protocol

    speed = {"x": 1.70}

    def fake_verify(base, cand, *, expectation, budget, seed, hashes):
        x = speed["x"]
        return SimpleNamespace(speedup=x, ci=(x - 0.04, x + 0.04), code="clears_bar", outcome="pass", pairs=16,
                               block_steps=1, elapsed_seconds=1.0, details={}, reason="")

    monkeypatch.setattr(protocol, "verify", fake_verify)
    args = ["calibrate", "--config", "channels_last", "--repeats", "2", "--device", "cpu", "--out", str(tmp_path)]
    path = tmp_path / f"{__import__('perflab.env').env.machine_info('cpu').hardware_class}.json"

    def entry() -> dict:
        return expectations.load_file(path)["optimisations"]["channels_last"]

    assert main(args) == 0
    first = entry()
    assert (first["calibrations"], len(first["runs"])) == (1, 2)
    speed["x"] = 1.26
    assert main([*args, "--add"]) == 0
    second = entry()
    assert (second["calibrations"], len(second["runs"])) == (2, 4)
    assert second["reference_low"] == pytest.approx(1.22) and second["threshold"] < first["threshold"]
    speed["x"] = 1.90
    assert main([*args, "--add"]) == 0
    assert entry()["threshold"] == second["threshold"] and entry()["calibrations"] == 3
    assert main(args) == 0
    assert (entry()["calibrations"], len(entry()["runs"])) == (1, 2) and entry()["reference_low"] == pytest.approx(1.86)


def test_a_pair_calibrated_with_and_without_naming_the_device_is_the_same_pair():
    """One host ran `perflab calibrate`, the next `perflab calibrate --add --device cpu`: the same pair,
    so the first host's runs are kept, not silently dropped."""
    from perflab.workload import TrainConfig

    base = TrainConfig(data="tiny")
    entry = {"baseline": base.to_dict(), "candidate": base.replace(amp_dtype="bf16").to_dict()}
    assert calibrate.same_pair(entry, base.replace(device="cpu"), base.replace(device="cpu", amp_dtype="bf16"))
    assert not calibrate.same_pair(entry, base, base.replace(channels_last=True))
    assert not calibrate.same_pair({"baseline": {"no such field": 1}}, base, base)
