"""The batched augmentation on the device: its distribution (crop scales and ratios, flip rate, jitter factors
and rate), per-step seeding, the output it hands the model, and one resampling per batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from perflab import device_augment
from perflab.dataset import normalize
from perflab.device_augment import (
    CROP_RATIO,
    CROP_SCALE,
    FLIP_P,
    JITTER,
    JITTER_P,
    AugmentDraw,
    DeviceAugment,
)

N = 4000  # draws per statistic: a rate's standard error is under 0.008
SIDE, CROP = 256, 224


@pytest.fixture(scope="module")
def drawn() -> AugmentDraw:
    return DeviceAugment(0, CROP).draw(N, SIDE, SIDE, step=7)


def test_crop_boxes_fit_the_image_with_the_scale_and_ratio_drawn(drawn: AugmentDraw) -> None:
    x0, y0, w, h = drawn.boxes.double().unbind(1)
    assert (x0 >= 0).all() and (y0 >= 0).all() and (x0 + w <= SIDE).all() and (y0 + h <= SIDE).all()
    area = w * h / SIDE**2
    # Width and height are whole pixels: a box's area and ratio may miss the range by a pixel's rounding.
    slack = 2 / SIDE
    assert area.min() >= CROP_SCALE[0] - slack and area.max() <= CROP_SCALE[1]
    assert (w / h).min() >= CROP_RATIO[0] - slack and (w / h).max() <= CROP_RATIO[1] + slack
    # Spread over the range, not stuck at one end (the first fitting candidate of ten is kept).
    assert 0.70 < float(area.mean()) < 0.78 and float(area.quantile(0.1)) < 0.65 and float(area.quantile(0.9)) > 0.85
    # The corner is uniform over where the box fits: on average in the middle of the slack.
    assert float((x0 / (SIDE - w).clamp(min=1)).mean()) == pytest.approx(0.5, abs=0.03)


def test_crop_distribution_is_kornias(drawn: AugmentDraw) -> None:
    """The areas and ratios kornia's RandomResizedCrop (the per-image pipeline this replaced) draws."""
    import kornia.augmentation as K

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        params = K.RandomResizedCrop((CROP, CROP), scale=CROP_SCALE).forward_parameters(torch.Size((N, 3, SIDE, SIDE)))
    src = params["src"].double()
    kw, kh = src[:, 1, 0] - src[:, 0, 0] + 1, src[:, 2, 1] - src[:, 1, 1] + 1
    _, _, w, h = drawn.boxes.double().unbind(1)
    q = torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=torch.float64)
    assert torch.allclose((w * h).quantile(q) / SIDE**2, (kw * kh).quantile(q) / SIDE**2, atol=0.015)
    assert torch.allclose((w / h).quantile(q), (kw / kh).quantile(q), atol=0.03)


def test_flip_and_jitter_rates_and_factor_ranges(drawn: AugmentDraw) -> None:
    assert float(drawn.flip.double().mean()) == pytest.approx(FLIP_P, abs=0.03)
    assert float(drawn.jitter.double().mean()) == pytest.approx(JITTER_P, abs=0.03)
    applied, skipped = drawn.factors[drawn.jitter], drawn.factors[~drawn.jitter]
    assert applied.min() >= 1 - JITTER and applied.max() <= 1 + JITTER
    assert torch.equal(skipped, torch.ones_like(skipped)), "an image the jitter skips keeps factors of 1"
    # Each factor uniform over its range: mean 1, and both halves of the range used.
    assert torch.allclose(applied.double().mean(0), torch.ones(3, dtype=torch.float64), atol=0.01)
    assert ((applied < 1 - JITTER / 2).double().mean(0) > 0.2).all()
    assert ((applied > 1 + JITTER / 2).double().mean(0) > 0.2).all()
    assert sorted(drawn.order) == [0, 1, 2]


def test_each_seed_and_step_draws_its_own_augmentation_without_touching_the_global_rng() -> None:
    images = torch.rand(6, 3, 40, 40)
    before = torch.random.get_rng_state()
    a, again, other_seed = DeviceAugment(0, 32), DeviceAugment(0, 32), DeviceAugment(1, 32)
    first = a(images, step=3)
    assert torch.equal(first, again(images, step=3)), "the same seed and step draw the same"
    assert torch.equal(first, a(images, step=3)), "drawing again does not move on a stream"
    assert not torch.equal(first, a(images, step=4)), "another step draws another augmentation"
    assert not torch.equal(first, other_seed(images, step=3)), "another seed draws another augmentation"
    assert torch.equal(torch.random.get_rng_state(), before), "the global RNG is left alone"


@pytest.mark.parametrize("crop", [None, 24])
def test_output_shape_dtype_and_device_and_the_input_left_alone(crop: int | None) -> None:
    images = torch.rand(5, 3, 32, 32)
    kept = images.clone()
    out = DeviceAugment(0, crop)(images, step=0)
    side = crop or 32
    assert out.shape == (5, 3, side, side) and out.dtype == torch.float32 and out.device == images.device
    assert torch.isfinite(out).all()
    assert torch.equal(images, kept)
    # Normalised: within what (x - MEAN) / STD gives for x in [0, 1].
    assert out.min() >= normalize(torch.zeros(1, 3, 1, 1)).min() - 1e-5
    assert out.max() <= normalize(torch.ones(1, 3, 1, 1)).max() + 1e-5


def test_a_box_is_cropped_resized_and_flipped_as_kornias_slice_and_resize_did() -> None:
    images = torch.rand(3, 3, 64, 64)
    boxes = torch.tensor([[3, 5, 50, 40], [0, 0, 64, 64], [10, 2, 44, 60]])
    flip = torch.tensor([False, True, False])
    drawn = AugmentDraw(boxes, flip, torch.ones(3, 3), torch.zeros(3, dtype=torch.bool), (0, 1, 2))
    out = DeviceAugment(0, 32).apply(images, drawn)
    for i, (x0, y0, w, h) in enumerate(boxes.tolist()):
        ref = nn.functional.interpolate(images[i:i + 1, :, y0:y0 + h, x0:x0 + w], size=(32, 32), mode="bilinear",
                                        align_corners=True)
        ref = ref.flip(-1) if flip[i] else ref
        assert torch.allclose(out[i], normalize(ref[0]), atol=1e-4)


def test_jitter_factors_act_as_brightness_contrast_and_saturation() -> None:
    images = torch.rand(4, 3, 16, 16) * 0.5 + 0.25  # away from the clamp
    whole = torch.tensor([[0, 0, 16, 16]]).expand(4, 4)
    factors = torch.tensor([[1.0, 1.0, 1.0], [0.8, 1.0, 1.0], [1.0, 0.8, 1.0], [1.0, 1.0, 0.8]])
    drawn = AugmentDraw(whole, torch.zeros(4, dtype=torch.bool), factors, torch.ones(4, dtype=torch.bool), (0, 1, 2))
    out = DeviceAugment(0).apply(images, drawn)
    plain = normalize(images)
    assert torch.allclose(out[0], plain[0], atol=1e-6), "factors of 1 leave an image as it was"
    assert torch.allclose(out[1], normalize(images[1] * 0.8), atol=1e-5)
    luma = torch.tensor(device_augment.LUMA).view(3, 1, 1)
    grey = (images[2] * luma).sum(0).mean()
    assert torch.allclose(out[2], normalize(grey + 0.8 * (images[2] - grey)), atol=1e-5)
    pixel_grey = (images[3] * luma).sum(0, keepdim=True)
    assert torch.allclose(out[3], normalize(pixel_grey + 0.8 * (images[3] - pixel_grey)), atol=1e-5)


def test_one_resampling_per_batch_not_one_per_image(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = nn.functional.grid_sample

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(args[0].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(nn.functional, "grid_sample", counted)
    DeviceAugment(0, 24)(torch.rand(16, 3, 32, 32), step=1)
    assert calls == [16]


def test_whole_image_kept_when_no_candidate_fits() -> None:
    """A very wide image: no candidate of ratio at most 4/3 and area above 0.6 fits, so the crop keeps its
    full height and the widest box of ratio 4/3, as torchvision and kornia fall back."""
    boxes = DeviceAugment(0, 8).draw(200, 10, 100, step=0).boxes
    assert (boxes[:, 3] == 10).all() and (boxes[:, 2] == round(10 * CROP_RATIO[1])).all()
    assert boxes[:, 0].min() < 20 and boxes[:, 0].max() > 67, "the box is placed anywhere along the image"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("crop", [None, 224])
def test_on_cuda_a_batch_is_augmented_without_waiting_for_the_device(crop: int | None) -> None:
    """Every parameter is drawn on the GPU and nothing is read back: the CPU queues the work and moves on."""
    images = torch.rand(128, 3, 256, 256, device="cuda")
    augment = DeviceAugment(0, crop).to("cuda")
    augment(images, step=0)  # the first call may set up generators and kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = augment(images, step=1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = crop or 256
    assert out.shape == (128, 3, side, side) and out.device.type == "cuda" and out.dtype == torch.float32
    drawn = augment.draw(N, SIDE, SIDE, step=7, device="cuda")
    assert float(drawn.flip.double().mean()) == pytest.approx(FLIP_P, abs=0.03)
    assert float(drawn.jitter.double().mean()) == pytest.approx(JITTER_P, abs=0.03)
