"""Report figures with matplotlib (an Agg canvas per figure, no pyplot state): readable in print and by colour-blind readers.

Every series differs by colour from the Okabe-Ito palette *and* by a hatch, marker or line
style, so a figure still reads in greyscale. Each function takes plain data and returns a
`Figure`; `png(fig)` renders it.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from perflab.report.model import Step

# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision deficiencies.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
HATCHES = ("", "//", "..", "xx", "\\\\", "oo", "--", "++")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
GOOD, BAD, NEUTRAL = OKABE_ITO[0], OKABE_ITO[5], "#7f7f7f"

# 110 dpi at 8 in wide: sharp on screen and in print at page width, ~50 KB a figure.
DPI = 110
P = ParamSpec("P")
WIDE = (8.0, 4.2)
# Roofline layers closer than this factor in intensity share one label (0.06 decades apart on the axis).
LABEL_CLUSTER_RATIO = 10 ** 0.06

_STYLE = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.6,
    "hatch.linewidth": 0.8,
    "legend.frameon": False,
    "savefig.bbox": "tight",
}

# A legend beside the axes, where it hides no point or bar (the tight bounding box keeps it).
OUTSIDE_RIGHT: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}

# Where a verdict is shown as a marker: a shape as well as a colour.
VERDICT_STYLE = {
    "pass": (GOOD, "o"),
    "fail": (BAD, "X"),
    "inconclusive": (OKABE_ITO[1], "D"),
}


def _styled(draw: Callable[P, Figure]) -> Callable[P, Figure]:
    """Draw the whole figure under the report's style (rc_context: nobody else's settings change)."""
    @functools.wraps(draw)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Figure:
        with matplotlib.rc_context(_STYLE):
            return draw(*args, **kwargs)
    return wrapper


def _figure(size: tuple[float, float] = WIDE) -> Figure:
    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # the Agg canvas, without touching pyplot's global backend
    return fig


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    with matplotlib.rc_context(_STYLE):
        fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return buf.getvalue()


def _axes(fig: Figure):
    return fig.add_subplot()


def _rate_unit(peak: float) -> tuple[float, str]:
    """The FLOP/s unit that keeps a device's peak between 1 and 1000 (a laptop CPU is not in TFLOP/s)."""
    for scale, unit in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if peak >= scale:
            return scale, unit
    return 1.0, "FLOP/s"


def _ci_err(value: float, ci: tuple[float, float] | None) -> list[list[float]]:
    if ci is None:
        return [[0.0], [0.0]]
    return [[max(value - ci[0], 0.0)], [max(ci[1] - value, 0.0)]]


# A waterfall bar's colour and hatch by what its step did (`Step.effect`): a step whose CI holds the level
# before it is drawn as noise, never as a gain (an A/A row always is).
WATERFALL_STYLE = {"gain": (GOOD, ""), "loss": (BAD, "//"), "within noise": (NEUTRAL, "..")}


@_styled
def waterfall(steps: Sequence[Step]) -> Figure:
    """Cumulative speedup: each bar spans from the previous level to the level after its change, coloured by
    `Step.effect` (gain, loss, or within noise)."""
    fig = _figure()
    ax = _axes(fig)
    level = 1.0
    names = ["baseline"]
    ax.bar(0, 1.0, color=NEUTRAL, edgecolor="black", linewidth=0.6)
    for i, step in enumerate(steps, start=1):
        colour, hatch = WATERFALL_STYLE[step.effect(level)]
        ax.bar(i, step.cumulative - level, bottom=level, color=colour, hatch=hatch, edgecolor="black",
               linewidth=0.6, label=step.effect(level))
        ax.errorbar(i, step.cumulative, yerr=_ci_err(step.cumulative, step.ci), fmt="none",
                    ecolor="black", capsize=4, linewidth=1)
        ax.plot([i - 1.4, i - 0.6], [level, level], color="black", linewidth=0.6, linestyle=":")
        ax.annotate(f"{step.cumulative:.2f}×", (i, max(step.cumulative, level)),
                    xytext=(0, 6 if step.ci is None else 14), textcoords="offset points",
                    ha="center", fontsize=9)
        level = step.cumulative
        names.append(step.name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.grid(axis="x", visible=False)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel("speedup over baseline (×)")
    ax.set_ylim(0, max([1.0] + [(s.ci[1] if s.ci else s.cumulative) for s in steps]) * 1.18)
    ax.set_title("Cumulative speedup, each change added in turn (bars: 95% CI)")
    ax.legend(handles=[Patch(facecolor=colour, edgecolor="black", hatch=hatch, label=effect)
                       for effect, (colour, hatch) in WATERFALL_STYLE.items()], **OUTSIDE_RIGHT)
    return fig


@_styled
def speedup_bars(rows: Sequence[tuple[str, float, tuple[float, float] | None, str | None]]) -> Figure:
    """Independent speedups (each against its own baseline) as horizontal bars with CIs."""
    fig = _figure((8.0, max(2.2, 0.42 * len(rows) + 1.2)))
    ax = _axes(fig)
    for i, (_name, value, ci, verdict) in enumerate(rows):
        colour, marker = VERDICT_STYLE.get(verdict or "", (NEUTRAL, "s"))
        ax.barh(i, value, color=colour, alpha=0.35, edgecolor="black", linewidth=0.6,
                hatch="" if value >= 1 else "//")
        ax.errorbar(value, i, xerr=_ci_err(value, ci), fmt=marker, color=colour, ecolor="black",
                    capsize=3, markeredgecolor="black")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("speedup against its own baseline (×)")
    ax.set_title("Each optimisation on its own (95% CI; marker: verification verdict)")
    ax.legend(handles=_verdict_handles(), fontsize=8, **OUTSIDE_RIGHT)
    return fig


def _verdict_handles() -> list[Line2D]:
    handles = [Line2D([], [], linestyle="none", marker=m, color=c, markeredgecolor="black", label=v)
               for v, (c, m) in VERDICT_STYLE.items()]
    handles.append(Line2D([], [], linestyle="none", marker="s", color=NEUTRAL,
                          markeredgecolor="black", label="not verified"))
    return handles


@_styled
def phase_bars(bars: Sequence[tuple[str, Mapping[str, float]]], order: Sequence[str]) -> Figure:
    """Stacked per-step time (ms) by phase for each labelled bar (e.g. 'lab02 before')."""
    fig = _figure((8.0, max(2.6, 0.55 * len(bars) + 1.6)))
    ax = _axes(fig)
    names = list(order) + sorted({k for _, b in bars for k in b} - set(order))
    for i, (_label, phases) in enumerate(bars):
        left = 0.0
        for j, name in enumerate(names):
            ms = phases.get(name, 0.0) * 1e3
            if ms <= 0:
                continue
            ax.barh(i, ms, left=left, color=OKABE_ITO[j % len(OKABE_ITO)],
                    hatch=HATCHES[j % len(HATCHES)], edgecolor="black", linewidth=0.5)
            left += ms
        ax.annotate(f"{left:.1f} ms", (left, i), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=9)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars])
    ax.invert_yaxis()
    ax.set_xlabel("time per training step (ms)")
    ax.set_xlim(0, max(sum(b.values()) for _, b in bars) * 1e3 * 1.15)
    ax.set_title("Where a step's time goes, before and after")
    present = [n for n in names if any(b.get(n, 0) > 0 for _, b in bars)]
    fig.legend(handles=[Patch(facecolor=OKABE_ITO[names.index(n) % len(OKABE_ITO)],
                             hatch=HATCHES[names.index(n) % len(HATCHES)], edgecolor="black",
                             label=n) for n in present],
              loc="outside lower center", ncol=min(len(present), 6))
    return fig


@_styled
def memory_lines(series: Sequence[tuple[str, bool, Sequence[tuple[int, float]]]],
                 device_bytes: float | None) -> Figure:
    """Peak memory (GiB) against batch size; solid circles plain, dashed squares checkpointed."""
    fig = _figure()
    ax = _axes(fig)
    for i, (label, checkpointed, points) in enumerate(series):
        xs = [p[0] for p in points]
        ys = [p[1] / 2**30 for p in points]
        ax.plot(xs, ys, color=OKABE_ITO[(i // 2 * 2 + (1 if checkpointed else 0)) % len(OKABE_ITO)],
                linestyle="--" if checkpointed else "-", marker="s" if checkpointed else "o",
                markeredgecolor="black", label=f"{label}, {'checkpointed' if checkpointed else 'no checkpointing'}")
    if device_bytes:
        ax.axhline(device_bytes / 2**30, color="black", linestyle=":", linewidth=1)
        ax.annotate(f"device memory {device_bytes / 2**30:.1f} GiB", (1.0, device_bytes / 2**30),
                    xycoords=("axes fraction", "data"), xytext=(-4, 4), textcoords="offset points",
                    ha="right", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("peak memory (GiB)")
    ax.set_title("Memory against batch size, with and without activation checkpointing")
    ax.legend(loc="center left", fontsize=8)
    return fig


@_styled
def roofline(peak_flops: float, peak_bandwidth: float,
             layers: Sequence[tuple[str, float, str]],
             achieved: tuple[float, float] | None) -> Figure:
    """Log-log roofline; layers (name, intensity, verdict) placed on the roof; the achieved point."""
    fig = _figure((8.0, 5.2))
    ax = _axes(fig)
    ridge = peak_flops / peak_bandwidth
    scale, unit = _rate_unit(peak_flops)
    xs = [x for _, x, _ in layers] + ([achieved[1]] if achieved else []) + [ridge]
    lo, hi = min(xs) / 4, max(xs) * 4
    grid = [lo * (hi / lo) ** (k / 200) for k in range(201)]

    def roof(x: float) -> float:
        return min(peak_flops, x * peak_bandwidth) / scale

    ax.plot(grid, [roof(x) for x in grid], color="black", linewidth=1.6,
            label="roof: min(peak compute, intensity × bandwidth)")
    ax.axvline(ridge, color=NEUTRAL, linestyle=":", linewidth=1)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, 0.03), xycoords=("data", "axes fraction"),
                xytext=(4, 0), textcoords="offset points", fontsize=8, color="#444444")
    kinds = sorted({v for _, _, v in layers})
    for k, kind in enumerate(kinds):
        pts = [(x, roof(x)) for _, x, v in layers if v == kind]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle="none",
                marker=MARKERS[k % len(MARKERS)], color=OKABE_ITO[(k + 1) % len(OKABE_ITO)],
                markeredgecolor="black", markersize=7, label=f"layer: {kind}")
    # Layers often share an intensity: one label per cluster of nearby points ("13,14"), clusters
    # alternately above and below the roof so that neighbours do not collide.
    order = sorted(range(len(layers)), key=lambda i: layers[i][1])
    clusters: list[list[int]] = []
    for i in order:
        if clusters and layers[i][1] / layers[clusters[-1][0]][1] < LABEL_CLUSTER_RATIO:
            clusters[-1].append(i)
        else:
            clusters.append([i])
    for c, members in enumerate(clusters):
        x = layers[members[0]][1]
        text = ",".join(str(i + 1) for i in sorted(members))
        ax.annotate(text, (x, roof(x)), xytext=(0, 8 if c % 2 == 0 else -14), textcoords="offset points",
                    fontsize=7, ha="center", color="#333333")
    if achieved:
        ax.plot([achieved[1]], [achieved[0] / scale], linestyle="none", marker="*", markersize=16,
                color=OKABE_ITO[5], markeredgecolor="black", label="achieved (whole step)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel(unit)
    ys = [roof(x) for x in xs] + ([achieved[0] / scale] if achieved else [])
    ax.set_ylim(min(ys) / 3, peak_flops / scale * 2)
    ax.set_title("Roofline: layers at their attainable rate (numbers: table below)")
    fig.legend(loc="outside lower center", ncol=2, fontsize=8)
    return fig


@_styled
def mfu_bars(rows: Sequence[tuple[str, float, float]]) -> Figure:
    """Achieved compute (TFLOP/s) against the device peak for each source, with MFU."""
    fig = _figure((8.0, max(2.0, 0.5 * len(rows) + 1.4)))
    ax = _axes(fig)
    scale, unit = _rate_unit(max(r[2] for r in rows))
    for i, (_label, achieved, peak) in enumerate(rows):
        ax.barh(i, peak / scale, color="white", edgecolor="black", hatch="//", linewidth=0.6)
        ax.barh(i, achieved / scale, color=GOOD, edgecolor="black", linewidth=0.6)
        ax.annotate(f"MFU {achieved / peak:.1%}", (achieved / scale, i), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=9,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title("Achieved compute against the device's peak")
    fig.legend(handles=[Patch(facecolor=GOOD, edgecolor="black", label="achieved"),
                        Patch(facecolor="white", edgecolor="black", hatch="//",
                              label="remaining gap to peak")],
               loc="outside lower center", ncol=2, fontsize=8)
    return fig


@_styled
def class_speedups(labs: Sequence[str], points: Sequence[tuple[str, float, str]],
                   title: str) -> Figure:
    """Re-measured speedups per lab: a box per lab, each submission a point shaped by its verdict."""
    fig = _figure((8.0, 4.2))
    ax = _axes(fig)
    data = [[v for lab, v, _ in points if lab == name] for name in labs]
    ax.boxplot([d if d else [float("nan")] for d in data], positions=range(len(labs)), widths=0.5,
               showfliers=False, medianprops={"color": "black"})
    for j, (lab, value, verdict) in enumerate(points):
        colour, marker = VERDICT_STYLE.get(verdict, (NEUTRAL, "s"))
        jitter = ((j * 37) % 11 - 5) / 40  # deterministic spread so equal values stay visible
        ax.plot(labs.index(lab) + jitter, value, linestyle="none", marker=marker, color=colour,
                markeredgecolor="black", markersize=6, alpha=0.85)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labs)), labs, rotation=15)
    ax.set_ylabel("re-measured speedup (×)")
    ax.set_title(title)
    ax.legend(handles=_verdict_handles(), fontsize=8, **OUTSIDE_RIGHT)
    return fig


@_styled
def class_scores(labs: Sequence[str], fractions: Mapping[str, Sequence[float]]) -> Figure:
    """Score distribution: a histogram of score/max per lab, stacked, hatched per lab."""
    fig = _figure((8.0, 3.8))
    ax = _axes(fig)
    bins = [i / 10 for i in range(11)]
    present = [lab for lab in labs if fractions.get(lab)]
    ax.hist([[100 * f for f in fractions[lab]] for lab in present], bins=[100 * b for b in bins],
            stacked=True, color=[OKABE_ITO[labs.index(lab) % len(OKABE_ITO)] for lab in present],
            hatch=None, edgecolor="black", linewidth=0.5, label=present)
    for patches, lab in zip(ax.containers, present, strict=False):
        for patch in patches:
            patch.set_hatch(HATCHES[labs.index(lab) % len(HATCHES)])
    ax.set_xlabel("score (% of the lab's points)")
    ax.set_ylabel("submissions")
    ax.set_title("Score distribution (stacked by lab)")
    ax.legend(fontsize=8, **OUTSIDE_RIGHT)
    return fig
