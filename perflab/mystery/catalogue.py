"""The planted performance bugs a mystery pipeline draws from.

Each bug is code a real training script carries: it trains exactly as the clean script does (the same
losses, the same samples), only slower, and one of lab 1's tools shows it. A bug puts its lines at one
site of the template (`perflab.mystery.template`), replacing that site's clean lines; some also need
a line of state in `Trainer.__init__` (`init`). What it costs on a 2-core CPU at the graded sizes is
measured by `make bench-mystery`, never assumed.
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

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every bottleneck type that counts as right for this bug."""
        return (self.kind, *self.accepts)

    def __post_init__(self) -> None:
        if self.site not in CLEAN:
            raise ValueError(f"{self.key}: no site {self.site!r}")
        if self.kind not in KINDS or self.tool not in TOOLS:
            raise ValueError(f"{self.key}: kind {self.kind!r} or tool {self.tool!r} unknown")


CATALOGUE: tuple[Bug, ...] = (
    Bug("pixel_list", "load",
        ("small = image.resize((IMAGE_SIZE, IMAGE_SIZE))",
         "array = np.array([[small.getpixel((x, y)) for x in range(IMAGE_SIZE)] for y in range(IMAGE_SIZE)],",
         "                 dtype=np.float32) / 255.0"),
        "data", "line_profiler",
        "one line of __getitem__ holds most of the data time: the image is read one pixel at a time",
        "np.asarray(image.resize(...)) reads all pixels at once, without a Python object for each"),
    Bug("row_loop", "normalize",
        ("for c in range(3):",
         "    for row in range(IMAGE_SIZE):",
         "        tensor[c, row] = (tensor[c, row] - MEAN_VALUES[c]) / STD_VALUES[c]"),
        "data", "line_profiler",
        "the normalisation runs one tensor operation per row of each channel: thousands of hits a batch",
        "normalise the whole tensor at once: (tensor - MEAN) / STD"),
    Bug("python_collate", "collate", ("collate_fn=python_collate,",),
        "data", "cProfile",
        "python_collate and Tensor.tolist take a large share of the data time",
        "drop collate_fn: the default collate stacks the tensors without going through Python lists",
        helpers=("python_collate",)),
    Bug("grad_histograms", "after_backward",
        ("self.histograms = {name: torch.histc(p.grad, bins=32).tolist()  # for the dashboard",
         "                   for name, p in self.model.named_parameters()}"),
        "sync", "torch.profiler",
        "aten::histc over every gradient, read back to Python, every step (on a GPU each read waits for it)",
        "compute histograms only on the steps that log them", accepts=("compute",)),
    Bug("anomaly", "forward",
        ('with record_function("forward"), torch.autograd.detect_anomaly():  # catch NaNs early',),
        "sync", "cProfile",
        "every forward op records a Python stack trace for anomaly mode (traceback functions fill a step)",
        "anomaly detection is a debugging aid: leave it off for training", accepts=("compute",)),
    Bug("eval_accuracy", "after_step", ("self.train_accuracy = accuracy(self.model, images, labels)",),
        "compute", "torch.profiler",
        "every step runs the model's forward ops twice (twice the convolutions of one forward)",
        "measure accuracy once at the end, or from the outputs the step already has", helpers=("accuracy",)),
    Bug("snapshot", "after_step", ("self.best_model = copy.deepcopy(self.model)  # keep the best weights",),
        "memory", "memory profiler",
        "a copy of every weight is allocated each step (tens of MiB per step through the allocator)",
        "keep the best weights only when they are the best, once, not a copy every step"),
    Bug("batch_history", "after_step", ("self.seen.append(images)  # for a confusion matrix at the end",),
        "memory", "memory profiler",
        "resident memory grows by one batch every step and is never given back: every batch stays referenced",
        "keep what the analysis needs (the indices, or the predictions), not the image batches",
        init=("self.seen = []",), costs_time=False),
)

BY_KEY = {bug.key: bug for bug in CATALOGUE}
