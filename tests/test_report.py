"""The optimization report: sections, missing data, bad input, mixed machines, single file, class report."""

from __future__ import annotations

import base64
import csv
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from perflab import report, results
from perflab.cli import main
from perflab.report import classreport, markdown
from perflab.report.html import PHASE_ORDER, SECTIONS

FIXTURES = Path(__file__).parent / "fixtures" / "results"
ALL = sorted(FIXTURES.glob("*.json"))
LABS = ("lab01_measure", "lab02_feed", "lab03_amp", "lab04_memory", "lab05_compile", "lab06_together")
# "A few MB" for all six labs: well under what a mail or an LMS upload accepts.
MAX_REPORT_BYTES = 3_000_000


class _Ids(HTMLParser):
    """Collects element ids, and every src/href, from a page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[str, str] = {}
        self.links: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids[value] = tag
            if name in ("src", "href") and value is not None:
                self.links.append((tag, name, value))


def parse(page: str) -> _Ids:
    p = _Ids()
    p.feed(page)
    return p


def section_text(page: str, sid: str) -> str:
    match = re.search(rf'<section id="{sid}">(.*?)</section>', page, re.S)
    assert match, f"section {sid} missing"
    return match.group(1)


@pytest.fixture(scope="module")
def full() -> report.Report:
    return report.build_report(ALL)


def test_fixture_set_is_complete_and_valid():
    labs = {results.load(p)["lab"] for p in ALL}
    assert set(LABS) <= labs and "profile" in labs


def test_full_report_has_every_section_measured(full):
    ids = parse(full.html).ids
    for sid, _title, _hint in SECTIONS:
        assert ids.get(sid) == "section", sid
        assert report.NOT_MEASURED not in section_text(full.html, sid), sid
    assert set(full.figures) == {"speedup-waterfall", "speedups-single", "phases", "memory",
                                 "roofline", "mfu"}
    assert "mixed-machines" not in ids and not full.warnings


def test_full_report_shows_the_numbers_it_was_given(full):
    page = full.html
    assert "612 img/s" in section_text(page, "baseline")
    assert "8.61×" in section_text(page, "speedups") and "8.33–8.88×" in section_text(page, "speedups")
    assert "NVIDIA H100 80GB HBM3" in section_text(page, "machine")
    assert "cudnn.benchmark" in section_text(page, "machine")
    assert "aten::convolution_backward" in section_text(page, "top-ops")
    verification = section_text(page, "verification")
    assert "inconclusive" in verification and "✗ fail" in verification
    mfu = section_text(page, "mfu")
    assert "5.9%" in mfu  # lab06: 256 img x 10.92 GFLOP / 47.9 ms over 989 TFLOP/s


def test_figures_are_real_pngs(full):
    for name, data in full.figures.items():
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), name
        assert 10_000 < len(data) < 400_000, name
        assert base64.b64encode(data).decode() in full.html


def test_single_self_contained_file_under_size(full):
    page = full.html
    assert 'src="http' not in page and "<link" not in page and "<script" not in page
    assert "@import" not in page and "url(" not in page
    for tag, attr, value in parse(page).links:
        if attr == "src":
            assert value.startswith("data:image/png;base64,"), (tag, value[:40])
    assert len(page.encode()) < MAX_REPORT_BYTES


def test_profile_run_alone(tmp_path):
    """A `perflab profile --json` run: per-sample counts, CPU and device op times, a measured peak."""
    page = report.build_report([FIXTURES / "profile.json"]).html
    baseline = section_text(page, "baseline")
    assert "3.64 GFLOP forward per sample" in baseline and "(batch 256)" in baseline
    assert "more DataLoader workers" in baseline  # the diagnosis' next step
    top = section_text(page, "top-ops")
    assert "device self" in top and "CPU self" in top and "20.3 ms" in top
    memory = section_text(page, "memory")
    assert "measured peak (cuda allocator)" in memory and "11.09 GiB" in memory
    assert report.NOT_MEASURED in memory  # no memory-vs-batch sweep, only the budget
    assert "bf16, table" in section_text(page, "roofline")


def test_missing_data_says_not_measured(tmp_path):
    path = results.save(tmp_path / "lab03_amp.json", "lab03_amp",
                        {"speedups": [{"name": "bf16", "speedup": 1.4, "ci": [1.3, 1.5]}]},
                        machine=results.load(ALL[0])["machine"])
    rendered = report.build_report([path])
    page = rendered.html
    for sid in ("baseline", "phases", "memory", "roofline", "top-ops", "mfu", "verification", "analysis"):
        assert report.NOT_MEASURED in section_text(page, sid), sid
    speedups = section_text(page, "speedups")
    assert "Cumulative waterfall not measured" in speedups and "1.40×" in speedups
    assert set(rendered.figures) == {"speedups-single"}


def test_empty_sections_render(tmp_path):
    path = results.save(tmp_path / "x.json", "lab01_measure", {},
                        machine=results.load(ALL[0])["machine"])
    page = report.build_report([path]).html
    assert all(parse(page).ids.get(sid) == "section" for sid in report.SECTION_IDS)
    assert page.count(report.NOT_MEASURED) == len(report.SECTION_IDS) - 1  # machine is always known


def _write(tmp_path: Path, doc: dict, name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d.update(version=99), "version"),
    (lambda d: d.update(schema="other"), "schema"),
    (lambda d: d["sections"]["baseline"]["throughput"].update(median="fast"), "sections.baseline.throughput.median"),
    (lambda d: d["sections"]["speedups"][2].pop("speedup"), "sections.speedups[2].speedup"),
    (lambda d: d["sections"]["speedups"][0].update(ci=[2.0, 1.0]), "sections.speedups[0].ci"),
    (lambda d: d["sections"]["mfu"].update(peak_flops=0), "sections.mfu.peak_flops"),
    (lambda d: d["machine"].pop("hardware_class"), "machine.hardware_class"),
])
def test_malformed_file_names_file_and_field(tmp_path, mutate, field):
    doc = json.loads((FIXTURES / "lab06_together.json").read_text())
    mutate(doc)
    bad = _write(tmp_path, doc)
    with pytest.raises(results.ResultsError) as err:
        report.build_report([ALL[0], bad])
    message = str(err.value)
    assert str(bad) in message and field in message and "\n" not in message


def test_cli_bad_file_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "broken.json"
    bad.write_text('{"schema": "perflab.results", "version": 1,')
    assert main(["report", str(bad), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "broken.json" in err and "not valid JSON" in err
    assert not (tmp_path / "r.html").exists()


def test_mixed_machines_are_flagged(tmp_path):
    doc = json.loads((FIXTURES / "lab03_amp.json").read_text())
    doc["machine"].update(device="cpu", device_name="AMD EPYC", hardware_class="cpu-bf16",
                          gpu_memory_bytes=None, cuda=None, cudnn=None)
    other = _write(tmp_path, doc, "lab03_amp.json")
    files = [p for p in ALL if p.name != "lab03_amp.json"] + [other]
    rendered = report.build_report(files)
    ids = parse(rendered.html).ids
    assert ids.get("mixed-machines") == "div"
    banner = re.search(r'<div class="banner" id="mixed-machines".*?</div>', rendered.html, re.S).group(0)
    assert "AMD EPYC" in banner and "NVIDIA H100" in banner and "lab03_amp" in banner
    assert rendered.warnings and "2 different machines" in rendered.warnings[0]
    assert "lab03_amp (machine B)" in section_text(rendered.html, "speedups")
    assert "machine A" in section_text(rendered.html, "machine")


def test_a_speedup_edited_after_it_was_measured_is_flagged(tmp_path):
    from perflab.timing import Comparison

    comparison = Comparison((0.30, 0.31, 0.29, 0.32), (0.20, 0.22, 0.21, 0.20), 4)
    machine = results.load(ALL[0])["machine"]
    honest = results.save(tmp_path / "lab03_amp.json", "lab03_amp",
                          {"speedups": [comparison.as_speedup("bf16")]}, machine=machine)
    assert not report.build_report([honest]).warnings
    doc = json.loads(honest.read_text())
    doc["sections"]["speedups"][0]["speedup"] = 9.0
    edited = _write(tmp_path, doc, "edited.json")
    rendered = report.build_report([edited])
    assert rendered.warnings == (f"lab03_amp: the speedup 'bf16' says 9.00x, but its own raw samples give "
                                 f"{comparison.speedup:.2f}x; the file was edited after it was measured.",)
    assert "does not match its measurements" in rendered.html


def test_analysis_is_escaped_markdown(full):
    analysis = section_text(full.html, "analysis")
    assert "<script>" not in analysis and "&lt;script&gt;" in analysis
    assert "<strong>74%</strong>" in analysis and "<ol>" in analysis and "<blockquote>" in analysis


@pytest.mark.parametrize(("text", "expected"), [
    ("**bold** and *it* and `x<y`", "<p><strong>bold</strong> and <em>it</em> and <code>x&lt;y</code></p>"),
    ("# Title", "<h3>Title</h3>"),
    ("- a\n- b", "<ul><li>a</li><li>b</li></ul>"),
    ("```\n<b>\n```", "<pre><code>&lt;b&gt;</code></pre>"),
    ('[x](javascript:alert(1)) <img src=x onerror="y">',
     "<p>[x](javascript:alert(1)) &lt;img src=x onerror=&quot;y&quot;&gt;</p>"),
    ("[docs](https://pytorch.org/docs)", '<p><a href="https://pytorch.org/docs" rel="noopener noreferrer">docs</a></p>'),
    ("a snake_case_name stays", "<p>a snake_case_name stays</p>"),
])
def test_markdown_subset(text, expected):
    assert markdown.to_html(text) == expected


def test_cli_writes_html_and_pngs(tmp_path, capsys):
    out, pngs = tmp_path / "out" / "report.html", tmp_path / "figs"
    assert main(["report", *map(str, ALL), "-o", str(out), "--png-dir", str(pngs), "--title", "Ada's term"]) == 0
    assert "wrote" in capsys.readouterr().out
    page = out.read_text()
    assert "<title>Ada&#x27;s term</title>" in page
    names = sorted(p.stem for p in pngs.glob("*.png"))
    assert names == sorted(["speedup-waterfall", "speedups-single", "phases", "memory", "roofline", "mfu"])
    assert all((pngs / f"{n}.png").read_bytes().startswith(b"\x89PNG") for n in names)


def test_cli_needs_input(tmp_path, capsys):
    assert main(["report", "-o", str(tmp_path / "r.html")]) == 2
    assert "give results JSON files" in capsys.readouterr().err


def test_phase_order_matches_phases_module():
    from perflab.phases import PHASES

    assert PHASE_ORDER == PHASES


def test_fixtures_regenerate_identically(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_results", FIXTURES.parent / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUT", tmp_path)
    module.main()
    for path in ALL:
        assert (tmp_path / path.name).read_text() == path.read_text(), path.name


# ---------------------------------------------------------------- class report

def class_rows() -> list[dict]:
    rows = []
    for n in range(12):
        for lab, base in (("lab02_feed", 3.6), ("lab03_amp", 1.7), ("lab05_compile", 1.15)):
            hw = "cuda-nvidia-h100-80gb-hbm3" if n < 8 else "cuda-nvidia-a100-sxm4-40gb"
            verdict = "inconclusive" if n == 3 else ("fail" if n == 5 and lab == "lab05_compile" else "pass")
            rows.append({"student": f"s{n:02d}", "lab": lab, "score": 60 + 3 * n, "max_score": 100,
                         "verdict": verdict, "speedup": round(base * (0.8 + 0.04 * n), 3),
                         "hardware_class": hw, "flagged": "true" if n == 7 else "false"})
    rows.append({"student": "s99", "lab": "lab01_measure", "score": "", "max_score": 100, "verdict": "",
                 "speedup": "", "hardware_class": "cpu", "flagged": ""})
    return rows


def write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=classreport.COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_class_report_from_csv(tmp_path):
    rendered = report.build_class_report(write_csv(tmp_path / "class.csv", class_rows()))
    ids = parse(rendered.html).ids
    for sid in classreport.CLASS_SECTION_IDS:
        assert ids.get(sid) == "section", sid
    assert ids.get("mixed-hardware") == "div"
    assert set(rendered.figures) == {"class-speedups-cuda-nvidia-h100-80gb-hbm3",
                                     "class-speedups-cuda-nvidia-a100-sxm4-40gb", "class-scores"}
    review = section_text(rendered.html, "class-review")
    assert "s03" in review and "s07" in review and "s05" not in review  # inconclusive, flagged; a fail is not
    assert "not graded" in section_text(rendered.html, "class-students")
    summary = section_text(rendered.html, "class-summary")
    assert "<b>13</b><span>students" in summary


def test_class_report_from_json_equals_csv(tmp_path):
    rows = class_rows()
    csv_export = classreport.load_export(write_csv(tmp_path / "c.csv", rows))
    doc = {"schema": classreport.EXPORT_SCHEMA, "version": 1, "rows": rows}
    json_export = classreport.load_export(_write(tmp_path, doc, "c.json"))
    assert csv_export.rows == json_export.rows


def test_class_report_from_results_directory(tmp_path):
    for student, files in (("ada", ALL), ("bob", [FIXTURES / "lab04_memory.json"])):
        (tmp_path / student).mkdir()
        for f in files:
            shutil.copy(f, tmp_path / student / f.name)
    export = classreport.load_export(tmp_path)
    by = {(r.student, r.lab): r for r in export.rows}
    assert by[("bob", "lab04_memory")].verdict == "inconclusive" and by[("bob", "lab04_memory")].flagged
    assert by[("ada", "lab05_compile")].verdict == "fail"
    assert by[("ada", "lab06_together")].speedup == 8.55
    page = report.render_class(export).html
    assert "not measured" in section_text(page, "class-scores")


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda r: r[0].update(score="lots"), "line 2, field 'score'"),
    (lambda r: r[1].update(verdict="maybe"), "line 3, field 'verdict'"),
    (lambda r: r[2].update(flagged="perhaps"), "line 4, field 'flagged'"),
    (lambda r: r[0].update(hardware_class=""), "line 2, field 'hardware_class'"),
])
def test_class_export_errors_name_line_and_field(tmp_path, edit, needle):
    rows = class_rows()
    edit(rows)
    path = write_csv(tmp_path / "class.csv", rows)
    with pytest.raises(ValueError, match=re.escape(needle)) as err:
        classreport.load_export(path)
    assert str(path) in str(err.value)


def grader_cells() -> list[dict]:
    """Rows as `perflab grade export` writes them: one per graded cell."""
    rows = []
    for n in range(4):
        hw = "cuda-nvidia-h100-80gb-hbm3"
        rows += [
            {"student": f"s{n}", "lab": "lab03_amp", "cell": "amp_dtype", "score": 10, "max_score": 10,
             "verdict": "", "speedup": "", "hardware_class": "", "flagged": int(n == 2), "error": ""},
            {"student": f"s{n}", "lab": "lab03_amp", "cell": "speedup", "score": 30 if n != 1 else 0,
             "max_score": 30, "verdict": "fail" if n == 1 else "pass", "speedup": 1.5 + 0.1 * n,
             "hardware_class": hw, "flagged": int(n == 2), "error": ""},
            {"student": f"s{n}", "lab": "lab03_amp", "cell": "analysis", "score": "", "max_score": 20,
             "verdict": "", "speedup": "", "hardware_class": "", "flagged": int(n == 2), "error": ""},
        ]
    return rows


def test_class_report_reads_the_grader_export(tmp_path):
    from perflab.grading.export import COLUMNS as GRADER_COLUMNS

    rows = grader_cells()
    path = tmp_path / "grades.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=GRADER_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    export = classreport.load_export(path)
    by = {r.student: r for r in export.rows}
    assert len(export.rows) == 4  # cells merged into one submission each
    assert (by["s0"].score, by["s0"].max_score, by["s0"].verdict) == (40, 60, "pass")
    assert by["s1"].verdict == "fail" and by["s2"].flagged and not by["s0"].flagged
    assert by["s3"].hardware_class == "cuda-nvidia-h100-80gb-hbm3" and by["s3"].speedup == 1.8
    doc = {"schema": "perflab.grades", "version": 1, "columns": list(GRADER_COLUMNS), "rows": rows}
    assert classreport.load_export(_write(tmp_path, doc, "grades.json")).rows == export.rows
    assert "s2" in section_text(report.render_class(export).html, "class-review")


def test_class_export_missing_column(tmp_path):
    path = tmp_path / "class.csv"
    path.write_text("student,lab,score\na,lab01_measure,3\n")
    with pytest.raises(ValueError, match="column 'max_score' missing"):
        classreport.load_export(path)


def test_cli_class_report(tmp_path, capsys):
    src = write_csv(tmp_path / "class.csv", class_rows())
    out = tmp_path / "class.html"
    assert main(["report", "--class", str(src), "-o", str(out), "--png-dir", str(tmp_path / "png")]) == 0
    assert "graded on 3 hardware classes" in capsys.readouterr().out
    assert out.stat().st_size < MAX_REPORT_BYTES and len(list((tmp_path / "png").glob("*.png"))) == 3


def test_an_a_a_ablation_is_never_drawn_as_a_gain(tmp_path):
    """The lazy student's "nothing kept" row (the baseline against a copy of itself) and any step whose CI
    holds the level before it are drawn as noise, in the waterfall and its table; only a CI wholly above
    the level is a gain."""
    from perflab.report import figures
    from perflab.report.model import Step, waterfall_steps

    aa = waterfall_steps([{"name": "nothing kept (A/A)", "speedup": 1.07, "ci": [1.05, 1.09], "aa": True}])
    assert aa[0].effect(1.0) == "within noise"
    assert Step("x", 1.07, (0.98, 1.10), None).effect(1.0) == "within noise"
    assert Step("x", 1.07, (1.02, 1.10), None).effect(1.0) == "gain"
    assert Step("x", 0.90, (0.85, 0.95), None).effect(1.0) == "loss"
    assert Step("x", 1.30, (1.25, 1.35), None).effect(1.4) == "loss"
    fig = figures.waterfall(aa)
    bars = [c.get_label() for c in fig.axes[0].containers if c.get_label() in figures.WATERFALL_STYLE]
    assert bars == ["within noise"]
    machine = results.load(ALL[0])["machine"]
    path = results.save(tmp_path / "lab06_together.json", "lab06_together",
                        {"speedups": [{"name": "nothing kept (A/A)", "speedup": 1.07, "ci": [1.05, 1.09],
                                       "cumulative": True, "aa": True}]}, machine=machine)
    speedups = section_text(report.build_report([path]).html, "speedups")
    assert "A/A: the noise floor" in speedups and "gain" not in speedups.replace("gain)", "")


def test_a_profile_with_its_ceiling_and_augment_phase_renders_both(tmp_path):
    """The share of the ceiling in the baseline section; the augment phase in the breakdown; and an older
    file, whose h2d holds the augmentation on the device, says so."""
    throughput = {"median": 6726.0, "ci": [6600.0, 6800.0], "unit": "samples/s", "statistic": "samples over wall time",
                  "samples": [0.019, 0.019]}
    ceiling = {"median": 12092.0, "ci": [12000.0, 12150.0], "unit": "samples/s",
               "statistic": "samples over wall time", "samples": [0.0106, 0.0106]}
    config = {"gpu_augment": True, "data_on_device": True, "batch_size": 128}
    new = results.save(tmp_path / "profile.json", "profile", {
        "baseline": {"throughput": throughput},
        "phases": {"before": {"data": 0.00014, "h2d": 0.0, "augment": 0.0076, "forward": 0.00493,
                              "backward": 0.00778, "optimizer": 0.0006}},
        "ceiling": {"throughput": ceiling, "share": 6726.0 / 12092.0}}, config=config)
    old = results.save(tmp_path / "older.json", "older", {
        "phases": {"before": {"data": 0.00014, "h2d": 0.0076, "forward": 0.00493, "backward": 0.00778,
                              "optimizer": 0.0006}}}, config=config)
    page = report.build_report([new, old]).html
    baseline = section_text(page, "baseline")
    assert "56%" in baseline and "of the ceiling" in baseline
    phases = section_text(page, "phases")
    assert "<td>augment</td>" in phases
    assert "older: written before the augmentation on the device was timed" in phases
    assert "profile: written before" not in phases
