"""`parplan calibrate --from-run` guards: what it must say or refuse instead of writing a profile that misleads
(a base with no host dispatch, a report of the compile step alone, an --out that is a report, a device it cannot
match to the base's GPU), and the table's memory columns for a refit of a refit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import hardware_profiles
from planner.cli import main

ROOT = Path(__file__).resolve().parents[1]
H200_GRID = ROOT / "benchmarks" / "results" / "2026-11-28-h200" / "grid"


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def _one_line_error(rc, out, err):
    assert rc == 2 and out == "", err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err


@pytest.fixture(scope="module")
def plan():
    from planner.core import recommend
    from planner.models import model_from_params
    spec, _ = model_from_params(7e9)
    return recommend(model=spec, gpus=8)


def _report(plan, path, factor=1.25, reserved_extra=1.0e9, steps=6, warmup=2, device="NVIDIA H100 80GB HBM3",
            first_s=None):
    pred = plan.prediction
    rows = [{"step": i, "loss": 10.0, "step_time_s": pred.step_time_s * factor * (3.0 if i < warmup else 1.0),
             "tokens_per_s": 1.0, "mfu": 0.3} for i in range(steps)]
    if first_s is not None:
        rows[0]["step_time_s"] = first_s
    mem = {str(r): {"allocated": 1.0, "reserved": pred.memory_bytes_per_gpu.total + reserved_extra}
           for r in range(plan.hardware.gpus)}
    data = {"plan": json.loads(plan.model_dump_json()), "device": device, "torch_version": "2.13.0",
            "world_size": plan.hardware.gpus, "warmup_steps": warmup, "steps": rows, "peak_memory_bytes": mem,
            "prediction": json.loads(pred.model_dump_json()), "error": {}}
    path.write_text(json.dumps(data))
    return path


# ---------------------------------------------------------------------------------------------- 1: no host dispatch

def test_a_base_without_host_dispatch_warns_that_no_report_can_be_told_launch_bound(tmp_path, capsys):
    """The shipped h200-sxm-141gb has no host_block_s: over the committed H200 grid every run fed the sustained
    fraction (0.83 -> 0.39, its compute-bound runs then predicted 77-135 % slow) and nothing was said."""
    from planner.calibrate import profile_toml
    reports = sorted(str(p) for p in H200_GRID.glob("*/report.json"))
    assert len(reports) == 8
    # the shipped profile as it was audited (a copy, should it gain a host measurement)
    base = tmp_path / "h200-no-host.toml"
    shipped = hardware_profiles.load_profile("h200-sxm-141gb")
    base.write_text(profile_toml(shipped.model_copy(update={"name": "h200-no-host", "host_block_s": {},
                                                            "host_forward_share": {}})))
    out = tmp_path / "x.toml"
    rc, stdout, err = _run(["calibrate", "--from-run", *reports, "--base", str(base), "--out", str(out)], capsys)
    assert rc == 0, err
    (line,) = [x for x in err.splitlines() if x.startswith("warning: ")]
    assert "h200-no-host has no measured host dispatch" in line and "all 8 fit sustained_matmul_fraction" in line
    assert f"`parplan calibrate --host-only --base {base}`" in line
    # a base with a measured dispatch (the session's device calibration): no such warning
    calibrated = str(H200_GRID.parent / "h200-calibrated.toml")
    rc, _, err = _run(["calibrate", "--from-run", *reports, "--base", calibrated, "--out", str(tmp_path / "y.toml")],
                      capsys)
    assert rc == 0 and "no measured host dispatch" not in err, err


def test_a_base_without_host_dispatch_for_one_recompute_mode_warns_for_that_mode(plan, tmp_path, capsys):
    """A base that measured full recompute only cannot tell a no-recompute report launch-bound: the warning names
    the mode and counts its reports; a report in the measured mode alone is not warned about."""
    from planner.calibrate import profile_toml
    h100 = hardware_profiles.load_profile("h100-sxm-80gb")
    base = tmp_path / "full-only.toml"
    base.write_text(profile_toml(h100.model_copy(update={"name": "full-only",
                                                         "host_block_s": {"full": h100.host_block_s["full"]}})))

    def on(mode):
        return plan.model_copy(update={"parallel": plan.parallel.model_copy(update={"recompute": mode})})
    a, b = _report(on("full"), tmp_path / "a.json"), _report(on("none"), tmp_path / "b.json", factor=1.3)
    rc, _, err = _run(["calibrate", "--from-run", str(a), str(b), "--base", str(base),
                       "--out", str(tmp_path / "o.toml")], capsys)
    assert rc == 0, err
    assert "full-only has no measured host dispatch for recompute none, so 1 of the 2 reports" in err
    rc, _, err = _run(["calibrate", "--from-run", str(a), "--base", str(base), "--out", str(tmp_path / "p.toml")],
                      capsys)
    assert rc == 0 and "no measured host dispatch" not in err, err


# ---------------------------------------------------------------------------------------------- 2: the compile step alone

def test_a_report_of_the_first_step_alone_is_refused(plan, tmp_path, capsys):
    """`parplan launch --steps 1` writes warmup_steps 0 and one step, the compile step (3-15 s): read_report had
    fallen back to it and the fit took it for the step time (sustained 0.83 -> 0.02 on a committed H200 report)."""
    rep = json.loads((H200_GRID / "llama-3b-mbs4-full" / "report.json").read_text())
    rep["steps"], rep["warmup_steps"] = rep["steps"][:1], 0
    rep["steps"][0]["step_time_s"] = 9.0
    one = tmp_path / "report.json"
    one.write_text(json.dumps(rep))
    rc, out, err = _run(["calibrate", "--from-run", str(one), "--base", "h200-sxm-141gb",
                         "--out", str(tmp_path / "o.toml")], capsys)
    _one_line_error(rc, out, err)
    assert str(one) in err and "one step, the first" in err and "launch with more steps" in err
    assert not (tmp_path / "o.toml").exists()


def test_warm_up_covering_every_step_is_refused_and_the_first_step_is_never_timed(plan, tmp_path, capsys):
    from planner.calibrate import CalibrationError, read_report
    with pytest.raises(CalibrationError, match="all of them warm-up"):
        read_report(str(_report(plan, tmp_path / "w.json", steps=2, warmup=2)))
    # warmup_steps 0 (train.py --warmup-steps 0) over two steps: the second step is the step time, not the
    # median of it and the compile step
    r = read_report(str(_report(plan, tmp_path / "z.json", steps=2, warmup=0, factor=1.0, first_s=12.0)))
    assert r["step_time_s"] == pytest.approx(plan.prediction.step_time_s) and r["steps_used"] == 1


def test_fp16_steps_skipped_for_overflow_are_not_timed(plan, tmp_path):
    """An fp16 step skipped for inf/nan gradients (the report's "skipped", parallel_layers.loss_scale) ran no
    clipping and no optimizer step: the fit reads the steps that stepped, as the report's own medians do."""
    from planner.calibrate import read_report
    path = _report(plan, tmp_path / "s.json", steps=6, warmup=2, factor=1.0)
    data = json.loads(path.read_text())
    for i in (2, 3):
        data["steps"][i].update(skipped=True, step_time_s=plan.prediction.step_time_s * 0.2, after_s=1e-4)
    for row in data["steps"]:
        row.setdefault("after_s", 0.5)
    path.write_text(json.dumps(data))
    r = read_report(str(path))
    assert r["steps_used"] == 2 and r["step_time_s"] == pytest.approx(plan.prediction.step_time_s)
    assert r["after_s"] == 0.5


# ---------------------------------------------------------------------------------------------- 3: --out a report

def test_out_naming_a_report_is_refused(plan, tmp_path, capsys, monkeypatch):
    (tmp_path / "runs").mkdir()
    rep = _report(plan, tmp_path / "runs" / "report.json")
    other = _report(plan, tmp_path / "other.json", factor=1.1)
    before = rep.read_text()
    monkeypatch.chdir(tmp_path)
    for out in (str(rep), "runs/../runs/report.json"):  # the same file by another path: compared resolved
        rc, stdout, err = _run(["calibrate", "--from-run", str(other), str(rep), "--base", "h100-sxm-80gb",
                                "--out", out], capsys)
        _one_line_error(rc, stdout, err)
        assert f"--out {out} is the run report" in err and "which it would overwrite" in err
        assert rep.read_text() == before
    # nor another run's report, not among the inputs
    (tmp_path / "b").mkdir()
    third = _report(plan, tmp_path / "b" / "report.json", factor=1.2)
    kept = third.read_text()
    rc, stdout, err = _run(["calibrate", "--from-run", str(other), "--base", "h100-sxm-80gb", "--out", str(third)], capsys)
    _one_line_error(rc, stdout, err)
    assert "is a launch report, which the profile would overwrite" in err and third.read_text() == kept


# ---------------------------------------------------------------------------------------------- 4: unknown device

@pytest.mark.parametrize("device", ["NVIDIA GeForce RTX 4090", "Tesla T4", "cuda"])
def test_a_device_of_no_known_gpu_family_gets_a_note(device, plan, tmp_path, capsys):
    """gpu_family() knows none of these, and check_devices compared known families only: such reports refit any
    base without a word.  Now a note says the device could not be matched to the base's GPU."""
    r = _report(plan, tmp_path / "r.json", device=device)
    rc, _, err = _run(["calibrate", "--from-run", str(r), "--base", "h100-sxm-80gb", "--out", str(tmp_path / "o.toml")],
                      capsys)
    assert rc == 0, err
    (line,) = [x for x in err.splitlines() if x.startswith("note: ") and "could not be matched" in x]
    assert device in line and "h100-sxm-80gb's H100 GPU" in line
    # a known device of the base's family: no note
    r = _report(plan, tmp_path / "h.json")
    rc, _, err = _run(["calibrate", "--from-run", str(r), "--base", "h100-sxm-80gb", "--out", str(tmp_path / "p.toml")],
                      capsys)
    assert rc == 0 and "could not be matched" not in err, err


# ---------------------------------------------------------------------------------------------- 5: memory columns

def test_memory_columns_are_what_each_profile_predicts_for_a_refit_of_a_refit(plan, tmp_path, capsys):
    """The memory table's before / after are the reserved peak each profile predicts: predicted total + its fitted slack.
    A refit of a refit on the same report changes nothing, so both read the measured peak; 'before' had left the
    base's slack out (-2.6 % / -3.9 % on a committed refit where the profile predicts ~0 %)."""
    from rich.console import Console
    import io

    from planner.calibrate import calibrate_from_runs
    r = _report(plan, tmp_path / "a.json", reserved_extra=3.0e9)
    once, twice = tmp_path / "once.toml", tmp_path / "twice.toml"
    quiet = Console(file=io.StringIO(), width=300)
    _, p1, rows1 = calibrate_from_runs([str(r)], base="h100-sxm-80gb", out=str(once), console=quiet)
    _, p2, rows2 = calibrate_from_runs([str(r)], base=str(once), out=str(twice), console=quiet)
    assert p1.memory_slack_gbytes == pytest.approx(3.0, abs=0.01)
    measured = rows1[0]["measured_reserved_bytes"]
    assert rows1[0]["predicted_memory_bytes_before"] == pytest.approx(plan.prediction.memory_bytes_per_gpu.total)
    assert rows1[0]["predicted_memory_bytes_after"] == pytest.approx(measured, rel=1e-4)
    (row,) = rows2
    assert row["predicted_memory_bytes_before"] == pytest.approx(measured, rel=1e-4)
    assert row["predicted_memory_bytes_after"] == pytest.approx(measured, rel=1e-4)


def test_a_refit_marks_the_base_calibrates_kept_from_line_it_supersedes(plan, tmp_path, capsys):
    """A calibrated base says sustained_matmul_fraction and memory_reserve_gbytes were "kept from" the datasheet
    profile; a refit fits both, and that line had stood unchanged beside the refit's own, saying the opposite."""
    import hardware_profiles
    base = ROOT / "benchmarks" / "results" / "2026-11-22-h100" / "h100-calibrated.toml"
    a, b = _report(plan, tmp_path / "a.json"), _report(plan, tmp_path / "b.json", factor=1.3)
    rc, _, err = _run(["calibrate", "--from-run", str(a), str(b), "--base", str(base), "--out", str(tmp_path / "o.toml")],
                      capsys)
    assert rc == 0, err
    lines = [x for x in hardware_profiles.load_profile(str(tmp_path / "o.toml")).sources if "kept from" in x]
    stale = [x for x in lines if x.startswith("[calibrate]") and "sustained_matmul_fraction" in x.split("kept from")[0]]
    assert stale and all("(superseded for sustained_matmul_fraction, memory_reserve_gbytes by the --from-run refit"
                         in x for x in stale), stale
    assert any("nvlink and inter_node kept from" in x and "superseded" not in x for x in lines)


def test_superseded_marks_merge_and_follow_what_the_refit_fitted(plan, tmp_path, capsys):
    """A line marked by an earlier refit gains the fields a later one fits (it had kept its first mark); a reserve
    that no report could refit (no reserved memory) is not called superseded; --out refuses a launch report with a
    byte-order mark as launch reads it, and a deeply nested JSON at --out is no internal error."""
    from planner.calibrate import _superseded
    line = "[calibrate] memory_reserve_gbytes, sustained_matmul_fraction and host memory kept from h100-sxm-80gb"
    once = _superseded(line, ["memory_reserve_gbytes"])
    assert once.endswith("(superseded for memory_reserve_gbytes by the --from-run refit below)")
    assert _superseded(once, ["sustained_matmul_fraction"]).endswith(
        "(superseded for memory_reserve_gbytes, sustained_matmul_fraction by the --from-run refit below)")
    import hardware_profiles
    base = ROOT / "benchmarks" / "results" / "2026-11-22-h100" / "h100-calibrated.toml"
    a, b = _report(plan, tmp_path / "a.json"), _report(plan, tmp_path / "b.json", factor=1.3)
    for r in (a, b):
        data = json.loads(r.read_text())
        data["peak_memory_bytes"] = {}
        r.write_text(json.dumps(data))
    rc, _, err = _run(["calibrate", "--from-run", str(a), str(b), "--base", str(base), "--out", str(tmp_path / "o.toml")],
                      capsys)
    assert rc == 0, err
    marked = [x for x in hardware_profiles.load_profile(str(tmp_path / "o.toml")).sources
              if x.startswith("[calibrate]") and "(superseded for" in x]
    assert marked and all("memory_reserve_gbytes" not in x.split("(superseded for")[1] for x in marked), marked
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + _report(plan, tmp_path / "c.json").read_bytes())
    kept = bom.read_bytes()
    rc, out, err = _run(["calibrate", "--from-run", str(a), "--base", "h100-sxm-80gb", "--out", str(bom)], capsys)
    _one_line_error(rc, out, err)
    assert "is a launch report" in err and bom.read_bytes() == kept
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    rc, out, err = _run(["calibrate", "--from-run", str(a), "--base", "h100-sxm-80gb", "--out", str(deep)], capsys)
    assert "internal error" not in err


def test_out_replaces_a_profile_but_not_another_kind_of_file(plan, tmp_path, capsys):
    """An explicit --out replaces an earlier profile (the README's refit loop does); a plan or any file that is no
    profile is refused before anything is measured or fitted (`--out plan.json` had replaced the plan)."""
    r = _report(plan, tmp_path / "r.json")
    other = tmp_path / "plan.json"
    other.write_text('{"schema_version": 1}')
    assert main(["calibrate", "--from-run", str(r), "--base", "h100-sxm-80gb", "--out", str(other)]) == 2
    err = capsys.readouterr().err
    assert "exists and is not a hardware profile" in err and err.count("\n") == 1, err
    assert other.read_text() == '{"schema_version": 1}'
    prof = tmp_path / "p.toml"
    assert main(["calibrate", "--from-run", str(r), "--base", "h100-sxm-80gb", "--out", str(prof)]) == 0
    assert main(["calibrate", "--from-run", str(r), "--base", "h100-sxm-80gb", "--out", str(prof)]) == 0
    assert hardware_profiles.load_profile(prof).name == "h100-sxm-80gb-calibrated"
