"""torch.compile's warm start (perflab.grading.compile_cache): made once per machine from a graph of the kit's
own, copied privately into each job, and grading goes on from cold where it cannot be made."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from perflab.grading import compile_cache, pipeline
from perflab.grading import job as job_mod
from perflab.grading.result import Job, LabInfo

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def warm_cache() -> Path:
    """The machine's warm start (the grading runs of this session reuse it: it is made once)."""
    cache = compile_cache.warm()
    assert cache is not None, "the warm start could not be made on this machine"
    return cache


def test_only_a_lab_whose_graded_notebook_compiles_asks_for_it() -> None:
    assert compile_cache.wanted(["lab05_compile"])
    assert compile_cache.wanted(["lab01_measure", "lab05_compile"])
    assert not compile_cache.wanted(["lab01_measure", "lab02_feed", "lab03_amp", "lab04_memory", "lab06_together"])
    assert not compile_cache.wanted(["toy_lab", "lab99_unknown", ""])


def test_the_warm_start_is_made_once_and_holds_nothing_of_a_lab(warm_cache: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    assert warm_cache.is_dir() and any(warm_cache.rglob("*.so")), "the warm start holds compiled kernels"
    text = "".join(p.read_text(errors="replace") for p in warm_cache.rglob("*.py"))
    for word in ("FixedBlock", "BrokenBlock", "amax", "gelu", "layer_norm"):
        assert word not in text, f"the warm start holds {word!r}: a lab's graph"

    def no_second_compile(*args, **kwargs):
        raise AssertionError("a warm start that exists is not made again")

    monkeypatch.setattr(compile_cache.subprocess, "run", no_second_compile)
    assert compile_cache.warm() == warm_cache


def test_a_copy_in_a_jobs_folder_is_a_cache_inductor_reads_at_its_new_place(warm_cache: Path, tmp_path: Path) -> None:
    """The graph the warm start compiled, compiled again from a copy elsewhere: Inductor finds it there."""
    copy = tmp_path / "job" / "cache" / "inductor"
    assert compile_cache.seed(warm_cache, copy)
    probe = ("import json, torch\nfrom torch._dynamo.utils import counters\n"
             "from perflab.grading import compile_cache\ncompile_cache._compile_once()\n"
             "print(json.dumps(dict(counters['inductor'])))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(copy)})
    assert done.returncode == 0, done.stderr[-2000:]
    counters = json.loads(done.stdout.strip().splitlines()[-1])
    assert counters.get("fxgraph_cache_hit", 0) >= 1 and counters.get("fxgraph_cache_miss", 0) == 0, counters


def test_a_job_starts_from_its_own_copy_and_without_one_from_cold(warm_cache: Path, tmp_path: Path) -> None:
    tmpl = tmp_path / "tmpl"
    (tmpl / "source" / "lab05_compile").mkdir(parents=True)
    info = LabInfo("lab05_compile", "lab05_compile.ipynb", (), {})
    job = Job("ann", "lab05_compile", tmp_path / "sub.ipynb", "x")
    for name, cache in (("warm", warm_cache), ("cold", None)):
        work = tmp_path / name
        work.mkdir()
        env = job_mod.prepare_job(job, info, tmpl, work, pipeline.Settings(compile_cache=cache),
                                  nbformat.v4.new_notebook(), 1)
        inductor = Path(env["TORCHINDUCTOR_CACHE_DIR"])
        assert inductor == work / "cache" / "inductor"
        if cache is None:
            assert not inductor.exists()
        else:
            assert sorted(p.relative_to(inductor) for p in inductor.rglob("*")) == \
                   sorted(p.relative_to(cache) for p in cache.rglob("*"))
            (inductor / "written-by-a-job").write_text("x")
    assert not (warm_cache / "written-by-a-job").exists(), "a job writes only into its own copy"


def test_a_warm_start_that_cannot_be_made_leaves_nothing_and_grading_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def fails(*args, **kwargs):
        return subprocess.CompletedProcess(args, 1, stdout="", stderr="RuntimeError: no C++ compiler found")

    monkeypatch.setattr(compile_cache.subprocess, "run", fails)
    with caplog.at_level(logging.WARNING):
        assert compile_cache.warm(tmp_path) is None
    assert "could not be made" in caplog.text and "no C++ compiler found" in caplog.text
    assert list(tmp_path.rglob("*")) == [], "no half-made warm start is left behind"
    assert not compile_cache.seed(None, tmp_path / "x") and not (tmp_path / "x").exists()
