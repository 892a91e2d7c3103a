"""The grader's side of the grading contract: judge the observations a notebook's probes returned.

Runs in the grading parent, a process that never runs student code. For every autograded cell a
lab has a judge (grader-only: `JUDGES` in its lab folder's `judges`, `perflab/labs/labNN/judges/` or
a course lab's `judges.py`):

    def judge_pick_workers(observed: Any, ctx: Context) -> Mark | None:
        for (sweep, tol), got in zip(pick_workers_cases(ctx.seed), observed["picked"]):
            assert got == {"value": reference(sweep, tol)}, f"pick_workers({sweep}, {tol}) gave {got}"

A judge draws the probe's inputs again from `ctx.seed`, computes the reference answers and compares.
It returns None (full marks) or a `Mark`, and raises AssertionError (0, the message is the
student's feedback line) on the first problem. Anything else it raises on malformed observations
(a KeyError, a TypeError) scores 0 too: observations come from the student's kernel and may be
anything. Re-measured speedups run here from the exported configuration (`ctx.verify`), with the
bar this process loads: nothing in the student's kernel reaches them.

    check_here(lab, grade_id, globals())   # a solution notebook's hidden block: probe + judge in-process

`Mark` and `Suspicious` live in `perflab.grading.marks` (which ships to students: the lab helpers
make marks too) and are importable from here as before.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from perflab.grading.marks import Mark, Suspicious
from perflab.grading.probing import run_probes
from perflab.labs import registry

log = logging.getLogger(__name__)

LAB_MODULE = re.compile(r"^(lab\d\d)_")
JUDGES_FILE = f"{registry.JUDGES}.py"  # a course lab's grader's side
# Lines of feedback from one judge's message (a long assertion message stays readable).
MESSAGE_MAX_CHARS = 600


@dataclass(frozen=True)
class Context:
    """What a judge may use besides the cell's own observation."""

    lab: str
    seed: int
    mode: str = "grade"  # the run mode grading uses (sizes of baselines and budgets)
    observations: Mapping[str, Any] = field(default_factory=dict)  # every cell's, by grade_id
    # Runs a `perflab.verify` child job where student code may run (the grading sandbox); None: a
    # plain child process (a solution notebook checking itself, the kit's tests).
    child_runner: Callable[..., Any] | None = None
    # Runs a program of the student's code (`run_program`) in the grading sandbox; None: a local process.
    program_runner: Callable[[str, float], tuple[int, str]] | None = None
    # The submission's student id (the grader's, never the notebook's): per-student work is drawn from it.
    student: str = ""
    # What the submitted notebook measured at home (`perflab.labs.homework.from_notebook`), read by the
    # judges of a decision it rests on; None where no submission was read (a solution checking itself).
    measured_at_home: tuple[Mapping[str, Any], ...] | None = None
    # What one judge measured that another of the same submission reads (`remembered`): lab 3's and lab 6's
    # decision cells hold the record against the re-measurement their verified cell grades, taken once.
    memo: dict[Any, Any] = field(default_factory=dict, compare=False)

    def remembered(self, key: Any, compute: Callable[[], Any]) -> Any:
        """`compute()` once per submission for `key` (a judge's re-measurement another judge reads too)."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def observed(self, grade_id: str) -> Any:
        """Another cell's observation (a verified cell reads the configuration its lab exported)."""
        entry = self.observations.get(grade_id) or {}
        if "observed" not in entry:
            raise AssertionError(entry.get("probe_error") or f"nothing was observed for {grade_id}")
        return entry["observed"]


    def run_program(self, program: str, timeout: float = 60.0) -> tuple[int, str]:
        """Run a Python program that holds student code (`python -I`), where it can reach nothing of
        the grader's: (exit status, its output)."""
        if self.program_runner is not None:
            return self.program_runner(program, timeout)
        import subprocess
        import sys

        try:
            done = subprocess.run([sys.executable, "-I", "-c", program], capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return -9, f"timeout after {timeout:.0f} s"
        return done.returncode, done.stdout + done.stderr

    def verify_module(self, baseline: Any, source: str, expectation_name: Any, *, label: str,
                      claim: float | None = None, max_pairs: int | None = None,
                      max_seconds: float | None = None, measure_activations: bool = False,
                      **factory_kwargs: Any) -> tuple[Any, Any]:
        """Re-measure a module of the student's code (`source`, following `perflab.verify.candidates`'
        contract; `factory_kwargs` go to its factory after the seed) against perflab's `baseline`, its
        child run by `child_runner` (in the grading sandbox): (verdict, expectation) as
        `perflab.labs.common.verify_against_bar` returns them (`expectation_name` may be an `Expectation`)."""
        import tempfile

        from perflab.labs.common import verify_against_bar
        from perflab.verify import Side

        with tempfile.TemporaryDirectory(prefix="perflab-candidate-") as tmp:
            path = Path(tmp) / "candidate.py"
            path.write_text(source, encoding="utf-8")
            return verify_against_bar(baseline, Side.module(path, label=label, **factory_kwargs), expectation_name,
                                      claim=claim,
                                      max_pairs=max_pairs, max_seconds=max_seconds, runner=self.child_runner,
                                      measure_activations=measure_activations)


Judge = Callable[[Any, Context], "Mark | None"]


def hidden_module(lab: str, source_folder: str | Path | None = None) -> ModuleType | None:
    """The grader's half of `lab` ("lab06_together" or "lab06"): its folder's `judges` (the lab's judges
    and its answer key: reference configurations and decisions, `calibration_pair`); None where this
    copy has none (a student's kit, or a sandbox that hides it)."""
    return registry.grader_side(lab, source_folder)


def judges_for(lab: str, source_folder: str | Path | None = None) -> dict[str, Judge] | None:
    """The lab's judges (grader-only), or None when it has none (perflab then refuses to grade it)."""
    module = hidden_module(lab, source_folder)
    judges = getattr(module, "JUDGES", None) if module is not None else None
    return dict(judges) if judges is not None else None


def warm_up(lab: str, mode: str = "grade") -> None:
    """Do what `lab`'s judges will need before its first notebook runs, graded in `mode` (its hidden
    module's `warm_up(mode)`, where it has one: lab 1 measures the machine while no notebook runs beside
    it, and starts the server its diagnosis judge measures in)."""
    module = hidden_module(lab)
    start = getattr(module, "warm_up", None) if module is not None else None
    if callable(start):
        try:
            start(mode)
        except Exception as exc:  # noqa: BLE001 (the judges meet the same fault per cell, and say so there)
            log.warning("%s: preparing its judges failed (%s: %s); each judge tries again when it grades",
                        lab, type(exc).__name__, exc)


def judge_cell(grade_id: str, judge: Judge, ctx: Context) -> Mark:
    """One cell's mark from its observation; never raises."""
    entry = ctx.observations.get(grade_id)
    if not isinstance(entry, dict) or not ({"observed", "probe_error"} & set(entry)):
        return Mark(0.0, "not checked: the notebook stopped before this cell's check ran (see the first "
                         "error or kernel death above it), or its answers could not be read")
    if "probe_error" in entry:
        return Mark(0.0, _short(str(entry["probe_error"])))
    try:
        mark = judge(entry["observed"], ctx)
    except Suspicious as exc:
        message = _short(str(exc)) or "a check failed"
        return Mark(0.0, message, flag=message)
    except AssertionError as exc:
        return Mark(0.0, _short(str(exc)) or "a check failed")
    except Exception as exc:  # observations are untrusted data: a malformed one fails the cell
        log.info("%s/%s: judge raised on the observation: %r", ctx.lab, grade_id, exc)
        return Mark(0.0, _short(f"the answer could not be checked ({type(exc).__name__}: {exc})"))
    return mark if mark is not None else Mark(1.0)


def _short(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MESSAGE_MAX_CHARS else text[:MESSAGE_MAX_CHARS] + " ..."


def check_here(lab: str, grade_id: str, namespace: Mapping[str, Any], seed: int = 0,
               mode: str | None = None) -> None:
    """Probe and judge one cell in this process (a solution notebook's hidden-test block): raises
    AssertionError with the grader's message when the answer would lose points."""
    from perflab import env
    from perflab.grading.harness import probes_for
    from perflab.mystery import STUDENT_ENV

    probes = probes_for(lab, Path.cwd()) or {}
    judges = judges_for(lab) or {}
    if grade_id not in probes or grade_id not in judges:
        raise KeyError(f"{lab}: no probe and judge for {grade_id!r}")
    observations = run_probes({grade_id: probes[grade_id]}, namespace, seed)
    student = os.environ.get(STUDENT_ENV, "") or str(namespace.get("STUDENT_ID", "") or "")
    ctx = Context(lab, seed, mode or env.run_mode(), observations, student=student)
    mark = judge_cell(grade_id, judges[grade_id], ctx)
    if mark.fraction < 1.0:
        raise AssertionError(mark.message or f"{grade_id}: {mark.fraction:.0%} of the points")


def grading_mode(env: Mapping[str, str] | None = None) -> str:
    """The mode a grading run's sizes follow: PERFLAB_MODE from the run's settings, else grade."""
    value = (env or {}).get("PERFLAB_MODE") or os.environ.get("PERFLAB_GRADE_MODE") or "grade"
    return value
