from __future__ import annotations

import json

import pytest
import torch

from perflab import env
from perflab.labs import registry


def test_machine_info_round_trips_and_describes_this_machine() -> None:
    info = env.machine_info()
    again = env.MachineInfo.from_dict(json.loads(json.dumps(info.to_dict())))
    assert again == info
    assert info.torch == torch.__version__
    assert info.threads == torch.get_num_threads()
    assert info.hardware_class in {"cpu", "cpu-bf16", "mps"} or info.hardware_class.startswith("cuda-")
    text = info.describe()
    assert info.device in text and "TF32" in text and "cudnn.benchmark" in text


def test_hardware_class_names() -> None:
    assert env.hardware_class(torch.device("cpu"), "x", bf16=True) == "cpu-bf16"
    assert env.hardware_class(torch.device("cpu"), "x", bf16=False) == "cpu"
    assert env.hardware_class(torch.device("cuda"), "NVIDIA H100 80GB HBM3", bf16=False) == "cuda-nvidia-h100-80gb-hbm3"


def test_pick_device_refuses_what_is_not_there() -> None:
    assert env.pick_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="device"):
        env.pick_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            env.pick_device("cuda")


def test_set_threads_controls_torch_threads() -> None:
    before = torch.get_num_threads()
    try:
        assert env.set_threads(1) == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="threads"):
        env.set_threads(0)


def test_run_mode_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFLAB_MODE", "tiny")
    assert env.run_mode() == "tiny"
    assert env.mode_sizes().data == "tiny"
    monkeypatch.delenv("PERFLAB_MODE")
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert env.run_mode() == "grade"
    monkeypatch.delenv("NBGRADER_EXECUTION")
    assert env.run_mode() == ("full" if torch.cuda.is_available() else "laptop")
    monkeypatch.setenv("PERFLAB_MODE", "huge")
    with pytest.raises(ValueError, match="PERFLAB_MODE"):
        env.run_mode()


def test_autocast_support_is_stated_per_device() -> None:
    assert env.supports_autocast("cpu", torch.bfloat16)
    assert not env.supports_autocast("cpu", torch.float16)
    assert env.supports_autocast("cuda", torch.float16) == torch.cuda.is_available()


def test_grade_sizes_are_each_labs_own_workload_on_this_device_kind() -> None:
    base = env.mode_sizes("grade")
    amp = env.mode_sizes("grade", lab="lab03_amp", device="cpu")
    assert (amp.data, amp.image_size, amp.batch_size) == registry.manifest("lab03_amp").workload("grade", "cpu")
    assert amp.image_size * amp.batch_size > base.image_size * base.batch_size  # bigger: where AMP shows
    assert env.mode_sizes("grade", lab="lab01_measure", device="cpu") == base  # not listed: the base sizes
    assert env.mode_sizes("laptop", lab="lab03_amp", device="cpu") == env.mode_sizes("laptop")  # not listed for laptop
    feed = env.mode_sizes("laptop", lab="lab02_feed", device="cpu")  # lab 2 loads photo-sized JPEGs in laptop mode too
    assert (feed.data, feed.image_size, feed.batch_size) == ("photo", 32, 16)
    assert env.mode_sizes("grade", lab="lab02_feed", device="cpu").data == "photo"
    from perflab.labs import lab03, lab06

    assert lab03.baseline_config("grade").image_size == env.mode_sizes("grade", lab=lab03.LAB).image_size
    assert lab06.sizes("grade").batch_size == env.mode_sizes("grade", lab=lab06.LAB).batch_size
