"""The clean training script every mystery pipeline starts from, with the sites code is planted at.

A line `#@ <site>` (indented as the code around it) is where the catalogue's snippets for that site go
(`perflab.mystery.catalogue`); a clean pipeline has nothing there. `{...}` fields are filled per student.

Every id's script also differs from a classmate's where nothing is planted (`perflab.mystery` draws
these per id): a `#@ note` line becomes a comment or nothing, a `<<name>>` becomes one of `CHOICES[name]`
(a local's name, a docstring, a logging interval), and the helpers come in their own order. None of it
changes what a step computes or costs.
"""

from __future__ import annotations

HEADER = '''"""Mystery pipeline of {student}: {model} trained on a folder of JPEG images.

It trains correctly, but every step takes longer than it should. Find out why with the tools of
lab 1 (cProfile, line_profiler, a memory profiler, torch.profiler), fix it, and prove the fix:

    python {filename} --steps 30                          # trains; prints the time per step
    python -m cProfile -s cumtime {filename} --steps 20   # where the time goes, by function

`make_step(seed)` follows perflab.verify's contract: each `step()` runs one optimizer step and returns
(loss, the dataset indices of the samples it consumed). The grader re-measures your fixed copy
against this one, and it must train the same way (the same losses, the same samples).
"""

from __future__ import annotations

import argparse
import copy
import logging
import time

import numpy as np
import torch
import torchvision
from PIL import Image
from torch import nn
from torch.profiler import record_function

from perflab.dataset import IMAGE_SUFFIXES, split_folder

log = logging.getLogger("mystery")

DATA = "{data}"  # the data set: one of perflab's (perflab dataset build --size NAME) or an ImageFolder's path
MODEL = "{model}"  # the torchvision model it trains
IMAGE_SIZE = {image_size}
BATCH_SIZE = {batch_size}
RUN_ID = {run_id}  # this experiment's id: it seeds the weights, the sample order and the flips
<<log_name>> = <<log_every>>  # steps between two log lines of `main`
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
MEAN_VALUES, STD_VALUES = MEAN.flatten().tolist(), STD.flatten().tolist()
#@ note
'''

# Helpers a real script carries; each pipeline gets a few, in its own order (so no two students'
# line numbers agree).
HELPERS = (
    '''
def count_parameters(model: nn.Module) -> int:
    """Trainable parameters of `model`."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
''',
    '''
def human_bytes(n: float) -> str:
    """`n` bytes, readable."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
''',
    '''
def learning_rate(step: int, base: float = 0.01, warmup: int = 10) -> float:
    """A linear warm-up (kept for a later experiment; the optimizer below uses `base`)."""
    return base * min(1.0, (step + 1) / warmup)
''',
    '''
def describe(images: torch.Tensor) -> str:
    """A batch's shape and value range, for a log line."""
    return f"{tuple(images.shape)} in [{float(images.min()):.2f}, {float(images.max()):.2f}]"
''',
    '''
def class_names(root) -> list[str]:
    """The class folders of an ImageFolder split."""
    return sorted(p.name for p in root.iterdir() if p.is_dir())
''',
    '''
def seconds(ms: float) -> str:
    """Milliseconds as a short string."""
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms"
''',
)

# Helpers the pipeline's own code calls, in an order drawn per id.
CALLED = (
    '''

def python_collate(batch):
    """Stack (image, label, index) samples into one batch."""
    images = torch.tensor(np.array([image.tolist() for image, _, _ in batch], dtype=np.float32))
    labels = torch.tensor([label for _, label, _ in batch])
    indices = torch.tensor([index for _, _, index in batch])
    return images, labels, indices
''',
    '''

def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy of `model` on one batch, in eval mode."""
    model.eval()
    with torch.no_grad():
        correct = (model(images).argmax(1) == labels).float().mean()
    model.train()
    return float(correct)
''',
)

DATASET = '''

class JpegFolder(torch.utils.data.Dataset):
    """<<doc_dataset>>"""

    def __init__(self, root, seed: int) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [(path, label) for label, name in enumerate(classes)
                        for path in sorted((root / name).iterdir()) if path.suffix.lower() in IMAGE_SUFFIXES]
        self.classes = classes
        #@ note
        self.seed = seed

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        <<path>>, label = self.samples[index]
        image = Image.open(<<path>>).convert("RGB")
        #@ load
        #@ note
        <<flip>> = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        tensor = torch.from_numpy(array).permute(2, 0, 1)
        if torch.rand((), generator=<<flip>>) < 0.5:
            tensor = tensor.flip(-1)
        #@ normalize
        return tensor.contiguous(), label, index
'''

TRAINER = '''

class Trainer:
    """<<doc_trainer>>"""

    def __init__(self, seed: int, data: str = DATA) -> None:
        <<seed>> = seed * 1_000_003 + RUN_ID
        torch.manual_seed(<<seed>>)
        self.dataset = JpegFolder(split_folder(data), <<seed>>)
        self.model = torchvision.models.get_model(MODEL, num_classes=len(self.dataset.classes))
        self.criterion = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loader = torch.utils.data.DataLoader(
            self.dataset, batch_size=BATCH_SIZE, shuffle=True, drop_last=True,
            #@ collate
            generator=torch.Generator().manual_seed(<<seed>>))
        #@ note
        self.batches = iter(self.loader)
        self.steps = 0
        #@ init

    def next_batch(self):
        with record_function(f"run {RUN_ID}"):  # which run a trace shows
            try:
                return next(self.batches)
            except StopIteration:  # a new epoch
                self.batches = iter(self.loader)
                return next(self.batches)

    def step(self):
        with record_function("data"):
            images, labels, indices = self.next_batch()
        #@ input
        #@ forward
            outputs = self.model(images)
            loss = self.criterion(outputs, labels)
        #@ backward
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        #@ after_backward
        #@ note
        with record_function("optimizer"):
            self.optimizer.step()
        #@ after_step
        self.steps += 1
        #@ note
        return loss.detach(), indices.tolist()


def make_step(seed: int, data: str = DATA):
    """perflab.verify's contract: build everything from `seed`; each call of the returned function
    runs one optimizer step and returns (loss, indices)."""
    return Trainer(seed, data).step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=DATA)
    args = parser.parse_args()
    trainer = Trainer(args.seed, args.data)
    trainer.step()  # warm-up
    <<start>> = time.perf_counter()
    for i in range(args.steps):
        loss, _ = trainer.step()
        if (i + 1) % <<log_name>> == 0:
            log.info("step %d: loss %.3f", i + 1, float(loss))
    <<per_step>> = (time.perf_counter() - <<start>>) / args.steps
    images, labels, _ = trainer.next_batch()
    print(f"{args.steps} steps: {<<per_step>> * 1000:.1f} ms a step, last loss {float(loss):.3f}, "
          f"batch accuracy {accuracy(trainer.model, images, labels):.2f}")


if __name__ == "__main__":
    main()
'''

# What a `<<name>>` of the template may become: the first is the plain script's; an id draws one.
CHOICES: dict[str, tuple[str, ...]] = {
    "log_name": ("LOG_EVERY", "LOG_INTERVAL", "PRINT_EVERY", "REPORT_EVERY"),
    "log_every": ("10", "20", "25", "50", "100"),
    "path": ("path", "file", "jpeg_path", "location"),
    "flip": ("flip", "coin", "flip_rng", "toss"),
    "seed": ("seed", "run_seed", "stream", "mixed_seed"),
    "start": ("start", "t0", "began", "tic"),
    "per_step": ("per_step", "step_s", "seconds", "mean_step"),
    "doc_dataset": (
        "The JPEG files of an ImageFolder split: (image tensor, label, index), with a seeded flip.",
        "An ImageFolder split of JPEG files, as (image tensor, label, index); the flip is seeded per sample.",
        "JPEG images of one split, one class per folder: (image tensor, label, index), flipped by a seeded coin.",
    ),
    "doc_trainer": (
        "Model, data and optimizer; `step()` runs one training step.",
        "Everything one training run needs; `step()` advances it by one optimizer step.",
        "The training run: model, loader, loss and optimizer (`step()` is one step).",
    ),
}

# What a `#@ note` line may become (besides nothing): comments a script gathers over its life.
NOTES = (
    "# kept deterministic: two runs with the same seed give the same losses",
    "# TODO: read these settings from a config file",
    "# checked against the notebook's run before the refactor",
    "# see the data set's README for the folder layout",
    "# plain PyTorch on purpose: no trainer framework, no callbacks",
    "# the same recipe as the baseline experiment",
    "# re-run the smoke test after changing anything here",
    "# (a leftover of the first version of this script)",
    "# reviewed: nothing to change here",
    "# numbers in the report come from this script",
)
