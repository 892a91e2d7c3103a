"""The grader's container image (autograder/Containerfile), checked as far as a machine without a
container engine can: every instruction is one an engine knows, every file it copies is in the
checkout (and not left out of the build context), the command it runs is perflab's, the user it
makes is the sandbox's, and the instructor guide says how to build and run it."""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path

from perflab.grading import sandbox

ROOT = Path(__file__).resolve().parents[1]
CONTAINERFILE = ROOT / "autograder" / "Containerfile"
INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
                "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for raw in CONTAINERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word, rest.strip()))
    assert not pending, "the Containerfile ends inside a continued line"
    return out


def _ignored(path: str) -> bool:
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_every_instruction_is_known_and_the_image_starts_from_a_supported_python():
    steps = instructions()
    assert all(word in INSTRUCTIONS for word, _ in steps), [w for w, _ in steps if w not in INSTRUCTIONS]
    assert steps[0][0] == "FROM"
    version = re.match(r"python:(\d+)\.(\d+)", steps[0][1])
    requires = re.search(r'requires-python = ">=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert version and requires
    assert tuple(map(int, version.groups())) >= tuple(map(int, requires.groups()))


def test_what_it_copies_is_in_the_checkout_and_in_the_build_context():
    copied = []
    for word, args in instructions():
        if word == "COPY":
            *sources, _ = shlex.split(args)
            copied += sources
    assert copied, "the image copies nothing"
    for source in copied:
        assert (ROOT / source).exists(), f"COPY {source}: not in the checkout"
        assert not _ignored(source), f"COPY {source}: left out of the build context by .dockerignore"
    assert _ignored("autograder/course") and _ignored(".venv") and _ignored("datasets/build")


def test_it_runs_perflab_as_root_with_the_sandbox_user_made():
    steps = dict((w, a) for w, a in instructions())
    entry = shlex.split(steps["ENTRYPOINT"].replace("[", "").replace("]", "").replace(",", " "))
    scripts = re.search(r"\[project\.scripts\]\n(.*?)\n\n", (ROOT / "pyproject.toml").read_text(), re.S).group(1)
    assert entry == ["perflab"] and re.search(r'^perflab = "perflab\.cli:main"$', scripts, re.M)
    assert "USER" not in steps  # perflab must be root inside to make the `root` sandbox
    runs = " ".join(a for w, a in instructions() if w == "RUN")
    assert f"useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin " \
           f"{sandbox.SANDBOX_USER}" in runs
    assert "util-linux" in runs and 'pip install --no-cache-dir -c constraints.txt -e ".[labs]"' in runs  # the tested versions
    assert "/opt/perflab/autograder/course" in steps["VOLUME"]


def test_the_instructor_guide_says_how_to_build_and_run_it_and_what_was_not_tested():
    readme = (ROOT / "docs" / "instructors.md").read_text()
    assert "docker build -f autograder/Containerfile -t perflab-grader ." in readme
    assert "--cap-add SYS_ADMIN" in readme and "/opt/perflab/autograder/course" in readme
    assert "not tested" in readme.lower()
