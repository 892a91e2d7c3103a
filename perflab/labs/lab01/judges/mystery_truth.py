"""What lab 1's mystery pipelines plant, and how a diagnosis of each is judged: grader-only (the student
bundle leaves the labs' `judges/` out).

The student's kit writes each id's pipeline (`perflab.mystery`: nbgrader releases one folder to every
student and the notebook renders the pipeline from the id), so the code of the bugs ships; what does not
ship is any account of it: which snippets are bugs of what type, the tool that shows each, its symptom
and its fix, and on which lines of an id's pipeline each sits. This module holds that account and
recomputes the truth for an id by rendering its pipeline with the kit's own renderer, told where each
snippet's lines land (`truth`), so the lines are exact for the same source the student was given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from perflab import mystery
from perflab.mystery.catalogue import KINDS, SNIPPET_BY_KEY, SNIPPETS, TOOLS, Snippet

_FUNCTION = re.compile(r"^(?P<indent>\s*)(def|class) (?P<name>\w+)")


@dataclass(frozen=True)
class Bug:
    """One planted bug: the kit's snippet (`key`), what it is, what shows it and what fixes it."""

    key: str
    kind: str  # one of KINDS
    tool: str  # the tool that shows it best (one of TOOLS)
    symptom: str  # what that tool shows
    fix: str  # what the fix is, in words
    accepts: tuple[str, ...] = ()  # other bottleneck types a diagnosis may fairly name
    helpers: tuple[str, ...] = ()  # template functions whose lines also locate it (what it calls)
    # Whether fixing it saves step time. A bug that only holds memory does not: what its fix "saves"
    # of a step is the allocator's page faults, which depend on the process's history (the grader's
    # fresh process read 0.05-0.10 where the student's kernel read -0.1-0.0).
    costs_time: bool = True

    @property
    def snippet(self) -> Snippet:
        """Its code, as the kit plants it. A full dose is `lines` (a large share of a step); `light`, where it
        has one, is the same mistake on a small part of the work (a few parameters, eight rows at a time,
        the head) or done more cheaply (pixels through getdata), costing a small share; `always_light`
        marks a bug whose `lines` cost only a small share already. Each pipeline plants one of its bugs
        that cost time at a light dose and the others at a full one, so their savings are clearly apart
        (`light_dose`): one guessed saving for every bug cannot agree with all."""
        return SNIPPET_BY_KEY[self.key]

    @property
    def site(self) -> str:
        return self.snippet.site

    @property
    def lines(self) -> tuple[str, ...]:
        return self.snippet.lines

    @property
    def light(self) -> tuple[str, ...]:
        return self.snippet.light

    @property
    def always_light(self) -> bool:
        return self.snippet.always_light

    def code(self, dose: str = "full", amounts: dict[str, str] | None = None) -> tuple[str, ...]:
        """Every line it plants at `dose` ("full" or "light"), in the order they appear in a pipeline, with an
        id's drawn `amounts` (`mystery._amounts`)."""
        return self.snippet.code(dose, amounts)

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every bottleneck type that counts as right for this bug."""
        return (self.kind, *self.accepts)

    def __post_init__(self) -> None:
        if self.key not in SNIPPET_BY_KEY:
            raise ValueError(f"{self.key}: the kit has no such snippet")
        if self.kind not in KINDS or self.tool not in TOOLS or not set(self.accepts) <= set(KINDS):
            raise ValueError(f"{self.key}: kind {self.kind!r} or tool {self.tool!r} unknown")
        if not self.costs_time and (self.snippet.light or self.snippet.always_light):
            raise ValueError(f"{self.key}: a light dose of a bug that costs no time")


CATALOGUE: tuple[Bug, ...] = (
    Bug("pixel_list", "data", "line_profiler",
        "one line of __getitem__ holds most of the data time: the image is read one pixel at a time",
        "np.asarray(image.resize(...)) reads all pixels at once, without a Python object for each"),
    Bug("row_loop", "data", "line_profiler",
        "the normalisation runs one tensor operation per part of a row (or per few rows) of each channel: "
        "hundreds to thousands of hits a batch",
        "normalise the whole tensor at once: (tensor - MEAN) / STD"),
    Bug("python_collate", "data", "cProfile",
        "python_collate and Tensor.tolist show in the data time: every pixel goes through a Python float",
        "drop collate_fn: the default collate stacks the tensors without going through Python lists",
        helpers=("python_collate",)),
    Bug("grad_histograms", "sync", "torch.profiler",
        "aten::histc over the gradients, read back to Python, every step (on a GPU each read waits for it)",
        "compute histograms only on the steps that log them", accepts=("compute",)),
    Bug("anomaly", "sync", "cProfile",
        "every forward op records a Python stack trace for anomaly mode (traceback functions fill a step)",
        "anomaly detection is a debugging aid: leave it off for training", accepts=("compute",)),
    Bug("eval_accuracy", "compute", "torch.profiler",
        "every step runs the model's forward ops again on a sample of the batch and its flips (up to twice "
        "the convolutions of one forward)",
        "measure accuracy once at the end, or from the outputs the step already has", helpers=("accuracy",)),
    Bug("snapshot", "memory", "memory profiler",
        "a copy of the weights is allocated each step (tens of MiB per step through the allocator at a full dose)",
        "keep the best weights only when they are the best, once, not a copy every step"),
    Bug("batch_history", "memory", "memory profiler",
        "resident memory grows by one batch every step and is never given back: every batch stays referenced",
        "keep what the analysis needs (the indices, or the predictions), not the image batches",
        costs_time=False),
)

BY_KEY = {bug.key: bug for bug in CATALOGUE}
assert set(BY_KEY) == {s.key for s in SNIPPETS}, "every snippet the kit plants is a bug of this catalogue"


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
class Truth(mystery.Mystery):
    """One student's pipeline (as the kit writes it) and what was planted in it."""

    planted: tuple[Planted, ...] = ()


def draw(student: str) -> tuple[Bug, ...]:
    """The bugs planted for `student`: BUGS_PER_PIPELINE of the catalogue, at most one per site
    (SITE_CAPACITY aside), of at least two bottleneck types, one of them a bug that costs time and can
    take a light dose (the kit's draw)."""
    return tuple(BY_KEY[s.key] for s in mystery._draw(student))


def light_dose(student: str, chosen: tuple[Bug, ...] | None = None) -> str | None:
    """The key of the bug `student`'s pipeline plants at a light dose (None when it has none): the bug
    that is always light where one was drawn, else one drawn at random of those with a light dose. The
    other bugs that cost time are planted at a full dose, so the light one's saving is clearly apart from
    theirs."""
    bugs = draw(student) if chosen is None else chosen
    return mystery._light(student, tuple(b.snippet for b in bugs if b.costs_time))


_DRAWN = "<drawn>"


def pipeline(student: str, mode: str | None = None, bugs: tuple[str, ...] | None = None,
             light: str | None = _DRAWN) -> Truth:
    """`student`'s pipeline and its truth (`bugs`: these catalogue keys instead of the drawn ones; () for a
    clean one). `light`: the bug planted at a light dose (default: the one drawn for `student`, so a copy
    with some bugs left out keeps the others' doses; None plants every bug that has a full dose at it).
    Every variant of one id carries the same harmless edits, so two differ only at their bugs' lines."""
    student = mystery._checked(student)
    chosen = draw(student) if bugs is None else tuple(BY_KEY[k] for k in bugs)
    if light == _DRAWN:
        light = light_dose(student)
    plan = mystery._doses(tuple(b.snippet for b in chosen), light)
    where: dict[str, list[int]] = {b.key: [] for b in chosen}
    case = mystery._render(student, mode, plan, lambda key, line: where[key].append(line))
    out = case.source.splitlines()
    functions = _functions(out)
    doses = dict(plan)
    planted = tuple(Planted(b.key, b.kind, tuple(sorted(where[b.key])), functions[max(where[b.key]) - 1],
                            tuple(i + 1 for i, f in enumerate(functions)
                                  if f.split(".")[0] in b.helpers and out[i].strip()), doses[b.key])
                    for b in chosen)
    return Truth(case.student, case.source, case.run_id, planted)


def truth(student: str, mode: str | None = None) -> Truth:
    """What was planted in `student`'s pipeline at `mode`'s sizes (its source is `mystery.for_student`'s)."""
    return pipeline(student, mode)


def without(student: str, mode: str | None, key: str) -> Truth:
    """`student`'s pipeline with the bug `key` fixed and the others as planted (the grader's savings copies)."""
    return pipeline(student, mode, bugs=tuple(p.key for p in truth(student, mode).planted if p.key != key))


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
