"""Parameters and FLOPs: ResNet-18's known figures, and closed forms equal to FlopCounterMode."""

from __future__ import annotations

import random

import pytest
import torch
import torchvision
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from perflab import counting

RESNET18_PARAMETERS = 11_689_512
RESNET18_FORWARD_FLOPS_224 = 3_628_146_688
SHAPE_224 = (1, 3, 224, 224)


@pytest.fixture(scope="module")
def resnet18() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None, num_classes=1000)


def counter_flops(module: nn.Module, x: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        module(x)
    return counter.get_total_flops()


def test_resnet18_parameters(resnet18: nn.Module) -> None:
    assert counting.count_parameters(resnet18) == RESNET18_PARAMETERS
    table = counting.parameter_counts(resnet18)
    assert table.total == table.trainable == RESNET18_PARAMETERS
    assert dict((name, n) for name, n, _ in table.rows)["fc"] == 512 * 1000 + 1000
    assert "total" in table.table() and "11,689,512" in str(table)


def test_trainable_only_counts_frozen_parameters_out() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    model[0].requires_grad_(False)
    assert counting.count_parameters(model) == 15 + 8
    assert counting.count_parameters(model, trainable_only=True) == 8
    assert counting.parameter_counts(model).trainable == 8


def test_shared_parameters_count_once() -> None:
    lin = nn.Linear(5, 5)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    assert counting.count_parameters(model) == 30
    assert counting.parameter_counts(model).total == 30


def test_resnet18_forward_flops_counter_and_formula(resnet18: nn.Module) -> None:
    resnet18.train()
    running_mean = resnet18.bn1.running_mean.clone()
    flops = counting.count_flops(resnet18, torch.randn(SHAPE_224))
    assert torch.equal(resnet18.bn1.running_mean, running_mean), "counting must not update BatchNorm statistics"
    assert flops.forward == RESNET18_FORWARD_FLOPS_224
    assert counting.formula_flops(resnet18, SHAPE_224) == RESNET18_FORWARD_FLOPS_224
    assert not flops.has_backward
    with pytest.raises(ValueError, match="backward"):
        _ = flops.train


def test_resnet18_backward_is_twice_forward_but_the_first_conv(resnet18: nn.Module) -> None:
    """Every conv/linear whose input needs a gradient pays grad-input and grad-weight (2x forward);
    conv1 sees data, so it only pays grad-weight (1x)."""
    for p in resnet18.parameters():
        p.grad = None
    flops = counting.count_flops(resnet18, torch.randn(SHAPE_224), backward=True)
    conv1 = flops.module_forward("ResNet.conv1")
    assert conv1 == 2 * 64 * 112 * 112 * 3 * 7 * 7
    assert flops.backward == 2 * flops.forward - conv1
    assert flops.train == 3 * flops.forward - conv1 == 10_648_412_160
    assert flops.module_backward("ResNet.conv1") == conv1
    assert flops.module_backward("ResNet.fc") == 2 * flops.module_forward("ResNet.fc")
    assert flops.module_backward("ResNet.layer3") == 2 * flops.module_forward("ResNet.layer3")
    assert all(p.grad is None for p in resnet18.parameters()), "count_flops must not fill .grad"
    assert flops.to_dict() == {"flops_forward": RESNET18_FORWARD_FLOPS_224, "flops_train": flops.train}
    table = flops.table()
    assert "ResNet.layer4" in table and "backward" in table


def random_conv(rng: random.Random) -> tuple[nn.Conv2d, tuple[int, int, int, int], dict]:
    groups = rng.choice([1, 1, 2, 3, 4])
    kernel = (rng.randint(1, 5), rng.randint(1, 5))
    dilation = (rng.randint(1, 3), rng.randint(1, 2))
    spec = dict(
        out_channels=groups * rng.randint(1, 4),
        kernel_size=kernel,
        stride=(rng.randint(1, 3), rng.randint(1, 3)),
        padding=(rng.randint(0, 3), rng.randint(0, 2)),
        dilation=dilation,
        groups=groups,
        bias=rng.random() < 0.5,
    )
    in_channels = groups * rng.randint(1, 3)
    # Big enough for the dilated kernel even without padding.
    h = dilation[0] * (kernel[0] - 1) + 1 + rng.randint(0, 12)
    w = dilation[1] * (kernel[1] - 1) + 1 + rng.randint(0, 12)
    return nn.Conv2d(in_channels, **spec), (rng.randint(1, 3), in_channels, h, w), spec


@pytest.mark.parametrize("seed", range(30))
def test_conv2d_formula_equals_flop_counter(seed: int) -> None:
    conv, in_shape, spec = random_conv(random.Random(seed))
    x = torch.randn(in_shape)
    assert counting.conv2d_flops(in_shape, **spec) == counter_flops(conv, x)
    assert counting.conv2d_output_shape(in_shape, spec["out_channels"], spec["kernel_size"], spec["stride"],
                                        spec["padding"], spec["dilation"]) == tuple(conv(x).shape)


@pytest.mark.parametrize("seed", range(30))
def test_linear_formula_equals_flop_counter(seed: int) -> None:
    rng = random.Random(1000 + seed)
    lead = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 3)))
    in_f, out_f, bias = rng.randint(1, 40), rng.randint(1, 40), rng.random() < 0.5
    x = torch.randn(*lead, in_f)
    batch = 1
    for d in lead:
        batch *= d
    assert counting.linear_flops(batch, in_f, out_f, bias) == counter_flops(nn.Linear(in_f, out_f, bias=bias), x)


def test_bias_is_not_counted_by_flop_counter_or_formula() -> None:
    x = torch.randn(2, 4, 9, 9)
    with_bias = counter_flops(nn.Conv2d(4, 6, 3, bias=True), x)
    assert with_bias == counter_flops(nn.Conv2d(4, 6, 3, bias=False), x)
    assert with_bias == counting.conv2d_flops(x.shape, 6, 3, bias=True) == counting.conv2d_flops(x.shape, 6, 3, bias=False)
    x = torch.randn(5, 7)
    assert counter_flops(nn.Linear(7, 3), x) == counter_flops(nn.Linear(7, 3, bias=False), x) == 2 * 5 * 7 * 3


def test_formula_handles_string_padding_and_padding_modes() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding="same", padding_mode="reflect"),
                          nn.Conv2d(4, 4, 3, padding="valid"), nn.Flatten(), nn.Linear(4 * 10 * 10, 5))
    x = torch.randn(2, 3, 12, 12)
    assert counting.formula_flops(model, x.shape) == counter_flops(model, x)
    layers = counting.layer_shapes(model, x.shape)
    assert [layer.name for layer in layers] == ["0", "1", "3"]
    assert layers[0].out_shape == (2, 4, 12, 12) and layers[2].kind == "linear"


def test_layer_shapes_leaves_the_model_as_it_was(resnet18: nn.Module) -> None:
    resnet18.train()
    before = resnet18.bn1.running_mean.clone()
    counting.layer_shapes(resnet18, (2, 3, 64, 64))
    assert resnet18.training and torch.equal(before, resnet18.bn1.running_mean)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(in_shape=(1, 6, 8, 8), out_channels=4, kernel_size=3, groups=4), "groups"),
        (dict(in_shape=(1, 3, 2, 2), out_channels=4, kernel_size=3), "in_shape"),
        (dict(in_shape=(3, 8, 8), out_channels=4, kernel_size=3), "in_shape"),
        (dict(in_shape=(1, 3, 8, 8), out_channels=4, kernel_size=(3, 3, 3)), "kernel_size"),
    ],
)
def test_conv2d_flops_rejects_bad_shapes(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        counting.conv2d_flops(**kwargs)
