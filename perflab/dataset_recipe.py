"""The synthetic data set's recipe (`datasets/recipe.json`) and how one image of it is drawn.

`recipe(size)` reads what a size holds; `draw(rec, seed, split, cls, index)` draws image `index` of class
`cls` from its own RNG (`image_rng`), so any image can be regenerated alone. `perflab.dataset` builds,
verifies and loads whole sets from these.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

SIZES = ("tiny", "small", "photo", "full")
SPLITS = ("train", "val")
REPO_ROOT = Path(__file__).resolve().parents[1]
RECIPE_PATH = REPO_ROOT / "datasets" / "recipe.json"
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
