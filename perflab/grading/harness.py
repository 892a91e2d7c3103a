"""The last cell the grading kernel runs: the lab's probes over the student's answers, as data.

    from perflab.grading import harness
    harness.run("lab02_feed", seed=1234, out="observations.json")  # in the submission's work folder

The grading worker appends that cell to the student's notebook (`cell_source`) and reads the file it
writes. Nothing here is trusted by the grader: the student's code ran in this kernel first, and may
have changed anything in it. The grader only reads the observations as data and judges them
itself (`perflab.grading.judging`).

Where a lab's probes live (`probes_for`): `PROBES` in the `probes.py` of the lab's folder
(lab02_feed -> perflab.labs.lab02.probes; a course's own lab: beside its notebook).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perflab.grading.probing import Probe, run_probes
from perflab.labs import registry

OBSERVATIONS_SCHEMA = "perflab.grading.observations"
LAB_MODULE = re.compile(r"^(lab\d\d)_")


def probes_for(lab: str, folder: str | Path | None = None) -> dict[str, Probe] | None:
    """The lab's probes, or None when the lab has none (perflab then refuses to grade it): the `PROBES`
    of its folder's `probes` (a course lab's folder: `folder`, else the working folder)."""
    module = registry.probes(lab, registry.folder(lab) or folder or Path.cwd())
    probes = getattr(module, "PROBES", None) if module is not None else None
    return dict(probes) if probes is not None else None


def _namespace() -> Mapping[str, Any]:
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:  # pragma: no cover - the grading kernel is IPython
        shell = None
    if shell is not None:
        return shell.user_ns
    return vars(sys.modules["__main__"])


def run(lab: str, seed: int, out: str, grade_ids: list[str] | None = None,
        namespace: Mapping[str, Any] | None = None) -> None:
    """Run the lab's probes for `grade_ids` (all by default) over `namespace` (default: the kernel's)
    and write their observations, with what this kernel looks like, to `out`."""
    probes = probes_for(lab) or {}
    if grade_ids is not None:
        probes = {gid: probes[gid] for gid in grade_ids if gid in probes}
    observations = run_probes(probes, namespace if namespace is not None else _namespace(), seed)
    doc = {"schema": OBSERVATIONS_SCHEMA, "version": 1, "lab": lab, "seed": seed, "cells": observations,
           "kernel": kernel_state()}
    if grade_ids == []:  # the first probe, before any student code: can this kernel run the job's device?
        doc["device"] = device_state()
    Path(out).write_text(json.dumps(doc, allow_nan=False), encoding="utf-8")


def device_state() -> dict[str, Any]:
    """The device this kernel is graded for ($PERFLAB_DEVICE) and the one it gets, or why it gets none
    (the driver's message): read by the worker before the student's first cell runs."""
    from perflab import env

    assigned = env.assigned_device()
    try:
        return {"assigned": assigned, "device": env.pick_device().type}
    except env.DeviceUnavailable as exc:
        return {"assigned": assigned, "error": str(exc)}


# Environment variables a notebook has no business setting: they steer perflab, Python and nbgrader.
WATCHED_ENV = re.compile(r"^(PERFLAB_|PYTHON|NBGRADER_|TORCH)")


def kernel_state() -> dict[str, Any]:
    """What hooks this kernel carries and the environment it runs with, as evidence for a person
    reviewing the submission (the kernel may hide them; nothing is decided from this)."""
    state: dict[str, Any] = {"trace": sys.gettrace() is not None, "profile": sys.getprofile() is not None,
                             "env": {k: v[:200] for k, v in os.environ.items() if WATCHED_ENV.match(k)}}
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:  # pragma: no cover
        shell = None
    if shell is not None:
        state["ast_transformers"] = [type(t).__name__ for t in getattr(shell, "ast_transformers", [])]
        state["input_transformers_post"] = [getattr(t, "__name__", type(t).__name__)
                                            for t in getattr(shell, "input_transformers_post", [])]
        manager = getattr(shell, "input_transformer_manager", None)
        state["input_transformers_cleanup"] = len(getattr(manager, "cleanup_transforms", []) or [])
        state["input_transformers_line"] = len(getattr(manager, "line_transforms", []) or [])
        events = getattr(getattr(shell, "events", None), "callbacks", {}) or {}
        state["event_callbacks"] = {name: [_where(f) for f in funcs] for name, funcs in events.items() if funcs}
    return state


def _where(fn: Any) -> str:
    """A callback's module and name (where a hook came from)."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def cell_source(lab: str, seed: int, out: str, grade_ids: list[str] | None = None) -> str:
    """The code of a cell the worker adds to the notebook (after each autograded cell)."""
    return (f"from perflab.grading import harness as _perflab_harness\n"
            f"_perflab_harness.run({lab!r}, {int(seed)}, {str(out)!r}, {grade_ids!r})\n")
