"""The augmentation on the device, one batch at a time: `DeviceAugment` (`TrainConfig.gpu_augment`).

The random resized crop and the flip of every image are one `grid_sample` over the batch, the colour jitter
is per-image factors in tensor arithmetic, and every parameter of a batch comes from one draw of a
generator of its own, seeded per step: no per-image Python loop, no launches per image on a GPU, nothing
that waits for the device. docs/DESIGN.md, "The augmentation on the device", has the choice and its figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from perflab.seeds import sample_seed

# The device augmentation's distribution, that of torchvision's and kornia's transforms the labs name:
# the random resized crop's area (a share of the image) and width/height ratio ranges, the candidate
# boxes drawn per image before the whole image is kept, the flip's and the colour jitter's chances, and
# the jitter's brightness, contrast and saturation factors, uniform in [1 - JITTER, 1 + JITTER].
CROP_SCALE = (0.6, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
CROP_TRIES = 10
FLIP_P = 0.5
JITTER = 0.2
JITTER_P = 0.8
# ITU-R 601 luma, the grayscale torchvision's and kornia's contrast and saturation steps mix towards.
LUMA = (0.299, 0.587, 0.114)


@dataclass(frozen=True)
class AugmentDraw:
    """What `DeviceAugment` drew for one batch, one row per image (tensors on the batch's device).

    boxes    (n, 4) crop boxes in pixels, (x0, y0, width, height); the whole image without a crop
    flip     (n,) bool, mirrored left to right
    factors  (n, 3) brightness, contrast and saturation factors, 1 where the jitter was not applied
    jitter   (n,) bool, the colour jitter applied
    order    the order of the three jitter steps for the batch (indices into brightness, contrast, saturation)
    """

    boxes: torch.Tensor
    flip: torch.Tensor
    factors: torch.Tensor
    jitter: torch.Tensor
    order: tuple[int, ...]


class DeviceAugment(nn.Module):
    """Augmentation on the device, one batch at a time: with `crop`, the random resized crop to that size and
    the flip as one `grid_sample` over the batch (a box per image); then colour jitter (brightness, contrast,
    saturation) as per-image factors in tensor arithmetic, and normalisation. Seeded per step.

    The distribution is that of kornia's per-image pipeline it replaces (`RandomResizedCrop((crop, crop),
    scale=(0.6, 1.0))`, `RandomHorizontalFlip()`, `ColorJitter(0.2, 0.2, 0.2, 0, p=0.8)`, `Normalize`), drawn
    in one call from a generator of its own on the batch's device: the global RNG is left alone and nothing
    waits for the device. Step `step` of seed `seed` draws the same on a given kind of device (a CPU and a GPU
    generator give different streams). docs/DESIGN.md, "The augmentation on the device", has the figures.
    """

    def __init__(self, seed: int, crop: int | None = None) -> None:
        super().__init__()
        from perflab.dataset import MEAN, STD

        self.seed, self.crop = seed, crop
        mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
        self.register_buffer("scale", 1 / std, persistent=False)
        self.register_buffer("shift", -mean / std, persistent=False)
        self.register_buffer("luma", torch.tensor(LUMA).view(1, 3, 1, 1), persistent=False)
        self._generators: dict[torch.device, torch.Generator] = {}

    def draw(self, n: int, height: int, width: int, step: int, device: torch.device | str = "cpu") -> AugmentDraw:
        """The parameters step `step` draws for a batch of `n` images of `height` x `width` on `device`."""
        device = torch.device(device)
        seed = sample_seed(self.seed, -1, step)
        generator = self._generators.get(device)
        if generator is None:
            generator = self._generators[device] = torch.Generator(device=device)
        generator.manual_seed(seed)
        # One draw for the batch: the crop's candidates and corner, then the flip, the factors, the jitter's chance.
        crop_columns = 2 * CROP_TRIES + 2
        u = torch.rand(n, crop_columns + 5, generator=generator, device=device)
        if self.crop:
            boxes = _crop_boxes(u[:, :crop_columns], height, width)
        else:  # the whole image, filled on the device (a tensor made from a list would be a copy that waits)
            boxes = torch.zeros(n, 4, dtype=torch.long, device=device)
            boxes[:, 2], boxes[:, 3] = width, height
        flip = u[:, crop_columns] < FLIP_P
        jitter = u[:, crop_columns + 4] < JITTER_P
        drawn = 1 - JITTER + 2 * JITTER * u[:, crop_columns + 1:crop_columns + 4]
        factors = torch.where(jitter[:, None], drawn, torch.ones_like(drawn))
        # The steps' order is one per batch, as kornia draws it, on the CPU: a Python loop runs it.
        order = tuple(torch.randperm(3, generator=torch.Generator().manual_seed(seed)).tolist())
        return AugmentDraw(boxes, flip, factors, jitter, order)

    def forward(self, images: torch.Tensor, step: int) -> torch.Tensor:
        """Float images in [0, 1], (n, 3, H, W) on the device, to the model's normalised input (step `step`'s draw)."""
        n, _, height, width = images.shape
        return self.apply(images, self.draw(n, height, width, step, images.device))

    def apply(self, images: torch.Tensor, drawn: AugmentDraw) -> torch.Tensor:
        """`images` augmented as `drawn` says: crop and flip, colour jitter, normalisation. `images` is not changed."""
        x = self._crop_and_flip(images, drawn)
        x = self._jitter(x, drawn)
        return torch.addcmul(self.shift, x, self.scale)  # (x - MEAN) / STD in one pass

    def _crop_and_flip(self, images: torch.Tensor, drawn: AugmentDraw) -> torch.Tensor:
        if not self.crop:  # the loader cropped on the CPU: only the flip is left
            return torch.where(drawn.flip[:, None, None, None], images.flip(-1), images)
        n, _, height, width = images.shape
        # Each box's corner pixel centres onto the output's (align_corners=True, as kornia's crop resized them).
        x0, y0, w, h = drawn.boxes.to(images.dtype).unbind(1)
        sx, sy = (w - 1) / max(width - 1, 1), (h - 1) / max(height - 1, 1)
        cx = (2 * x0 + w - 1) / max(width - 1, 1) - 1
        cy = (2 * y0 + h - 1) / max(height - 1, 1) - 1
        sx = torch.where(drawn.flip, -sx, sx)
        zero = torch.zeros_like(sx)
        theta = torch.stack([torch.stack([sx, zero, cx], 1), torch.stack([zero, sy, cy], 1)], 1)
        grid = nn.functional.affine_grid(theta, [n, 3, self.crop, self.crop], align_corners=True)
        return nn.functional.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=True)

    def _jitter(self, x: torch.Tensor, drawn: AugmentDraw) -> torch.Tensor:
        """Brightness, contrast and saturation in the batch's order, each clamped to [0, 1] as kornia's are; a
        factor of 1 leaves an image as it was (`torch.lerp` returns its end at weight 1)."""
        factors = drawn.factors.to(x.dtype)[:, :, None, None, None]  # (n, 3, 1, 1, 1)
        for step in drawn.order:
            factor = factors[:, step]
            if step == 0:  # brightness: towards black
                x = x.mul_(factor)
            elif step == 1:  # contrast: towards the image's mean grey (the grey of its mean colour)
                x = torch.lerp((x.mean((2, 3), keepdim=True) * self.luma).sum(1, keepdim=True), x, factor)
            else:  # saturation: towards each pixel's grey
                x = torch.lerp((x * self.luma).sum(1, keepdim=True), x, factor)
            x = x.clamp_(0, 1)
        return x


def _crop_boxes(u: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(n, 4) boxes (x0, y0, w, h) from uniforms `u` (n, 2 * CROP_TRIES + 2), as torchvision's and kornia's
    `RandomResizedCrop` draw them: CROP_TRIES candidates per image (area share uniform in CROP_SCALE, log of
    width/height uniform in log CROP_RATIO), the first that fits; the whole image (its ratio clamped to
    CROP_RATIO) when none does; the box's corner uniform over the places it fits."""
    tries = CROP_TRIES
    area = height * width * (CROP_SCALE[0] + (CROP_SCALE[1] - CROP_SCALE[0]) * u[:, :tries])
    low, high = math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])
    ratio = torch.exp(low + (high - low) * u[:, tries:2 * tries])
    w = torch.sqrt(area * ratio).round()
    h = torch.sqrt(area / ratio).round()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.to(torch.uint8).argmax(1, keepdim=True)  # the first True (0 when none)
    w, h = w.gather(1, first).squeeze(1), h.gather(1, first).squeeze(1)
    aspect = width / height
    if aspect < CROP_RATIO[0]:
        whole = (width, round(width / CROP_RATIO[0]))
    elif aspect > CROP_RATIO[1]:
        whole = (round(height * CROP_RATIO[1]), height)
    else:
        whole = (width, height)
    some = fits.any(1)
    w = torch.where(some, w, float(whole[0]))
    h = torch.where(some, h, float(whole[1]))
    x0 = (u[:, 2 * tries] * (width - w + 1)).floor().clamp_(max=width - w)
    y0 = (u[:, 2 * tries + 1] * (height - h + 1)).floor().clamp_(max=height - h)
    return torch.stack([x0, y0, w, h], 1).long()
