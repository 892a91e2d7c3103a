"""What a replayed home record may still change of a grade, through `pipeline.grade` (issue 53): nothing the
submitted code does not decide, nothing the grader's own re-measurement contradicts, and lab 6 starts from
what the grader graded, never from files the student's code wrote."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import labs_helpers as H
import nbformat
import pytest

from perflab.grading import nbgrader_api, pipeline, sandbox
from perflab.grading.state import CellResult, Record, State
from perflab.labs import homework


def _cell(nb: Any, grade_id: str) -> Any:
    return next(c for c in nb.cells if H.nbgrader_meta(c).get("grade_id") == grade_id)


def _records(nb: Any, kind: str) -> list[dict[str, Any]]:
    """The record entries of `kind` in `nb`'s outputs, as the notebook holds them (edited in place)."""
    return [o["data"][homework.HOMEWORK_MIME] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if homework.HOMEWORK_MIME in (o.get("data") or {}) and o["data"][homework.HOMEWORK_MIME].get("kind") == kind]


def _grade(lab: str, submissions: dict[str, Any]) -> tuple[Path, State]:
    """Submit each notebook under its student's name in `lab`'s test course and grade them in one run."""
    course = H.course_for(lab)
    folder = course / "to-submit"
    folder.mkdir(exist_ok=True)
    for student, nb in submissions.items():
        path = folder / student / f"{lab}.ipynb"
        path.parent.mkdir(exist_ok=True)
        nbformat.write(nb, path)
        nbgrader_api.submit(course, lab, student, path)
    settings = pipeline.Settings(limits=sandbox.Limits(wall_s=H.SUBMISSION_WALL_S), cell_timeout=H.CELL_TIMEOUT,
                                 env=dict(H.TINY_ENV), unisolated=sandbox.isolation().kind == "none")
    start = time.perf_counter()
    summary = pipeline.grade(course, settings, labs=[lab], students=list(submissions), force=True)
    assert len(summary.graded) == len(submissions), (summary.line(), time.perf_counter() - start)
    return course, State.load(course)


def _outputs(course: Path, lab: str, student: str, grade_id: str) -> str:
    nb = nbformat.read(course / "autograded" / student / lab / f"{lab}.ipynb", as_version=4)
    return "".join(o.get("text", "") for o in _cell(nb, grade_id).get("outputs", []))


def _graded(state: State, lab: str, student: str, grade_id: str) -> CellResult:
    record = state.get(lab, student)
    assert record is not None, f"{lab}/{student} was not graded"
    return next(c for c in record.cells if c.grade_id == grade_id)


def test_lab2_grades_the_decision_its_code_makes_not_the_one_its_record_names() -> None:
    """Two students hand in the reference's saved run with its BEST record naming 2 workers (typed in): one
    left the decision cell at `BEST = BASELINE` and never ran it, one edited `pick_workers` to return 0
    after the run. Both are graded on the baseline their code decides, and the cell says what the record
    said; the re-measured cell's decision, which lab 6 starts from, is the baseline."""
    lab = "lab02_feed"
    home = nbformat.read(H.solution_at_home(lab), as_version=4)
    for entry in _records(home, "lab02.best"):
        entry["value"]["knobs"] = {"num_workers": 2, "persistent_workers": True}
        entry["value"]["swept"] = sorted({*(entry["value"].get("swept") or []), 0, 2})
    lazy, stale = copy.deepcopy(home), copy.deepcopy(home)
    _cell(lazy, "best").source = 'BEST = BASELINE\nWHY_BEST = "left as it was"\nprint(BEST)'
    _cell(stale, "pick_workers").source = "def pick_workers(sweep, tolerance=0.05):\n    return 0\n"
    course, state = _grade(lab, {"lazy2": lazy, "stale2": stale})
    for student in ("lazy2", "stale2"):
        decided = _graded(state, lab, student, "test_best_verified").decision
        assert decided is not None and decided["config"]["num_workers"] == 0, (student, decided)
        said = _outputs(course, lab, student, "best_as_decided")
        assert "as your code decides it in this run" in said and "your saved run decided" in said, said


def test_a_typed_in_lab3_comparison_the_grader_contradicts_is_flagged_and_its_decision_earns_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference's saved run with one autocast setting's record typed in at 10x (its baseline blocks
    kept, its own divided by ten): the notebook's code keeps it, the grader re-measures it on the machine
    and workload the record names, and the decision cell earns nothing and is flagged for a person. The
    grader's re-measurement is simulated at 1.0x (CI 0.95-1.05x), a setting that gains nothing here: on a
    loaded test host the real one may time too few blocks to hold anything against (then nothing is
    flagged). The honest reference, graded with the real re-measurement, is not flagged."""
    from types import SimpleNamespace

    from perflab.labs import lab03
    from perflab.labs.lab03 import judges as hidden03

    lab = "lab03_amp"
    honest = H.graded_solution(lab).record
    assert not any("noise does not explain" in f for f in honest.flags), honest.flags
    assert next(c for c in honest.cells if c.grade_id == "test_amp_config").score > 0

    typed = nbformat.read(H.solution_at_home(lab), as_version=4)
    (entry,) = _records(typed, "lab03.compare_precisions")
    names = list(entry["value"])
    target = next((n for n in names if hidden03.candidate_knobs(n)[0] is not None), names[-1])
    for name, comparison in entry["value"].items():  # every other setting measured at parity
        comparison["b_times"] = [t / 10 if name == target else t for t in comparison["a_times"]]
    remeasured: list = []

    def at_parity(config, observed, ctx):
        remeasured.append(config)
        verdict = SimpleNamespace(outcome="fail", code="below_bar", speedup=1.0, ci=(0.95, 1.05),
                                  claim=observed.get("claim"), reason="re-measured 1.00x (CI 0.95-1.05x)", details={})
        return verdict, SimpleNamespace(name=lab03.EXPECTATION, hardware_class="cpu", threshold=1.0)

    monkeypatch.setattr(hidden03, "remeasured", at_parity)
    course, state = _grade(lab, {"typed3": typed})
    assert [(c.amp_dtype, c.channels_last) for c in remeasured] == [hidden03.candidate_knobs(target)] * 2, remeasured
    decision = _graded(state, lab, "typed3", "test_amp_config")
    assert decision.score == 0.0 and "noise does not explain" in (decision.error or ""), decision
    record = state.get(lab, "typed3")
    assert record.flagged and any(f.startswith("test_amp_config:") and "noise does not explain" in f
                                  for f in record.flags), record.flags


def test_lab6_starts_from_the_decisions_the_grader_graded_never_from_rewritten_results_files() -> None:
    """A lazy student's earlier results files, rewritten to claim a classmate's decisions, are not what lab 6
    reads: it starts from the decisions the grading state holds for labs 2, 3 and 5, and a student with no
    graded earlier lab starts from the notebook's default."""
    from perflab import results
    from perflab.grading.result import Job
    from perflab.workload import TrainConfig

    lab, student = "lab06_together", "lazy6"
    course = H.course_for(lab)
    state = State.load(course)
    graded = {"lab02_feed": {"config": TrainConfig(num_workers=1, persistent_workers=True).to_dict()},
              "lab03_amp": {"config": TrainConfig().to_dict()},
              "lab05_compile": {"choice": None}}
    for earlier, decision in graded.items():
        state.put(Record(student, earlier, "x", "graded", (CellResult("test_verified", 1.0, 1.0, decision=decision),)))
        claimed = {"lab02_feed": ({}, TrainConfig(num_workers=3, persistent_workers=True, prefetch_factor=4)),
                   "lab03_amp": ({}, TrainConfig(amp_dtype="bf16", channels_last=True)),
                   "lab05_compile": ({"compile": {"choice": "max-autotune"}}, None)}[earlier]
        results.save(course / "autograded" / student / earlier / "results" / f"{earlier}.json", earlier,
                     claimed[0], config=claimed[1])
    assert pipeline.with_earlier(course, Job("nobody", lab, course / "x.ipynb", "x")).earlier == ()

    blank = nbformat.read(course / "release" / lab / f"{lab}.ipynb", as_version=4)
    course, state = _grade(lab, {student: blank})
    said = _printed_decisions(course, lab, student)
    assert "loader {'num_workers': 1, 'persistent_workers': True}, precision {}" in said, said
    assert "compile None" in said and "num_workers': 3" not in said and "max-autotune" not in said, said
    assert "lab04_memory   no results here" in said, said


def _printed_decisions(course: Path, lab: str, student: str) -> str:
    """The output of the cell that reads the earlier decisions (`lab06_report.earlier_decisions`)."""
    nb = nbformat.read(course / "autograded" / student / lab / f"{lab}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and "earlier_decisions()" in c.source)
    return "".join(o.get("text", "") for o in cell.get("outputs", []))


@pytest.mark.parametrize("recorded_low, ci, where_same, flagged", [
    (1.85, (0.95, 1.05), True, True),    # typed in at 1.9x where the grader measures 1.0x
    (1.21, (0.84, 1.44), True, False),   # lab 3's reference in tiny mode: noise, never flagged
    (1.85, (0.95, 1.05), False, False),  # made on another machine or workload: never compared
    (None, (0.95, 1.05), True, False),   # no CI to hold
])
def test_a_record_is_contradicted_only_beyond_noise_on_the_graders_machine_and_workload(
        recorded_low, ci, where_same, flagged) -> None:
    from perflab.labs import lab03

    base = lab03.baseline_config("tiny")
    where = homework.stamp(base) if where_same else {**homework.stamp(base), "machine": "a laptop"}
    why = homework.contradicted(recorded_low, json.loads(json.dumps(where)), {"ci": list(ci)}, base, "AMP_CONFIG")
    assert bool(why) == flagged, why
