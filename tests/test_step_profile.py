"""parallel_layers.step_profile (launch --profile): one span under torch.profiler, its tables and trace."""
from __future__ import annotations

import gzip
import json

import pytest
import torch

from parallel_layers import step_profile, train


def test_a_profiled_span_writes_its_operators_and_trace(tmp_path):
    a = torch.randn(64, 64)
    prof = step_profile.start("cpu")
    for _ in range(5):
        a = torch.tanh(a @ a)
    s = step_profile.finish(prof, str(tmp_path / "prof"), 3, 7, 0.25, "cpu")
    assert s["step"] == 7 and s["wall_s"] == 0.25 and s["device_busy_s"] is None and s["top_device_op"] is None
    assert s["files"] == [str(tmp_path / "prof" / f"rank3.{e}") for e in ("ops.md", "ops.json", "trace.json.gz")]
    ops = json.loads((tmp_path / "prof" / "rank3.ops.json").read_text())
    by_name = {o["name"]: o for o in ops["ops"]}
    assert by_name["aten::mm"]["calls"] == 5 and by_name["aten::tanh"]["calls"] == 5
    assert by_name["aten::mm"]["self_host_us"] > 0 and by_name["aten::mm"]["self_device_us"] == 0
    assert ops["host_self_s"] == pytest.approx(sum(o["self_host_us"] for o in ops["ops"]) / 1e6)
    md = (tmp_path / "prof" / "rank3.ops.md").read_text()
    assert "Rank 3, step 7" in md and "| aten::mm | 5 |" in md and "kernels by device time" not in md  # cpu: one table
    assert {o["kind"] for o in ops["ops"]} <= {"op", "range"}
    with gzip.open(tmp_path / "prof" / "rank3.trace.json.gz") as f:
        assert any(e.get("name") == "aten::mm" for e in json.load(f)["traceEvents"])


def _row(name, dev_us, host_us, calls=1, kind="kernel"):
    return {"kind": kind, "name": name, "calls": calls, "self_device_us": dev_us, "device_us": dev_us, "self_host_us": host_us,
            "host_us": host_us}


@pytest.mark.parametrize("busy_ms,says", [(900.0, "the GPU's work holds the step up"),
                                          (300.0, "the GPU waits for the host")])
def test_the_device_summary_says_which_side_held_the_step(busy_ms, says):
    rows = [_row("triton_red_fused_amax_0", busy_ms * 1e3 * 2 / 3, 50.0, calls=100),
            _row("sm90_xmma_gemm", busy_ms * 1e3 / 3, 0.0),
            # a host operator's self device time is its kernels' again: in neither the sum nor the kernel table
            _row("aten::mm", busy_ms * 1e3 / 3, 900.0, kind="op")]
    s = step_profile.summary(rows, 1.0, 4, "cuda")
    assert s["device_busy_s"] == pytest.approx(busy_ms / 1e3) and s["device_busy_fraction"] == pytest.approx(busy_ms / 1e3)
    assert s["top_device_op"] == {"name": "triton_red_fused_amax_0", "calls": 100,
                                  "self_device_s": pytest.approx(busy_ms / 1e3 * 2 / 3)}
    md = step_profile.markdown(rows, s, 0)
    assert says in md and "## Top 25 kernels by device time" in md
    device_table, host_table = md.split("## Top 25 kernels by device time")[1].split("## Top 25 host operators")
    assert "aten::mm" not in device_table and "| aten::mm | 1 |" in host_table and "sm90" not in host_table
    assert s["host_self_s"] == pytest.approx(900e-6)


def test_the_runtime_refuses_profile_with_the_cpu_allocator_trace():
    with pytest.raises(SystemExit):
        train.parse_args(["--plan", "p.json", "--device", "cpu", "--profile", "a", "--memory-snapshot", "b"])
    assert train.parse_args(["--plan", "p.json", "--device", "cpu", "--profile", "a"]).profile == "a"


def _profile_diff():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "profile_diff.py"
    spec = importlib.util.spec_from_file_location("profile_diff", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_profile_diff_puts_the_largest_differences_first(tmp_path, capsys):
    """benchmarks/profile_diff.py on two ops.json files: the steps' totals, then kernels and host operators by the
    size of B - A, a kernel only one step ran included; a file that is no profile is one error line."""
    diff = _profile_diff()
    twin = {"step": 13, "wall_s": 0.152, "device_busy_s": 0.140, "host_self_s": 0.080,
            "ops": [_row("sm90_gemm_bf16", 100e3, 0.0, calls=168), _row("triton_poi_fused_add", 20e3, 0.0, calls=96),
                    _row("aten::mm", 100e3, 5e3, calls=168, kind="op")]}
    fp8 = {"step": 7, "wall_s": 1.020, "device_busy_s": 0.990, "host_self_s": 0.700,
           "ops": [_row("sm90_gemm_fp8", 60e3, 0.0, calls=168), _row("triton_red_fused_amax", 850e3, 0.0, calls=700),
                   _row("triton_poi_fused_add", 21e3, 0.0, calls=96),
                   _row("aten::_scaled_mm", 60e3, 30e3, calls=168, kind="op")]}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(twin))
    b.write_text(json.dumps(fp8))
    assert diff.main([str(a), str(b), "--top", "3", "--out", str(tmp_path / "d.md")]) == 0
    out = capsys.readouterr().out
    assert out == (tmp_path / "d.md").read_text()
    assert "| step wall ms | 152.0 | 1020.0 | +868.0 |" in out and "| GPU busy ms (kernels) | 140.0 | 990.0 | +850.0 |" in out
    kernels = out.split("## Kernels")[1].split("## Host")[0]
    rows = [ln.split("|")[1].strip() for ln in kernels.splitlines() if ln.startswith("| ") and "name" not in ln]
    assert rows == ["triton_red_fused_amax", "sm90_gemm_bf16", "sm90_gemm_fp8"]  # the top 3 by |B - A|
    assert "| triton_red_fused_amax | 0 | 0.000 | 700 | 850.000 | +850.000 |" in kernels
    host = out.split("## Host operators")[1]
    assert "| aten::_scaled_mm | 0 | 0.000 | 168 | 30.000 | +30.000 |" in host and "sm90" not in host
    a.write_text("{}")
    with pytest.raises(SystemExit, match="is not a profiled step's ops.json"):
        diff.main([str(a), str(b)])


def test_a_profiler_that_fails_leaves_the_run_and_says_why(tmp_path, monkeypatch):
    """A profiler that cannot start (no CUPTI on a GPU host, another profiler running) or whose tables fail: the
    measured steps are done, so the run goes on and the report's profile says why there are no tables."""
    from planner.launch import profile_line

    def broken(**kw):
        raise RuntimeError("CUPTI could not be loaded\nmore")
    monkeypatch.setattr(step_profile, "profile", broken)
    why = step_profile.start("cuda")
    assert why == "RuntimeError: CUPTI could not be loaded"
    p = step_profile.finish(why, str(tmp_path / "p"), 0, 5, 0.5, "cuda")
    assert p == {"step": 5, "wall_s": 0.5, "error": "the profiler did not start: RuntimeError: CUPTI could not be loaded"}
    assert not (tmp_path / "p").exists()
    assert profile_line({"profile": p}) == ("profiled step 5 (rank 0, not in the medians): 500.0 ms; no tables: the "
                                            "profiler did not start: RuntimeError: CUPTI could not be loaded")
    monkeypatch.undo()
    prof = step_profile.start("cpu")
    monkeypatch.setattr(step_profile, "op_rows", lambda prof: 1 / 0)
    assert step_profile.finish(prof, str(tmp_path / "q"), 0, 6, 0.25, "cpu")["error"] == \
        "profiling failed: ZeroDivisionError: division by zero"
