"""The training workload: `TrainConfig` (every knob the labs touch, the model among them) and the one loop it builds.

Each knob changes one visible place in the loop: the loader (workers, pinning, prefetch), the
augmentation (CPU transforms, or `perflab.device_augment` on the device), the memory format, the checkpoint wrapper,
the compile call, the autocast context, and gradient accumulation. `perflab.phases` times those
places without reshaping them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from perflab import device_data, env
from perflab.counting import restoring_buffers
from perflab.device_augment import DeviceAugment
from perflab.phase_timer import PhaseTimer
from perflab.seeds import sample_seed as _sample_seed

AMP_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
OPTIMIZERS = ("sgd", "adam")
# ResNet-18 halves the image five times; below 32 px the last stage has no spatial extent left.
MIN_IMAGE_SIZE = 32
MAX_IMAGE_SIZE = 1024
RESNET_STAGES = ("layer1", "layer2", "layer3", "layer4")
# The checkpointing perflab's references use wherever they checkpoint (calibration's `checkpoint`, lab 4's
# graded pair, lab 6's forced change): every stage, each stage one segment.
REFERENCE_CHECKPOINT_STAGES = len(RESNET_STAGES)


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of the training workload. Invalid values raise `ValueError` naming the field."""

    data: str = "tiny"
    # A torchvision classification model, built by `network`; the course's ($PERFLAB_MODEL) by default.
    model: str = field(default_factory=env.course_model)
    batch_size: int = 32
    image_size: int = 32
    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    gpu_augment: bool = False
    # The training set decoded once into device memory; each step gathers its batch there (no loader).
    data_on_device: bool = False
    amp_dtype: str | None = None
    channels_last: bool = False
    checkpoint_stages: int = 0  # the first N ResNet stages, each run as one checkpointed segment
    accumulation_steps: int = 1
    compile_mode: str | None = None
    device: str | None = None
    seed: int = 0
    optimizer: str = "sgd"
    lr: float = 0.002  # SGD+momentum stays stable on the small synthetic sets (0.05 diverges at batch 16)
    momentum: float = 0.9
    threads: int | None = None

    def __post_init__(self) -> None:
        check_model(self.model)
        _check_int("batch_size", self.batch_size, low=1)
        _check_int("num_workers", self.num_workers, low=0)
        _check_int("accumulation_steps", self.accumulation_steps, low=1)
        _check_int("checkpoint_stages", self.checkpoint_stages, low=0, high=len(RESNET_STAGES))
        _check_int("seed", self.seed, low=0)
        _check_int("image_size", self.image_size, low=MIN_IMAGE_SIZE, high=MAX_IMAGE_SIZE,
                   why="the models downsample by 32")
        if self.threads is not None:
            _check_int("threads", self.threads, low=1)
        if self.prefetch_factor is not None:
            _check_int("prefetch_factor", self.prefetch_factor, low=1)
            if self.num_workers == 0:
                raise ValueError("prefetch_factor: only applies with num_workers > 0 (set num_workers or drop prefetch_factor)")
        if self.persistent_workers and self.num_workers == 0:
            raise ValueError("persistent_workers: needs num_workers > 0")
        if self.data_on_device and self.num_workers > 0:
            raise ValueError("data_on_device: the training set is already decoded on the device, nothing is "
                             "left to load: set num_workers=0")
        if self.data_on_device and not self.gpu_augment:
            raise ValueError("data_on_device: its images are augmented where they are: set gpu_augment=True")
        if self.amp_dtype is not None and self.amp_dtype not in AMP_DTYPES:
            raise ValueError(f"amp_dtype: {self.amp_dtype!r} is not one of None, {', '.join(map(repr, AMP_DTYPES))}")
        if self.compile_mode is not None and self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode: {self.compile_mode!r} is not one of None, {', '.join(map(repr, COMPILE_MODES))}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer: {self.optimizer!r} is not one of {', '.join(map(repr, OPTIMIZERS))}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr: must be a positive finite number, got {self.lr!r}")
        if self.device is not None:
            env.pick_device(self.device)  # raises ValueError naming the device field
        if self.amp_dtype is not None:
            kind = self.device_type
            if not env.supports_autocast(kind, AMP_DTYPES[self.amp_dtype]):
                raise ValueError(
                    f"amp_dtype: {self.amp_dtype!r} autocast is not supported on device {kind!r} here"
                    + (" (use 'bf16' on CPU)" if kind == "cpu" else "")
                )

    @property
    def device_type(self) -> str:
        return env.pick_device(self.device).type

    @property
    def samples_per_step(self) -> int:
        """Samples one optimizer step consumes (micro-batch times accumulation steps)."""
        return self.batch_size * self.accumulation_steps

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def effective(self) -> TrainConfig:
        """This configuration with the knobs that change nothing on its device reset, so that two runs
        that do the same work compare equal: `pin_memory` pins host memory for copies to a CUDA device
        (`build_loader` pins only there, and a copy to the CPU is no copy; data on the device is copied
        once)."""
        kind = str(self.device).split(":")[0] if self.device else self.device_type
        if self.pin_memory and (kind != "cuda" or self.data_on_device):
            return self.replace(pin_memory=False)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """The configuration a `to_dict` wrote; one written before the model was a field is ResNet-18's (the
        only model there was)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"TrainConfig: unknown field(s) {', '.join(unknown)}")
        return cls(**{"model": env.DEFAULT_MODEL, **data})


def _check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    suffix = f" ({why})" if why else ""
    if low is not None and value < low:
        raise ValueError(f"{name}: must be at least {low}, got {value}{suffix}")
    if high is not None and value > high:
        raise ValueError(f"{name}: must be at most {high}, got {value}{suffix}")


# ---------------------------------------------------------------------------------------------
# Data


class IndexedDataset(torch.utils.data.Dataset):
    """Yields (image, label, index); each sample's augmentation is seeded by (seed, epoch, index).

    That makes the pixels a step sees independent of worker count, prefetching and pinning, so a
    candidate loader can be checked for consuming exactly the baseline's samples.
    """

    def __init__(self, base: torch.utils.data.Dataset, seed: int) -> None:
        self.base = base
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int, int]:
        # `EpochSampler` sends (epoch, index): persistent workers never see `self.epoch` change.
        epoch, index = key if isinstance(key, tuple) else (self.epoch, key)
        with torch.random.fork_rng(devices=[]):
            # The CPU generator only: torch.manual_seed also seeds every accelerator, and before CUDA
            # starts it queues that call with a stack trace, 0.3 ms a sample (the augmentations draw
            # from the CPU generator alone).
            torch.default_generator.manual_seed(_sample_seed(self.seed, epoch, index))
            image, label = self.base[index]
        return image, label, index


class EpochSampler(torch.utils.data.Sampler):
    """A shuffled order that depends only on (seed, epoch), yielding (epoch, index) keys.

    DataLoader draws its workers' base seed from its generator at every new iterator but not when
    persistent workers are reused, so an order drawn from that generator changes with
    `persistent_workers`; and persistent workers keep their own copy of the dataset, so the epoch
    has to travel with each key. Set `epoch` before starting an epoch's iterator.
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch
        generator = torch.Generator().manual_seed(_sample_seed(self.seed, epoch, -1))
        return iter([(epoch, i) for i in torch.randperm(self.size, generator=generator).tolist()])


def build_dataset(config: TrainConfig) -> IndexedDataset:
    from perflab import dataset

    base = dataset.load(config.data, image_size=config.image_size, train=True,
                        device_augment=config.gpu_augment)
    return IndexedDataset(base, config.seed)


def build_loader(config: TrainConfig, data: IndexedDataset | None = None) -> torch.utils.data.DataLoader:
    """The DataLoader for `config`: seeded shuffling, every sample once per epoch, the loader knobs applied."""
    data = data if data is not None else build_dataset(config)
    if len(data) < config.batch_size:  # drop_last would leave every epoch empty
        raise ValueError(f"data: {config.data} holds {len(data)} training image(s), fewer than one batch of "
                         f"{config.batch_size}: add images, or lower batch_size")
    generator = torch.Generator().manual_seed(config.seed)
    kwargs: dict[str, Any] = {}
    if config.num_workers > 0:
        kwargs["persistent_workers"] = config.persistent_workers
        if config.prefetch_factor is not None:
            kwargs["prefetch_factor"] = config.prefetch_factor
    return torch.utils.data.DataLoader(
        data,
        batch_size=config.batch_size,
        sampler=EpochSampler(len(data), config.seed),
        drop_last=True,
        num_workers=config.num_workers,
        pin_memory=config.pin_memory and config.device_type == "cuda",
        generator=generator,
        **kwargs,
    )


class DeviceBatches:
    """The training set decoded once into device memory (uint8 squares, `dataset.square_transform`); each
    step gathers its batch there, in `EpochSampler`'s order with the DataLoader's `drop_last`, so the
    samples of every step are those of the loader it replaces. Iterating it yields (images, labels,
    indices) like `build_loader`'s loader: images uint8 on the device, the random crop left to
    `DeviceAugment`.

    On an H200, 8 loader workers decoded about 4,000 images a second of the full set at 224 px: enough
    for FP32, half of what bf16 with channels_last trains (docs/DESIGN.md). Kept on the device, the
    data never sets the pace of the steps labs 3-6 time there.
    """

    def __init__(self, config: TrainConfig, device: torch.device, data: IndexedDataset) -> None:
        self.dataset, self.batch_size = data, config.batch_size
        self.sampler = EpochSampler(len(data), config.seed)
        self.decoded = device_data.decoded_on_device(config.data, config.image_size, device)
        self.images, self.labels = self.decoded.images, self.decoded.labels

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        bs = self.batch_size
        order = torch.tensor([index for _, index in self.sampler][:len(self) * bs])
        # One copy an epoch: a copy from pageable memory each step would make the CPU wait for the GPU.
        on_device = order.to(self.images.device)
        for b in range(len(self)):
            picked = on_device[b * bs:(b + 1) * bs]
            yield self.images.index_select(0, picked), self.labels.index_select(0, picked), order[b * bs:(b + 1) * bs]


# ---------------------------------------------------------------------------------------------
# Model


class CheckpointedStage(nn.Module):
    """Runs a ResNet stage as one `torch.utils.checkpoint` segment: its activations are recomputed in backward.

    It checkpoints whenever grad is enabled (the stage's own parameters need gradients even when its
    input does not), and the recomputation puts the stage's buffers back as the forward left them:
    BatchNorm in train mode would otherwise update its running statistics a second time per step.
    """

    def __init__(self, stage: nn.Module) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self.stage(x)
        if torch.compiler.is_compiling():
            # Dynamo takes no context_fn; it traces the checkpoint into one graph whose buffer updates
            # are functionalised and applied once, after the forward, however much backward recomputes.
            return checkpoint(self.stage, x, use_reentrant=False)
        return checkpoint(self.stage, x, use_reentrant=False,
                          context_fn=lambda: (contextlib.nullcontext(), restoring_buffers(self.stage)))


@functools.cache
def model_names() -> frozenset[str]:
    """torchvision's classification models: the names `TrainConfig.model` takes."""
    import torchvision

    return frozenset(torchvision.models.list_models(module=torchvision.models))


def check_model(name: str) -> None:
    """ValueError in one line where `name` is not a torchvision classification model (the default is one:
    a configuration of it does not import torchvision)."""
    if name != env.DEFAULT_MODEL and name not in model_names():
        raise ValueError(f"model: {name!r} is not a torchvision classification model (list them with "
                         "`torchvision.models.list_models(module=torchvision.models)`)")


def network(name: str, num_classes: int) -> nn.Module:
    """torchvision's model `name`, randomly initialised (no weights) with `num_classes` outputs: the one place
    the kit builds its model."""
    import torchvision

    check_model(name)
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


@functools.cache
def has_stages(name: str) -> bool:
    """Whether model `name` has ResNet's four stages (`RESNET_STAGES`), what checkpointing by stages needs."""
    with torch.device("meta"):
        model = network(name, 10)
    return all(isinstance(getattr(model, stage, None), nn.Module) for stage in RESNET_STAGES)


def require_stages(lab: str, config: TrainConfig) -> TrainConfig:
    """`config`, where its model has ResNet's stages; ValueError in one line where it has none (a lab whose
    lesson checkpoints by stages declares it with this call)."""
    if not has_stages(config.model):
        raise ValueError(f"{lab} checkpoints ResNet stages ({RESNET_STAGES[0]}..{RESNET_STAGES[-1]}); "
                         f"{config.model} has none: choose a ResNet ($PERFLAB_MODEL)")
    return config


def build_model(config: TrainConfig, num_classes: int) -> nn.Module:
    """`config.model`, randomly initialised from `config.seed`, with checkpointing and memory format applied."""
    if config.checkpoint_stages:
        require_stages("checkpoint_stages", config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = network(config.model, num_classes)
    for name in RESNET_STAGES[: config.checkpoint_stages]:
        setattr(model, name, CheckpointedStage(getattr(model, name)))
    model = model.to(env.pick_device(config.device))
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.register_forward_pre_hook(_takes_float_images)
    return model


class RawBatch(TypeError):
    """A loader's raw batch (integer pixels) fed to the model without `Workload.on_device`."""


def _takes_float_images(module: nn.Module, args: tuple[Any, ...]) -> None:
    """The one way into the model is `Workload.on_device`: a batch of integer pixels (a set kept on the device,
    or a loader whose augmentation runs on the device, hands over uint8) stops here with the way in."""
    images = args[0] if args else None
    if isinstance(images, torch.Tensor) and not (images.is_floating_point() or images.is_complex()):
        raise RawBatch(f"the model takes float images; this batch is {images.dtype} pixels as the loader hands them "
                       "over: pass it through `work.on_device(images, labels)` first (it copies, augments, "
                       "normalises and sets the memory format)")


def build_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=config.lr)
    return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)


# ---------------------------------------------------------------------------------------------
# The loop


def autocast(config: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The loop's autocast context on `device`: `config.amp_dtype`, or no autocast when it is None."""
    if config.amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AMP_DTYPES[config.amp_dtype])


@dataclass
class Workload:
    """Everything one training run holds: the model (possibly compiled), optimizer, loader and device."""

    config: TrainConfig
    model: nn.Module
    train_model: Callable[[torch.Tensor], torch.Tensor]
    optimizer: torch.optim.Optimizer
    loader: torch.utils.data.DataLoader | DeviceBatches
    device: torch.device
    augment: DeviceAugment | None
    num_classes: int
    _batches: Iterator[Any] | None = field(default=None, repr=False)
    _epoch: int = 0
    steps_done: int = 0
    # fp16 has 5 exponent bits: small gradients flush to zero without loss scaling (bf16 needs none).
    scaler: torch.amp.GradScaler | None = None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return autocast(self.config, self.device)

    def on_device(self, images: torch.Tensor, labels: torch.Tensor, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A loader batch as the model takes it: `copy_to_device`, then `augment_on_device`. `micro`: the
        micro-batch within the step (each draws its own augmentation)."""
        images, labels = self.copy_to_device(images, labels)
        return self.augment_on_device(images, micro), labels

    def copy_to_device(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch moved to the device as the loader gave it (the loop's `h2d` phase): a copy from host
        memory, non-blocking from pinned memory; nothing is copied when it is already there (a set kept on
        the device, or a CPU run)."""
        non_blocking = self.config.pin_memory
        return images.to(self.device, non_blocking=non_blocking), labels.to(self.device, non_blocking=non_blocking)

    def augment_on_device(self, images: torch.Tensor, micro: int = 0) -> torch.Tensor:
        """Images on the device as the model takes them (the loop's `augment` phase): augmented there where
        `gpu_augment` is on (the loader hands over uint8 crops; a set kept on the device, uint8 squares the
        device crops), in the configured memory format."""
        cfg = self.config
        if self.augment is not None:
            images = self.augment(images.float().div_(255), self.steps_done * cfg.accumulation_steps + micro)
        if cfg.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next micro-batch as the loader gives it (uint8 with `gpu_augment`: see `on_device`),
        starting a new epoch (with fresh augmentation seeds) when one ends."""
        if self._batches is None:
            self._batches = iter(self.loader)
        try:
            return next(self._batches)
        except StopIteration:
            self._epoch += 1
            dataset = self.loader.dataset
            if isinstance(dataset, IndexedDataset):
                dataset.epoch = self._epoch
            if isinstance(self.loader.sampler, EpochSampler):
                self.loader.sampler.epoch = self._epoch
            self._batches = iter(self.loader)
            return next(self._batches)

    def close(self) -> None:
        """Stop loader workers (persistent ones live until their iterator is released)."""
        self._batches = None


def build(config: TrainConfig) -> Workload:
    """Build the workload `config` describes (threads, data, model, optimizer, compile)."""
    env.set_threads(config.threads)
    device = env.pick_device(config.device)
    data = build_dataset(config)
    num_classes = len(data.base.classes)  # type: ignore[attr-defined]
    model = build_model(config, num_classes)
    optimizer = build_optimizer(config, model)
    train_model: Callable[[torch.Tensor], torch.Tensor] = model
    if config.compile_mode is not None:
        train_model = torch.compile(model, mode=config.compile_mode)
    crop = config.image_size if config.data_on_device else None
    augment = DeviceAugment(config.seed, crop).to(device) if config.gpu_augment else None
    scaler = torch.amp.GradScaler(device.type) if config.amp_dtype == "fp16" else None
    batches = DeviceBatches(config, device, data) if config.data_on_device else build_loader(config, data)
    return Workload(config, model, train_model, optimizer, batches, device, augment, num_classes, scaler=scaler)


def train_step(work: Workload, timer: PhaseTimer | None = None) -> tuple[torch.Tensor, list[int]]:
    """One optimizer step (over `accumulation_steps` micro-batches). Returns its mean loss and the sample indices seen.

    The loss stays on the device (a 0-d tensor): reading it (`float(loss)`) waits for the device, so the
    step itself never does, and asynchronous copies and CPU/GPU overlap show in what is timed around it.
    """
    timer = timer or PhaseTimer.disabled()
    cfg, model = work.config, work.train_model
    work.model.train()
    indices: list[int] = []
    total_loss: torch.Tensor | None = None
    for micro in range(cfg.accumulation_steps):
        with timer.phase("data"):
            images, labels, index = work.next_batch()
        with timer.phase("h2d"):
            images, labels = work.copy_to_device(images, labels)
        with timer.phase("augment"):
            images = work.augment_on_device(images, micro)
        with timer.phase("forward"), work.autocast():
            logits = model(images)
            loss = nn.functional.cross_entropy(logits, labels) / cfg.accumulation_steps
        with timer.phase("backward"):
            (loss if work.scaler is None else work.scaler.scale(loss)).backward()
        total_loss = loss.detach() if total_loss is None else total_loss + loss.detach()
        indices.extend(int(i) for i in index)
    with timer.phase("optimizer"):
        if work.scaler is None:
            work.optimizer.step()
        else:  # unscales, skips the step if a gradient overflowed, then adapts the scale
            work.scaler.step(work.optimizer)
            work.scaler.update()
        work.optimizer.zero_grad(set_to_none=True)
    work.steps_done += 1
    assert total_loss is not None  # accumulation_steps >= 1
    return total_loss, indices


def train(config: TrainConfig, steps: int, *, timer: PhaseTimer | None = None,
          progress: bool = False) -> TrainRun:
    """Build the workload and run `steps` optimizer steps; the losses and samples of each step come back."""
    if steps < 1:
        raise ValueError(f"steps: must be at least 1, got {steps}")
    work = build(config)
    run = TrainRun(config=config)
    iterator = range(steps)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="train", unit="step", leave=False)
    losses: list[torch.Tensor] = []
    try:
        for _ in iterator:
            loss, indices = train_step(work, timer)
            losses.append(loss)
            run.indices.append(indices)
    finally:
        work.close()
    run.losses = [float(x) for x in torch.stack(losses).cpu()] if losses else []  # one sync, after the run
    return run


@dataclass
class TrainRun:
    config: TrainConfig
    losses: list[float] = field(default_factory=list)
    indices: list[list[int]] = field(default_factory=list)


@torch.no_grad()
def evaluate(work: Workload, batches: int | None = None) -> float:
    """Top-1 accuracy of `work.model` on the evaluation view of its data (no augmentation)."""
    from perflab import dataset

    data = dataset.load(work.config.data, image_size=work.config.image_size, train=False,
                        device_augment=work.config.gpu_augment)
    loader = torch.utils.data.DataLoader(data, batch_size=work.config.batch_size, shuffle=False)
    work.model.eval()
    correct = total = 0
    for i, (images, labels) in enumerate(loader):
        if batches is not None and i >= batches:
            break
        images, labels = images.to(work.device), labels.to(work.device)
        if work.config.gpu_augment:
            from perflab.dataset import normalize

            images = normalize(images.float().div_(255))
        if work.config.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with work.autocast():
            logits = work.model(images)
        correct += int((logits.argmax(1) == labels).sum())
        total += int(labels.numel())
    return correct / max(total, 1)
