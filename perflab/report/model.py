"""What a report is drawn from: validated results files, and the questions a report asks of them.

No presentation here: `html` and `figures` turn these plain records into a page.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perflab import results
from perflab.labs import registry

# The labs in course order (their manifests'). A report lists other runs (a `perflab profile` diagnosis)
# first, then the labs in this order, so that "the latest" file holding a section is the most optimised state.
LAB_ORDER = registry.names()

# The labs whose `speedups` rows are a cumulative ablation unless a row says otherwise (a manifest's `ablation`).
ABLATION_LABS = tuple(lab.lab for lab in registry.with_any("ablation"))

# How far a stored speedup may be from the one its raw samples give (float rounding only).
SAMPLES_RTOL = 1e-6

# Machine fields that decide whether two results can be compared at all.
MACHINE_IDENTITY = ("hardware_class", "device_name")


@dataclass(frozen=True)
class LabResults:
    """One validated results file."""

    path: Path
    lab: str
    created: str
    machine: dict[str, Any]
    config: dict[str, Any] | None
    sections: dict[str, Any]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LabResults:
        """Read and validate `path` (ResultsError naming the file and the field otherwise)."""
        doc = results.load(path)
        return cls(Path(path), doc["lab"], doc["created"], doc["machine"], doc.get("config"),
                   doc["sections"])

    @property
    def machine_key(self) -> tuple[str, ...]:
        return tuple(str(self.machine.get(k, "")) for k in MACHINE_IDENTITY)

    @property
    def label(self) -> str:
        return self.lab


def _order(item: LabResults) -> tuple[int, str, str]:
    rank = LAB_ORDER.index(item.lab) if item.lab in LAB_ORDER else -1
    return rank, item.created, item.lab


@dataclass(frozen=True)
class ResultsSet:
    """The results files of one report, in course order."""

    items: tuple[LabResults, ...]

    @classmethod
    def load(cls, paths: Iterable[str | os.PathLike[str]]) -> ResultsSet:
        items = [LabResults.load(p) for p in paths]
        if not items:
            raise ValueError("results: give at least one results JSON file")
        return cls(tuple(sorted(items, key=_order)))

    def having(self, section: str) -> list[LabResults]:
        """The files that hold `section`, in course order."""
        return [item for item in self.items if section in item.sections]

    def latest(self, section: str) -> LabResults | None:
        """The last file in course order that holds `section` (the most optimised state)."""
        found = self.having(section)
        return found[-1] if found else None

    def machines(self) -> list[tuple[tuple[str, ...], list[LabResults]]]:
        """Distinct machines (by hardware class and device name) and the files measured on each."""
        groups: dict[tuple[str, ...], list[LabResults]] = {}
        for item in self.items:
            groups.setdefault(item.machine_key, []).append(item)
        return list(groups.items())

    def mismatched_speedups(self) -> list[tuple[LabResults, dict[str, Any], float]]:
        """Speedup rows whose stored speedup is not what their own raw samples give (an edited file):
        (file, row, the speedup recomputed from the samples)."""
        out = []
        for item in self.having("speedups"):
            for row in item.sections["speedups"]:
                again = results.recompute_speedup(row)
                if again is not None and abs(again[0] - float(row["speedup"])) > SAMPLES_RTOL * again[0]:
                    out.append((item, row, again[0]))
        return out

    @property
    def mixed_machines(self) -> bool:
        return len(self.machines()) > 1

    def machine_tag(self, item: LabResults) -> str:
        """'' on one machine; 'machine A', 'machine B'... when files come from several."""
        if not self.mixed_machines:
            return ""
        keys = [key for key, _ in self.machines()]
        return f"machine {chr(ord('A') + keys.index(item.machine_key))}"


@dataclass(frozen=True)
class Step:
    """One bar of the speedup waterfall: the cumulative speedup after a change, with its CI. `aa` marks
    an A/A row (the baseline timed against itself: the machine's noise floor, never a gain)."""

    name: str
    cumulative: float
    ci: tuple[float, float] | None
    verdict: str | None
    aa: bool = False

    def effect(self, level: float) -> str:
        """What this step did to the level before it: "gain" or "loss" when its CI lies wholly above or
        below that level (or, with no CI, by its value), else "within noise"; an A/A row is always noise."""
        if self.aa:
            return "within noise"
        low, high = self.ci if self.ci is not None else (self.cumulative, self.cumulative)
        if low > level:
            return "gain"
        if high < level:
            return "loss"
        return "within noise"


def waterfall_steps(rows: Sequence[dict[str, Any]]) -> list[Step]:
    """Cumulative ablation rows in order (each measured against the first baseline)."""
    return [Step(r["name"], float(r["speedup"]), tuple(r["ci"]) if r.get("ci") else None,
                 r.get("verdict"), bool(r.get("aa", False))) for r in rows]


def is_cumulative(item: LabResults, row: dict[str, Any]) -> bool:
    return bool(row.get("cumulative", item.lab in ABLATION_LABS))


def numeric_items(mapping: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a mapping (phases may carry notes beside the seconds)."""
    return {k: float(v) for k, v in mapping.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
