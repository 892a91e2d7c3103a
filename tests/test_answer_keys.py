"""The answer key lives on the grader's side only: no module the student's kit ships gives a reference
configuration, a reference decision or a calibration pair.

A student cell `BEST = lab02.reference_best()` or `FINAL = lab06.reference_final()` once earned the
decision points without measuring anything. The reference answers (`reference_best` of labs 2 and 3,
lab 6's plan, decisions and FINAL, each lab's `calibration_pair`) now live in the grader-only
`perflab/labs/labNN/judges/`, which the bundle leaves out (`perflab.bundle.GRADER_ONLY`). These tests
hold every shipped module to that by name, and, more robustly, by what its functions return: none may
hand back a TrainConfig equal to a reference the grader's side computes (tests/test_bundle.py checks
the built zip itself).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import perflab
from perflab import bundle, env
from perflab.labs import lab02, lab03, lab04, lab06
from perflab.labs.lab02 import judges as hidden02
from perflab.labs.lab03 import judges as hidden03
from perflab.labs.lab04 import judges as hidden04
from perflab.labs.lab06 import judges as hidden06
from perflab.workload import TrainConfig

# A public name of this shape in a shipped module is an answer key.
ANSWER_KEY = re.compile(r"(reference_\w+|calibration_pair)")
# Names of that shape that give no answer, and why.
NOT_ANSWERS = {
    "reference_activation_bytes": "lab 4: the activation bytes of the plain (unmodified) workload the "
                                  "student's checkpointing is measured against, not a configuration",
    "reference_notebook": "demo: fills a released notebook from the instructor's solution source, "
                          "which the kit does not hold",
}
# The answer keys each student contract once held (now on the grader's side): a cell reading one fails.
FORMER_KEYS = {lab02: ("reference_best",), lab03: ("reference_best", "calibration_pair"),
              lab04: ("calibration_pair",),
              lab06: ("reference_final", "reference_decisions", "calibration_pair", "plan_changes",
                      "loader_change", "precision_change")}
MODES = ("tiny", "grade")


def shipped_module_names() -> list[str]:
    """Every module of perflab the student bundle ships (`bundle.GRADER_ONLY` left out)."""
    grader_only = tuple(path.removesuffix(".py").replace("/", ".") for path in bundle.GRADER_ONLY)
    names = ["perflab"]
    for info in pkgutil.walk_packages(perflab.__path__, "perflab."):
        if info.name.endswith("__main__") or any(info.name == g or info.name.startswith(g + ".") for g in grader_only):
            continue
        names.append(info.name)
    return names


def _answer_names(module: ModuleType) -> list[str]:
    return sorted(name for name, value in vars(module).items()
                  if callable(value) and ANSWER_KEY.fullmatch(name) and name not in NOT_ANSWERS)


def test_the_walk_covers_the_package_and_leaves_the_grader_side_out():
    names = shipped_module_names()
    assert {"perflab.labs.lab02", "perflab.labs.lab06", "perflab.verify.calibrate", "perflab.grading.self_calibration",
            "perflab.cli.calibrate"} <= set(names)
    assert not [n for n in names if ".judges" in n or n == "perflab.grading.judging"]


def test_no_shipped_module_has_an_answer_key_by_name():
    found = {name: keys for name in shipped_module_names()
             if (keys := _answer_names(importlib.import_module(name)))}
    assert found == {}, f"answer keys in modules the student's kit ships (move them to the lab's judges/): {found}"


def test_the_name_rule_finds_an_answer_key_put_back():
    fake = ModuleType("perflab.labs.lab09")
    fake.reference_best = lambda mode=None: TrainConfig()  # type: ignore[attr-defined]
    fake.calibration_pair = lambda mode="grade": (TrainConfig(), TrainConfig())  # type: ignore[attr-defined]
    fake.reference_activation_bytes = lambda config: 0  # type: ignore[attr-defined]
    assert _answer_names(fake) == ["calibration_pair", "reference_best"]


def test_the_grader_side_holds_every_answer_key():
    for side, names in ((hidden02, ["reference_best"]), (hidden03, ["calibration_pair", "reference_best"]),
                        (hidden04, ["calibration_pair"]),
                        (hidden06, ["calibration_pair", "reference_decisions", "reference_final"])):
        assert set(names) <= set(_answer_names(side)), side.__name__
    assert callable(hidden06.plan_changes) and callable(hidden06.loader_change) and callable(hidden06.precision_change)


# ---------------------------------------------------------------------------------------------
# A student's cell that copies the answer key finds nothing


def test_a_student_cell_reading_the_answer_key_fails():
    for module, names in FORMER_KEYS.items():
        for name in names:
            assert not hasattr(module, name), f"{module.__name__}.{name}: the student's kit must not answer it"
    with pytest.raises(AttributeError):
        exec("BEST = lab02.reference_best()", {"lab02": lab02})
    with pytest.raises(AttributeError):
        exec("FINAL = lab06.reference_final()", {"lab06": lab06})
    with pytest.raises(AttributeError):
        exec("DECIDED = lab06.reference_decisions(INFO)", {"lab06": lab06, "INFO": env.machine_info()})
    with pytest.raises(ImportError):
        exec("from perflab.labs.lab03 import reference_best", {})
    with pytest.raises(ImportError):
        exec("from perflab.labs.lab06 import calibration_pair", {})


# ---------------------------------------------------------------------------------------------
# No shipped function returns a reference configuration under another name


def _machine(device: str = "cpu", bf16: bool = True, cores: int = 8) -> env.MachineInfo:
    """A machine where the references change something: bf16 hardware, cores for loader workers."""
    info = env.machine_info()
    return env.MachineInfo(**{**info.to_dict(), "device": device, "cpu_bf16": bf16, "cpu_count": cores,
                              "gpu_memory_bytes": None, "hardware_class": "cpu-bf16" if bf16 else "cpu"})


def _all_gains(name: str) -> Any:
    """Every calibration entry a calibrated gain: lab 6's reference FINAL then keeps every change it plans."""
    return SimpleNamespace(calibrated=True, kind="gain", hardware_class="test", reason=f"{name}: gain", threshold=1.1)


def _baselines(mode: str) -> list[TrainConfig]:
    import perflab.labs as labs

    out = []
    for info in pkgutil.iter_modules(labs.__path__):
        module = importlib.import_module(f"perflab.labs.{info.name}")
        if re.fullmatch(r"lab\d\d", info.name) and callable(getattr(module, "baseline_config", None)):
            out.append(module.baseline_config(mode))
    return out


def references(mode: str, info: env.MachineInfo) -> dict[str, TrainConfig]:
    """The reference configurations the grader's side computes at `mode` on `info`, each that changes
    something (a reference equal to a lab's public baseline gives nothing away)."""
    found = {"lab02.reference_best": hidden02.reference_best(mode),
             "lab03.reference_best": hidden03.reference_best(mode, info),
             "lab04.calibration_pair": hidden04.calibration_pair(mode)[1],
             "lab06.reference_final": hidden06.reference_final(mode, info, expectations=_all_gains)}
    decided = hidden06.reference_decisions(info, mode)
    base = lab06.baseline_config(mode)
    found["lab06.reference_decisions (loader)"] = base.replace(**decided["loader"])
    if decided["precision"]:
        found["lab06.reference_decisions (precision)"] = base.replace(**decided["precision"])
    baselines = _baselines(mode)
    return {name: config for name, config in found.items() if config not in baselines}


def _required(function: Any) -> list[str] | None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    return [p.name for p in signature.parameters.values() if p.default is p.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


# Arguments a shipped function may be called with here: the mode, and a machine with bf16 and workers.
FILLABLE = {"mode", "info"}


def contract_calls(mode: str, info: env.MachineInfo) -> Iterator[tuple[str, Any]]:
    """(name, what it returned) for every public function of every shipped lab contract
    (`perflab.labs.labNN`) whose required arguments are at most the mode and a machine, called with them
    (and with its defaults alone), and every module-level value of those contracts."""
    import perflab.labs as labs

    for found in sorted(pkgutil.iter_modules(labs.__path__), key=lambda i: i.name):
        if not re.fullmatch(r"lab\d\d", found.name):
            continue
        module = importlib.import_module(f"perflab.labs.{found.name}")
        for name, value in sorted(vars(module).items()):
            if name.startswith("_"):
                continue
            yield f"{module.__name__}.{name}", value
            if not inspect.isfunction(value) or value.__module__ != module.__name__:
                continue
            required = _required(value)
            if required is None or not set(required) <= FILLABLE:
                continue
            params = inspect.signature(value).parameters
            given = {k: v for k, v in (("mode", mode), ("info", info)) if k in params}
            for kwargs in ({k: given[k] for k in required}, given):
                yield f"{module.__name__}.{name}({', '.join(kwargs)})", value(**kwargs)


@pytest.mark.parametrize("mode", MODES)
def test_no_shipped_contract_returns_a_reference_configuration(mode, monkeypatch):
    monkeypatch.setenv("PERFLAB_MODE", mode)
    info = _machine()
    refs = references(mode, info)
    # The check means something: the grader's references here change what the labs teach.
    assert {"lab02.reference_best", "lab03.reference_best", "lab06.reference_final"} <= set(refs), refs
    leaks = []
    calls = 0
    for where, value in contract_calls(mode, info):
        calls += 1
        if isinstance(value, TrainConfig):
            leaks += [f"{where} == {name}" for name, ref in refs.items() if value == ref]
    assert calls > 50, "the contracts were not called: is perflab.labs there?"
    assert leaks == [], f"shipped functions give the grader's reference configuration: {leaks}"


def test_the_return_rule_finds_a_reference_under_another_name(monkeypatch):
    """The detector itself: a contract function renamed but returning lab 3's reference is found."""
    monkeypatch.setenv("PERFLAB_MODE", "tiny")
    info = _machine()

    def suggested_amp(mode: str | None = None, info: env.MachineInfo | None = None) -> TrainConfig:
        return hidden03.reference_best(mode, info)

    suggested_amp.__module__ = lab03.__name__
    monkeypatch.setattr(lab03, "suggested_amp", suggested_amp, raising=False)
    refs = references("tiny", info)
    found = [where for where, value in contract_calls("tiny", info)
             if isinstance(value, TrainConfig) and value == refs["lab03.reference_best"]]
    assert "perflab.labs.lab03.suggested_amp(mode, info)" in found


# ---------------------------------------------------------------------------------------------
# The package's own source: no shipped file defines an answer key


def shipped_sources() -> dict[str, str]:
    """{name in the zip: text} of every Python file the bundle would ship (without building it)."""
    return {name: path.read_text(encoding="utf-8") for path, name in bundle.files()
            if name.startswith(f"{bundle.ROOT_NAME}/perflab/") and name.endswith(".py")}


def defined_answer_keys(source: str) -> list[str]:
    """Module-level names of a Python source that look like an answer key (defined, assigned or imported)."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [(alias.asname or alias.name).split(".")[0] for alias in node.names]
    return sorted(n for n in names if ANSWER_KEY.fullmatch(n) and n not in NOT_ANSWERS)


def test_no_shipped_source_defines_an_answer_key():
    sources = shipped_sources()
    assert f"{bundle.ROOT_NAME}/perflab/labs/lab06/__init__.py" in sources
    assert not [n for n in sources if "/judges/" in n or n.endswith("/perflab/grading/judging.py")]
    found = {name: keys for name, text in sources.items() if (keys := defined_answer_keys(text))}
    assert found == {}, f"shipped files define answer keys: {found}"
    assert defined_answer_keys("def reference_final(mode='grade'):\n    pass\n") == ["reference_final"]
    assert defined_answer_keys("from x import calibration_pair\n") == ["calibration_pair"]


# ---------------------------------------------------------------------------------------------
# Lab 1's mystery pipeline: the kit writes it and returns no planted truth (the grader recomputes it)

# What a planted truth is made of: a field, key or attribute of these names in what a shipped function
# returns carries it.
TRUTH_FIELDS = frozenset({"planted", "dose", "doses", "kind", "kinds", "lines", "helper_lines", "accepted_lines",
                          "bug_lines", "symptom", "fix", "tool", "accepts", "helpers", "costs_time"})
MYSTERY_IDS = ("alice", "bob", "ivan", "judy")


def _truth_of(student: str) -> tuple[set[str], set[tuple[int, ...]]]:
    from perflab.labs.lab01.judges import mystery_truth

    planted = mystery_truth.truth(student).planted
    return {p.key for p in planted}, {p.lines for p in planted} | {p.helper_lines for p in planted if p.helper_lines}


def carried_truth(value: Any, keys: set[str], lines: set[tuple[int, ...]], where: str = "", depth: int = 0) -> list[str]:
    """Where `value` (what a shipped function returned) carries a planted truth: a field named as one, a
    planted bug's key as a value, or a planted bug's line numbers."""
    import dataclasses
    from collections.abc import Mapping

    if depth > 6 or value is None or isinstance(value, (bool, int, float, bytes, ModuleType, type)) or callable(value):
        return []
    if isinstance(value, str):
        return [f"{where}: {value!r}"] if value in keys else []
    if isinstance(value, tuple) and value and all(isinstance(v, int) for v in value):
        return [f"{where}: lines {value}"] if value in lines else []
    found: list[str] = []
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    elif isinstance(value, Mapping):
        fields = {str(k): v for k, v in value.items()}
        found += [f"{where}[{k!r}]" for k in value if isinstance(k, str) and k in keys]
    elif isinstance(value, (list, tuple, set, frozenset)):
        fields = {f"{i}": v for i, v in enumerate(value)}
    else:
        fields = {k: v for k, v in getattr(value, "__dict__", {}).items() if not k.startswith("_")}
    found += [f"{where}.{name}" for name in fields if name in TRUTH_FIELDS]
    for name, item in fields.items():
        found += carried_truth(item, keys, lines, f"{where}.{name}", depth + 1)
    return found


def mystery_values() -> Iterator[tuple[str, Any]]:
    """(name, value) of every public module-level value of the shipped perflab.mystery package (what the
    kit writes every pipeline from: the same for every id)."""
    from perflab import mystery

    for module in (mystery, mystery.catalogue, mystery.template):
        for name, value in sorted(vars(module).items()):
            if not name.startswith("_") and not callable(value) and not isinstance(value, ModuleType):
                yield f"{module.__name__}.{name}", value


def mystery_calls(student: str) -> Iterator[tuple[str, Any]]:
    """(name, what it returned) for every public function of the shipped perflab.mystery package whose
    required arguments are a student id and a mode, called with the id (and the tiny mode)."""
    from perflab import mystery

    for module in (mystery, mystery.catalogue, mystery.template):
        for name, value in sorted(vars(module).items()):
            if name.startswith("_") or not callable(value) or getattr(value, "__module__", "") != module.__name__:
                continue
            required = _required(value)
            if required is None or not set(required) <= {"student", "mode", "typed"}:
                continue
            params = inspect.signature(value).parameters
            given = {k: v for k, v in (("student", student), ("typed", student), ("mode", "tiny")) if k in params}
            yield f"{module.__name__}.{name}({', '.join(given)})", value(**given)


@pytest.mark.parametrize("student", MYSTERY_IDS)
def test_no_public_function_of_the_shipped_mystery_returns_the_planted_truth(student):
    keys, lines = _truth_of(student)
    calls = list(mystery_calls(student))
    assert "perflab.mystery.for_student(student, mode)" in [name for name, _ in calls]
    leaks = [found for name, value in calls for found in carried_truth(value, keys, lines, name)]
    assert leaks == [], f"the student's kit returns what was planted for {student}: {leaks}"


def test_what_the_shipped_mystery_writes_pipelines_from_says_nothing_of_bugs():
    """The snippets and the template are the code every pipeline may carry (the same for every id): none of
    it says which is a bug of what type, what shows it or how it is fixed, or how a dose is judged."""
    prose = TRUTH_FIELDS - {"lines"}  # a snippet's code lines are what the kit writes
    found = [f for name, value in mystery_values() for f in carried_truth(value, set(), set(), name)
             if f.rsplit(".", 1)[-1] in prose]
    assert found == [], found


def test_the_truth_rule_finds_a_planted_truth_put_back():
    """The detector itself: the grader's truth (as the kit's for_student once returned it), or its keys or
    lines alone, are found."""
    from perflab.labs.lab01.judges import mystery_truth

    keys, lines = _truth_of("bob")
    case = mystery_truth.truth("bob")
    assert carried_truth(case, keys, lines, "for_student")
    assert carried_truth({"bugs": sorted(keys)}, keys, lines, "x")
    assert carried_truth([case.planted[0].lines], keys, lines, "x")
    assert carried_truth(mystery_truth.BY_KEY["row_loop"], set(), set(), "x")  # prose: symptom, fix, tool


def test_the_shipped_mystery_has_no_truth_in_its_api():
    from perflab import mystery
    from perflab.mystery import catalogue

    for gone in ("Planted", "draw", "light_dose", "CATALOGUE", "BY_KEY", "Bug"):
        assert not hasattr(mystery, gone) and not hasattr(catalogue, gone), gone
    assert list(inspect.signature(mystery.for_student).parameters) == ["student", "mode"]
    assert not hasattr(mystery.for_student("bob"), "planted")
    for snippet in catalogue.SNIPPETS:
        assert not {f for f in vars(snippet)} & TRUTH_FIELDS - {"lines"}, snippet.key


def test_no_shipped_file_holds_the_bugs_prose():
    """The tool, symptom and fix of each bug are the grader's (perflab/labs/lab01/judges/mystery_truth.py): no
    file the kit ships, package or notebook, holds one of them."""
    from perflab.labs.lab01.judges.mystery_truth import CATALOGUE

    prose = {text for bug in CATALOGUE for text in (bug.symptom, bug.fix)}
    assert len(prose) == 2 * len(CATALOGUE)
    found = []
    for path, name in bundle.files():
        if path.suffix in (".py", ".ipynb", ".md", ".json", ".txt", ".html"):
            text = path.read_text(encoding="utf-8", errors="replace")
            found += [f"{name}: {p[:50]!r}" for p in prose if p in text]
    assert found == [], found
