"""The student distribution: `python -m perflab.bundle [-o dist/perflab-student.zip]`.

One zip that a student unpacks and installs (`pip install -e .`), holding:

    labs/<lab>/<lab>.ipynb    the student copies nbgrader generated (no solutions, no hidden tests)
    perflab/                  the package source (the labs import it; the grader re-measures with it)
    pyproject.toml            the dependency ranges (a torch already installed in range stays)
    constraints.txt, environment.yml   the exact versions the course tested, for pip and conda
    nbgrader_config.py        nbgrader's settings for `nbgrader validate` run from the kit's root
    datasets/                 the synthetic data set's recipe, data card and README (not built data)
    README.md                 the student guide (docs/students.md): install, Colab, work, hand in

and never solutions/, autograder/ (course folder, gradebook, expectations), tests/, built data,
results files, caches, or the grader-only `judges/` of each lab (`perflab/labs/labNN/judges/`: the hidden
checks and the reference answers they compare against). Before writing, every file is scanned for nbgrader's solution and
hidden-test markers (`LEAK_MARKERS`); one hit stops the bundle with the file's name.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from perflab.labs import registry

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "dist" / "perflab-student.zip"
ROOT_NAME = "perflab-student"
# Lines that exist only in an instructor's source notebook. The `###` prefix is nbgrader's: the
# bare words appear in perflab's own grading code, which scans for them.
# (Spelled in pieces so that this file, which ships, holds none of them.)
LEAK_MARKERS = tuple(prefix + words for prefix, words in (
    ("### ", "BEGIN SOLUTION"), ("### ", "END SOLUTION"), ("### ", "BEGIN HIDDEN TESTS"),
    ("### ", "END HIDDEN TESTS"), ("=== ", "BEGIN MARK SCHEME ===")))
# (folder or file relative to the repository, suffixes kept; None keeps every file)
CONTENTS: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("labs", (".ipynb", ".py", ".csv", ".json", ".md", ".txt", ".png", ".jpg")),
    ("perflab", (".py", ".json", ".html", ".css", ".md")),
    ("datasets/recipe.json", None),
    ("datasets/DATA_CARD.md", None),
    ("datasets/README.md", None),
    ("perflab-course.toml", None),
    ("pyproject.toml", None),
    ("constraints.txt", None),
    ("nbgrader_config.py", None),
    ("environment.yml", None),
)
# Path parts never shipped: caches, checkpoints, and what a lab run writes beside its notebook.
SKIP_PARTS = frozenset({"__pycache__", ".ipynb_checkpoints", "results", "build", ".pytest_cache"})
# Parts of the package only the grader needs: the judges with their reference answers, and the code
# that loads and runs them.
GRADER_ONLY = (*(folder.relative_to(REPO).as_posix() for folder in registry.grader_only_folders()),
               "perflab/grading/judging.py")

# The student guide, shipped as the kit's README.md: one text for the repository and the bundle.
STUDENT_GUIDE = "docs/students.md"


def files(repo: Path = REPO) -> Iterator[tuple[Path, str]]:
    """(file on disk, name in the zip) for everything the bundle holds, in a stable order."""
    for entry, suffixes in CONTENTS:
        path = repo / entry
        if path.is_file():
            yield path, f"{ROOT_NAME}/{entry}"
            continue
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: missing; the student bundle needs it "
                                    f"(run `make labs` for labs/, or check out the full repository)")
        for item in sorted(path.rglob("*")):
            rel = item.relative_to(repo)
            if (not item.is_file() or item.is_symlink() or SKIP_PARTS & set(rel.parts[:-1])
                    or any(p.startswith(".") for p in rel.parts)
                    or any(rel.as_posix() == entry or rel.as_posix().startswith(entry + "/") for entry in GRADER_ONLY)
                    or (suffixes is not None and item.suffix not in suffixes)):
                continue
            yield item, f"{ROOT_NAME}/{rel.as_posix()}"


def leaks(name: str, data: bytes) -> list[str]:
    """The leak markers in one file's bytes."""
    text = data.decode("utf-8", "replace")
    return [marker for marker in LEAK_MARKERS if marker in text]


def build(out: Path = DEFAULT_OUT, repo: Path = REPO) -> Path:
    """Write the student zip to `out` (atomically); raises ValueError naming a file that would leak."""
    entries = [(name, path.read_bytes()) for path, name in files(repo)]
    labs = {n.split("/")[2] for n, _ in entries if n.startswith(f"{ROOT_NAME}/labs/") and n.endswith(".ipynb")}
    if not labs:
        raise FileNotFoundError(f"{repo / 'labs'}: no student notebooks; run `make labs` first")
    for name, data in entries:
        found = leaks(name, data)
        if found:
            raise ValueError(f"{name}: holds {found[0]!r}; the student bundle must carry no solution "
                             "or hidden test (regenerate labs/ with `make labs`)")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # same inputs, same bytes
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
        info = zipfile.ZipInfo(f"{ROOT_NAME}/README.md", date_time=(2020, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = 0o644 << 16
        zf.writestr(info, (repo / STUDENT_GUIDE).read_bytes())
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perflab.bundle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT, help="zip to write (default: dist/perflab-student.zip)")
    args = p.parse_args(argv)
    try:
        path = build(args.out)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
    labs = sorted({n.split("/")[2] for n in names if n.startswith(f"{ROOT_NAME}/labs/") and n.count("/") >= 3})
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB, {len(names)} files; labs: {', '.join(labs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
