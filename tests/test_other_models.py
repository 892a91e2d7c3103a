"""Courses on another torchvision model and an ImageFolder the kit's recipe did not make, as an instructor sets
them up: a course file beside the labs (the students' kernels read it) or in the course folder (the grader
puts it in force). Labs 1 and 2 run top to bottom on mobilenet_v3_small, which has no ResNet stages, and lab 6
says in one line that its checkpointing cannot run there; lab 6 runs on resnet34; lab 3 runs at home on
resnet34 and is graded through the pipeline against a bar calibrated for resnet34 on that folder first."""

from __future__ import annotations

import json
from pathlib import Path

import nbclient.exceptions
import nbformat
import pytest
from test_course_choice import image_folder

from perflab import course, demo, env
from perflab.grading import self_calibration
from perflab.labs import build
from perflab.verify import load_expectation

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return image_folder(tmp_path_factory.mktemp("data") / "imagenette-like")


@pytest.fixture(autouse=True)
def _no_course_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(course.MODEL_ENV, raising=False)
    monkeypatch.delenv(course.DATA_ENV, raising=False)


def at_home(lab: str, model: str, folder: Path, home: Path, **kwargs) -> tuple[object, Path]:
    """`lab` run top to bottom in tiny mode in home/<lab>/, below a course file naming `model` and `folder`."""
    course.write(home, course.Course((lab,), model, str(folder)))
    executed, _ = build.run_notebook(build.source_notebook(lab), mode="tiny", workdir=home / lab, **kwargs)
    return executed, home / lab / "results" / f"{lab}.json"


def trained_on(results: Path) -> set[tuple[str, str]]:
    """(model, data) of every training configuration a results file holds."""
    found: set[tuple[str, str]] = set()

    def walk(value: object) -> None:
        if isinstance(value, dict):
            if "model" in value and "data" in value and "batch_size" in value:
                found.add((value["model"], value["data"]))
            for child in value.values():
                walk(child)
        elif isinstance(value, list):
            for child in value:
                walk(child)

    walk(json.loads(results.read_text(encoding="utf-8")))
    return found


@pytest.mark.parametrize("lab", ["lab01_measure", "lab02_feed"])
def test_a_lab_runs_top_to_bottom_on_a_model_without_resnet_stages(lab: str, folder: Path, tmp_path: Path) -> None:
    _, results = at_home(lab, "mobilenet_v3_small", folder, tmp_path)
    assert trained_on(results) == {("mobilenet_v3_small", str(folder))}


def test_lab6_says_in_one_line_that_its_checkpointing_cannot_run_on_a_model_without_stages(
        folder: Path, tmp_path: Path) -> None:
    with pytest.raises(nbclient.exceptions.CellExecutionError) as err:
        at_home("lab06_together", "mobilenet_v3_small", folder, tmp_path)
    said = [line for line in str(err.value).splitlines() if line.startswith("ValueError: ")]
    assert said and "lab06_together checkpoints ResNet stages" in said[-1] and "mobilenet_v3_small" in said[-1], said


def test_lab6_runs_top_to_bottom_on_resnet34_and_the_folder(folder: Path, tmp_path: Path) -> None:
    _, results = at_home("lab06_together", "resnet34", folder, tmp_path)
    assert trained_on(results) == {("resnet34", str(folder))}


def test_lab3_on_resnet34_is_graded_through_the_pipeline_against_a_bar_calibrated_for_resnet34(
        folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's way (`perflab.demo.run`: setup, the reference's home run, collect, grade) in grade mode on a
    course of resnet34 on the folder: the course file records both, no committed bar holds for that model,
    so the grader calibrates lab 3's bar for it first; the reference earns every autograded mark but what
    this host's timing takes, the lazy student's decision is judged against the same bar."""
    import labs_helpers

    monkeypatch.setenv(course.MODEL_ENV, "resnet34")
    monkeypatch.setenv(course.DATA_ENV, str(folder))
    monkeypatch.setattr(self_calibration, "REPEATS", 1)
    ran = demo.run(["lab03_amp"], out=tmp_path / "demo", mode="grade", students=("reference", "lazy"))
    print(ran.table(), ran.calibration, sep="\n")
    assert course.read(ran.course / course.FILE_NAME) == course.Course(("lab03_amp",), "resnet34", str(folder))
    from perflab.labs import lab03

    with course.in_force(course.Course((), "resnet34", str(folder))):
        workload = lab03.baseline_config("grade")
    assert (workload.model, workload.data) == ("resnet34", str(folder))
    bar = load_expectation(lab03.EXPECTATION, directory=self_calibration.folder(ran.course), workload=workload)
    assert bar.calibrated, bar.reason
    committed = load_expectation(lab03.EXPECTATION, workload=workload)
    assert not committed.calibrated or committed.source != bar.source  # resnet18's bars do not hold here
    score, top = ran.scores["reference"]["lab03_amp"]
    assert top > 0 and ran.autograded_max["lab03_amp"] > 0
    from perflab.grading.state import State

    record = State.load(ran.course).get("lab03_amp", "reference")
    assert record.outcome == "graded" and record.uncalibrated == (), record
    short = {c.grade_id: c for c in record.cells if c.score is not None and c.score < c.max_score}
    timed = labs_helpers.only_timed_shortfalls(short, lambda c: c.code, "lab 3's reference on resnet34")
    assert set(short) == set(timed), short
    assert env.course_model() == env.DEFAULT_MODEL  # nothing left in force
    home = nbformat.read(ran.root / "home" / "lab03_amp" / "lab03_amp.ipynb", as_version=4)
    printed = "".join(out.get("text", "") for cell in home.cells for out in cell.get("outputs", []))
    assert f"data {folder}, images" in printed  # the hardware statement names the course's data
