"""No lab announces a result: a figure in prose is computed in the notebook or marked as the reference
machine's example, never a bare "measured ... 1.4x" a student reads before measuring it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted([*ROOT.glob("solutions/lab*/*.ipynb"), *ROOT.glob("labs/lab*/*.ipynb")])

_NUMBER = r"(?<![\w.])(?:about |~|≈)?\d+(?:[.,]\d+)?(?:\s*(?:-|–|to)\s*\d+(?:\.\d+)?)?\s*"
# A speed, a time or a share: what a measurement reports. "95% CI" names an interval, not a result.
SPEED = re.compile(_NUMBER + r"(?:x|×|%(?! CI)|s|ms|µs|us|min|minutes?|seconds?|samples/s|images/s)(?![\w/])")
SIZE = re.compile(_NUMBER + r"(?:KiB|MiB|GiB|KB|MB|GB)(?!\w)")
# Words that report what a run gave (a rule or a definition uses none of them).
REPORTED = re.compile(
    r"\b(?:measur\w*|on (?:a |this |one |two )?(?:\d+|two)[- ]cores?|on this (?:machine|CPU|GPU)|"
    r"gain(?:s|ed)?|faster|slower|speedup|took|takes|sat|costs?|saves?|saved|pays? after)\b", re.I)
MEASURED = re.compile(r"\bmeasur\w*", re.I)
# How a figure is marked as an example: "on the reference machine, for instance, ...".
MARKED = re.compile(r"\breference machine\b", re.I)
# Arithmetic on supposed values, not a result: "had the step saved, say, 0.1 ms ...".
SUPPOSED = re.compile(r"\b(?:say|suppose|supposing|imagine)\b,?", re.I)


def sentences(text: str) -> list[str]:
    """Markdown split into sentences, list items and table rows."""
    parts = re.split(r"(?<=[.!?;:])\s+(?=[A-Z(`*])|\n\s*\n|\n\s*[-*] |\n\|", text)
    return [" ".join(p.split()) for p in parts if p.strip()]


def announced(text: str) -> list[str]:
    """Sentences of `text` that state a measured figure without marking it as the reference machine's."""
    found = []
    for sentence in sentences(text):
        if MARKED.search(sentence) or SUPPOSED.search(sentence):
            continue
        if (SPEED.search(sentence) and REPORTED.search(sentence)) or (SIZE.search(sentence) and MEASURED.search(sentence)):
            found.append(sentence)
    return found


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("Measured on 2 cores (photo set), one or two workers made a step 1.4-1.5x faster.", True),
        ("On a 2-core CPU the workers then gain little or lose (measured 0.9-1.06x).", True),
        ("Compiling ResNet-18 training takes about 90 s on 2 cores and makes the step no faster.", True),
        ("Lab 4 measured 20-35% more step time.", True),
        ("The fit gave about 1.7 MiB per image, measured with saved-tensor hooks.", True),
        ("On the reference machine, for instance, one worker made a step 1.4-1.5x faster.", False),
        ("Had the step saved, say, 0.1 ms at 20 s of compile, it would pay after 200,000 steps.", False),
        ("The bar is 1.10x, a named constant of the grader.", False),
        ("Each bar carries the 95% CI of the cumulative speedup.", False),
        ("Your sweep shows how much the overlap gains here.", False),
    ],
)
def test_the_scan_tells_an_announced_result_from_an_example(text: str, flagged: bool) -> None:
    assert bool(announced(text)) is flagged, announced(text)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_markdown_cell_announces_a_measured_figure(notebook: Path) -> None:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = [f"cell {i}: {sentence}" for i, cell in enumerate(cells) if cell["cell_type"] == "markdown"
             for sentence in announced("".join(cell["source"]))]
    assert not found, (f"{notebook.relative_to(ROOT)} states measured figures a student has not measured; compute "
                       "them in the notebook or mark them 'on the reference machine, for instance':\n"
                       + "\n".join(found))


LABS = ("lab01_measure", "lab02_feed", "lab03_amp", "lab04_memory", "lab05_compile", "lab06_together")


@pytest.mark.parametrize("lab", LABS)
def test_no_hardware_note_announces_a_result(lab: str) -> None:
    """The note a lab prints at its top, before anything is measured, says what the hardware offers,
    not what it will give ("compiling costs about 90 s and gains nothing")."""
    from perflab.labs import common

    notes = common.lab_hardware_notes(lab)
    assert notes, f"{lab} has no hardware notes"
    found = [f"{device}: {sentence}" for device, note in notes.items() for sentence in announced(note)]
    found += [f"{device}: {note}" for device, note in notes.items() if re.search(r"\bexpect\b", note, re.I)]
    assert not found, f"{lab}'s HARDWARE_NOTES announce results:\n" + "\n".join(found)
