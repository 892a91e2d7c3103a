"""A warm start for torch.compile in the graded notebooks, made once per machine.

Inductor's first compile in a process pays for work that no graph of a lab decides: its checks of this
CPU's vector instructions and the C++ prelude every generated kernel includes. A sandboxed job starts
with an empty cache, so every graded notebook that compiles paid it again (lab 5's correctness gate: 14 s
on 2 cores, about half of it that work). The grader now does it once per machine and torch version, on
a graph of its own, and every job starts from a private copy of the cache it leaves:

    wanted(labs) -> bool           does a graded notebook of `labs` compile (its kit module says so)?
    warm(root=None) -> Path | None the warm cache, made here first where there is none (None: it could not be)
    seed(warm, dest) -> bool       copy it to a job's Inductor cache folder `dest`

Nothing of a lab is in it (the graph is a small MLP written below), so a student who reads their copy
reads no answer; what one job writes into its copy reaches no other job. A cache made by another torch
or on another CPU only misses: Inductor keys every entry by both.

    python -m perflab.grading.compile_cache FOLDER   (started by `warm`: compiles that graph with FOLDER
                                                      as Inductor's cache)
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from perflab.grading.judging import LAB_MODULE

log = logging.getLogger(__name__)

# A kit module (perflab.labs.labNN) whose graded notebook compiles with Inductor sets this to True.
FLAG = "COMPILES_WHEN_GRADED"
# Where the warm cache is kept: $PERFLAB_COMPILE_CACHE, else the user's cache folder.
ROOT_ENV = "PERFLAB_COMPILE_CACHE"
# The file that says a warm cache is complete (written last).
READY = "ready"
# Seconds the one warming compile may take before grading goes on without it.
WARM_TIMEOUT_S = 600


def wanted(labs: Iterable[str]) -> bool:
    """Whether a graded notebook of `labs` compiles in the grading kernel (its kit module's FLAG)."""
    for lab in labs:
        match = LAB_MODULE.match(lab)
        if not match:
            continue
        try:
            module = importlib.import_module(f"perflab.labs.{match.group(1)}")
        except ModuleNotFoundError:
            continue
        if getattr(module, FLAG, False) is True:
            return True
    return False


def default_root() -> Path:
    """$PERFLAB_COMPILE_CACHE, else <user cache>/perflab/compile-cache."""
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "perflab" / "compile-cache"


def _version() -> str:
    import torch

    return f"torch-{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}".replace("+", "_")


def warm(root: Path | None = None) -> Path | None:
    """The warm Inductor cache for this torch (made once, here, by a subprocess compiling a small MLP);
    None, with one warning, where it cannot be made: grading then goes on with cold caches, as before."""
    folder = (root or default_root()) / _version()
    if (folder / READY).is_file():
        return folder / "inductor"
    started = time.monotonic()
    tmp: Path | None = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".warming-", dir=folder.parent))
        cache = tmp / "inductor"
        done = subprocess.run([sys.executable, "-m", __name__, str(cache)], capture_output=True, text=True,
                              timeout=WARM_TIMEOUT_S, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)})
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"the warming compile exited with status {done.returncode}: {tail[0][:200]}")
        (tmp / READY).write_text(_version(), encoding="utf-8")
        if not (folder / READY).is_file():  # another grading run may have made it meanwhile
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        if (folder / READY).is_file():  # made by another grading run meanwhile
            return folder / "inductor"
        log.warning("torch.compile's warm start could not be made (%s); graded notebooks compile from cold", exc)
        return None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already where it became the cache
    log.info("made torch.compile's warm start for this machine in %s (%.0f s, once)", folder, time.monotonic() - started)
    return folder / "inductor"


def seed(warm_cache: Path | None, dest: Path) -> bool:
    """Copy `warm_cache` into a job's Inductor cache folder `dest` (missing: nothing, False)."""
    if warm_cache is None or not Path(warm_cache).is_dir():
        return False
    shutil.copytree(warm_cache, dest, dirs_exist_ok=True)
    return True


def _compile_once() -> None:
    """One forward and backward of a compiled two-layer MLP on the CPU: what every later compile shares."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = torch.compile(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)))
    model(torch.randn(4, 8, requires_grad=True)).sum().backward()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m perflab.grading.compile_cache FOLDER")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[1]
    _compile_once()
