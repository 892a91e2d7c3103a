"""Checks every lab in solutions/ must pass (a new lab gets them by existing), and the lab helpers."""

from __future__ import annotations

import json
import re
import warnings

import labs_helpers as H
import nbformat
import pytest

from perflab import env
from perflab.labs import build, common

LABS = H.lab_names()
TOTAL_POINTS = 100


def _student_text(lab: str) -> str:
    path = build.student_notebook(lab)
    assert path.is_file(), f"{path} missing: run `make labs`"
    return path.read_text(encoding="utf-8")


def test_there_are_labs() -> None:
    assert "lab01_measure" in LABS


@pytest.mark.parametrize("lab", LABS)
def test_ipynb_and_py_twin_agree(lab: str) -> None:
    assert build.twin_problems(lab) == []


@pytest.mark.parametrize("lab", LABS)
def test_grade_ids_unique(lab: str) -> None:
    ids = [H.nbgrader_meta(c).get("grade_id") for c in H.source_cells(lab) if H.nbgrader_meta(c)]
    assert all(ids), f"{lab}: an nbgrader cell has no grade_id"
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates, f"{lab}: duplicate grade_ids {duplicates}"


@pytest.mark.parametrize("lab", LABS)
def test_test_cells_locked_with_points(lab: str) -> None:
    for cell in H.grade_cells(lab):
        meta = H.nbgrader_meta(cell)
        assert meta.get("points", 0) > 0, f"{lab} {meta['grade_id']}: a graded cell without points"
        if not meta.get("solution"):
            assert cell.cell_type == "code", f"{lab} {meta['grade_id']}: autograded tests must be code cells"
            assert meta.get("locked"), f"{lab} {meta['grade_id']}: test cells must be locked"


@pytest.mark.parametrize("lab", LABS)
def test_total_points(lab: str) -> None:
    total = sum(H.nbgrader_meta(c)["points"] for c in H.grade_cells(lab))
    assert total == TOTAL_POINTS, f"{lab}: {total} points, every lab has {TOTAL_POINTS}"


@pytest.mark.parametrize("lab", LABS)
def test_markers_balanced_and_in_the_right_cells(lab: str) -> None:
    for i, cell in enumerate(H.source_cells(lab)):
        meta = H.nbgrader_meta(cell)
        where = f"{lab} cell {i} ({meta.get('grade_id', '-')})"
        for begin, end in (H.SOLUTION_MARKERS, H.HIDDEN_MARKERS, H.MARK_SCHEME_MARKERS):
            assert H.marker_problems(cell.source, begin, end) == [], where
        if "BEGIN SOLUTION" in cell.source:
            assert meta.get("solution"), f"{where}: solution markers in a cell that is not a solution cell"
        if "BEGIN HIDDEN TESTS" in cell.source:
            assert meta.get("grade") and not meta.get("solution"), f"{where}: hidden tests outside a test cell"


@pytest.mark.parametrize("lab", LABS)
def test_solution_cells_hold_solutions(lab: str) -> None:
    """A code solution cell without markers would be wiped whole; with them, the student keeps the signatures."""
    for cell in H.source_cells(lab):
        meta = H.nbgrader_meta(cell)
        if meta.get("solution") and cell.cell_type == "code":
            assert "### BEGIN SOLUTION" in cell.source, f"{lab} {meta['grade_id']}: no BEGIN SOLUTION marker"


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_student_copy_is_what_nbgrader_generates(lab: str) -> None:
    assert _student_text(lab) == H.generated(lab), f"{build.student_notebook(lab)} is stale: run `make labs`"


@pytest.mark.parametrize("lab", LABS)
def test_student_copy_has_no_solution_or_hidden_text(lab: str) -> None:
    text = _student_text(lab)
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "MARK SCHEME"):
        assert marker not in text, f"{lab}: {marker!r} in the student copy"
    student = "\n".join(c.source for c in nbformat.reads(text, as_version=4).cells)
    source = H.source_cells(lab)
    outside = "\n".join(line for c in source for line in c.source.splitlines()
                        if line not in H.solution_lines(c.source))
    secret = {line.strip() for c in source for line in H.solution_lines(c.source)}
    # Lines that also appear outside any solution block (a `return` shared by both) give nothing away.
    leaked = sorted(s for s in secret if len(s) > 12 and s in student and s not in outside)
    assert not leaked, f"{lab}: solution or hidden-test lines in the student copy: {leaked[:5]}"


@pytest.mark.parametrize("lab", LABS)
def test_written_answers_are_wiped(lab: str) -> None:
    cells = nbformat.reads(_student_text(lab), as_version=4).cells
    for cell in cells:
        meta = H.nbgrader_meta(cell)
        if meta.get("solution") and cell.cell_type == "markdown":
            assert cell.source.strip() == "YOUR ANSWER HERE", f"{lab} {meta['grade_id']}: model answer released"


# Each lab's written answers (graded by a person) and the points its autograded cells carry.
WRITTEN_ANSWERS = {
    "lab01_measure": ({"answer_timing", "answer_profilers", "answer_bottleneck"}, 83),
    "lab02_feed": ({"answer_sweep", "answer_share", "answer_knobs", "answer_pace"}, 80),
    "lab03_amp": ({"answer_speed", "answer_scaler", "answer_census"}, 82),
    "lab04_memory": ({"answer_memory_model", "answer_cost", "answer_budget", "answer_accumulation"}, 80),
    "lab05_compile": ({"answer_modes", "answer_break_even", "answer_breaks"}, 85),
    "lab06_together": ({"answer_plan", "answer_memory", "analysis"}, 77),
}


def test_every_lab_has_its_answer_table() -> None:
    assert set(WRITTEN_ANSWERS) == set(LABS)


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_solution_gets_full_autograded_marks(lab: str, tiny_data) -> None:
    """Every autograded cell earns full marks, but for a re-measurement the host's timing decided (`H.TIMED_CODES`):
    that verdict rides on the host's noise at tiny sizes, so it is reported as a warning, never asserted here."""
    run = H.graded_solution(lab)
    assert run.errors() == []
    assert run.untimed_shortfalls() == {}, "autograded cells below full marks (score/max: the grader's line)"
    if run.timed_shortfalls():
        warnings.warn(f"{lab}: re-measured below full marks on this host's timing: {run.timed_shortfalls()}", stacklevel=1)
    manual, points = WRITTEN_ANSWERS[lab]
    assert sum(s.max_score for s in run.autograded) == points
    assert {s.grade_id for s in run.manual} == manual
    assert all(s.needs_manual_grade for s in run.manual), "answered written cells wait for a person"


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_blank_copy_runs_and_scores_zero(lab: str, tiny_data) -> None:
    run = H.graded_blank(lab)
    assert len(run.scores) == len(H.graded_solution(lab).scores)
    scored = {s.grade_id: s.auto_score for s in run.scores if s.auto_score}
    assert scored == {}, f"an unanswered notebook earned points: {scored}"
    assert all(not s.needs_manual_grade for s in run.manual), "unchanged written cells are scored 0 outright"
    assert any("NotImplementedError" in e for e in run.errors())


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_no_test_cell_writes_stderr(lab: str, tiny_data) -> None:
    run = H.graded_solution(lab)
    assert run.stderr_test_cells() == [], "nbgrader scores a test cell that writes stderr 0"


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_solution_runs_top_to_bottom_without_errors(lab: str, tiny_data) -> None:
    assert H.graded_solution(lab).errors() == []


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_solution_saves_valid_results(lab: str, tiny_data) -> None:
    from perflab import results

    run = H.graded_solution(lab)
    doc = results.load(common.results_path(lab, run.folder))
    assert doc["lab"] == lab and doc["sections"], doc


# ---------------------------------------------------------------------------------------------
# The helpers themselves


def test_marker_problems_finds_unbalanced_and_nested() -> None:
    begin, end = H.SOLUTION_MARKERS
    assert H.marker_problems(f"{begin}\nx\n{end}\n", begin, end) == []
    assert H.marker_problems(f"{begin}\nx\n", begin, end) == [f"{begin} never closed"]
    assert H.marker_problems(f"x\n{end}\n", begin, end) == [f"line 2: {end} without {begin}"]
    assert H.marker_problems(f"{begin}\n{begin}\n{end}\n{end}", begin, end)[0].startswith("line 2")


def test_progress_is_silent_in_grade_and_tiny_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    items = [1, 2, 3]
    for mode in ("grade", "tiny"):
        monkeypatch.setenv("PERFLAB_MODE", mode)
        assert common.progress(items) is items
    monkeypatch.delenv("PERFLAB_MODE")
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert env.run_mode() == "grade" and common.progress(items) is items


def test_each_lab_times_itself_from_its_first_cell() -> None:
    assert "not timed" in common.elapsed_statement("lab99_never_started")
    common.hardware_statement("lab99_timed")
    line = common.elapsed_statement("lab99_timed")
    assert re.match(r"lab99_timed ran top to bottom in \d+ s here: \w+ mode, ", line), line
    for lab in LABS:  # every lab ends by printing it, and quotes no run time of its own in prose
        text = build.source_notebook(lab).with_suffix(".py").read_text(encoding="utf-8")
        assert "common.elapsed_statement(" in text.split("# %%")[-1], lab
        assert not re.search(r"\b\d+(\.\d+)? ?minutes\b", text), f"{lab}: a run time typed into the prose"


def test_nbgrader_validate_never_overwrites_the_students_results(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert common.results_path("lab01_measure") == tmp_path / "results" / "lab01_measure.json"
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")  # what nbgrader sets in the kernel it validates with
    assert not common.results_path("lab01_measure").is_relative_to(tmp_path)
    assert common.results_path("lab01_measure", tmp_path) == tmp_path / "results" / "lab01_measure.json"


def test_save_results_writes_beside_the_notebook(tmp_path) -> None:
    from perflab import results

    path = common.save_results("lab00_demo", {"counts": {"parameters": 3}}, folder=tmp_path)
    assert path == tmp_path / "results" / "lab00_demo.json"
    assert results.load(path)["sections"]["counts"]["parameters"] == 3
    with pytest.raises(results.ResultsError, match="sections.counts"):
        common.save_results("lab00_demo", {"counts": "not an object"}, folder=tmp_path)


def test_hardware_statement_names_device_mode_and_lab(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFLAB_MODE", "tiny")
    text = common.hardware_statement("lab01_measure")
    info = env.machine_info()
    assert info.device in text and "mode          tiny" in text
    assert "this lab" in text and "can give" in text


def test_canonical_notebooks_are_deterministic() -> None:
    nb = build.read_notebook(build.source_notebook("lab01_measure"))
    nb.cells[0]["id"] = "random-id"
    nb.metadata["widgets"] = {"junk": 1}
    once = build.dumps(build.canonical(nb))
    assert once == build.source_notebook("lab01_measure").read_text(encoding="utf-8")
    assert json.loads(once)["metadata"] == build.NOTEBOOK_METADATA
    ids = [c["id"] for c in json.loads(once)["cells"]]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", i) for i in ids)


def test_sync_roundtrip_in_a_copy(tmp_path) -> None:
    """Editing the .py and syncing rewrites the .ipynb; the reverse direction restores the twin."""
    import shutil

    lab = "lab01_measure"
    shutil.copytree(build.SOLUTIONS / lab, tmp_path / lab)
    twin = build.source_twin(lab, tmp_path)
    twin.write_text(twin.read_text(encoding="utf-8").replace("# # Lab 1 — Measure first", "# # Lab 1 — edited"),
                    encoding="utf-8")
    assert build.twin_problems(lab, tmp_path)  # out of step until synced
    assert build.sync([lab], solutions=tmp_path) == [build.source_notebook(lab, tmp_path)]
    assert build.twin_problems(lab, tmp_path) == []
    assert "Lab 1 — edited" in build.source_notebook(lab, tmp_path).read_text(encoding="utf-8")
    assert build.sync([lab], solutions=tmp_path, from_ipynb=True) == []  # already equal both ways


def test_unknown_lab_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="lab: 'lab99_nope' is not a lab"):
        build.sync(["lab99_nope"])


@pytest.mark.slow
def test_make_lab_runs_the_notebook_beside_a_copy_of_itself(tmp_path) -> None:
    """`make lab` (build.run_notebook) runs in a folder holding the notebook, as Jupyter does: lab 6
    reads its written analysis from its own file."""
    from nbformat.v4 import new_code_cell, new_notebook

    source = tmp_path / "src" / "selfread.ipynb"
    source.parent.mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell(
        "import json\nprint(len(json.load(open('selfread.ipynb'))['cells']), 'cell')")]), source)
    nb, seconds = build.run_notebook(source, workdir=tmp_path / "work")
    assert nb.cells[0].outputs[0]["text"] == "1 cell\n" and seconds > 0
    assert (tmp_path / "work" / "selfread.ipynb").is_file()


def test_report_records_an_error_as_a_fail_against_its_expectation() -> None:
    from types import SimpleNamespace

    from perflab.verify import load_expectation

    expectation = load_expectation("amp_bf16")
    verdict = SimpleNamespace(outcome="error", speedup=None, ci=None, claim=2.0, reason="the child crashed")
    record = common.report(verdict, expectation)
    assert record == {"name": "amp_bf16", "verdict": "fail", "speedup": None, "ci": None, "claimed": 2.0,
                      "hardware_class": expectation.hardware_class, "reason": "the child crashed"}
    passed = SimpleNamespace(outcome="pass", speedup=1.3, ci=(1.2, 1.4), claim=None, reason="")
    assert common.report(passed, expectation)["verdict"] == "pass"
    assert common.report(passed, expectation)["ci"] == [1.2, 1.4]


@pytest.mark.slow
@pytest.mark.parametrize("lab", ["lab03_amp"])  # lab 4 has its own, with its sandboxed programs (test_lab04)
def test_every_cheat_at_once_on_a_blank_lab_earns_nothing_and_is_flagged(lab: str, tiny_data) -> None:
    """The fixture corpus's cheats (kernel hooks, rebinding perflab, the bar and mode from the environment,
    snooping grader material out in base64, forged observations) all at once on a real blank lab, plus a
    rebinding of the lab's own module through the name its setup cell imported: no more than a blank."""
    module = lab.split("_")[0]
    rebind = (f"{module}.accepted = lambda outcome: True\n{module}.PROBES = {{}}\n"
              f"{module} = type('Proxy', (), {{'__getattr__': lambda self, name: (lambda *a, **k: True)}})()\n")
    path = H.every_cheat_notebook(lab, "cheater-all", rebind)

    run = H.autograde(H.course_for(lab), lab, "cheater-all", path)
    blank = H.graded_blank(lab)
    assert sum(s.auto_score or 0 for s in run.autograded) <= sum(s.auto_score or 0 for s in blank.autograded) == 0
    flags = " ".join(run.record.flags)
    for evidence in ("kernel hooks", "replaces perflab.grading", "environment variable", "outside its folder",
                     f"replaces perflab.labs.{module}.accepted", f"rebinds {module}"):
        assert evidence in flags, (evidence, run.record.flags)
    blob = H.snooped(run)
    for secret in (b"BEGIN HIDDEN", b"BEGIN SOLUTION", b"JUDGES"):
        assert secret not in blob, secret


@pytest.mark.slow
def test_nbgrader_validate_still_works_for_a_student(tmp_path, tiny_data) -> None:
    """The visible tests still run in the student's kernel: `nbgrader validate` passes a reference answer
    and names the failing cells of a blank copy (they earn nothing by themselves: the grader re-runs them)."""
    import subprocess

    from perflab import demo

    lab = "lab03_amp"
    release = nbformat.read(H.REPO / "labs" / lab / f"{lab}.ipynb", as_version=4)
    source = nbformat.read(H.REPO / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    answered, blank = tmp_path / "answered" / f"{lab}.ipynb", tmp_path / "blank" / f"{lab}.ipynb"
    for path, nb in ((answered, demo.reference_notebook(source, release)), (blank, release)):
        path.parent.mkdir()
        nbformat.write(nb, path)
    # A student validates from the kit's root, whose nbgrader_config.py gives each cell the grader's 600 s
    # (nbgrader's own default is 30 s, which lab 3's comparison passes only on a quiet machine).
    validate = [str(H.REPO / ".venv" / "bin" / "nbgrader"), "validate", "--Execute.timeout=600"]
    env_vars = {**__import__("os").environ, **H.TINY_ENV}
    ok = subprocess.run([*validate, str(answered)], capture_output=True, text=True, env=env_vars, timeout=900,
                        cwd=answered.parent)
    assert "Success! Your notebook passes all the tests." in ok.stdout, ok.stdout[-2000:] + ok.stderr[-2000:]
    bad = subprocess.run([*validate, str(blank)], capture_output=True, text=True, env=env_vars, timeout=900,
                         cwd=blank.parent)
    assert "VALIDATION FAILED ON" in bad.stdout and "You did not provide a response" in bad.stdout, bad.stdout[-2000:]
    assert not (answered.parent / "results").exists()  # validation never writes the student's results


def test_the_timed_codes_the_lab_tests_set_aside_are_the_verifiers_timing_verdicts() -> None:
    """`H.TIMED_CODES` names only verdicts the verifier or the keep rule reach after timing both sides: never a
    gate, a check or an error, which the full-marks tests above still assert."""
    import inspect

    from perflab.verify import protocol

    source = inspect.getsource(protocol) + inspect.getsource(common)
    for code in H.TIMED_CODES:
        assert f'"{code}"' in source, code
    assert not H.TIMED_CODES & {"no_change", "clears_bar", "loss_mismatch", "samples_differ", "timeout", "crashed",
                                "claim_contradicted", "clock_tampered", "results_tampered"}
