"""Every TrainConfig knob takes effect, on CPU in tiny mode; invalid configs name their field."""

from __future__ import annotations

import math
import os

import psutil
import pytest
import torch

from perflab import device_data, workload
from perflab.workload import TrainConfig

TINY = TrainConfig(data="tiny", batch_size=4, image_size=32)


@pytest.fixture(autouse=True)
def _data(tiny_data) -> None:  # noqa: ANN001 - fixture from conftest
    """Every test here needs the tiny data set built."""


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"batch_size": -1}, "batch_size"),
        ({"batch_size": 0}, "batch_size"),
        ({"amp_dtype": "fp8"}, "amp_dtype"),
        ({"amp_dtype": "fp16", "device": "cpu"}, "amp_dtype"),
        ({"image_size": 8}, "image_size"),
        ({"num_workers": -2}, "num_workers"),
        ({"checkpoint_stages": 5}, "checkpoint_stages"),
        ({"compile_mode": "fastest"}, "compile_mode"),
        ({"prefetch_factor": 2}, "prefetch_factor"),
        ({"persistent_workers": True}, "persistent_workers"),
        ({"accumulation_steps": 0}, "accumulation_steps"),
        ({"optimizer": "lamb"}, "optimizer"),
        ({"lr": float("nan")}, "lr"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_invalid_config_names_the_field(changes: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        TrainConfig(**changes)


def test_from_dict_refuses_unknown_fields() -> None:
    with pytest.raises(ValueError, match="unknown field.*batchsize"):
        TrainConfig.from_dict({"batchsize": 3})
    assert TrainConfig.from_dict(TINY.to_dict()) == TINY


def test_same_seed_same_losses_and_samples() -> None:
    a = workload.train(TINY, steps=2)
    b = workload.train(TINY, steps=2)
    assert a.losses == b.losses
    assert a.indices == b.indices
    c = workload.train(TINY.replace(seed=1), steps=2)
    assert c.indices != a.indices


def test_workers_are_real_processes_and_yield_the_same_data() -> None:
    cfg = TINY.replace(num_workers=2, persistent_workers=True, prefetch_factor=3)
    work = workload.build(cfg)
    try:
        images, _, index = work.next_batch()
        children = psutil.Process(os.getpid()).children()
        assert len(children) >= 2, "num_workers=2 started no worker processes"
        assert work.loader.persistent_workers and work.loader.prefetch_factor == 3
    finally:
        work.close()
    # Per-sample seeded augmentation: the same pixels whatever the worker count.
    plain = workload.build(TINY)
    try:
        images0, _, index0 = plain.next_batch()
    finally:
        plain.close()
    assert torch.equal(index, index0)
    assert torch.equal(images, images0)


def _conv1_inputs(cfg: TrainConfig) -> dict:
    seen: dict = {}
    work = workload.build(cfg)

    def hook(module, args, output) -> None:  # noqa: ANN001
        seen["input"] = args[0]
        seen["output_dtype"] = output.dtype

    work.model.conv1.register_forward_hook(hook)
    workload.train_step(work)
    work.close()
    return seen


def test_channels_last_reaches_the_model() -> None:
    seen = _conv1_inputs(TINY.replace(channels_last=True))
    assert seen["input"].is_contiguous(memory_format=torch.channels_last)
    assert not _conv1_inputs(TINY)["input"].is_contiguous(memory_format=torch.channels_last)


def test_autocast_dtype_is_seen_inside_forward() -> None:
    assert _conv1_inputs(TINY.replace(amp_dtype="bf16"))["output_dtype"] == torch.bfloat16
    assert _conv1_inputs(TINY)["output_dtype"] == torch.float32


def _saved_bytes(cfg: TrainConfig) -> int:
    work = workload.build(cfg)
    images, labels, _ = work.next_batch()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(work.model(images), labels)
    loss.backward()
    work.close()
    return total


def test_checkpointing_lowers_saved_bytes() -> None:
    plain = _saved_bytes(TINY)
    two = _saved_bytes(TINY.replace(checkpoint_stages=2))
    four = _saved_bytes(TINY.replace(checkpoint_stages=4))
    assert four < two < plain


def _bn_state_after_one_step(stages: int, *, freeze_stem: bool = False) -> dict[str, torch.Tensor]:
    """BatchNorm running statistics and counters after one training step of ResNet-18 (no data set)."""
    model = workload.build_model(TrainConfig(checkpoint_stages=stages), num_classes=10).train()
    if freeze_stem:
        for p in (*model.conv1.parameters(), *model.bn1.parameters()):
            p.requires_grad_(False)
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    torch.nn.functional.cross_entropy(model(images), torch.tensor([0, 1, 2, 3])).backward()
    return {name.replace("stage.", ""): b.detach().clone() for name, b in model.named_buffers()}


@pytest.mark.parametrize("freeze_stem", [False, True])
def test_checkpointing_leaves_batchnorm_statistics_as_one_step_without(freeze_stem: bool) -> None:
    plain = _bn_state_after_one_step(0, freeze_stem=freeze_stem)
    ckpt = _bn_state_after_one_step(workload.REFERENCE_CHECKPOINT_STAGES, freeze_stem=freeze_stem)
    assert plain.keys() == ckpt.keys()
    differ = [name for name in plain if not torch.allclose(plain[name].float(), ckpt[name].float(), atol=1e-6)]
    assert differ == [], f"checkpointing changed {len(differ)} buffers, e.g. {differ[:3]}"


@pytest.mark.slow
def test_compiled_checkpointing_updates_batchnorm_statistics_once() -> None:
    """Under torch.compile the stage checkpoints without the restoring context (Dynamo takes none):
    the traced graph applies its buffer updates once, whatever backward recomputes."""
    def bn_state(checkpointed: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        stage = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
        model = workload.CheckpointedStage(stage) if checkpointed else stage
        run = torch.compile(model) if checkpointed else model
        run(torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))).sum().backward()
        return [b.detach().clone().float() for b in stage.buffers()]

    torch._dynamo.reset()
    for plain, compiled in zip(bn_state(False), bn_state(True), strict=True):
        torch.testing.assert_close(compiled, plain)


def _saved_bytes_of(module: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd keeps for backward from one forward of `module` (then runs the backward)."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
    out.sum().backward()
    return total


def test_checkpointed_stage_checkpoints_when_its_input_needs_no_grad() -> None:
    """A frozen stem gives the first stage an input without grad; its parameters still need one, so
    its activations must still be recomputed, not kept."""
    def stage() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))

    x = torch.randn(32, 64)
    assert _saved_bytes_of(workload.CheckpointedStage(stage()), x) < _saved_bytes_of(stage(), x) / 2


def test_accumulation_consumes_micro_batches_per_step() -> None:
    run = workload.train(TINY.replace(batch_size=2, accumulation_steps=3), steps=2)
    assert [len(i) for i in run.indices] == [6, 6]
    assert len(set(run.indices[0] + run.indices[1])) == 12


def test_gpu_augment_moves_augmentation_to_the_device() -> None:
    work = workload.build(TINY.replace(gpu_augment=True))
    try:
        images, _, _ = work.next_batch()
        assert images.dtype == torch.uint8, "the CPU side should only decode and crop"
        assert isinstance(work.augment, workload.DeviceAugment)
        ready, _ = work.on_device(images, torch.zeros(len(images), dtype=torch.long))
        assert ready.dtype == torch.float32 and ready.min() < 0 < ready.max(), "normalised on the device"
        loss, _ = workload.train_step(work)
        assert loss == loss  # finite, not NaN
    finally:
        work.close()


def test_threads_knob_sets_torch_threads() -> None:
    before = torch.get_num_threads()
    try:
        workload.build(TINY.replace(threads=1)).close()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_pin_memory_only_where_it_means_something() -> None:
    work = workload.build(TINY.replace(pin_memory=True))
    assert work.loader.pin_memory == torch.cuda.is_available()
    work.close()


def test_compile_wraps_the_model() -> None:
    work = workload.build(TINY.replace(compile_mode="default"))
    assert isinstance(work.train_model, torch._dynamo.eval_frame.OptimizedModule)
    assert work.train_model._orig_mod is work.model
    work.close()


def test_adam_optimizer_knob() -> None:
    work = workload.build(TINY.replace(optimizer="adam"))
    assert isinstance(work.optimizer, torch.optim.Adam)
    work.close()


def test_fp16_trains_with_a_grad_scaler_and_bf16_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp16 gradients underflow without loss scaling: an fp16 run scales its loss, unscales before the
    step and skips a step whose gradients overflowed. Run on CPU here (CPU fp16 autocast works, it is
    only too slow for the labs to time), as it runs on a GPU."""
    assert workload.build(TINY.replace(amp_dtype="bf16")).scaler is None
    monkeypatch.setattr(workload.env, "supports_autocast", lambda kind, dtype: True)
    work = workload.build(TINY.replace(amp_dtype="fp16", device="cpu"))
    assert isinstance(work.scaler, torch.amp.GradScaler)
    # the first steps may overflow at the initial scale (2**16): skipped, the scale halves, until one applies
    for _ in range(20):
        before = [p.detach().clone() for p in work.model.parameters()]
        loss, _ = workload.train_step(work)
        assert torch.isfinite(loss)
        if any(not torch.equal(a, p) for a, p in zip(before, work.model.parameters(), strict=True)):
            break
    else:
        raise AssertionError("20 fp16 steps and not one update: the scaler never backed off")
    # an overflowing scale: the step is skipped and the scale backs off
    work.scaler.update(new_scale=2.0**120)
    before = [p.detach().clone() for p in work.model.parameters()]
    workload.train_step(work)
    assert all(torch.equal(a, p) for a, p in zip(before, work.model.parameters(), strict=True)), "overflow applied"
    assert work.scaler.get_scale() < 2.0**120


def test_samples_are_seeded_without_the_global_seed_call(monkeypatch) -> None:
    # torch.manual_seed also seeds every accelerator (a queued call with a stack trace before CUDA
    # starts): per sample it cost more than decoding a small JPEG, and filled lab 1's cProfile table.
    class Draws(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index):
            return torch.rand(3), index

    data = workload.IndexedDataset(Draws(), seed=5)
    first = [data[i][0] for i in range(4)]
    calls = []
    monkeypatch.setattr(torch, "manual_seed", lambda *a: calls.append(a))
    again = [data[i][0] for i in range(4)]
    assert calls == []
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))  # same seed, same draws
    assert not torch.equal(first[0], first[1])  # each sample its own seed
    data.epoch = 1
    assert not torch.equal(data[0][0], first[0])  # and each epoch


def test_the_loss_stays_on_the_device_until_read() -> None:
    """train_step hands back the loss as a 0-d tensor on the step's device (reading it is the caller's
    sync); train() reads every step's loss once, after the run."""
    work = workload.build(TINY)
    try:
        loss, indices = workload.train_step(work)
        assert isinstance(loss, torch.Tensor) and loss.dim() == 0 and not loss.requires_grad
        assert loss.device.type == work.device.type and len(indices) == TINY.batch_size
    finally:
        work.close()
    run = workload.train(TINY, 2)
    assert len(run.losses) == 2 and all(type(x) is float for x in run.losses)


def test_data_on_device_sees_the_loaders_samples_in_the_loaders_order() -> None:
    """The training set kept on the device (labs 3-6's fed baseline on a GPU) trains on the samples the
    DataLoader would have given, step for step and across epochs, as uint8 squares the device crops."""
    from perflab import dataset

    loaded = TINY.replace(gpu_augment=True)
    kept = loaded.replace(data_on_device=True)
    per_epoch = len(workload.build_loader(loaded))
    steps = 2 * per_epoch + 1  # into the third epoch
    a, b = workload.train(loaded, steps=steps), workload.train(kept, steps=steps)
    assert a.indices == b.indices
    assert all(math.isfinite(loss) for loss in b.losses)
    work = workload.build(kept)
    try:
        images, labels, indices = work.next_batch()
        side = dataset.device_side_size(TINY.image_size)
        assert images.dtype == torch.uint8 and images.shape == (TINY.batch_size, 3, side, side)
        ready, _ = work.on_device(images, labels)
        assert ready.shape[-2:] == (TINY.image_size, TINY.image_size) and ready.dtype == torch.float32
        assert len(work.loader) == per_epoch
    finally:
        work.close()


def test_data_on_device_is_refused_beside_workers_or_without_device_augmentation() -> None:
    with pytest.raises(ValueError, match="data_on_device: .* num_workers=0"):
        TINY.replace(data_on_device=True, gpu_augment=True, num_workers=2)
    with pytest.raises(ValueError, match="data_on_device: .* gpu_augment=True"):
        TINY.replace(data_on_device=True)
    kept = TINY.replace(data_on_device=True, gpu_augment=True, pin_memory=True, device="cpu")
    assert not kept.effective().pin_memory


def test_workloads_of_one_process_share_the_set_kept_on_the_device() -> None:
    """The verifier's two sides (and lab 6's chain) decode the set into device memory once."""
    kept = TINY.replace(gpu_augment=True, data_on_device=True)
    first, second = workload.build(kept), workload.build(kept.replace(amp_dtype="bf16"))
    try:
        assert first.loader.images is second.loader.images
    finally:
        first.close()
        second.close()


def test_decoding_a_set_into_device_memory_is_counted_once() -> None:
    """The verifier leaves decoding out of each side's setup time: only the first build pays it."""
    kept = TINY.replace(gpu_augment=True, data_on_device=True, image_size=40)  # a size no other test keeps
    before = device_data.DECODE_SECONDS[0]
    first = workload.build(kept)
    after_first = device_data.DECODE_SECONDS[0]
    second = workload.build(kept)
    try:
        assert after_first > before and device_data.DECODE_SECONDS[0] == after_first
    finally:
        first.close()
        second.close()
