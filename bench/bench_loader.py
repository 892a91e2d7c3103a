"""How many images a second a fed loader delivers: as perflab's `gpu_augment` loads (decode, then the
random crop on the CPU) against decoding alone (what moving the crop to the device would leave the
workers). `python bench/bench_loader.py`.

The loader alone, no model: a DataLoader over the training split at `--image-size` and `--batch-size`
with `--workers` processes, timed over `--batches` batches after the first `2 x workers` (the workers'
start). On a GPU this is the ceiling of every fed configuration: what bf16 can gain is capped there.
"""

from __future__ import annotations

import argparse
import time

import torch


def images_per_second(data: str, image_size: int, batch_size: int, workers: int, batches: int,
                      crop_on_cpu: bool) -> float:
    from torchvision.transforms import v2

    from perflab import dataset

    source = dataset.load(data, image_size=image_size, train=True, device_augment=True)
    if not crop_on_cpu:  # decode only: the images are already squares of the size the crop starts from
        source.transform = v2.Compose([v2.ToImage(), v2.ToPureTensor()])
    loader = torch.utils.data.DataLoader(source, batch_size=batch_size, shuffle=True, num_workers=workers,
                                         persistent_workers=workers > 0, drop_last=True)
    it = iter(loader)

    def take() -> None:
        nonlocal it
        try:
            next(it)
        except StopIteration:  # a small set: the next epoch (persistent workers keep going)
            it = iter(loader)
            next(it)

    for _ in range(2 * max(workers, 1)):
        take()
    start = time.perf_counter()
    for _ in range(batches):
        take()
    return batches * batch_size / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--data", default="full")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batches", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"{args.data}, {args.image_size} px, batch {args.batch_size}: images a second the loader delivers")
    for workers in args.workers:
        rates = {crop: images_per_second(args.data, args.image_size, args.batch_size, workers, args.batches, crop)
                 for crop in (True, False)}
        print(f"  {workers} worker(s): as loaded (decode + crop) {rates[True]:8,.0f}, decode only {rates[False]:8,.0f} "
              f"({rates[False] / rates[True]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
