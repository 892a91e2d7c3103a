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
        ("counts", {"parameters": "lots"}, "sections.counts.parameters"),
        ("baseline", {"throughput": "fast"}, "sections.baseline.throughput"),
        ("accuracy", {"baseline": 0.5, "final": True}, "sections.accuracy.final"),
        ("mfu", {"achieved_flops_per_s": 1e9, "peak_flops": 0}, "sections.mfu.peak_flops"),
        ("verification", [{"name": "amp", "verdict": "pass", "ci": [0.9]}], "sections.verification[0].ci"),
        ("speedups", [{"name": "amp", "speedup": 1.2, "samples": {"baseline_s": [1.0, 1.1]}}],
         "sections.speedups[0].samples.candidate_s"),
        ("mystery", {"anything": 1}, "sections.mystery"),
    ],
)
def test_bad_sections_name_the_field(section: str, value: object, field: str) -> None:
    with pytest.raises(ResultsError, match=field.replace("[", r"\[").replace("]", r"\]")):
        results.make("lab01_measure", {section: value})


def test_non_finite_numbers_are_refused() -> None:
    with pytest.raises(ResultsError, match="finite"):
        results.make("lab01_measure", {"counts": {"parameters": float("nan")}})


def test_an_unknown_section_says_which_sections_exist() -> None:
    with pytest.raises(ResultsError, match=r"'sections.riddle': not a section perflab knows \(ablation, .*speedups"):
        results.make("lab01_measure", {"riddle": 1})


def test_the_schema_is_a_valid_json_schema_and_ships_with_the_package() -> None:
    import jsonschema

    schema = json.loads(results.SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert results.SCHEMA_FILE.is_relative_to(Path(results.__file__).parent)
    assert schema["properties"]["version"]["enum"] == list(results.READS)


def test_a_version_1_file_stays_readable(tmp_path: Path) -> None:
    path = results.save(tmp_path / "old.json", "lab01_measure", _sections())
    doc = json.loads(path.read_text())
    doc["version"] = 1
    path.write_text(json.dumps(doc))
    assert results.load(path)["sections"]["speedups"][0]["speedup"] == 1.4


def test_raw_samples_are_kept_and_recompute_every_derived_number() -> None:
    """A speedup row and a STAT carry the raw times they were derived from; recomputing from the
    saved file gives the same speedup, CI and median."""
    from perflab.timing import Comparison, Measurement

    comparison = Comparison((0.30, 0.31, 0.29, 0.32, 0.30, 0.33), (0.20, 0.22, 0.21, 0.20, 0.23, 0.21), 4)
    measured = Measurement((0.010, 0.012, 0.011, 0.013, 0.009))
    doc = json.loads(json.dumps(results.make("lab03_amp", {
        "speedups": [comparison.as_speedup("bf16")], "baseline": {"step_time": measured.as_stat()}})))
    row = doc["sections"]["speedups"][0]
    speedup, (low, high) = results.recompute_speedup(row)
    assert speedup == pytest.approx(row["speedup"]) and [low, high] == pytest.approx(row["ci"])
    assert row["samples"]["baseline_s"] == list(comparison.a_times)
    stat = doc["sections"]["baseline"]["step_time"]
    assert Measurement(tuple(stat["samples"])).median == stat["median"]
    assert results.recompute_speedup({"name": "typed", "speedup": 2.0}) is None  # no samples: nothing to redo
