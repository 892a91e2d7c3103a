"""The page kit both reports are drawn with: the inline CSS, the page frame, sections, tables, badges,
figures as data: URIs and the number formats (`perflab.report.html` for a student, `classreport` for a class).
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

NOT_MEASURED = "not measured"

CSS = """
:root { --ink:#1a1a1a; --muted:#5a5a5a; --rule:#d8d8d8; --accent:#0072B2; --bad:#D55E00;
        --warn:#E69F00; --good:#009E73; --paper:#ffffff; --band:#f5f7fa; }
* { box-sizing: border-box; }
body { margin:0; background:var(--band); color:var(--ink);
       font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
header { background:#12263a; color:#fff; padding:28px 40px 22px; }
header h1 { margin:0 0 6px; font-size:26px; font-weight:600; }
header p { margin:0; color:#c9d6e3; font-size:14px; }
nav { background:#fff; border-bottom:1px solid var(--rule); padding:8px 40px; position:sticky; top:0;
      display:flex; flex-wrap:wrap; gap:4px 18px; z-index:1; }
nav a { color:var(--accent); text-decoration:none; font-size:13px; white-space:nowrap; }
main { max-width:1100px; margin:0 auto; padding:20px 24px 40px; }
section { background:var(--paper); border:1px solid var(--rule); border-radius:6px;
          padding:18px 24px; margin:18px 0; break-inside:avoid-page; }
section h2 { margin:0 0 4px; font-size:20px; }
.source { color:var(--muted); font-size:13px; margin:0 0 12px; }
.not-measured { color:var(--muted); font-style:italic; background:var(--band); padding:10px 14px;
                border-left:4px solid var(--rule); margin:8px 0; }
.banner { background:#fff4e0; border:2px solid var(--warn); border-left-width:8px; border-radius:6px;
          padding:12px 18px; margin:18px 0; }
.banner strong { color:#8a4b00; }
table { border-collapse:collapse; width:100%; margin:10px 0; font-size:14px; }
th, td { text-align:left; padding:5px 10px; border-bottom:1px solid var(--rule); vertical-align:top; }
th { background:var(--band); font-weight:600; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
figure { margin:12px 0; text-align:center; }
figure img { max-width:100%; height:auto; border:1px solid var(--rule); }
figcaption { color:var(--muted); font-size:13px; margin-top:4px; }
.kpi { display:inline-block; margin:6px 28px 6px 0; }
.kpi b { display:block; font-size:24px; font-variant-numeric:tabular-nums; }
.kpi span { color:var(--muted); font-size:13px; }
.badge { display:inline-block; padding:1px 8px; border-radius:10px; font-size:13px; font-weight:600;
         border:1px solid; white-space:nowrap; }
.badge.pass { color:#00557f; border-color:var(--accent); background:#e3f1fa; }
.badge.fail { color:#9c3c00; border-color:var(--bad); background:#fbe9df; }
.badge.inconclusive { color:#7a4f00; border-color:var(--warn); background:#fff4e0; }
.badge.other { color:var(--muted); border-color:var(--rule); }
.share { white-space:nowrap; }
.bar { display:inline-block; height:10px; background:var(--accent); vertical-align:middle; }
.analysis { max-width:820px; }
.analysis h3 { font-size:16px; margin:16px 0 6px; }
blockquote { margin:8px 0; padding:4px 14px; border-left:4px solid var(--accent); color:#333;
             background:var(--band); }
pre { background:var(--band); padding:10px; overflow-x:auto; }
details summary { cursor:pointer; color:var(--accent); }
footer { text-align:center; color:var(--muted); font-size:12px; padding:0 0 30px; }
@media print { body { background:#fff; } nav { display:none; } header { background:#fff; color:#000; }
  header p { color:#333; } section { border-color:#999; } }
"""

_BADGE_MARK = {"pass": "✓", "fail": "✗", "inconclusive": "?"}


@dataclass(frozen=True)
class Report:
    """A rendered report: the page, and each figure as PNG bytes keyed by its name."""

    html: str
    figures: dict[str, bytes] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


# ---------------------------------------------------------------- formatting

def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt_num(value: float, digits: int = 3) -> str:
    """A number with `digits` significant figures, thousands separated where large."""
    if value == 0:
        return "0"
    if abs(value) >= 10 ** digits:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def fmt_seconds(seconds: float) -> str:
    """Seconds in the unit a reader wants (ns, µs, ms, s)."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(seconds) >= scale:
            return f"{fmt_num(seconds / scale)} {unit}"
    return f"{fmt_num(seconds / 1e-9)} ns"


def fmt_bytes(n: float) -> str:
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_bandwidth(n: float) -> str:
    """Bytes per second in decimal units, as device data sheets state them."""
    for scale, unit in ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} B/s"


def fmt_flops(n: float, per_s: bool = False) -> str:
    suffix = "FLOP/s" if per_s else "FLOP"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}{suffix}"
    return f"{n:.3g} {suffix}"


def fmt_ci(ci: Sequence[float] | None, unit: str = "", digits: int = 3) -> str:
    if not ci:
        return "–"
    return f"{fmt_num(ci[0], digits)}–{fmt_num(ci[1], digits)}{unit}"


def badge(verdict: str | None) -> str:
    if not verdict:
        return '<span class="badge other">not verified</span>'
    kind = verdict if verdict in _BADGE_MARK else "other"
    return f'<span class="badge {kind}">{_BADGE_MARK.get(verdict, "·")} {esc(verdict)}</span>'


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Iterable[int] = (),
          raw: bool = False) -> str:
    """An HTML table; cells are escaped unless `raw` (then the caller escaped them)."""
    numeric = set(numeric)
    head = "".join(f'<th class="num">{esc(h)}</th>' if i in numeric else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = "".join(
            (f'<td class="num">{c if raw else esc(c)}</td>' if i in numeric
             else f"<td>{c if raw else esc(c)}</td>") for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def figure_html(name: str, data: bytes, alt: str, caption: str = "") -> str:
    b64 = base64.b64encode(data).decode("ascii")
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return (f'<figure id="fig-{esc(name)}"><img alt="{esc(alt)}" '
            f'src="data:image/png;base64,{b64}">{cap}</figure>')


def section(sid: str, title: str, body: str, source: str = "") -> str:
    src = f'<p class="source">{source}</p>' if source else ""
    return f'<section id="{esc(sid)}"><h2>{esc(title)}</h2>{src}{body}</section>'


def not_measured(what: str) -> str:
    return f'<p class="not-measured">{NOT_MEASURED} — {esc(what)} measures it.</p>'


def page(title: str, subtitle: str, nav: Sequence[tuple[str, str]], body: str) -> str:
    links = "".join(f'<a href="#{esc(i)}">{esc(t)}</a>' for i, t in nav)
    from perflab import __version__ as version

    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{esc(title)}</h1><p>{subtitle}</p></header>"
        f"<nav>{links}</nav><main>{body}</main>"
        f"<footer>perflab {esc(version)} · generated "
        f"{esc(_dt.datetime.now(_dt.UTC).strftime('%Y-%m-%d %H:%M UTC'))}</footer>"
        "</body></html>\n"
    )
