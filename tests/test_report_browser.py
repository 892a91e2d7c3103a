"""The report as a reader sees it: rendered by headless Chromium, screenshot and DOM checked.

Chromium is required (Debian package `chromium`; `.ci/run` installs it). Without it these tests
fail, unless PERFLAB_NO_BROWSER=1 is set to skip them on purpose.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from perflab import report
from perflab.report import classreport

ALL = sorted((Path(__file__).parent / "fixtures" / "results").glob("*.json"))

WINDOW = (1200, 3000)
# Measured at 1200x3000: a blank page has 1 colour, a bare paragraph of text 230, the fixture report
# ~1600 (the report with every section "not measured" ~1200).
MIN_DISTINCT_COLOURS = 500
# Share of the screenshot that is not its most common colour: a bare paragraph 0.05%, the report ~30%.
MIN_INK_FRACTION = 0.15
# Okabe-Ito vermillion, used only by the waterfall's "loss" bar in the first screen of the fixture report:
# finding it proves the embedded PNG figures were decoded and painted.
VERMILLION = (0xD5, 0x5E, 0x00)
CHROMIUM_TIMEOUT_S = 90


def chromium() -> str:
    if os.environ.get("PERFLAB_NO_BROWSER") == "1":
        pytest.skip("PERFLAB_NO_BROWSER=1: browser checks skipped on request")
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail("chromium is not installed: install it with `apt-get install -y chromium` "
                    "(Debian; .ci/run does this), or set PERFLAB_NO_BROWSER=1 to skip on purpose")
    return found


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / 'profile'}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"chromium failed ({done.returncode}): {done.stderr[-2000:]}"
    return done


def screenshot(tmp_path: Path, page: Path) -> Image.Image:
    shot = tmp_path / "shot.png"
    run_chromium(tmp_path, f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                 page.resolve().as_uri())
    assert shot.exists(), "chromium wrote no screenshot"
    return Image.open(shot).convert("RGB")


def assert_not_blank(image: Image.Image) -> None:
    assert image.size == WINDOW
    colours = image.getcolors(maxcolors=image.width * image.height)
    assert len(colours) >= MIN_DISTINCT_COLOURS, f"only {len(colours)} colours: the page looks blank"
    background = max(colours)[1]
    ink = 1 - max(colours)[0] / (image.width * image.height)
    assert ink >= MIN_INK_FRACTION, f"{ink:.0%} of the page differs from its background {background}"


def near(colour: tuple[int, int, int], target: tuple[int, int, int], tol: int = 12) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(colour, target, strict=True))


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.update({value: tag for name, value in attrs if name == "id" and value})


def dom_ids(tmp_path: Path, page: Path) -> dict[str, str]:
    done = run_chromium(tmp_path, "--dump-dom", page.resolve().as_uri())
    assert "</html>" in done.stdout, "chromium returned no DOM"
    parser = _Ids()
    parser.feed(done.stdout)
    return parser.ids


def class_csv(path: Path) -> Path:
    """Twenty students, three labs, two kinds of GPU, a few inconclusive and flagged."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=classreport.COLUMNS)
        writer.writeheader()
        for n in range(20):
            for lab, base in (("lab02_feed", 3.6), ("lab03_amp", 1.7), ("lab05_compile", 1.15)):
                writer.writerow({
                    "student": f"student{n:02d}", "lab": lab, "score": 55 + 2 * n, "max_score": 100,
                    "verdict": "inconclusive" if n % 7 == 3 else "pass",
                    "speedup": round(base * (0.8 + 0.02 * n), 3), "flagged": n % 9 == 4,
                    "hardware_class": "cuda-nvidia-h100-80gb-hbm3" if n % 3 else "cuda-nvidia-a100-sxm4-40gb",
                })
    return path


def test_student_report_renders_in_chromium(tmp_path):
    page = tmp_path / "report.html"
    report.write_report(ALL, page)
    image = screenshot(tmp_path, page)
    assert_not_blank(image)
    painted = sum(n for n, c in image.getcolors(maxcolors=image.width * image.height) if near(c, VERMILLION))
    assert painted > 200, "the waterfall figure's loss bar is not on screen: figures did not render"
    ids = dom_ids(tmp_path, page)
    for sid in report.SECTION_IDS:
        assert ids.get(sid) == "section", f"section {sid} not in the rendered DOM"
    for fig in ("speedup-waterfall", "phases", "memory", "roofline", "mfu"):
        assert ids.get(f"fig-{fig}") == "figure", fig


def test_class_report_renders_in_chromium(tmp_path):
    page = tmp_path / "class.html"
    report.write_class_report(class_csv(tmp_path / "class.csv"), page)
    assert_not_blank(screenshot(tmp_path, page))
    ids = dom_ids(tmp_path, page)
    for sid in classreport.CLASS_SECTION_IDS:
        assert ids.get(sid) == "section", f"section {sid} not in the rendered DOM"
