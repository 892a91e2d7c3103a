"""A course chooses its model ($PERFLAB_MODEL, `TrainConfig.model`) and its data set ($PERFLAB_DATA: a size or
an ImageFolder): the builder, the bars keyed by both, the labs that need ResNet's stages, a real ImageFolder
through the labs' setup, the grader's data step, the sandbox and the mystery pipeline."""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from PIL import Image

from perflab import dataset, env, workload
from perflab.workload import TrainConfig

CLASSES = ("dots", "bars")


def image_folder(root: Path, *, splits: bool = True, per_class: int = 6, side: int = 40) -> Path:
    """A small ImageFolder made here (not by the kit's recipe): per class a colour and a pattern with noise,
    every other image a PNG, the rest JPEGs."""
    rng = random.Random(7)
    for split in ("train", "val") if splits else ("",):
        for c, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                image = Image.new("RGB", (side + rng.randrange(9), side), (200 * c + 20, 90, 200 - 150 * c))
                pixels = image.load()
                for x in range(image.width):
                    for y in range(image.height):
                        on = (x // 4) % 2 if c else (x // 5 + y // 5) % 2
                        r, g, b = pixels[x, y]
                        pixels[x, y] = (r, (g + 120 * on + rng.randrange(40)) % 256, b)
                image.save(folder / f"{i:03d}.{'png' if i % 2 else 'jpg'}")
    return root


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return image_folder(tmp_path / "imagenette-like")


# --- the model ------------------------------------------------------------------------------------


def test_the_model_is_the_courses_and_defaults_to_resnet18(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env.MODEL_ENV, raising=False)
    assert TrainConfig().model == "resnet18"
    monkeypatch.setenv(env.MODEL_ENV, "resnet34")
    assert TrainConfig().model == "resnet34" and TrainConfig(model="resnet18").model == "resnet18"
    # A configuration written before the model was a field timed ResNet-18, whatever the course is now.
    assert TrainConfig.from_dict({"data": "tiny", "batch_size": 8}).model == "resnet18"
    assert TrainConfig.from_dict(TrainConfig().to_dict()).model == "resnet34"


def test_an_unknown_model_is_one_line_saying_how_to_list_them(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"^model: 'resnet19' is not a torchvision classification model "
                                         r"\(list them with `torchvision.models.list_models"):
        TrainConfig(model="resnet19")
    monkeypatch.setenv(env.MODEL_ENV, "vgg7")
    with pytest.raises(ValueError, match="model: 'vgg7'"):
        TrainConfig()


def test_one_builder_builds_the_configured_model() -> None:
    deeper = workload.build_model(TrainConfig(model="resnet34", device="cpu"), 3)
    assert len(deeper.layer3) == 6 and deeper.fc.out_features == 3  # ResNet-34's stage 3: six blocks
    small = workload.build_model(TrainConfig(model="mobilenet_v3_small", device="cpu"), 4)
    assert type(small).__name__ == "MobileNetV3" and small.classifier[-1].out_features == 4
    again = workload.build_model(TrainConfig(model="mobilenet_v3_small", device="cpu"), 4)
    assert all((a == b).all() for a, b in zip(small.parameters(), again.parameters(), strict=True))  # seeded


def test_checkpointing_by_stages_refuses_a_model_without_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab.labs import lab04, lab06

    assert workload.has_stages("resnet34") and not workload.has_stages("mobilenet_v3_small")
    with pytest.raises(ValueError, match=r"checkpoints ResNet stages \(layer1..layer4\); mobilenet_v3_small has none"):
        workload.build_model(TrainConfig(model="mobilenet_v3_small", checkpoint_stages=2, device="cpu"), 4)
    monkeypatch.setenv(env.MODEL_ENV, "mobilenet_v3_small")
    for lab in (lab04, lab06):
        with pytest.raises(ValueError) as caught:
            lab.baseline_config("tiny")
        assert str(caught.value) == (f"{lab.LAB} checkpoints ResNet stages (layer1..layer4); mobilenet_v3_small "
                                     "has none: choose a ResNet ($PERFLAB_MODEL)")
    monkeypatch.setenv(env.MODEL_ENV, "resnet34")
    assert lab04.baseline_config("tiny").model == lab06.baseline_config("tiny").model == "resnet34"
    assert lab04.resnet18().fc.in_features == 512 and len(lab04.resnet18().layer3) == 2  # the checks' own model


# --- bars keyed by model and data -----------------------------------------------------------------


def _expectations(folder: Path, baseline: dict) -> Path:
    from perflab.verify import expectations
    from perflab.verify.protocol import VERIFY_THREADS

    entry = {"baseline": baseline, "candidate": {**baseline, "amp_dtype": "bf16"}, "threshold": 1.2,
             "kind": "speedup", "reference": 1.5, "rule": "a rule", "runs": []}
    doc = {"schema": expectations.SCHEMA, "version": expectations.VERSION, "hardware_class": "cpu", "mode": "grade",
           "verify_threads": VERIFY_THREADS, "optimisations": {"lab03_amp": entry}}
    folder.mkdir(parents=True, exist_ok=True)
    path = expectations.expectations_path("cpu", folder)
    path.write_text(json.dumps(doc))
    return folder


def test_a_bar_holds_only_for_the_model_and_data_it_was_calibrated_on(tmp_path: Path) -> None:
    from perflab.verify import load_expectation

    base = TrainConfig(data="small", image_size=64, batch_size=32)
    before_models = {"data": "small", "image_size": 64, "batch_size": 32}  # a file written before: ResNet-18's
    old = _expectations(tmp_path / "old", before_models)
    assert load_expectation("lab03_amp", "cpu", directory=old, workload=base).calibrated
    other = load_expectation("lab03_amp", "cpu", directory=old, workload=base.replace(model="resnet34"))
    assert not other.calibrated and "calibrated on resnet18 at 64 px" in other.reason
    assert "this run is resnet34 at 64 px" in other.reason
    on_folder = load_expectation("lab03_amp", "cpu", directory=old, workload=base.replace(data=str(tmp_path)))
    assert not on_folder.calibrated and f"{tmp_path} data" in on_folder.reason
    new = _expectations(tmp_path / "new", base.replace(model="resnet34").to_dict())
    assert load_expectation("lab03_amp", "cpu", directory=new, workload=base.replace(model="resnet34")).calibrated
    assert not load_expectation("lab03_amp", "cpu", directory=new, workload=base).calibrated


def test_the_committed_calibrations_hold_for_resnet18_on_the_default_data(monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab.grading import bars
    from perflab.verify import expectations

    monkeypatch.delenv(env.DATA_ENV, raising=False)
    files = sorted(expectations.default_dir().glob("*.json"))
    assert files
    for path in files:
        doc = expectations.load_file(path)
        for name, entry in doc["optimisations"].items():
            if "threshold" in entry and "model" not in entry["baseline"]:
                workload_here = TrainConfig.from_dict({**entry["baseline"], "device": None})
                assert workload_here.model == "resnet18"
                assert expectations._other_workload(entry, workload_here) is None, (path, name)
                assert expectations._other_workload(entry, workload_here.replace(model="resnet34")), (path, name)
    # The 2-core CPU's bars hold for the default course; for another model its cells are held to the
    # conservative rule, and so the grader calibrates them first.
    labs = ["lab02_feed", "lab03_amp", "lab06_together"]
    assert bars.uncalibrated(labs, "grade", machine="cpu-bf16") == []
    monkeypatch.setenv(env.MODEL_ENV, "resnet34")
    held = bars.uncalibrated(labs, "grade", machine="cpu-bf16")
    assert len(held) == 3 and all("this run is resnet34" in line for line in held), held


# --- the data set ---------------------------------------------------------------------------------


def test_the_courses_data_replaces_every_modes_and_labs(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab import mystery

    monkeypatch.setenv(env.DATA_ENV, str(folder))
    for mode in env.MODES:
        for lab in (None, "lab02_feed", "lab03_amp", "lab06_together"):
            assert env.mode_sizes(mode, lab=lab, device="cpu").data == str(folder)
    assert mystery.sizes_for("tiny")[0] == str(folder)
    monkeypatch.chdir(folder.parent)
    monkeypatch.setenv(env.DATA_ENV, folder.name)  # a relative path: every process of a job reads the same one
    assert env.course_data() == str(folder.resolve())
    monkeypatch.setenv(env.DATA_ENV, "small")
    assert env.mode_sizes("laptop", lab="lab02_feed", device="cpu").data == "small"


def test_an_imagefolder_is_ready_as_it_is(folder: Path, tmp_path: Path) -> None:
    assert dataset.is_built(str(folder)) and dataset.data_root(str(folder)) == folder
    assert dataset.split_folder(folder, train=False) == folder / "val"
    train = dataset.load(folder, 32)
    assert train.classes == sorted(CLASSES) and len(train) == 12
    assert {Path(p).suffix for p, _ in train.samples} == {".jpg", ".png"}
    assert train[1][0].shape == (3, 32, 32)
    flat = image_folder(tmp_path / "flat", splits=False)  # class folders at the top: one split for both
    assert dataset.is_built(str(flat)) and dataset.split_folder(flat, train=False) == flat
    assert len(dataset.load(flat, 32, train=False)) == 12


def test_a_folder_that_is_not_an_imagefolder_is_one_line_naming_what_is_wrong(folder: Path, tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    Image.new("RGB", (8, 8)).save(loose / "a.jpg")
    with pytest.raises(dataset.DatasetError, match=r"loose: not an ImageFolder: images \(a.jpg, ...\) but no class"):
        dataset.is_built(str(loose))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("x")
    with pytest.raises(dataset.DatasetError, match="notes: not an ImageFolder: nothing but files, and no class"):
        dataset.load(tmp_path / "notes", 32)
    (loose / "cats").mkdir()
    (loose / "cats" / "list.txt").write_text("x")
    with pytest.raises(dataset.DatasetError, match=r"loose: mixed: image files \(a.jpg, ...\) beside class folders"):
        dataset.is_built(str(loose))
    (loose / "a.jpg").unlink()
    with pytest.raises(dataset.DatasetError, match=r"loose/cats: class folder with no images \(jpg/jpeg/png\)"):
        dataset.is_built(str(loose))
    for name in ("val", "train"):
        half = image_folder(tmp_path / f"no-{name}")
        for path in sorted((half / name).rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        (half / name).rmdir()
        with pytest.raises(FileNotFoundError, match=rf"no-{name}/{name}: no .* split next to .*; add a {name}/ folder"):
            dataset.is_built(str(half))
    with pytest.raises(FileNotFoundError, match="nowhere: no such data folder"):
        dataset.is_built(str(tmp_path / "nowhere"))


def test_a_course_trains_its_model_on_its_imagefolder(folder: Path) -> None:
    run = workload.train(TrainConfig(data=str(folder), model="resnet34", batch_size=4, device="cpu"), 2)
    assert len(run.losses) == 2 and all(loss > 0 for loss in run.losses)
    work = workload.build(TrainConfig(data=str(folder), model="mobilenet_v3_small", batch_size=4, device="cpu"))
    assert work.num_classes == 2 and 0 <= workload.evaluate(work, batches=1) <= 1


def test_the_graders_data_step_takes_a_folder_and_names_a_bad_one(folder: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab.grading import pipeline
    from perflab.grading.job import Settings

    monkeypatch.setenv(env.DATA_ENV, str(folder))
    settings = Settings(env={"PERFLAB_MODE": "grade"}, device="cpu")
    assert pipeline.data_sizes(["lab01_measure", "lab03_amp"], settings) == [str(folder)]
    pipeline.build_data(["lab01_measure", "lab03_amp"], settings)  # nothing to build, nothing raised
    monkeypatch.setenv(env.MODEL_ENV, "resnet34")
    assert {k: v for k, v in pipeline.with_instructor_policy(settings).env.items() if k in env.COURSE_ENV} == {
        env.DATA_ENV: str(folder), env.MODEL_ENV: "resnet34"}
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv(env.DATA_ENV, str(tmp_path / "empty"))
    with pytest.raises(dataset.DatasetError, match="empty: not an ImageFolder"):
        pipeline.build_data(["lab03_amp"], settings)


def test_the_sandbox_sees_the_courses_folder_read_only(folder: Path, tmp_path: Path, request: pytest.FixtureRequest,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab.grading import run, sandbox

    monkeypatch.setenv(env.DATA_ENV, str(folder))
    assert folder.resolve() in sandbox.needed_paths()
    repo = tmp_path / "repo"
    for name in ("perflab", "solutions", "mydata"):
        (repo / name).mkdir(parents=True)
    monkeypatch.setenv(env.DATA_ENV, str(repo / "mydata"))  # a course's data inside the checkout stays visible
    assert run.grader_only_paths(repo)[-1:] == [repo / "solutions"]
    # In /tmp itself, which each sandbox gets a private copy of: the course's folder is kept there.
    folder = image_folder(Path(tempfile.mkdtemp(prefix="perflab-course-data-")))
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    folder.chmod(0o755)
    (folder / "train" / "dots").chmod(0o777)  # writable by anyone: only the read-only mount stops a write
    monkeypatch.setenv(env.DATA_ENV, str(folder))
    work = tmp_path / "work"
    work.mkdir()
    program = ("import json, os\nfrom perflab import dataset, env\nroot = env.course_data()\n"
               "out = {'data': root, 'ok': dataset.is_built(root), 'n': len(dataset.load(root, 32))}\n"
               "try:\n    open(os.path.join(root, 'train', 'dots', 'new.jpg'), 'wb')\n    out['write'] = 'written'\n"
               "except OSError as exc:\n    out['write'] = type(exc).__name__\n"
               "os.write(int(os.environ['PERFLAB_RESULT_FD']), json.dumps(out).encode())\n")
    box = sandbox.run([sys.executable, "-c", program], workdir=work, limits=sandbox.Limits(wall_s=120),
                      env={"HOME": str(work), **run.course_env()})
    assert box.returncode == 0, box.output_tail
    out = json.loads(box.result)
    assert out["data"] == str(folder) and out["ok"] and out["n"] == 12
    if sandbox.isolation().kind != "none":
        assert out["write"] == "OSError" and not (folder / "train" / "dots" / "new.jpg").exists(), out


def test_the_mystery_pipeline_trains_the_courses_model_on_its_folder(folder: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab import mystery

    monkeypatch.setenv(env.DATA_ENV, str(folder))
    monkeypatch.setenv(env.MODEL_ENV, "resnet34")
    drawn = mystery.for_student("alice", "tiny")
    assert f'DATA = "{folder}"' in drawn.source and 'MODEL = "resnet34"' in drawn.source
    trainer = drawn.module().Trainer(0)
    assert len(trainer.dataset) == 12 and len(trainer.model.layer3) == 6


def test_a_folder_smaller_than_one_batch_is_one_line_saying_so(folder: Path) -> None:
    config = TrainConfig(data=str(folder), batch_size=64, image_size=32)
    with pytest.raises(ValueError, match=r"holds 12 training image\(s\), fewer than one batch of 64"):
        workload.build_loader(config)


def test_a_mystery_pipeline_on_a_folder_smaller_than_its_batch_is_not_written(
        folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from perflab.labs.lab01 import mystery as lab01_mystery

    monkeypatch.setenv(env.DATA_ENV, str(folder))
    with pytest.raises(ValueError, match=r"holds 12 training image\(s\), fewer than one batch of 16 of the mystery"):
        lab01_mystery.write_pipeline("alice", tmp_path / "pipeline.py")
    assert not (tmp_path / "pipeline.py").exists()

