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


# A module that blocks every import outside the standard library, perflab and the distributions
# `allowed` names (the core dependencies and what they require): an environment with only the core
# dependencies installed, simulated inside this one.
_ONLY_CORE = """
import importlib.abc, importlib.metadata as md, json, sys
allowed = set(json.loads(sys.argv[1]))
provided = md.packages_distributions()
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top == "perflab" or top.startswith("_"):
            return None
        if not {d.lower().replace("_", "-") for d in provided.get(top, [])} & allowed:
            raise ModuleNotFoundError(f"{name} is not installed with perflab's core dependencies", name=name)
        return None
sys.meta_path.insert(0, Block())
from perflab import results
results.validate(results.load(sys.argv[2]))
print("validated")
"""


def _with_requirements(names: set[str]) -> set[str]:
    """`names` and every distribution they require (extras left out), as installed here."""
    import importlib.metadata as md

    seen: set[str] = set()
    todo = [n.lower().replace("_", "-") for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:
                continue
            todo.append(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower().replace("_", "-"))
    return seen


def test_results_validate_with_only_the_core_dependencies() -> None:
    """perflab.results validates every results file with jsonschema: it must be a core dependency
    (pinned like the rest), not something that arrives only with the `labs` extra."""
    import json
    import subprocess
    import sys

    core = {line.split("==")[0].lower() for line in _requirements((ROOT / "pyproject.toml").read_text())[:_core_count()]}
    assert "jsonschema" in core
    run = subprocess.run([sys.executable, "-c", _ONLY_CORE, json.dumps(sorted(_with_requirements(core))),
                          str(ROOT / "tests" / "fixtures" / "results" / "lab01_measure.json")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.strip() == "validated", run.stderr[-2000:]


def _core_count() -> int:
    """How many of `_requirements`'s strings are [project] dependencies (they come first)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    return len(re.findall(r'^\s*"[^"]+==[^"]+",?', block, flags=re.M))
