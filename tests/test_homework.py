"""What a notebook measured at home is carried in its outputs and replayed when graded (perflab.labs.homework):
grading runs the notebook's decisions as they ran at home without timing them again."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from perflab.labs import homework, lab06
from perflab.labs.lab03 import figures as lab03_figures
from perflab.labs.lab06 import measure as lab06_measure
from perflab.timing import Comparison

pytestmark = pytest.mark.usefixtures("fresh_homework")


@pytest.fixture
def fresh_homework(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERFLAB_MODE", "tiny")
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("PERFLAB_GRADER_REMEASURES", raising=False)
    homework.reset()
    yield
    homework.reset()


def _grading_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setenv("PERFLAB_GRADER_REMEASURES", "1")
    homework.reset()


def _fake_blocks(monkeypatch: pytest.MonkeyPatch, step_s: dict) -> list:
    """lab06's timer replaced by fixed step times per configuration: the calls it got, in order."""
    calls: list = []

    def fake(configs, rounds, block_steps, warmup, desc):
        calls.append((list(configs), rounds))
        return [[step_s(c) * (1 + 0.01 * (r % 3)) for r in range(rounds)] for c in configs], "cpu"

    monkeypatch.setattr(lab06_measure, "_timed_blocks", fake)
    return calls


def test_a_screening_measured_at_home_is_replayed_when_graded_and_not_timed_again(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = lab06.baseline_config("tiny")
    bf16 = base.replace(amp_dtype="bf16")
    calls = _fake_blocks(monkeypatch, lambda c: 0.005 if c.amp_dtype else 0.010)
    at_home = lab06_measure.screen(base, bf16, lab06.sizes("tiny"))
    assert len(calls) == 1 and homework.RECORDED[0]["kind"] == "lab06.screen"
    homework.write_file(list(homework.RECORDED), tmp_path)

    _grading_kernel(monkeypatch)
    graded = lab06_measure.screen(base, bf16, lab06.sizes("tiny"))
    assert len(calls) == 1, "a recorded screening is not timed again"
    assert graded == at_home and graded.speedup == pytest.approx(2.0, rel=0.02)
    assert "replayed from your home run" in capsys.readouterr().out
    assert homework.EVENTS == [{"kind": "lab06.screen", "key": {"changes": ["precision"]}, "event": "replayed"}]


def test_a_measurement_the_notebook_does_not_carry_runs_at_the_smallest_budget_and_says_so(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    base = lab06.baseline_config("tiny")
    calls = _fake_blocks(monkeypatch, lambda c: 0.010)
    _grading_kernel(monkeypatch)
    comparison = lab06_measure.screen(base, base.replace(channels_last=True), lab06.sizes("tiny"))
    assert calls[0][1] == homework.QUICK_BLOCKS and comparison.blocks == homework.QUICK_BLOCKS
    out = capsys.readouterr().out
    assert "carries no home measurement" in out and "rests on no measurement" in out
    assert homework.EVENTS[-1]["event"] == "quick"


def test_a_record_is_matched_by_what_changes_not_by_this_machines_values(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Workers = 4 on the student's laptop and 1 with pinned memory on the grader are one change; bf16 is
    another; each record is used once, in the order the calls come."""
    base = lab06.baseline_config("tiny")
    calls = _fake_blocks(monkeypatch, lambda c: 0.004 if c.num_workers else 0.010)
    s = lab06.sizes("tiny")
    first = lab06_measure.screen(base, base.replace(num_workers=4, persistent_workers=True), s)
    homework.write_file(list(homework.RECORDED), tmp_path)
    _grading_kernel(monkeypatch)
    grader_loader = base.replace(num_workers=1, persistent_workers=True, pin_memory=True)
    assert lab06_measure.screen(base, grader_loader, s) == first
    assert len(calls) == 1
    lab06_measure.screen(base, grader_loader, s)  # used up: timed quickly
    lab06_measure.screen(base, base.replace(amp_dtype="bf16"), s)  # never measured at home
    assert [rounds for _, rounds in calls[1:]] == [homework.QUICK_BLOCKS, homework.QUICK_BLOCKS]


def test_the_ablation_and_its_leave_one_out_replay_as_measured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    base = lab06.baseline_config("tiny")
    loader = base.replace(num_workers=1, persistent_workers=True)
    both = loader.replace(amp_dtype="bf16")
    chain = [("baseline", base), ("loader", loader), ("bf16", both)]
    step = {base: 0.010, loader: 0.008, both: 0.005, base.replace(amp_dtype="bf16"): 0.006}
    calls = _fake_blocks(monkeypatch, lambda c: step[c])
    times, left_out = lab06_measure.measure_ablation(chain, leave_out=["loader", "bf16"])
    homework.write_file(list(homework.RECORDED), tmp_path)
    _grading_kernel(monkeypatch)
    replayed_times, replayed_left = lab06_measure.measure_ablation(chain, leave_out=["loader", "bf16"])
    assert len(calls) == 1 and replayed_times == times and replayed_left == left_out
    assert replayed_left["loader"].speedup == pytest.approx(6.0 / 5.0, rel=0.02)


def test_a_malformed_or_forged_record_is_never_trusted_blindly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Unreadable values, non-positive times, wrong shapes and junk files all fall back to timing."""
    base = lab06.baseline_config("tiny")
    calls = _fake_blocks(monkeypatch, lambda c: 0.010)
    key = {"changes": ["precision"]}
    bad = [{"kind": "lab06.screen", "key": key, "value": {"a_times": [1.0], "b_times": [1.0], "block_size": 1}},
           {"kind": "lab06.screen", "key": key, "value": {"a_times": [1.0, -1.0], "b_times": [1.0, 1.0], "block_size": 1}},
           {"kind": "lab06.screen", "key": key, "value": "fast"}]
    homework.write_file(bad, tmp_path)
    _grading_kernel(monkeypatch)
    for _ in bad:
        assert lab06_measure.screen(base, base.replace(amp_dtype="bf16"), lab06.sizes("tiny")).blocks == homework.QUICK_BLOCKS
    assert [e["event"] for e in homework.EVENTS] == ["unreadable", "quick"] * 3
    assert len(calls) == 3
    for junk in ("not json", json.dumps({"kind": "x"}), json.dumps([1, "a", None])):
        (tmp_path / homework.HOMEWORK_FILE).write_text(junk)
        assert homework.read_file(tmp_path / homework.HOMEWORK_FILE) == []


def test_the_comparison_of_precisions_replays_by_name_and_setting(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    from perflab.labs import lab03

    bf16 = lab03.baseline_config("tiny").replace(amp_dtype="bf16")
    recorded = {"bf16": Comparison((0.02, 0.021, 0.02), (0.01, 0.011, 0.01), 1, labels=("fp32", "bf16"))}
    homework.write_file([{"kind": "lab03.compare_precisions",
                          "key": {"names": ["bf16"], "changes": {"bf16": {"amp_dtype": "bf16", "channels_last": False}}},
                          "value": {k: homework.comparison_value(c) for k, c in recorded.items()}}], tmp_path)
    _grading_kernel(monkeypatch)
    timed = []
    monkeypatch.setattr("perflab.workload.build", lambda *a, **k: timed.append(a) or pytest.fail("timed again"))
    assert lab03_figures.compare_precisions({"bf16": bf16}, mode="tiny") == recorded
    assert not timed
    # CANDIDATES edited after the saved run ("bf16" now channels_last too): the record is not this setting's.
    homework.reset()
    with pytest.raises(pytest.fail.Exception, match="timed again"):
        lab03_figures.compare_precisions({"bf16": bf16.replace(channels_last=True)}, mode="tiny")


def test_the_grader_reads_the_record_from_the_notebooks_outputs_in_cell_order() -> None:
    entry = {"kind": "lab06.screen", "key": {"changes": ["amp_dtype"]}, "value": {"a_times": [1, 2]}}
    nb = new_notebook(cells=[
        new_code_cell("x", outputs=[new_output("display_data", data={homework.HOMEWORK_MIME: entry,
                                                                   "text/plain": "recorded"})]),
        new_code_cell("y", outputs=[new_output("stream", name="stdout", text="hello"),
                                    new_output("display_data", data={homework.HOMEWORK_MIME: json.dumps({**entry, "kind": "b"}),
                                                                     "text/plain": "as text"}),
                                    new_output("display_data", data={homework.HOMEWORK_MIME: "not json{",
                                                                     "text/plain": "junk"})])])
    got = homework.from_notebook(nbformat.from_dict(json.loads(nbformat.writes(nb))))
    assert [e["kind"] for e in got] == ["lab06.screen", "b"] and got[0]["value"] == entry["value"]


def test_a_real_kernel_shows_the_record_as_an_output_the_grader_finds(tmp_path: Path) -> None:
    """At home the record is a display output of the cell: saved with the notebook, read back by the grader."""
    from nbclient import NotebookClient

    nb = new_notebook(cells=[new_code_cell(
        "from perflab.labs import homework\n"
        "r = homework.measured('k', {'changes': ['a']}, lambda: 3, quick=lambda: 0, encode=lambda v: v,\n"
        "                      decode=int, what='a test measurement')\n"
        "print(r)")])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    texts = [o.get("data", {}).get("text/plain", "") for o in nb.cells[0].outputs]
    assert any("recorded in this output for the grader" in t for t in texts), nb.cells[0].outputs
    assert homework.from_notebook(nb) == [{"kind": "k", "key": {"changes": ["a"]}, "value": 3}]


def test_the_labs_that_decide_from_a_record_are_the_ones_whose_notebooks_call_one() -> None:
    calls = ("lab06_measure.screen(", "lab06_measure.measure_ablation(", "compare_precisions(", ".as_decided(")
    for twin in sorted(Path(__file__).resolve().parents[1].glob("solutions/*/*.py")):
        lab = twin.parent.name
        uses = any(c in twin.read_text(encoding="utf-8") for c in calls)
        assert uses == (lab in homework.LABS), lab


def test_the_graders_own_accuracy_run_is_never_replayed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A forged accuracy record steers only the notebook: the judge trains both configurations itself."""
    base = lab06.baseline_config("tiny")
    final = base.replace(amp_dtype="bf16")
    forged = {"baseline": 0.5, "final": 0.99, "baseline_loss": 1.0, "final_loss": 0.1, "steps": 4, "n_eval": 10}
    homework.write_file([{"kind": "lab06.accuracy", "key": {"changes": ["precision"]}, "value": forged}], tmp_path)
    _grading_kernel(monkeypatch)
    trained = []
    monkeypatch.setattr(lab06_measure, "trained_accuracy", lambda c, n: trained.append(c) or (0.3, 2.0))
    monkeypatch.setattr("perflab.dataset.load", lambda *a, **k: [0] * 7)
    assert lab06_measure.measure_accuracy(base, final, 4)["final"] == 0.99 and not trained  # the notebook's copy
    judged = lab06_measure.accuracy_run(base, final, 4)
    assert judged["final"] == 0.3 and trained == [base, final] and judged["n_eval"] == 7


# ---------------------------------------------------------------------------------------------
# A decision its notebook never measured at home earns the re-measurement's points only


def _ctx(lab: str, entries) -> object:
    from perflab.grading.judging import Context

    return Context(lab, 0, "tiny", {}, measured_at_home=None if entries is None else tuple(entries))


def test_a_final_typed_in_from_elsewhere_loses_the_decision_and_says_why() -> None:
    from perflab.labs.lab06 import judges as hidden06

    base = lab06.baseline_config("tiny")
    loader = base.replace(num_workers=1, persistent_workers=True)
    both = loader.replace(amp_dtype="bf16")

    def observed(chain):
        from perflab.labs.lab06 import probes as lab06_probes

        return lab06_probes.PROBES["test_final_config"]({"CHAIN": chain, "FINAL": chain[-1][1]}, 0)

    kept = [("baseline", base), ("loader", loader), ("bf16", both)]
    home = [{"kind": "lab06.ablation", "value": {},
             "key": {"names": ["baseline", "loader", "bf16"], "changes": [["loader"], ["precision"]], "leave_out": []}}]
    judge = hidden06.JUDGES["test_final_config"]
    judge(observed(kept), _ctx(lab06.LAB, home))  # measured at home: its ablation timed this FINAL
    judge(observed(kept), _ctx(lab06.LAB, None))  # no submission read (a solution checking itself)
    only_loader = [{**home[0], "key": {**home[0]["key"], "changes": [["loader"]]}}]
    for entries, says in ((only_loader, r"never measured loader \+ precision at home"),
                          ([], "carries no measurement from a home run")):
        with pytest.raises(AssertionError, match=says):
            judge(observed(kept), _ctx(lab06.LAB, entries))
    aa = [{"kind": "lab06.ablation", "value": {},
           "key": {"names": ["baseline", "nothing kept (A/A)"], "changes": [[]], "leave_out": []}}]
    judge(observed([("baseline", base)]), _ctx(lab06.LAB, aa))  # kept nothing, after measuring


def test_an_amp_setting_the_notebook_never_compared_at_home_loses_the_decision(tiny_data) -> None:
    from perflab.labs import lab03
    from perflab.labs.lab03 import judges as hidden03

    base = lab03.baseline_config("tiny")
    judge = hidden03.JUDGES["test_amp_config"]

    def observed(config):
        from perflab.labs.lab03 import probes as lab03_probes

        return lab03_probes.PROBES["test_amp_config"]({"AMP_CONFIG": config, "CLAIM": 1.2}, 0)

    home = [{"kind": "lab03.compare_precisions", "value": {},
             "key": {"names": ["fp32 channels_last", "bf16", "bf16 channels_last"]}}]
    for config in (base.replace(amp_dtype="bf16", channels_last=True), base.replace(amp_dtype="bf16"), base):
        judge(observed(config), _ctx(lab03.LAB, home))
    only_bf16 = [{**home[0], "key": {"names": ["bf16"]}}]
    with pytest.raises(AssertionError, match="never measured bf16 with channels_last at home"):
        judge(observed(base.replace(amp_dtype="bf16", channels_last=True)), _ctx(lab03.LAB, only_bf16))
    with pytest.raises(AssertionError, match="carries no measurement from a home run"):
        judge(observed(base), _ctx(lab03.LAB, []))
    assert hidden03.candidate_knobs("fp32 channels_last") == (None, True)
    assert [hidden03.candidate_knobs(n) for n in lab03.candidate_configs("tiny")] == \
        [(c.amp_dtype, c.channels_last) for c in lab03.candidate_configs("tiny").values()]


def test_a_loader_whose_worker_count_the_home_sweep_never_measured_loses_the_decision(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Lab 2's decision record carries the worker counts the notebook's sweep measured at home; a BEST
    typed in from elsewhere (a GPU server's 8 workers, where this machine's sweep went to 4) loses the
    decision's cell and says why; the baseline, a swept count, a record without counts (`as_decided`
    called without `swept`), no submission read, and a grader on another kind of device all
    pass."""
    from perflab.labs import lab02
    from perflab.labs.lab02 import judges as hidden02

    base = lab02.baseline_config("tiny")
    lab02.as_decided(base.replace(num_workers=2), "two workers gained", base, "cpu", swept={0: 9.0, 1: 10.0, 2: 12.0,
                                                                                              4: 11.0})
    home = [e for e in homework.RECORDED if e["kind"] == "lab02.best"]
    assert home and home[-1]["value"]["swept"] == [0, 1, 2, 4]
    for best in (base, base.replace(num_workers=2), base.replace(num_workers=4, pin_memory=True)):
        hidden02.measured_at_home(best, _ctx(lab02.LAB, home))
    typed = base.replace(num_workers=8, persistent_workers=True)
    with pytest.raises(AssertionError, match=r"never measured 8 loader workers at home.*measured 0, 1, 2, 4 workers"):
        hidden02.measured_at_home(typed, _ctx(lab02.LAB, home))
    without_counts = [{**home[-1], "value": {k: v for k, v in home[-1]["value"].items() if k != "swept"}}]
    for entries in (without_counts, [], None):
        hidden02.measured_at_home(typed, _ctx(lab02.LAB, entries))
    # The simulated CUDA grading machine: a laptop's record was not replayed there (the notebook decided
    # again from the GPU server's own sweep, which went to 8 workers), so it is not judged on it.
    monkeypatch.setattr(homework, "device_kind", lambda: "cuda")
    hidden02.measured_at_home(typed, _ctx(lab02.LAB, home))


def test_a_chain_timed_at_home_with_measure_chain_replays_and_counts_as_measured(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from perflab.labs.lab06 import judges as hidden06
    from perflab.labs.lab06 import probes as lab06_probes

    base = lab06.baseline_config("tiny")
    chain = [("baseline", base), ("bf16", base.replace(amp_dtype="bf16"))]
    calls = _fake_blocks(monkeypatch, lambda c: 0.005 if c.amp_dtype else 0.010)
    times = lab06_measure.measure_chain(chain)
    entries = list(homework.RECORDED)
    homework.write_file(entries, tmp_path)
    _grading_kernel(monkeypatch)
    assert lab06_measure.measure_chain(chain) == times and len(calls) == 1
    observed = lab06_probes.PROBES["test_final_config"]({"CHAIN": chain, "FINAL": chain[-1][1]}, 0)
    hidden06.JUDGES["test_final_config"](observed, _ctx(lab06.LAB, entries))


def test_the_decision_graded_is_the_one_the_submitted_code_makes_whatever_its_record_says(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A record of BEST is never replayed: the grading kernel's BEST is what the submitted code decides
    in that run. The sweep (replayed) runs at the smallest budget; the comparison BEST is decided from
    keeps the mode's budget, so that decision rests on a measurement."""
    from perflab.labs import lab02

    base = lab02.baseline_config("tiny")
    home_best = base.replace(num_workers=3, persistent_workers=True, prefetch_factor=4)
    assert lab02.sizes() == lab02.sizes("tiny")  # at home, the mode's own budgets
    best, why = lab02.as_decided(home_best, "three workers gained 1.4x with a CI above one", base, "cpu")
    assert (best, why) == (home_best, "three workers gained 1.4x with a CI above one")
    sweep = {"kind": "lab02.workers", "key": {"cell": "workers", "args": [], "device": "cpu", "code": "x"}, "value": {}}
    homework.write_file([*homework.RECORDED, sweep], tmp_path)

    _grading_kernel(monkeypatch)
    small, mode = lab02.sizes(), lab02.sizes("tiny")
    assert small.sweep_steps == 2 and small.phase_steps == 2  # replayed, or shown only: the smallest budget
    assert (small.compare_blocks, small.compare_block_size) == (mode.compare_blocks, mode.compare_block_size)
    assert small.verify_max_pairs == mode.verify_max_pairs  # the grader's own: unchanged
    # The decision cell left at the baseline (or a function that now picks no workers): graded as submitted.
    best, why = lab02.as_decided(base, "no gain here", base, "cpu")
    assert (best, why) == (base, "no gain here")
    out = capsys.readouterr().out
    assert "as your code decides it in this run" in out and "your saved run decided" in out
    assert homework.EVENTS[-1]["event"] == "decided"
    # Without the sweep's record the sweep keeps its budget too.
    homework.reset()
    homework.write_file([e for e in homework.read_file(tmp_path / homework.HOMEWORK_FILE)
                         if e["kind"] != "lab02.workers"], tmp_path)
    assert lab02.sizes() == lab02.sizes("tiny")


def test_lab5s_budgets_shorten_only_where_its_compile_record_replays_on_this_kind_of_device(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from perflab.labs import lab05

    homework.write_file([{"kind": "lab05.modes", "key": {"workload": "small", "device": "cpu", "code": "x"},
                          "value": {}}], tmp_path)
    _grading_kernel(monkeypatch)
    assert lab05.sizes().compare_blocks == 2 and lab05.sizes("tiny").compare_blocks == 10
    with monkeypatch.context() as graded_on_a_gpu:  # the laptop's record is not this device's
        graded_on_a_gpu.setattr(homework, "device_kind", lambda: "cuda")
        assert lab05.sizes().compare_blocks == lab05.sizes("tiny").compare_blocks
    assert lab05.as_decided("default", "w", "cuda") == ("default", "w")
    homework.reset()
    (tmp_path / homework.HOMEWORK_FILE).unlink()
    assert lab05.sizes().compare_blocks == lab05.sizes("tiny").compare_blocks  # no record: the mode's budget


def test_a_forged_decision_record_is_never_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    from perflab.labs import lab02, lab05

    base = lab02.baseline_config("tiny")
    homework.write_file([
        {"kind": "lab02.best", "key": {"device": "cpu", "code": None},
         "value": {"knobs": {"amp_dtype": "bfloat16"}, "why": "x"}},
        {"kind": "lab02.best", "key": {"device": "cpu", "code": None},
         "value": {"knobs": {"num_workers": 4, "persistent_workers": True}, "why": "typed in"}},
        {"kind": "lab05.choice", "key": {"device": "cpu", "code": None},
         "value": {"choice": "max-autotune", "why": "typed in"}},
    ], tmp_path)
    _grading_kernel(monkeypatch)
    assert lab02.as_decided(base, "mine", base, "cpu") == (base, "mine")
    assert lab05.as_decided(None, "mine", "cpu") == (None, "mine")
    assert [e["event"] for e in homework.EVENTS] == ["decided", "decided"]
    out = capsys.readouterr().out
    assert "your saved run decided TrainConfig(" in out and "your saved run decided 'max-autotune'" in out


def test_a_real_kernel_grades_the_decision_its_code_makes_not_the_one_its_record_names(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The decision cell edited after the saved run and never run again (the lazy `PICK = 0`), or a record
    typed in: the grading kernel's decision is the submitted code's."""
    from nbclient import NotebookClient

    decide = new_code_cell("PICK = int(os.environ.get('HOME_PICK', '0'))  # what this run's measurement says")
    record = new_code_cell("from perflab.labs import homework\n"
                           "PICK = homework.decided('k', PICK, device='cpu', encode=int, decode=int, what='PICK')\n"
                           "print('graded', PICK)")
    nb = new_notebook(cells=[new_code_cell("import os"), decide, record])

    def run(notebook, folder: Path, **env: str) -> str:
        folder.mkdir(exist_ok=True)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
        for name in env:
            monkeypatch.delenv(name)
        return "".join(o.get("text", "") for o in notebook.cells[-1].outputs if o.get("output_type") == "stream")

    run(nb, tmp_path / "home", HOME_PICK="3")  # at home the measurement picked 3
    saved = nbformat.reads(nbformat.writes(nb), as_version=4)
    assert homework.from_notebook(saved)[0]["value"] == 3
    (tmp_path / "graded").mkdir()
    homework.write_file(homework.from_notebook(saved), tmp_path / "graded")  # the grader lays it beside
    out = run(saved, tmp_path / "graded", NBGRADER_EXECUTION="autograde", PERFLAB_GRADER_REMEASURES="1")
    assert "graded 0" in out and "your saved run decided 3" in out


def _compile_experiment(modes: tuple[str, ...], compiled_s: float = 0.008) -> tuple[dict, dict]:
    """What lab 5's measure-modes cell returns: each mode's compile timed apart, and its comparison."""
    from perflab.labs.lab05 import CompileTiming

    timings = {"eager": CompileTiming(0.05, (0.010, 0.011, 0.010))}
    comparisons = {}
    for mode in modes:
        timings[mode] = CompileTiming(9.0, (compiled_s, compiled_s, compiled_s))
        comparisons[mode] = Comparison((0.010, 0.011, 0.010, 0.012), (compiled_s,) * 4, 1,
                                       labels=("eager", f"compile {mode}"))
    return timings, comparisons


def test_lab5s_compile_of_each_mode_is_replayed_when_graded_and_never_compiled_again(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A laptop-mode home run also times max-autotune; graded in grade mode (default only), the record is
    still the home run's: matched by workload and device, never by the modes this mode happens to time."""
    from perflab.labs import lab05

    runs: list[str] = []

    def measure(modes: tuple[str, ...]):
        def run():
            runs.append("measured")
            return _compile_experiment(modes)
        return run

    at_home = lab05.measured_modes(measure(("default", "max-autotune")), "small", "cpu")
    assert runs == ["measured"] and homework.RECORDED[-1]["kind"] == "lab05.modes"
    homework.write_file(homework.from_notebook(_notebook_of(homework.RECORDED)), tmp_path)

    _grading_kernel(monkeypatch)
    timings, comparisons = lab05.measured_modes(measure(("default",)), "small", "cpu")
    assert runs == ["measured"], "a recorded compile experiment is not compiled again in the grading kernel"
    assert (timings, comparisons) == at_home and set(comparisons) == {"default", "max-autotune"}
    assert timings["default"].compile_seconds == pytest.approx(9.0 - 0.008)
    assert "replayed from your home run" in capsys.readouterr().out
    # A second call (a cell run twice) and the ResNet-18 experiment were never recorded: they run, and say at
    # what budget (the lab's decision is replayed on its own, so the budget is the one in force).
    lab05.measured_modes(measure(("default",)), "small", "cpu")
    lab05.measured_modes(measure(("default",)), "resnet18", "cpu")
    assert runs == ["measured"] * 3
    out = capsys.readouterr().out
    assert "carries no home measurement" in out and "steady steps and" in out and "rests on no measurement" not in out


def test_lab5s_compile_record_from_another_device_or_forged_is_not_replayed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from perflab.labs import lab05

    timings, comparisons = _compile_experiment(("default",))
    good = {"timings": {n: {"first": t.first, "steady": list(t.steady)} for n, t in timings.items()},
            "comparisons": {m: homework.comparison_value(c) for m, c in comparisons.items()}}
    homework.write_file([
        {"kind": "lab05.modes", "key": {"workload": "small", "device": "cuda", "code": None}, "value": good},
        {"kind": "lab05.modes", "key": {"workload": "small", "device": "cpu", "code": None},
         "value": {**good, "comparisons": {"fastest-please": good["comparisons"]["default"]}}},
        {"kind": "lab05.modes", "key": {"workload": "small", "device": "cpu", "code": None},
         "value": {**good, "timings": {**good["timings"], "default": {"first": float("nan"), "steady": [0.1]}}}},
        {"kind": "lab05.modes", "key": {"workload": "small", "device": "cpu", "code": None}, "value": None},
    ], tmp_path)
    _grading_kernel(monkeypatch)
    runs: list[int] = []
    for _ in range(3):
        lab05.measured_modes(lambda: runs.append(1) or _compile_experiment(("default",)), "small", "cpu")
    assert len(runs) == 3
    assert [e["event"] for e in homework.EVENTS] == ["unreadable", "quick"] * 3  # the cuda record: never taken


def test_lab5s_resnet_compile_measured_on_a_gpu_replays_on_a_gpu_grader_and_not_on_a_cpu_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A student's full-mode run on a CUDA GPU, graded on a CUDA server (simulated): ResNet-18 is not compiled
    again; the same record read by a CPU grader is another device's, so that grader measures."""
    import torch

    from perflab.labs import lab05

    runs: list[str] = []
    gpu = torch.device("cuda")  # a device object only: nothing here touches CUDA

    def measure():
        runs.append("measured")
        return _compile_experiment(("default", "reduce-overhead"))

    at_home = lab05.measured_modes(measure, "resnet18", gpu)
    homework.write_file(list(homework.RECORDED), tmp_path)
    _grading_kernel(monkeypatch)
    monkeypatch.setattr(homework, "device_kind", lambda: "cuda")
    assert lab05.measured_modes(measure, "resnet18", gpu) == at_home and runs == ["measured"]
    homework.reset()
    monkeypatch.setattr(homework, "device_kind", lambda: "cpu")
    lab05.measured_modes(measure, "resnet18", torch.device("cpu"))
    assert runs == ["measured"] * 2 and homework.EVENTS[-1]["event"] == "quick"


def test_lab5s_compile_record_belongs_to_the_measure_compile_that_made_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A measure_compile edited after the saved run (say, to report a smaller compile) times again."""
    from perflab.labs import lab05

    def measure_compile(build, steps, *, clock=None, sync=None):
        return "as handed in"

    def edited_measure_compile(build, steps, *, clock=None, sync=None):
        return "edited after the run"

    runs: list[int] = []

    def measure():
        runs.append(1)
        return _compile_experiment(("default",))

    lab05.measured_modes(measure, "small", "cpu", code=measure_compile)
    homework.write_file(list(homework.RECORDED), tmp_path)
    _grading_kernel(monkeypatch)
    lab05.measured_modes(measure, "small", "cpu", code=edited_measure_compile)
    assert len(runs) == 2 and homework.EVENTS[-1]["event"] == "quick"
    homework.reset()
    lab05.measured_modes(measure, "small", "cpu", code=measure_compile)
    assert len(runs) == 2 and homework.EVENTS[-1]["event"] == "replayed"
    assert homework.code_digest(measure_compile) != homework.code_digest(edited_measure_compile) is not None
    assert homework.code_digest(len) is None  # no source: nothing to bind a record to


def test_a_compile_experiment_the_kit_cannot_record_still_runs_at_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """A student's measure_compile that returns its own type: the cell runs as before, and the grader, finding
    nothing it can replay, runs it (`test_lab5s_compile_record_from_another_device_or_forged_is_not_replayed`)."""
    from perflab.labs import lab05

    result = lab05.measured_modes(lambda: ({"eager": (0.1, [0.01])}, {}), "small", "cpu")
    assert result == ({"eager": (0.1, [0.01])}, {}) and homework.RECORDED[-1]["value"] is None


def _notebook_of(entries: list) -> nbformat.NotebookNode:
    """A saved notebook whose one cell shows `entries` as the kit does (what the grader reads back)."""
    cell = new_code_cell("...")
    cell.outputs = [new_output("display_data", data={homework.HOMEWORK_MIME: dict(e), "text/plain": "[...]"})
                    for e in entries]
    return new_notebook(cells=[cell])


def _loader_sweep() -> tuple[dict, dict, dict]:
    return {0: 400.0, 1: 700.0}, {0: 50.0, 1: 70.0}, {0: 0.3, 1: 0.01}


def test_lab2s_loader_measurements_replay_when_graded_with_their_keys_and_types(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The sweep (a tuple of tables) and the epoch starts (booleans to lists of seconds) come back as measured."""
    from perflab.labs import lab02
    from perflab.labs.lab02 import measure as lab02_measure

    s = lab02.sizes("tiny")
    runs: list[str] = []

    def measure_sweep():
        runs.append("sweep")
        return _loader_sweep()

    def measure_epoch_starts(workers):
        runs.append(f"starts {workers}")
        return {False: [0.2, 0.1, 0.1], True: [0.2, 0.001, 0.001]}

    home = (lab02_measure.measured("workers", measure_sweep, device="cpu", sizes=s),
            lab02_measure.measured("epoch starts", measure_epoch_starts, 1, device="cpu", sizes=s))
    homework.write_file(list(homework.RECORDED), tmp_path)
    _grading_kernel(monkeypatch)
    graded = (lab02_measure.measured("workers", measure_sweep, device="cpu", sizes=s),
              lab02_measure.measured("epoch starts", measure_epoch_starts, 1, device="cpu", sizes=s))
    assert graded == home and runs == ["sweep", "starts 1"]
    assert [type(k) for k in graded[1]] == [bool, bool] and [type(n) for n in graded[0][1]] == [int, int]


def test_lab2s_loader_measurement_runs_again_for_other_code_args_or_device(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A make_loader edited after the saved run, another worker count or another kind of device: measured
    here, at the budgets in force, and said so."""
    from perflab.labs import lab02
    from perflab.labs.lab02 import measure as lab02_measure

    s = lab02.sizes("tiny")
    runs: list[int] = []

    def make_loader(dataset, batch_size, num_workers=0):
        return "as handed in"

    def edited_make_loader(dataset, batch_size, num_workers=0):
        return "edited after the run"

    def measure_prefetch(workers):
        runs.append(workers)
        return {1: 60.0, 2: 61.0, 4: 59.0}

    lab02_measure.measured("prefetch", measure_prefetch, 1, device="cpu", sizes=s, code=(make_loader,))
    homework.write_file(list(homework.RECORDED), tmp_path)
    for args, device, loader in (((1,), "cpu", edited_make_loader), ((2,), "cpu", make_loader),
                                 ((1,), "cuda", make_loader)):
        _grading_kernel(monkeypatch)
        lab02_measure.measured("prefetch", measure_prefetch, *args, device=device, sizes=s, code=(loader,))
        assert homework.EVENTS[-1]["event"] == "quick", (args, device)
    assert runs == [1, 1, 2, 1]
    _grading_kernel(monkeypatch)
    lab02_measure.measured("prefetch", measure_prefetch, 1, device="cpu", sizes=s, code=(make_loader,))
    assert homework.EVENTS[-1]["event"] == "replayed" and runs == [1, 1, 2, 1]


@pytest.mark.parametrize("value", [
    {"tuple": False, "tables": [[["1", 60.0]]]},  # a key that is not a count
    {"tuple": False, "tables": [[[1, float("nan")]]]},  # not a finite figure
    {"tuple": False, "tables": [[[1, "fast"]]]},
    {"tuple": False, "tables": [[[1, [0.1, None]]]]},
    {"tuple": False, "tables": []},
    {"tuple": False, "tables": [[[1, 1.0]], [[2, 2.0]]]},  # two tables where one was measured
    {"tables": [[[1, 1.0]]]},
    "fast",
])
def test_a_malformed_lab2_loader_record_is_not_replayed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value) -> None:
    from perflab.labs import lab02
    from perflab.labs.lab02 import measure as lab02_measure

    def measure_prefetch(workers):
        return {1: 60.0}

    key = {"cell": "prefetch", "args": [1], "device": "cpu", "code": homework.code_digest(measure_prefetch)}
    homework.write_file([{"kind": "lab02.prefetch", "key": key, "value": value}], tmp_path)
    _grading_kernel(monkeypatch)
    got = lab02_measure.measured("prefetch", measure_prefetch, 1, device="cpu", sizes=lab02.sizes("tiny"))
    assert got == {1: 60.0} and [e["event"] for e in homework.EVENTS] == ["unreadable", "quick"]


def test_a_lab2_measurement_the_kit_cannot_record_still_runs_at_home() -> None:
    from perflab.labs import lab02
    from perflab.labs.lab02 import measure as lab02_measure

    got = lab02_measure.measured("crowded", lambda workers: {"0": "slow"}, 1, device="cpu", sizes=lab02.sizes("tiny"))
    assert got == {"0": "slow"} and homework.RECORDED[-1]["value"] is None


def test_a_lab2_measurement_not_tied_to_its_code_or_counts_is_measured_and_never_recorded(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A make_loader without source (a functools.partial) could not tell an edit apart, and a numpy worker
    count from the student's pick_workers is still a count: neither breaks the cell."""
    import functools

    import numpy as np

    from perflab.labs import lab02
    from perflab.labs.lab02 import measure as lab02_measure

    s = lab02.sizes("tiny")

    def loader(dataset, batch_size, num_workers=0):
        return None

    def measure_prefetch(workers):
        return {1: 60.0 + workers}

    got = lab02_measure.measured("prefetch", measure_prefetch, 1, device="cpu", sizes=s,
                                 code=(functools.partial(loader, batch_size=4),))
    assert got == {1: 61.0} and homework.RECORDED == []
    got = lab02_measure.measured("prefetch", measure_prefetch, np.int64(2), device="cpu", sizes=s, code=(loader,))
    assert got == {1: 62.0} and homework.RECORDED[-1]["key"]["args"] == [2]
    assert lab02_measure.measured("prefetch", measure_prefetch, 1.5, device="cpu", sizes=s) == {1: 61.5}
    assert len(homework.RECORDED) == 1  # a count that is not whole: measured, not recorded
    assert lab02_measure.encode_tables({1: float("inf")}) is None  # nothing the grader would read back


def test_a_measurement_whose_code_changed_says_so_when_graded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    from perflab.labs import lab02
    from perflab.labs.lab02 import measure as lab02_measure

    s = lab02.sizes("tiny")

    def measure_prefetch(workers):
        return {1: 60.0}

    def edited_measure_prefetch(workers):
        return {1: 90.0}

    lab02_measure.measured("prefetch", measure_prefetch, 1, device="cpu", sizes=s)
    homework.write_file(list(homework.RECORDED), tmp_path)
    _grading_kernel(monkeypatch)
    capsys.readouterr()
    assert lab02_measure.measured("prefetch", edited_measure_prefetch, 1, device="cpu", sizes=s) == {1: 90.0}
    assert "the code that measured it changed after the run your notebook saved" in capsys.readouterr().out
    homework.reset()
    assert lab02_measure.measured("prefetch", measure_prefetch, 2, device="cpu", sizes=s) == {1: 60.0}
    assert "carries no home measurement" in capsys.readouterr().out  # another worker count: not an edit


def test_lab2s_loader_record_made_on_a_gpu_replays_on_a_simulated_cuda_grader_and_not_on_a_cpu_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A GPU server grading with default flags runs the notebook on `cuda`: a home run on a GPU replays there
    (the device as the notebook holds it, a torch.device), and a CPU grader measures again."""
    import torch

    from perflab.labs import lab02
    from perflab.labs.lab02 import measure as lab02_measure

    s = lab02.sizes("tiny")
    runs: list[int] = []

    def measure_prefetch(workers):
        runs.append(workers)
        return {1: 900.0, 2: 910.0}

    lab02_measure.measured("prefetch", measure_prefetch, 4, device=torch.device("cuda", 0), sizes=s)
    homework.write_file(list(homework.RECORDED), tmp_path)
    _grading_kernel(monkeypatch)
    assert lab02_measure.measured("prefetch", measure_prefetch, 4, device=torch.device("cuda"), sizes=s) == {1: 900.0, 2: 910.0}
    assert runs == [4] and homework.EVENTS[-1]["event"] == "replayed"
    _grading_kernel(monkeypatch)
    lab02_measure.measured("prefetch", measure_prefetch, 4, device=torch.device("cpu"), sizes=s)
    assert runs == [4, 4] and homework.EVENTS[-1]["event"] == "quick"


def test_lab5s_compile_measured_by_code_without_source_is_measured_and_never_recorded() -> None:
    import functools

    from perflab.labs import lab05

    def measure_compile(build, steps, *, clock=None, sync=None):
        return None

    got = lab05.measured_modes(lambda: _compile_experiment(("default",)), "small", "cpu",
                               code=functools.partial(measure_compile, steps=3))
    assert set(got[0]) == {"eager", "default"} and homework.RECORDED == []


def test_lab2s_decision_comparison_replays_for_the_same_two_loaders_and_device(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The comparison BEST is decided from (`lab02_measure.compare_loaders`) is the kit's code on two
    loaders: replayed when graded for those loaders on this kind of device, timed again for any other."""
    from types import SimpleNamespace

    from perflab.labs import lab02
    from perflab.labs.lab02 import measure as lab02_measure

    measured = Comparison((0.02, 0.021, 0.02), (0.01, 0.011, 0.01), 1, labels=("baseline", "candidate"))
    runs: list = []
    monkeypatch.setattr("perflab.workload.build", lambda config: SimpleNamespace(close=lambda: None))
    monkeypatch.setattr("perflab.timing.compare", lambda *a, **k: runs.append(k["blocks"]) or measured)
    base, s = lab02.baseline_config("tiny"), lab02.sizes("tiny")
    one = base.replace(num_workers=1, persistent_workers=True)
    assert lab02_measure.compare_loaders(base, one, s) == measured and runs == [s.compare_blocks]
    homework.write_file(homework.RECORDED, tmp_path)
    _grading_kernel(monkeypatch)
    assert lab02_measure.compare_loaders(base, one, s) == measured and len(runs) == 1
    assert homework.EVENTS[-1]["event"] == "replayed"
    lab02_measure.compare_loaders(base, one.replace(num_workers=2), s)
    assert len(runs) == 2 and homework.EVENTS[-1]["event"] == "quick"
