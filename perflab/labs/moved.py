"""Names a lab module no longer defines, still answered for a notebook released before they moved.

A lab's contract (`perflab.labs.labNN`) states what is asked; its checks, probes and measurements
import it, never the reverse. What moved out of a contract is listed in its `MOVED` ({name: the module
it lives in now}), and its module-level `__getattr__` answers those names from there, importing that
module only when such a name is read: a notebook released before the move keeps running.

Reading a moved name warns once per name with `MovedNameWarning`, which says where the name lives now.
It is a PendingDeprecationWarning, hidden under Python's default filters *and* in a notebook's
`__main__` (IPython shows DeprecationWarning there): nbgrader scores a test cell that writes to stderr 0,
so a released notebook must stay silent.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable
from typing import Any


class MovedNameWarning(PendingDeprecationWarning):
    """A name read from a lab module it moved out of (hidden by default; `-W always` shows it)."""


_WARNED: set[tuple[str, str]] = set()


def first_read(module: str, name: str) -> bool:
    """True the first time `module.name` is read through its moved-name lookup in this process."""
    key = (module, name)
    if key in _WARNED:
        return False
    _WARNED.add(key)
    return True


def message(module: str, name: str, home: str) -> str:
    """The warning's words: where `module.name` lives now."""
    return f"{module}.{name} moved to {home}.{name}; import it from {home}"


def table(moves: Iterable[tuple[str, Iterable[str]]]) -> dict[str, str]:
    """{name: module} from (module, names) pairs: a contract's MOVED, grouped by where the names went."""
    return {name: home for home, names in moves for name in names}


def lookup(module: str, moves: dict[str, str]) -> Callable[[str], Any]:
    """The module-level `__getattr__` of `module`: a name in `moves` read from where it lives now,
    warning once; any other name an AttributeError."""
    def __getattr__(name: str) -> Any:
        home = moves.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        if first_read(module, name):
            warnings.warn(message(module, name, home), MovedNameWarning, stacklevel=2)
        return getattr(importlib.import_module(home), name)

    return __getattr__
