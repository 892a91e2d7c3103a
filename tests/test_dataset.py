"""The synthetic data set: deterministic from its seed, checked against its manifest, loadable, learnable."""

from __future__ import annotations

import hashlib
import json
import shutil
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from perflab import dataset
from perflab.cli import main
from perflab.workload import TrainConfig, train

IMAGE = 32


def _manifest(root: Path) -> dict:
    return json.loads((root / dataset.MANIFEST).read_text())


def _copy(root: Path, to: Path) -> Path:
    shutil.copytree(root, to)
    return to


# --- building ---------------------------------------------------------------------------------


def test_same_seed_gives_byte_identical_files_and_another_seed_differs(tmp_path: Path) -> None:
    a = dataset.build("tiny", root=tmp_path / "a", seed=3, progress=False)
    b = dataset.build("tiny", root=tmp_path / "b", seed=3, progress=False)
    c = dataset.build("tiny", root=tmp_path / "c", seed=4, progress=False)
    files_a, files_b, files_c = (_manifest(r)["files"] for r in (a, b, c))
    rec = dataset.recipe("tiny")
    assert len(files_a) == len(rec.classes) * (rec.train_per_class + rec.val_per_class)
    assert files_a == files_b
    for rel, digest in files_a.items():
        assert hashlib.sha256((b / rel).read_bytes()).hexdigest() == digest
        assert (a / rel).read_bytes() == (b / rel).read_bytes()
    assert files_a.keys() == files_c.keys()
    assert sum(files_a[k] == files_c[k] for k in files_a) == 0


def test_any_image_can_be_regenerated_alone(tiny_data: Path) -> None:
    rec = dataset.recipe("tiny")
    files = _manifest(tiny_data)["files"]
    cls = rec.classes[-1]
    data = dataset.jpeg_bytes(dataset.draw(rec, 0, "val", cls, 2), rec)
    assert hashlib.sha256(data).hexdigest() == files[f"val/{cls}/0002.jpg"]


def test_parallel_build_matches_serial(tmp_path: Path, tiny_data: Path) -> None:
    root = dataset.build("tiny", root=tmp_path / "p", progress=False, workers=2)
    assert _manifest(root)["files"] == _manifest(tiny_data)["files"]


def test_manifest_describes_the_build(tiny_data: Path) -> None:
    manifest = _manifest(tiny_data)
    rec = dataset.recipe("tiny")
    assert manifest["size"] == "tiny" and manifest["seed"] == 0
    assert manifest["classes"] == list(rec.classes)
    assert manifest["image_side"] == rec.side
    assert manifest["count"] == {"train": 16 * 4, "val": 4 * 4}
    assert manifest["recipe_version"] == rec.version and manifest["recipe_sha256"] == rec.digest
    assert manifest["pillow"] and manifest["numpy"]
    from PIL import Image

    with Image.open(tiny_data / "train" / rec.classes[0] / "0000.jpg") as image:
        assert image.format == "JPEG" and image.size == (rec.side, rec.side) and image.mode == "RGB"


def test_build_is_idempotent_and_rebuilds_a_half_built_folder(tmp_path: Path) -> None:
    root = dataset.build("tiny", root=tmp_path / "t", progress=False)
    manifest = root / dataset.MANIFEST
    stamp = manifest.stat().st_mtime_ns
    assert dataset.build("tiny", root=root, progress=False) == root
    assert manifest.stat().st_mtime_ns == stamp  # kept, not rebuilt
    manifest.unlink()  # as if a build had stopped before its last write
    assert not dataset.is_built("tiny", root)
    dataset.build("tiny", root=root, progress=False)
    dataset.verify(root)
    assert dataset.build("tiny", root=root, seed=1, progress=False) == root
    assert _manifest(root)["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]  # no staging folders left behind


def test_concurrent_builds_of_one_folder_both_succeed(tmp_path: Path) -> None:
    root = tmp_path / "t"
    with ThreadPoolExecutor(2) as pool:
        roots = list(pool.map(lambda _: dataset.build("tiny", root=root, progress=False), range(2)))
    assert roots == [root, root]
    dataset.verify(root)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_build_rebuilds_a_corrupt_set(tmp_path: Path, tiny_data: Path) -> None:
    root = _copy(tiny_data, tmp_path / "t")
    victim = root / "train" / "circle" / "0001.jpg"
    victim.write_bytes(b"not a jpeg")
    dataset.build("tiny", root=root, progress=False)
    dataset.verify(root)
    assert victim.read_bytes() == (tiny_data / "train" / "circle" / "0001.jpg").read_bytes()


def test_build_refuses_to_replace_a_folder_that_is_not_a_data_set(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(dataset.DatasetError, match="not a perflab data set"):
        dataset.build("tiny", root=tmp_path, progress=False)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_bad_size_and_seed_name_the_field() -> None:
    with pytest.raises(ValueError, match="size: 'huge'"):
        dataset.build("huge")
    with pytest.raises(ValueError, match="seed"):
        dataset.build("tiny", seed=-1)


# --- verifying --------------------------------------------------------------------------------


def test_verify_names_a_flipped_byte_a_missing_file_and_a_stray_file(tmp_path: Path, tiny_data: Path) -> None:
    root = _copy(tiny_data, tmp_path / "t")
    dataset.verify(root)
    victim = root / "val" / "cross" / "0003.jpg"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(dataset.DatasetError, match=r"val/cross/0003\.jpg: sha256 differs"):
        dataset.verify(root)
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=r"val/cross/0003\.jpg: missing"):
        dataset.verify(root)
    shutil.copy(tiny_data / "val" / "cross" / "0003.jpg", victim)
    dataset.verify(root)
    (root / "train" / "circle" / "extra.jpg").write_bytes(b"x")
    with pytest.raises(dataset.DatasetError, match=r"train/circle/extra\.jpg: not in"):
        dataset.verify(root)


def test_verify_without_manifest_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no manifest"):
        dataset.verify(tmp_path)


# --- loading ----------------------------------------------------------------------------------


def test_load_shapes_and_dtypes(tiny_data: Path) -> None:
    rec = dataset.recipe("tiny")
    train_set = dataset.load("tiny", IMAGE, train=True)
    assert list(train_set.classes) == sorted(rec.classes)
    assert len(train_set) == 16 * 4
    image, label = train_set[0]
    assert type(image) is torch.Tensor and image.dtype == torch.float32 and image.shape == (3, IMAGE, IMAGE)
    assert image.min() < 0 < image.max()  # normalised, not in [0, 1]
    assert 0 <= label < len(rec.classes)

    eval_set = dataset.load("tiny", IMAGE, train=False)
    assert len(eval_set) == 4 * 4
    first, again = eval_set[5][0], eval_set[5][0]
    assert first.dtype == torch.float32 and first.shape == (3, IMAGE, IMAGE)
    assert torch.equal(first, again)  # evaluation is deterministic

    raw, _ = dataset.load("tiny", IMAGE, train=True, device_augment=True)[0]
    assert type(raw) is torch.Tensor and raw.dtype == torch.uint8 and raw.shape == (3, IMAGE, IMAGE)
    raw_eval, _ = dataset.load("tiny", IMAGE, train=False, device_augment=True)[5]
    assert raw_eval.dtype == torch.uint8
    # On-device normalisation of the uint8 view equals the CPU path (same resize and crop).
    assert torch.allclose(dataset.normalize(raw_eval.float() / 255), first, atol=1e-5)


def test_load_accepts_an_imagefolder_path(tiny_data: Path, tmp_path: Path) -> None:
    by_path = dataset.load(str(tiny_data), IMAGE, train=False)
    assert torch.equal(by_path[3][0], dataset.load("tiny", IMAGE, train=False)[3][0])
    flat = _copy(tiny_data / "val", tmp_path / "flat")  # no train/ or val/: the folder itself
    assert len(dataset.load(flat, IMAGE, train=True)) == len(dataset.load(flat, IMAGE, train=False)) == 16


def test_corrupt_jpeg_raises_naming_the_file(tiny_data: Path, tmp_path: Path) -> None:
    root = _copy(tiny_data / "train", tmp_path / "imgs")
    victim = root / "stripes" / "0004.jpg"
    victim.write_bytes(victim.read_bytes()[:200])  # truncated mid-scan
    data = dataset.load(root, IMAGE)
    index = data.samples.index((str(victim), data.class_to_idx["stripes"]))
    with pytest.raises(dataset.DatasetError, match=r"stripes/0004\.jpg: cannot decode"):
        data[index]
    loader = torch.utils.data.DataLoader(data, batch_size=len(data), num_workers=1)
    with pytest.raises(dataset.DatasetError, match=r"stripes/0004\.jpg: cannot decode"):
        next(iter(loader))


def test_missing_folders_raise_naming_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=r"nowhere: no such data folder.*perflab dataset build --size tiny"):
        dataset.load(missing, IMAGE)
    monkeypatch.setenv(dataset.DATA_DIR_ENV, str(tmp_path / "data"))
    with pytest.raises(FileNotFoundError, match=r"data/small: the 'small' data set is not built.*--size small"):
        dataset.load("small", IMAGE)
    with pytest.raises(FileNotFoundError, match=r"cifar-10-batches-py: CIFAR-10 not found"):
        dataset.load(f"cifar10:{tmp_path}", IMAGE)
    (tmp_path / "cifar-10-batches-py").mkdir()
    with pytest.raises(dataset.DatasetError, match=r"cifar-10-batches-py: CIFAR-10 files missing or corrupt"):
        dataset.load(f"cifar10:{tmp_path}", IMAGE)
    (tmp_path / "split" / "train" / "a").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"split/val: no evaluation split"):
        dataset.load(tmp_path / "split", IMAGE, train=False)


def test_normalize_works_on_a_batch_and_checks_its_input() -> None:
    x = torch.rand(4, 3, 8, 8, dtype=torch.float64)
    y = dataset.normalize(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    expected = (x[:, 1] - dataset.MEAN[1]) / dataset.STD[1]
    assert torch.allclose(y[:, 1], expected)
    with pytest.raises(ValueError, match="float"):
        dataset.normalize(torch.zeros(3, 4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"\(\.\.\., 3, H, W\)"):
        dataset.normalize(torch.zeros(4, 1, 4, 4))


# --- the command ------------------------------------------------------------------------------


def test_cli_build_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "cli"
    assert main(["dataset", "build", "--size", "tiny", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"built tiny set in {root}" in out and "64 train + 16 val JPEGs" in out
    assert main(["dataset", "verify", "--size", "tiny", "--root", str(root)]) == 0
    assert "ok: 80 files" in capsys.readouterr().out
    (root / "train" / "checker" / "0000.jpg").write_bytes(b"changed")
    assert main(["dataset", "verify", "--size", "tiny", "--root", str(root)]) == 2
    assert "checker/0000.jpg: sha256 differs" in capsys.readouterr().err
    assert main(["dataset", "verify", "--size", "tiny", "--root", str(tmp_path / "none")]) == 2
    assert "perflab dataset build --size tiny --root" in capsys.readouterr().err


# --- learnable --------------------------------------------------------------------------------


def test_classes_are_learnable(tiny_data: Path) -> None:
    """A short ResNet-18 run on the tiny set drives its training loss well below chance level."""
    # One thread: on a shared 2-core machine two spinning threads per step can take ten times longer.
    threads = torch.get_num_threads()
    # Measured here over seeds 0-3: last/first ratio 0.36-0.38 (0.38-0.43 over the last 10 steps).
    config = TrainConfig(data="tiny", batch_size=32, image_size=IMAGE, optimizer="adam", lr=1e-3, seed=0,
                         threads=1)
    try:
        losses = train(config, steps=20).losses
    finally:
        torch.set_num_threads(threads)
    first, last = statistics.mean(losses[:5]), statistics.mean(losses[-8:])
    assert last < 0.7 * first, f"loss did not fall: first steps {first:.2f}, last steps {last:.2f} ({losses})"


# --- the photo size: what a photograph costs to load -------------------------------------------


def test_a_size_overrides_the_shared_jpeg_and_jitter_settings_only_for_itself(tmp_path: Path) -> None:
    photo, small = dataset.recipe("photo"), dataset.recipe("small")
    assert (photo.jpeg_quality, photo.noise_sigma) == (95, (8.0, 20.0))
    assert (small.jpeg_quality, small.noise_sigma) == (90, (0.0, 10.0))  # the shared settings
    assert (photo.center, photo.radius, photo.jpeg_subsampling) == (small.center, small.radius, small.jpeg_subsampling)
    doc = json.loads(dataset.RECIPE_PATH.read_text())
    doc["sizes"]["small"]["jpeg"] = {"quality": "high"}
    bad = tmp_path / "recipe.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(dataset.DatasetError, match="malformed recipe for size 'small'"):
        dataset.recipe("small", bad)


def test_photo_jpegs_are_photograph_sized_and_cost_several_times_more_to_load() -> None:
    """`photo` exists so that lab 2 has a real data bottleneck: its JPEGs are about a photograph's size
    (ImageNet: about 400x350 px, 110 KB), and loading one costs several times a `small` one (a ratio
    taken in one run, not a time)."""
    import io
    import time

    from PIL import Image

    transform = dataset.train_transform(IMAGE)
    files, cost = {}, {}
    for size in ("small", "photo"):
        rec = dataset.recipe(size)
        files[size] = [dataset.jpeg_bytes(dataset.draw(rec, 0, "train", cls, i), rec)
                       for i, cls in enumerate(rec.classes)]
    for size in ("small", "photo", "small", "photo"):  # interleaved; each keeps its faster pass
        start = time.perf_counter()
        for data in files[size]:
            transform(Image.open(io.BytesIO(data)).convert("RGB"))
        cost[size] = min(cost.get(size, float("inf")), time.perf_counter() - start)
    kib = {size: statistics.mean(len(b) for b in found) / 1024 for size, found in files.items()}
    assert dataset.recipe("photo").side == 384 and 60 < kib["photo"] < 130 and kib["small"] < 10, kib
    assert cost["photo"] > 1.5 * cost["small"], cost  # 2.6x measured on a 2-core CPU
