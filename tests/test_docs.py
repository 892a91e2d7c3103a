"""The docs a newcomer reads stay short, true to the tree and linked: README under 1,500 words and
DESIGN under 6,000, DESIGN's module table and layout held to the package and the Makefile, every
relative link of README and docs/ resolving (anchors included), every make target a user runs
reachable, and the Colab way in present in the student guide and in each lab's first cell."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "DESIGN.md"
STUDENTS = ROOT / "docs" / "students.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def words(path: Path) -> int:
    """Words as `wc -w` counts them."""
    return len(path.read_text(encoding="utf-8").split())


def test_readme_and_design_stay_short() -> None:
    assert words(README) < 1500, f"README.md has {words(README)} words; move detail to docs/"
    assert words(DESIGN) < 6000, f"docs/DESIGN.md has {words(DESIGN)} words; figures go to docs/MEASUREMENTS.md"


def package_modules() -> set[str]:
    """perflab's top-level modules and subpackages."""
    package = ROOT / "perflab"
    found = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    return found | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}


def design_module_table() -> list[str]:
    """The first column of DESIGN's `### perflab/` table."""
    text = DESIGN.read_text(encoding="utf-8")
    section = re.search(r"^### perflab/.*?\n(.*?)(?=^#)", text, re.M | re.S)
    assert section, "docs/DESIGN.md: no `### perflab/` section"
    return re.findall(r"^\| `([a-z_]+)` \|", section.group(1), re.M)


def test_design_module_table_lists_every_module_of_the_package_and_no_other() -> None:
    listed = design_module_table()
    assert len(listed) == len(set(listed)), "docs/DESIGN.md lists a module twice"
    actual = package_modules()
    assert not actual - set(listed), f"modules missing from DESIGN's table: {sorted(actual - set(listed))}"
    assert not set(listed) - actual, f"DESIGN's table lists modules perflab does not have: {sorted(set(listed) - actual)}"


def make_targets() -> dict[str, bool]:
    """Every target of the Makefile, True where `make help` lists it (a `##` description)."""
    text = (ROOT / "Makefile").read_text()
    return {m.group(1): "##" in m.group(2) for m in re.finditer(r"^([a-z][a-z-]*):(.*)$", text, re.M)}


def test_design_layout_names_only_make_targets_that_exist() -> None:
    line = re.search(r"^Makefile\s+(.*(?:\n\s{10,}.*)*)", DESIGN.read_text(encoding="utf-8"), re.M)
    assert line, "docs/DESIGN.md's layout has no Makefile line"
    named = re.findall(r"\b([a-z][a-z-]*[a-z])\b(?!\*)", line.group(1).split("(")[0])
    targets = make_targets()
    assert named and not [t for t in named if t not in targets], [t for t in named if t not in targets]


def test_every_make_target_a_user_runs_is_in_the_readme_or_a_guide() -> None:
    text = "".join(p.read_text(encoding="utf-8") for p in (README, ROOT / "docs" / "instructors.md", STUDENTS))
    missing = [t for t, listed in make_targets().items() if listed and f"make {t}" not in text]
    assert not missing, f"make targets no page names: {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        if not resolved.exists() or (anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved))):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links that resolve to nothing: {broken}"


def test_readme_first_screen_links_the_three_guides() -> None:
    first_screen = "\n".join(README.read_text(encoding="utf-8").splitlines()[:40])
    for needed in ("make demo", "make test", "docs/students.md", "docs/instructors.md", "solutions/README.md"):
        assert needed in first_screen, f"README's first screen lacks {needed}"


def test_the_student_guide_installs_the_bundle_beside_colabs_torch() -> None:
    guide = STUDENTS.read_text(encoding="utf-8")
    cell = re.search(r"```python\n(.*?)```", guide[guide.index("On Colab"):], re.S)
    assert cell, "docs/students.md: no Colab cell after 'On Colab'"
    lines = cell.group(1).splitlines()
    install = [line for line in lines if line.startswith("%pip install")]
    assert install and "/content/perflab-student" in install[0] and "==" not in install[0], install
    assert any("sys.path" in line for line in lines), "the running kernel cannot import an editable install without it"


@pytest.mark.parametrize("notebook", sorted(ROOT.glob("labs/lab*/lab*.ipynb")), ids=lambda p: p.parent.name)
def test_each_lab_says_first_what_to_do_on_colab(notebook: Path) -> None:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    first = "".join(next(c for c in cells if c["cell_type"] == "markdown")["source"])
    assert "On Colab" in first and f"labs/{notebook.parent.name}" in first, first[:300]
