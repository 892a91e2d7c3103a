"""`perflab profile`: flags generated from TrainConfig, one-line errors, and a tiny run end to end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from perflab import diagnose, env, results
from perflab.cli import build_parser, main
from perflab.cli import profile as cli_profile
from perflab.phases import PHASES
from perflab.workload import TrainConfig

# ResNet-18 with the tiny set's 4 classes: 11,689,512 less the 1000-class head (513,000) plus 4 x 513.
TINY_RESNET_PARAMS = 11_689_512 - 1000 * 513 + 4 * 513


def _profile_parser():  # noqa: ANN202 - argparse's private subparser type
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["profile"]


def test_every_trainconfig_field_is_a_flag() -> None:
    options = {opt for action in _profile_parser()._actions for opt in action.option_strings}
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        assert flag in options, f"TrainConfig.{f.name} has no {flag} flag"
        if isinstance(f.default, bool):
            assert "--no-" + f.name.replace("_", "-") in options


def test_size_sets_the_mode_sizes_and_knobs_override_them() -> None:
    args = _profile_parser().parse_args(["--size", "small", "--channels-last", "--lr", "0.1",
                                         "--prefetch-factor", "none", "--threads", "1"])
    config, mode = cli_profile.config_from_args(args)
    laptop = env.mode_sizes("laptop")
    assert mode == "laptop"
    assert (config.data, config.image_size, config.batch_size) == ("small", laptop.image_size, laptop.batch_size)
    assert config.channels_last is True and config.lr == 0.1 and config.prefetch_factor is None
    assert config.threads == 1
    args = _profile_parser().parse_args(["--size", "tiny", "--batch-size", "5", "--no-channels-last"])
    config, mode = cli_profile.config_from_args(args)
    assert (mode, config.batch_size, config.image_size, config.channels_last) == ("tiny", 5, 32, False)


def test_the_checkpoint_flag_sets_its_field() -> None:
    config, _ = cli_profile.config_from_args(_profile_parser().parse_args(["--size", "tiny", "--checkpoint-stages", "3"]))
    assert config.checkpoint_stages == 3


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--batch-size", "-1"], "batch_size"),
        (["--batch-size", "abc"], "batch_size"),
        (["--amp-dtype", "fp16", "--device", "cpu"], "amp_dtype"),
        (["--image-size", "8"], "image_size"),
        (["--size", "no/such/folder"], "--size"),
        (["--steps", "1"], "steps"),
    ],
)
def test_bad_flags_exit_2_with_one_line_naming_the_field(
        flags: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--size", "tiny", *flags]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"perflab profile: error: {field}") or f"{field}:" in lines[0]
    assert captured.out == ""


def test_missing_data_names_the_build_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PERFLAB_DATA_DIR", str(tmp_path))
    assert main(["profile", "--size", "small"]) == 2
    err = capsys.readouterr().err
    assert "perflab dataset build --size small" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_tiny_profile_end_to_end_writes_results_and_a_trace(
        tiny_data, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    out, trace = tmp_path / "profile.json", tmp_path / "trace.json"
    assert main(["profile", "--size", "tiny", "--batch-size", "4", "--steps", "2",
                 "--json", str(out), "--trace", str(trace)]) == 0
    text = capsys.readouterr().out
    for title in ("machine", "throughput", "phases", "parameters", "FLOPs", "memory budget",
                  "top ops", "roofline", "diagnosis"):
        assert f"== {title}" in text, f"section {title!r} missing from the output"
    assert "your pipeline reaches " in text and "of what this device gives the same step with no data path" in text
    assert f"{TINY_RESNET_PARAMS:,}" in text

    doc = results.load(out)
    assert doc["lab"] == "profile" and doc["config"]["batch_size"] == 4
    s = doc["sections"]
    assert s["counts"]["parameters"] == TINY_RESNET_PARAMS
    assert s["counts"]["flops_train"] > 2 * s["counts"]["flops_forward"] > 0
    assert s["counts"]["flops_forward_per_step"] == 4 * s["counts"]["flops_forward"]
    throughput = s["baseline"]["throughput"]
    assert throughput["ci"][0] <= throughput["median"] <= throughput["ci"][1]
    assert set(PHASES) <= set(s["phases"]["before"])
    assert s["memory_budget"]["parameters"] == 4 * TINY_RESNET_PARAMS
    assert s["memory_budget"]["peak"] > 0
    assert len(s["roofline"]["layers"]) == 21  # 20 convolutions and the classifier
    assert s["top_ops"] and s["top_ops"][0]["self_time_s"] > 0
    assert s["bottleneck"]["verdict"] in diagnose.VERDICTS
    assert s["bottleneck"]["lab"] in diagnose.LABS
    ceiling = s["ceiling"]
    assert ceiling["share"] == pytest.approx(throughput["median"] / ceiling["throughput"]["median"])
    assert f"reaches {ceiling['share']:.0%} of what" in text
    # The saved file holds what the diagnosis needs: diagnosing it again gives the same verdict.
    assert diagnose.diagnose_results(doc).verdict == s["bottleneck"]["verdict"]

    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert set(PHASES) <= names


def test_the_ceiling_is_the_runs_own_step_on_one_batch_and_the_share_is_throughput_over_it(
        tiny_data) -> None:  # noqa: ANN001
    """Cheap on a CPU: a few steps of the profile's own sizes, with no loader, copy or augmentation."""
    import torch

    from perflab import timing, workload
    from perflab import training_profile as tp

    config = TrainConfig(batch_size=2, image_size=32, channels_last=True, gpu_augment=True, data_on_device=True)
    plan = tp.ProfilePlan.for_steps(4)
    work = workload.build(config)
    try:
        seen = []
        work.augment.register_forward_hook(lambda *args: seen.append(1))
        ceiling = tp._time_ceiling(work, plan, torch.device("cpu"))
    finally:
        work.close()
    assert seen == [1], "the batch is augmented once, before the timed steps, never during them"
    assert ceiling.step_time.n == plan.ceiling_steps == 2 and ceiling.samples_per_step == 2
    assert ceiling.throughput == pytest.approx(2 * 2 / sum(ceiling.step_time.times))

    # A run twice as slow per step reaches half of its ceiling.
    run = timing.Measurement(tuple(2 * t for t in ceiling.step_time.times))
    unused = {f.name: None for f in dataclasses.fields(tp.TrainingProfile) if f.name not in ("config", "step_time")}
    profile = tp.TrainingProfile(**{**unused, "config": config, "step_time": run, "ceiling": ceiling})
    assert profile.ceiling_share == pytest.approx(profile.throughput / ceiling.throughput) == pytest.approx(0.5)
    line = profile.ceiling_line()
    assert line is not None and line.startswith("your pipeline reaches 50% of what this device gives the same step "
                                                "with no data path")
    doc = results.make("profile", {"ceiling": {"throughput": ceiling.rate.as_stat(), "share": 0.5}})
    assert doc["sections"]["ceiling"]["share"] == 0.5
