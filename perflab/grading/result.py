"""The grading records: what a grade starts from (`Job`, `LabInfo`) and what crosses each process
boundary between a student's notebook and the gradebook, typed, and validated where it is read.

    collect.submissions ──Job──▶ job.prepare_job (with the lab's LabInfo) ──▶ run.run_worker
    worker, in the sandbox ──WorkerReport (JSON on a pipe)──▶ interpret.interpret
        ──SubmissionResult──▶ score.score: the judges add one CellRow per graded cell
        ──(Ray: SubmissionResult as JSON from a worker node)──▶ merge.merge
        ──state.Record──▶ gradebook, feedback, export

Whatever another process sends is untrusted data: `WorkerReport.parse` and
`SubmissionResult.from_json` refuse a malformed document with `ResultError`, naming the field, and
the caller turns that into the submission's failure line. Within a well-formed report, a malformed
event or results file is dropped (it is the student's process that wrote it), never trusted.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perflab.grading.checks import Finding

WORKER_SCHEMA = "perflab.grading.result"
WORKER_VERSION = 2
SUBMISSION_SCHEMA = "perflab.grading.submission"
SUBMISSION_VERSION = 1


@dataclass(frozen=True)
class Job:
    """One submission to grade."""

    student: str
    lab: str
    path: Path  # submitted/<student>/<lab>/<notebook>.ipynb
    sha256: str
    # (lab, results JSON) of this student's graded earlier labs this lab starts from (lab 6 from labs 2-5:
    # `pipeline.with_earlier`), built by the grader from the decisions it graded, laid beside the notebook
    # where the lab reads them at home (`job.prepare_job`).
    earlier: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class LabInfo:
    """What the parent knows of a lab from its source notebook (never sent to the sandbox)."""

    lab: str
    notebook: str  # file name, e.g. lab01_measure.ipynb
    cells: tuple[dict[str, Any], ...]  # [{"grade_id", "max_score", "hidden", "manual"}] in notebook order
    guarded: dict[str, list[str]]  # grade_id -> hidden-test lines (for the leak guard)
    source_folder: Path | None = None  # <course>/source/<lab>/ (a course lab's judges.py lives there)

    @property
    def hidden(self) -> set[str]:
        return set(self.guarded)


class ResultError(ValueError):
    """A result document that does not fit its model; the message names the field."""


def _need(data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], *, optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) and kinds in (int, float, (int, float)) or not isinstance(value, kinds):
        raise ResultError(f"field {key!r}: expected {getattr(kinds, '__name__', kinds)}, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Event:
    """Something that happened to one cell while the notebook ran (a kernel death, a cut output)."""

    cell: int  # 1-based position in the executed notebook
    event: str
    grade_id: str | None = None

    @classmethod
    def read(cls, data: Any) -> Event | None:
        """An event from untrusted data, or None when it is not one."""
        if (isinstance(data, dict) and isinstance(data.get("event"), str) and isinstance(data.get("cell"), int)
                and not isinstance(data.get("cell"), bool)
                and (data.get("grade_id") is None or isinstance(data.get("grade_id"), str))):
            return cls(data["cell"], data["event"], data.get("grade_id"))
        return None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class CellRow:
    """One graded cell's outcome, as the gradebook, feedback and export read it."""

    grade_id: str
    max_score: float
    score: float | None  # None: waits for a person (a written answer)
    needs_manual_grade: bool = False
    error: str | None = None
    verdict: Mapping[str, Any] | None = None  # the cell's verification record, if it re-measured
    flag: str | None = None  # why a person should look at the answer (the judge's evidence)
    decision: Mapping[str, Any] | None = None  # what the cell graded as the student's decision (`Mark.decision`)

    @classmethod
    def for_cell(cls, cell: Mapping[str, Any], score: float | None, *, error: str | None = None,
                 verdict: Mapping[str, Any] | None = None, manual: bool = False,
                 flag: str | None = None, decision: Mapping[str, Any] | None = None) -> CellRow:
        """The row of a lab cell (`LabInfo.cells` entry: grade_id, max_score)."""
        return cls(cell["grade_id"], float(cell["max_score"]), score, manual, error, verdict, flag, decision)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "verdict": dict(self.verdict) if self.verdict is not None else None,
                "decision": dict(self.decision) if self.decision is not None else None}

    @classmethod
    def from_dict(cls, data: Any) -> CellRow:
        if not isinstance(data, dict):
            raise ResultError("a cell row: expected an object")
        score = _need(data, "score", (int, float), optional=True)
        verdict = data.get("verdict")
        if verdict is not None and not isinstance(verdict, dict):
            raise ResultError("field 'verdict': expected an object or null")
        decision = _need(data, "decision", dict, optional=True)
        return cls(_need(data, "grade_id", str), float(_need(data, "max_score", (int, float))),
                   None if score is None else float(score), bool(data.get("needs_manual_grade")),
                   _need(data, "error", str, optional=True), verdict, _need(data, "flag", str, optional=True),
                   decision)


def _document(data: str | bytes, schema: str, version: int) -> dict[str, Any]:
    """The JSON object in `data` of `schema` at `version`, or ResultError saying what it is instead."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise ResultError("not a JSON document") from None
    if not isinstance(doc, dict):
        raise ResultError("top level: expected an object")
    if doc.get("schema") != schema or doc.get("version") != version:
        raise ResultError(f"field 'schema'/'version': expected {schema} {version}, "
                          f"got {doc.get('schema')!r} {doc.get('version')!r}")
    return doc


def _finding(data: Any) -> Finding:
    if not isinstance(data, dict):
        raise ResultError("a finding: expected an object")
    return Finding(_need(data, "cell", str), _need(data, "message", str), bool(data.get("flag")),
                   bool(data.get("fatal")))


def _files(data: Any) -> dict[str, str]:
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}


def _events(data: Any) -> tuple[Event, ...]:
    return tuple(e for e in (Event.read(item) for item in data) if e is not None) if isinstance(data, list) else ()


@dataclass(frozen=True)
class WorkerReport:
    """What the sandboxed worker sends up: the executed notebook and what its probes observed. It
    scores nothing; the parent decides every score from it."""

    notebook: str | None = None  # the executed notebook (nbformat JSON), outputs capped
    observations: dict[str, Any] | None = None  # the probes' merged observations (harness schema)
    events: tuple[Event, ...] = ()
    files: dict[str, str] = field(default_factory=dict)  # results/<lab>.json and its trace
    error: str | None = None  # set when the notebook could not be run at all
    trace: str | None = None  # the worker's own traceback, for the instructor's log only
    # Set (with `error`) when the grading machine, not the submission, kept the notebook from running
    # as graded: the device the job is graded for could not start in the sandbox.
    machine_fault: bool = False

    def to_json(self) -> bytes:
        doc = {"schema": WORKER_SCHEMA, "version": WORKER_VERSION, "notebook": self.notebook,
               "observations": self.observations, "events": [e.to_dict() for e in self.events],
               "files": self.files, "error": self.error, "trace": self.trace, "machine_fault": self.machine_fault}
        return json.dumps(doc).encode("utf-8")

    @classmethod
    def parse(cls, data: bytes) -> WorkerReport:
        """The report in `data`, or ResultError: not JSON, not an object, another schema or version,
        or an error that is not text. A notebook that is not text and observations that are not an
        object count as absent (the judges then find nothing to credit)."""
        doc = _document(data, WORKER_SCHEMA, WORKER_VERSION)
        notebook, observations = doc.get("notebook"), doc.get("observations")
        return cls(notebook if isinstance(notebook, str) else None,
                   observations if isinstance(observations, dict) else None,
                   _events(doc.get("events")), _files(doc.get("files")),
                   _need(doc, "error", str, optional=True), _need(doc, "trace", str, optional=True),
                   doc.get("machine_fault") is True)


@dataclass(frozen=True)
class SubmissionResult:
    """One submission's result, from the sandbox's report and the judges' rows to the merge."""

    cells: tuple[CellRow, ...] = ()
    error: str | None = None  # why nothing could be graded (every cell then scores 0 with it)
    notebook: str | None = None
    observations: dict[str, Any] | None = None
    events: tuple[Event, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    wall_s: float = 0.0
    isolation: str = ""
    sandbox_notes: tuple[str, ...] = ()
    seed: int | None = None
    hardware_class: str | None = None  # the machine that re-measured (set by a Ray worker)
    # The grading machine's fault, not the submission's (`WorkerReport.machine_fault`): never merged as a
    # score; the submission stays to be graded once the machine is fixed.
    machine_fault: bool = False

    @classmethod
    def failure(cls, cells: Iterable[Mapping[str, Any]], reason: str, **fields: Any) -> SubmissionResult:
        """The result of a submission that produced none: every cell 0, with the reason."""
        return cls(cells=tuple(CellRow.for_cell(c, 0.0, error=reason) for c in cells), error=reason, **fields)

    def replace(self, **changes: Any) -> SubmissionResult:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        doc = {"schema": SUBMISSION_SCHEMA, "version": SUBMISSION_VERSION,
               **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}
        doc.update(cells=[c.to_dict() for c in self.cells], events=[e.to_dict() for e in self.events],
                   findings=[f.to_dict() for f in self.findings], sandbox_notes=list(self.sandbox_notes))
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> SubmissionResult:
        """The result a Ray worker sent, or ResultError naming what does not fit."""
        doc = _document(text, SUBMISSION_SCHEMA, SUBMISSION_VERSION)
        for key in ("cells", "events", "findings", "sandbox_notes"):
            _need(doc, key, list)
        notes = doc["sandbox_notes"]
        if not all(isinstance(n, str) for n in notes):
            raise ResultError("field 'sandbox_notes': expected text lines")
        observations = doc.get("observations")
        seed = _need(doc, "seed", int, optional=True)
        return cls(cells=tuple(CellRow.from_dict(c) for c in doc["cells"]),
                   error=_need(doc, "error", str, optional=True),
                   notebook=_need(doc, "notebook", str, optional=True),
                   observations=observations if isinstance(observations, dict) else None,
                   events=_events(doc["events"]), files=_files(doc.get("files")),
                   findings=tuple(_finding(f) for f in doc["findings"]),
                   wall_s=float(_need(doc, "wall_s", (int, float))), isolation=_need(doc, "isolation", str),
                   sandbox_notes=tuple(notes), seed=seed,
                   hardware_class=_need(doc, "hardware_class", str, optional=True),
                   machine_fault=doc.get("machine_fault") is True)


def failure_result(info: LabInfo, reason: str, **fields: Any) -> SubmissionResult:
    """The result of a submission that produced none: every cell 0, with the reason."""
    return SubmissionResult.failure(info.cells, reason, **fields)
