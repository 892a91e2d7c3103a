"""A small, safe Markdown subset for the student's written analysis.

Everything the student wrote is HTML-escaped first; only then is a known subset of Markdown
turned into tags, so no raw HTML, script or attribute from the text reaches the page.
Supported: paragraphs, headings (shifted to sit under a report section), bullet and numbered
lists, block quotes, fenced code, inline code, **bold**, *italic*, and http(s) links.
"""

from __future__ import annotations

import html
import re

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^\s*[-*+]\s+(.*)$")
_NUMBERED = re.compile(r"^\s*\d+[.)]\s+(.*)$")
_CODE_SPAN = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?!\*)|(?<!\w)_(?=\S)(.+?)(?<=\S)_(?!\w)")
_LINK = re.compile(r"\[([^\]]+)\]\((https?://[^\s)]+)\)")

# Headings in the analysis start at <h3>: the report section holding them is an <h2>.
HEADING_OFFSET = 2


def _inline(text: str) -> str:
    """Escape one line of text, then apply inline markup."""
    spans: list[str] = []

    def keep(match: re.Match[str]) -> str:
        spans.append(f"<code>{match.group(1)}</code>")
        return f"\x00{len(spans) - 1}\x00"

    out = _CODE_SPAN.sub(keep, html.escape(text.replace("\x00", ""), quote=True))
    out = _LINK.sub(lambda m: f'<a href="{m.group(2)}" rel="noopener noreferrer">{m.group(1)}</a>', out)
    out = _BOLD.sub(lambda m: f"<strong>{m.group(1) or m.group(2)}</strong>", out)
    out = _ITALIC.sub(lambda m: f"<em>{m.group(1) or m.group(2)}</em>", out)
    return re.sub("\x00(\\d+)\x00", lambda m: spans[int(m.group(1))], out)


def to_html(text: str) -> str:
    """Markdown subset -> HTML fragment; everything not recognised is shown as escaped text."""
    out: list[str] = []
    para: list[str] = []
    lines = text.replace("\r\n", "\n").split("\n")
    i = 0

    def flush() -> None:
        if para:
            out.append("<p>" + " ".join(_inline(line.strip()) for line in para) + "</p>")
            para.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            block = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                block.append(lines[i])
                i += 1
            out.append("<pre><code>" + html.escape("\n".join(block)) + "</code></pre>")
            i += 1
            continue
        heading = _HEADING.match(stripped)
        if heading:
            flush()
            level = min(len(heading.group(1)) + HEADING_OFFSET, 6)
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif _BULLET.match(line) or _NUMBERED.match(line):
            flush()
            pattern, tag = (_BULLET, "ul") if _BULLET.match(line) else (_NUMBERED, "ol")
            items = []
            while i < len(lines) and pattern.match(lines[i]):
                items.append(f"<li>{_inline(pattern.match(lines[i]).group(1))}</li>")
                i += 1
            out.append(f"<{tag}>" + "".join(items) + f"</{tag}>")
            continue
        elif stripped.startswith(">"):
            flush()
            quoted = []
            while i < len(lines) and lines[i].strip().startswith(">"):
                quoted.append(lines[i].strip()[1:].strip())
                i += 1
            out.append("<blockquote>" + to_html("\n".join(quoted)) + "</blockquote>")
            continue
        elif not stripped:
            flush()
        else:
            para.append(line)
        i += 1
    flush()
    return "\n".join(out)
