"""The pins live in pyproject.toml; environment.yml must repeat exactly the same ones."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^\s*-?\s*([A-Za-z0-9_.\-]+)==([^\s#]+)")


def _requirements(pyproject: str) -> list[str]:
    """The strings of [project] dependencies and every [project.optional-dependencies] list. Read as
    text, the one layout pyproject.toml uses (tomllib is Python 3.11+; the kit supports 3.10)."""
    table, listing, out = "", False, []
    for raw in pyproject.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not listing and line.startswith("[") and line.endswith("]"):
            table = line
        elif not listing and line.endswith("= [") and (
                table == "[project.optional-dependencies]" or (table == "[project]" and line.startswith("dependencies"))):
            listing = True
        elif listing and line.startswith("]"):
            listing = False
        elif listing and line:
            out.append(line.rstrip(",").strip('"'))
    return out


def test_requirements_reader_sees_every_list() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    found = _requirements(text)
    assert "torch==2.14.1" in found and "nbgrader==0.9.6" in found and "pytest==9.2.0" in found
    quoted_pins = re.findall(r'^\s*"[^"]+==[^"]+",?\s*$', text, flags=re.M)
    assert len(found) == len(quoted_pins), "a requirement line was missed"


def _pyproject_pins() -> dict[str, str]:
    lines = _requirements((ROOT / "pyproject.toml").read_text())
    pins = {}
    for line in lines:
        match = PIN.match(line)
        assert match, f"pyproject.toml: {line!r} is not pinned with =="
        pins[match.group(1).lower()] = match.group(2)
    return pins


def _environment_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        match = PIN.match(line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def test_environment_yml_repeats_pyproject_pins() -> None:
    assert _environment_pins() == _pyproject_pins()


def test_torch_pins_are_the_supported_pair() -> None:
    pins = _pyproject_pins()
    assert pins["torch"] == "2.14.1"
    assert pins["torchvision"] == "0.29.1"


def test_installed_versions_match_pins() -> None:
    from importlib.metadata import PackageNotFoundError, version

    pins = _pyproject_pins()
    wrong = {}
    for name, pinned in pins.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            wrong[name] = "not installed"
            continue
        if installed.split("+")[0] != pinned:
            wrong[name] = installed
    assert not wrong, f"installed versions differ from the pins (run `make setup`): {wrong}"
