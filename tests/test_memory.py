"""Training memory: optimizer state, saved activations (and checkpointing), peak memory."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from perflab import memory
from perflab.workload import TrainConfig, build_model

MiB = 2**20
CHILD_ALLOCATION = 200 * MiB


def allocate_and_touch(n: int) -> int:
    """Runs in the peak-memory child: n bytes, every page written."""
    block = bytearray(b"\x01") * n
    return len(block)


def iterate_with_workers(workers: int) -> int:
    """Starts DataLoader workers (child processes of the measured child): what a training run may do."""
    import torch

    data = torch.utils.data.TensorDataset(torch.arange(16.0))
    return sum(len(batch[0]) for batch in torch.utils.data.DataLoader(data, batch_size=4, num_workers=workers))


def fail_in_child() -> None:
    raise RuntimeError("boom from the child")


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return build_model(TrainConfig(), num_classes=10)


def n_param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize(("name", "factor"), [("sgd", 0), ("sgd-momentum", 1), ("adam", 2)])
def test_optimizer_state_matches_closed_form(model: nn.Module, name: str, factor: int) -> None:
    weights = [p.detach().clone() for p in model.parameters()]
    static = memory.static_memory(model, name)
    params = n_param_bytes(model)
    assert static.parameter_bytes == static.gradient_bytes == params
    assert memory.expected_optimizer_bytes(model, name) == factor * params
    # Adam also keeps one float32 step counter per parameter tensor.
    counters = 4 * len(list(model.parameters())) if name == "adam" else 0
    assert static.optimizer_bytes == factor * params + counters
    assert static.total == (2 + factor) * params + counters
    # Measuring moved no weight and left no gradient behind.
    assert all(torch.equal(w, p) for w, p in zip(weights, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_static_memory_equals_state_of_a_real_training_step(model: nn.Module) -> None:
    trained = build_model(TrainConfig(), num_classes=10)
    opt = torch.optim.Adam(trained.parameters(), lr=1e-3)
    assert memory.optimizer_state_bytes(opt) == 0  # no state before the first step
    nn.functional.cross_entropy(trained(torch.randn(2, 3, 32, 32)), torch.tensor([1, 2])).backward()
    opt.step()
    assert memory.optimizer_state_bytes(opt) == memory.static_memory(model, "adam").optimizer_bytes


def test_static_memory_keeps_existing_gradients() -> None:
    lin = nn.Linear(3, 2)
    lin(torch.randn(4, 3)).sum().backward()
    grad = lin.weight.grad.clone()
    assert memory.static_memory(lin, "sgd-momentum").optimizer_bytes == 4 * (6 + 2)
    assert torch.equal(lin.weight.grad, grad)


def test_unknown_optimizer_is_named() -> None:
    with pytest.raises(ValueError, match="optimizer: 'lion'"):
        memory.static_memory(nn.Linear(2, 2), "lion")
    assert memory.optimizer_name(TrainConfig()) == "sgd-momentum"
    assert memory.optimizer_name(TrainConfig(optimizer="adam")) == "adam"


def test_saved_storages_count_once() -> None:
    class Square(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.lin(x))  # relu saves h
            return h.view(-1) * h.view(-1)  # mul saves two views of h: the same storage

    acts = memory.activation_bytes(Square(), torch.randn(4, 8))
    # x (saved by addmm for the weight gradient) and h: 4*8 + 4*16 floats.
    assert (acts.count, acts.bytes) == (2, 4 * (4 * 8 + 4 * 16))
    assert acts.by_module == {"lin": (1, 4 * 4 * 8), "": (1, 4 * 4 * 16)}


def test_checkpointing_lowers_saved_activation_bytes() -> None:
    x = torch.randn(2, 3, 32, 32)
    saved = []
    for segments in (0, 2, 4):
        net = build_model(TrainConfig(checkpoint_stages=segments), num_classes=10)
        saved.append(memory.activation_bytes(net, x).bytes)
    assert saved[0] > saved[1] > saved[2] > 0
    assert saved[2] < 0.6 * saved[0], f"checkpointing all four stages kept {saved}"


def test_activation_bytes_grow_with_batch_and_restore_buffers(model: nn.Module) -> None:
    model.train()
    before = model.bn1.running_mean.clone()
    small = memory.activation_bytes(model, torch.randn(2, 3, 32, 32))
    large = memory.activation_bytes(model, torch.randn(8, 3, 32, 32))
    assert large.bytes > 3 * small.bytes
    assert torch.equal(model.bn1.running_mean, before)
    assert "total" in large.table()


def test_memory_budget_adds_up(model: nn.Module) -> None:
    x = torch.randn(2, 3, 32, 32)
    labels = torch.tensor([0, 1])
    budget = memory.memory_budget(model, "adam", x, loss_fn=lambda out: nn.functional.cross_entropy(out, labels))
    params = n_param_bytes(model)
    assert budget.parameters == budget.gradients == params
    assert budget.optimizer_state == 2 * params + 4 * len(list(model.parameters()))
    # The loss adds what nll_loss saves: the log-softmax output (2x10 floats), the int64 targets
    # and its float total_weight.
    assert budget.activations == memory.activation_bytes(model, x).bytes + 4 * 2 * 10 + 8 * 2 + 4
    assert budget.total == sum(budget.to_dict().values())
    assert set(budget.to_dict()) == {"parameters", "gradients", "optimizer", "activations"}
    assert abs(sum(budget.shares().values()) - 1) < 1e-9
    assert "optimizer (adam)" in budget.table()


def test_cpu_peak_of_a_child_sees_its_allocation() -> None:
    peak = memory.peak_memory(allocate_and_touch, "cpu", CHILD_ALLOCATION)
    assert peak.device == "cpu"
    assert peak.baseline_bytes > 0
    assert peak.delta >= 200e6, str(peak)  # 200 MiB is 209.7 MB
    assert peak.delta < CHILD_ALLOCATION + 100 * MiB, str(peak)


def test_cpu_peak_of_a_function_that_starts_loader_workers() -> None:
    """`perflab profile --num-workers 2` measures its peak in a child that starts loader workers: a
    daemonic child may not, and the profile failed on a CPU."""
    peak = memory.peak_memory(iterate_with_workers, "cpu", 2)
    assert peak.device == "cpu" and peak.peak_bytes >= peak.baseline_bytes > 0


def test_cpu_peak_reports_failures_and_unpicklable_functions() -> None:
    with pytest.raises(ValueError, match="module-level function"):
        memory.peak_memory(lambda: None, "cpu")
    with pytest.raises(RuntimeError, match="boom from the child"):
        memory.peak_memory(fail_in_child, "cpu")


def test_peak_memory_rejects_unknown_devices() -> None:
    with pytest.raises((ValueError, RuntimeError)):
        memory.peak_memory(allocate_and_touch, "xla", 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peak_sees_a_transient_tensor() -> None:
    def step() -> None:
        block = torch.ones(64 * MiB, device="cuda")  # 256 MiB, freed on return
        block.mul_(2)

    peak = memory.peak_memory(step, "cuda")
    assert peak.delta >= 256 * MiB
    assert torch.cuda.memory_allocated() - peak.baseline_bytes < MiB
