"""A mystery pipeline per student: a ResNet-18 training script with planted performance bugs.

    from perflab import mystery

    case = mystery.for_student("alice")        # the same pipeline for the same id, every time
    case.write("mystery_pipeline.py")          # a plain script: run it, profile it, fix a copy

Which code it carries (three snippets of `catalogue.SNIPPETS`) and where depend on a hash of the
student's id, and so does the run it trains (`RUN_ID` seeds its weights and sample order); the id also
draws edits that cost nothing (names of a few locals, comments, docstrings, a logging interval, the
order of helpers), so two students' scripts differ where nothing is planted too. Two students' answers
do not carry over, and another student's fixed copy does not train as this pipeline does. The script
follows `perflab.verify`'s candidate contract (`make_step(seed)`), so the grader re-measures a
student's fixed copy against the planted one (`planted_step`) and checks that it trains the same way.

This module writes pipelines; it does not say what is wrong with one. What was planted, where, and
how a diagnosis of it is judged is the grader's (it renders the same pipeline and keeps its own
account), and what each bug costs only measuring tells.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perflab.mystery import template
from perflab.mystery.catalogue import (
    AMOUNTS,
    CLEAN,
    KINDS,
    SNIPPET_BY_KEY,
    SNIPPETS,
    STEP_SITES,
    TOOLS,
    Snippet,
    with_amounts,
)

__all__ = ["BUGS_PER_PIPELINE", "KINDS", "TOOLS", "Mystery", "for_student", "planted_step", "sizes_for", "student_id"]

BUGS_PER_PIPELINE = 3
# Sites that take more than one snippet (several things can go wrong after a step).
SITE_CAPACITY = {"after_step": 2}
# The data set, image side and batch of a mystery pipeline. One size for every mode but the kit's own
# tests, so the copy a student fixes at home is the pipeline the grader re-measures.
SIZES = {"tiny": ("tiny", 32, 16)}
DEFAULT_SIZES = ("small", 32, 16)
STUDENT_ENV = "PERFLAB_STUDENT_ID"
FILENAME = "mystery_pipeline.py"
# Of the `#@ note` lines of the template, about this share becomes a comment.
NOTE_SHARE = 0.5
_SITE = re.compile(r"^(?P<indent>\s*)#@ (?P<site>\w+)$")
_CHOICE = re.compile(r"<<(\w+)>>")


@dataclass(frozen=True)
class Mystery:
    """One student's pipeline: its source and the run it trains."""

    student: str
    source: str
    run_id: int  # seeds the run; the pipeline's traces carry it in a "run <id>" label

    def write(self, path: str | os.PathLike[str] = FILENAME) -> Path:
        """Write the script to `path` (overwriting it) and return the path."""
        out = Path(path)
        out.write_text(self.source, encoding="utf-8")
        return out

    def module(self) -> types.ModuleType:
        """The script imported as a module (for the grader's baseline)."""
        module = types.ModuleType(f"perflab_mystery_{_slug(self.student)}")
        module.__file__ = f"<mystery pipeline of {self.student}>"
        exec(compile(self.source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - perflab's own code
        return module


def sizes_for(mode: str | None = None) -> tuple[str, int, int]:
    """(data set, image side, batch) of the mystery pipeline in `mode` (default: the mode in force)."""
    from perflab import env

    data, image_size, batch_size = SIZES.get(mode or env.run_mode(), DEFAULT_SIZES)
    return env.course_data() or data, image_size, batch_size


def student_id(typed: str = "") -> str:
    """The id a pipeline is drawn for: the grader's (PERFLAB_STUDENT_ID, set when it grades), else
    `typed`, else the JupyterHub user. ValueError when there is none."""
    for value in (os.environ.get(STUDENT_ENV, ""), typed, os.environ.get("JUPYTERHUB_USER", "")):
        if str(value).strip():
            return str(value).strip()
    raise ValueError("no student id: type the id your instructor grades you under into MY_ID "
                     f"(or set {STUDENT_ENV} before starting Jupyter)")


def for_student(student: str, mode: str | None = None) -> Mystery:
    """`student`'s pipeline, as `lab01_mystery.write_pipeline` writes it."""
    student = _checked(student)
    return _render(student, mode, _plan(student))


def planted_step(seed: int, student: str, data: str | None = None, mode: str | None = None) -> Any:
    """The planted pipeline's `make_step(seed)` (perflab's reference for the grader's re-measurement)."""
    module = for_student(student, mode).module()
    return module.make_step(seed, data) if data else module.make_step(seed)


# ---------------------------------------------------------------------------------------------
# Writing a pipeline (private: the grader's side renders the same way and keeps its own account)


def _checked(student: str) -> str:
    student = str(student)
    if not student.strip():
        raise ValueError("student: an empty id draws no pipeline")
    return student


def _seed(student: str) -> int:
    return int(hashlib.sha256(f"perflab-mystery:{student}".encode()).hexdigest()[:16], 16)


def _slug(text: str) -> str:
    return re.sub(r"\W", "_", text)[:40] or "anonymous"


def _draw(student: str) -> tuple[Snippet, ...]:
    """BUGS_PER_PIPELINE snippets for `student`, at most one per site (SITE_CAPACITY aside), at least one
    in the training step, one of them with a light form."""
    rng = random.Random(_seed(student))
    while True:
        order = list(SNIPPETS)
        rng.shuffle(order)
        chosen: list[Snippet] = []
        for snippet in order:
            used = sum(s.site == snippet.site for s in chosen)
            if used < SITE_CAPACITY.get(snippet.site, 1):
                chosen.append(snippet)
            if len(chosen) == BUGS_PER_PIPELINE:
                break
        if any(s.site in STEP_SITES for s in chosen) and any(s.light or s.always_light for s in chosen):
            return tuple(chosen)


def _light(student: str, chosen: tuple[Snippet, ...]) -> str | None:
    """The key of the snippet of `chosen` placed in its light form (None when none has one): the one that
    has only that form, else one drawn for `student` of those that have two."""
    always = [s.key for s in chosen if s.always_light]
    if always:
        return always[0]
    candidates = [s.key for s in chosen if s.light]
    return random.Random(_seed(student) ^ 0xD05E).choice(candidates) if candidates else None


def _doses(chosen: tuple[Snippet, ...], light: str | None) -> tuple[tuple[str, str], ...]:
    """(key, "light" or "full") of each of `chosen`, `light` (where it has two forms) in its light form."""
    return tuple((s.key, "light" if s.always_light or (s.key == light and s.light) else "full") for s in chosen)


def _amounts(student: str) -> dict[str, str]:
    """How much of the work each snippet takes in `student`'s pipelines (`catalogue.AMOUNTS`): drawn from
    the id alone, so every copy of one id's pipeline (one without a bug) keeps the others' amounts."""
    rng = random.Random(_seed(student) ^ 0xA307)
    return {name: rng.choice(options) for name, options in AMOUNTS.items()}  # in AMOUNTS' order


def _plan(student: str) -> tuple[tuple[str, str], ...]:
    chosen = _draw(student)
    return _doses(chosen, _light(student, chosen))


def _render(student: str, mode: str | None, plan: tuple[tuple[str, str], ...],
            placed: Callable[[str, int], None] | None = None) -> Mystery:
    """`student`'s pipeline carrying `plan`'s snippets ((key, dose), in order), at `mode`'s sizes. What
    does not depend on the plan (the run, the harmless edits) is drawn from the id alone, so two plans'
    pipelines of one id differ only where their snippets do. `placed(key, line)` is told the line
    (1-based) of each line a snippet places."""
    chosen = [(SNIPPET_BY_KEY[key], dose) for key, dose in plan]
    rng = random.Random(_seed(student) ^ 0x5EED)
    edits = random.Random(_seed(student) ^ 0xED17)  # harmless per-id edits, apart from the draws above
    from perflab.env import course_model

    data, image_size, batch_size = sizes_for(mode)
    run_id = rng.randrange(1, 1_000_000)
    helpers = list(template.HELPERS)
    rng.shuffle(helpers)
    helpers = helpers[: rng.randint(2, len(helpers))]
    called = list(template.CALLED)
    edits.shuffle(called)
    head = template.HEADER.format(student=student, filename=FILENAME, data=data, model=course_model(),
                                  image_size=image_size, batch_size=batch_size, run_id=run_id)
    text = head + "".join("\n" + h for h in helpers) + "".join(called) + template.DATASET + template.TRAINER
    choice = {name: edits.choice(options) for name, options in sorted(template.CHOICES.items())}
    text = _CHOICE.sub(lambda m: choice[m.group(1)], text)
    notes = edits.sample(template.NOTES, len(template.NOTES))
    amounts = _amounts(student)
    by_site: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for snippet, dose in chosen:
        lines = snippet.light if dose == "light" and snippet.light else snippet.lines
        by_site.setdefault(snippet.site, []).append((snippet.key, lines))
        if dose == "full":
            for site, also in snippet.also:
                by_site.setdefault(site, []).append((snippet.key, also))
    out: list[str] = []

    def put(key: str, line: str) -> None:
        out.append(line)
        if placed is not None:
            placed(key, len(out))

    for line in text.splitlines():
        site = _SITE.match(line)
        if site is None:
            out.append(line)
            continue
        indent, name = site.group("indent"), site.group("site")
        if name == "note":
            note = notes.pop()
            if edits.random() < NOTE_SHARE:
                out.append(indent + note)
            continue
        if name == "init":
            for snippet, _ in chosen:
                for code in snippet.init:
                    put(snippet.key, indent + with_amounts(code, amounts))
            continue
        placing = by_site.get(name, [])
        if not placing:
            out.extend(indent + code for code in CLEAN[name])
        for key, lines in placing:
            for code in lines:
                put(key, indent + with_amounts(code, amounts))
    return Mystery(student, "\n".join(out) + "\n", run_id)
