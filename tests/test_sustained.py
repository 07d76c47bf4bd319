"""`calibrate --sustained`: the best GEMM run back to back, its steady throughput over the isolated one written as the
profile's sustained_matmul_fraction (CPU here: the mechanics, not a GPU's clocks); benchmarks/sustained_drift.py,
which reads a device call's long run, and benchmarks/sustained_gap.py, whose committed output regenerates."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

import hardware_profiles
from planner.calibrate import _gpu_telemetry, measure_sustained, sustained_note
from planner.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    """A script under benchmarks/, imported with that folder on the path (the scripts import each other)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.pop(0)
    return mod


def test_measure_sustained_on_the_cpu():
    import torch
    dev = torch.device("cpu")
    # an isolated rate far below what even a loaded 2-core CPU does (1e-4 TFLOP/s): the fraction is capped at 1
    row = {"m": 256, "k": 256, "n": 512, "tflops": 1e-4}
    sus = measure_sustained(torch, dev, row, "fp32", seconds=0.3, window_s=0.05)
    assert len(sus["windows"]) >= 2
    assert all(w["tflops"] > 0 and "sm_mhz" not in w for w in sus["windows"])  # no telemetry on a CPU
    assert [w["t_s"] for w in sus["windows"]] == sorted(w["t_s"] for w in sus["windows"])
    assert sus["windows"][-1]["t_s"] >= 0.3
    assert sus["fraction"] == 1.0 and sus["steady_tflops"] > 1e-4
    # steady is the median of the last third of the windows
    rates = [w["tflops"] for w in sus["windows"]]
    tail = sorted(rates[len(rates) - max(1, len(rates) // 3):])
    mid = len(tail) // 2
    assert sus["steady_tflops"] == pytest.approx(tail[mid] if len(tail) % 2 else (tail[mid - 1] + tail[mid]) / 2)
    # an isolated rate above what a small CPU sustains (0.5 TFLOP/s): fraction = steady / isolated (capped at 1)
    fast = measure_sustained(torch, dev, {**row, "tflops": 0.5}, "fp32", seconds=0.1, window_s=0.005)
    assert fast["fraction"] == pytest.approx(min(1.0, fast["steady_tflops"] / 0.5), rel=1e-12)
    assert _gpu_telemetry(torch, dev) is None
    note = sustained_note(sus)
    assert "256x256x512" in note and "sustained_matmul_fraction 1" in note and "nvidia-smi" not in note


def test_sustained_note_reads_the_clocks():
    ws = [{"t_s": i, "tflops": 700 - 10 * i, "sm_mhz": 1980 - 40 * i, "power_w": 500 + 20 * i, "temp_c": 40 + 5 * i}
          for i in range(6)]
    sus = {"shape": {"m": 8, "k": 8, "n": 8}, "dtype": "bf16", "seconds": 6, "isolated_tflops": 720.0,
           "first_tflops": 700.0, "steady_tflops": 655.0, "fraction": 655 / 720, "windows": ws}
    note = sustained_note(sus)
    # the last third (windows 4 and 5): medians of 1820/1780 MHz, 580/600 W, 60/65 C
    assert "SM clock 1980 -> 1800 MHz" in note and "power 500 -> 590 W" in note and "62 C" in note
    assert "sustained_matmul_fraction 0.91" in note


def test_calibrate_sustained_writes_the_measured_fraction(tmp_path):
    path = tmp_path / "c.toml"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["calibrate", "--device", "cpu", "--quick", "--sustained", "0.5", "--out", str(path)])
    assert rc == 0, err.getvalue()
    prof = hardware_profiles.load_profile(path)
    base = hardware_profiles.load_profile("h100-sxm-80gb")
    assert 0 < prof.sustained_matmul_fraction <= 1
    assert "--sustained 0.5" in prof.measured
    # measured now: the base's "fitted" source for it is gone, and the calibrate line says how it was measured
    assert not any(s.startswith("[fitted] sustained_matmul_fraction") for s in prof.sources)
    assert any(s.startswith("[fitted] sustained_matmul_fraction") for s in base.sources)
    line = next(s for s in prof.sources if "sustained:" in s)
    assert f"sustained_matmul_fraction {prof.sustained_matmul_fraction:.3g}" in line
    assert any(f"{base.sustained_matmul_fraction:g} -> {prof.sustained_matmul_fraction:g}, measured" in s
               for s in prof.sources)


def test_drift_and_smi_trace(tmp_path):
    drift = _script("sustained_drift")
    steps = [{"step_time_s": 0.5}] * 2 + [{"step_time_s": 0.30}] * 20 + [{"step_time_s": 0.33}] * 10 + \
        [{"step_time_s": 0.345}] * 15
    d = drift.drift(steps, warmup=2)
    assert d["steps"] == 45 and d["first_s"] == 0.30 and d["last_s"] == 0.345
    assert d["slowdown"] == pytest.approx(0.15)
    assert d["fifths_s"] == [0.30, 0.30, 0.33, 0.345, 0.345]  # steps 0-8, 9-17, 18-26, 27-35, 36-44
    with pytest.raises(ValueError):
        drift.drift(steps[:20], warmup=2)
    csv = tmp_path / "smi.csv"
    csv.write_text("timestamp, clocks.sm [MHz], power.draw [W], temperature.gpu\n"
                   "2026/12/01 10:00:00.000, 345, 70.1, 30\n"  # idle: below half the top power, not the load
                   + "".join(f"2026/12/01 10:00:{i:02d}.000, {1980 - 20 * i}, {600 + 5 * i}, {35 + i}\n"
                             for i in range(1, 10)))
    t = drift.smi_trace(csv)
    assert t["samples"] == 9 and t["first"] == (1960.0, 605.0, 36.0)
    assert t["last"] == (1820.0, 640.0, 43.0)  # samples 7-9: medians of the last third
    assert t["fifths"][0] == (1960.0, 605.0, 36.0) and t["fifths"][-1] == (1810.0, 642.5, 43.5)
    assert drift.smi_trace(tmp_path / "none.csv") is None


def test_drift_report_on_a_long_run(tmp_path):
    """build() on a results folder laid out as long_run writes it: a slowing run reads as its slowdown, and the
    prediction is the folder's calibrated profile's."""
    drift = _script("sustained_drift")
    src = ROOT / "benchmarks" / "results" / "2026-11-28-h200"
    rep = json.loads((src / "grid" / "llama-3b-mbs4-full" / "report.json").read_text())
    base = rep["steps"][-1]
    rep["steps"] = [dict(base, step=i, step_time_s=0.36 if i < 40 else 0.396) for i in range(60)]
    (tmp_path / "long" / "llama-3b-mbs4-none").mkdir(parents=True)
    (tmp_path / "long" / "llama-3b-mbs4-none" / "report.json").write_text(json.dumps(rep))
    (tmp_path / "h200-calibrated.toml").write_text((src / "h200-calibrated.toml").read_text())
    text = "\n".join(drift.build(tmp_path))
    assert "| llama-3b-mbs4-none | 58 |" in text and "| +10.0% |" in text
    assert "kept from the base profile" in text  # that calibrate ran without --sustained
    assert "- llama-3b-mbs4-none: step ms by fifth of the timed steps 360.0 / 360.0 / 360.0 / 396.0 / 396.0" in text
    # the calibrated profile's prediction, made here without the script's helper
    from hardware_profiles import load_profile
    from planner.core import evaluate_plan
    from planner.schema import Plan
    prof = load_profile(str(tmp_path / "h200-calibrated.toml"))
    pred = evaluate_plan(Plan(**rep["plan"]), profile=prof).prediction.step_time_s
    datasheet = evaluate_plan(Plan(**rep["plan"]), profile=load_profile("h200-sxm-141gb")).prediction.step_time_s
    assert pred != pytest.approx(datasheet, rel=0.01)  # so the page shows which profile it used
    assert "| - | - | - |" in text  # no clocks: neither per step nor a csv
    # the run's own per-step clocks (launches since telemetry) fill the clock columns
    rep["steps"] = [dict(st, sm_mhz=1980 if st["step"] < 40 else 1755, power_w=700, temp_c=50 + st["step"] // 10)
                    for st in rep["steps"]]
    (tmp_path / "long" / "llama-3b-mbs4-none" / "report.json").write_text(json.dumps(rep))
    text = "\n".join(drift.build(tmp_path))
    assert "| 1980 -> 1755 | 700 -> 700 | 50 -> 55 |" in text
    assert f"| {pred * 1e3:.1f} | {pred / 0.36 - 1:+.1%} | {pred / 0.396 - 1:+.1%} |" in text


def test_committed_sustained_gap_regenerates(tmp_path, monkeypatch):
    """docs/accuracy.md's numbers on the sustained-fraction gap are benchmarks/sustained_gap.py's output for this checkout's
    cost model and the committed launches and profiles."""
    gap = _script("sustained_gap")
    out = tmp_path / "g.md"
    monkeypatch.setattr(sys, "argv", ["sustained_gap.py", "--out", str(out)])
    gap.main()
    assert out.read_text() == (ROOT / "benchmarks" / "results" / "sustained_gap.md").read_text()


def test_committed_gemm_shape_gap_regenerates(tmp_path, monkeypatch):
    """docs/accuracy.md's numbers on GEMM shape and the H100 fraction gap are benchmarks/gemm_shape_gap.py's output for this
    checkout's cost model and the committed GEMM measurements and reference sets."""
    gap = _script("gemm_shape_gap")
    out = tmp_path / "s.md"
    monkeypatch.setattr(sys, "argv", ["gemm_shape_gap.py", "--out", str(out)])
    gap.main()
    text = out.read_text()
    assert text == (ROOT / "benchmarks" / "results" / "gemm_shape_gap.md").read_text()
    readme = (ROOT / "docs" / "accuracy.md").read_text()  # the README's "How accurate" in full
    assert "scales the GEMM time by 0.981\n(0.964–1.006) on the Megatron-Core rows" in readme
    assert "r is 0.981 (median; 0.964 … 1.006) on the Megatron-Core rows" in text and "gap +0.096, 8% closed" in text


def test_device_scripts_run_the_long_run_and_the_sustained_calibrate():
    """The device scripts' long run names a grid entry that exists (a typo would spend the call's minute on an
    argparse error), the H200 call measures the sustained fraction and probes the host at the launches' width, and
    every grid entry either call names exists."""
    import re
    grid = _script("gpu_grid")
    names = dict(grid.grid())
    start = (ROOT / "benchmarks" / "gpu_call_start.sh").read_text()
    only = re.search(r"long_run\(\) \{.*?--only (\S+)", start, re.S).group(1)
    assert only in names
    h200 = (ROOT / "benchmarks" / "gpu_h200.sh").read_text()
    assert re.search(r'BASE=h200-sxm-141gb .*CALIBRATE_ARGS="--sustained \d+"', h200)
    assert "calibrate --base \"$BASE\" $CALIBRATE_ARGS" in (ROOT / "benchmarks" / "gpu_calibrated_call.sh").read_text()
    # the H200 call's long run answered its question on 2026-12-04 (no slowdown over 58 s); the H100 call keeps it.
    # The H200 call runs the FP8 diagnosis (fp8_diagnosis, shared with the H100 call) before the host-probe study, and
    # its grid through grid() after it, the 3B FP8 entry last
    assert "long_run " not in h200
    calls = [(m.start(), m.group(1).replace("\\", " ").split())
             for m in re.finditer(r'^grid "\$\(cap \d+(?: \d+)?\)" ((?:.|\\\n)*?)$(?<!\\)', h200, re.M)]
    assert h200.index("\nfp8_diagnosis\n") < h200.index("python3 benchmarks/host_probe_width.py") < calls[0][0]
    assert calls[-1][1][-1] == "llama-3b-mbs4-none-fp8"
    assert "long_run " in (ROOT / "benchmarks" / "gpu_next.sh").read_text()
    h100 = (ROOT / "benchmarks" / "gpu_next.sh").read_text()
    one_call = (ROOT / "benchmarks" / "gpu_h100.sh").read_text()
    h100_grid = [w for m in re.finditer(r'^grid "\$\(cap \d+(?: \d+)?\)" ((?:.|\\\n)*?)$(?<!\\)', one_call, re.M)
                 for w in m.group(1).replace("\\", " ").split()]
    for script, listed in (("gpu_h200.sh", [n for _, c in calls for n in c]), ("gpu_h100.sh", h100_grid),
                           ("gpu_next.sh", [w for block in re.findall(
                               r"gpu_grid\.py --out \"\$R/grid\".*?--only \\\n(.*?)2>&1", h100, re.S)
                               for w in block.replace("\\", " ").split()])):
        # every grid entry the calls name exists (an unknown one stops the grid)
        assert len(listed) >= 8 and all(n in names for n in listed), (script, [n for n in listed if n not in names])


def test_the_docs_quote_the_sustained_gap_as_generated():
    """docs/accuracy.md's sentence on the committed launches carries sustained_gap.md's own summary numbers."""
    import re
    md = (ROOT / "benchmarks" / "results" / "sustained_gap.md").read_text()
    n, own, own_max, one, within = re.search(
        r"(\d+) GPU-bound runs: median \|error\| ([\d.]+)% \(max ([\d.]+)%\) at the profiles' own fraction, ([\d.]+)% "
        r"\(max [\d.]+%\) at 1.0; within 5 % at 1.0: (\d+) of", md).groups()
    readme = " ".join((ROOT / "docs" / "accuracy.md").read_text().split())
    assert (f"their {n} GPU-bound runs of dense 16-bit plans (five sessions, each run predicted with its session's "
            "calibrated profile; parplan's FP8 and MoE runs of 2026-12-06 left out, their misses the runtime's) read a "
            f"median |error| of {own} % (max {own_max} %) at the profiles' own fraction (0.83; 0.845 and 0.891 as "
            f"2026-12-04's and 2026-12-06's calibrates measured it) and {one} % at 1.0, {within} of {n} within 5 %"
            ) in readme


def test_drift_skips_a_short_long_run_and_refuses_an_empty_folder(tmp_path, capsys):
    """A long run of fewer than 20 timed steps had raised drift()'s ValueError out of build(): a traceback, and the
    other runs' rows lost.  It is left out with a one-line note; a folder that is missing, has no long/ runs, or none
    long enough is one error line and exit 2, not an empty table."""
    drift = _script("sustained_drift")
    src = ROOT / "benchmarks" / "results" / "2026-11-28-h200"
    rep = json.loads((src / "grid" / "llama-3b-mbs4-full" / "report.json").read_text())
    base = rep["steps"][-1]
    for name, n in (("long-ok", 60), ("short", 12)):
        (tmp_path / "long" / name).mkdir(parents=True)
        (tmp_path / "long" / name / "report.json").write_text(
            json.dumps(dict(rep, steps=[dict(base, step=i, step_time_s=0.36) for i in range(n)])))
    assert drift.main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "| long-ok | 58 |" in out and "- short: skipped (10 timed steps: a drift needs at least 20)" in out
    assert err.strip() == f"note: {tmp_path / 'long' / 'short' / 'report.json'}: skipped, 10 timed steps: a drift needs at least 20"
    # with a profile to predict with, a report whose plan the cost model refuses is skipped too (it had raised)
    (tmp_path / "h200-calibrated.toml").write_text((src / "h200-calibrated.toml").read_text())
    (tmp_path / "long" / "bad-plan").mkdir()
    (tmp_path / "long" / "bad-plan" / "report.json").write_text(
        json.dumps(dict(rep, plan={"model": {}}, steps=[dict(base, step=i, step_time_s=0.36) for i in range(60)])))
    assert drift.main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "| long-ok | 58 |" in out and "- bad-plan: skipped (" in out and "Traceback" not in err
    (tmp_path / "h200-calibrated.toml").unlink()
    import shutil
    shutil.rmtree(tmp_path / "long" / "bad-plan")
    shutil.rmtree(tmp_path / "long" / "long-ok")
    for root, says in ((tmp_path, "no long run in"), (tmp_path / "missing", "is not a folder"),
                       (src, "no long runs in")):
        assert drift.main([str(root), "--out", str(tmp_path / "page.md")]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("error: ") and says in err, err
        assert not (tmp_path / "page.md").exists()


def test_attention_backends_probe_runs_and_its_result_is_committed(tmp_path):
    """benchmarks/attention_backends.py (the side-by-side of torch's SDPA kernels) at its CPU shapes: the math kernel,
    one row a length, the calibrate's FLOP count; its H200 run (2026-12-04's gpu_h200.sh) is committed, and the
    calibrate of the same call reads the cuDNN column (README, How accurate)."""
    probe = _script("attention_backends")
    out = tmp_path / "a.md"
    assert probe.main(["--device", "cpu", "--quick", "--out", str(out), "--json", str(tmp_path / "a.json")]) == 0
    text = out.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [ln.split("|")[1].strip() for ln in rows] == ["128", "256", "512"] and "| MATH |" in text
    data = json.loads((tmp_path / "a.json").read_text())
    assert all(r["tflops_causal"] > 0 for r in data["rows"]["MATH"])
    gpu = json.loads((ROOT / "benchmarks" / "results" / "2026-12-04-h200" / "attention_backends.json").read_text())
    cudnn = {r["seq"]: r["tflops_causal"] for r in gpu["rows"]["CUDNN_ATTENTION"]}
    flash = {r["seq"]: r["tflops_causal"] for r in gpu["rows"]["FLASH_ATTENTION"]}
    assert all(1.6 < cudnn[s] / flash[s] < 1.9 for s in cudnn)
    prof = hardware_profiles.tomllib.loads((ROOT / "benchmarks" / "results" / "2026-12-04-h200" / "h200-calibrated.toml").read_text())
    for seq, frac in prof["attention_efficiency_curve"]:
        if int(seq) in cudnn:
            assert abs(frac * prof["peak_dense_tflops"]["bf16"] / cudnn[int(seq)] - 1) < 0.07, seq


_STUB_PY = r'''#!/bin/bash
# python3 as benchmarks/gpu_h200.sh calls it, faked: each call is logged; the studies and grid entries write their outputs
echo "python3 $*" >> "$CALLS"
case "$1 $2" in
  "-m pip") exit 0 ;;
  "-c "*) echo "torch 2.11.0 cuda 13.0"; exit 0 ;;
  "- "*) exec "$REAL_PY" "$@" ;;
  "-m planner.cli") while [ $# -gt 0 ]; do [ "$1" = --out ] && echo "name = 'x'" > "$2"; shift; done; exit 0 ;;
esac
case "$1" in
  benchmarks/gpu_grid.py)
    out=; names=; on=
    shift
    while [ $# -gt 0 ]; do
      case "$1" in --out) out=$2; shift ;; --hardware) shift ;; --only) on=1 ;; *) [ -n "$on" ] && names="$names $1" ;; esac
      shift
    done
    for n in $names; do
      mkdir -p "$out/$n"
      if [ "$n" = "$FAIL" ]; then echo "launch failed" > "$out/$n/launch.log"; else echo '{}' > "$out/$n/report.json"; fi
    done ;;
  benchmarks/host_probe_width.py|benchmarks/fp8_gemm_shapes.py|benchmarks/fp8_ops.py)
    while [ $# -gt 0 ]; do [ "$1" = --json ] && echo '{}' > "$2"; shift; done ;;
esac
exit 0
'''


def _run_h200_call(tmp_path, results, limit=560, fail="", script="gpu_h200.sh", gpu="H200", rc=0):
    """benchmarks/gpu_h200.sh (or SCRIPT) on this machine with nvidia-smi, python3 and timeout faked (an H200, or GPU,
    named, every step instant): the calls it made, in order (the timeouts given, then the command), and its stdout."""
    import os
    import shutil
    import subprocess
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "python3").write_text(_STUB_PY)
    (bin_ / "nvidia-smi").write_text(f'#!/bin/bash\necho "GPU 0: NVIDIA {gpu} (UUID: GPU-0)"\n')
    (bin_ / "timeout").write_text('#!/bin/bash\necho "timeout $1" >> "$CALLS"\nshift\nexec "$@"\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "CALLS": str(calls), "REAL_PY": sys.executable,
           "LIMIT": str(limit), "FAIL": fail, "OUT": str(tmp_path / "out")}
    (tmp_path / "out").mkdir(exist_ok=True)
    assert shutil.which("bash")
    run = subprocess.run(["bash", f"benchmarks/{script}", str(results)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == rc, run.stdout + run.stderr
    return [line for line in calls.read_text().splitlines() if not line.startswith("python3 -m pip")], run.stdout


def test_the_h200_call_runs_fp8_first_within_its_budget_and_resumes(tmp_path):
    """gpu_h200.sh's order and budget, with its commands faked: calibrate, the FP8 diagnosis (fp8_diagnosis: the
    profiled 1.3B FP8 entry and its twin, the FP8 op study, the FP8 entry under two cast modes), the host-probe study,
    the FP8 GEMM study, then the grid, each under a timeout capped by what is left of LIMIT; run again on the same
    folder it redoes nothing, and after a partial call it runs only what is missing (not an entry that failed)."""
    import re
    results = tmp_path / "R"
    calls, out = _run_h200_call(tmp_path, results)
    # (the host's `parplan hardware detect`, kept under host/, is not a step of the call's budget)
    assert sum("planner.cli hardware detect --json" in c for c in calls) == 1
    steps = [c for c in calls if c.startswith("python3 ") and not c.startswith(("python3 -c", "python3 - "))
             and "hardware detect" not in c]
    assert [s.split()[1] if "planner.cli" not in s else "calibrate" for s in steps] == [
        "calibrate", "benchmarks/gpu_grid.py", "benchmarks/fp8_ops.py", "benchmarks/gpu_grid.py", "benchmarks/gpu_grid.py",
        "benchmarks/host_probe_width.py", "benchmarks/fp8_gemm_shapes.py", "benchmarks/gpu_grid.py"]
    assert " --profile " in steps[1] and steps[1].endswith("--only llama-1.3b-mbs4-none-fp8 llama-1.3b-mbs4-none")
    assert [f"--out {results}/fp8cast-{m} " in st for st, m in zip(steps[3:5], ("static", "hybrid"))] == [True, True]
    timeouts = [int(c.split()[1]) for c in calls if c.startswith("timeout ")]
    # capped: calibrate 300, the profiled pair 150, the op study 120, each cast mode 75, probe 240, shapes 90, the rest
    # what is left of 560 (less 10 s); the fakes are instant, but the script's clock (bash's SECONDS, whole seconds)
    # may tick on a loaded machine
    assert timeouts[:7] == [300, 150, 120, 75, 75, 240, 90] and 520 <= timeouts[7] <= 550, timeouts
    assert json.loads((results / "grids.json").read_text())["grids"]["grid"]["calibrated"] == "h200-calibrated.toml"
    # 16 (the three MoE entries first, then the three MLA ones) + the 3B FP8 entry last
    assert len(list((results / "grid").glob("*/report.json"))) == 17
    assert steps[-1].endswith(" llama-3b-mbs4-full llama-3b-mbs4-none-fp8")
    # again: everything is there, nothing runs
    calls, out = _run_h200_call(tmp_path, results)
    assert not [c for c in calls if c.startswith("timeout ")], calls
    assert "is there already" in out and "every entry named has run" in out and "probe width: done already" in out
    assert "profiled: done already" in out and "fp8 cast hybrid: done already" in out
    # a partial call: the profiled FP8 entry and two grid entries missing, one of them failed before
    import shutil
    shutil.rmtree(results / "profiled" / "llama-1.3b-mbs4-none-fp8")
    for n in ("llama-0.5b-mbs1-none", "llama-3b-mbs4-full"):
        shutil.rmtree(results / "grid" / n)
    (results / "grid" / "llama-3b-mbs4-full").mkdir()
    (results / "grid" / "llama-3b-mbs4-full" / "launch.log").write_text("launch exit 1")
    calls, out = _run_h200_call(tmp_path, results, limit=200)
    grids = [c for c in calls if "gpu_grid.py" in c]
    assert [g.split("--only ")[1].split() for g in grids] == [["llama-1.3b-mbs4-none-fp8", "llama-1.3b-mbs4-none"],
                                                              ["llama-0.5b-mbs1-none"]]
    # a call short of time: the FP8 diagnosis gets its first minutes, later steps are said not started
    shutil.rmtree(results)
    calls, out = _run_h200_call(tmp_path, results, limit=150)
    first = [int(c.split()[1]) for c in calls if c.startswith("timeout ")][:3]
    assert all(110 <= t <= 130 for t in first) and first == sorted(first, reverse=True), first
    calls, out = _run_h200_call(tmp_path, tmp_path / "R2", limit=70)
    assert re.search(r"profiled: [2-5]\d s left, not started", out), out
    assert re.search(r"probe width: [2-5]\d s left, not started", out), out


def test_the_h100_call_calibrates_then_studies_fp8_and_the_probe_then_runs_the_grid(tmp_path):
    """gpu_h100.sh (the next H100 call), its commands faked: calibrate from the H100 profile with --sustained 30, the
    1.3B FP8 entry and its 16-bit twin with a profiled step each (into profiled/), the FP8 operations study, the
    probe-width study, then one grid call, the second MoE entry first; each capped by LIMIT; it stops at once on an
    H200."""
    results = tmp_path / "R"
    calls, out = _run_h200_call(tmp_path, results, limit=570, script="gpu_h100.sh", gpu="H100 80GB HBM3")
    # (the host's `parplan hardware detect`, kept under host/, is not a step of the call's budget)
    assert sum("planner.cli hardware detect --json" in c for c in calls) == 1
    steps = [c for c in calls if c.startswith("python3 ") and not c.startswith(("python3 -c", "python3 - "))
             and "hardware detect" not in c]
    assert "--base h100-sxm-80gb --sustained 30" in steps[0]
    assert [s.split()[1] for s in steps[1:]] == ["benchmarks/gpu_grid.py", "benchmarks/fp8_ops.py",
                                                 "benchmarks/gpu_grid.py", "benchmarks/gpu_grid.py",
                                                 "benchmarks/host_probe_width.py", "benchmarks/gpu_grid.py"]
    assert f"--out {results}/profiled " in steps[1] and " --profile " in steps[1]
    assert steps[1].split("--only ")[1].split() == ["llama-1.3b-mbs4-none-fp8", "llama-1.3b-mbs4-none"]
    for step, mode in zip(steps[3:5], ("static", "hybrid")):  # (the stub logs no environment: the folders tell)
        assert f"--out {results}/fp8cast-{mode} " in step and step.endswith("--only llama-1.3b-mbs4-none-fp8")
    assert steps[6].split("--only ")[1].split()[:3] == ["moe-2.4b-e8-mbs2", "moe-2.5b-e16-mbs2",
                                                        "gpt-1.3b-mbs4-none-dropout"]
    assert "--profile" not in steps[6]
    timeouts = [int(c.split()[1]) for c in calls if c.startswith("timeout ")]
    assert timeouts[:6] == [300, 150, 120, 75, 75, 150] and 530 <= timeouts[6] <= 560, timeouts
    assert json.loads((results / "grids.json").read_text())["datasheet"] == "h100-sxm-80gb"
    assert len(list((results / "grid").glob("*/report.json"))) == 15
    assert len(list((results / "profiled").glob("*/report.json"))) == 2
    calls, out = _run_h200_call(tmp_path, results, script="gpu_h100.sh", gpu="H100 80GB HBM3")
    assert not [c for c in calls if c.startswith("timeout ")] and "fp8 ops: done already" in out
    assert "profiled: done already" in out
    calls, out = _run_h200_call(tmp_path, tmp_path / "R2", script="gpu_h100.sh", gpu="H200", rc=3)
    assert "prepared for an H100" in out and not [c for c in calls if c.startswith("timeout ")]
