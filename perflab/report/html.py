"""The student's optimization report as one self-contained HTML page (figures inlined as PNG).

Every section has a stable DOM id (`SECTIONS`); a section whose data no results file holds
says "not measured" and names what would measure it. Nothing on the page is fetched from
the network: the CSS is inline, fonts are the reader's own, figures are data: URIs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from perflab.labs import registry
from perflab.report import figures, markdown
from perflab.report.layout import (  # noqa: F401 - the page kit, re-exported where callers read it
    CSS,
    NOT_MEASURED,
    Report,
    badge,
    esc,
    figure_html,
    fmt_bandwidth,
    fmt_bytes,
    fmt_ci,
    fmt_flops,
    fmt_num,
    fmt_seconds,
    not_measured,
    page,
    section,
    table,
)
from perflab.report.model import (
    ABLATION_LABS,
    LabResults,
    ResultsSet,
    is_cumulative,
    numeric_items,
    waterfall_steps,
)
from perflab.throughput import Throughput


def _either(sources: Sequence[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return " or ".join([", ".join(sources[:-1]), sources[-1]] if len(sources) > 1 else sources)


def measured_by(section: str, *others: str) -> str:
    """What measures report section `section`: the labs whose manifest lists it (the ablation labs'
    speedups said so), in course order, then `others` (`perflab profile`)."""
    labs = [lab.lab + (" (the cumulative ablation)" if lab.ablation and section == "speedups" else "")
            for lab in registry.manifests() if section in lab.report_sections]
    return _either([*labs, *others])


PROFILE = "`perflab profile`"
# (DOM id, heading, what measures it when it is missing), in page order.
SECTIONS = (
    ("machine", "Machine and settings", "every results file records it"),
    ("baseline", "Baseline", measured_by("baseline", PROFILE)),
    ("speedups", "Speedups", measured_by("speedups")),
    ("phases", "Step-time breakdown", measured_by("phases", PROFILE)),
    ("memory", "Memory against batch size", measured_by("memory")),
    ("roofline", "Roofline", measured_by("roofline", PROFILE)),
    ("top-ops", "Top operations", measured_by("top-ops", PROFILE)),
    ("mfu", "Remaining gap to peak (MFU)", measured_by("mfu", PROFILE)),
    ("verification", "Verification", "the autograder (`perflab grade`)"),
    ("analysis", "Written analysis", measured_by("analysis")),
)
SECTION_IDS = tuple(s[0] for s in SECTIONS)

# perflab.phases.PHASES, repeated so that rendering a report never imports torch (a test checks they agree).
PHASE_ORDER = ("data", "h2d", "augment", "forward", "backward", "optimizer")

# The parts of `memory_budget` that add up to a step's memory; other keys (a measured peak) are shown apart.
BUDGET_PARTS = ("parameters", "gradients", "optimizer", "activations")

# Top-ops tables list this many rows: the head of the distribution is what a reader acts on.
TOP_OPS_ROWS = 15
TOP_OPS_BAR_PX = 80  # the widest share bar; fits beside its percentage in a 1100 px page


# ---------------------------------------------------------------- the student report

class _Builder:
    """Collects figures while the sections are rendered."""

    def __init__(self, rs: ResultsSet) -> None:
        self.rs = rs
        self.figures: dict[str, bytes] = {}

    def fig(self, name: str, figure: Any, alt: str, caption: str = "") -> str:
        data = figures.png(figure)
        self.figures[name] = data
        return figure_html(name, data, alt, caption)

    def source(self, items: Sequence[LabResults]) -> str:
        parts = []
        for item in items:
            tag = self.rs.machine_tag(item)
            parts.append(f"{esc(item.lab)}" + (f" ({esc(tag)})" if tag else ""))
        return "from " + ", ".join(parts) if parts else ""


def render(rs: ResultsSet, title: str | None = None) -> Report:
    """Render the optimization report of a set of results files."""
    b = _Builder(rs)
    warnings = []
    body = []
    if rs.mixed_machines:
        lines = []
        for key, items in rs.machines():
            tag = rs.machine_tag(items[0])
            lines.append(f"<li><b>{esc(tag)}</b>: {esc(key[1])} ({esc(key[0])}) — "
                         + ", ".join(esc(i.lab) for i in items) + "</li>")
        text = (f"These results come from {len(rs.machines())} different machines; numbers "
                "measured on different hardware are not comparable.")
        warnings.append(text)
        body.append(f'<div class="banner" id="mixed-machines" role="alert"><strong>Warning: mixed '
                    f"machines.</strong> {esc(text)} Each section names the machine of its "
                    f"data.<ul>{''.join(lines)}</ul></div>")
    for item, row, again in rs.mismatched_speedups():
        text = (f"{item.lab}: the speedup '{row['name']}' says {float(row['speedup']):.2f}x, but its own raw "
                f"samples give {again:.2f}x; the file was edited after it was measured.")
        warnings.append(text)
        body.append(f'<div class="banner" role="alert"><strong>Warning: a number that does not match its '
                    f"measurements.</strong> {esc(text)}</div>")
    renderers = {
        "machine": _machine, "baseline": _baseline, "speedups": _speedups, "phases": _phases,
        "memory": _memory, "roofline": _roofline, "top-ops": _top_ops, "mfu": _mfu,
        "verification": _verification, "analysis": _analysis,
    }
    for sid, heading, hint in SECTIONS:
        content, source = renderers[sid](b)
        body.append(section(sid, heading, content if content else not_measured(hint), source))
    labs = ", ".join(i.lab for i in rs.items)
    title = title or "Optimization report: ResNet-18 training"
    subtitle = esc(f"{len(rs.items)} results file{'s' if len(rs.items) != 1 else ''}: {labs}")
    return Report(page(title, subtitle, [(s[0], s[1]) for s in SECTIONS], "".join(body)),
                  dict(b.figures), tuple(warnings))


_MACHINE_ROWS = (
    ("device", "device"), ("device name", "device_name"), ("hardware class", "hardware_class"),
    ("GPU memory", "gpu_memory_bytes"), ("CPU", "cpu_model"), ("CPU cores", "cpu_count"),
    ("bf16 in CPU hardware", "cpu_bf16"), ("torch threads", "threads"), ("Python", "python"),
    ("torch", "torch"), ("torchvision", "torchvision"), ("CUDA", "cuda"), ("cuDNN", "cudnn"),
    ("TF32 matmul", "tf32_matmul"), ("TF32 cuDNN", "tf32_cudnn"),
    ("cudnn.benchmark", "cudnn_benchmark"), ("platform", "platform"),
)


def _machine_value(key: str, value: Any) -> str:
    if value is None:
        return "–"
    if key == "gpu_memory_bytes":
        return fmt_bytes(value)
    if key == "cpu_bf16":
        return "yes" if value else "no"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _machine(b: _Builder) -> tuple[str, str]:
    groups = b.rs.machines()
    heads = ["setting"] + [b.rs.machine_tag(items[0]) or "value" for _, items in groups]
    rows = [[label] + [_machine_value(key, items[0].machine.get(key)) for _, items in groups]
            for label, key in _MACHINE_ROWS
            if any(items[0].machine.get(key) is not None for _, items in groups)]
    out = [table(heads, rows)]
    files = [[i.lab, i.path.name, i.created, b.rs.machine_tag(i) or i.machine.get("hardware_class", "")]
             for i in b.rs.items]
    out.append("<h3>Results files</h3>" + table(["lab", "file", "created", "machine"], files))
    configs = [i for i in b.rs.items if i.config]
    if configs:
        keys = sorted({k for i in configs for k in i.config})
        rows = [[k] + [_machine_value(k, i.config.get(k)) for i in configs] for k in keys]
        out.append("<details><summary>Training configuration of each lab</summary>"
                   + table(["knob"] + [i.lab for i in configs], rows) + "</details>")
    return "".join(out), ""


def _stat(stat: dict[str, Any] | None) -> tuple[str, str]:
    if not isinstance(stat, dict) or "median" not in stat:
        return "–", "–"
    unit = stat.get("unit", "")
    if unit == "s":
        return fmt_seconds(stat["median"]), (
            f"{fmt_seconds(stat['ci'][0])} – {fmt_seconds(stat['ci'][1])}" if "ci" in stat else "–")
    return f"{fmt_num(stat['median'])} {esc(unit)}", fmt_ci(stat.get("ci"), f" {unit}")


def _stall_line(baseline: dict[str, Any]) -> str | None:
    """The stalls of a wall throughput recomputed from its raw step seconds ('1 step in 7 waits ...')."""
    tp = baseline.get("throughput")
    if not (isinstance(tp, dict) and tp.get("statistic") == "samples over wall time" and tp.get("samples")):
        return None
    steps = tp["samples"]
    samples = round(tp["median"] * sum(steps) / len(steps))
    return Throughput(tuple(steps), max(1, samples)).stall_line()


def _baseline(b: _Builder) -> tuple[str, str]:
    items = b.rs.having("baseline")
    if not items:
        return "", ""
    first = items[0].sections["baseline"]
    out = []
    tp = first.get("throughput")
    if isinstance(tp, dict) and "median" in tp:
        ci = tp.get("ci")
        out.append(f'<div class="kpi"><b>{fmt_num(tp["median"])} {esc(tp.get("unit", ""))}</b>'
                   f"<span>baseline throughput ({esc(tp.get('statistic') or 'median step')}), "
                   f"95% CI {esc(fmt_ci(ci))}</span></div>")
    st = first.get("step_time")
    if isinstance(st, dict) and "median" in st:
        out.append(f'<div class="kpi"><b>{esc(_stat(st)[0])}</b><span>median step time</span></div>')
    ceilings = [(item, item.sections["ceiling"]) for item in b.rs.having("ceiling")]
    if ceilings:
        item, ceiling = ceilings[-1]
        out.append(f'<div class="kpi"><b>{ceiling["share"]:.0%}</b><span>of the ceiling: what this device gives '
                   f"the same step with no data path ({esc(item.lab)})</span></div>")
    rows = []
    for item in items:
        base = item.sections["baseline"]
        what = (base.get("throughput") or {}).get("statistic") or "median step"
        beside = base.get("median_step_throughput")
        rows.append([item.lab, *_stat(base.get("throughput")), what,
                     _stat(beside)[0] if isinstance(beside, dict) else "–", *_stat(base.get("step_time"))])
    out.append(table(["source", "throughput", "95% CI", "measured as", "at the median step", "step time (median)",
                      "95% CI"], rows, numeric=(1, 2, 4, 5, 6)))
    if ceilings:
        out.append("<h3>Ceiling</h3><p>The run's own training step timed on one batch already on the device, in "
                   "the model's layout (same model, optimizer, precision, memory format and compile mode; no "
                   "loader, no copy, no augmentation): the pipeline's throughput as a share of it says how much "
                   "of the step the data path costs.</p>")
        out.append(table(["source", "pipeline", "ceiling", "95% CI", "share of the ceiling"],
                         [[item.lab, _stat(item.sections.get("baseline", {}).get("throughput"))[0],
                           *_stat(ceiling["throughput"]), f"{ceiling['share']:.0%}"] for item, ceiling in ceilings],
                         numeric=(1, 2, 3, 4)))
    stalls = [(item.lab, line) for item in items if (line := _stall_line(item.sections["baseline"]))]
    if stalls:
        out.append("<p>" + "<br>".join(f"{esc(lab)}: {esc(line)}" for lab, line in stalls) + "</p>")
    counts = b.rs.latest("counts")
    if counts:
        out.append(f"<p>Model: {esc(_counts_text(counts.sections['counts']))} ({esc(counts.lab)}).</p>")
    diag = b.rs.having("bottleneck")
    if diag:
        keys = [k for k in _DIAGNOSIS_COLUMNS if any(i.sections["bottleneck"].get(k) for i in diag)]
        out.append("<h3>Diagnosis</h3>" + table(
            ["source"] + [_DIAGNOSIS_COLUMNS[k] for k in keys],
            [[i.lab] + [str(i.sections["bottleneck"].get(k) or "–") for k in keys] for i in diag]))
    return "".join(out), b.source(items)


_DIAGNOSIS_COLUMNS = {"verdict": "bottleneck", "component": "component", "operation": "operation",
                      "reason": "why", "next_step": "try next"}


def _counts_text(c: dict[str, Any]) -> str:
    """Parameters and FLOPs; `flops_forward`/`flops_train` are per sample when per-step totals sit beside them."""
    def num(key: str) -> float | None:
        v = c.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    parts = []
    if num("parameters") is not None:
        parts.append(f"{num('parameters') / 1e6:.2f} M parameters")
    per_step = num("flops_train_per_step") is not None or num("flops_forward_per_step") is not None
    unit = "per sample" if per_step else "per batch"
    if num("flops_forward") is not None:
        parts.append(f"{fmt_flops(num('flops_forward'))} forward {unit}")
    if num("flops_train") is not None:
        parts.append(f"{fmt_flops(num('flops_train'))} forward+backward {unit}")
    if num("flops_train_per_step") is not None:
        batch = f" (batch {int(num('batch_size'))})" if num("batch_size") else ""
        parts.append(f"{fmt_flops(num('flops_train_per_step'))} per training step{batch}")
    return ", ".join(parts) or "no counts recorded"


def _speedups(b: _Builder) -> tuple[str, str]:
    out = []
    sources = []
    ablation = [i for i in b.rs.having("speedups")
                if any(is_cumulative(i, r) for r in i.sections["speedups"])]
    if ablation:
        item = ablation[-1]
        steps = waterfall_steps([r for r in item.sections["speedups"] if is_cumulative(item, r)])
        out.append(b.fig("speedup-waterfall", figures.waterfall(steps),
                         "Waterfall of cumulative speedups with 95% confidence intervals",
                         f"Cumulative ablation from {item.lab}: each bar adds one change to all before it."))
        rows, prev = [], 1.0
        for s in steps:
            effect = "A/A: the noise floor" if s.aa else s.effect(prev)
            rows.append([esc(s.name), f"{s.cumulative:.2f}×", esc(fmt_ci(s.ci, "×", 3)),
                         f"{s.cumulative / prev:.2f}×", esc(effect), badge(s.verdict)])
            prev = s.cumulative
        out.append(table(["change added", "cumulative speedup", "95% CI", "this step", "effect", "verdict"],
                         rows, numeric=(1, 2, 3), raw=True))
        sources.append(item)
    else:
        out.append(not_measured(_either([f"{lab} (the cumulative ablation)" for lab in ABLATION_LABS]))
                   .replace(NOT_MEASURED, f"Cumulative waterfall {NOT_MEASURED}", 1))
    single = [(i, r) for i in b.rs.having("speedups") for r in i.sections["speedups"]
              if not is_cumulative(i, r)]
    if single:
        bars = [(f"{i.lab.split('_')[0]}: {r['name']}", float(r["speedup"]),
                 tuple(r["ci"]) if "ci" in r else None, r.get("verdict")) for i, r in single]
        out.append("<h3>Each optimisation on its own</h3>")
        out.append(b.fig("speedups-single", figures.speedup_bars(bars),
                         "Speedup of each optimisation against its own baseline, with 95% CIs"))
        out.append(table(
            ["lab", "optimisation", "speedup", "95% CI", "claimed", "verdict"],
            [[esc(i.lab), esc(r["name"]), f"{r['speedup']:.2f}×", esc(fmt_ci(r.get("ci"), "×")),
              f"{r['claimed']:.2f}×" if isinstance(r.get("claimed"), (int, float)) else "–",
              badge(r.get("verdict"))] for i, r in single],
            numeric=(2, 3, 4), raw=True))
        sources.extend(i for i, _ in single if i not in sources)
    predicted = [(i, p) for i in b.rs.having("predictions") for p in i.sections["predictions"]]
    if predicted:
        out.append("<h3>Predicted, then measured</h3>")
        out.append(table(
            ["lab", "prediction of", "predicted", "measured", "why (written before measuring)"],
            [[esc(i.lab), esc(p["name"]), _predicted_value(p.get("predicted"), p.get("unit", "")),
              _predicted_value(p.get("measured"), p.get("unit", ""), "–"), esc(p.get("why") or "–")]
             for i, p in predicted], numeric=(2, 3), raw=True))
        sources.extend(i for i, _ in predicted if i not in sources)
    if not sources:
        return "", ""
    return "".join(out), b.source(sources)


def _predicted_value(value: Any, unit: str, missing: str = "none written") -> str:
    """A prediction or its measurement in a table cell; a missing one says `missing`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return missing
    return esc(f"{value:.3g}{'×' if unit == 'x' else unit}")


def _phases(b: _Builder) -> tuple[str, str]:
    items = b.rs.having("phases")
    if not items:
        return "", ""
    bars = []
    for item in items:
        data = item.sections["phases"]
        for when in ("before", "after"):
            if isinstance(data.get(when), dict) and numeric_items(data[when]):
                label = item.lab.split("_")[0] + ("" if "after" not in data else f" {when}")
                bars.append((label, numeric_items(data[when])))
    if not bars:
        return "", ""
    out = [b.fig("phases", figures.phase_bars(bars, PHASE_ORDER),
                 "Stacked bars of time per training step by phase, before and after optimisation")]
    names = list(PHASE_ORDER) + sorted({k for _, p in bars for k in p} - set(PHASE_ORDER))
    rows = []
    for name in names:
        if any(p.get(name, 0) > 0 for _, p in bars):
            rows.append([name] + [f"{p.get(name, 0) * 1e3:.1f} ms ({p.get(name, 0) / sum(p.values()):.0%})"
                                  for _, p in bars])
    rows.append(["total"] + [f"{sum(p.values()) * 1e3:.1f} ms" for _, p in bars])
    out.append(table(["phase"] + [label for label, _ in bars], rows,
                     numeric=range(1, len(bars) + 1)))
    older = [item.lab for item in items if (item.config or {}).get("gpu_augment")
             and not any("augment" in (item.sections["phases"].get(when) or {}) for when in ("before", "after"))]
    if older:
        out.append(f"<p>{esc(', '.join(older))}: written before the augmentation on the device was timed as its "
                   "own phase; its h2d includes that augmentation.</p>")
    return "".join(out), b.source(items)


def _memory(b: _Builder) -> tuple[str, str]:
    out = []
    items = b.rs.having("memory_vs_batch")
    if items:
        series = []
        for item in items:
            for ckpt in (False, True):
                pts = sorted((int(r["batch_size"]), float(r["bytes"]))
                             for r in item.sections["memory_vs_batch"]
                             if bool(r.get("checkpointed", False)) == ckpt)
                if pts:
                    series.append((item.lab.split("_")[0], ckpt, pts))
        device_bytes = items[-1].machine.get("gpu_memory_bytes")
        out.append(b.fig("memory", figures.memory_lines(series, device_bytes),
                         "Peak memory against batch size with and without activation checkpointing"))
        batches = sorted({p[0] for _, _, pts in series for p in pts})
        rows = []
        for bs in batches:
            row = [str(bs)]
            for _label, _ckpt, pts in series:
                hit = [v for x, v in pts if x == bs]
                row.append(fmt_bytes(hit[0]) if hit else "–")
            rows.append(row)
        out.append(table(["batch size"] + [f"{lab} {'checkpointed' if c else 'plain'}"
                                           for lab, c, _ in series], rows,
                         numeric=range(0, len(series) + 1)))
    budget = b.rs.latest("memory_budget")
    if budget and not items:
        out.append(not_measured(measured_by("memory"))
                   .replace(NOT_MEASURED, f"Memory against batch size {NOT_MEASURED}", 1))
    if budget:
        data = numeric_items(budget.sections["memory_budget"])
        parts = {k: v for k, v in data.items() if k in BUDGET_PARTS}
        total = sum(parts.values()) or 1
        rows = [[k, fmt_bytes(v), f"{v / total:.1%}"] for k, v in parts.items()]
        rows.append(["total", fmt_bytes(total), "100%"])
        if "peak" in data:
            method = budget.sections["memory_budget"].get("peak_method")
            rows.append([f"measured peak{f' ({method})' if method else ''}", fmt_bytes(data["peak"]), "–"])
        out.append(f"<h3>Memory budget of one training step ({esc(budget.lab)})</h3>"
                   + table(["part", "bytes", "share"], rows, numeric=(1, 2)))
    if not out:
        return "", ""
    return "".join(out), b.source([*items, *([budget] if budget and budget not in items else [])])


def _roofline(b: _Builder) -> tuple[str, str]:
    item = b.rs.latest("roofline")
    if not item:
        return "", ""
    data = item.sections["roofline"]
    peak, bw = float(data["peak_flops"]), float(data["peak_bandwidth"])
    layers = [(r["name"], r["flops"] / r["bytes"], r.get("verdict", "unknown"))
              for r in data["layers"] if r["bytes"] > 0 and r["flops"] > 0]
    ach = data.get("achieved")
    achieved = ((float(ach["flops_per_s"]), float(ach["intensity"]))
                if isinstance(ach, dict) and ach.get("flops_per_s", 0) > 0 and ach.get("intensity", 0) > 0
                else None)
    if not layers and not achieved:
        return f"<p>Peaks: {fmt_flops(peak, True)}, {fmt_bandwidth(bw)}; no layers placed.</p>", b.source([item])
    out = [b.fig("roofline", figures.roofline(peak, bw, layers, achieved),
                 "Roofline plot with the model's layers and the achieved point")]
    basis = ", ".join(str(data[k]) for k in ("dtype", "source") if data.get(k))
    out.append(f"<p>Peak compute {esc(fmt_flops(peak, True))}{f' ({esc(basis)})' if basis else ''}, peak bandwidth "
               f"{esc(fmt_bandwidth(bw))}, ridge point {peak / bw:.0f} FLOP/byte.")
    if achieved:
        out.append(f" Achieved: {esc(fmt_flops(achieved[0], True))} at {achieved[1]:.0f} FLOP/byte "
                   f"({achieved[0] / min(peak, achieved[1] * bw):.0%} of the roof there).")
    out.append("</p>")
    rows = [[str(n + 1), name, fmt_flops(r["flops"]), fmt_bytes(r["bytes"]),
             f"{r['flops'] / r['bytes']:.1f}", r.get("verdict", "")]
            for n, (name, r) in enumerate((r["name"], r) for r in data["layers"]
                                          if r["bytes"] > 0 and r["flops"] > 0)]
    out.append(table(["#", "layer", "FLOPs", "bytes moved", "FLOP/byte", "verdict"], rows,
                     numeric=(0, 2, 3, 4)))
    return "".join(out), b.source([item])


def _top_ops(b: _Builder) -> tuple[str, str]:
    item = b.rs.latest("top_ops")
    if not item:
        return "", ""
    ops = sorted(item.sections["top_ops"], key=lambda r: -r["self_time_s"])
    total = sum(r["self_time_s"] for r in ops) or 1.0
    widest = ops[0]["self_time_s"] if ops else 1.0
    extra = [(k, h) for k, h in (("self_cpu_s", "CPU self"), ("self_device_s", "device self"))
             if any(isinstance(r.get(k), (int, float)) for r in ops)]
    rows = []
    for n, r in enumerate(ops[:TOP_OPS_ROWS], start=1):
        calls = r.get("calls")
        per_call = fmt_seconds(r["self_time_s"] / calls) if isinstance(calls, int) and calls > 0 else "–"
        bar = f'<span class="bar" style="width:{TOP_OPS_BAR_PX * r["self_time_s"] / widest:.0f}px"></span>'
        rows.append([str(n), f"<code>{esc(r['name'])}</code>", esc(fmt_seconds(r["self_time_s"])),
                     f'<span class="share">{r["self_time_s"] / total:.1%} {bar}</span>', esc(calls if calls is not None else "–"),
                     esc(per_call)]
                    + [esc(fmt_seconds(r[k])) if isinstance(r.get(k), (int, float)) else "–" for k, _ in extra])
    note = (f"<p>{len(ops)} operations listed; shares are of their total self time "
            f"({esc(fmt_seconds(total))}).</p>")
    heads = ["#", "operation", "self time", "share", "calls", "per call"] + [h for _, h in extra]
    return note + table(heads, rows, numeric=(0, 2, 4, 5, *range(6, 6 + len(extra))), raw=True), \
        b.source([item])


def _mfu(b: _Builder) -> tuple[str, str]:
    items = b.rs.having("mfu")
    if not items:
        return "", ""
    rows, bars = [], []
    for item in items:
        m = item.sections["mfu"]
        ach, peak = float(m["achieved_flops_per_s"]), float(m["peak_flops"])
        bars.append((item.lab.split("_")[0], ach, peak))
        rows.append([item.lab, fmt_flops(ach, True), fmt_flops(peak, True), f"{ach / peak:.1%}",
                     fmt_flops(peak - ach, True), f"{peak / ach:.1f}×" if ach > 0 else "–"])
    last = bars[-1]
    out = [f'<div class="kpi"><b>{last[1] / last[2]:.1%}</b><span>model FLOPs utilisation '
           f"({esc(items[-1].lab)})</span></div>"
           f'<div class="kpi"><b>{last[2] / last[1]:.1f}×</b><span>remaining headroom to the '
           "device's peak</span></div>" if last[1] > 0 else ""]
    out.append(b.fig("mfu", figures.mfu_bars(bars), "Achieved compute against the device peak"))
    out.append(table(["source", "achieved", "peak", "MFU", "gap to peak", "headroom"], rows,
                     numeric=(1, 2, 3, 4, 5)))
    return "".join(out), b.source(items)


def _verification(b: _Builder) -> tuple[str, str]:
    items = b.rs.having("verification")
    acc = b.rs.having("accuracy")
    if not items and not acc:
        return "", ""
    out = []
    if items:
        rows = []
        for item in items:
            for r in item.sections["verification"]:
                speed = f"{r['speedup']:.2f}×" if isinstance(r.get("speedup"), (int, float)) else "–"
                rows.append([esc(item.lab), esc(r["name"]), badge(r["verdict"]), esc(_own_figure(item, r)), speed,
                             esc(fmt_ci(r.get("ci"), "×")), esc(r.get("reason", ""))])
        counts: dict[str, int] = {}
        for item in items:
            for r in item.sections["verification"]:
                counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
        out.append("<p>" + " ".join(f"{badge(v)} × {n}" for v, n in sorted(counts.items())) + "</p>")
        out.append("<p>Each check beside the figure your own notebook measured and claimed: the grader's "
                   "re-measurement, in a fresh process on its own hardware, is what counts.</p>")
        out.append(table(["lab", "check", "verdict", "you measured", "re-measured", "95% CI", "reason"], rows,
                         numeric=(3, 4, 5), raw=True))
    for item in acc:
        a = numeric_items(item.sections["accuracy"])
        if "baseline" in a and "final" in a:
            out.append(f"<p>Accuracy after a short training run ({esc(item.lab)}): baseline "
                       f"{a['baseline']:.1%}, optimised {a['final']:.1%} "
                       f"({100 * (a['final'] - a['baseline']):+.1f} points).</p>")
    return "".join(out), b.source(items or acc)


def _own_figure(item: Any, row: Mapping[str, Any]) -> str:
    """The student's own claimed speedup for a verification row, with the CI of the notebook's own
    measurement of it where its `speedups` section holds that figure; "–" where none was claimed."""
    claimed = row.get("claimed")
    if not isinstance(claimed, (int, float)) or isinstance(claimed, bool):
        return "–"
    for own in item.sections.get("speedups") or []:
        value = own.get("speedup") if isinstance(own, Mapping) else None
        if isinstance(value, (int, float)) and abs(value - claimed) <= 1e-9 * max(1.0, abs(claimed)):
            ci = own.get("ci")
            return f"{claimed:.2f}× [{fmt_ci(ci, '×')}]" if ci else f"{claimed:.2f}×"
    return f"{claimed:.2f}×"


def _analysis(b: _Builder) -> tuple[str, str]:
    items = [i for i in b.rs.having("analysis") if i.sections["analysis"].strip()]
    if not items:
        return "", ""
    out = []
    for item in items:
        heading = f"<h3>{esc(item.lab)}</h3>" if len(items) > 1 else ""
        out.append(f'<div class="analysis">{heading}{markdown.to_html(item.sections["analysis"])}</div>')
    return "".join(out), b.source(items)
