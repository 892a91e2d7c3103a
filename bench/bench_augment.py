"""What the augmentation on the device costs a batch: perflab's batched `DeviceAugment` against the kornia
pipeline it replaced (each image cropped by its own slice and resize) and against kornia's batched crop
(`cropping_mode="resample"`: one warp for the batch). `python bench/bench_augment.py` (`make bench-augment`).

A batch as the set kept on the device gives it (uint8 squares of 256 px for 224 px crops, docs/DESIGN.md
"The workload"), converted to floats in [0, 1] and augmented, as the loop's `augment` phase does it; each
call draws a new step's augmentation. Timed on the CPU and, when there is one, on the GPU, each pair in
interleaved ABBA blocks in one run (`perflab.timing.compare`), so the ratio holds on a busy machine too.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import torch
from torch import nn

from perflab import env, timing
from perflab.device_augment import DeviceAugment
from perflab.seeds import sample_seed


class _KorniaAugment(nn.Module):
    """perflab's device augmentation before the batched one: kornia's RandomResizedCrop (per image, or batched
    with `cropping_mode="resample"`), flip, ColorJitter and Normalize, seeded per step through the global RNG."""

    def __init__(self, seed: int, crop: int | None = None, cropping_mode: str = "slice") -> None:
        super().__init__()
        import kornia.augmentation as K

        from perflab.dataset import MEAN, STD

        self.seed = seed
        crops = [K.RandomResizedCrop((crop, crop), scale=(0.6, 1.0), cropping_mode=cropping_mode)] if crop else []
        self.ops = nn.Sequential(
            *crops,
            K.RandomHorizontalFlip(),
            K.ColorJitter(0.2, 0.2, 0.2, 0.0, p=0.8),
            K.Normalize(mean=torch.tensor(MEAN), std=torch.tensor(STD)),
        )

    def forward(self, images: torch.Tensor, step: int) -> torch.Tensor:
        devices = [images.device] if images.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            seed = sample_seed(self.seed, -1, step)
            if devices:
                torch.cuda.manual_seed(seed)
            torch.default_generator.manual_seed(seed)
            return self.ops(images)


def augment_call(augment: nn.Module, images: torch.Tensor) -> Callable[[], torch.Tensor]:
    """One batch's `augment` phase, a new step each call: uint8 to floats in [0, 1], then the augmentation."""
    steps = itertools.count()
    return lambda: augment(images.float().div_(255), next(steps))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--side", type=int, default=256, help="side of the uint8 squares kept on the device")
    p.add_argument("--crop", type=int, default=224, help="side of the random resized crop")
    p.add_argument("--blocks", type=int, default=None,
                   help="ABBA blocks per pair (default: 8 on the CPU, 20 on a GPU)")
    p.add_argument("--device", nargs="+", default=None, help="devices to time (default: cpu, and cuda if present)")
    args = p.parse_args()
    devices = args.device or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"augmentation of a batch of {args.batch_size} uint8 {args.side} px squares to {args.crop} px crops "
          "(float conversion included)")
    for name in devices:
        device = env.pick_device(name)
        where = env.machine_info(device)
        label = where.device_name or where.cpu_model or device.type
        images = torch.randint(0, 256, (args.batch_size, 3, args.side, args.side), dtype=torch.uint8,
                               generator=torch.Generator().manual_seed(0)).to(device)
        new = augment_call(DeviceAugment(0, args.crop).to(device), images)
        blocks = args.blocks or (8 if device.type == "cpu" else 20)
        print(f"\n{device.type} ({label}, {torch.get_num_threads()} CPU threads), {blocks} ABBA blocks per pair:")
        for old_name, mode in (("kornia, per image (before)", "slice"), ("kornia, batched resample", "resample")):
            old = augment_call(_KorniaAugment(0, args.crop, mode).to(device), images)
            c = timing.compare(old, new, blocks=blocks, block_size=1, warmup=2, device=device,
                               labels=(old_name, "perflab DeviceAugment"))
            ci = c.ci()
            print(f"  {old_name:<28} {c.a_per_call * 1e3:8.2f} ms   perflab DeviceAugment {c.b_per_call * 1e3:8.2f} ms"
                  f"   ratio {c.speedup:5.2f}x (95% CI {ci.low:.2f}-{ci.high:.2f})")


if __name__ == "__main__":
    main()
