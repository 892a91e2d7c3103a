"""Lab 2's augmentation on the device: the batches the grader hands a student's `make_augment` pipeline,
what the pipeline makes of them (`observe_augment`) and what is wrong with that (`augment_problems`).

Public: the visible test, the probe (in the student's kernel) and the judge (in the grader) run these, the
probe and the judge on the case drawn from the grader's seed (`augment_case`). Two batches check a pipeline
without knowing its random draws:

* ramps: every image the same smooth picture, red rising along the width, green along the height, blue
  flat. A crop resized, flipped or not, is again such a picture; colour jitter without hue (brightness,
  contrast, saturation) maps each output's grey by one factor and one offset. So each output's grey says
  whether it was flipped and the width/height ratio of its crop, and an output whose blue is still the
  input's was left unjittered: its red and green say exactly which box it was cropped from.
* flat colours: every image one colour. A crop of it is that colour; jitter scales its grey by the
  brightness factor and its colourfulness by the contrast and saturation factors. So each output gives
  its factors, and says whether it was jittered at all.

The distribution asked for is that of `perflab.device_augment` (its constants), the kit's batched form the
notebook times the student's pipeline against. Rates are checked within bounds a right pipeline leaves
only once in about a million gradings.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from perflab.device_augment import CROP_RATIO, CROP_SCALE, FLIP_P, JITTER, JITTER_P, LUMA

# Images per batch: enough that a rate (flips, unjittered images) falls outside its bounds by chance only once
# in about a million draws of a right pipeline.
RAMP_IMAGES = 64
COLOUR_IMAGES = 128
# The flat-colour batch is cropped to this side (its crop is invisible: only its colour matters).
COLOUR_CROP = 4
COLOUR_SIDE = 16
# Every input channel stays within this range and jitter moves it by at most (1 + JITTER)**2 about its grey,
# so no output is clamped: clamping would bend the planes the checks read.
LOW, HIGH = 0.4, 0.6
# Output values are sent rounded to this many decimals; agreement within EXACT means "unchanged".
DECIMALS = 6
EXACT = 3e-4
# A pipeline's grey must be a plane (a crop resampled) within this RMS, on the outputs' inner pixels (the edge
# pixels of a crop resized without aligned corners repeat their neighbours).
PLANE_RMS = 1e-3
# Slack on the crop's measured ratio and area: a box is whole pixels, and where a resize puts its first
# and last samples (aligned corners or not) changes the span read from the output by up to a pixel or two.
RATIO_SLACK = 0.12
AREA_SLACK = (0.8, 1.05)
# Bounds on counts out of RAMP_IMAGES or COLOUR_IMAGES, each a right pipeline's count with probability above
# 1 - 1e-6 (binomial tails): flips at FLIP_P, images left unjittered at 1 - JITTER_P.
FLIPS_BOUNDS = (12, 52)
UNJITTERED_BOUNDS = (6, 50)
# The spread a pipeline drawing per image shows over a batch: the log of the crops' width/height ratio
# (uniform over log CROP_RATIO: a standard deviation near 0.17), the brightness factor (uniform over
# 1 +- JITTER: near 0.115).
MIN_LOG_RATIO_SPREAD = 0.05
MIN_BRIGHTNESS_SPREAD = 0.04


@dataclass(frozen=True)
class AugmentCase:
    """One set of inputs for `make_augment`: the ramp batch (`height` x `width` pictures, cropped to `crop`),
    red = red0 + red_slope * x / (width - 1), green = green0 + green_slope * y / (height - 1), blue flat; and
    the flat-colour batch (`colour`). `seed` seeds torch's generator before the pipeline runs."""

    seed: int
    crop: int
    height: int
    width: int
    red0: float
    red_slope: float
    green0: float
    green_slope: float
    blue: float
    colour: tuple[float, float, float]


VISIBLE_AUGMENT_CASE = AugmentCase(seed=0, crop=8, height=40, width=40, red0=0.4, red_slope=0.2, green0=0.4,
                                   green_slope=0.2, blue=0.42, colour=(0.56, 0.47, 0.44))


def augment_case(seed: int) -> AugmentCase:
    """The hidden test's case, drawn from `seed`: the picture's size (not always square), the crop, which way
    each ramp rises, and the colours."""
    rng = random.Random(seed)
    height, width = rng.choice([(40, 40), (48, 36), (36, 48), (44, 40)])

    def ramp() -> tuple[float, float]:
        slope = rng.uniform(0.15, HIGH - LOW) * rng.choice([-1, 1])
        return (LOW if slope > 0 else HIGH), slope

    (red0, red_slope), (green0, green_slope) = ramp(), ramp()
    while True:  # a colour clearly off grey, each channel within [LOW, HIGH]
        colour = tuple(round(rng.uniform(LOW + 0.02, HIGH - 0.02), 3) for _ in range(3))
        grey = sum(w * c for w, c in zip(LUMA, colour, strict=True))
        if max(abs(c - grey) for c in colour) > 0.04:
            break
    return AugmentCase(seed=rng.randrange(2**31), crop=rng.choice([8, 10]), height=height, width=width,
                       red0=red0, red_slope=red_slope, green0=green0, green_slope=green_slope,
                       blue=rng.choice([0.42, 0.58]), colour=colour)  # type: ignore[arg-type]


def ramp_batch(case: AugmentCase, device: torch.device | str = "cpu") -> torch.Tensor:
    """RAMP_IMAGES copies of the case's picture, float32 in [0, 1], (n, 3, height, width) on `device`."""
    x = torch.linspace(0, 1, case.width).view(1, -1).expand(case.height, -1)
    y = torch.linspace(0, 1, case.height).view(-1, 1).expand(-1, case.width)
    picture = torch.stack([case.red0 + case.red_slope * x, case.green0 + case.green_slope * y,
                           torch.full_like(x, case.blue)])
    return picture.expand(RAMP_IMAGES, -1, -1, -1).contiguous().to(device)


def colour_batch(case: AugmentCase, device: torch.device | str = "cpu") -> torch.Tensor:
    """COLOUR_IMAGES images of the case's flat colour, float32, (n, 3, COLOUR_SIDE, COLOUR_SIDE) on `device`."""
    colour = torch.tensor(case.colour, dtype=torch.float32).view(1, 3, 1, 1)
    return colour.expand(COLOUR_IMAGES, 3, COLOUR_SIDE, COLOUR_SIDE).contiguous().to(device)


# ---------------------------------------------------------------------------------------------
# What a pipeline makes of the case (the probe's side: raw outputs, no verdict)


def _on(pipeline: Any, device: torch.device) -> Any:
    return pipeline.to(device) if isinstance(pipeline, nn.Module) else pipeline


def module_names(pipeline: Any) -> list[str]:
    """The classes a pipeline is made of, as `module.Class` (its own first), at most 50."""
    parts = list(pipeline.modules())[:50] if isinstance(pipeline, nn.Module) else [pipeline]
    return [f"{type(p).__module__}.{type(p).__name__}" for p in parts]


def images_of(value: Any, expected: int, crop: int) -> dict[str, Any]:
    """A pipeline's output as data: its type, shape, dtype and device, and, where it has the expected shape
    (expected, 3, crop, crop), each image's values (rounded to DECIMALS) as one flat list."""
    if not isinstance(value, torch.Tensor):
        return {"type": type(value).__name__}
    out: dict[str, Any] = {"type": "Tensor", "shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", ""),
                           "device": value.device.type}
    if tuple(value.shape) == (expected, 3, crop, crop) and value.is_floating_point():
        flat = value.detach().to("cpu", torch.float64).reshape(expected, -1)
        out["values"] = [[round(v, DECIMALS) for v in row] for row in flat.tolist()]
    return out


def observe_augment(make_augment: Callable[[int], Any], case: AugmentCase, device: torch.device | str = "cpu") -> dict[str, Any]:
    """What `make_augment`'s pipelines make of the case's batches on `device`, as data: {"device", "modules",
    "ramps": the ramp batch's output, "colours": two calls on the flat-colour batch}, or {"raised", "message"}."""
    device = torch.device(device)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(case.seed)
            ramps = _on(make_augment(case.crop), device)
            out: dict[str, Any] = {"device": device.type, "modules": module_names(ramps),
                                   "ramps": images_of(ramps(ramp_batch(case, device)), RAMP_IMAGES, case.crop)}
            flat = _on(make_augment(COLOUR_CROP), device)
            colours = colour_batch(case, device)
            out["colours"] = [images_of(flat(colours), COLOUR_IMAGES, COLOUR_CROP) for _ in range(2)]
            return out
    except Exception as exc:  # the student's pipeline may fail in any way: that is an answer too
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}


# ---------------------------------------------------------------------------------------------
# What is wrong with it (the judge's side, and the visible test's)


def _denormalised(seen: Any, device: str, crop: int, images: int, what: str) -> tuple[torch.Tensor | None, list[str]]:
    """The output's images back in [0, 1] colour, (n, 3, crop, crop) float64, or the problem with the output."""
    from perflab.dataset import MEAN, STD

    shape = [images, 3, crop, crop]
    if not isinstance(seen, dict) or seen.get("type") != "Tensor":
        got = seen.get("type") if isinstance(seen, dict) else seen
        return None, [f"{what}: the pipeline returned a {got}, not a tensor of images"]
    if seen.get("shape") != shape:
        return None, [f"{what}: a batch of {images} images came back shaped {seen.get('shape')}, expected {shape}: "
                      f"RandomResizedCrop(({crop}, {crop})) gives every image the same size"]
    if seen.get("dtype") != "float32":
        return None, [f"{what}: the output is {seen.get('dtype')}, expected float32 (the model's input)"]
    if seen.get("device") != device:
        return None, [f"{what}: the batch was on {device} and came back on {seen.get('device')}: augment on the "
                      "batch's own device"]
    rows = seen.get("values")
    size = 3 * crop * crop
    if (not isinstance(rows, list) or len(rows) != images
            or not all(isinstance(r, list) and len(r) == size for r in rows)
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                       for r in rows for v in r)):
        return None, [f"{what}: the output's values could not be read (finite numbers expected)"]
    x = torch.tensor(rows, dtype=torch.float64).view(images, 3, crop, crop)
    x = x * torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1) + torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    low, high = float(x.min()), float(x.max())
    if low < -EXACT or high > 1 + EXACT:
        return None, [f"{what}: un-normalised, the output spans [{low:.3f}, {high:.3f}], outside [0, 1]: normalise "
                      "last, with Normalize(mean=MEAN, std=STD) of perflab.dataset, images in [0, 1]"]
    return x, []


def _plane(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Least-squares planes a + p * column + q * row through each image's inner pixels: ((n, 3) of (a, p, q),
    (n,) RMS residuals). `values` is (n, side, side)."""
    inner = values[:, 1:-1, 1:-1]
    n, rows, cols = inner.shape
    i, j = torch.meshgrid(torch.arange(rows, dtype=values.dtype), torch.arange(cols, dtype=values.dtype), indexing="ij")
    design = torch.stack([torch.ones_like(i), j, i], -1).view(-1, 3)
    target = inner.reshape(n, -1).T
    coef = torch.linalg.lstsq(design, target).solution.T
    residual = (design @ coef.T - target).pow(2).mean(0).sqrt()
    return coef, residual


def _ramp_problems(x: torch.Tensor, case: AugmentCase) -> list[str]:
    n = x.shape[0]
    luma = torch.tensor(LUMA, dtype=x.dtype).view(1, 3, 1, 1)
    coef, residual = _plane((x * luma).sum(1))
    worst = int(residual.argmax())
    if float(residual[worst]) > PLANE_RMS:
        return [f"ramps: image {worst} is not a crop of its input resized (its grey is off a plane by "
                f"{float(residual[worst]):.4f} RMS): crop, resize and flip, and change colours by brightness, "
                "contrast and saturation only"]
    # The grey's slope per output pixel over the input's, in input pixels per output pixel (times the jitter's factor).
    along_x = coef[:, 1] * (case.width - 1) / (LUMA[0] * case.red_slope)
    along_y = coef[:, 2] * (case.height - 1) / (LUMA[1] * case.green_slope)
    if bool((along_y <= 0).any()):
        return [f"ramps: image {int((along_y <= 0).nonzero()[0])} came back upside down or flat: flip left to right "
                "only (RandomHorizontalFlip)"]
    flips = int((along_x < 0).sum())
    if not FLIPS_BOUNDS[0] <= flips <= FLIPS_BOUNDS[1]:
        return [f"ramps: {flips} of {n} images were mirrored left to right: each should be, on its own, with "
                f"probability {FLIP_P} (RandomHorizontalFlip)"]
    ratio = along_x.abs() / along_y
    low, high = CROP_RATIO[0] * (1 - RATIO_SLACK), CROP_RATIO[1] * (1 + RATIO_SLACK)
    off = ((ratio < low) | (ratio > high)).nonzero()
    if len(off):
        k = int(off[0])
        return [f"ramps: image {k} was cropped to a width/height ratio of {float(ratio[k]):.2f}, outside "
                f"RandomResizedCrop's ratio range ({CROP_RATIO[0]:.2f}, {CROP_RATIO[1]:.2f})"]
    if float(ratio.log().std()) < MIN_LOG_RATIO_SPREAD:
        return ["ramps: every image was cropped to the same shape: draw each image's crop on its own "
                "(same_on_batch=False), a random box per image"]
    return _box_problems(x, case)


def _box_problems(x: torch.Tensor, case: AugmentCase) -> list[str]:
    """The unjittered outputs' boxes: their blue is the input's, their red follows x only and green y only."""
    n, crop = x.shape[0], case.crop
    red, green, blue = x[:, 0, 1:-1, 1:-1], x[:, 1, 1:-1, 1:-1], x[:, 2, 1:-1, 1:-1]
    same = (((blue - case.blue).abs().amax((1, 2)) < EXACT)
            & ((red - red.mean(1, keepdim=True)).abs().amax((1, 2)) < EXACT)
            & ((green - green.mean(2, keepdim=True)).abs().amax((1, 2)) < EXACT))
    if not bool(same.any()):
        return [f"ramps: all {n} images came back with other colours: colour jitter leaves each image as it was with "
                f"probability {1 - JITTER_P:.1f} (ColorJitter(..., p={JITTER_P})), and Normalize comes last"]
    coef, _ = _plane(x[same][:, 0])  # red: a + p * column
    span_x = (coef[:, 1] / case.red_slope).abs() * (crop - 1) * (case.width - 1) + 1
    coef, _ = _plane(x[same][:, 1])  # green: a + q * row
    span_y = (coef[:, 2] / case.green_slope).abs() * (crop - 1) * (case.height - 1) + 1
    share = span_x * span_y / (case.width * case.height)
    low, high = CROP_SCALE[0] * AREA_SLACK[0], CROP_SCALE[1] * AREA_SLACK[1]
    off = ((share < low) | (share > high)).nonzero()
    if len(off):
        k = int(off[0])
        return [f"ramps: an image was cropped from {float(share[k]):.0%} of its picture, outside RandomResizedCrop's "
                f"scale ({CROP_SCALE[0]}, {CROP_SCALE[1]})"]
    ratio = span_x / span_y
    off = ((ratio < CROP_RATIO[0] * (1 - RATIO_SLACK)) | (ratio > CROP_RATIO[1] * (1 + RATIO_SLACK))).nonzero()
    if len(off):
        return [f"ramps: an image was cropped to a {float(span_x[int(off[0])]):.0f} x {float(span_y[int(off[0])]):.0f} "
                f"pixel box, a width/height ratio outside ({CROP_RATIO[0]:.2f}, {CROP_RATIO[1]:.2f})"]
    if float(share.min()) > 0.97:
        return ["ramps: no image was cropped: each should be a random box of its picture (RandomResizedCrop)"]
    return []


def _colour_problems(x: torch.Tensor, case: AugmentCase) -> list[str]:
    n = x.shape[0]
    colour = x.mean((2, 3))
    spread = float((x - colour[:, :, None, None]).abs().max())
    if spread > EXACT:
        return [f"colours: a flat image came back with a pattern (off its mean by {spread:.4f}): crop, flip and "
                "colour jitter keep a flat colour flat"]
    c0 = torch.tensor(case.colour, dtype=x.dtype)
    luma = torch.tensor(LUMA, dtype=x.dtype)
    unjittered = (colour - c0).abs().amax(1) < EXACT
    count = int(unjittered.sum())
    if not UNJITTERED_BOUNDS[0] <= count <= UNJITTERED_BOUNDS[1]:
        return [f"colours: {count} of {n} images kept their colour: colour jitter should leave each as it was with "
                f"probability {1 - JITTER_P:.1f} (ColorJitter(..., p={JITTER_P})), and Normalize comes last"]
    jittered = colour[~unjittered]
    grey0 = float((luma * c0).sum())
    chroma0 = c0 - grey0
    grey = (jittered * luma).sum(1)
    brightness = grey / grey0
    chroma = jittered - grey[:, None]
    cosine = (chroma @ chroma0) / (chroma.norm(dim=1) * chroma0.norm()).clamp(min=1e-12)
    if float(cosine.min()) < 0.999:
        return ["colours: an image's hue changed: jitter brightness, contrast and saturation only (hue 0)"]
    both = (chroma @ chroma0) / chroma0.dot(chroma0) / brightness  # contrast x saturation factors
    b_low, b_high = 1 - JITTER - 2e-3, 1 + JITTER + 2e-3
    k_low, k_high = (1 - JITTER) ** 2 - 5e-3, (1 + JITTER) ** 2 + 5e-3
    if float(brightness.min()) < b_low or float(brightness.max()) > b_high:
        far = float(brightness[(brightness - 1).abs().argmax()])
        return [f"colours: a brightness factor of {far:.3f}, outside [{1 - JITTER:.1f}, {1 + JITTER:.1f}] "
                f"(ColorJitter(brightness={JITTER}, ...))"]
    if float(both.min()) < k_low or float(both.max()) > k_high:
        far = float(both[(both - 1).abs().argmax()])
        return [f"colours: contrast and saturation scaled an image's colourfulness by {far:.3f}, outside "
                f"[{(1 - JITTER) ** 2:.2f}, {(1 + JITTER) ** 2:.2f}] (ColorJitter(contrast={JITTER}, saturation={JITTER}))"]
    if float(brightness.std()) < MIN_BRIGHTNESS_SPREAD:
        return ["colours: the jittered images share one brightness: draw each image's factors on its own "
                "(same_on_batch=False)"]
    return []


def augment_problems(observed: Any, case: AugmentCase) -> list[str]:
    """What is wrong with what a pipeline made of `case` (`observe_augment`), in words; empty when all is well."""
    if not isinstance(observed, dict):
        return ["make_augment: no result"]
    if "raised" in observed:
        return [f"make_augment raised {observed.get('raised')}: {observed.get('message', '')}".rstrip(": ")]
    modules = observed.get("modules")
    if not isinstance(modules, list) or not any(isinstance(m, str) and m.startswith("kornia.augmentation")
                                                for m in modules):
        return ["make_augment: build the pipeline from kornia.augmentation (e.g. AugmentationSequential)"]
    device = observed.get("device")
    if device not in ("cpu", "cuda", "mps"):
        return ["make_augment: the probe's device could not be read"]
    ramps, problems = _denormalised(observed.get("ramps"), device, case.crop, RAMP_IMAGES, "ramps")
    if problems:
        return problems
    problems = _ramp_problems(ramps, case)
    if problems:
        return problems
    calls = observed.get("colours")
    if not isinstance(calls, list) or len(calls) != 2:
        return ["colours: the pipeline's two calls could not be read"]
    outputs = []
    for seen in calls:
        x, problems = _denormalised(seen, device, COLOUR_CROP, COLOUR_IMAGES, "colours")
        if problems:
            return problems
        outputs.append(x)
    if float((outputs[0] - outputs[1]).abs().max()) < EXACT:
        return ["colours: two calls on the same batch gave the same images: each call draws new augmentations "
                "(do not seed inside the pipeline)"]
    return _colour_problems(outputs[0], case)


def check_augment(make_augment: Callable[[int], Any], device: torch.device | str = "cpu") -> None:
    """The visible test: the first problem with the pipeline on the visible case, as an AssertionError."""
    problems = augment_problems(observe_augment(make_augment, VISIBLE_AUGMENT_CASE, device), VISIBLE_AUGMENT_CASE)
    assert not problems, problems[0]
