"""Each lab's MANIFEST (perflab.labs.registry): read as data, checked field by field, true to the lab."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from perflab import diagnose
from perflab.labs import build, registry
from perflab.labs.manifest import LabManifest

SOLUTIONS = Path(__file__).resolve().parents[1] / "solutions"


def grade_ids(lab: str) -> set[str]:
    nb = build.read_notebook(build.source_notebook(lab))
    return {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb.cells} - {None}


def test_every_lab_of_the_kit_is_in_the_registry_in_course_order() -> None:
    names = registry.names()
    assert list(names) == sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir() and p.name.startswith("lab"))
    assert registry.find("lab03") == registry.find("lab03_amp") == registry.manifest("lab03_amp")
    assert registry.find("lab99_none") is None


@pytest.mark.parametrize("lab", registry.manifests(), ids=lambda m: m.lab)
def test_what_a_manifest_declares_is_true_of_its_lab(lab: LabManifest) -> None:
    ids = grade_ids(lab.lab)
    assert set(lab.lazy_choices) <= ids, "lazy_choices names a grade_id the notebook lacks"
    assert all(registry.names().index(e) < registry.names().index(lab.lab) for e in lab.starts_from)
    topics = {diagnose.LOADING, diagnose.PRECISION, diagnose.LAYOUT, diagnose.CHECKPOINTING, diagnose.COMPILING,
              diagnose.ABLATION}
    assert set(lab.hints) <= topics
    contract = registry.contract(lab)
    assert lab.lab == contract.LAB
    if lab.bars:
        for entry, workload in registry.graded_bars(lab.lab, "grade"):
            assert isinstance(entry, str) and entry
            assert workload is None or hasattr(workload, "replace")


def test_every_topic_the_diagnosis_points_to_is_taught_by_a_lab() -> None:
    for topic in (diagnose.LOADING, diagnose.PRECISION, diagnose.LAYOUT, diagnose.CHECKPOINTING, diagnose.COMPILING,
                  diagnose.ABLATION):
        assert diagnose.lab_teaching(topic) in diagnose.LABS, topic


def _write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / registry.PROBES_FILE
    path.write_text(text, encoding="utf-8")
    return path


def test_a_course_lab_declares_its_manifest_beside_its_probes(tmp_path: Path) -> None:
    folder = tmp_path / "source" / "lab07_extra"
    _write(folder, 'PROBES = {}\nMANIFEST = {"lab": "lab07_extra", "title": "Lab 7", '
                   '"workloads": {"grade": {"cpu": ("small", 32, 8)}}, "report_sections": ["speedups"]}\n')
    got = registry.manifest("lab07_extra", folder)
    assert (got.title, got.workload("grade", "cpu"), got.report_sections) == ("Lab 7", ("small", 32, 8), ("speedups",))
    assert registry.manifest("lab08_bare", tmp_path / "nowhere") == LabManifest(lab="lab08_bare")
    with pytest.raises(ValueError, match="names lab 'lab07_extra', not 'lab09_other'"):
        registry.manifest("lab09_other", folder)


@pytest.mark.parametrize(("text", "says"), [
    ('MANIFEST = {"lab": "lab07_extra", "colour": 1}', "unknown field"),
    ('MANIFEST = {"lab": "lab07_extra", "fed": "yes"}', "MANIFEST['fed'] must be a bool"),
    ('MANIFEST = {"lab": "Lab Seven"}', "must be the lab's name"),
    ('MANIFEST = {"lab": "lab07_extra", "workloads": {"grade": {"cpu": ("small", 32)}}}', "workload grade/cpu"),
    ('import os\nMANIFEST = {"lab": os.environ["LAB"]}', "a literal dict"),
    ('MANIFEST = ["lab07_extra"]', "must be a dict"),
])
def test_a_malformed_manifest_is_one_line_naming_its_file_and_field(tmp_path: Path, text: str, says: str) -> None:
    path = _write(tmp_path, text + "\n")
    with pytest.raises(ValueError, match=re.escape(says)) as raised:
        registry.read(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_a_course_lab_in_force_is_read_from_its_folder_wherever_the_core_reads_a_lab(tmp_path: Path) -> None:
    from perflab.verify import calibrate

    folder = tmp_path / "lab07_extra"
    _write(folder, 'MANIFEST = {"lab": "lab07_extra", "bars": "bars"}\nPROBES = {}\nEXPECTATION = "lab07_extra"\n'
                   'def baseline_config(mode):\n    return ("base", mode)\n'
                   'def bars(mode):\n    return [(EXPECTATION, baseline_config(mode))]\n')
    (folder / f"{registry.JUDGES}.py").write_text(
        'JUDGES = {}\ndef calibration_pair(mode):\n    return ("base", mode), ("candidate", mode)\n', encoding="utf-8")
    assert registry.graded_bars("lab07_extra", "grade") == [] and "lab07_extra" not in calibrate.lab_names()
    with registry.course_labs({"lab07_extra": folder, "lab03_amp": tmp_path / "ignored"}):
        assert [m.lab for m in registry.labs()] == [*registry.names(), "lab07_extra"]  # the kit's lab stays the kit's
        assert registry.graded_bars("lab07_extra", "grade") == [("lab07_extra", ("base", "grade"))]
        assert registry.grader_side("lab07_extra").calibration_pair("grade")[1] == ("candidate", "grade")
        assert calibrate.lab_pairs("grade")["lab07_extra"] == (("base", "grade"), ("candidate", "grade"))
    assert registry.labs() == registry.manifests() and registry.graded_bars("lab07_extra", "grade") == []


def test_the_kits_labs_and_a_courses_are_read_through_the_same_folder_parts(tmp_path: Path) -> None:
    """One path for every lab: its folder's manifest, `probes` and grader-only `judges` (a file or a
    package), whether the folder is the kit's (`perflab/labs/labNN/`) or a course's own."""
    from perflab.grading import harness, judging

    for lab in registry.names():
        folder = registry.folder(lab)
        assert folder == registry.KIT / registry.find(lab).key and (folder / "probes.py").is_file()
        assert set(harness.probes_for(lab)) == set(judging.judges_for(lab)), lab
    assert registry.grader_only_folders() == [registry.folder(lab) / "judges" for lab in registry.names()]

    course = tmp_path / "lab07_extra"
    _write(course, 'MANIFEST = {"lab": "lab07_extra"}\nPROBES = {"test_x": lambda answers, seed: 1}\n')
    (course / "judges").mkdir()
    (course / "judges" / "__init__.py").write_text('JUDGES = {"test_x": lambda observed, ctx: None}\n', encoding="utf-8")
    assert registry.folder("lab07_extra") is None and harness.probes_for("lab07_extra", tmp_path) is None
    with registry.course_labs({"lab07_extra": course}):
        assert registry.folder("lab07_extra") == course.resolve()
        assert set(harness.probes_for("lab07_extra")) == set(judging.judges_for("lab07_extra")) == {"test_x"}
    assert set(judging.judges_for("lab07_extra", course)) == {"test_x"}  # the grader, given the source folder
