"""The grader says, before it grades, which re-measured cells have no bar calibrated on its machine
(such a cell takes the conservative rule, which a kept baseline passes), and refuses with
--require-calibration."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from perflab.grading import bars, pipeline
from perflab.grading.job import Settings
from perflab.verify import expectations

LABS = ("lab01_measure", "lab02_feed", "lab03_amp", "lab04_memory", "lab05_compile", "lab06_together")
CPU_FILE = expectations.default_dir() / "cpu-bf16.json"


def test_a_class_with_no_file_lists_every_cell_held_to_a_calibrated_bar() -> None:
    lines = bars.uncalibrated(LABS, "grade", "cuda-some-new-card")
    listed = [line.split(":")[0] for line in lines]
    # Lab 1's fix bar is a fixed rule; lab 5's small model (a CPU's) is held to parity by design.
    assert listed == [lab for lab in LABS if bars.graded_bars(lab, "grade")]
    assert {"lab02_feed", "lab03_amp", "lab04_memory", "lab06_together"} <= set(listed) and "lab01_measure" not in listed
    assert all("cuda-some-new-card.json not found" in line and "perflab calibrate" in line for line in lines)
    by_lab = dict(zip(listed, lines, strict=True))
    assert "not below 0.5x" in by_lab["lab04_memory"] and "no regression below 0.9x" in by_lab["lab06_together"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the committed CPU file holds at a CPU's grade workloads")
def test_a_calibrated_class_lists_nothing_and_a_missing_entry_lists_its_lab(tmp_path: Path) -> None:
    assert bars.uncalibrated(LABS, "grade", "cpu-bf16") == []
    doc = json.loads(CPU_FILE.read_text())
    del doc["optimisations"]["lab06_final"]
    (tmp_path / "cpu-bf16.json").write_text(json.dumps(doc))
    lines = bars.uncalibrated(LABS, "grade", "cpu-bf16", directory=tmp_path)
    assert len(lines) == 1 and lines[0].startswith("lab06_together:") and "'lab06_final'" in lines[0]
    # A bar measured at other sizes holds nothing at these: the kit's tiny sizes are never calibrated.
    assert [line.split(":")[0] for line in bars.uncalibrated(["lab02_feed"], "tiny", "cpu-bf16")] == ["lab02_feed"]


def test_grading_warns_of_each_uncalibrated_cell_and_refuses_when_asked(monkeypatch, caplog) -> None:
    line = "lab06_together: no calibrated bar for its re-measured cell here (...)"
    asked: list[str] = []

    def fake(labs, mode, machine=None, directory=None):
        asked.append(mode)
        return [line]

    monkeypatch.setattr(bars, "uncalibrated", fake)
    graded_at = Settings(env={"PERFLAB_MODE": "grade"})
    with caplog.at_level(logging.WARNING, logger=pipeline.log.name):
        assert pipeline.check_calibration(["lab06_together"], graded_at) == [line]
    assert line in caplog.text
    with pytest.raises(pipeline.Uncalibrated, match="--require-calibration: lab06_together"):
        pipeline.check_calibration(["lab06_together"], Settings(env={"PERFLAB_MODE": "grade"}, require_calibration=True))
    assert pipeline.check_calibration(["lab06_together"], Settings(env={"PERFLAB_MODE": "tiny"})) == []
    assert asked == ["grade", "grade"]
    # The Ray back-end grades on the workers' hardware: the head says it cannot check, and refuses to promise it.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=pipeline.log.name):
        assert pipeline.check_calibration(["lab06_together"], graded_at, "ray") == []
    assert "Ray workers' hardware are not checked" in caplog.text and asked == ["grade", "grade"]
    with pytest.raises(pipeline.Uncalibrated, match="workers' hardware"):
        pipeline.check_calibration(["lab06_together"], Settings(env={"PERFLAB_MODE": "grade"}, require_calibration=True), "ray")
    summary = pipeline.Summary(graded=("lab06_together/ann",), uncalibrated=(line,))
    assert "1 re-measured cell(s) held to the conservative rule" in summary.line()


def test_the_command_refuses_in_one_line(monkeypatch, capsys, tmp_path: Path) -> None:
    from perflab.cli import main

    def refuse(*args, **kwargs):
        raise pipeline.Uncalibrated("--require-calibration: lab06_together: no calibrated bar (...)")

    monkeypatch.setattr(pipeline, "check_isolation", lambda settings: None)
    monkeypatch.setattr(pipeline, "grade", refuse)
    assert main(["grade", "grade", "--course", str(tmp_path), "--require-calibration", "--unisolated"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lab06_together: no calibrated bar" in err
