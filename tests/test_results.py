from __future__ import annotations

import json
from pathlib import Path

import pytest

from perflab import results
from perflab.results import ResultsError
from perflab.workload import TrainConfig


def _sections() -> dict:
    return {
        "counts": {"parameters": 11_689_512, "flops_forward": 3_628_146_688},
        "baseline": {"throughput": {"median": 120.5, "ci": [118.0, 123.0], "unit": "samples/s"}},
        "speedups": [{"name": "amp", "speedup": 1.4, "ci": [1.3, 1.5], "verdict": "pass"}],
        "analysis": "The data loader was the bottleneck.",
    }


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    path = results.save(tmp_path / "r" / "lab01.json", "lab01_measure", _sections(), config=TrainConfig())
    doc = results.load(path)
    assert doc["lab"] == "lab01_measure"
    assert doc["version"] == results.VERSION
    assert doc["config"]["batch_size"] == TrainConfig().batch_size
    assert doc["sections"]["speedups"][0]["ci"] == [1.3, 1.5]
    assert not list(tmp_path.rglob("*.tmp")), "atomic write left a temporary file"


def test_wrong_version_names_file_and_field(tmp_path: Path) -> None:
    path = results.save(tmp_path / "a.json", "lab01_measure", _sections())
    doc = json.loads(path.read_text())
    doc["version"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=r"a\.json: field 'version'"):
        results.load(path)


def test_malformed_json_names_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ResultsError, match=r"bad\.json: not valid JSON"):
        results.load(path)


@pytest.mark.parametrize(
    ("section", "value", "field"),
    [
        ("speedups", [{"name": "amp"}], "sections.speedups[0].speedup"),
        ("speedups", [{"name": "amp", "speedup": 1.2, "ci": [2.0, 1.0]}], "sections.speedups[0].ci"),
        ("baseline", {"throughput": {"median": "fast"}}, "sections.baseline.throughput.median"),
        ("analysis", 42, "sections.analysis"),
        ("roofline", {"peak_flops": 1e12, "peak_bandwidth": 1e11, "layers": [{"name": "conv1"}]},
         "sections.roofline.layers[0].flops"),
    ],
)
def test_bad_sections_name_the_field(section: str, value: object, field: str) -> None:
    with pytest.raises(ResultsError, match=field.replace("[", r"\[").replace("]", r"\]")):
        results.make("lab01_measure", {section: value})


def test_non_finite_numbers_are_refused() -> None:
    with pytest.raises(ResultsError, match="finite"):
        results.make("lab01_measure", {"counts": {"parameters": float("nan")}})
