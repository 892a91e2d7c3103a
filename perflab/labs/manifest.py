"""What the core needs to know of a lab, declared by the lab: its contract's `MANIFEST`.

A manifest is data (a dict literal in `perflab/labs/labNN.py`, read without importing the contract, so
reading it costs no torch import and no import circle). The core (env, grading, verify, the report, the
demo, the diagnosis) reads every lab from `perflab.labs.registry` and names none.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# A lab's name: its nbgrader assignment, `labNN_what` (lower case); its key is the `labNN` part.
LAB_NAME = re.compile(r"(lab\d\d)_[a-z0-9_]+")
# A workload: (data set, image side, batch size).
Workload = tuple[str, int, int]


@dataclass(frozen=True)
class LabManifest:
    """One lab, as the core sees it."""

    lab: str
    title: str = ""
    # {mode ("grade", "laptop"): {device kind ("cpu", "cuda", "mps"): workload}}: where the lesson shows
    # at that mode on that device (docs/DESIGN.md, "Workloads where the lesson is true"); a mode or kind
    # not listed runs at the mode's base sizes.
    workloads: Mapping[str, Mapping[str, Workload]] = field(default_factory=dict)
    fed: bool = False  # its baseline on a GPU keeps the data set decoded on the device (`env.baseline_loader`)
    # The contract's function `(mode) -> [(expectations entry, baseline workload)]` of its cells re-measured
    # against a bar calibrated on the grading machine ("" where none is).
    bars: str = ""
    graded_changes: tuple[str, ...] = ()  # reference optimisations calibrated at this lab's grade workload
    pair_from_bars: bool = False  # its calibration pair keeps only the gains calibrated before it
    starts_from: tuple[str, ...] = ()  # labs whose graded decisions it starts from (graded before it)
    decides_at_home: bool = False  # its notebook decides from a recorded measurement (`homework`)
    untimed_records: tuple[str, ...] = ()  # home-record kinds that hold no timing (a decision, a fixed seed)
    repeated_records: tuple[str, ...] = ()  # home-record kinds whose samples repeat one measurement
    report_sections: tuple[str, ...] = ()  # the report sections its results file fills
    ablation: bool = False  # its `speedups` are a cumulative ablation
    lazy_choices: Mapping[str, str] = field(default_factory=dict)  # grade_id -> the demo's lazy line
    hints: tuple[str, ...] = ()  # the diagnosis's next steps it teaches (`perflab.diagnose` topics)
    private_modules: tuple[str, ...] = ()  # modules whose private names a notebook may not reach
    mystery_data: bool = False  # its notebook trains the mystery pipeline on that pipeline's data set

    @property
    def key(self) -> str:
        """The `labNN` part of the name: its contract module's name."""
        return self.lab.split("_", 1)[0]

    def workload(self, mode: str, kind: str) -> Workload | None:
        """Its own workload at `mode` on device kind `kind`; None where it has none."""
        return self.workloads.get(mode, {}).get(kind)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> LabManifest:
        """Check `data` (a contract's MANIFEST) field by field; ValueError naming `where` and the field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: MANIFEST must be a dict, not {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"{where}: MANIFEST has unknown field(s) {', '.join(unknown)}; "
                             f"known: {', '.join(fields)}")
        values = dict(data)
        for name, value in values.items():
            default = cls.__dataclass_fields__[name]
            expected = type(default.default_factory() if default.default_factory is not dataclasses.MISSING
                            else default.default) if name != "lab" else str
            if isinstance(value, list) and expected is tuple:
                values[name] = value = tuple(value)
            if not isinstance(value, Mapping if expected is dict else expected):
                raise ValueError(f"{where}: MANIFEST[{name!r}] must be a {expected.__name__}, "
                                 f"not {type(value).__name__}")
        if not LAB_NAME.fullmatch(values.get("lab", "")):
            raise ValueError(f"{where}: MANIFEST['lab'] must be the lab's name (labNN_what, lower case), "
                             f"not {values.get('lab')!r}")
        for mode, kinds in values.get("workloads", {}).items():
            for kind, load in kinds.items():
                if not (isinstance(load, tuple) and len(load) == 3 and isinstance(load[0], str)
                        and all(isinstance(n, int) for n in load[1:])):
                    raise ValueError(f"{where}: MANIFEST workload {mode}/{kind} must be (data, image side, batch), "
                                     f"not {load!r}")
        return cls(**values)
