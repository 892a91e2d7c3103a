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

import functools
import hashlib
import io
import json
import logging
import math
import multiprocessing
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import PIL
from PIL import Image, ImageDraw

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SIZES = ("tiny", "small", "photo", "full")
SPLITS = ("train", "val")
# ImageNet statistics: the usual choice for ResNet-18, and right for real ImageFolders too.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

REPO_ROOT = Path(__file__).resolve().parents[1]
RECIPE_PATH = REPO_ROOT / "datasets" / "recipe.json"
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
# Tries to draw a foreground colour far enough from the background before taking its complement.
COLOUR_TRIES = 32


class DatasetError(ValueError):
    """A data file or manifest is wrong (corrupt, changed, undecodable); the message names the file."""


# ---------------------------------------------------------------------------------------------
# The recipe


@dataclass(frozen=True)
class Recipe:
    """What one size of the synthetic set holds and how its images are drawn (from datasets/recipe.json)."""

    size: str
    version: int
    classes: tuple[str, ...]
    train_per_class: int
    val_per_class: int
    side: int
    supersample: int
    jpeg_quality: int
    jpeg_subsampling: str
    center: float
    radius: tuple[float, float]
    texture_period: tuple[float, float]
    noise_sigma: tuple[float, float]
    min_contrast: float

    def per_class(self, split: str) -> int:
        return self.train_per_class if split == "train" else self.val_per_class

    @property
    def digest(self) -> str:
        """sha256 of everything that decides the pixels; a manifest with another digest is stale."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def recipe(size: str, path: Path = RECIPE_PATH) -> Recipe:
    """The recipe of `size` (tiny, small, photo or full): a size's own "jpeg" and "jitter" override the shared ones."""
    _check_size(size)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        spec = data["sizes"][size]
        jitter, jpeg = {**data["jitter"], **spec.get("jitter", {})}, {**data["jpeg"], **spec.get("jpeg", {})}
        rec = Recipe(
            size=size,
            version=int(data["recipe_version"]),
            classes=tuple(spec["classes"]),
            train_per_class=int(spec["train_per_class"]),
            val_per_class=int(spec["val_per_class"]),
            side=int(spec["side"]),
            supersample=int(spec["supersample"]),
            jpeg_quality=int(jpeg["quality"]),
            jpeg_subsampling=str(jpeg["subsampling"]),
            center=float(jitter["center"]),
            radius=_pair(jitter["radius"]),
            texture_period=_pair(jitter["texture_period"]),
            noise_sigma=_pair(jitter["noise_sigma"]),
            min_contrast=float(jitter["min_contrast"]),
        )
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: the data set recipe is missing (it ships in the repository's datasets/)") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise DatasetError(f"{path}: malformed recipe for size {size!r} ({exc!r})") from exc
    unknown = [name for name in rec.classes if name not in DRAW]
    if unknown:
        raise DatasetError(f"{path}: size {size!r} names unknown class(es) {', '.join(unknown)}; known: {', '.join(DRAW)}")
    return rec


def _pair(value: Any) -> tuple[float, float]:
    low, high = (float(v) for v in value)
    return low, high


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"size: {size!r} is not one of {', '.join(SIZES)}")


# ---------------------------------------------------------------------------------------------
# Drawing one image


def image_rng(seed: int, split: str, cls: str, index: int) -> np.random.Generator:
    """The RNG of one image: independent of every other image, so any one can be regenerated alone."""
    class_key = int.from_bytes(hashlib.blake2b(cls.encode(), digest_size=4).digest(), "little")
    return np.random.default_rng(np.random.SeedSequence([seed, SPLITS.index(split), class_key, index]))


def draw(rec: Recipe, seed: int, split: str, cls: str, index: int) -> Image.Image:
    """Image `index` of class `cls` in `split`: a shape or texture over a gradient, in jittered colours, with noise."""
    rng = image_rng(seed, split, cls, index)
    side = rec.side
    # Background: a mild linear gradient between two nearby colours, in a random direction.
    c0 = rng.uniform(0, 255, 3)
    c1 = np.clip(c0 + rng.uniform(-60, 60, 3), 0, 255)
    angle = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:side, 0:side] / max(side - 1, 1)
    t = (xx - 0.5) * math.cos(angle) + (yy - 0.5) * math.sin(angle) + 0.5
    background = c0 + (c1 - c0) * np.clip(t, 0, 1)[..., None]
    # Foreground: any colour far enough from the background's mean; the class is never the colour.
    mean = (c0 + c1) / 2
    for _ in range(COLOUR_TRIES):
        foreground = rng.uniform(0, 255, 3)
        if np.linalg.norm(foreground - mean) >= rec.min_contrast:
            break
    else:
        foreground = 255 - mean
    mask = DRAW[cls](rng, rec)[..., None]
    pixels = background * (1 - mask) + foreground * mask
    sigma = rng.uniform(*rec.noise_sigma)
    pixels = pixels + rng.normal(0.0, sigma, pixels.shape)
    return Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), "RGB")


def jpeg_bytes(image: Image.Image, rec: Recipe) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=rec.jpeg_quality, subsampling=rec.jpeg_subsampling, optimize=False)
    return buffer.getvalue()


def _canvas(rec: Recipe) -> tuple[Image.Image, ImageDraw.ImageDraw, int]:
    big = rec.side * rec.supersample
    canvas = Image.new("L", (big, big), 0)
    return canvas, ImageDraw.Draw(canvas), big


def _shrink(canvas: Image.Image, rec: Recipe) -> np.ndarray:
    """Area-average the supersampled mask down to the stored side (anti-aliased edges), as floats in [0, 1]."""
    small = canvas.resize((rec.side, rec.side), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float64) / 255.0


def _placement(rng: np.random.Generator, rec: Recipe, big: int) -> tuple[float, float, float, float]:
    """Centre, radius and rotation of a shape on the supersampled canvas."""
    cx, cy = (0.5 + rng.uniform(-rec.center, rec.center, 2)) * big
    radius = rng.uniform(*rec.radius) * big
    angle = rng.uniform(0, 2 * math.pi)
    return float(cx), float(cy), float(radius), float(angle)


def _polygon(cx: float, cy: float, angle: float, points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    cos, sin = math.cos(angle), math.sin(angle)
    return [(cx + x * cos - y * sin, cy + x * sin + y * cos) for x, y in points]


def _star_points(n: int, outer: float, inner: float) -> list[tuple[float, float]]:
    step = math.pi / n
    return [((outer if k % 2 == 0 else inner) * math.cos(k * step), (outer if k % 2 == 0 else inner) * math.sin(k * step))
            for k in range(2 * n)]


def _circle(rng: np.random.Generator, rec: Recipe) -> np.ndarray:
    canvas, pen, big = _canvas(rec)
    cx, cy, r, _ = _placement(rng, rec, big)
    pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=255)
    return _shrink(canvas, rec)


def _ring(rng: np.random.Generator, rec: Recipe) -> np.ndarray:
    canvas, pen, big = _canvas(rec)
    cx, cy, r, _ = _placement(rng, rec, big)
    inner = r * rng.uniform(0.45, 0.65)
    pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=255)
    pen.ellipse((cx - inner, cy - inner, cx + inner, cy + inner), fill=0)
    return _shrink(canvas, rec)


def _regular(sides: int, scale: float) -> Callable[[np.random.Generator, Recipe], np.ndarray]:
    def shape(rng: np.random.Generator, rec: Recipe) -> np.ndarray:
        canvas, pen, big = _canvas(rec)
        cx, cy, r, angle = _placement(rng, rec, big)
        corners = [(r * scale * math.cos(2 * math.pi * k / sides), r * scale * math.sin(2 * math.pi * k / sides))
                   for k in range(sides)]
        pen.polygon(_polygon(cx, cy, angle, corners), fill=255)
        return _shrink(canvas, rec)

    return shape


def _star(rng: np.random.Generator, rec: Recipe) -> np.ndarray:
    canvas, pen, big = _canvas(rec)
    cx, cy, r, angle = _placement(rng, rec, big)
    pen.polygon(_polygon(cx, cy, angle, _star_points(5, 1.2 * r, 0.48 * r)), fill=255)
    return _shrink(canvas, rec)


def _cross(rng: np.random.Generator, rec: Recipe) -> np.ndarray:
    canvas, pen, big = _canvas(rec)
    cx, cy, r, angle = _placement(rng, rec, big)
    arm, w = 1.1 * r, 0.3 * r
    outline = [(-w, -arm), (w, -arm), (w, -w), (arm, -w), (arm, w), (w, w),
               (w, arm), (-w, arm), (-w, w), (-arm, w), (-arm, -w), (-w, -w)]
    pen.polygon(_polygon(cx, cy, angle, outline), fill=255)
    return _shrink(canvas, rec)


def _texture_grid(rng: np.random.Generator, rec: Recipe) -> tuple[np.ndarray, np.ndarray, float]:
    """Rotated, shifted coordinates over the supersampled canvas, and the texture's period in its pixels."""
    big = rec.side * rec.supersample
    period = rng.uniform(*rec.texture_period) * big
    angle = rng.uniform(0, math.pi)
    shift = rng.uniform(0, period, 2)
    yy, xx = np.mgrid[0:big, 0:big] + 0.5
    u = xx * math.cos(angle) + yy * math.sin(angle) + shift[0]
    v = -xx * math.sin(angle) + yy * math.cos(angle) + shift[1]
    return u, v, period


def _from_bool(mask: np.ndarray, rec: Recipe) -> np.ndarray:
    return _shrink(Image.fromarray(mask.astype(np.uint8) * 255, "L"), rec)


def _stripes(rng: np.random.Generator, rec: Recipe) -> np.ndarray:
    u, _, period = _texture_grid(rng, rec)
    return _from_bool((u / period) % 1.0 < 0.5, rec)


def _checker(rng: np.random.Generator, rec: Recipe) -> np.ndarray:
    u, v, period = _texture_grid(rng, rec)
    return _from_bool((np.floor(u / period) + np.floor(v / period)) % 2 == 0, rec)


def _dots(rng: np.random.Generator, rec: Recipe) -> np.ndarray:
    canvas, pen, big = _canvas(rec)
    step = rng.uniform(*rec.texture_period) * big
    radius = step * rng.uniform(0.18, 0.28)
    offset = rng.uniform(0, step, 2)
    count = int(big / step) + 2
    jitter = rng.uniform(-0.2, 0.2, (count, count, 2)) * step
    for i in range(count):
        for j in range(count):
            x = offset[0] + (i - 0.5) * step + jitter[i, j, 0]
            y = offset[1] + (j - 0.5) * step + jitter[i, j, 1]
            pen.ellipse((x - radius, y - radius, x + radius, y + radius), fill=255)
    return _shrink(canvas, rec)


def _blob(rng: np.random.Generator, rec: Recipe) -> np.ndarray:
    """A soft Gaussian spot: the one class told apart by its edge profile, not its outline."""
    cx, cy, r, _ = _placement(rng, rec, rec.side)
    yy, xx = np.mgrid[0:rec.side, 0:rec.side] + 0.5
    return np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * (0.55 * r) ** 2))


DRAW: dict[str, Callable[[np.random.Generator, Recipe], np.ndarray]] = {
    "circle": _circle,
    "square": _regular(4, 1.15),
    "triangle": _regular(3, 1.3),
    "ring": _ring,
    "cross": _cross,
    "star": _star,
    "stripes": _stripes,
    "checker": _checker,
    "dots": _dots,
    "blob": _blob,
}


# ---------------------------------------------------------------------------------------------
# Building, locating and verifying a built set


def default_root(size: str) -> Path:
    """Where `size` is built by default: `$PERFLAB_DATA_DIR/<size>`, else `datasets/build/<size>`."""
    _check_size(size)
    base = os.environ.get(DATA_DIR_ENV)
    return (Path(base).expanduser() if base else DEFAULT_BUILD_DIR) / size


def data_root(size: str) -> Path:
    """The folder of the built `size` set; FileNotFoundError naming it and the command when it is not built."""
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
    """Whether `root` holds a finished build of `size` from `seed` and the current recipe (files are not hashed)."""
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
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = root.parent / f".{root.name}.building-{uuid.uuid4().hex}"
    staging.mkdir()
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
    if source in SIZES:
        return _image_folder(data_root(source) / ("train" if train else "val"), transform)
    if source.startswith("cifar10:"):
        return _cifar10(Path(source[len("cifar10:"):]).expanduser(), train, transform)
    return _image_folder(_split_folder(Path(source).expanduser(), train), transform)


def _split_folder(path: Path, train: bool) -> Path:
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path}: no such data folder; check the path, or build the synthetic set with: "
            "perflab dataset build --size tiny"
        )
    if train:
        return path / "train" if (path / "train").is_dir() else path
    if (path / "val").is_dir():
        return path / "val"
    if (path / "train").is_dir():
        raise FileNotFoundError(f"{path / 'val'}: no evaluation split next to {path / 'train'}; add a val/ folder")
    return path


def _image_folder(folder: Path, transform: Callable[[Any], torch.Tensor]) -> torch.utils.data.Dataset:
    from torchvision.datasets import ImageFolder

    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder}: no such data folder; check the path, or build the synthetic set with: "
            "perflab dataset build --size tiny"
        )
    return ImageFolder(str(folder), transform=transform, loader=decode_image)


def _cifar10(root: Path, train: bool, transform: Callable[[Any], torch.Tensor]) -> torch.utils.data.Dataset:
    from torchvision.datasets import CIFAR10

    batches = root / CIFAR10.base_folder
    if not batches.is_dir():
        raise FileNotFoundError(
            f"{batches}: CIFAR-10 not found; extract cifar-10-python.tar.gz under {root} "
            "(nothing is downloaded at run time)"
        )
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
