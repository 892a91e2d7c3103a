"""The workloads a GPU grades and teaches at: lab 2 starts starved, labs 3-6 start fed (docs/DESIGN.md)."""

from __future__ import annotations

import pytest

from perflab import dataset, env
from perflab.labs import registry

FED_LABS = [m.lab for m in registry.with_any("fed")]


def test_every_verified_lab_has_a_cuda_grade_workload_at_224_px():
    for lab in ("lab02_feed", "lab03_amp", "lab04_memory", "lab05_compile", "lab06_together"):
        sizes = env.mode_sizes("grade", lab=lab, device="cuda")
        assert (sizes.image_size, sizes.batch_size) == (224, 128), lab
    # A CPU keeps its own, measured rows.
    assert env.mode_sizes("grade", lab="lab03_amp", device="cpu").image_size == 64


def test_lab_2_starts_starved_and_labs_3_to_6_start_fed_on_a_gpu():
    assert FED_LABS == ["lab03_amp", "lab04_memory", "lab05_compile", "lab06_together"]
    assert env.baseline_loader("lab02_feed", "cuda", "grade") == {}
    for lab in FED_LABS:
        fed = env.baseline_loader(lab, "cuda", "grade")
        # The data on the device: an H200's 8 loader workers fed FP32 but half of what bf16 trains.
        assert fed == {"data_on_device": True, "gpu_augment": True}, lab
        assert env.baseline_loader(lab, "cuda", "full") == fed
        assert env.baseline_loader(lab, "cpu", "grade") == {}  # a CPU's lessons are measured unfed
        assert env.baseline_loader(lab, "cuda", "tiny") == {}


@pytest.mark.parametrize("lab", FED_LABS)
def test_fed_labs_train_on_a_set_whose_epochs_do_not_dominate(lab):
    """The loader restarts at an epoch's end: at batch 128 the full set has 78 batches an epoch, the small
    set 7 (where one step in seven waited 370-600 ms on an H100)."""
    sizes = env.mode_sizes("grade", lab=lab, device="cuda")
    train = dataset.recipe(sizes.data).per_class("train") * len(dataset.recipe(sizes.data).classes)
    assert train // sizes.batch_size >= 50


def test_the_fed_loader_leaves_a_core_to_the_training_process(monkeypatch):
    monkeypatch.setattr(env, "usable_cores", lambda: 4)
    assert env.fed_workers() == 3
    monkeypatch.setattr(env, "usable_cores", lambda: 64)
    assert env.fed_workers() == env.FED_WORKERS
