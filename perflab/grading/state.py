"""What has been graded: one record per (student, lab), keyed by the submission's content hash.

The state file (`<course>/.perflab/state.json`) is what makes grading idempotent and resumable:
a submission whose hash matches a finished record is not graded again, a run stopped half-way
finds every finished record on disk (each merge rewrites the file atomically), and a crash,
timeout or unreadable notebook is recorded like any other outcome (a score and a reason), so
nothing is lost. Only the process holding `lock(course)` writes it, and the gradebook.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_VERSION = 1
OUTCOMES = ("graded", "failed")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class BusyError(ValueError):
    """Another grading run holds the course folder."""


@dataclass(frozen=True)
class CellResult:
    grade_id: str
    score: float | None  # None: waits for a person (a written answer)
    max_score: float
    needs_manual_grade: bool = False
    error: str | None = None
    verdict: str | None = None  # pass | fail | inconclusive, from the cell's verification record
    speedup: float | None = None
    claimed: float | None = None
    hardware_class: str | None = None
    code: str | None = None  # the verifier's named reason for `verdict` ("clears_bar", "below_bar", "no_change", ...)
    # What the cell graded as the student's decision (`marks.Mark.decision`): what a later lab starts from.
    decision: dict[str, Any] | None = None


@dataclass(frozen=True)
class Record:
    """The outcome of grading one submission."""

    student: str
    lab: str
    sha256: str
    outcome: str  # graded | failed (no notebook could be run: every cell scored 0, with the reason)
    cells: tuple[CellResult, ...]
    notes: tuple[str, ...] = ()  # lines for the student's feedback
    flagged: bool = False
    flags: tuple[str, ...] = ()
    error: str | None = None
    backend: str = "local"
    wall_s: float = 0.0
    graded_at: str = ""
    merges: int = 1  # how many times a result for this very content was merged (always 1)
    isolation: str = ""
    # The lab's expectations entries its re-measured cells were held to the conservative rule for, no bar
    # being calibrated on the grading machine (`perflab grade grade --no-calibration`, or a calibration
    # that measured nothing); empty where every bar was calibrated, or the lab has none.
    uncalibrated: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.lab}/{self.student}"

    @property
    def score(self) -> float:
        return sum(c.score or 0.0 for c in self.cells)

    @property
    def max_score(self) -> float:
        return sum(c.max_score for c in self.cells)

    @property
    def inconclusive(self) -> bool:
        return any(c.verdict == "inconclusive" for c in self.cells)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        data = dict(data)
        data["cells"] = tuple(CellResult(**c) for c in data.get("cells", ()))
        for name in ("notes", "flags", "uncalibrated"):
            data[name] = tuple(data.get(name, ()))
        return cls(**data)


@dataclass
class State:
    """All records of one course folder, loaded from and saved to its state file."""

    path: Path
    records: dict[str, Record] = field(default_factory=dict)

    @classmethod
    def load(cls, course: Path) -> State:
        path = Path(course) / ".perflab" / "state.json"
        if not path.is_file():
            return cls(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            records = {key: Record.from_dict(value) for key, value in doc["records"].items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: the grading state is unreadable ({exc}); move it aside and "
                             "re-run `perflab grade grade` (every submission is graded again)") from exc
        return cls(path, records)

    def get(self, lab: str, student: str) -> Record | None:
        return self.records.get(f"{lab}/{student}")

    def done(self, lab: str, student: str, digest: str) -> bool:
        record = self.get(lab, student)
        return record is not None and record.sha256 == digest

    def put(self, record: Record) -> None:
        """Store a record and write the whole state to disk atomically."""
        self.records[record.key] = record
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"version": STATE_VERSION,
               "records": {key: rec.to_dict() for key, rec in sorted(self.records.items())}}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(doc, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)


@contextlib.contextmanager
def lock(course: Path) -> Iterator[None]:
    """Hold the course's writer lock: one grading run writes the gradebook and the state at a time."""
    path = Path(course) / ".perflab" / "writer.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BusyError(f"{Path(course)}: another `perflab grade` run is writing this course "
                               "folder; wait for it to finish") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
