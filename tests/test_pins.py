"""The pins live in pyproject.toml; environment.yml must repeat exactly the same ones."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^\s*-?\s*([A-Za-z0-9_.\-]+)==([^\s#]+)")


def _pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines.extend(extra)
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
