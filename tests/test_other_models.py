"""Courses on another torchvision model and an ImageFolder the kit's recipe did not make, as an instructor sets
them up: a course file beside the labs (the students' kernels read it) or in the course folder (the grader
puts it in force). Labs 1 and 2 run top to bottom on mobilenet_v3_small, which has no ResNet stages, and lab 6
says in one line that its checkpointing cannot run there; labs 1 and 6 run on resnet34. (Lab 3 graded on
resnet34 in grade mode, its bar calibrated for that model first, takes over 15 minutes on 2 cores: it is
not in the suite; `perflab.demo` runs it, `PERFLAB_MODEL=resnet34 make demo LABS=lab03_amp`.)"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import nbclient.exceptions
import pytest
from test_course_choice import image_folder

from perflab import course
from perflab.labs import build

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    """The course's ImageFolder, where a grader's sandbox can bind it (not under pytest's own folder, which
    the sandbox may not enter); a grade-mode batch of 32 and more."""
    root = Path(tempfile.mkdtemp(prefix="perflab-course-data-"))
    root.chmod(0o755)
    yield image_folder(root / "imagenette-like", per_class=20)
    shutil.rmtree(root, ignore_errors=True)


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


def test_lab2_runs_top_to_bottom_on_a_model_without_resnet_stages(folder: Path, tmp_path: Path) -> None:
    _, results = at_home("lab02_feed", "mobilenet_v3_small", folder, tmp_path)
    assert trained_on(results) == {("mobilenet_v3_small", str(folder))}


def test_lab1_runs_top_to_bottom_on_resnet34_and_the_folder(folder: Path, tmp_path: Path) -> None:
    _, results = at_home("lab01_measure", "resnet34", folder, tmp_path)
    assert ("resnet34", str(folder)) in trained_on(results)


def test_lab6_says_in_one_line_that_its_checkpointing_cannot_run_on_a_model_without_stages(
        folder: Path, tmp_path: Path) -> None:
    with pytest.raises(nbclient.exceptions.CellExecutionError) as err:
        at_home("lab06_together", "mobilenet_v3_small", folder, tmp_path)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", str(err.value))  # the traceback as Jupyter colours it
    said = [line for line in plain.splitlines() if line.startswith("ValueError: ")]
    assert said and "lab06_together checkpoints ResNet stages" in said[-1] and "mobilenet_v3_small" in said[-1], said


def test_lab6_runs_top_to_bottom_on_resnet34_and_the_folder(folder: Path, tmp_path: Path) -> None:
    _, results = at_home("lab06_together", "resnet34", folder, tmp_path)
    assert trained_on(results) == {("resnet34", str(folder))}

