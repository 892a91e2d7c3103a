"""perflab.verify.guard: perflab's file hashes, the bound clocks, and the runtime-patch snapshot."""

from __future__ import annotations

import json
import shutil
import time

import torch

from perflab.verify import guard


def test_hash_check_names_modified_and_missing_files(tmp_path):
    root = tmp_path / "perflab"
    shutil.copytree(guard.package_root(), root, ignore=shutil.ignore_patterns("__pycache__"))
    recorded = guard.file_hashes(root)
    assert "verify/child.py" in recorded and "workload.py" in recorded
    assert guard.check_hashes(recorded, root) == []
    with open(root / "workload.py", "a") as f:
        f.write("\nimport time; time.sleep(1)\n")
    (root / "env.py").unlink()
    (root / "extra.py").write_text("x = 1\n")  # nothing imports it: not a finding
    assert guard.check_hashes(recorded, root) == ["perflab/env.py is missing", "perflab/workload.py was modified"]


def test_manifest_round_trip(tmp_path, monkeypatch):
    path = guard.write_manifest(tmp_path / "manifest.json")
    monkeypatch.setenv(guard.MANIFEST_ENV, str(path))
    assert guard.expected_hashes() == json.loads(path.read_text())["perflab"]
    monkeypatch.setenv(guard.MANIFEST_ENV, str(tmp_path / "missing.json"))
    try:
        guard.expected_hashes()
    except ValueError as exc:
        assert guard.MANIFEST_ENV in str(exc)
    else:
        raise AssertionError("a missing manifest must be an error")


def test_clocks_notice_replacement(monkeypatch):
    clocks = guard.Clocks()
    clocks.bind_torch()
    assert clocks.problems() == []
    monkeypatch.setattr(time, "perf_counter_ns", lambda: 0)
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, end: 0.0)
    assert clocks.problems() == ["time.perf_counter_ns was replaced", "torch.cuda.Event.elapsed_time was replaced"]


def test_snapshot_notices_patched_functions_and_inherited_operators(monkeypatch):
    before = guard.Snapshot.take()
    assert before.changed(guard.Snapshot.take()) == []
    monkeypatch.setattr(torch.nn.functional, "conv2d", lambda *a, **k: None)
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda self, other: None, raising=False)
    assert before.changed(guard.Snapshot.take()) == ["torch.Tensor.__matmul__", "torch.nn.functional.conv2d"]


def test_imported_files_limit_the_check(tmp_path):
    imported = guard.imported_files()
    assert "verify/guard.py" in imported and "__init__.py" in imported
    root = tmp_path / "perflab"
    shutil.copytree(guard.package_root(), root, ignore=shutil.ignore_patterns("__pycache__"))
    recorded = guard.file_hashes(root)
    (root / "verify" / "guard.py").write_text("# emptied\n")
    assert guard.check_hashes(recorded, root, only={"env.py"}) == []
    assert guard.check_hashes(recorded, root, only=imported) == ["perflab/verify/guard.py was modified"]
