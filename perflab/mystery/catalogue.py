"""The code a mystery pipeline can carry at the template's sites (`perflab.mystery.template`).

Each snippet is lines a real training script carries, placed at one site of the template in place of
that site's clean lines; some also need a line of state in `Trainer.__init__` (`init`) or change a
second site (`also`). A snippet comes in one form (`lines`), or two (`light`: the same code on a
smaller part of the work); a `<<name>>` in its lines is an amount each id draws (`AMOUNTS`). This
module holds only what writing a pipeline needs: which snippets a student's pipeline holds, where and
why they are slow is for the student to measure (lab 1, part 10).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The bottleneck types a diagnosis names (lab 1's four-phase method).
KINDS = ("data", "sync", "compute", "memory")
# The tools a diagnosis may name as its evidence.
TOOLS = ("cProfile", "line_profiler", "memory profiler", "torch.profiler", "timer", "roofline")

# What a site holds in the clean pipeline.
CLEAN: dict[str, tuple[str, ...]] = {
    "load": ("array = np.asarray(image.resize((IMAGE_SIZE, IMAGE_SIZE)), dtype=np.float32) / 255.0",),
    "normalize": ("tensor = (tensor - MEAN) / STD",),
    "collate": (),
    "init": (),
    "input": (),
    "forward": ('with record_function("forward"):',),
    "backward": ('with record_function("backward"):',),
    "after_backward": (),
    "after_step": (),
}
# The sites inside the training step (`Trainer.step`); the others are on the data path.
STEP_SITES = frozenset({"input", "forward", "backward", "after_backward", "after_step"})


@dataclass(frozen=True)
class Snippet:
    """Code a pipeline can carry: the site it goes to and its lines."""

    key: str
    site: str
    lines: tuple[str, ...]  # replace the site's clean lines
    init: tuple[str, ...] = ()  # state it needs, in Trainer.__init__
    light: tuple[str, ...] = ()  # its second form, where it has one
    always_light: bool = False  # `lines` is its only form, and counts as the light one
    also: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (site, lines) the first form also replaces

    def code(self, dose: str = "full", amounts: dict[str, str] | None = None) -> tuple[str, ...]:
        """Every line it places in the form `dose` ("full" or "light"), in the order they appear, with an
        id's `amounts` (`AMOUNTS`) in place of its `<<name>>`s."""
        light = dose == "light" and bool(self.light)
        lines = (*self.init, *(self.light if light else self.lines),
                 *(line for _, lines in (() if light or self.always_light else self.also) for line in lines))
        return tuple(with_amounts(line, amounts or {}) for line in lines)

    def __post_init__(self) -> None:
        if self.site not in CLEAN or any(site not in CLEAN for site, _ in self.also):
            raise ValueError(f"{self.key}: no site {self.site!r}")
        if self.light and self.always_light:
            raise ValueError(f"{self.key}: a second form of a snippet that has one form")


SNIPPETS: tuple[Snippet, ...] = (
    Snippet("pixel_list", "load",
            ("small = image.resize((IMAGE_SIZE, IMAGE_SIZE))",
             "array = np.array([[<<pixel_read>> for x in range(IMAGE_SIZE)]",
             "                  for y in range(IMAGE_SIZE)], dtype=np.float32) / 255.0"),
            light=("small = image.resize((IMAGE_SIZE, IMAGE_SIZE))",
                   "array = np.array(list(small.getdata()), dtype=np.float32).reshape(IMAGE_SIZE, IMAGE_SIZE, 3) "
                   "/ 255.0")),
    Snippet("row_loop", "normalize",
            ("for c in range(3):",
             "    for row in range(IMAGE_SIZE):",
             "        for part in range(0, IMAGE_SIZE, <<row_part>>):",
             "            tensor[c, row, part:part + <<row_part>>] = ((tensor[c, row, part:part + <<row_part>>]"
             " - MEAN_VALUES[c]) / STD_VALUES[c])"),
            light=("for c in range(3):",
                   "    for row in range(0, IMAGE_SIZE, <<row_block>>):",
                   "        tensor[c, row:row + <<row_block>>] = ((tensor[c, row:row + <<row_block>>] - MEAN_VALUES[c])"
                   " / STD_VALUES[c])")),
    Snippet("python_collate", "collate", ("collate_fn=python_collate,",), always_light=True),
    Snippet("grad_histograms", "after_backward",
            ("self.histograms = {name: torch.histc(p.grad, bins=32).tolist()  # for the dashboard",
             "                   for name, p in list(self.model.named_parameters())[::<<histogram_every>>]}"),
            light=("self.histograms = {name: torch.histc(p.grad, bins=32).tolist()  # for the dashboard",
                   "                   for name, p in self.model.named_parameters() if name.startswith(\"fc.\")}")),
    Snippet("anomaly", "forward",
            ('with record_function("forward"), torch.autograd.detect_anomaly():  # catch NaNs early',),
            also=(("backward", ('with record_function("backward"), torch.autograd.detect_anomaly():',)),)),
    Snippet("eval_accuracy", "after_step",
            ("seen = images[:<<accuracy_seen>>]  # a sample of the batch, with flips",
             "self.train_accuracy = accuracy(self.model, torch.cat([seen, seen.flip(-1)]),",
             "                               labels[:<<accuracy_seen>>].repeat(2))")),
    Snippet("snapshot", "after_step",
            ("self.best = (copy.deepcopy(self.model),  # keep the best checkpoint",
             "             <<snapshot_state>>)"),
            light=("self.best_head = copy.deepcopy(self.model.fc)  # keep the best classifier",)),
    Snippet("batch_history", "after_step", ("self.seen.append(images)  # for a confusion matrix at the end",),
            init=("self.seen = []",)),
)

SNIPPET_BY_KEY = {snippet.key: snippet for snippet in SNIPPETS}

# How much of the work a snippet's `<<name>>` takes: each id draws one of each (`perflab.mystery`), so what
# a snippet costs differs from one pipeline to the next and is known only by measuring that pipeline.
# Each id draws them in this order (`perflab.mystery._amounts`): new ones go last, so the ids keep what
# they drew before.
AMOUNTS: dict[str, tuple[str, ...]] = {
    "accuracy_seen": ("8", "10", "12", "16"),  # images of the batch the accuracy is measured on
    "histogram_every": ("1", "2"),  # every parameter, or every other one
    "row_block": ("6", "8", "11"),  # rows per operation (3 to 6 operations a channel)
    "row_part": ("8", "11", "16"),  # columns per operation of a row (2 to 4 operations a row)
    # A Python call per channel of a pixel, or one per pixel.
    "pixel_read": ("[small.getpixel((x, y))[c] for c in range(3)]", "list(small.getpixel((x, y)))"),
    # The snapshot copies the optimizer's state, or the whole optimizer (its parameters a second time).
    "snapshot_state": ("copy.deepcopy(self.optimizer.state_dict())", "copy.deepcopy(self.optimizer)"),
}
_AMOUNT = re.compile(r"<<(\w+)>>")


def with_amounts(line: str, amounts: dict[str, str]) -> str:
    """`line` with each `<<name>>` of AMOUNTS replaced by `amounts[name]` (left as it is without one)."""
    return _AMOUNT.sub(lambda m: amounts.get(m.group(1), m.group(0)), line)
