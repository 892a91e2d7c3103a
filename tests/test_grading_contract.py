"""The grading contract of every lab: each autograded cell has a public probe and a grader-only judge,
and nothing a student's kernel can send (forged, malformed, oversized or missing observations)
earns a point or stops the grader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import labs_helpers as H
import pytest

from perflab.grading import harness, judging, pipeline, probing, sandbox, worker
from perflab.grading import result as result_model

LABS = H.lab_names()
# What a hostile kernel might send instead of the probe's raw outputs.
FORGED = [{"problems": []}, True, None, "pass", [], 0, {"verdict": "pass", "speedup": 2.5, "passed": True},
          {"raised": None}, {"value": True}]


def autograded_code_cells(lab: str) -> set[str]:
    return {H.nbgrader_meta(c)["grade_id"] for c in H.grade_cells(lab)
            if c.cell_type == "code" and not H.nbgrader_meta(c).get("solution")}


@pytest.mark.parametrize("lab", LABS)
def test_every_autograded_cell_has_a_probe_and_a_judge(lab: str) -> None:
    probes = harness.probes_for(lab) or {}
    judges = judging.judges_for(lab) or {}
    cells = autograded_code_cells(lab)
    assert set(probes) == cells, f"probes: missing {cells - set(probes)}, extra {set(probes) - cells}"
    assert set(judges) == cells, f"judges: missing {cells - set(judges)}, extra {set(judges) - cells}"


def test_every_kit_lab_is_judged_outside_the_kernel() -> None:
    assert all(judging.judges_for(lab) for lab in LABS)


def test_a_course_lab_without_judges_is_refused_in_one_line(tmp_path: Path) -> None:
    lab = "lab99_course"  # an instructor's own lab with plain nbgrader tests and no judges.py
    (tmp_path / "source" / lab).mkdir(parents=True)
    info = pipeline.LabInfo(lab, f"{lab}.ipynb", ({"grade_id": "test_a", "max_score": 1.0, "hidden": False,
                                                   "manual": False},), {})
    with pytest.raises(pipeline.NoJudges, match="lab99_course: no judge for test_a.*nbgrader autograde"):
        pipeline.lab_judges(info, tmp_path)


@pytest.mark.parametrize("lab", LABS)
def test_forged_observations_earn_nothing(lab: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab.labs import common

    def no_remeasurement(*args, **kwargs):
        raise AssertionError("a forged observation reached a re-measurement")

    monkeypatch.setattr(common, "verify_against_bar", no_remeasurement)
    judges = judging.judges_for(lab) or {}
    for gid, judge in judges.items():
        for forged in FORGED:
            ctx = judging.Context(lab, 7, "tiny", {gid: {"observed": forged}})
            mark = judging.judge_cell(gid, judge, ctx)
            assert mark.fraction == 0.0, f"{lab}/{gid}: {forged!r} earned {mark.fraction:.0%}"
            assert "forged observation reached" not in mark.message, f"{lab}/{gid}: {forged!r}"


@pytest.mark.parametrize("lab", LABS)
def test_a_notebook_that_defines_nothing_gets_a_line_per_cell(lab: str) -> None:
    observations = probing.run_probes(harness.probes_for(lab) or {}, {}, seed=3)
    for gid, judge in (judging.judges_for(lab) or {}).items():
        mark = judging.judge_cell(gid, judge, judging.Context(lab, 3, "tiny", observations))
        assert mark.fraction == 0.0 and mark.message, (gid, mark)


def test_missing_and_failed_probes_score_zero_with_a_reason() -> None:
    judge = judging.judges_for("lab02_feed")["test_pick_workers"]
    missing = judging.judge_cell("test_pick_workers", judge, judging.Context("lab02_feed", 1, "tiny", {}))
    assert missing.fraction == 0 and "stopped before this cell's check ran" in missing.message
    failed = judging.judge_cell("test_pick_workers", judge, judging.Context(
        "lab02_feed", 1, "tiny", {"test_pick_workers": {"probe_error": "ZeroDivisionError: boom"}}))
    assert failed.fraction == 0 and failed.message == "ZeroDivisionError: boom"


def test_observations_made_for_another_seed_fail() -> None:
    from perflab.labs.lab02 import probes as lab02_probes

    def pick(sweep, tolerance=0.05):
        if not sweep or min(sweep) < 0 or not all(v > 0 for v in sweep.values()):
            raise ValueError("sweep: worker counts >= 0, throughputs > 0")
        best = max(sweep.values())
        return min(n for n, v in sweep.items() if v >= (1 - tolerance) * best)

    gid = "test_pick_workers"
    observed = probing.run_probes({gid: lab02_probes.PROBES[gid]}, {"pick_workers": pick}, seed=11)
    judge = judging.judges_for("lab02_feed")[gid]
    assert judging.judge_cell(gid, judge, judging.Context("lab02_feed", 11, "tiny", observed)).fraction == 1.0
    assert judging.judge_cell(gid, judge, judging.Context("lab02_feed", 12, "tiny", observed)).fraction == 0.0


def test_encode_turns_anything_into_bounded_json() -> None:
    import torch

    class Weird:
        pass

    big = torch.arange(probing.MAX_TENSOR_ELEMENTS + 1, dtype=torch.float32)
    data = probing.encode({"nan": float("nan"), "t": torch.ones(2, 2), "big": big, "obj": Weird(),
                           "long": "x" * (probing.MAX_CHARS + 10), 3: (1, 2)})
    text = json.dumps(data, allow_nan=False)
    assert data["nan"] == {"float": "nan"} and data["obj"] == {"type": "Weird"} and data["3"] == [1, 2]
    assert data["t"]["tensor"]["values"] == [1.0] * 4 and "values" not in data["big"]["tensor"]
    assert len(data["long"]) == probing.MAX_CHARS and len(text) < 3 * probing.MAX_CHARS
    assert probing.decode_float({"float": "inf"}) == float("inf") and probing.decode_float(True) is None


# ---------------------------------------------------------------------------------------------
# The harness protocol, from the sandbox to the parent: hostile output is that submission's line


def _write(folder: Path, name: str, data: bytes | str) -> None:
    (folder / name).write_bytes(data.encode() if isinstance(data, str) else data)


def test_read_observations_ignores_malformed_oversized_and_linked_files(tmp_path: Path) -> None:
    good = {"cells": {"test_mean": {"observed": [1]}}, "kernel": {"env": {}}}
    _write(tmp_path, "start.json", json.dumps({"kernel": {"env": {}}}))
    _write(tmp_path, "0.json", json.dumps(good))
    _write(tmp_path, "1.json", b"\xff\xfe not json")
    _write(tmp_path, "2.json", json.dumps({"cells": ["a", "list"]}))
    _write(tmp_path, "3.json", b" " * (worker.OBSERVATIONS_CAP_BYTES + 1))
    os.symlink("/etc/passwd", tmp_path / "4.json")
    _write(tmp_path, "5.json", json.dumps({"cells": {"test_fast_sum": {"observed": 45}, 7: 1}}))
    merged = worker.read_observations(tmp_path, 7)
    assert merged["cells"] == {"test_mean": {"observed": [1]}, "test_fast_sum": {"observed": 45}}
    assert merged["kernel_start"] == {"env": {}} and merged["schema"] == harness.OBSERVATIONS_SCHEMA


def _run(result: bytes, returncode: int = 0, timed_out: bool = False) -> sandbox.SandboxRun:
    return sandbox.SandboxRun(returncode, timed_out, 1.0, result, "", sandbox.Isolation("none"))


INFO = pipeline.LabInfo("lab00_fixture", "lab00_fixture.ipynb",
                        ({"grade_id": "test_mean", "max_score": 2.0, "hidden": True, "manual": False},), {})
JOB = pipeline.Job("alice", "lab00_fixture", Path("x.ipynb"), "0" * 64)


_REPORT = {"schema": result_model.WORKER_SCHEMA, "version": result_model.WORKER_VERSION}


@pytest.mark.parametrize("payload", [
    b"", b"not json", b"[1, 2]", b'{"error": 3}', b"\xff" * 100,
    json.dumps({"notebook": 5, "events": [{"cell": "x"}], "files": [1]}).encode(),
    json.dumps({**_REPORT, "version": 1, "notebook": "{}"}).encode(),
    json.dumps({**_REPORT, "error": ["not", "text"]}).encode(),
    json.dumps({**_REPORT, "notebook": 5, "observations": [1], "events": [{"cell": "x"}, {"cell": True, "event": "e"}],
                "files": {"a.json": 3}}).encode(),
])
def test_hostile_results_become_a_clear_failure_or_nothing_at_all(payload: bytes) -> None:
    result = pipeline.interpret(_run(payload), JOB, INFO)
    if result.error:
        assert isinstance(result.error, str) and result.error
        assert [row.score for row in result.cells] == [0.0]
    else:
        assert result.notebook is None and result.observations is None
        assert result.events == () and result.files == {}


def test_the_worker_report_round_trips_through_the_pipe() -> None:
    report = result_model.WorkerReport(notebook="{}", observations={"cells": {}},
                                       events=(result_model.Event(3, "KeyboardInterrupt", "test_mean"),),
                                       files={"lab00_fixture.json": "{}"})
    assert result_model.WorkerReport.parse(report.to_json()) == report
    got = pipeline.interpret(_run(report.to_json()), JOB, INFO)
    assert got.error is None and got.events == report.events and got.files == report.files


def test_a_submission_result_crosses_to_the_head_whole_or_not_at_all() -> None:
    """What a Ray worker node sends back is checked field by field on the head."""
    from perflab.grading.checks import Finding

    result = result_model.SubmissionResult(
        cells=(result_model.CellRow("test_mean", 2.0, 1.0, error="a check failed",
                                    verdict={"verdict": "pass", "speedup": 1.4}),
               result_model.CellRow("test_fix", 6.0, 0.0, error="fail", flag="the re-measurement found x")),
        findings=(Finding("notebook", "hooks", flag=True),), events=(result_model.Event(1, "x"),),
        files={"lab00_fixture.json": "{}"}, wall_s=3.5, isolation="root", sandbox_notes=("a note",), seed=7,
        hardware_class="cpu-bf16")
    assert result_model.SubmissionResult.from_json(result.to_json()) == result
    doc = json.loads(result.to_json())
    for field, bad in (("cells", [{"grade_id": "test_mean", "max_score": "2", "score": 1.0}]),
                       ("cells", [{"grade_id": "test_mean", "max_score": 2.0, "score": True}]),
                       ("findings", [{"cell": "notebook"}]), ("wall_s", "slow"), ("version", 9),
                       ("sandbox_notes", [1])):
        with pytest.raises(result_model.ResultError):
            result_model.SubmissionResult.from_json(json.dumps({**doc, field: bad}))


def test_a_result_with_no_observations_scores_every_cell_zero(tmp_path: Path) -> None:
    tmpl = tmp_path / "tmpl"
    (tmpl / "source" / "lab02_feed").mkdir(parents=True)
    info = pipeline.LabInfo("lab02_feed", "lab02_feed.ipynb",
                            ({"grade_id": "test_pick_workers", "max_score": 10.0, "hidden": True, "manual": False},),
                            {})
    for observations in (None, [], {"schema": "x", "cells": {}}, {"schema": harness.OBSERVATIONS_SCHEMA, "cells": 3}):
        submission = result_model.SubmissionResult(observations=observations)
        rows = pipeline.score(info, tmpl, submission, {"test_pick_workers"}, 1, "tiny")
        assert rows[0].score == 0.0 and rows[0].error, observations


def test_outputs_over_the_budget_are_dropped_largest_first_with_a_line() -> None:
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    image = "A" * 1_000_000
    cells = [new_code_cell("show()", outputs=[new_output("display_data", data={"image/png": image})])
             for _ in range(8)]
    cells.append(new_code_cell("print(1)", outputs=[new_output("stream", name="stdout", text="kept\n")]))
    nb = new_notebook(cells=cells)
    worker.cap_total_outputs(nb, 3_500_000)
    sizes = [len(json.dumps(o)) for c in nb.cells for o in c.outputs]
    assert sum(sizes) <= 3_500_000
    assert nb.cells[-1].outputs[0]["text"] == "kept\n"
    removed = [o["text"] for c in nb.cells for o in c.outputs if "removed" in o.get("text", "")]
    assert len(removed) == 5 and "image/png output of" in removed[0]


def test_a_cell_that_hit_a_limit_is_reported_by_the_limit_not_its_own_exception() -> None:
    from nbformat.v4 import new_code_cell, new_output

    cell = new_code_cell("while True: os.fork()", outputs=[
        new_output("error", ename="BlockingIOError", evalue="[Errno 11] Resource temporarily unavailable", traceback=[]),
        new_output("error", ename="ProcessLimit", evalue=worker.PROCESS_LIMIT_NOTE, traceback=[])])
    assert worker.first_error(cell) == ("ProcessLimit", worker.PROCESS_LIMIT_NOTE)
    plain = new_code_cell("1/0", outputs=[new_output("error", ename="ZeroDivisionError", evalue="division by zero",
                                                     traceback=[])])
    assert worker.first_error(plain) == ("ZeroDivisionError", "division by zero")


def test_the_students_results_file_gets_the_graders_verdicts_and_stays_valid() -> None:
    """The kernel's verification row says "deferred"; the results file kept for the student's report
    holds the grader's re-measurement instead (lab 4: with the activation memory it measured)."""
    from perflab import results

    doc = results.make("lab04_memory", {
        "speedups": [{"name": "checkpoint every stage", "speedup": 0.8, "ci": [0.7, 0.9], "verdict": "deferred"}],
        "verification": [{"name": "checkpoint_stages", "verdict": "deferred", "reason": "re-measured by the grader"}]},
        machine={"device": "cpu", "hardware_class": "cpu-bf16"})
    verdict = {"name": "checkpoint_stages", "verdict": "pass", "speedup": 0.76, "ci": [0.74, 0.79], "reason": "clears",
               "activation_bytes": {"baseline": 3_722_436, "candidate": 1_795_268}}
    graded = json.loads(pipeline.with_grader_verdicts(json.dumps(doc), [verdict]))
    results.validate(graded)
    (row,) = graded["sections"]["verification"]
    assert row == {"name": "checkpoint_stages", "verdict": "pass", "reason": "clears", "speedup": 0.76,
                   "ci": [0.74, 0.79], "activation_bytes": {"baseline": 3_722_436, "candidate": 1_795_268}}
    assert graded["sections"]["speedups"][0]["verdict"] == "pass"
    assert pipeline.with_grader_verdicts("not json", [verdict]) == "not json"


def test_the_students_report_shows_the_graders_figure_beside_the_students_own(tmp_path) -> None:
    """The student's claimed speedup (with its own CI where the notebook measured it) stays in the graded
    results file and the report shows it beside the grader's re-measurement and CI."""
    from perflab import report, results

    doc = results.make("lab03_amp", {
        "speedups": [{"name": "bf16", "speedup": 1.62, "ci": [1.51, 1.7], "claimed": 1.62, "verdict": "deferred"}],
        "verification": [{"name": "amp_config", "verdict": "deferred", "reason": "re-measured by the grader",
                          "claimed": 1.62}]},
        machine={"device": "cpu", "hardware_class": "cpu-bf16"})
    verdict = {"name": "amp_config", "verdict": "pass", "speedup": 1.41, "ci": [1.33, 1.48], "reason": "clears",
               "claimed": 1.62}
    graded = json.loads(pipeline.with_grader_verdicts(json.dumps(doc), [verdict]))
    results.validate(graded)
    assert graded["sections"]["verification"][0]["claimed"] == 1.62
    path = tmp_path / "lab03_amp.json"
    path.write_text(json.dumps(graded))
    page = report.build_report([path]).html
    row = next(r for r in page.split("<tr") if "amp_config" in r)
    assert "you measured" in page and "1.62×" in row and "1.51" in row and "1.41×" in row and "1.33" in row, row


def test_what_the_verifier_should_show_a_person_is_flagged_and_honest_verdicts_are_not() -> None:
    """A re-measurement that found tampering, or training that left the reference only after the gate
    (work skipped where the gate cannot see), fails and is flagged; an honest fail is not flagged."""
    from perflab.labs.common import suspicion
    from perflab.verify import Verdict

    skipped = Verdict("fail", "loss_mismatch", "at step 9 (timed steps) the candidate's loss differs", 1.1)
    wrong = Verdict("fail", "loss_mismatch", "at step 1 (correctness check) the candidate's loss differs", 1.1)
    for verdict in (skipped, Verdict("fail", "cached_outputs", "outputs reused", 1.1),
                    Verdict("fail", "clock_tampered", "a clock was replaced", 1.1)):
        assert verdict.code in suspicion(verdict), verdict
    for verdict in (wrong, Verdict("fail", "below_bar", "1.02x is below the bar", 1.1),
                    Verdict("pass", "clears_bar", "1.5x", 1.1)):
        assert suspicion(verdict) is None, verdict


def test_a_suspicious_judge_scores_zero_and_flags_the_cell() -> None:
    from perflab.grading.judging import Context, Suspicious, judge_cell

    def judge(observed, ctx):  # noqa: ANN001, ANN202
        raise Suspicious("TRACE_FILE is not torch.profiler's trace of your pipeline: edited")

    ctx = Context("lab01_measure", 0, "tiny", {"mystery_trace": {"observed": {}}})
    mark = judge_cell("mystery_trace", judge, ctx)
    assert mark.fraction == 0.0 and mark.flag == mark.message and "edited" in mark.flag
