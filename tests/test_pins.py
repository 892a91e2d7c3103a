"""Versions in two layers: pyproject.toml declares the ranges the kit works in (a student's own torch in
range stays installed), constraints.txt locks the exact versions `make setup`, CI and environment.yml
install. These tests hold the layers together: every requirement is locked inside its range, the
Makefile and environment.yml install through the lock, and this environment is the locked one."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = "constraints.txt"
EXTRAS = "labs,dev,ray"  # what `make setup`, CI and environment.yml install
LOCKED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)==([^\s;#]+)$")


def _requirements(pyproject: str) -> dict[str, list[str]]:
    """The requirement strings of [project] dependencies ("core") and of each optional-dependencies
    list, by name. Read as text, the one layout pyproject.toml uses."""
    table, listing, out = "", "", {}
    for raw in pyproject.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not listing and line.startswith("[") and line.endswith("]"):
            table = line
        elif not listing and line.endswith("= ["):
            if table == "[project]" and line.startswith("dependencies"):
                listing = "core"
            elif table == "[project.optional-dependencies]":
                listing = line.split("=", 1)[0].strip()
            if listing:
                out[listing] = []
        elif listing and line.startswith("]"):
            listing = ""
        elif listing and line:
            out[listing].append(line.rstrip(",").strip('"'))
    return out


def _ranges() -> dict[str, Requirement]:
    found = _requirements((ROOT / "pyproject.toml").read_text())
    return {canonicalize_name(req.name): req for lines in found.values() for req in map(Requirement, lines)}


def _lock() -> dict[str, str]:
    """constraints.txt as {name: exact version}; any line that is not `name==version` fails."""
    pins = {}
    for number, raw in enumerate((ROOT / LOCK).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = LOCKED.match(line)
        assert match, f"{LOCK}:{number}: {line!r} is not `name==version`"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"{LOCK}:{number}: {name} is locked twice"
        pins[name] = match.group(2)
    return pins


def test_requirements_reader_sees_every_list() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    found = _requirements(text)
    assert set(found) == {"core", "labs", "ray", "dev"}
    assert sum(map(len, found.values())) == len(re.findall(r'^\s*"[A-Za-z][^"]*[<>=~][^"]*",?\s*$', text, re.M))
    assert "jsonschema" in {Requirement(r).name for r in found["core"]}


def test_requires_python_is_what_the_locked_versions_need() -> None:
    """The kit's Python floor is no lower than any locked distribution's own, so pip says "requires a
    different Python" instead of failing to resolve."""
    from importlib.metadata import PackageNotFoundError, metadata

    from packaging.specifiers import SpecifierSet

    floor = re.search(r'^requires-python = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert floor, "pyproject.toml: no requires-python"
    lowest = min(Version(s.version) for s in SpecifierSet(floor.group(1)) if s.operator == ">=")
    too_new = {}
    for name in _ranges():
        try:
            needs = metadata(name).get("Requires-Python")
        except PackageNotFoundError:
            continue
        if needs and not SpecifierSet(needs).contains(str(lowest)):
            too_new[name] = needs
    assert not too_new, f"requires-python {floor.group(1)} is below what these need: {too_new}"


def test_pyproject_declares_ranges_not_pins() -> None:
    """A range with a lower and an upper bound for every requirement: `==` would uninstall a student's
    own torch (Colab's) for one exact build."""
    for req in _ranges().values():
        operators = {spec.operator for spec in req.specifier}
        assert "==" not in operators and "===" not in operators, f"pyproject.toml: {req} pins an exact version"
        assert operators & {">=", ">", "~="} and operators & {"<", "<=", "~="}, f"pyproject.toml: {req} needs both bounds"


def test_every_requirement_is_locked_inside_its_range() -> None:
    lock = _lock()
    for name, req in _ranges().items():
        assert name in lock, f"{LOCK} has no version for {req}"
        assert req.specifier.contains(lock[name], prereleases=True), f"{LOCK}: {name}=={lock[name]} is outside {req}"


def test_torch_range_admits_what_the_kit_ran_on_and_locks_the_tested_pair() -> None:
    ranges, lock = _ranges(), _lock()
    assert (lock["torch"], lock["torchvision"]) == ("2.14.1", "0.29.1")
    for name, ran_on in (("torch", ("2.11.0", "2.14.1")), ("torchvision", ("0.26.0", "0.29.1"))):
        assert all(ranges[name].specifier.contains(v) for v in ran_on), ranges[name]
        assert not ranges[name].specifier.contains("3.0.0" if name == "torch" else "1.0.0"), ranges[name]
    # the lower bound is a version the kit ran on: every GPU check in docs/gpu-runs/ ran torch 2.11.0
    assert min(Version(s.version) for s in ranges["torch"].specifier if s.operator == ">=") == Version("2.11")


def test_make_setup_installs_through_the_lock() -> None:
    makefile = (ROOT / "Makefile").read_text()
    rule = re.search(r"^\$\(STAMP\):(.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert rule, "Makefile: no $(STAMP) rule"
    assert {"pyproject.toml", LOCK} <= set(rule.group(1).split()), "the venv must be rebuilt when the lock changes"
    assert f"pip install -q -c {LOCK} -e '.[{EXTRAS}]'" in rule.group(2)


def test_environment_yml_installs_the_same_lock_and_no_version_of_its_own() -> None:
    text = (ROOT / "environment.yml").read_text()
    pip = re.search(r"^  - pip:\n((?:      - .*\n)+)", text, re.M)
    assert pip, "environment.yml: no pip section"
    assert [line.strip()[2:] for line in pip.group(1).splitlines()] == [f"-c {LOCK}", f"-e .[{EXTRAS}]"]
    body = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in body if "==" in line], "environment.yml pins a version; the lock holds them"


def test_installed_versions_match_the_lock() -> None:
    """This environment is the locked one: every locked distribution installed here has its locked
    version, and every requirement of pyproject.toml is installed."""
    from importlib.metadata import PackageNotFoundError, version

    required, wrong = set(_ranges()), {}
    for name, locked in _lock().items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            if name in required:
                wrong[name] = "not installed"
            continue
        if Version(installed).public != Version(locked).public:
            wrong[name] = installed
    assert not wrong, f"installed versions differ from {LOCK} (run `make setup`): {wrong}"


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
    """perflab.results validates every results file with jsonschema: it must be a core dependency,
    not something that arrives only with the `labs` extra."""
    import json
    import subprocess
    import sys

    core = {Requirement(line).name.lower() for line in _requirements((ROOT / "pyproject.toml").read_text())["core"]}
    assert "jsonschema" in core
    run = subprocess.run([sys.executable, "-c", _ONLY_CORE, json.dumps(sorted(_with_requirements(core))),
                          str(ROOT / "tests" / "fixtures" / "results" / "lab01_measure.json")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.strip() == "validated", run.stderr[-2000:]
