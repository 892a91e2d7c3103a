"""The course file (`perflab.course`): the labs in order, the model and the data set of a course, written by
`perflab grade setup`, shipped with the release, read by every notebook below it and put in force by the
grader for every process of a grading run; the repo holds the kit's own."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import nbformat
import pytest

from perflab import course, env
from perflab.grading import nbgrader_api, pipeline, sandbox, submission
from perflab.grading.result import failure_result
from perflab.labs import build
from perflab.workload import TrainConfig

REPO = Path(__file__).resolve().parents[1]
FIXTURE_SOLUTIONS = Path(__file__).parent / "fixtures" / "grading" / "solutions"
FIXTURE_LAB = "lab00_fixture"


@pytest.fixture(autouse=True)
def _no_course_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(course.MODEL_ENV, raising=False)
    monkeypatch.delenv(course.DATA_ENV, raising=False)


def test_the_repos_course_is_the_kits_six_labs_in_order_on_resnet18() -> None:
    kit = course.read(REPO / course.FILE_NAME)
    assert kit.labs == tuple(build.lab_names()) and kit.model == env.DEFAULT_MODEL and kit.data is None


def test_a_course_file_reads_back_what_was_written_and_a_folder_is_read_from_the_files_folder(tmp_path) -> None:
    (tmp_path / "images" / "cats").mkdir(parents=True)
    path = course.write(tmp_path, course.Course(("lab02_feed", "lab01_measure"), "resnet34", "images"))
    again = course.read(path)
    assert again == course.Course(("lab02_feed", "lab01_measure"), "resnet34", str(tmp_path / "images"))
    (tmp_path / course.FILE_NAME).write_text('labs = []\ndata = "small"\n')
    assert course.read(tmp_path / course.FILE_NAME) == course.Course((), env.DEFAULT_MODEL, "small")


@pytest.mark.parametrize(("text", "says"), [
    ("labs = [lab01", "not TOML"),
    ('labs = []\nmodle = "resnet34"\n', "unknown key(s) modle"),
    ('labs = ["one"]\n', "labs must be a list of lab names"),
    ('labs = ["lab01_measure", "lab01_measure"]\n', "names a lab twice"),
    ("model = 18\n", "model must be"),
    ('data = ""\n', "data must be"),
])
def test_a_malformed_course_file_is_one_line_naming_the_file_and_what_is_wrong(tmp_path, text, says) -> None:
    path = tmp_path / course.FILE_NAME
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        course.read(path)
    assert str(err.value).startswith(f"{path}: ") and says in str(err.value) and "\n" not in str(err.value)


def test_a_notebook_below_a_course_file_trains_its_model_and_a_variable_overrides_it(tmp_path, monkeypatch) -> None:
    """The release puts the course file beside the lab folders: a notebook's kernel, in its lab's folder,
    reads it; $PERFLAB_MODEL and $PERFLAB_DATA override it (as the grader's sandboxes receive them)."""
    (tmp_path / "data").mkdir()
    course.write(tmp_path, course.Course(("lab03_amp",), "resnet34", "data"))
    lab = tmp_path / "lab03_amp"
    lab.mkdir()
    monkeypatch.chdir(lab)
    assert (env.course_model(), env.course_data()) == ("resnet34", str(tmp_path / "data"))
    assert TrainConfig().model == "resnet34"
    monkeypatch.setenv(course.MODEL_ENV, "mobilenet_v3_small")
    monkeypatch.setenv(course.DATA_ENV, "tiny")
    assert (env.course_model(), env.course_data(), TrainConfig().model) == ("mobilenet_v3_small", "tiny",
                                                                           "mobilenet_v3_small")
    monkeypatch.chdir(tmp_path.parent)  # no course file above, none read before: the kit's defaults
    monkeypatch.delenv(course.MODEL_ENV)
    monkeypatch.delenv(course.DATA_ENV)
    monkeypatch.delenv(course.FILE_ENV)
    assert (env.course_model(), env.course_data()) == (env.DEFAULT_MODEL, None)


def test_in_force_sets_the_courses_variables_for_a_block_and_leaves_a_set_one_alone(monkeypatch) -> None:
    monkeypatch.setenv(course.DATA_ENV, "small")
    with course.in_force(course.Course((), "resnet34", "/data/imagenette")):
        assert (os.environ[course.MODEL_ENV], os.environ[course.DATA_ENV]) == ("resnet34", "small")
    assert course.MODEL_ENV not in os.environ and os.environ[course.DATA_ENV] == "small"


@pytest.fixture(scope="module")
def fixture_course(tmp_path_factory) -> Path:
    """The fixture lab set up in a course folder: the course file written by setup."""
    folder = tmp_path_factory.mktemp("course") / "course"
    pipeline.setup(folder, FIXTURE_SOLUTIONS)
    return folder


def test_setup_writes_the_course_file_and_keeps_an_edited_one(fixture_course: Path) -> None:
    written = course.read(fixture_course / course.FILE_NAME)
    assert written == course.Course((FIXTURE_LAB,), env.DEFAULT_MODEL, None)
    edited = course.Course((FIXTURE_LAB,), "resnet34", None)
    course.write(fixture_course, edited)
    assert pipeline.setup(fixture_course, FIXTURE_SOLUTIONS) == [FIXTURE_LAB]
    assert course.read(fixture_course / course.FILE_NAME) == edited
    course.write(fixture_course, written)


def test_setup_refuses_a_course_file_naming_a_lab_the_solutions_lack_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "course"
    folder.mkdir()
    course.write(folder, course.Course(("lab00_fixture", "lab09_missing"), env.DEFAULT_MODEL, None))
    with pytest.raises(FileNotFoundError, match=r"no folder for lab09_missing \(named by the course file"):
        pipeline.setup(folder, FIXTURE_SOLUTIONS)


def test_the_release_ships_the_course_file_beside_the_labs(fixture_course: Path, tmp_path: Path) -> None:
    bundle = pipeline.release(fixture_course, tmp_path / "bundle.zip", to=tmp_path / "copies")
    with zipfile.ZipFile(bundle) as zf:
        zf.extract(f"perflab-labs/{course.FILE_NAME}", tmp_path / "unzipped")
    shipped = course.read(tmp_path / "unzipped" / "perflab-labs" / course.FILE_NAME)
    assert shipped == course.read(fixture_course / course.FILE_NAME)
    assert (tmp_path / "copies" / course.FILE_NAME).is_file() and (tmp_path / "copies" / FIXTURE_LAB).is_dir()


def test_grading_puts_the_course_file_in_force_for_every_process_it_starts(fixture_course: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """What each submission's sandbox is handed: the course file's model and data set, whatever the grader's
    own working folder or environment says."""
    from test_course_choice import image_folder

    image_folder(tmp_path / "images", per_class=2)
    course.write(fixture_course, course.Course((FIXTURE_LAB,), "resnet34", str(tmp_path / "images")))
    release = nbformat.read(fixture_course / "release" / FIXTURE_LAB / f"{FIXTURE_LAB}.ipynb", as_version=4)
    handed = tmp_path / "ann" / f"{FIXTURE_LAB}.ipynb"
    handed.parent.mkdir()
    nbformat.write(release, handed)
    nbgrader_api.submit(fixture_course, FIXTURE_LAB, "ann", handed)
    seen: list[dict[str, str]] = []

    def graded(job, info, tmpl, settings, **_):
        seen.append({**settings.env, "in_process": env.course_model()})
        return failure_result(info, "not run: this test reads what the sandbox is handed")

    monkeypatch.setattr(submission, "grade_one", graded)
    monkeypatch.setattr(pipeline, "grade_one", graded)
    monkeypatch.chdir(tmp_path)
    settings = pipeline.Settings(cell_timeout=10, jobs=1, unisolated=sandbox.isolation().kind == "none",
                                 self_calibrate=False)
    pipeline.grade(fixture_course, settings, students=["ann"], force=True)
    assert len(seen) == 1
    assert (seen[0][course.MODEL_ENV], seen[0][course.DATA_ENV], seen[0]["in_process"]) == (
        "resnet34", str(tmp_path / "images"), "resnet34")
    assert course.MODEL_ENV not in os.environ  # out of force after the run
    course.write(fixture_course, course.Course((FIXTURE_LAB,)))


def test_grading_a_course_whose_file_names_no_torchvision_model_stops_in_one_line(fixture_course: Path) -> None:
    course.write(fixture_course, course.Course((FIXTURE_LAB,), "vgg7", None))
    try:
        with pytest.raises(ValueError, match=r"perflab-course.toml: model: 'vgg7' is not a torchvision"):
            pipeline.grade(fixture_course, pipeline.Settings(unisolated=True, self_calibrate=False))
    finally:
        course.write(fixture_course, course.Course((FIXTURE_LAB,)))


def test_a_process_whose_working_folder_was_removed_reads_the_kits_defaults(tmp_path, monkeypatch) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert (course.model(), course.data()) == (env.DEFAULT_MODEL, None)


def test_a_process_the_kit_starts_elsewhere_trains_the_course_its_parent_read(tmp_path, monkeypatch) -> None:
    """A verifier's fresh process runs in a folder of its own: it reads the course file its parent found."""
    import subprocess
    import sys

    course.write(tmp_path, course.Course((), "resnet34", None))
    monkeypatch.chdir(tmp_path)
    assert course.model() == "resnet34"
    elsewhere = tmp_path.parent
    child = subprocess.run([sys.executable, "-c", "from perflab import course; print(course.model())"],
                           cwd=elsewhere, capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "resnet34"
    monkeypatch.delenv(course.FILE_ENV)
    assert subprocess.run([sys.executable, "-c", "from perflab import course; print(course.model())"],
                          cwd=elsewhere, capture_output=True, text=True, check=True).stdout.strip() == "resnet18"
