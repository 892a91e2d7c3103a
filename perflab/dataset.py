"""The workload's data: a synthetic ImageFolder of real JPEG files, built offline from a seed, and its loaders.

`build(size)` draws learnable classes (shapes and textures under colour, position, scale and noise
jitter, as `datasets/recipe.json` says) into `datasets/build/<size>/{train,val}/<class>/NNNN.jpg`
(or `$PERFLAB_DATA_DIR/<size>`) and writes `manifest.json` last, with a sha256 per file. Each image
has its own RNG seeded by (seed, split, class, index), so any image can be regenerated alone and
the build can run in parallel; the same seed gives byte-identical files with the same numpy and
Pillow. `load(source, image_size)` returns a torchvision dataset over that data, over any real
ImageFolder on disk, or over CIFAR-10 in torchvision's format (`cifar10:PATH`); nothing is
downloaded.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import PIL
from PIL import Image

if TYPE_CHECKING:
    import torch

from perflab.dataset_recipe import (  # noqa: F401 - the recipe and drawing, re-exported where callers read them
    COLOUR_TRIES,
    DRAW,
    RECIPE_PATH,
    REPO_ROOT,
    SIZES,
    SPLITS,
    DatasetError,
    Recipe,
    _check_size,
    draw,
    image_rng,
    jpeg_bytes,
    recipe,
)

log = logging.getLogger(__name__)

# ImageNet statistics: the usual choice for ResNet-18, and right for real ImageFolders too.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

DEFAULT_BUILD_DIR = REPO_ROOT / "datasets" / "build"
DATA_DIR_ENV = "PERFLAB_DATA_DIR"
MANIFEST = "manifest.json"
FORMAT = "perflab-synthetic-imagefolder"
# Evaluation resizes to image_size / 0.875 and centre-crops, the ImageNet convention (256 -> 224).
EVAL_CROP_FRACTION = 0.875
# Below this many images a process pool costs more to start than it saves.
PARALLEL_MIN_IMAGES = 4000
# More build workers than this only contend for the disk.
MAX_BUILD_WORKERS = 8


# ---------------------------------------------------------------------------------------------
# Building, locating and verifying a built set


def default_root(size: str) -> Path:
    """Where `size` is built by default: `$PERFLAB_DATA_DIR/<size>`, else `datasets/build/<size>`."""
    _check_size(size)
    base = os.environ.get(DATA_DIR_ENV)
    return (Path(base).expanduser() if base else DEFAULT_BUILD_DIR) / size


def data_root(size: str) -> Path:
    """The folder of the built `size` set, or of an ImageFolder (`size` its path, `check_image_folder`d);
    FileNotFoundError naming it and the command when it is not built."""
    if size not in SIZES:
        return checked_folder(size)
    root = default_root(size)
    if not (root / MANIFEST).is_file():
        raise FileNotFoundError(
            f"{root}: the {size!r} data set is not built (no {MANIFEST}); "
            f"build it with: perflab dataset build --size {size}"
        )
    manifest = read_manifest(root)
    if manifest.get("recipe_sha256") != recipe(size).digest:
        raise DatasetError(
            f"{root}: built from an older recipe than datasets/recipe.json; "
            f"rebuild it with: perflab dataset build --size {size}"
        )
    return root


def read_manifest(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a built set; FileNotFoundError if absent, DatasetError if unreadable."""
    path = Path(root) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no manifest (not a built data set, or a build that did not finish)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: unreadable manifest ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        raise DatasetError(f"{path}: not a perflab data set manifest (format {FORMAT!r} with a 'files' table expected)")
    return manifest


def verify(root: str | os.PathLike[str]) -> None:
    """Check every file of a built set against its manifest; the error names the first missing, changed or extra file."""
    root = Path(root)
    manifest = read_manifest(root)
    hint = _rebuild_hint(manifest, root)
    files: dict[str, str] = manifest["files"]
    for rel in sorted(files):
        path = root / rel
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing (listed in {root / MANIFEST}); {hint}")
        if _sha256(path) != files[rel]:
            raise DatasetError(f"{path}: sha256 differs from {root / MANIFEST} (the file changed or is corrupt); {hint}")
    for split in SPLITS:
        for path in sorted((root / split).rglob("*")):
            if path.is_file() and path.relative_to(root).as_posix() not in files:
                raise DatasetError(f"{path}: not in {root / MANIFEST} (a stray file would be loaded as data); {hint}")


def is_built(size: str, root: str | os.PathLike[str] | None = None, seed: int = 0) -> bool:
    """Whether `root` holds a finished build of `size` from `seed` and the current recipe (files are not hashed).
    For data that is not built (an ImageFolder's path, `cifar10:PATH`): True where it is there and whole,
    else FileNotFoundError or DatasetError in one line saying what is wrong."""
    if root is None and size not in SIZES:
        if size.startswith("cifar10:"):
            _cifar10_folder(Path(size[len("cifar10:"):]).expanduser())
        else:
            checked_folder(size)
        return True
    root = Path(root) if root is not None else default_root(size)
    try:
        manifest = read_manifest(root)
    except (FileNotFoundError, DatasetError):
        return False
    return (manifest.get("size") == size and manifest.get("seed") == seed
            and manifest.get("recipe_sha256") == recipe(size).digest)


def build(size: str, root: str | os.PathLike[str] | None = None, seed: int = 0,
          progress: bool | None = None, *, workers: int | None = None) -> Path:
    """Build the `size` set into `root` (default: `default_root(size)`) and return `root`.

    Idempotent: a finished build of the same size, seed and recipe that verifies is kept as is; a
    missing, half-built, stale or corrupt one is rebuilt. Files are written into a temporary
    sibling folder, the manifest last, which then replaces `root` in one rename. `progress`: show
    a bar (None: only in an interactive terminal and never in grade mode). `workers`: build
    processes (None: one for small sets, a pool for large ones).
    """
    rec = recipe(size)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    root = Path(root).expanduser() if root is not None else default_root(size)
    found = is_built(size, root, seed)
    if found:
        try:
            verify(root)
            log.info("%s: %s set already built from seed %d; verified", root, size, seed)
            return root
        except (FileNotFoundError, DatasetError) as exc:
            log.warning("%s; rebuilding", exc)
    _check_replaceable(root)
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = root.parent / f".{root.name}.building-{uuid.uuid4().hex}"
        staging.mkdir()
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        raise DatasetError(f"{root}: the {size} set is not built and its folder cannot be written here ({exc.strerror}): "
                           f"build it where it can be, before this run (`perflab dataset build --size {size}`; "
                           "a grader builds each set its jobs need before grading)") from None
    start = time.perf_counter()
    try:
        files = _generate(rec, seed, staging, _show_progress(progress), workers)
        manifest = {
            "format": FORMAT,
            "size": size,
            "seed": seed,
            "recipe_version": rec.version,
            "recipe_sha256": rec.digest,
            "classes": list(rec.classes),
            "image_side": rec.side,
            "count": {split: rec.per_class(split) * len(rec.classes) for split in SPLITS},
            "pillow": PIL.__version__,
            "numpy": np.__version__,
            "files": files,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        _swap_in(staging, root, size, seed, keep_finished=not found)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("%s: built %d images of the %s set in %.1f s", root, len(files), size, time.perf_counter() - start)
    return root


def _generate(rec: Recipe, seed: int, out: Path, progress: bool, workers: int | None) -> dict[str, str]:
    from tqdm import tqdm

    jobs = [(split, cls, i) for split in SPLITS for cls in rec.classes for i in range(rec.per_class(split))]
    for split in SPLITS:
        for cls in rec.classes:
            (out / split / cls).mkdir(parents=True, exist_ok=True)
    task = functools.partial(_write_image, rec, seed, str(out))
    count = _worker_count(workers, len(jobs))
    files: dict[str, str] = {}
    with tqdm(total=len(jobs), desc=f"dataset {rec.size}", unit="img", disable=not progress) as bar:
        if count == 1:
            results = map(task, jobs)
            for rel, digest in results:
                files[rel] = digest
                bar.update()
        else:
            from concurrent.futures import ProcessPoolExecutor

            # spawn, not fork: the parent may hold torch's thread pools, which do not survive a fork.
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(count, mp_context=context) as pool:
                for rel, digest in pool.map(task, jobs, chunksize=64):
                    files[rel] = digest
                    bar.update()
    return dict(sorted(files.items()))


def _write_image(rec: Recipe, seed: int, out: str, job: tuple[str, str, int]) -> tuple[str, str]:
    split, cls, index = job
    data = jpeg_bytes(draw(rec, seed, split, cls, index), rec)
    rel = f"{split}/{cls}/{index:04d}.jpg"
    Path(out, rel).write_bytes(data)
    return rel, hashlib.sha256(data).hexdigest()


def _worker_count(workers: int | None, jobs: int) -> int:
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers: must be a positive integer, got {workers!r}")
        return workers
    if jobs < PARALLEL_MIN_IMAGES:
        return 1
    from perflab import env

    return max(1, min(env.usable_cores(), MAX_BUILD_WORKERS))


def _show_progress(progress: bool | None) -> bool:
    if progress is not None:
        return bool(progress)
    from perflab import env

    try:
        grading = env.run_mode() == "grade"
    except ValueError:
        grading = False
    return not grading and sys.stderr.isatty()


def _check_replaceable(root: Path) -> None:
    """Refuse to replace a folder that is not ours: only empty, half-built or perflab-built folders are rebuilt."""
    if not root.exists():
        return
    if not root.is_dir():
        raise DatasetError(f"{root}: exists and is not a folder; choose another root")
    entries = {p.name for p in root.iterdir()}
    if entries <= {*SPLITS, MANIFEST}:
        return
    raise DatasetError(
        f"{root}: exists and holds files that are not a perflab data set ({', '.join(sorted(entries)[:3])}, ...); "
        "choose an empty or new folder"
    )


def _swap_in(staging: Path, root: Path, size: str, seed: int, *, keep_finished: bool) -> None:
    """Replace `root` with the finished `staging` folder; with `keep_finished`, a concurrent build that won the race is kept."""
    if keep_finished and is_built(size, root, seed):
        log.info("%s: another process finished the same build first; keeping it", root)
        return
    old = root.parent / f".{root.name}.old-{uuid.uuid4().hex}"
    if root.exists():
        os.rename(root, old)
    try:
        os.rename(staging, root)
    except OSError:
        if not is_built(size, root, seed):
            raise
        log.info("%s: another process finished the same build first; keeping it", root)
    finally:
        shutil.rmtree(old, ignore_errors=True)


def _rebuild_hint(manifest: dict[str, Any], root: Path) -> str:
    size = manifest.get("size")
    if size not in SIZES:
        return "rebuild the data set"
    command = f"perflab dataset build --size {size}"
    if root.resolve() != default_root(size).resolve():
        command += f" --root {root}"
    if manifest.get("seed", 0) != 0:
        command += f" --seed {manifest['seed']}"
    return f"rebuild with: {command}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Loading


def decode_image(path: str) -> Image.Image:
    """PIL decode to RGB (the ImageFolder loader); an undecodable file raises DatasetError naming it."""
    try:
        with open(path, "rb") as f:
            image = Image.open(f)
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise DatasetError(f"{path}: cannot decode image ({exc}); replace or delete the file") from exc


def train_transform(image_size: int, device_augment: bool = False) -> Callable[[Any], torch.Tensor]:
    """Random crop, flip, colour jitter and normalise (float CHW); with `device_augment` only the crop (uint8 CHW)."""
    import torch
    from torchvision.transforms import v2

    ops: list[Any] = [v2.ToImage(), v2.RandomResizedCrop(image_size, scale=(0.6, 1.0), antialias=True)]
    if not device_augment:
        ops += [v2.RandomHorizontalFlip(), v2.ColorJitter(0.2, 0.2, 0.2),
                v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    return v2.Compose([*ops, v2.ToPureTensor()])


def device_side_size(image_size: int) -> int:
    """The side of the uint8 squares a training set kept on the device holds: the evaluation resize
    (image_size / EVAL_CROP_FRACTION; the full set's 256 px images at 224), from which each step's
    random crop of `image_size` is taken there."""
    return round(image_size / EVAL_CROP_FRACTION)


class SquareUint8:
    """An image as a `side` x `side` uint8 tensor: untouched when it already is one, else resized (short
    side) and centre-cropped."""

    def __init__(self, side: int) -> None:
        self.side = side

    def __call__(self, image: Any) -> Any:
        from torchvision.transforms.v2 import functional as F

        if tuple(image.shape[-2:]) == (self.side, self.side):
            return image
        return F.center_crop(F.resize(image, self.side, antialias=True), [self.side, self.side])


def square_transform(image_size: int) -> Callable[[Any], torch.Tensor]:
    """Decode only, to uint8 CHW squares of `device_side_size(image_size)`: the training set as it is kept
    on the device (`TrainConfig.data_on_device`), every augmentation left to the device."""
    from torchvision.transforms import v2

    return v2.Compose([v2.ToImage(), SquareUint8(device_side_size(image_size)), v2.ToPureTensor()])


def eval_transform(image_size: int, device_augment: bool = False) -> Callable[[Any], torch.Tensor]:
    """Resize and centre-crop, then normalise (float CHW); with `device_augment` left as uint8 CHW."""
    import torch
    from torchvision.transforms import v2

    ops: list[Any] = [v2.ToImage(), v2.Resize(round(image_size / EVAL_CROP_FRACTION), antialias=True),
                      v2.CenterCrop(image_size)]
    if not device_augment:
        ops += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    return v2.Compose([*ops, v2.ToPureTensor()])


def load(source: str | os.PathLike[str], image_size: int, train: bool = True,
         device_augment: bool = False, squares: bool = False) -> torch.utils.data.Dataset:
    """A dataset of `(image, label)` with `.classes`, over the train or evaluation split of `source`.

    `source`: a built synthetic size (tiny, small, photo, full), `cifar10:PATH` (torchvision's CIFAR-10
    files under PATH), or the path of an ImageFolder (its `train/` and `val/` subfolders when it has
    them, else the folder itself). Images come back as normalised float CHW tensors, or as uint8
    CHW tensors with `device_augment` (flip, jitter and normalisation then happen on the device), or
    as decoded uint8 squares with `squares` (`square_transform`: the set kept on the device).
    """
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size: must be a positive integer, got {image_size!r}")
    if squares:
        transform = square_transform(image_size)
    else:
        transform = (train_transform if train else eval_transform)(image_size, device_augment)
    source = os.fspath(source)
    if source.startswith("cifar10:"):
        return _cifar10(Path(source[len("cifar10:"):]).expanduser(), train, transform)
    from torchvision.datasets import ImageFolder

    return ImageFolder(str(split_folder(source, train)), transform=transform, loader=decode_image,
                       is_valid_file=is_image_file)


def split_folder(source: str | os.PathLike[str], train: bool = True) -> Path:
    """The class folders of `source`'s train or evaluation split: a built size's `train/` or `val/`, an
    ImageFolder's `train/` and `val/` where it has them, else the folder itself (one split for both)."""
    source = os.fspath(source)
    if source in SIZES:
        return data_root(source) / ("train" if train else "val")
    root = checked_folder(source)
    if (root / "train").is_dir():
        return root / ("train" if train else "val")
    return root


# The image files an ImageFolder's class folders hold (what the kit's loaders and the mystery pipeline read).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def is_image_file(path: str) -> bool:
    return path.lower().endswith(IMAGE_SUFFIXES)


def checked_folder(source: str | os.PathLike[str]) -> Path:
    """The ImageFolder at `source`: class folders of JPEG/PNG images, in `train/` and `val/` or at its top.
    FileNotFoundError or DatasetError in one line naming what is wrong: no such folder, no class folders,
    a class folder with no images, image files beside class folders, a train/ without a val/."""
    root = Path(source).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such data folder; check the path (an ImageFolder: class folders of "
                                "JPEG/PNG images), or build the synthetic set with: perflab dataset build --size tiny")
    splits = [root / split for split in SPLITS if (root / split).is_dir()]
    if len(splits) == 1:
        missing = root / ({*SPLITS} - {splits[0].name}).pop()
        raise FileNotFoundError(f"{missing}: no {'evaluation' if missing.name == 'val' else 'training'} split next "
                                f"to {splits[0]}; add a {missing.name}/ folder")
    for folder in splits or [root]:
        check_image_folder(folder)
    return root


def check_image_folder(folder: Path) -> None:
    """DatasetError in one line where `folder` is not class folders each holding JPEG/PNG images."""
    entries = [p for p in folder.iterdir() if not p.name.startswith(".")]
    classes = sorted(p for p in entries if p.is_dir())
    loose = [p.name for p in entries if p.is_file() and is_image_file(p.name)]
    kinds = "/".join(s.lstrip(".") for s in IMAGE_SUFFIXES)
    if not classes:
        what = f"images ({loose[0]}, ...) but" if loose else "nothing but files, and"
        raise DatasetError(f"{folder}: not an ImageFolder: {what} no class folders (expected "
                           f"{folder}/<class>/<image>.{kinds})")
    if loose:
        raise DatasetError(f"{folder}: mixed: image files ({loose[0]}, ...) beside class folders "
                           f"({classes[0].name}, ...); move every image into its class's folder")
    for cls in classes:
        if not any(p.is_file() and is_image_file(p.name) for p in cls.iterdir()):
            raise DatasetError(f"{cls}: class folder with no images ({kinds}); add images or remove the folder")


def _cifar10_folder(root: Path) -> Path:
    """The CIFAR-10 batches under `root`; FileNotFoundError in one line where they are not there."""
    from torchvision.datasets import CIFAR10

    batches = root / CIFAR10.base_folder
    if not batches.is_dir():
        raise FileNotFoundError(
            f"{batches}: CIFAR-10 not found; extract cifar-10-python.tar.gz under {root} "
            "(nothing is downloaded at run time)"
        )
    return batches


def _cifar10(root: Path, train: bool, transform: Callable[[Any], torch.Tensor]) -> torch.utils.data.Dataset:
    from torchvision.datasets import CIFAR10

    batches = _cifar10_folder(root)
    try:
        return CIFAR10(str(root), train=train, transform=transform, download=False)
    except RuntimeError as exc:
        raise DatasetError(f"{batches}: CIFAR-10 files missing or corrupt ({exc}); extract cifar-10-python.tar.gz again") from exc


def normalize(x: torch.Tensor) -> torch.Tensor:
    """(x - MEAN) / STD per channel for float images in [0, 1], shaped (..., 3, H, W), on x's device and dtype."""
    import torch

    if x.dim() < 3 or x.shape[-3] != 3:
        raise ValueError(f"normalize: expected images shaped (..., 3, H, W), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"normalize: expected float images in [0, 1], got {x.dtype} (use x.float().div(255))")
    mean = torch.tensor(MEAN, device=x.device, dtype=x.dtype).view(3, 1, 1)
    std = torch.tensor(STD, device=x.device, dtype=x.dtype).view(3, 1, 1)
    return (x - mean) / std
