"""perflab.verify.saved: the activation bytes a training step keeps for backward, as the verify child
measures them (parameters apart, a checkpoint's recomputation not counted)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from perflab.verify.saved import SavedBytes, bind


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def _step(model: nn.Module, forward) -> None:
    x = torch.randn(32, 64)
    loss = forward(model, x).square().mean()
    loss.backward()


def test_a_checkpointed_step_keeps_less_and_recomputation_is_not_counted() -> None:
    hooks = bind()
    with SavedBytes(hooks) as plain:
        _step(_net(), lambda m, x: m(x))
    with SavedBytes(hooks) as ckpt:
        _step(_net(), lambda m, x: checkpoint(m, x, use_reentrant=False))
    # plain: the input, two 32x256 activations and their ReLU outputs, the 32x10 output (fp32)
    assert plain.bytes >= 4 * 32 * 256 * 4
    assert ckpt.bytes < plain.bytes / 4  # only what lies outside the checkpoint is kept


def test_parameters_are_not_activations() -> None:
    weight = nn.Parameter(torch.randn(64, 64))
    with SavedBytes(bind()) as seen:
        (torch.randn(8, 64) @ weight).sum().backward()
    assert seen.bytes == 8 * 64 * 4  # the input saved for weight's gradient; the weight itself is a parameter


def test_the_hooks_bound_before_student_code_measure_even_if_torch_is_patched(monkeypatch) -> None:
    hooks = bind()

    class Blind:  # what a candidate could put in torch's place: hooks that see nothing
        def __init__(self, *a):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(torch.autograd.graph, "saved_tensors_hooks", Blind)
    with SavedBytes(hooks) as seen:
        _step(_net(), lambda m, x: m(x))
    assert seen.bytes > 0
