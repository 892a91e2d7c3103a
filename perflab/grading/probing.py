"""The student's side of the grading contract: probes that call the student's answers and return
plain data. Public (it ships to students): it holds no answer and decides nothing.

A lab's contract module (`perflab/labs/labNN.py`) lists, for every autograded cell, the probe that
collects what the grader needs from the student's notebook:

    PROBES = {"test_pick_workers": probe_pick_workers, ...}

    def probe_pick_workers(answers: Answers, seed: int) -> dict:
        pick = answers["pick_workers"]                     # the student's function, by name
        cases = pick_workers_cases(seed)                   # inputs drawn from the grader's seed
        return {"picked": [outcome(pick, sweep, tol) for sweep, tol in cases]}

A probe runs in the student's kernel after the notebook, so nothing it returns is trusted: it
returns the student's raw outputs (numbers, lists, the fields of a config), never a verdict. The
grader (`perflab.grading.judging`, in a process that never runs student code) draws the same inputs
from the same seed, computes the reference answers itself and decides. A probe that raises, or an
answer that is missing, is recorded as such and scores the cell 0.

    python: harness.run(lab, seed, out)   # the last cell the grading kernel runs (see harness.py)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

# What a probe returns is cut to this many list items and characters per string: a probe returns
# outputs on small inputs (a page a notebook wrote is the largest, a few MB), and an endless or huge
# answer must not blow up the result pipe.
MAX_ITEMS = 10_000
MAX_CHARS = 6 * 1024 * 1024
# Tensors up to this many elements travel whole; larger ones as shape, dtype and summary numbers.
MAX_TENSOR_ELEMENTS = 4096

Probe = Callable[["Answers", int], Any]


class MissingAnswer(LookupError):
    """The notebook does not define a name a probe needs."""


class Answers:
    """Read access to what the student's notebook defined (the kernel's user namespace)."""

    def __init__(self, namespace: Mapping[str, Any]) -> None:
        self._namespace = namespace

    def __getitem__(self, name: str) -> Any:
        try:
            return self._namespace[name]
        except KeyError:
            raise MissingAnswer(f"the notebook defines no `{name}` (run every cell, and keep the "
                                "name the lab asks for)") from None

    def get(self, name: str, default: Any = None) -> Any:
        return self._namespace.get(name, default)

    def __contains__(self, name: str) -> bool:
        return name in self._namespace

    @property
    def namespace(self) -> Mapping[str, Any]:
        """The whole namespace (to export a function with what it uses: `export_source`)."""
        return self._namespace


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Call `fn` and record what happened as data: {"value": ...} or {"raised": type, "message": ...}."""
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:  # the student's function may raise anything; that is an answer too
        return {"raised": type(exc).__name__, "message": str(exc)[:500]}
    return {"value": encode(value)}


def encode(value: Any, depth: int = 0) -> Any:
    """`value` as JSON-able data: numbers, strings, lists, str-keyed dicts; tensors, arrays and
    dataclasses as tagged dicts; anything else by its type name. Never raises."""
    if depth > 20:
        return {"type": "too deep"}
    if value is None or isinstance(value, (bool, int, str)):
        return value[:MAX_CHARS] if isinstance(value, str) else value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, (list, tuple)):
        return [encode(v, depth + 1) for v in list(value)[:MAX_ITEMS]]
    if isinstance(value, Mapping):
        return {str(k)[:200]: encode(v, depth + 1) for k, v in list(value.items())[:MAX_ITEMS]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: encode(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value)}
        return {"dataclass": type(value).__name__, "fields": fields}
    tensor = _tensor(value)
    if tensor is not None:
        return tensor
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "shape", None) == ():
        try:  # a numpy scalar
            return encode(value.item(), depth + 1)
        except Exception:
            pass
    return {"type": type(value).__name__}


def _tensor(value: Any) -> dict[str, Any] | None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not isinstance(value, torch.Tensor):
        try:
            import numpy as np
        except ImportError:  # pragma: no cover
            return None
        if not isinstance(value, np.ndarray):
            return None
        value = torch.from_numpy(value)
    t = value.detach().to("cpu")
    out: dict[str, Any] = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
    flat = t.reshape(-1)
    if flat.numel() <= MAX_TENSOR_ELEMENTS:
        out["values"] = encode(flat.tolist())
    else:
        as_float = flat.double() if flat.is_floating_point() or not flat.is_complex() else flat.abs().double()
        out["sum"] = encode(float(as_float.sum()))
        out["norm"] = encode(float(as_float.norm()))
        out["head"] = encode(flat[:16].tolist())
    return {"tensor": out}


def decode_float(value: Any) -> float | None:
    """A number as `encode` wrote it (None if it is not one)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict) and set(value) == {"float"} and value["float"] in ("nan", "inf", "-inf"):
        return float(value["float"])
    return None


def run_probes(probes: Mapping[str, Probe], namespace: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """{grade_id: observation} for every probe; a probe that fails records {"probe_error": why}."""
    answers = Answers(namespace)
    out: dict[str, Any] = {}
    for grade_id, probe in probes.items():
        try:
            out[grade_id] = {"observed": encode(probe(answers, seed))}
        except MissingAnswer as exc:
            out[grade_id] = {"probe_error": str(exc)}
        except Exception as exc:
            out[grade_id] = {"probe_error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    return out


# ---------------------------------------------------------------------------------------------
# A student's function as source, to run it where the kernel cannot reach (a fresh sandboxed process)

LITERALS = (bool, int, float, str, bytes, type(None))


def _literal(value: Any, depth: int = 0) -> bool:
    if isinstance(value, LITERALS):
        return True
    if depth < 4 and isinstance(value, (list, tuple, set, frozenset)):
        return all(_literal(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, dict):
        return all(_literal(k, depth + 1) and _literal(v, depth + 1) for k, v in value.items())
    return False


def _names_used(source: str) -> list[str]:
    """Every name a piece of source reads (globals among them), in order of first use."""
    import ast

    return list(dict.fromkeys(node.id for node in ast.walk(ast.parse(source))
                              if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)))


def _source(obj: Any) -> str:
    """The source of a function or class defined in a notebook cell."""
    import ast
    import inspect
    import linecache
    import textwrap

    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        if not inspect.isclass(obj):
            raise
    # A class in a notebook cell (inspect cannot find it before Python 3.13): through its methods' cell.
    for value in vars(obj).values():
        if not inspect.isfunction(value):
            continue
        text = "".join(linecache.getlines(value.__code__.co_filename))
        found = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef) and n.name == obj.__name__]
        if found:
            node = found[-1]
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return textwrap.dedent("".join(text.splitlines(keepends=True)[start - 1: node.end_lineno]))
    raise OSError(f"cannot find the source of class {obj.__name__}")


def export_source(fn: Callable[..., Any], namespace: Mapping[str, Any]) -> str:
    """A module's text that defines `fn` as the notebook did: its source, the sources of the notebook's
    functions and classes it uses (and theirs), the modules and library names it refers to as imports,
    and plain constants (numbers, strings, tuples of them) as assignments. A name it uses that cannot
    be written so (a tensor, a model the notebook built) is left out: the module then fails with a
    NameError naming it, which the grader reports.

    Raises OSError when the source of `fn` or of a notebook class it uses cannot be found."""
    import inspect

    imports: list[str] = []
    constants: list[str] = []
    sources: list[str] = []
    seen: set[int] = set()

    def visit(obj: Any) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        source = _source(obj)
        for name in _names_used(source):
            if name not in namespace:
                continue
            value = namespace[name]
            if inspect.ismodule(value):
                line = f"import {value.__name__}" + (f" as {name}" if name != value.__name__ else "")
                if "." in value.__name__ and name == value.__name__.split(".")[0]:
                    line = f"import {value.__name__}"
                imports.append(line)
            elif (inspect.isfunction(value) or inspect.isclass(value)) and _from_notebook(value):
                visit(value)
            elif inspect.isfunction(value) or inspect.isclass(value) or inspect.isbuiltin(value):
                module, qual = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
                if module and qual and "." not in qual and "<" not in qual:
                    imports.append(f"from {module} import {qual}" + (f" as {name}" if name != qual else ""))
            elif _literal(value):
                constants.append(f"{name} = {value!r}")
        sources.append(source)

    visit(fn)
    text = "\n".join(dict.fromkeys(imports)) + "\n\n" + "\n".join(dict.fromkeys(constants)) + "\n\n\n"
    return text + "\n\n".join(dict.fromkeys(sources))


def _from_notebook(obj: Any) -> bool:
    """Whether a function or class was defined in the notebook (not imported from a module)."""
    return getattr(obj, "__module__", None) in ("__main__", None)
