"""The planted performance bugs a mystery pipeline draws from.

Each bug is code a real training script carries: it trains exactly as the clean script does (the same
losses, the same samples), only slower, and one of lab 1's tools shows it. A bug puts its lines at one
site of the template (`perflab.mystery.template`), replacing that site's clean lines; some also need
a line of state in `Trainer.__init__` (`init`). A bug that costs time comes at a full dose, a light one
(the same mistake on a small part of the work, or done more cheaply), or both; each pipeline plants one
of its bugs light
and the others full, so what fixing each saves differs clearly, and a diagnosis must get the order right
(the grader's judge of the diagnosis). What each dose costs on a 2-core CPU at the graded sizes
is measured by `make bench-mystery`, never assumed.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Bug:
    """One planted bug: where it goes, what it is, what shows it and what fixes it."""

    key: str
    site: str
    lines: tuple[str, ...]  # replace the site's clean lines
    kind: str  # one of KINDS
    tool: str  # the tool that shows it best (one of TOOLS)
    symptom: str  # what that tool shows
    fix: str  # what the fix is, in words
    init: tuple[str, ...] = ()  # state it needs, in Trainer.__init__
    accepts: tuple[str, ...] = ()  # other bottleneck types a diagnosis may fairly name
    helpers: tuple[str, ...] = ()  # template functions whose lines also locate it (what it calls)
    # Whether fixing it saves step time. A bug that only holds memory does not: what its fix "saves"
    # of a step is the allocator's page faults, which depend on the process's history (the grader's
    # fresh process read 0.05-0.10 where the student's kernel read -0.1-0.0).
    costs_time: bool = True
    # Its dose. `lines` cost a full dose (a large share of a step); `light`, where a bug has one, is the
    # same mistake on a small part of the work (a few parameters, eight rows at a time, the head) or done
    # more cheaply (pixels through getdata), costing a small share;
    # `always_light` marks a bug whose `lines` cost only a small share already. Each pipeline plants one
    # of its bugs that cost time at a light dose and the others at a full one, so their savings are
    # clearly apart (`perflab.mystery.light_dose`): one guessed saving for every bug cannot agree with all.
    light: tuple[str, ...] = ()
    always_light: bool = False
    also: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (site, lines) a full dose also replaces

    def code(self, dose: str = "full") -> tuple[str, ...]:
        """Every line it plants at `dose` ("full" or "light"), in the order they appear in a pipeline."""
        light = dose == "light" and bool(self.light)
        return (*self.init, *(self.light if light else self.lines),
                *(line for _, lines in (() if light or self.always_light else self.also) for line in lines))

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every bottleneck type that counts as right for this bug."""
        return (self.kind, *self.accepts)

    def __post_init__(self) -> None:
        if self.site not in CLEAN or any(site not in CLEAN for site, _ in self.also):
            raise ValueError(f"{self.key}: no site {self.site!r}")
        if self.light and self.always_light:
            raise ValueError(f"{self.key}: a light dose of a bug that is always light")
        if self.kind not in KINDS or self.tool not in TOOLS:
            raise ValueError(f"{self.key}: kind {self.kind!r} or tool {self.tool!r} unknown")


CATALOGUE: tuple[Bug, ...] = (
    Bug("pixel_list", "load",
        ("small = image.resize((IMAGE_SIZE, IMAGE_SIZE))",
         "array = np.array([[[small.getpixel((x, y))[c] for c in range(3)] for x in range(IMAGE_SIZE)]",
         "                  for y in range(IMAGE_SIZE)], dtype=np.float32) / 255.0"),
        "data", "line_profiler",
        "one line of __getitem__ holds most of the data time: the image is read one pixel at a time",
        "np.asarray(image.resize(...)) reads all pixels at once, without a Python object for each",
        light=("small = image.resize((IMAGE_SIZE, IMAGE_SIZE))",
               "array = np.array(list(small.getdata()), dtype=np.float32).reshape(IMAGE_SIZE, IMAGE_SIZE, 3) / 255.0")),
    Bug("row_loop", "normalize",
        ("for c in range(3):",
         "    for row in range(IMAGE_SIZE):",
         "        for half in (slice(0, IMAGE_SIZE // 2), slice(IMAGE_SIZE // 2, IMAGE_SIZE)):",
         "            tensor[c, row, half] = (tensor[c, row, half] - MEAN_VALUES[c]) / STD_VALUES[c]"),
        "data", "line_profiler",
        "the normalisation runs one tensor operation per part of a row (or per few rows) of each channel: "
        "hundreds to thousands of hits a batch",
        "normalise the whole tensor at once: (tensor - MEAN) / STD",
        light=("for c in range(3):",
               "    for row in range(0, IMAGE_SIZE, 8):",
               "        tensor[c, row:row + 8] = (tensor[c, row:row + 8] - MEAN_VALUES[c]) / STD_VALUES[c]")),
    Bug("python_collate", "collate", ("collate_fn=python_collate,",),
        "data", "cProfile",
        "python_collate and Tensor.tolist show in the data time: every pixel goes through a Python float",
        "drop collate_fn: the default collate stacks the tensors without going through Python lists",
        helpers=("python_collate",), always_light=True),
    Bug("grad_histograms", "after_backward",
        ("self.histograms = {name: torch.histc(p.grad, bins=32).tolist()  # for the dashboard",
         "                   for name, p in self.model.named_parameters()}"),
        "sync", "torch.profiler",
        "aten::histc over the gradients, read back to Python, every step (on a GPU each read waits for it)",
        "compute histograms only on the steps that log them", accepts=("compute",),
        light=("self.histograms = {name: torch.histc(p.grad, bins=32).tolist()  # for the dashboard",
               "                   for name, p in self.model.named_parameters() if name.startswith(\"fc.\")}")),
    Bug("anomaly", "forward",
        ('with record_function("forward"), torch.autograd.detect_anomaly():  # catch NaNs early',),
        "sync", "cProfile",
        "every forward op records a Python stack trace for anomaly mode (traceback functions fill a step)",
        "anomaly detection is a debugging aid: leave it off for training", accepts=("compute",),
        also=(("backward", ('with record_function("backward"), torch.autograd.detect_anomaly():',)),)),
    Bug("eval_accuracy", "after_step",
        ("self.train_accuracy = accuracy(self.model, torch.cat([images, images.flip(-1)]),  # with flips",
         "                               labels.repeat(2))"),
        "compute", "torch.profiler",
        "every step runs the model's forward ops twice (twice the convolutions of one forward)",
        "measure accuracy once at the end, or from the outputs the step already has", helpers=("accuracy",)),
    Bug("snapshot", "after_step",
        ("self.best = (copy.deepcopy(self.model),  # keep the best checkpoint",
         "             copy.deepcopy(self.optimizer.state_dict()))"),
        "memory", "memory profiler",
        "a copy of the weights is allocated each step (tens of MiB per step through the allocator at a full dose)",
        "keep the best weights only when they are the best, once, not a copy every step",
        light=("self.best_head = copy.deepcopy(self.model.fc)  # keep the best classifier",)),
    Bug("batch_history", "after_step", ("self.seen.append(images)  # for a confusion matrix at the end",),
        "memory", "memory profiler",
        "resident memory grows by one batch every step and is never given back: every batch stays referenced",
        "keep what the analysis needs (the indices, or the predictions), not the image batches",
        init=("self.seen = []",), costs_time=False),
)

BY_KEY = {bug.key: bug for bug in CATALOGUE}
