"""`parplan calibrate`: the CPU self-calibration writes a profile the planner accepts at once, the
--from-run refit moves sustained_matmul_fraction and memory_reserve_gbytes by what the reports say,
and bad input is one stderr line with exit code 2."""
from __future__ import annotations

import json
import math
import os
from hardware_profiles import tomllib  # tomli on Python 3.10
from pathlib import Path

import pytest

import hardware_profiles
from planner.calibrate import _predict, binned_curve, increasing_root, isotonic_increasing, profile_toml
from planner.cli import main
from planner.schema import HardwareProfile

GB = 1e9


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def _monotone_ish(curve, slack=0.02):
    ys = [y for _, y in curve]
    return all(b >= a - slack for a, b in zip(ys, ys[1:]))


# ---------------------------------------------------------------------------------------------- device mode

@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """(profile path, stderr) of `calibrate --device cpu --quick`."""
    import contextlib
    import io
    path = tmp_path_factory.mktemp("cal") / "tmp.toml"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["calibrate", "--device", "cpu", "--quick", "--out", str(path)])
    assert rc == 0, err.getvalue()
    return path, err.getvalue()


@pytest.fixture(scope="module")
def cpu_profile(cpu_run):
    return cpu_run[0]


def test_cpu_quick_writes_a_valid_profile(cpu_profile):
    data = tomllib.loads(cpu_profile.read_text())
    prof = HardwareProfile(**data)
    assert hardware_profiles.load_profile(cpu_profile) == prof
    assert prof.name == "h100-sxm-80gb-calibrated"
    assert "CPU SELF-CALIBRATION FOR TESTING ONLY" in prof.measured and "torch" in prof.measured
    from planner.core import recommend
    plan = recommend("tiny-llama-test", 1, seq_len=128, global_batch_size=8, hardware=str(cpu_profile))
    assert any(w.startswith("test-only profile") for w in plan.prediction.warnings)
    assert any(s.startswith("[calibrate] parplan calibrate") for s in prof.sources)
    assert any("network not measured" in s for s in prof.sources)
    for curve in (prof.matmul_efficiency_curve, prof.attention_efficiency_curve):
        assert len(curve) >= 2
        xs = [x for x, _ in curve]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)
        assert all(0 < y <= 1 for _, y in curve)
        assert _monotone_ish(curve)
    # CPU: the best fp32 GEMM is the peak of every dtype, and the copy bandwidth the memory bandwidth
    peaks = set(prof.peak_dense_tflops.values())
    assert len(peaks) == 1 and 0 < peaks.pop() < 50
    assert prof.hbm_efficiency == 1.0 and prof.hbm_gbytes_per_s > 0.1
    # not measured on a CPU: kept from the base
    base = hardware_profiles.load_profile("h100-sxm-80gb")
    assert prof.nvlink == base.nvlink and prof.inter_node == base.inter_node
    assert prof.sustained_matmul_fraction == base.sustained_matmul_fraction


def test_cpu_self_calibration_warns_on_stderr_and_in_the_file(cpu_run):
    """--device cpu still works, but says loudly, on stderr and not only inside the file, that the profile
    is a test of the tool; the file's notes say --device cpu was asked for (it was: auto never falls back)."""
    path, err = cpu_run
    assert err.count("FOR TESTING THE TOOL ONLY") >= 2  # before the 100 s run and after it
    assert "never plan real runs" in err
    assert "use it with `parplan recommend --hardware" not in err
    prof = hardware_profiles.load_profile(path)
    assert "--device cpu" in prof.measured and "(the CPU asked for by name)" in prof.measured
    assert prof.description.startswith("CPU SELF-CALIBRATION FOR TESTING ONLY")


def test_calibrate_says_where_its_time_went(cpu_run):
    """The bar is the whole command under 5 minutes: the profile's `measured` line and the closing line on stderr
    give each phase's seconds (the CPU's phases here; a GPU adds host link, collectives, host dispatch, FP8), and
    the phases add up to the whole."""
    import re
    path, err = cpu_run
    measured = hardware_profiles.load_profile(path).measured
    m = re.search(r"; (\d+) s: (start-up [^)]*)\)", measured)
    assert m, measured
    phases = dict((k, float(v)) for k, v in re.findall(r"([a-zA-Z0-9 -]+?) ([\d.]+) s(?:, |$)", m.group(2)))
    assert list(phases) == ["start-up", "GEMM fp32", "attention", "device copy", "optimizer step"], m.group(2)
    total = int(m.group(1))
    assert abs(sum(phases.values()) - total) <= 0.5 * len(phases) + 0.5, (phases, total)
    line = next(x for x in err.splitlines() if x.startswith("calibration took"))
    assert "(start-up " in line and "GEMM fp32 " in line and "device copy " in line, line


def test_phase_clock_charges_each_phase_its_own_time(monkeypatch):
    from planner import calibrate as cal
    now = iter([10.0, 13.5, 13.6, 20.0])
    monkeypatch.setattr(cal.time, "perf_counter", lambda: next(now))
    lap = cal.PhaseClock(9.0)
    lap("start-up")
    lap("GEMM bf16")
    lap("start-up")  # a name again adds to it
    lap("attention")
    assert lap.phases == pytest.approx({"start-up": 1.1, "GEMM bf16": 3.5, "attention": 6.4})
    assert lap.text() == "start-up 1 s, GEMM bf16 4 s, attention 6 s"
    assert cal.PhaseClock.render({"copy": 0.25}) == "copy 0.2 s"


@pytest.mark.parametrize("argv", [["calibrate"], ["calibrate", "--quick"], ["calibrate", "--host-only"]])
def test_auto_without_a_gpu_refuses_instead_of_calibrating_the_cpu(argv, tmp_path, capsys, monkeypatch):
    """`parplan calibrate` on a machine with no GPU once self-calibrated the CPU for 100 s and wrote an
    h100-sxm-80gb-calibrated.toml at 0.15 TFLOP/s; now one line and exit 2, nothing written."""
    import torch

    import planner.calibrate as cal
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def measured(*a, **k):
        raise AssertionError("measured the CPU under --device auto")
    monkeypatch.setattr(cal, "gemm_shapes", measured)
    monkeypatch.setattr(cal, "measure_host_block", measured)
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(argv, capsys)
    assert rc == 2 and out == ""
    assert err.strip() == ("error: no CUDA GPU here to calibrate -- fix: run it on the GPU node, or pass --device cpu "
                           "for a test-only self-calibration of this CPU")
    assert list(tmp_path.iterdir()) == []


def test_recommend_accepts_the_calibrated_profile(cpu_profile, capsys):
    rc, out, err = _run(["recommend", "--hardware", str(cpu_profile), "--params", "1e9", "--gpus", "1", "--json"], capsys)
    assert rc in (0, 3), err
    plan = json.loads(out)
    assert plan["hardware"]["name"] == str(cpu_profile)
    assert plan["prediction"]["step_time_s"] > 0


@pytest.mark.parametrize("name", ["h100-sxm-80gb", "mi300x"])  # mi300x: a mesh; the others leave mesh_links unset
def test_toml_writer_round_trips_a_shipped_profile(tmp_path, name):
    base = hardware_profiles.load_profile(name)
    p = tmp_path / "rt.toml"
    p.write_text(profile_toml(base))
    assert hardware_profiles.load_profile(p) == base


def test_binning_shared_with_build_script():
    import importlib.util
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("build_h100_curve_t", root / "benchmarks" / "build_h100_curve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.binned_curve is binned_curve
    assert isotonic_increasing([1.0, 0.5, 2.0], [1, 1, 1]) == [0.75, 0.75, 2.0]


# ---------------------------------------------------------------------------------------------- --from-run

@pytest.fixture(scope="module")
def plan():
    from planner.core import recommend
    from planner.models import model_from_params
    spec, _ = model_from_params(7e9)
    return recommend(model=spec, gpus=8)


def _report(plan, path, factor=1.25, reserved_extra=1.0e9, steps=6, warmup=2, device="NVIDIA H100 80GB HBM3"):
    pred = plan.prediction
    rows = [{"step": i, "loss": 10.0, "step_time_s": pred.step_time_s * factor * (3.0 if i < warmup else 1.0),
             "tokens_per_s": 1.0, "mfu": 0.3} for i in range(steps)]
    mem = {str(r): {"allocated": 1.0, "reserved": pred.memory_bytes_per_gpu.total + reserved_extra * (1 if r else 0.5)}
           for r in range(plan.hardware.gpus)}
    data = {"plan": json.loads(plan.model_dump_json()), "device": device, "torch_version": "2.13.0",
            "warmup_steps": warmup, "steps": rows, "peak_memory_bytes": mem,
            "prediction": json.loads(pred.model_dump_json()), "error": {}}
    path.write_text(json.dumps(data))
    return path


def test_from_run_refits_sustained_fraction_and_reserve(plan, tmp_path, capsys):
    base = hardware_profiles.load_profile("h100-sxm-80gb")
    r1 = _report(plan, tmp_path / "a.json", reserved_extra=1.0e9)
    r2 = _report(plan, tmp_path / "b.json", reserved_extra=2.0e9)
    r3 = _report(plan, tmp_path / "c.json", reserved_extra=3.0e9)
    out = tmp_path / "fit.toml"
    rc, stdout, err = _run(["calibrate", "--from-run", str(r1), "--from-run", str(r2), "--from-run", str(r3),
                            "--base", "h100-sxm-80gb", "--out", str(out)], capsys)
    assert rc == 0, err
    assert stdout.strip() == str(out)
    assert "step time s" in err and "a.json" in err
    prof = hardware_profiles.load_profile(out)
    ratio = prof.sustained_matmul_fraction / base.sustained_matmul_fraction

    # Only matmul/attention time scales with the fraction: step(s) = A/s + B. Solve for the exact
    # expected factor from two predictions; it is 0.8 for the scaling part, a little below for the whole step.
    s0 = base.sustained_matmul_fraction
    t0 = _predict(plan, base).step_time_s
    t1 = _predict(plan, base.model_copy(update={"sustained_matmul_fraction": s0 / 2})).step_time_s
    a = (t1 - t0) * s0
    b = t0 - a / s0
    expected = a / (1.25 * t0 - b) / s0
    after = _predict(plan, prof)
    assert 0.75 < expected <= 0.8
    assert ratio == pytest.approx(expected, rel=2e-3)
    assert after.step_time_s == pytest.approx(1.25 * plan.prediction.step_time_s, rel=0.01)
    # reserve: + median(max reserved over ranks - predicted total) = +2 GB
    assert prof.memory_reserve_gbytes == pytest.approx(base.memory_reserve_gbytes + 2.0, abs=0.01)
    assert prof.name == "h100-sxm-80gb-calibrated"
    assert "--from-run" in prof.measured and any("--from-run" in s for s in prof.sources)


def test_from_run_prints_its_table_whole_into_a_log(plan, tmp_path, capsys):
    """stderr is no terminal here (as in a log): the table is as wide as it needs, where the 160 columns had cut
    the step columns of long report names to "0.16…"."""
    r = _report(plan, tmp_path / ("a-long-report-name-" * 6 + ".json"))
    rc, _, err = _run(["calibrate", "--from-run", str(r), "--base", "h100-sxm-80gb", "--out", str(tmp_path / "w.toml")],
                      capsys)
    assert rc == 0 and "step time s" in err and "reserved memory GB" in err and "…" not in err, err


def test_from_run_refuses_reports_of_two_gpu_kinds_in_one_line(tmp_path, capsys):
    """One profile describes one GPU: reports of an H200 and an H100 session together are refused before a base is
    picked (a note, the base and an error had suggested a --base that would refuse the other kind's reports)."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    mixed = [str(results / "2026-11-28-h200" / "grid" / "gpt-1.3b-mbs4-none" / "report.json"),
             str(results / "2026-11-22-h100" / "grid" / "llama-3b-mbs4-none" / "report.json")]
    rc, out, err = _run(["calibrate", "--from-run", *mixed, "--out", str(tmp_path / "x.toml")], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert "2 kinds of device" in err and "H200: 1 report" in err and "H100: 1 report" in err


def test_a_refit_of_a_refit_replaces_the_reserves_slack_instead_of_adding_it(plan, tmp_path, capsys):
    """The reserve is the base's own plus the launches' allocator slack; refitting the refit profile on the same
    report had added the slack again each time (2.5 -> 4.28 -> 6.06 GB on a committed H100 report)."""
    base = hardware_profiles.load_profile("h100-sxm-80gb")
    r = _report(plan, tmp_path / "a.json", reserved_extra=2.0e9)
    once, twice = tmp_path / "once.toml", tmp_path / "twice.toml"
    assert _run(["calibrate", "--from-run", str(r), "--base", "h100-sxm-80gb", "--out", str(once)], capsys)[0] == 0
    assert _run(["calibrate", "--from-run", str(r), "--base", str(once), "--out", str(twice)], capsys)[0] == 0
    p1, p2 = hardware_profiles.load_profile(once), hardware_profiles.load_profile(twice)
    assert p1.memory_reserve_gbytes == pytest.approx(base.memory_reserve_gbytes + 2.0, abs=0.01)
    assert p1.memory_slack_gbytes == pytest.approx(2.0, abs=0.01)
    assert (p2.memory_reserve_gbytes, p2.memory_slack_gbytes) == (p1.memory_reserve_gbytes, p1.memory_slack_gbytes)
    with pytest.raises(ValueError, match="must not exceed memory_reserve_gbytes"):  # a hand edit past the reserve
        type(p1)(**{**p1.model_dump(), "memory_slack_gbytes": p1.memory_reserve_gbytes + 1})


def test_from_run_faster_than_predicted_clamps_to_one_and_reserve_not_negative(plan, tmp_path, capsys):
    r = _report(plan, tmp_path / "fast.json", factor=0.3, reserved_extra=-50e9)
    out = tmp_path / "fast.json.toml"
    rc, _, err = _run(["calibrate", "--from-run", str(r), "--out", str(out)], capsys)
    assert rc == 0, err
    prof = hardware_profiles.load_profile(out)
    assert prof.sustained_matmul_fraction == 1.0
    assert prof.memory_reserve_gbytes == 0.0
    assert "clamped" in err


def test_from_run_json_out(plan, tmp_path, capsys):
    r = _report(plan, tmp_path / "r.json", factor=1.1)
    out = tmp_path / "fit.json"
    rc, _, err = _run(["calibrate", "--from-run", str(r), "--base", "h100-sxm-80gb", "--out", str(out)], capsys)
    assert rc == 0, err
    data = json.loads(out.read_text())
    # measured 10 % slower than predicted: the refit fraction drops below the base profile's
    base = hardware_profiles.load_profile("h100-sxm-80gb").sustained_matmul_fraction
    assert HardwareProfile(**data).sustained_matmul_fraction < base
    assert math.isfinite(data["memory_reserve_gbytes"])


# ---------------------------------------------------------------------------------------------- bad input

def _bad(tmp_path, plan):
    no_steps = json.loads(_report(plan, tmp_path / "x.json").read_text())
    no_steps["steps"] = []
    (tmp_path / "nosteps.json").write_text(json.dumps(no_steps))
    (tmp_path / "bad.json").write_text("{not json")
    _report(plan, tmp_path / "cpu.json", device="cpu")
    return {
        "missing": ["calibrate", "--from-run", str(tmp_path / "nope.json"), "--out", str(tmp_path / "o.toml")],
        "malformed": ["calibrate", "--from-run", str(tmp_path / "bad.json"), "--out", str(tmp_path / "o.toml")],
        "no steps": ["calibrate", "--from-run", str(tmp_path / "nosteps.json"), "--out", str(tmp_path / "o.toml")],
        "cpu report": ["calibrate", "--from-run", str(tmp_path / "cpu.json"), "--out", str(tmp_path / "o.toml")],
        "bad base": ["calibrate", "--from-run", str(tmp_path / "x.json"), "--base", "no-such-gpu", "--out", str(tmp_path / "o.toml")],
        "bad out": ["calibrate", "--from-run", str(tmp_path / "x.json"), "--out", str(tmp_path / "o.yaml")],
        "bad device": ["calibrate", "--device", "tpu", "--out", str(tmp_path / "o.toml")],
        "from-run with --quick": ["calibrate", "--from-run", str(tmp_path / "x.json"), "--quick", "--out", str(tmp_path / "o.toml")],
        "from-run with --sustained": ["calibrate", "--from-run", str(tmp_path / "x.json"), "--sustained", "60",
                                      "--out", str(tmp_path / "o.toml")],
        "negative --sustained": ["calibrate", "--device", "cpu", "--sustained", "-5", "--out", str(tmp_path / "o.toml")],
    }


@pytest.mark.parametrize("case", ["missing", "malformed", "no steps", "cpu report", "bad base", "bad out", "bad device",
                                  "from-run with --quick", "from-run with --sustained", "negative --sustained"])
def test_bad_input_is_one_line_exit_2(case, plan, tmp_path, capsys):
    argv = _bad(tmp_path, plan)[case]
    rc, out, err = _run(argv, capsys)
    assert rc == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ")
    assert not list(tmp_path.glob("o.*"))  # no profile written, under either name the cases give


def _overlap_worker(rank, world, port, out):
    import torch
    import torch.distributed as dist
    from planner.calibrate import overlap_slowdown
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from datetime import timedelta
    # a short timeout: ranks issuing different numbers of collectives fail instead of hanging
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        r = overlap_slowdown(torch, dist, torch.device("cpu"), n=192, gemms=4, comm_bytes=1 << 20, reps=3)
        Path(f"{out}.{rank}").write_text(json.dumps(r))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_overlap_probe_runs_gemms_beside_async_all_reduces(tmp_path):
    """The (f) probe's mechanics on two gloo ranks: GEMMs timed alone and with all-reduces in flight.
    On a CPU the number means nothing; on GPUs the worker runs the same function over NCCL."""
    from tests.runtime_helpers.two_ranks import spawn_on_a_free_port
    out = tmp_path / "overlap.json"
    spawn_on_a_free_port(_overlap_worker, lambda port: (2, port, str(out)), 2)
    r, r1 = (json.loads(Path(f"{out}.{k}").read_text()) for k in (0, 1))
    # each rank times its own GEMMs and all-reduce; they must agree on how many all-reduces to issue
    # (they once did not, and a CI run hung on the extra one)
    assert r["all_reduces_in_flight"] == r1["all_reduces_in_flight"]
    assert r["gemm_alone_s"] > 0 and r["gemm_beside_s"] > 0 and r["all_reduces_in_flight"] >= 1
    assert r["slowdown"] == pytest.approx(max(0.0, r["gemm_beside_s"] / r["gemm_alone_s"] - 1))


def test_collective_results_fill_the_profile():
    """What a >= 2-GPU calibration writes (no GPU needed): nvlink from the all-reduce sweep and
    overlap_compute_slowdown from the overlap probe."""
    from planner.calibrate import apply_collectives
    base = hardware_profiles.load_profile("h100-sxm-80gb")
    coll = [{"op": op, "bytes": b, "s": b / 300e9, "busbw_gbytes_per_s": 300.0 if b > 1e6 else 1.0}
            for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv") for b in (8 << 10, 256 << 20)]
    coll.append({"op": "overlap", "gemm_alone_s": 0.020, "gemm_beside_s": 0.025, "all_reduces_in_flight": 9,
                 "slowdown": 0.25})
    data = base.model_dump(mode="json")
    fields: list[str] = []
    note = apply_collectives(data, coll, base, 8, fields)
    prof = HardwareProfile(**data)
    assert prof.overlap_compute_slowdown == 0.25
    assert prof.nvlink.efficiency == pytest.approx(300 / 450, rel=1e-3)
    assert set(fields) == {"overlap_compute_slowdown", "nvlink.efficiency", "nvlink.latency_s"}
    assert "overlap_compute_slowdown 0.25" in note
    without = base.model_dump(mode="json")
    apply_collectives(without, coll[:-1], base, 8, [])
    assert without["overlap_compute_slowdown"] == base.overlap_compute_slowdown  # kept from the base
    # a base with rates by group size (the L40S's PCIe tree): another machine's, so this calibrate's one group's rate
    # stands for every group, and the note says so
    l40s = hardware_profiles.load_profile("l40s")
    data = l40s.model_dump(mode="json")
    note = apply_collectives(data, coll[:-1], l40s, 4, [])
    assert HardwareProfile(**data).nvlink.efficiency_by_group_size is None
    assert "efficiency_by_group_size dropped (a group of 4 measured here" in note
    # a base bridged in pairs (the H100 PCIe's): two GPUs measure their pair (300 GB/s busbw: the whole bridge), the
    # PCIe rate of the rest kept; eight measure the node's PCIe rate (300 / 64 clamps to 1), the bridges kept
    pcie = hardware_profiles.load_profile("h100-pcie-80gb")
    for world, field, value, kept, said in ((2, "bridge_efficiency", 1.0, ("efficiency", 0.625), "one bridged pair"),
                                            (8, "efficiency", 1.0, ("bridge_efficiency", 0.387), "pairs (nvlink.")):
        data, fields = pcie.model_dump(mode="json"), []
        note = apply_collectives(data, coll[:-1], pcie, world, fields)
        nv = HardwareProfile(**data).nvlink.model_dump()
        assert nv[field] == value and nv[kept[0]] == kept[1] and f"nvlink.{field}" in fields and said in note


def test_from_run_fits_host_dispatch_on_launch_bound_reports_only(plan, tmp_path, capsys):
    """A launch-bound report (a tiny model whose blocks wait on the host) refits host_block_s for its
    recompute mode and leaves the sustained fraction to the compute-bound report; the refit profile
    reproduces both measured steps."""
    from planner.core import recommend
    from planner.schema import ModelSpec
    from planner.search import Pins
    tiny = ModelSpec(arch="llama", layers=4, hidden=256, heads=4, kv_heads=2, ffn_hidden=512, vocab=1024, name="tiny")
    small = recommend(tiny, gpus=1, seq_len=128, global_batch_size=1, suggest=False, hardware="h100-sxm-80gb",
                      pins=Pins(tp=1, pp=1, dp=1, mbs=1, zero=0, recompute="none", offload="none"))
    assert any(w.startswith("launch-bound") for w in small.prediction.warnings)
    big = _report(plan, tmp_path / "big.json", factor=1.1)
    slow_host = _report(small, tmp_path / "tiny.json", factor=1.3)
    out = tmp_path / "fit.toml"
    rc, _, err = _run(["calibrate", "--from-run", str(big), "--from-run", str(slow_host), "--base", "h100-sxm-80gb",
                       "--out", str(out)], capsys)
    assert rc == 0, err
    base = hardware_profiles.load_profile("h100-sxm-80gb")
    prof = hardware_profiles.load_profile(out)
    assert prof.host_block_s["none"] > base.host_block_s["none"]
    assert prof.host_block_s["full"] == base.host_block_s["full"]  # no launch-bound full-recompute report
    assert any("launch-bound, not used" in s for s in prof.sources)
    for p, factor in ((plan, 1.1), (small, 1.3)):
        got = _predict(p, prof).step_time_s
        assert got == pytest.approx(factor * p.prediction.step_time_s, rel=0.02)


def test_host_only_remeasures_the_dispatch_and_keeps_everything_else(tmp_path):
    """`calibrate --host-only --base P`: P's fields untouched but host_block_s and host_forward_share, which are
    measured here (the runtime on CPU in this test; on a GPU machine the compiled runtime on its host)."""
    from planner.calibrate import calibrate_host
    from rich.console import Console
    import io
    base = hardware_profiles.load_profile("h100-sxm-80gb")
    path, prof, host = calibrate_host(out=str(tmp_path / "h.toml"), base="h100-sxm-80gb", device="cpu",
                                      console=Console(file=io.StringIO()), steps=3, modes=("none",), moe=False)
    assert set(host) == {"none"} and host["none"] >= 0  # a timing difference on a shared CPU: its sign is noise
    assert prof.host_block_s["none"] == pytest.approx(host["none"], rel=1e-3)
    assert prof.host_block_s["full"] == base.host_block_s["full"]  # modes not measured are kept
    same = {k for k in type(base).model_fields
            if k not in ("host_block_s", "host_forward_share", "sources", "measured", "name")}
    assert all(getattr(prof, k) == getattr(base, k) for k in same)
    # the forward's share of the dispatch is measured with it (the runtime's reports carry the forward's end)
    assert set(prof.host_forward_share) == {"none"} and 0 < prof.host_forward_share["none"] < 1
    assert prof.name == "h100-sxm-80gb-host"  # not to be mistaken for the shipped profile
    assert any(s.startswith("[calibrate --host-only]") and "FOR TESTING ONLY" in s for s in prof.sources)
    assert hardware_profiles.load_profile(path) == prof
    # a plan made with it says so: its numbers describe no GPU (plans had carried no word of it)
    from planner.core import recommend
    warned = recommend("tiny-llama-test", 1, seq_len=128, global_batch_size=8, hardware=str(path)).prediction.warnings
    assert any(w.startswith("test-only profile") for w in warned)
    shipped = recommend("tiny-llama-test", 1, seq_len=128, global_batch_size=8).prediction.warnings
    assert not any(w.startswith("test-only profile") for w in shipped)


def test_host_only_refuses_from_run(tmp_path, capsys):
    rc, _, err = _run(["calibrate", "--host-only", "--from-run", str(tmp_path / "r.json"), "--out",
                       str(tmp_path / "o.toml")], capsys)
    assert rc != 0 and "--host-only" in err and len(err.strip().splitlines()) == 1


def test_the_collective_benchmark_starts_again_on_a_fresh_port_only_when_its_port_was_taken(monkeypatch):
    """A port free when measure_collectives chose it was once taken before rank 0's store bound it (CI, 2026-12-06:
    EADDRINUSE while the other test worker's gloo ranks ran): that start, and only that, is tried again."""
    import torch.multiprocessing as mp

    from planner import calibrate
    ports, errors = [], ["EADDRINUSE", None]

    def spawn(fn, args, nprocs, join, start_method):
        ports.append(args[1])
        err = errors.pop(0)
        if err:
            raise mp.ProcessRaisedException(f"DistNetworkError: ... code: -98, name: {err}, ...", 0, 1)
        Path(args[3]).write_text('[{"op": "overlap"}]')

    monkeypatch.setattr(mp, "start_processes", spawn)
    assert calibrate.measure_collectives(2, quick=True, device_type="cpu", sizes=[8]) == [{"op": "overlap"}]
    assert len(ports) == 2
    errors[:] = ["ECONNREFUSED"]  # any other failure is the benchmark's own: raised at once
    with pytest.raises(mp.ProcessRaisedException, match="ECONNREFUSED"):
        calibrate.measure_collectives(2, quick=True, device_type="cpu", sizes=[8])
    errors[:] = ["EADDRINUSE"] * calibrate.PORT_TRIES
    with pytest.raises(mp.ProcessRaisedException, match="EADDRINUSE"):
        calibrate.measure_collectives(2, quick=True, device_type="cpu", sizes=[8])


def test_collective_benchmark_runs_end_to_end_on_gloo_ranks():
    """The >= 2-GPU collective sweep (`measure_collectives`: spawned ranks, every op at every size, the
    overlap probe, rank 0's file) on two gloo CPU ranks, then into a profile.  Until this ran on CPU the
    worker had only ever been read, never run: the NCCL machine with two GPUs has not been lent yet."""
    from planner.calibrate import apply_collectives, measure_collectives
    sizes = [8 << 10, 32 << 20]
    coll = measure_collectives(2, quick=True, device_type="cpu", sizes=sizes)
    ops = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
    assert [(r["op"], r["bytes"]) for r in coll if r["op"] != "overlap"] == [(op, b) for op in ops for b in sizes]
    for r in coll:
        if r["op"] != "overlap":
            assert r["s"] > 0 and r["busbw_gbytes_per_s"] > 0
    for op in ops:  # a 4096x larger message takes longer, and moves more bytes per second
        small, big = (r for r in coll if r["op"] == op)
        assert big["s"] > small["s"], op
        assert big["busbw_gbytes_per_s"] > small["busbw_gbytes_per_s"], op
    (ov,) = (r for r in coll if r["op"] == "overlap")
    assert ov["all_reduces_in_flight"] >= 1 and ov["slowdown"] >= 0
    base = hardware_profiles.load_profile("h100-sxm-80gb")
    data = base.model_dump(mode="json")
    fields: list[str] = []
    note = apply_collectives(data, coll, base, 2, fields)
    prof = HardwareProfile(**data)
    (big_ar,) = (r for r in coll if r["op"] == "all_reduce" and r["bytes"] == 32 << 20)
    eff = min(1.0, max(1e-4, big_ar["busbw_gbytes_per_s"] / base.nvlink.gbytes_per_s))
    assert prof.nvlink.efficiency == pytest.approx(eff, rel=1e-3, abs=1e-4)
    (small_ar,) = (r for r in coll if r["op"] == "all_reduce" and r["bytes"] == 8 << 10)
    assert prof.nvlink.latency_s == pytest.approx(small_ar["s"] / 2, rel=1e-2)  # 2 (n - 1) ring steps
    assert set(fields) == {"overlap_compute_slowdown", "nvlink.efficiency", "nvlink.latency_s"}
    assert "2 GPUs: all-reduce busbw" in note


@pytest.mark.parametrize("f, root", [
    (lambda x: 0.3 + 2.0 * x - 5.0, 2.35),                      # linear: a step time in 1 / fraction
    (lambda x: max(1.0, 0.5 * x) - 3.0, 6.0),                    # flat, then linear (launch-bound, then not)
    (lambda x: max(4.0, 0.5 * x) + 0.1 * x - 5.0, 25.0 / 3.0),   # a kink where the root is
    (lambda x: x + 1e-3 * x ** 2 - 5.0, (math.sqrt(1.02) - 1.0) / 2e-3),  # a curve
])
def test_increasing_root_finds_the_crossing_in_few_evaluations(f, root):
    """The from-run fits solve one monotone equation per report; the solver must land where bisection
    would (to its tolerance) with far fewer cost-model evaluations."""
    calls = []

    def counted(x):
        calls.append(x)
        return f(x)
    x = increasing_root(counted, 0.0, 1e3, 1e-9)
    assert x == pytest.approx(root, rel=1e-8)
    assert all(0.0 <= c <= 1e3 for c in calls)
    assert len(calls) < 15  # bisection: ~40 over this bracket


# ---------------------------------------------------------------------------------------------- --from-run: which base, which reports

def _on_hardware(plan, name):
    return plan.model_copy(update={"hardware": plan.hardware.model_copy(update={"name": name})})


def _profile_file(path, name, base="h100-sxm-80gb"):
    prof = hardware_profiles.load_profile(base).model_copy(update={"name": name})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile_toml(prof))
    return path


def test_from_run_finds_the_reports_relative_hardware_path_from_elsewhere(plan, tmp_path, capsys, monkeypatch):
    """A launch from the repository root records --hardware benchmarks/results/X/h100-calibrated.toml in
    the plan; a refit from another folder, with no --base, finds it from the report's folder up."""
    repo = tmp_path / "repo"
    rel = "benchmarks/results/2026-11-23-h100/h100-calibrated.toml"
    _profile_file(repo / rel, "h100-calibrated")
    run = repo / "benchmarks/results/2026-11-23-h100/runs/7b"
    run.mkdir(parents=True)
    r = _report(_on_hardware(plan, rel), run / "report.json")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    rc, out, err = _run(["calibrate", "--from-run", str(r), "--out", "fit.toml"], capsys)
    assert rc == 0, err
    prof = hardware_profiles.load_profile(tmp_path / "elsewhere" / "fit.toml")
    assert prof.name == "h100-calibrated"  # the base was the report's profile, not the shipped one
    assert "--base h100-calibrated" in prof.sources[-1]


def test_from_run_reports_hardware_nowhere_says_pass_base(plan, tmp_path, capsys, monkeypatch):
    r = _report(_on_hardware(plan, "benchmarks/results/gone/h100-calibrated.toml"), tmp_path / "report.json")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    rc, out, err = _run(["calibrate", "--from-run", str(r), "--out", "fit.toml"], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert str(r) in err and "pass --base" in err and "--base:" not in err
    assert not (tmp_path / "elsewhere" / "fit.toml").exists()


@pytest.mark.parametrize("base, device, want", [
    ("mi300x", "NVIDIA H100 80GB HBM3", ["MI300X", "H100", "--base h100-sxm-80gb"]),
    ("a100-sxm-80gb", "NVIDIA H100 80GB HBM3", ["A100", "H100"]),
    (None, "AMD Instinct MI300X", ["MI300X", "H100", "--base mi300x"]),  # the plan's h100-sxm-80gb, MI300X runs
    (None, "NVIDIA H100 PCIe", ["(H100 PCIE)", "describes H100 GPUs", "--base h100-pcie-80gb"]),  # not the SXM part
    ("h800-sxm-80gb", "NVIDIA H100 80GB HBM3", ["(H100)", "describes H800 GPUs", "--base h100-sxm-80gb"]),
    ("h800-sxm-80gb", "NVIDIA H800 PCIe", ["(H800 PCIE)", "describes H800 GPUs"]),  # no profile of its own to name
])
def test_from_run_refuses_reports_from_another_gpu_than_the_base(base, device, want, plan, tmp_path, capsys):
    r = _report(plan, tmp_path / "report.json", device=device)
    argv = ["calibrate", "--from-run", str(r), "--out", str(tmp_path / "o.toml")] + (["--base", base] if base else [])
    rc, out, err = _run(argv, capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "pass the --base of the GPU the runs used" in err
    assert all(w in err for w in want), err
    assert not (tmp_path / "o.toml").exists()


def test_from_run_tells_reports_named_alike_apart_and_marks_the_unused(plan, tmp_path, capsys, monkeypatch):
    """Every launch report is report.json: the table and the profile's sources name each by its folder,
    and a launch-bound report left out of the sustained fraction says so in the table."""
    from planner.core import recommend
    from planner.schema import ModelSpec
    from planner.search import Pins
    tiny = ModelSpec(arch="llama", layers=4, hidden=256, heads=4, kv_heads=2, ffn_hidden=512, vocab=1024, name="tiny")
    small = recommend(tiny, gpus=1, seq_len=128, global_batch_size=1, suggest=False, hardware="h100-sxm-80gb",
                      pins=Pins(tp=1, pp=1, dp=1, mbs=1, zero=0, recompute="none", offload="none"))
    for name, p, f in (("7b-a", plan, 1.1), ("7b-b", plan, 1.2), ("tiny", small, 1.3)):
        (tmp_path / "runs" / name).mkdir(parents=True)
        _report(p, tmp_path / "runs" / name / "report.json", factor=f)
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(["calibrate", "--from-run", "runs/7b-a/report.json", "--from-run", "runs/7b-b/report.json",
                         "--from-run", "runs/tiny/report.json", "--base", "h100-sxm-80gb", "--out", "fit.toml"], capsys)
    assert rc == 0, err
    rows = [line for line in err.splitlines() if "report.json" in line and line.startswith("│")]
    names = ["7b-a/report.json", "7b-b/report.json", "tiny/report.json"]
    assert [line.split("│")[1].strip() for line in rows] == names * 2  # the step table, then the memory table's
    rows = rows[:3]
    assert "(not used)" in rows[2] and "not used" not in rows[0] + rows[1]
    assert "launch-bound, not used for sustained_matmul_fraction (they refit host_block_s): tiny/report.json" in err
    src = hardware_profiles.load_profile(tmp_path / "fit.toml").sources[-1]
    assert "--from-run 7b-a/report.json 7b-b/report.json tiny/report.json (in runs)" in src


def test_from_run_takes_more_reports_after_one_flag(plan, tmp_path, capsys):
    """`--from-run runs/*/report.json` expands to `--from-run a b c`: all of them are reports."""
    paths = [str(_report(plan, tmp_path / f"{k}.json", factor=f)) for k, f in zip("abc", (1.1, 1.2, 1.3))]
    rc, out, err = _run(["calibrate", "--from-run", *paths, "--base", "h100-sxm-80gb", "--out", str(tmp_path / "o.toml")],
                        capsys)
    assert rc == 0, err
    assert all(f"{k}.json" in err for k in "abc")
    assert "3 reports" in hardware_profiles.load_profile(tmp_path / "o.toml").measured


def test_reports_without_from_run_say_to_give_it(tmp_path, capsys):
    rc, out, err = _run(["calibrate", str(tmp_path / "a.json"), "--out", str(tmp_path / "o.toml")], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "repeat --from-run for each report" in err


# ---------------------------------------------------------------------------------------------- never the --base file

def test_from_run_default_out_never_overwrites_a_calibrated_base(plan, tmp_path, capsys, monkeypatch):
    """--base ./h100-sxm-80gb-calibrated.toml once made the default --out that same file: the refit
    replaced the device calibration.  Now the default gets -refit, and --out naming the base is refused."""
    base = _profile_file(tmp_path / "h100-sxm-80gb-calibrated.toml", "h100-sxm-80gb-calibrated")
    before = base.read_text()
    r = _report(plan, tmp_path / "r.json", factor=1.1)
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(["calibrate", "--from-run", str(r), "--base", "./h100-sxm-80gb-calibrated.toml"], capsys)
    assert rc == 0, err
    assert out.strip() == "h100-sxm-80gb-calibrated-refit.toml"
    assert base.read_text() == before
    assert hardware_profiles.load_profile(tmp_path / out.strip()).sustained_matmul_fraction < 0.83
    rc, out, err = _run(["calibrate", "--from-run", str(r), "--base", "./h100-sxm-80gb-calibrated.toml",
                         "--out", str(base)], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "is the --base profile itself" in err
    assert base.read_text() == before


def test_out_is_never_the_base_file_in_any_mode(tmp_path):
    """check_out_path, which all three modes use: a shipped profile's own file included."""
    from planner.calibrate import CalibrationError, base_file, check_out_path
    shipped = base_file("h100-sxm-80gb")
    assert shipped.is_file()
    with pytest.raises(CalibrationError, match="is the --base profile itself"):
        check_out_path(str(shipped), "h100-sxm-80gb-calibrated", shipped)
    mine = _profile_file(tmp_path / "x-calibrated.toml", "x-calibrated")
    assert check_out_path(None, str(tmp_path / "x-calibrated"), base_file(str(mine)), "-recalibrated") == \
        tmp_path / "x-calibrated-recalibrated.toml"
    assert check_out_path(None, str(tmp_path / "y-calibrated"), base_file(str(mine))) == tmp_path / "y-calibrated.toml"
    # a default never replaces an existing file (an earlier calibration); an explicit --out does
    _profile_file(tmp_path / "y-calibrated.toml", "y-calibrated")
    (tmp_path / "y-calibrated-2.toml").write_text("earlier too")
    assert check_out_path(None, str(tmp_path / "y-calibrated"), base_file(str(mine))) == tmp_path / "y-calibrated-3.toml"
    assert check_out_path(str(tmp_path / "y-calibrated.toml"), "ignored", base_file(str(mine))) == \
        tmp_path / "y-calibrated.toml"
    with pytest.raises(CalibrationError, match="exists and is not a hardware profile"):  # an explicit --out replaces
        check_out_path(str(tmp_path / "y-calibrated-2.toml"), "ignored", base_file(str(mine)))  # a profile only


def test_host_only_on_a_host_profile_writes_a_new_file_with_its_own_name(tmp_path, monkeypatch, capsys):
    """--host-only writes <base>-host.toml (as --out's help says) named <base>-host; a base that is
    itself such a file is not overwritten."""
    import io

    from rich.console import Console

    import planner.calibrate as cal
    monkeypatch.setattr(cal, "measure_host_block", lambda *a, **k: {"none": 1.5e-3})
    monkeypatch.chdir(tmp_path)
    path, prof, _ = cal.calibrate_host(base="h100-sxm-80gb", device="cpu", console=Console(file=io.StringIO()))
    assert str(path) == "h100-sxm-80gb-host.toml" and prof.name == "h100-sxm-80gb-host"
    before = path.read_text()
    again, prof2, _ = cal.calibrate_host(base=str(path), device="cpu", console=Console(file=io.StringIO()))
    assert again != path and path.read_text() == before and prof2.name == "h100-sxm-80gb-host"
    rc, out, err = _run(["calibrate", "--help"], capsys)
    assert "<base>-host.toml" in " ".join(out.split())


def test_from_run_says_which_base_when_reports_were_planned_on_several(plan, tmp_path, capsys, monkeypatch):
    """Every report is refit against one base profile: with reports planned on two, a note names the one used."""
    mine = _profile_file(tmp_path / "mine.toml", "mine")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _report(plan, tmp_path / "a" / "report.json")
    b = _report(_on_hardware(plan, str(mine)), tmp_path / "b" / "report.json")
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(["calibrate", "--from-run", str(a), "--from-run", str(b), "--out", "fit.toml"], capsys)
    assert rc == 0, err
    assert "planned on 2 profiles" in err and f"refitting {plan.hardware.name}" in err


def test_host_block_estimate_keeps_the_median_pair():
    """One pair of probe runs disturbed by the host (here its 10-block run took 40 ms longer) does not set the
    reading: the median of three pairs does, and the spread says the pairs disagreed."""
    from planner.calibrate import HOST_BLOCKS, host_block_estimate, noisy_host_note
    per = HOST_BLOCKS[1] - HOST_BLOCKS[0]
    steady = {"t": [0.010, 0.010 + per * 0.002], "f": [0.004, 0.004 + per * 0.001], "d": [0.008, 0.008 + per * 0.002]}
    hit = {"t": [0.010, 0.010 + per * 0.002 + 0.040], "f": [0.004, 0.004 + per * 0.0015], "d": [0.008, 0.008 + per * 0.002]}
    est, share, spread = host_block_estimate([steady, hit, dict(steady, t=[0.010, 0.010 + per * 0.0021])])
    assert est == pytest.approx(0.0021)  # the middle pair, not the disturbed one (0.007) nor the mean (0.0037)
    assert share == pytest.approx(0.5)  # median of 0.5, 0.75, 0.5
    assert spread == pytest.approx((0.007 - 0.002) / 0.0021)
    assert noisy_host_note({"none": spread, "full": 0.1}).startswith("host dispatch varied over its repeats (none 238%")
    assert noisy_host_note({"none": 0.1}) is None
    # one pair: no spread; a pair without forward/dispatch phases gives no share; a negative difference reads 0
    assert host_block_estimate([steady]) == (pytest.approx(0.002), pytest.approx(0.5), None)
    assert host_block_estimate([{"t": [0.02, 0.01], "f": None, "d": None}]) == (0.0, None, None)


def test_a_report_given_twice_is_counted_once(tmp_path):
    """`calibrate --from-run a.json a.json` (or a byte-identical copy) fits as `--from-run a.json`: a repeat had weighed
    its run twice in every fit and made a two-point least squares of one run."""
    from planner.calibrate import distinct_reports
    a = tmp_path / "a.json"
    a.write_text('{"x": 1}')
    copy = tmp_path / "sub"
    copy.mkdir()
    (copy / "a.json").write_text('{"x": 1}')
    b = tmp_path / "b.json"
    b.write_text('{"x": 2}')
    kept, repeated = distinct_reports([str(a), str(b), str(a), str(copy / "a.json"), str(tmp_path / "missing.json")])
    assert kept == [str(a), str(b), str(tmp_path / "missing.json")]
    assert repeated == [str(a), str(copy / "a.json")]


def test_from_run_with_a_report_twice_fits_as_with_it_once(plan, tmp_path, capsys):
    """The command, not only the helper: a report given twice is counted once (said on stderr), and the profile
    written is the one the report alone gives."""
    rep = str(_report(plan, tmp_path / "a.json", factor=1.3))
    rc, _, err = _run(["calibrate", "--from-run", rep, rep, "--base", "h100-sxm-80gb", "--out", str(tmp_path / "two.toml")],
                      capsys)
    assert rc == 0 and "given more than once, counted once" in err, err
    rc, _, _ = _run(["calibrate", "--from-run", rep, "--base", "h100-sxm-80gb", "--out", str(tmp_path / "one.toml")],
                    capsys)
    two, one = (hardware_profiles.load_profile(tmp_path / f"{n}.toml") for n in ("two", "one"))
    assert "1 report" in two.measured
    assert two.sustained_matmul_fraction == one.sustained_matmul_fraction
    assert two.memory_reserve_gbytes == one.memory_reserve_gbytes


def test_from_run_with_only_launch_bound_reports_keeps_the_fraction(tmp_path, capsys):
    """Every report launch-bound: their steps are host dispatch, so the base's sustained fraction is kept (said) and
    host_block_s is refit; fitting the fraction to them had taken 0.83 to 0.21 on one committed H100 report."""
    from planner.core import recommend
    from planner.schema import ModelSpec
    from planner.search import Pins
    tiny = ModelSpec(arch="llama", layers=4, hidden=256, heads=4, kv_heads=2, ffn_hidden=512, vocab=1024, name="tiny")
    small = recommend(tiny, gpus=1, seq_len=128, global_batch_size=1, suggest=False, hardware="h100-sxm-80gb",
                      pins=Pins(tp=1, pp=1, dp=1, mbs=1, zero=0, recompute="none", offload="none"))
    rep = _report(small, tmp_path / "tiny.json", factor=1.3)
    out = tmp_path / "fit.toml"
    rc, _, err = _run(["calibrate", "--from-run", str(rep), "--base", "h100-sxm-80gb", "--out", str(out)], capsys)
    assert rc == 0, err
    assert "every report is launch-bound" in err
    base, prof = hardware_profiles.load_profile("h100-sxm-80gb"), hardware_profiles.load_profile(out)
    assert prof.sustained_matmul_fraction == base.sustained_matmul_fraction
    assert prof.host_block_s["none"] > base.host_block_s["none"]
    assert _predict(small, prof).step_time_s == pytest.approx(small.prediction.step_time_s * 1.3, rel=0.02)


def test_an_unwritable_out_is_refused_before_measuring(tmp_path, capsys):
    """--out under a file (or an unwritable folder) was found only after the whole calibration (minutes on a GPU)."""
    (tmp_path / "afile").write_text("x")
    rc, _, err = _run(["calibrate", "--device", "cpu", "--quick", "--out", str(tmp_path / "afile" / "x.toml")], capsys)
    assert rc == 2 and "is a file, not a folder" in err and "GEMM" not in err, err


@pytest.mark.parametrize("device, base", [
    ("NVIDIA GB300", "gb300-nvl72"),  # its name contains b300's: matched first
    ("NVIDIA B300 SXM6 AC", "b300"),
    ("NVIDIA GB200", "gb200-nvl72"),  # its name contains b200's: matched first
    ("NVIDIA B200", "b200"),
    ("NVIDIA H200", "h200-sxm-141gb"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"),
    ("NVIDIA H100 PCIe", "h100-pcie-80gb"),  # not the SXM part's NVSwitch node and 989.4 TFLOP/s
    ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),  # not the SXM part's NVSwitch node
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-80gb"),  # the PCIe node; calibrate measures its 40 GB
    ("NVIDIA H800", "h800-sxm-80gb"),  # the export-market SXM parts (their PCIe cards have no profile)
    ("NVIDIA H800 80GB HBM3", "h800-sxm-80gb"),
    ("NVIDIA A800-SXM4-80GB", "a800-sxm-80gb"),
    ("NVIDIA H100 NVL", "h100-nvl-94gb"),  # its own bridged-pair PCIe node, no longer the SXM part's
    ("NVIDIA H20", "h20-96gb"),  # not h200's, whose name holds its
    ("NVIDIA GH200 480GB", "gh200-96gb"),  # not h200's, which its name holds
    ("NVIDIA GH200 144G HBM3e", "gh200-144gb"),  # the HBM3e superchip's own profile, not the 96 GB part's
    ("NVIDIA H20-3e", "h20-3e-141gb"),  # the 141 GB H20: matched before "h20", which its name holds
    ("AMD Instinct MI355X", "mi355x"),
    ("AMD Instinct MI325X", "mi325x"),
    ("AMD Instinct MI300X", "mi300x"),
    ("NVIDIA L40S", "l40s"),
])
def test_the_base_profile_follows_the_gpu_name(device, base):
    from planner.calibrate import base_for_device
    assert base_for_device(device) == (base, True)
    assert base_for_device("NVIDIA RTX 6000 Ada Generation") == ("h100-sxm-80gb", False)  # no profile: the default


def test_the_probe_width_script_measures_both_shapes():
    """benchmarks/host_probe_width.py (a device call's question: does the probe's block width set its reading of
    full recompute?) on the CPU runtime at tiny shapes: both shapes, both modes, a reading each, and the ratio line."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "host_probe_width", Path(__file__).resolve().parents[1] / "benchmarks" / "host_probe_width.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    seen = []
    rows = mod.measure("cpu", mod.CPU_SHAPES, steps=4, repeats=1, on_row=lambda rows: seen.append(len(rows)))
    assert [(r["shape"], r["blocks"], r["recompute"]) for r in rows] == (
        [(s, [2, 10], m) for s in mod.CPU_SHAPES for m in mod.MODES] + [("wider", [10, 24], m) for m in mod.MODES])
    assert seen == [2, 4, 6]  # each probe's rows handed on as it finishes
    # a reading each, never negative (host_block_estimate clamps at 0); not "> 0": at 1 pair of 4 steps on a loaded
    # 2-core CI machine the 10-block run once timed below the 2-block one (CI, 2026-12-05), which is noise, not a bug
    assert all(isinstance(r["host_block_s"], float) and r["host_block_s"] >= 0 for r in rows)
    text = mod.render(rows, "cpu", 1)
    assert "median of 1 pairs" in text and text.count("| probe |") == 2 and text.count("| 10 to 24 |") == 2
    # a ratio line wherever the readings it divides are all above zero (a clamped 0 there has no ratio: CI,
    # 2026-12-05, read the wider 10-to-24 full-recompute run at 0.00 ms)
    at = {(r["shape"], tuple(r["blocks"]), r["recompute"]): r["host_block_s"] for r in rows}
    narrow, wide = mod.CPU_SHAPES
    ratios = all(at[(s, (2, 10), m)] > 0 for s in mod.CPU_SHAPES for m in mod.MODES)
    assert ("Wide over narrow: none " in text) == ratios
    longer = all(at[("wider", (10, 24), m)] > 0 and at[(wide, (2, 10), m)] > 0 for m in mod.MODES)
    assert ("10 to 24 blocks over 2 to 10 (wider): none " in text) == longer
    assert mod.SHAPES["probe"] == mod.PROBE_SHAPE and mod.SHAPES["llama-1.3b"]["hidden"] == 2048



def test_the_moe_probes_line_is_through_its_two_expert_counts():
    """host_moe_block_s and host_moe_expert_s from the MoE probe's two readings: the line through them; a slope that
    noise made negative is none (the mean of the two), and an intercept below zero is zero."""
    from planner.calibrate import moe_host_line
    block, expert = moe_host_line({4: {"none": 5e-3, "full": 8e-3}, 16: {"none": 11e-3, "full": 20e-3}})
    assert expert == pytest.approx({"none": 0.5e-3, "full": 1e-3}) and block == pytest.approx({"none": 3e-3, "full": 4e-3})
    block, expert = moe_host_line({4: {"none": 5e-3}, 16: {"none": 4e-3}})
    assert expert == {"none": 0.0} and block == pytest.approx({"none": 4.5e-3})
    block, expert = moe_host_line({4: {"none": 1e-3}, 16: {"none": 13e-3}})
    assert block == {"none": 0.0} and expert == pytest.approx({"none": 1e-3})


def test_host_only_measures_the_moe_probe_and_writes_its_line(tmp_path, monkeypatch):
    """--host-only runs the MoE probe (MOE_PROBE_SHAPE at each of MOE_PROBE_EXPERTS, balanced routing) beside the dense
    one and writes host_moe_block_s / host_moe_expert_s, named in the sources; a probe that fails leaves them out with
    a note, and a base's values from another host are dropped, as host_block_fp8_s's are."""
    import io

    from rich.console import Console

    import planner.calibrate as cal
    seen = []

    def fake(device_type, steps=12, advance=None, modes=cal.HOST_MODES, shape=None, compiled=None, **kw):
        seen.append((tuple(modes), dict(shape or {}), compiled))
        e = (shape or {}).get("experts")
        base = 3e-3 if compiled is False else 2e-3
        return {m: (base if e is None else 4e-3 + e * 0.25e-3) * (2 if m == "full" else 1) for m in modes}
    monkeypatch.setattr(cal, "measure_host_block", fake)
    path, prof, _ = cal.calibrate_host(out=str(tmp_path / "h.toml"), base="h100-sxm-80gb", device="cpu",
                                       console=Console(file=io.StringIO()), modes=("none",))
    assert [s for s in seen if s[1]] == [(cal.HOST_MOE_MODES, {**cal.MOE_PROBE_SHAPE, "experts": e}, None)
                                         for e in cal.MOE_PROBE_EXPERTS]
    assert (cal.HOST_MOE_MODES, {}, False) in seen  # the dense probe uncompiled
    assert prof.host_block_eager_s == pytest.approx({"none": 3e-3, "full": 6e-3})
    assert prof.host_moe_block_s == pytest.approx({"none": 4e-3, "full": 8e-3})
    assert prof.host_moe_expert_s == pytest.approx({"none": 0.25e-3, "full": 0.5e-3})
    assert any("a mixture of experts' block, eager" in x and "4.00 ms + 0.250 ms an expert" in x
               and "uncompiled (host_block_eager_s) none 3.00 ms" in x for x in prof.sources)

    def failing(device_type, steps=12, advance=None, modes=cal.HOST_MODES, shape=None, compiled=None, **kw):
        if shape and shape.get("experts"):
            raise cal.CalibrationError("probe failed")
        return {m: 2e-3 for m in modes}
    monkeypatch.setattr(cal, "measure_host_block", failing)
    _, again, _ = cal.calibrate_host(out=str(tmp_path / "h2.toml"), base=str(path), device="cpu",
                                     console=Console(file=io.StringIO()), modes=("none",))
    assert again.host_moe_block_s == {} and again.host_moe_expert_s == {}
    assert any("mixture of experts' block not measured" in x for x in again.sources)
    assert any("host_moe_block_s dropped" in x for x in again.sources)


def test_the_moe_probe_runs_parplans_eager_moe_on_cpu():
    """measure_moe_host_block on this CPU (one pair of tiny runs a mode and expert count): a reading for none and full,
    never negative (its values are the CPU runtime's, not a GPU host's)."""
    from planner.calibrate import measure_moe_host_block
    block, expert, note = measure_moe_host_block("cpu", steps=3, repeats=1)
    assert note is None and set(block) == set(expert) == {"none", "full"}
    assert all(v >= 0 for v in (*block.values(), *expert.values()))



def test_the_committed_moe_host_line_is_as_the_docs_state():
    """benchmarks/results/2026-12-06-cpu-moe-host: the MoE probe at 2-32 experts and the dense block of its width on
    this CPU, scored (score()) against the calibrate's line through 4 and 16: the committed page and docs/cost-model.md's
    median and max, and the dense block's over-reading at one expert, are the readings'."""
    import importlib.util
    import statistics
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("moe_host_line", root / "benchmarks" / "moe_host_line.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = root / "benchmarks" / "results" / "2026-12-06-cpu-moe-host"
    at = {int(k): v for k, v in json.loads((res / "moe_host_line.json").read_text()).items()}
    rows = mod.score(at)
    assert (res / "moe_host_line.md").read_text().split("\n", 2)[2] == mod.markdown(rows, "cpu", 12, 3).split("\n", 2)[2]
    held = [abs(r["error"]) for r in rows if not r["fitted"] and r["experts"]]
    readme = " ".join((root / "docs" / "cost-model.md").read_text().split())  # the README's "What it models" in full
    assert len(held) == 6 and f"median {statistics.median(held):.1%}, max {max(held):.1%}".replace("%", " %") in readme
    dense = {r["mode"]: r["error"] for r in rows if r["experts"] == mod.DENSE}
    assert (f"over-reads the dense block of the probe's width by {dense['none']:.0%} (none) and {dense['full']:.0%} "
            "(full)").replace("%", " %") in readme


def test_the_summary_table_names_the_uncompiled_and_moe_readings():
    """calibrate's table shows the base's and the new profile's host readings, the uncompiled block's and the MoE
    line's among them, in ms ("-" where a profile has none)."""
    from planner.calibrate import summary_rows
    base = hardware_profiles.load_profile("h100-sxm-80gb")
    prof = base.model_copy(update={"host_block_eager_s": {"none": 3e-3, "full": 6e-3},
                                   "host_moe_block_s": {"none": 4e-3, "full": 8e-3},
                                   "host_moe_expert_s": {"none": 2.5e-4, "full": 5e-4}})
    rows = {r[0]: r[1:] for r in summary_rows(base, prof, {})}
    assert rows["uncompiled (none/full)"] == ("-", "3.00 / 6.00")
    assert rows["MoE block + an expert (none/full)"] == ("- + -", "4.00 / 8.00 + 0.250 / 0.500")


def test_the_optimizer_probe_fits_the_cost_models_form():
    """calibrate's optimizer probe (measure_optimizer: parplan's clip and master-weights AdamW step on a few large
    and many small tensors) gives optimizer_bandwidth_fraction and optimizer_host_per_tensor_s in the form the cost
    model prices the step (passes / f + tensors x h), solved as calibrate --from-run solves the launches' after-phase:
    a synthetic machine's f and h come back; the clamps hold; the CPU probe's two rows fit a fraction in (0, 1]."""
    import torch

    from planner.calibrate import _Timer, measure_optimizer, optimizer_fit, solve_optimizer
    f, h = solve_optimizer([(p, n, p / 0.8 + n * 20e-6) for p, n in ((0.004, 8), (1e-5, 1024), (0.02, 200))])
    assert f == pytest.approx(0.8) and h == pytest.approx(20e-6)
    assert solve_optimizer([(0.004, 8, 0.003), (1e-5, 1024, 0.001)])[0] == 1.0  # faster than the passes: f <= 1
    f, h = solve_optimizer([(0.004, 8, 0.005), (0.008, 8, 0.0098)])  # (the tensors' share unresolvable: h >= 0)
    assert h >= 0 and 0 < f <= 1
    dev = torch.device("cpu")
    rows = measure_optimizer(torch, dev, _Timer(torch, dev, warmup=1, reps=2, sample_s=1e-3))
    assert [(r["tensors"], r["params"]) for r in rows] == [(4, 4 << 19), (256, 256 << 8)] and all(r["s"] > 0 for r in rows)
    f, h = optimizer_fit(rows, hardware_profiles.load_profile("h100-sxm-80gb").model_dump(mode="json"))
    assert 0 < f <= 1 and h >= 0
