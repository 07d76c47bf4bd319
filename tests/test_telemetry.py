"""parallel_layers.telemetry: nvidia-smi's SM clock, power and temperature per training step (rank 0), here from a
fake nvidia-smi on the PATH (this machine has no GPU), and `parplan launch`'s line for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parallel_layers.telemetry import GpuTelemetry, per_step
from planner.launch import telemetry_line

ROOT = Path(__file__).resolve().parents[1]


def _fake_smi(tmp_path: Path, lines: list[str], period: float = 0.02) -> Path:
    """A directory holding an `nvidia-smi` that prints `lines` every `period` seconds until killed (as -lms does)."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    exe = d / "nvidia-smi"
    body = "".join(f"  echo '{line}'\n" for line in lines)
    exe.write_text(f"#!/bin/bash\nwhile true; do\n{body}  sleep {period}\ndone\n")
    exe.chmod(0o755)
    return d


def test_per_step_takes_the_samples_inside_each_step_or_the_nearest():
    samples = [(0.0, 1980, 300, 40), (0.5, 1900, 650, 50), (1.0, 1800, 700, 60), (1.5, 1700, 700, 70)]
    spans = [(0.4, 1.1), (1.2, 1.3), (2.0, 2.2), (5.0, 6.0)]
    got = per_step(samples, spans)
    assert got[0] == {"sm_mhz": 1850, "power_w": 675, "temp_c": 55}  # the two samples inside
    assert got[1] == {"sm_mhz": 1800, "power_w": 700, "temp_c": 60}  # none inside: the nearest to 1.25 (1.0)
    assert got[2] == {"sm_mhz": 1700, "power_w": 700, "temp_c": 70}  # the nearest, 0.5 s before the step
    assert got[3] == {}  # the nearest is 3.5 s away: no reading of this step
    assert per_step([], spans) == [{}, {}, {}, {}]


def test_sampler_reads_its_gpu_by_uuid_and_skips_what_it_cannot_parse(tmp_path, monkeypatch):
    bindir = _fake_smi(tmp_path, ["GPU-aaaa-1111, 1980, 650.5, 45", "GPU-bbbb-2222, 1410, 300.0, 38",
                                  "GPU-aaaa-1111, [N/A], 650.5, 45"])
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    tel = GpuTelemetry(uuid="aaaa-1111", interval_ms=20)
    assert tel.start()
    time.sleep(0.3)
    got = tel.stop()
    assert got and all(s[1:] == (1980.0, 650.5, 45.0) for s in got)
    assert [s[0] for s in got] == sorted(s[0] for s in got)
    # two GPUs listed and none named: no single GPU's trace
    tel = GpuTelemetry(uuid=None, interval_ms=20)
    assert tel.start()
    time.sleep(0.2)
    assert tel.stop() == []
    # one GPU listed: its samples, whatever uuid torch gave (its formatting may differ from nvidia-smi's)
    (tmp_path / "one").mkdir()
    one = _fake_smi(tmp_path / "one", ["GPU-cccc, 1755, 500, 50"])
    monkeypatch.setenv("PATH", f"{one}{os.pathsep}{os.environ['PATH']}")
    tel = GpuTelemetry(uuid="something-else", interval_ms=20)
    assert tel.start()
    time.sleep(0.2)
    assert tel.stop()[0][1:] == (1755.0, 500.0, 50.0)


def test_no_nvidia_smi_means_no_sampler(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert GpuTelemetry().start() is False


@pytest.mark.multirank
def test_a_run_records_the_clock_per_step_and_launch_prints_it(tmp_path):
    """A one-rank CPU run with telemetry forced on and a fake nvidia-smi: every step carries the clock, the report's
    median has it, and launch's summary line reads it."""
    from planner.calibrate import _host_probe_plan
    plan = tmp_path / "plan.json"
    plan.write_text(_host_probe_plan(2, "none", "cpu").model_dump_json())
    report = tmp_path / "report.json"
    bindir = _fake_smi(tmp_path, ["GPU-dddd, 1980, 640, 44"])
    code = ("import os; os.environ.update(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', LOCAL_WORLD_SIZE='1', "
            "MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT']); "
            "from parallel_layers.train import RunOptions, run_plans; "
            f"run_plans('cpu', [({str(plan)!r}, RunOptions(steps=4, device='cpu', telemetry=True), {str(report)!r})])")
    from tests.runtime_helpers.two_ranks import PORT_TRIES, free_port
    for _ in range(PORT_TRIES):  # a port taken between free_port and the rank's bind: a fresh one (two_ranks.py)
        env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "PORT": str(free_port()),
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        job = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        if job.returncode == 0 or "EADDRINUSE" not in job.stderr:
            break
    assert job.returncode == 0, job.stderr[-2000:]
    rep = json.loads(report.read_text())
    assert all(st["sm_mhz"] == 1980 and st["power_w"] == 640 and st["temp_c"] == 44 for st in rep["steps"])
    assert rep["median"]["sm_mhz"] == 1980
    line = telemetry_line(rep)
    assert line == ("GPU (rank 0, nvidia-smi; first timed step / median / last): SM clock 1980 / 1980 / 1980 MHz, "
                    "power 640 / 640 / 640 W, 44 / 44 / 44 C")
    # without it (a CPU run's default): no clock fields, no line
    rep["steps"] = [{k: v for k, v in st.items() if k not in ("sm_mhz", "power_w", "temp_c")} for st in rep["steps"]]
    assert telemetry_line(rep) is None


def test_gpu_accuracy_shows_the_clock_where_the_reports_carry_it(tmp_path):
    """gpu_accuracy.py's per-run table gains an SM MHz column when a session's reports carry the clock (the committed
    sessions do not, and their tables regenerate unchanged: tests/test_gpu_results.py)."""
    import shutil
    src = ROOT / "benchmarks" / "results" / "2026-11-28-h200"
    dst = tmp_path / "2026-11-28-h200"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.md", "host"))
    rep_path = dst / "grid" / "llama-3b-mbs4-full" / "report.json"
    rep = json.loads(rep_path.read_text())
    rep["steps"] = [dict(st, sm_mhz=1700 + 10 * i) for i, st in enumerate(rep["steps"])]
    rep_path.write_text(json.dumps(rep))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_accuracy
    finally:
        sys.path.pop(0)
    lines, _ = gpu_accuracy.build_session(dst)
    header = lines[0].split(" | ")
    assert "SM MHz" in header
    col = header.index("SM MHz")
    rows = {line.split(" | ")[1]: line.split(" | ") for line in lines[2:] if line.startswith("| grid |")}
    after = [1700 + 10 * i for i in range(len(rep["steps"]))][rep["warmup_steps"]:]
    import statistics
    assert gpu_accuracy.measured(rep)["sm_mhz"] == statistics.median(after)
    assert rows["llama-3b-mbs4-full"][col] == f"{statistics.median(after):.0f}"
    assert rows["llama-0.5b-mbs1-none"][col] == "-"
    assert all(len(r) == len(header) for r in rows.values())


def test_query_once_reads_one_gpu_now(tmp_path, monkeypatch):
    """calibrate --sustained's one reading a window: the same uuid rules as the sampler, one nvidia-smi call."""
    from parallel_layers.telemetry import query_once
    d = tmp_path / "bin"
    d.mkdir()
    exe = d / "nvidia-smi"
    exe.write_text("#!/bin/bash\necho 'GPU-aaaa-1111, 1980, 650.5, 45'\necho 'GPU-bbbb-2222, 1410, [N/A], 38'\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    assert query_once("aaaa-1111") == (1980.0, 650.5, 45.0)
    assert query_once("GPU-AAAA-1111") == (1980.0, 650.5, 45.0)  # either spelling of the uuid
    assert query_once("bbbb-2222") is None  # listed, its line unreadable: not another GPU's reading instead
    assert query_once(None) is None  # two GPUs listed, none named
    monkeypatch.setenv("PATH", str(tmp_path))
    assert query_once("aaaa-1111") is None
