"""Lab 3's figures and measurements: what the notebook times, counts and draws.

Fixed-seed loss curves per precision (`loss_curves`, `curve_summary`, `plot_loss_curves`), the aten-op
census under autocast (`op_census`) and census tables and bars (`census_table`, `plot_census`), timed
comparisons of AMP settings against the FP32 baseline (`compare_precisions`, `speedup_rows`,
`plot_speedups`) and the tensor-core shape demo (`matmul_shapes`). The notebook uses them; nothing here
is graded, and matplotlib is imported only by the plots.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from perflab import env
from perflab.labs.lab03 import (
    AMP_FIELDS,
    StepFn,
    as_dtype,
    baseline_config,
    dtype_name,
    make_scaler,
    sizes,
)
from perflab.labs.lab03.checks import loss_float
from perflab.workload import TrainConfig

# aten ops that only move or view data, left out of the op census (they have no precision of their
# own); casts (`_to_copy`) are kept: they are the price autocast pays at every precision boundary.
CENSUS_SKIP_OPS = frozenset({
    "detach", "view", "_unsafe_view", "t", "expand", "lift_fresh", "empty", "empty_like", "alias",
    "as_strided", "transpose", "permute", "reshape", "unsqueeze", "squeeze", "slice", "select",
    "clone", "copy_", "zeros", "zeros_like", "ones_like", "new_empty", "new_zeros", "fill_", "zero_",
    "_local_scalar_dense", "add_", "lift_fresh_copy", "contiguous", "split", "unbind",
})


def loss_curves(step: StepFn, precisions: Sequence[str], *, mode: str | None = None, steps: int | None = None,
                progress: Callable[[Any], Any] | None = None) -> dict[str, list[float]]:
    """Fixed-seed ResNet-18 runs on the lab's data through `step`, one per precision (fp32, bf16, fp16).

    Every run starts from the same initial weights and sees the same batches, so the curves differ by
    precision alone. fp16 runs get a GradScaler.
    """
    from perflab import workload

    config = baseline_config(mode)
    steps = steps or sizes(mode).curve_steps
    curves: dict[str, list[float]] = {}
    for name in precisions:
        dtype = as_dtype(name)
        work = workload.build(config)
        scaler = make_scaler(work.device.type, dtype)
        losses = []
        try:
            for _ in (progress or iter)(range(steps)):
                images, labels, _ = work.next_batch()
                images, labels = work.on_device(images, labels)  # augmented there on a fed GPU baseline
                losses.append(loss_float(step(work.model, work.optimizer, images, labels, dtype=dtype, scaler=scaler),
                                         f"{name} step {len(losses) + 1}"))
                work.steps_done += 1  # the device's augmentation is seeded by step
        finally:
            work.close()
        curves[name] = losses
    return curves


def curve_summary(curves: Mapping[str, Sequence[float]], reference: str = "fp32") -> dict[str, dict[str, float]]:
    """Per precision: its first and last loss, and its largest absolute and relative gap to `reference`."""
    ref = list(curves[reference])
    out = {}
    for name, losses in curves.items():
        gaps = [abs(a - b) for a, b in zip(ref, losses, strict=True)]
        rel = [g / max(abs(a), 1e-12) for g, a in zip(gaps, ref, strict=True)]
        out[name] = {"first": float(losses[0]), "last": float(losses[-1]), "max_abs_gap": max(gaps),
                     "max_rel_gap": max(rel), "finite": all(math.isfinite(v) for v in losses)}
    return out


class _OpCensus(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts each floating-point aten op that runs under it by the dtype of its first output tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        tensor = next((t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)), None)
        if name not in CENSUS_SKIP_OPS and tensor is not None and tensor.is_floating_point():
            self.counts[name][dtype_name(tensor.dtype)] += 1
        return out


def op_census(fn: Callable[[], Any]) -> dict[str, dict[str, int]]:
    """Every floating-point aten op `fn()` runs (forward and backward alike) by the dtype it produced.

    This sits below autocast, so it sees what really ran: the casts autocast inserted (`_to_copy`),
    convolutions and matmuls in the low dtype, and what autocast keeps in FP32.
    """
    census = _OpCensus()
    with census:
        fn()
    return {name: dict(c) for name, c in sorted(census.counts.items())}


def census_rows(census: Mapping[str, Mapping[str, int]]) -> list[dict[str, Any]]:
    """A census as table rows (name, then a count per dtype), most calls first."""
    dtypes = sorted({d for inner in census.values() for d in inner})
    rows = [{"name": name, **{d: int(inner.get(d, 0)) for d in dtypes}} for name, inner in census.items()]
    return sorted(rows, key=lambda r: (-sum(r[d] for d in dtypes), r["name"]))


def census_table(census: Mapping[str, Mapping[str, int]]) -> str:
    """A census as a fixed-width text table."""
    rows = census_rows(census)
    dtypes = sorted({d for inner in census.values() for d in inner})
    width = max([len("op / module")] + [len(r["name"]) for r in rows])
    lines = [f"{'op / module':<{width}}  " + "  ".join(f"{d:>9}" for d in dtypes)]
    lines += [f"{r['name']:<{width}}  " + "  ".join(f"{r[d] or '':>9}" for d in dtypes) for r in rows]
    return "\n".join(lines)


def plot_census(census: Mapping[str, Mapping[str, int]], title: str = "") -> Any:
    """A horizontal stacked bar per op or module: how many of its calls produced each dtype."""
    import matplotlib.pyplot as plt

    rows = census_rows(census)[::-1]
    dtypes = sorted({d for inner in census.values() for d in inner})
    colours = {"float32": "#4c72b0", "bfloat16": "#dd8452", "float16": "#55a868"}
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(rows) + 1.2))
    left = [0] * len(rows)
    for d in dtypes:
        values = [r[d] for r in rows]
        ax.barh([r["name"] for r in rows], values, left=left, label=d, color=colours.get(d))
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("calls")
    ax.legend(loc="lower right")
    ax.set_title(title or "which dtype each op produced")
    fig.tight_layout()
    return fig


def plot_loss_curves(curves: Mapping[str, Sequence[float]], title: str = "") -> Any:
    """The loss curves of a fixed-seed run per precision, on one axis, and their gap to FP32 below it."""
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ref = curves.get("fp32")
    for name, losses in curves.items():
        steps = range(1, len(losses) + 1)
        top.plot(steps, losses, marker="o" if len(losses) <= 30 else None, ms=3, label=name)
        if ref is not None and name != "fp32":
            bottom.plot(steps, [b - a for a, b in zip(ref, losses, strict=True)], label=f"{name} - fp32")
    top.set_ylabel("training loss")
    top.legend()
    top.set_title(title or "same seed, same batches: only the precision differs")
    bottom.axhline(0, color="grey", lw=0.8)
    bottom.set_xlabel("step")
    bottom.set_ylabel("gap to fp32")
    if len(curves) > 1:
        bottom.legend()
    fig.tight_layout()
    return fig


def compare_precisions(configs: Mapping[str, TrainConfig], *, mode: str | None = None, blocks: int | None = None,
                       progress: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Time each config's training step against the FP32 baseline's in interleaved one-step blocks (ABBA),
    each primed by an untimed step of its own side (`perflab.timing.interleaved_blocks`: the first step
    after the other side's is slower, and ABBA runs B after itself more often); Comparisons by name.

    One baseline workload serves every comparison; each candidate gets its own (same seed, same data).
    """
    from perflab import timing, workload
    from perflab.labs import homework

    s = sizes(mode)
    names = list(configs)

    def timed(n_blocks: int, warmup: int) -> dict[str, Any]:
        base = workload.build(baseline_config(mode))
        out = {}
        try:
            for name in (progress or iter)(names):
                work = workload.build(configs[name])
                try:
                    for _ in range(warmup):
                        workload.train_step(base)
                        workload.train_step(work)
                    a, b = timing.interleaved_blocks(
                        [lambda: workload.train_step(base), lambda w=work: workload.train_step(w)], n_blocks, 1,
                        sync=lambda i: env.synchronize(base.device))
                    out[name] = timing.Comparison(tuple(a), tuple(b), 1, labels=("fp32", name),
                                                  device=str(base.device), threads=torch.get_num_threads(),
                                                  warmup=warmup,
                                                  hardware_class=env.machine_info(base.device).hardware_class)
                finally:
                    work.close()
        finally:
            base.close()
        return out

    def decode(value: Any) -> dict[str, Any]:
        return {name: homework.comparison_from(value[name]) for name in names}

    def encode(out: dict[str, Any]) -> dict[str, Any]:
        where = homework.stamp(baseline_config(mode))  # whether the grader may hold it against its own
        return {k: {**homework.comparison_value(c), "where": where} for k, c in out.items()}

    # Matched by the names and by what each setting changes (an edited CANDIDATES times again).
    key = {"names": names, "changes": {name: {f: getattr(configs[name], f) for f in AMP_FIELDS} for name in names}}
    return homework.measured("lab03.compare_precisions", key,
                             lambda: timed(blocks or s.compare_blocks, s.compare_warmup),
                             quick=lambda: timed(homework.QUICK_BLOCKS, 1),
                             encode=encode, decode=decode, what="comparison of the precisions")


def speedup_rows(comparisons: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The `speedups` section of the results from named Comparisons."""
    return [comparison.as_speedup(name) for name, comparison in comparisons.items()]


def plot_speedups(comparisons: Mapping[str, Any], bar: float | None = None, title: str = "") -> Any:
    """Each setting's speedup over FP32 with its 95% CI; the grader's bar as a dashed line."""
    import matplotlib.pyplot as plt

    names = list(comparisons)
    values = [comparisons[n].speedup for n in names]
    cis = [comparisons[n].ci() for n in names]
    low = [v - ci.low for v, ci in zip(values, cis, strict=True)]
    high = [ci.high - v for v, ci in zip(values, cis, strict=True)]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.5))
    ax.barh(names, values, xerr=[low, high], color="#4c72b0", capsize=4)
    ax.axvline(1.0, color="grey", lw=1, label="FP32 baseline")
    if bar is not None:
        ax.axvline(bar, color="#c44e52", ls="--", lw=1, label=f"grader's bar {bar:.2f}x")
    ax.set_xlabel("speedup over FP32 (time FP32 / time setting), 95% CI")
    ax.legend(loc="lower right")
    ax.set_title(title or "what each precision setting gives on this machine")
    fig.tight_layout()
    return fig


def matmul_shapes(n: int, dtypes: Sequence[str] = ("fp32", "bf16"), device: str | None = None) -> list[dict[str, Any]]:
    """Time an n x n matmul against an (n-1) x (n-1) one per dtype: tensor cores want multiples of 8.

    Returns rows {"dtype", "n", "seconds", "tflops"}; the seconds are the median of perflab.timing.
    """
    from perflab import timing

    dev = env.pick_device(device)
    rows = []
    for name in dtypes:
        dtype = as_dtype(name)
        for side in (n, n - 1):
            a = torch.randn(side, side, device=dev).to(dtype)
            b = torch.randn(side, side, device=dev).to(dtype)
            m = timing.benchmark(lambda a=a, b=b: a @ b, device=dev, min_run_time=0.1,
                                 label=f"{name} {side}")
            rows.append({"dtype": name, "n": side, "seconds": m.median, "tflops": 2 * side**3 / m.median / 1e12})
    return rows
