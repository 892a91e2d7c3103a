"""A mystery pipeline per student: a ResNet-18 training script with planted performance bugs.

    from perflab import mystery

    case = mystery.for_student("alice")        # the same pipeline for the same id, every time
    case.write("mystery_pipeline.py")          # a plain script: run it, profile it, fix a copy

Which bugs (three of `catalogue.CATALOGUE`) and where they sit depend on a hash of the student's
id, and so does the run it trains (`RUN_ID` seeds its weights and sample order): two students'
answers do not carry over, and another student's fixed copy does not train as this pipeline does.
The script follows `perflab.verify`'s candidate contract (`make_step(seed)`), so the grader
re-measures a student's fixed copy against the planted one (`planted_step`) and checks that it
trains the same way.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perflab.mystery import template
from perflab.mystery.catalogue import BY_KEY, CATALOGUE, CLEAN, KINDS, TOOLS, Bug

__all__ = ["BUGS_PER_PIPELINE", "KINDS", "TOOLS", "Mystery", "Planted", "for_student", "light_dose",
           "planted_step", "sizes_for", "student_id"]

BUGS_PER_PIPELINE = 3
# Sites that take more than one bug (several things can go wrong after a step).
SITE_CAPACITY = {"after_step": 2}
# The data set, image side and batch of a mystery pipeline. One size for every mode but the kit's own
# tests, so the copy a student fixes at home is the pipeline the grader re-measures.
SIZES = {"tiny": ("tiny", 32, 16)}
DEFAULT_SIZES = ("small", 32, 16)
STUDENT_ENV = "PERFLAB_STUDENT_ID"
FILENAME = "mystery_pipeline.py"
_SITE = re.compile(r"^(?P<indent>\s*)#@ (?P<site>\w+)$")
_FUNCTION = re.compile(r"^(?P<indent>\s*)(def|class) (?P<name>\w+)")


@dataclass(frozen=True)
class Planted:
    """Where one bug sits in a student's script: its line numbers (1-based) and enclosing function."""

    key: str
    kind: str
    lines: tuple[int, ...]
    function: str  # qualified, e.g. "Trainer.step"
    helper_lines: tuple[int, ...] = ()  # lines of a function only it calls (a finding there counts too)
    dose: str = "full"  # "light" for the one bug planted on a small part of the work (`light_dose`)

    @property
    def accepted_lines(self) -> frozenset[int]:
        return frozenset(self.lines) | frozenset(self.helper_lines)


@dataclass(frozen=True)
class Mystery:
    """One student's pipeline: its source and what was planted in it."""

    student: str
    source: str
    planted: tuple[Planted, ...]
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

    return SIZES.get(mode or env.run_mode(), DEFAULT_SIZES)


def student_id(typed: str = "") -> str:
    """The id a pipeline is drawn for: the grader's (PERFLAB_STUDENT_ID, set when it grades), else
    `typed`, else the JupyterHub user. ValueError when there is none."""
    for value in (os.environ.get(STUDENT_ENV, ""), typed, os.environ.get("JUPYTERHUB_USER", "")):
        if str(value).strip():
            return str(value).strip()
    raise ValueError("no student id: type the id your instructor grades you under into MY_ID "
                     f"(or set {STUDENT_ENV} before starting Jupyter)")


def _seed(student: str) -> int:
    return int(hashlib.sha256(f"perflab-mystery:{student}".encode()).hexdigest()[:16], 16)


def _slug(text: str) -> str:
    return re.sub(r"\W", "_", text)[:40] or "anonymous"


def draw(student: str) -> tuple[Bug, ...]:
    """The bugs planted for `student`: BUGS_PER_PIPELINE of the catalogue, at most one per site
    (SITE_CAPACITY aside), of at least two bottleneck types, one of them a bug that costs time and can
    take a light dose."""
    rng = random.Random(_seed(student))
    while True:
        order = list(CATALOGUE)
        rng.shuffle(order)
        chosen: list[Bug] = []
        for bug in order:
            used = sum(b.site == bug.site for b in chosen)
            if used < SITE_CAPACITY.get(bug.site, 1):
                chosen.append(bug)
            if len(chosen) == BUGS_PER_PIPELINE:
                break
        # One bug that costs time must be able to take a light dose (`light_dose`).
        if len({b.kind for b in chosen}) >= 2 and any(b.costs_time and (b.light or b.always_light) for b in chosen):
            return tuple(chosen)


def light_dose(student: str, chosen: tuple[Bug, ...] | None = None) -> str | None:
    """The key of the bug `student`'s pipeline plants at a light dose (None when it has none): the bug
    that is always light where one was drawn, else one drawn at random of those with a light dose. The
    other bugs that cost time are planted at a full dose, so the light one's saving is clearly apart from
    theirs (`catalogue.Bug.light`)."""
    timed = [b for b in (draw(student) if chosen is None else chosen) if b.costs_time]
    always = [b.key for b in timed if b.always_light]
    if always:
        return always[0]
    candidates = [b.key for b in timed if b.light]
    return random.Random(_seed(student) ^ 0xD05E).choice(candidates) if candidates else None


_DRAWN = "<drawn>"


def for_student(student: str, mode: str | None = None, bugs: tuple[str, ...] | None = None,
                light: str | None = _DRAWN) -> Mystery:
    """`student`'s pipeline (`bugs`: these catalogue keys instead of the drawn ones; () for a clean one).
    `light`: the bug planted at a light dose (default: the one drawn for `student`, so a copy with some
    bugs left out keeps the others' doses; None plants every bug that has a full dose at it)."""
    student = str(student)
    if not student.strip():
        raise ValueError("student: an empty id draws no pipeline")
    rng = random.Random(_seed(student) ^ 0x5EED)
    chosen = draw(student) if bugs is None else tuple(BY_KEY[k] for k in bugs)
    if light == _DRAWN:
        light = light_dose(student)
    data, image_size, batch_size = sizes_for(mode)
    run_id = rng.randrange(1, 1_000_000)
    helpers = list(template.HELPERS)
    rng.shuffle(helpers)
    helpers = helpers[: rng.randint(2, len(helpers))]
    head = template.HEADER.format(student=student, filename=FILENAME, data=data, image_size=image_size,
                                  batch_size=batch_size, run_id=run_id)
    text = head + "".join("\n" + h for h in helpers) + template.DATASET + template.TRAINER
    doses = {b.key: ("light" if b.always_light or (b.key == light and b.light) else "full") for b in chosen}
    by_site: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for bug in chosen:
        lines = bug.light if doses[bug.key] == "light" and bug.light else bug.lines
        by_site.setdefault(bug.site, []).append((bug.key, lines))
        if doses[bug.key] == "full":
            for site, also in bug.also:
                by_site.setdefault(site, []).append((bug.key, also))
    out: list[str] = []
    where: dict[str, list[int]] = {b.key: [] for b in chosen}
    for line in text.splitlines():
        site = _SITE.match(line)
        if site is None:
            out.append(line)
            continue
        indent, name = site.group("indent"), site.group("site")
        if name == "init":
            for bug in chosen:
                for code in bug.init:
                    out.append(indent + code)
                    where[bug.key].append(len(out))
            continue
        placed = by_site.get(name, [])
        if not placed:
            out.extend(indent + code for code in CLEAN[name])
        for key, lines in placed:
            for code in lines:
                out.append(indent + code)
                where[key].append(len(out))
    source = "\n".join(out) + "\n"
    functions = _functions(out)
    planted = tuple(Planted(b.key, b.kind, tuple(sorted(where[b.key])), functions[max(where[b.key]) - 1],
                            tuple(i + 1 for i, f in enumerate(functions)
                                  if f.split(".")[0] in b.helpers and out[i].strip()), doses[b.key])
                    for b in chosen)
    return Mystery(student, source, planted, run_id)


def _functions(lines: list[str]) -> list[str]:
    """The qualified function (or class) each line belongs to ('' at module level)."""
    stack: list[tuple[int, str]] = []
    out = []
    for line in lines:
        match = _FUNCTION.match(line)
        if line.strip():
            indent = len(line) - len(line.lstrip())
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if match:
                stack.append((indent, match.group("name")))
        out.append(".".join(name for _, name in stack))
    return out


def planted_step(seed: int, student: str, data: str | None = None, mode: str | None = None) -> Any:
    """The planted pipeline's `make_step(seed)` (perflab's reference for the grader's re-measurement)."""
    module = for_student(student, mode).module()
    return module.make_step(seed, data) if data else module.make_step(seed)
