"""planner.launch: plan reading, pre-flight checks, the torchrun argv, dry runs, and (multirank)
a real CPU run and a crashed run reported by rank."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner import launch as L
from tests.runtime_helpers.plans import TINY_LLAMA, tiny_plan, write_plan


@pytest.fixture
def plan8(tmp_path):
    return write_plan(tiny_plan(tp=2, pp=2, dp=2), tmp_path / "plan.json")


NO_GPU = L.MachineInfo(torch_version="x", gpus=0, free_memory_bytes=None)


def test_dry_run_without_gpu_explains_and_exits_0(plan8, capsys):
    if L.probe_machine().gpus:
        pytest.skip("this machine has a GPU")
    assert L.launch(plan8, dry_run=True) == 0
    out, err = capsys.readouterr()
    assert "no CUDA GPU" in err and "--device cpu" in err
    assert "Traceback" not in err + out
    argv = out.strip()
    assert argv.count("\n") == 0 and "torch.distributed.run" in argv and "parallel_layers.train" in argv


def test_dry_run_cpu_prints_every_check_and_the_command(plan8, capsys, tmp_path):
    assert L.launch(plan8, dry_run=True, device="cpu", steps=7, report=str(tmp_path / "r" / "report.json")) == 0
    out, err = capsys.readouterr()
    for name in ("torch", "device", "world size", "runtime support", "rendezvous", "memory"):
        assert f"] {name}:" in err
    assert "FAIL" not in err
    assert "--nproc-per-node 8" in out and "--steps 7" in out and "--device cpu" in out
    assert not (tmp_path / "r").exists()  # a dry run writes nothing


def test_a_report_path_holding_another_file_is_refused(plan8, capsys, tmp_path):
    """--report naming a file that is not a launch report (a plan, notes) is refused: the run had replaced it without
    a word.  A launch report there (the same command run again) is replaced as before."""
    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "notes"}')
    assert L.launch(plan8, dry_run=True, device="cpu", report=str(mine)) == 0
    err = capsys.readouterr().err
    assert f"[FAIL] report: --report {mine} exists and is not a launch report" in err and "1 check failed" in err
    again = tmp_path / "r" / "report.json"
    again.parent.mkdir()
    again.write_text(json.dumps({"plan": {}, "steps": [], "world_size": 8}))
    assert L.launch(plan8, dry_run=True, device="cpu", report=str(again)) == 0
    assert "FAIL" not in capsys.readouterr().err
    assert L.is_launch_report(again) and not L.is_launch_report(mine) and not L.is_launch_report(tmp_path / "none")
    empty = tmp_path / "made.json"  # a file made for the report (mktemp): nothing to lose
    empty.write_text("")
    assert L.is_launch_report(empty)


def test_dry_run_with_failed_checks_shows_placeholders_not_none(plan8, capsys):
    """3 nodes for 8 ranks without an endpoint: the command names what is missing instead of printing
    --rdzv-endpoint None and --nproc-per-node 0, and the memory line does not count 0 ranks."""
    assert L.launch(plan8, dry_run=True, device="cpu", nnodes=3) == 0
    out, err = capsys.readouterr()
    assert "--rdzv-endpoint '<HOST:PORT>'" in out and "--nproc-per-node '<RANKS_PER_NODE>'" in out
    assert "None" not in out and "2 checks failed" in err and "0 ranks" not in err


def test_dry_run_says_when_the_run_folder_cannot_be_written(plan8, capsys, monkeypatch, tmp_path):
    """The run itself stops at its first write ("cannot write in ..."); the dry run said every check passed. (As
    root every folder is writable to os.access, so the unwritable folder is simulated.)"""
    real = L.os.access
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(L.os, "access", lambda p, mode: False if str(p) == str(locked) else real(p, mode))
    assert L.launch(plan8, dry_run=True, device="cpu", report=str(locked / "r" / "report.json")) == 0
    out, err = capsys.readouterr()
    assert f"[FAIL] report: cannot write in {locked / 'r'}" in err and "1 check failed" in err
    assert L.launch(plan8, dry_run=True, device="cpu", report=str(tmp_path / "free" / "report.json")) == 0
    assert "FAIL" not in capsys.readouterr().err


def test_dry_run_tries_to_make_the_run_folder_where_permission_bits_say_yes(plan8, capsys, monkeypatch, tmp_path):
    """Some folders pass os.access and take no folder (/proc as root, a read-only mount): the dry run had said every
    check passed there.  It now makes and removes a folder where the bits allow one (the refusal is simulated by
    a mkdtemp that fails, as /proc's does), and leaves nothing behind where it can."""
    import errno
    import tempfile
    free = tmp_path / "free"
    free.mkdir()
    assert L.can_make_folder_in(free) and list(free.iterdir()) == []
    real = tempfile.mkdtemp

    def refuse(*args, dir=None, **kwargs):
        if str(dir) == str(free):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*args, dir=dir, **kwargs)
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    assert not L.can_make_folder_in(free)
    assert L.launch(plan8, dry_run=True, device="cpu", report=str(free / "r" / "report.json")) == 0
    assert f"[FAIL] report: cannot write in {free / 'r'}" in capsys.readouterr().err


@pytest.mark.parametrize("fused", [True, False])
def test_the_run_fuses_gradient_accumulation_as_the_plan_predicted(tmp_path, capsys, fused):
    """A plan predicted without fused accumulation (--no-grad-accumulation-fusion, or written before the runtime
    had it) runs the main_grad hook; one predicted with it leaves the runtime its default (auto: on CUDA)."""
    plan = tiny_plan(tp=2, pp=2, dp=2, precision="master-weights")
    plan.training.grad_accumulation_fusion = fused
    assert L.launch(write_plan(plan, tmp_path / "plan.json"), dry_run=True, device="cpu") == 0
    out, _ = capsys.readouterr()
    assert ("--wgrad-fusion off" in out) is not fused


def test_memory_snapshot_reaches_the_runtime_on_cuda_and_on_cpu(plan8, capsys, monkeypatch):
    argv = L.torchrun_argv("p.json", nproc=1, steps=2, device="cuda", report="r.json", memory_snapshot="snap")
    assert argv[-2:] == ["--memory-snapshot", "snap"]
    assert L.launch(plan8, dry_run=True, device="cpu", memory_snapshot="snap") == 0  # cpu: the CPU allocator trace
    out, _ = capsys.readouterr()
    assert "--memory-snapshot snap" in out


def test_profile_reaches_the_runtime_and_its_line_reads_the_report(plan8, capsys):
    argv = L.torchrun_argv("p.json", nproc=1, steps=2, device="cuda", report="r.json", profile="prof")
    assert argv[-2:] == ["--profile", "prof"]
    assert L.launch(plan8, dry_run=True, device="cpu", profile="prof") == 0
    assert "--profile prof" in capsys.readouterr().out
    # on cpu the allocator's trace is the profiler's too: one of the two per run
    assert L.launch(plan8, dry_run=True, device="cpu", profile="prof", memory_snapshot="snap") == 0  # shows every check
    assert "[FAIL] profile: --profile and --memory-snapshot on cpu" in capsys.readouterr().err
    assert L.profile_line({"profile": None}) is None
    assert L.profile_line({"profile": None, "error": {"step_time_s": -0.10}}) is None
    assert L.profile_line({"profile": None, "error": {"step_time_s": None}}) is None  # cpu: not comparable
    hint = L.profile_line({"error": {"step_time_s": -0.816}})
    assert hint.startswith("the predicted step is 82% under the measured one: `parplan launch --profile DIR`"), hint
    assert "19% over the measured" in L.profile_line({"error": {"step_time_s": 0.19}})
    files = ["runs/x/profile/rank0.ops.md", "runs/x/profile/rank0.ops.json", "runs/x/profile/rank0.trace.json.gz"]
    gpu = {"step": 13, "wall_s": 1.03, "device_busy_s": 0.97, "device_busy_fraction": 0.97 / 1.03, "host_self_s": 0.8,
           "top_device_op": {"name": "triton_red_fused_abs_amax_0", "calls": 264, "self_device_s": 0.61}, "files": files}
    line = L.profile_line({"profile": gpu})
    assert line.startswith("profiled step 13 (rank 0, not in the medians): 1030.0 ms, GPU busy 970.0 ms (94%)")
    assert "most in triton_red_fused_abs_amax_0 (610.0 ms, 264 calls)" in line and line.endswith("runs/x/profile")
    cpu = {**gpu, "device_busy_s": None, "device_busy_fraction": None, "top_device_op": None}
    assert "host operators 800.0 ms" in L.profile_line({"profile": cpu})


def test_cpu_memory_line_compares_the_traced_peak_with_the_model():
    assert L.cpu_memory_line({"cpu_memory": None}) is None
    # a CPU run without the trace says how to take it (its summary row reads "-")
    assert "--memory-snapshot DIR" in L.cpu_memory_line({"cpu_memory": None, "device": "cpu"})
    line = L.cpu_memory_line({"cpu_memory": {"allocated_max": 2.2e9, "without_collective_buffers_max": 2.0e9,
                                             "predicted": 1.9e9, "error": -0.05}})
    assert "2.20 GB" in line and "2.00 GB without gloo" in line and "1.90 GB (-5.0%)" in line
    # amp computes in fp32 on the CPU: its peak is shown with why there is no comparison, and per rank kind too
    amp = {"allocated_max": 2.2e9, "without_collective_buffers_max": 2.0e9, "predicted": None, "error": None,
           "note": "amp runs in fp32 on the CPU (no autocast): not comparable with its 16-bit prediction"}
    assert "not comparable" in L.cpu_memory_line({"cpu_memory": amp}) and "%" not in L.cpu_memory_line({"cpu_memory": amp})
    rep = _report(2, 1, "1f1b", [100, 90], {"first": 110.0, "last": 95.0})
    assert L.rank_kind_memory(rep) is not None
    rep["cpu_memory"] = amp
    assert L.rank_kind_memory(rep) is None


def test_bad_plan_file_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(tiny_plan().model_dump_json()), "surprise": 1}))
    assert L.launch(str(bad), dry_run=True) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "surprise" in err and err.startswith("error: invalid plan")
    (tmp_path / "notjson.json").write_text("{not json")
    assert L.launch(str(tmp_path / "notjson.json")) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert L.launch(str(tmp_path / "missing.json")) == 2
    assert "not found" in capsys.readouterr().err


def test_plan_from_stdin(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(tiny_plan(tp=2).model_dump_json()))
    assert L.launch("-", dry_run=True, device="cpu") == 0
    assert "--nproc-per-node 2" in capsys.readouterr().out


def test_world_size_checks():
    plan = tiny_plan(tp=2, pp=2, dp=2)
    four = L.MachineInfo(torch_version="x", gpus=4, free_memory_bytes=80e9, gpu_name="H100")
    nproc, c = L.check_world(plan, "cuda", four, nnodes=1, nproc_per_node=None)
    assert (nproc, c.ok) == (8, False) and "this node has 4" in c.detail and "--nnodes 2" in c.fix
    nproc, c = L.check_world(plan, "cuda", four, nnodes=2, nproc_per_node=None)
    assert (nproc, c.ok) == (4, True)
    _, c = L.check_world(plan, "cuda", four, nnodes=3, nproc_per_node=None)
    assert not c.ok and "do not split evenly" in c.detail
    nproc, c = L.check_world(plan, "cpu", NO_GPU, nnodes=1, nproc_per_node=None)
    assert (nproc, c.ok) == (8, True)
    two_cores = L.MachineInfo(torch_version="x", gpus=0, free_memory_bytes=None, cpu_cores=2)
    nproc, c = L.check_world(plan, "cpu", two_cores, nnodes=1, nproc_per_node=None)
    assert (nproc, c.ok) == (8, True) and "share this node's 2 cores" in c.detail
    assert c.line().startswith("[ok  ]")  # 4 ranks a core: said, not warned
    one_core = L.MachineInfo(torch_version="x", gpus=0, free_memory_bytes=None, cpu_cores=1)
    nproc, c = L.check_world(plan, "cpu", one_core, nnodes=1, nproc_per_node=None)
    assert c.ok and c.line().startswith("[warn] world size: ") and "8 ranks a core" in c.line()


def test_a_cpu_runs_summary_compares_the_allocators_peak_in_mib(capsys):
    """On CPU the summary's memory row is the allocator trace's peak per rank against the model (it had shown '-'
    beside the GPU prediction, and 24.3 vs 26.7 MB as '0.02 GB / 0.03 GB'); the MFU row says whose it is; one step
    says its time includes start-up."""
    report = {"device": "cpu", "world_size": 4, "warmup_steps": 0, "steps": [{"loss": 6.9}],
              "median": {"step_time_s": 1.0, "tokens_per_s": 100.0, "mfu": None},
              "prediction": {"step_time_s": 0.5, "tokens_per_s": 200.0, "mfu": 0.4,
                             "memory_bytes_per_gpu": {"total": 28e6}},
              "error": {}, "peak_memory_bytes": {},
              "cpu_memory": {"allocated_max": 30 * 2**20, "without_collective_buffers_max": 26.7 * 2**20, "predicted": 28e6,
                             "error": 28e6 / (26.7 * 2**20) - 1}}
    rows = {r[0]: r for r in L.summary_rows(report)}
    assert rows["peak memory / rank (cpu allocator)"][1:] == ("26.7 MiB", "26.7 MiB", "+0.0%")
    assert rows["MFU (predicted for the plan's GPU)"][1:3] == ("-", "40.0%")
    L.print_summary({**report, "plan": tiny_plan(tp=2).model_dump(mode="json")}, "r.json")
    assert "cpu x 4: 1 step, no warm-up: the time includes start-up; final loss 6.9000" in capsys.readouterr().err


def test_memory_check_uses_the_prediction():
    from planner.schema import Prediction

    plan = tiny_plan(tp=2)
    mem = dict(weights=1e9, grads=1e9, optimizer=2e9, activations=5e9, other=1e9, total=10e9)
    plan.prediction = Prediction.model_validate(dict(
        memory_bytes_per_gpu=mem, step_time_s=1.0, tokens_per_s=1.0, model_tflops_per_gpu=1.0, hardware_tflops_per_gpu=1.0,
        mfu=0.4, hfu=0.4, bubble_fraction=0.0, comm_bytes_per_step={}, amdahl=dict(parallel_fraction=1, speedup=2), fits=True))
    small = L.MachineInfo(torch_version="x", gpus=2, free_memory_bytes=8e9, gpu_name="H100")
    big = L.MachineInfo(torch_version="x", gpus=2, free_memory_bytes=40e9, gpu_name="H100")
    c = L.check_memory(plan, "cuda", small)
    assert not c.ok and c.exit_code == L.EXIT_DOES_NOT_FIT and "10.00 GB" in c.detail and "8.00 GB" in c.detail
    assert L.check_memory(plan, "cuda", big).ok


def test_torchrun_argv_is_a_list_and_multinode():
    argv = L.torchrun_argv("/p/plan.json", nproc=4, steps=5, device="cuda", report="/r.json", nnodes=2, node_rank=1,
                           rdzv_endpoint="node0:29500", checkpoint_dir="/ck", checkpoint_every=2, resume=True,
                           data="/tok.bin")
    assert all(isinstance(a, str) for a in argv)
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"] and "--standalone" not in argv
    i = argv.index("--rdzv-endpoint")
    assert argv[i + 1] == "node0:29500" and argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[argv.index("--node-rank") + 1] == "1" and argv[argv.index("--nnodes") + 1] == "2"
    assert "--rdzv-id" in argv
    assert argv[argv.index("--plan") + 1] == "/p/plan.json" and "--resume" in argv
    single = L.torchrun_argv("/p.json", nproc=8, steps=1, device="cpu", report="/r.json")
    assert "--standalone" in single and "--nnodes" not in single
    assert not L.check_rendezvous(2, 0, None).ok


def test_planner_launch_does_not_import_torch():
    code = "import sys, planner.launch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.multirank
def test_cpu_launch_writes_report_and_keeps_stdout_clean(tmp_path, capfd):
    plan = write_plan(tiny_plan(tp=2, dp=2), tmp_path / "plan.json")
    report = tmp_path / "run" / "report.json"
    assert L.launch(plan, steps=3, device="cpu", report=str(report)) == 0
    out, err = capfd.readouterr()
    assert out == ""
    assert "measured" in err and "step time" in err
    rep = json.loads(report.read_text())
    assert [s["step"] for s in rep["steps"]] == [1, 2, 3]
    assert rep["plan"]["parallel"]["tp"] == 2 and len(rep["peak_memory_bytes"]) == 4
    assert (tmp_path / "run" / "plan.json").exists() and (tmp_path / "run" / "torchrun.log").exists()
    # the pre-flight's CPU time is a lower bound of the step the ranks measured
    from planner.schema import Plan
    est = L.check_cpu_time(Plan.model_validate_json((tmp_path / "run" / "plan.json").read_text()), 1, 4,
                           L.probe_machine())
    step = float(est.detail.split("at least ")[1].split(" s a step")[0])
    assert 0 < step <= rep["median"]["step_time_s"], (est.detail, rep["median"])


def _cpu_plan(**over):
    from planner.core import evaluate_plan
    return evaluate_plan(tiny_plan(**{"tp": 1, "dp": 2, **over}))


def test_cpu_time_scales_with_the_step_and_warns_past_ten_minutes():
    """The CPU-time check (cpu launches only): the step's FLOPs over the rate measured here and the cores the ranks
    share; recomputation adds its forward; a warning with the fix past CPU_RUN_WARN_S, never a failure."""
    two = L.MachineInfo(torch_version="x", gpus=0, free_memory_bytes=None, cpu_cores=2)

    def secs(c):
        return float(c.detail.split("at least ")[1].split(" s a step")[0])

    base = L.check_cpu_time(_cpu_plan(), 10, 2, two, rate=1e9)
    assert base.ok and not base.detail.startswith("warning") and "1.0 GFLOP/s" in base.detail
    doubled = L.check_cpu_time(_cpu_plan(global_batch_size=16), 10, 2, two, rate=1e9)
    assert secs(doubled) == pytest.approx(2 * secs(base), rel=0.01)
    one_core = L.check_cpu_time(_cpu_plan(), 10, 2, L.MachineInfo("x", 0, None, cpu_cores=1), rate=1e9)
    assert secs(one_core) == pytest.approx(2 * secs(base), rel=0.01)
    full = L.check_cpu_time(_cpu_plan(recompute="full"), 10, 2, two, rate=1e9)
    assert 1.2 < secs(full) / secs(base) < 1.4  # the forward again: about 4/3
    slow = L.check_cpu_time(_cpu_plan(), 10, 2, two, rate=secs(base) * 1e9 / (L.CPU_RUN_WARN_S / 10) / 1.01)
    assert slow.ok and slow.detail.startswith("warning: ") and "--global-batch-size" in slow.detail
    assert L.cpu_matmul_rate(n=64, repeats=2) > 1e6
    # on two nodes, each node's ranks do half the step
    half = L.check_cpu_time(_cpu_plan(), 10, 1, two, rate=1e9)
    assert secs(half) == pytest.approx(secs(base), rel=0.01)  # half the work on one core of two


def test_a_cpu_dry_run_says_how_long_the_run_takes(plan8, capsys):
    assert L.launch(plan8, dry_run=True, device="cpu", steps=4) == 0
    _, err = capsys.readouterr()
    assert "] cpu time: at least " in err and "for 4 steps" in err


def test_unimplemented_settings_fail_before_any_rank_starts(tmp_path, capsys):
    plan = write_plan(tiny_plan(tp=2, cp=2, seq_len=30), tmp_path / "plan.json")  # 30 tokens: not 2*cp chunks
    assert L.launch(plan, device="cpu", report=str(tmp_path / "run" / "report.json")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cp=2" in err and "seq_len divisible by 4" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.multirank
def test_crashed_ranks_are_reported_by_rank_and_cause(tmp_path, capfd, monkeypatch):
    """Token ids >= vocab in the data file make every rank raise at its first batch (past the ids the
    pre-flight samples: every 33-token window reaches them)."""
    plan = write_plan(tiny_plan(tp=2), tmp_path / "plan.json")
    tok = tmp_path / "tok.bin"
    import numpy as np
    ids = np.full(1000, 300, dtype=np.uint16)  # vocab is 256
    ids[:10] = 0
    ids.tofile(tok)
    monkeypatch.setattr(L, "DATA_SAMPLE_TOKENS", 10)
    code = L.launch(plan, steps=2, device="cpu", report=str(tmp_path / "run" / "report.json"), data=str(tok))
    assert code != 0
    out, err = capfd.readouterr()
    assert out == ""
    assert "rank 0 failed: ValueError" in err and "rank 1 failed: ValueError" in err
    assert "token id 300" in err


@pytest.mark.parametrize("change, ok, words", [
    # fp16 trains with the runtime's dynamic loss scale (parallel_layers.loss_scale); refused before 2026-12-03
    (dict(precision="master-weights-half-grads", dtype="fp16"), True, "every setting"),
    (dict(precision="master-weights", dtype="fp16"), True, "every setting"),
    (dict(precision="amp", dtype="fp16"), True, "every setting"),
    (dict(zero_stage=3, offload="optimizer"), True, "CPUOffloadPolicy"),
    (dict(cp=2), True, "every setting"),
    (dict(cp=4, zero_stage=3, offload="optimizer"), True, "CPUOffloadPolicy"),
    (dict(cp=2, seq_len=30), False, "cp=2 with seq_len 30"),
    # dropout trains (parallel_layers.dropout); refused before 2026-12-03: the fused-pointwise plan is told how the
    # runtime's passes differ from Megatron's fused bias-dropout-add
    (dict(dropout=True), True, "bias-dropout-add"),
    (dict(), True, "every setting"),
    (dict(precision="master-weights"), True, "every setting"),
    (dict(precision="master-weights-half-grads", zero_stage=3), True, "every setting"),
    (dict(precision="master-weights", zero_stage=1, offload="optimizer"), True, "every setting"),
    (dict(zero_stage=2, offload="optimizer"), True, "every setting"),
])
def test_runtime_support_check(change, ok, words):
    plan = tiny_plan(tp=2, cp=change.get("cp", 1), seq_len=change.get("seq_len", 32), precision=change.get("precision", "fp32"),
                     zero_stage=change.get("zero_stage", 0), offload=change.get("offload", "none"))
    plan.training.dropout = change.get("dropout", False)
    plan.training.dtype = change.get("dtype", "bf16")
    c = L.check_runtime_support(plan, "cpu")
    assert c.ok is ok and words in c.detail
    if not ok:
        assert c.fix and "\n" not in c.fix


@pytest.mark.parametrize("flag, pp, sp, warned", [
    ("p2p_scatter_gather", 2, False, True),
    ("p2p_scatter_gather", 2, True, False),   # with SP the runtime sends 1/tp slices too
    ("p2p_scatter_gather", 1, False, False),  # no pipeline, nothing to send
])
def test_runtime_support_warns_about_megatron_only_assumptions(flag, pp, sp, warned):
    plan = tiny_plan(tp=2, pp=pp, dp=1, seq_len=32)
    plan.parallel.sp = sp
    setattr(plan.training, flag, True)
    c = L.check_runtime_support(plan, "cpu")
    assert c.ok
    assert ("Megatron" in c.detail) is warned


@pytest.mark.parametrize("precision, device, torch_version, warned", [
    ("master-weights", "cpu", "2.13.0", True),          # the runtime fuses on CUDA only
    ("master-weights", "cuda", "2.11.0+cu128", False),
    ("master-weights", "cuda", "2.7.1+cu126", True),    # before torch's fp32-output GEMM (2.8)
    ("master-weights", "cuda", None, False),            # unknown: the run's probe decides, and its report says
    ("fp32", "cpu", "2.13.0", False),                   # no main_grad: the prediction does not count fusion either
])
def test_runtime_support_warns_when_fused_accumulation_cannot_run(precision, device, torch_version, warned):
    plan = tiny_plan(tp=2, pp=1, dp=1, seq_len=32, precision=precision)
    plan.training.grad_accumulation_fusion = True
    c = L.check_runtime_support(plan, device, torch_version)
    assert c.ok
    assert ("fused gradient accumulation" in c.detail) is warned
    # a zero-bubble schedule with a pipeline fuses in its queued weight pass as any other plan; under FSDP2 (torch's
    # own weight pass) neither the prediction nor the runtime fuses, nothing to warn about
    zb = tiny_plan(tp=1, pp=2, dp=1, seq_len=32, precision=precision, schedule="zbv", vpp=2)
    zb.training.grad_accumulation_fusion = True
    assert ("fused gradient accumulation" in L.check_runtime_support(zb, device, torch_version).detail) is warned
    zb3 = tiny_plan(tp=1, pp=2, dp=2, seq_len=32, precision=precision, schedule="zbv", vpp=2, zero_stage=3)
    zb3.training.grad_accumulation_fusion = True
    assert "fused gradient accumulation" not in L.check_runtime_support(zb3, device, torch_version).detail


def test_runtime_support_warns_when_zero1_is_predicted_with_reduce_scatter():
    plan = tiny_plan(tp=1, dp=2, seq_len=32, zero_stage=1)
    plan.training.zero1_grad_reduce = "reduce-scatter"
    c = L.check_runtime_support(plan, "cpu")
    assert c.ok and "reduce-scatters" in c.detail
    plan.training.zero1_grad_reduce = "all-reduce"
    assert "reduce-scatters" not in L.check_runtime_support(plan, "cpu").detail


@pytest.mark.parametrize("g16, warned", [(False, True), (True, False)])
def test_runtime_support_warns_when_the_prediction_counts_a_fused_loss_it_does_not_run(g16, warned):
    """The runtime runs the autograd loss and flash-attn's kind (16-bit gradient; layers.
    fused_vocab_parallel_cross_entropy), not Megatron's (an fp32 softmax overwritten in place)."""
    plan = tiny_plan(tp=1, dp=2, seq_len=32)
    assert "cross-entropy" not in L.check_runtime_support(plan, "cpu").detail
    plan.training.fused_cross_entropy = True
    plan.training.cross_entropy_16bit_grad = g16
    c = L.check_runtime_support(plan, "cpu")
    assert c.ok and ("Megatron's fused cross-entropy" in c.detail) is warned


def test_runtime_support_warns_when_the_prediction_times_another_attention_kernel():
    plan = tiny_plan(tp=1, dp=2, seq_len=32)
    assert "attention_kernel profile" not in L.check_runtime_support(plan, "cpu").detail
    plan.training.attention_kernel = "triton-2022"
    c = L.check_runtime_support(plan, "cpu")
    assert c.ok and "triton-2022" in c.detail and "attention_kernel profile" in c.detail


def test_runtime_support_warns_when_zero2_is_predicted_per_micro_batch():
    plan = tiny_plan(tp=1, dp=2, seq_len=32, zero_stage=2)
    assert "reduces them once per step" not in L.check_runtime_support(plan, "cpu").detail
    plan.training.zero2_grad_reduce = "per-micro-batch"
    c = L.check_runtime_support(plan, "cpu")
    assert c.ok and "reduces them once per step" in c.detail


def test_runtime_support_warns_about_fsdp_inside_a_pipeline():
    """The parplan framework's prediction counts the unsharded weights and gradients; another's does not."""
    plan = tiny_plan(tp=1, pp=2, dp=2, seq_len=32, zero_stage=3)
    assert "unsharded" not in L.check_runtime_support(plan, "cpu").detail
    plan.training.framework = "deepspeed"
    c = L.check_runtime_support(plan, "cpu")
    assert c.ok and "unsharded until the step ends" in c.detail
    flat = tiny_plan(tp=1, pp=1, dp=2, seq_len=32, zero_stage=3)
    flat.training.framework = "deepspeed"
    assert "unsharded" not in L.check_runtime_support(flat, "cpu").detail


def _report(pp, tp, schedule, peaks, by_stage, cpu=True):
    """A launch report with what rank_kind_memory reads: the plan's layout, per-rank peaks, the prediction."""
    key = "allocated_without_collective_buffers" if cpu else "reserved"
    return {"plan": {"parallel": {"pp": pp, "tp": tp, "cp": 1, "schedule": schedule}},
            "peak_memory_bytes": {str(r): {key: v, "allocated": v} for r, v in enumerate(peaks)},
            "prediction": {"memory_bytes_per_gpu": {"total": max(by_stage.values()), "by_stage": by_stage}},
            "cpu_memory": {"error": 0.0, "predicted": max(by_stage.values())} if cpu else None,
            "error": {"peak_memory": None if cpu else 0.0}}


def test_rank_kind_memory_matches_each_kind_with_its_pipeline_rank():
    # tp 2 x pp 4 = 8 ranks, mesh (dp, pp, tp): ranks 2k and 2k+1 are pipeline rank k; the larger peer counts
    peaks = [100, 104, 90, 80, 70, 75, 60, 50]
    rep = _report(4, 2, "1f1b", peaks, {"first": 110.0, "middle": 81.0, "last": 60.0})
    got = L.rank_kind_memory(rep)
    assert {k: v["pipeline_rank"] for k, v in got.items()} == {"first": 0, "middle": 1, "last": 3}
    assert got["first"]["measured"] == 104 and got["first"]["error"] == pytest.approx(110 / 104 - 1)
    assert got["middle"]["error"] == pytest.approx(81 / 90 - 1)
    assert got["last"]["error"] == pytest.approx(0.0)
    # the middle kind is the fullest middle rank as measured (the zero-bubble schedules' is pp - 2 with the default
    # split, but a plan's own split, or an uneven default one, may fill another more)
    got = L.rank_kind_memory(_report(4, 2, "zbv", peaks, {"first": 110.0, "middle": 81.0, "last": 50.0}))
    assert got["middle"]["pipeline_rank"] == 1 and got["middle"]["measured"] == 90
    fuller_late = [100, 104, 70, 75, 90, 80, 60, 50]
    got = L.rank_kind_memory(_report(4, 2, "zbv", fuller_late, {"first": 110.0, "middle": 81.0, "last": 50.0}))
    assert got["middle"]["pipeline_rank"] == 2 and got["middle"]["measured"] == 90
    # on a GPU the reserved peaks; the summary prints one line
    gpu = _report(2, 1, "1f1b", [10e9, 8e9], {"first": 11e9, "last": 8e9}, cpu=False)
    assert L.rank_kind_memory(gpu)["first"]["error"] == pytest.approx(0.1)
    assert L.rank_kind_line(gpu) == ("memory per pipeline rank, measured / predicted: rank 0 (first) 10.00 GB / "
                                     "11.00 GB (+10.0%), rank 1 (last) 8.00 GB / 8.00 GB (+0.0%)")
    # a CPU run with optimizer offload holds the offloaded states in the same allocator, which by_stage leaves out
    cpu = _report(2, 1, "1f1b", [10e9, 8e9], {"first": 11e9, "last": 8e9})
    assert not L.rank_kind_line(cpu).endswith("which a CPU run holds beside them")
    cpu["plan"]["parallel"]["offload"] = "optimizer"
    assert L.rank_kind_line(cpu).endswith("; predicted without the offloaded optimizer states, which a CPU run holds "
                                          "beside them")
    # nothing to compare: no pipeline, or a prediction the run cannot be compared with
    assert L.rank_kind_memory(_report(1, 1, "1f1b", [10.0], {"first": 10.0}) | {
        "prediction": {"memory_bytes_per_gpu": {"total": 10.0, "by_stage": None}}}) is None
    assert L.rank_kind_memory({**gpu, "error": {"peak_memory": None}}) is None


@pytest.mark.parametrize("fused", [True, False])
def test_cuda_compiles_blocks_when_the_plan_models_fused_pointwise_work(tmp_path, capsys, monkeypatch, fused):
    """On cuda the runtime compiles each block by default, which is what the cost model's fused pointwise
    term assumes; a plan predicted with eager pointwise work (--no-fused-elementwise) runs eager."""
    plan = tiny_plan(tp=1, pp=1, dp=1)
    plan = plan.model_copy(update={"training": plan.training.model_copy(update={"fused_elementwise": fused})})
    path = write_plan(plan, tmp_path / "plan.json")
    monkeypatch.setattr(L, "resolve_device", lambda device, machine, plan=None: ("cuda", L.Check("device", True, "cuda (test)")))
    assert L.launch(path, dry_run=True) == 0
    out, _ = capsys.readouterr()
    assert ("--compile" in out.split()) is fused


def test_runtime_support_warns_about_overlapped_cp_and_deepspeed_predictions():
    """A plan predicted with ring attention's overlapped K/V exchange, or for DeepSpeed's engine, is not
    what the runtime runs: the preflight says so and how to compare."""
    plan = tiny_plan(tp=2, cp=2, seq_len=32)
    assert "overlap_cp_comm" not in L.check_runtime_support(plan, "cpu").detail
    plan.training.overlap_cp_comm = True
    c = L.check_runtime_support(plan, "cpu")
    assert c.ok and "overlap_cp_comm off" in c.detail
    assert "overlap_tp_comm" not in c.detail
    plan.training.overlap_tp_comm = True  # Megatron's --tp-comm-overlap: the runtime waits for its collectives
    c = L.check_runtime_support(plan, "cpu")
    assert c.ok and "overlap_tp_comm off" in c.detail
    plan = tiny_plan(tp=1, pp=2, dp=1, seq_len=32)
    plan.training.framework = "deepspeed"
    c = L.check_runtime_support(plan, "cpu")
    assert c.ok and "DeepSpeed's engine" in c.detail and "--framework parplan" in c.detail


def test_runtime_support_rejects_dimensions_tp_does_not_divide():
    """The runtime shards the MLP width and the heads evenly, so the preflight rejects a tp that does not
    divide them, with the fix; a vocabulary it pads to a multiple of tp (a GPT-2 vocabulary, 50257, over
    tp 2: tests/test_runtime_multirank.py's gpt-tied-odd-vocab case trains like one rank)."""
    plan = tiny_plan(tp=2, seq_len=32)
    plan.model.vocab = 257
    assert L.check_runtime_support(plan, "cpu").ok
    plan = tiny_plan(tp=2, seq_len=32)
    plan.model.ffn_hidden = plan.model.ffn_hidden + 1
    c = L.check_runtime_support(plan, "cpu")
    assert not c.ok and "ffn_hidden" in c.detail


def test_the_report_says_how_many_steps_clipped():
    from planner.launch import grad_norm_line
    report = {"plan": {"training": {"clip_grad": 1.0}},
              "steps": [{"step": 1, "grad_norm": 2.5}, {"step": 2, "grad_norm": 0.8}, {"step": 3, "grad_norm": 1.2}]}
    assert grad_norm_line(report) == ("gradient norm before clipping at 1: 2.5 at step 1, 1.2 at step 3; "
                                      "2 of 3 steps clipped")
    one = {**report, "steps": report["steps"][2:]}  # a resumed run of one step names it once
    assert grad_norm_line(one) == "gradient norm before clipping at 1: 1.2 at step 3; 1 of 1 step clipped"
    report["plan"]["training"]["clip_grad"] = None  # a plan without clipping, or a report from before it
    assert grad_norm_line(report) is None


def test_the_report_says_the_fp16_loss_scale_and_skipped_steps():
    """An fp16 run's summary names its loss scale and the steps it skipped; a skipped step (no norm) leaves the
    clipping line to the steps that stepped; bf16 reports (loss_scaling null, or none before 2026-12-03) say nothing."""
    from planner.launch import grad_norm_line, loss_scale_line
    steps = [{"step": 1, "grad_norm": 2.5, "loss_scale": 65536.0, "skipped": False},
             {"step": 2, "grad_norm": None, "loss_scale": 65536.0, "skipped": True},
             {"step": 3, "grad_norm": 0.5, "loss_scale": 32768.0, "skipped": False}]
    report = {"plan": {"training": {"clip_grad": 1.0}}, "steps": steps,
              "loss_scaling": {"first": 65536.0, "last": 32768.0, "skipped_steps": [2]}}
    assert loss_scale_line(report) == ("fp16 loss scale 65536 at the first step, 32768 at the last; 1 step skipped "
                                       "for inf/nan gradients (step 2)")
    assert grad_norm_line(report) == ("gradient norm before clipping at 1: 2.5 at step 1, 0.5 at step 3; "
                                      "1 of 2 steps clipped")
    report["loss_scaling"] = {"first": 65536.0, "last": 65536.0, "skipped_steps": []}
    assert loss_scale_line(report).endswith("; no step skipped")
    assert loss_scale_line({"loss_scaling": None}) is None and loss_scale_line({}) is None


def test_the_report_says_the_dropout_it_applied():
    from planner.launch import dropout_line
    assert dropout_line({"dropout": {"hidden": 0.1, "attention": 0.0}}) == (
        "dropout 0.1 on the embedding and residual branches, 0 on the attention probabilities")
    assert dropout_line({"dropout": None}) is None and dropout_line({}) is None


def test_a_gpt_plan_past_its_learned_positions_fails_before_any_rank():
    """A GPT model's learned position table caps the sequence: every rank would crash on the add.  A plan file cannot
    say it since the schema refuses it (every command's reading); a Plan edited in code still meets this check."""
    from tests.runtime_helpers.plans import TINY_GPT
    with pytest.raises(ValueError, match="beyond the model's 16 learned positions"):
        tiny_plan({**TINY_GPT, "max_seq_len": 16}, tp=2, seq_len=32)
    plan = tiny_plan({**TINY_GPT, "max_seq_len": 16}, tp=2, seq_len=16)
    plan.training.seq_len = 32  # assignment is not validated
    c = L.check_runtime_support(plan, "cpu")
    assert not c.ok and "16 learned positions" in c.detail and "at most 16" in c.fix
    plan.training.seq_len = 16
    assert L.check_runtime_support(plan, "cpu").ok


def test_unfused_attention_is_a_warning_the_runtime_runs_sdpa():
    plan = tiny_plan(tp=2, seq_len=32)
    plan.training.flash_attention = False
    c = L.check_runtime_support(plan, "cpu")
    assert c.ok and "unfused attention" in c.detail


def test_report_paths_and_resume_are_checked_before_the_run(plan8, tmp_path, capsys):
    """--report writes plan.json and torchrun.log beside the report: it must not overwrite another plan there,
    nor point into a file; --resume needs --checkpoint-dir."""
    other = tmp_path / "mine"
    other.mkdir()
    (other / "plan.json").write_text('{"my": "plan"}')
    assert L.launch(plan8, device="cpu", report=str(other / "report.json")) == 2
    assert (other / "plan.json").read_text() == '{"my": "plan"}'
    assert "another plan" in capsys.readouterr().err
    logs = tmp_path / "logs"  # a torchrun.log with no report or plan beside it: no earlier run of this plan's
    logs.mkdir()
    (logs / "torchrun.log").write_text("my notes")
    assert L.launch(plan8, device="cpu", report=str(logs / "report.json")) == 2
    assert "torchrun.log exists beside no launch report" in capsys.readouterr().err
    assert (logs / "torchrun.log").read_text() == "my notes"
    (logs / "report.json").write_text(json.dumps({"plan": {}, "steps": [], "world_size": 8}))
    assert L.launch(plan8, dry_run=True, device="cpu", report=str(logs / "report.json")) == 0  # a rerun replaces both
    assert "FAIL" not in capsys.readouterr().err
    assert L.launch(plan8, device="cpu", report=str(tmp_path)) == 2  # a folder, not a report file
    assert "not a file path" in capsys.readouterr().err
    assert L.launch(plan8, device="cpu", report=str(other / "plan.json" / "report.json")) == 2
    assert "not a file path" in capsys.readouterr().err
    # a folder not made yet, named with a trailing separator: it had run the job and failed at the report's last write
    assert L.launch(plan8, device="cpu", report=str(tmp_path / "new") + "/") == 2
    assert "not a file path" in capsys.readouterr().err and not (tmp_path / "new").exists()
    assert L.launch(plan8, device="cpu", resume=True, report=str(tmp_path / "r" / "report.json")) == 2
    assert "--checkpoint-dir" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_report_rates_are_at_the_median_step_time():
    """With an even number of measured steps the median of tokens/s is not tokens over the median step time;
    the report gives the latter, so its step time and rates agree."""
    import torch
    from parallel_layers.train import RunOptions, build_report
    plan = tiny_plan(tp=1, seq_len=32)
    steps = [{"step": i + 1, "step_time_s": t, "tokens_per_s": 256 / t, "mfu": 0.01 / t}
             for i, t in enumerate([9.0, 1.0, 2.0, 3.0, 4.0])]
    rep = build_report(plan, RunOptions(steps=5, warmup_steps=1), torch.device("cpu"), steps, [{}], [1])
    med = rep["median"]
    assert med["step_time_s"] == 2.5
    assert med["tokens_per_s"] == pytest.approx(256 / 2.5) and med["mfu"] == pytest.approx(0.01 / 2.5)


def test_a_token_file_is_checked_before_any_rank_starts(tmp_path, capsys):
    """The runtime reads uint16 when the vocabulary fits 16 bits: a file of another width, a short one or one
    with ids past the vocabulary fails pre-flight with one line, not in every rank."""
    import numpy as np
    plan = write_plan(tiny_plan(tp=2), tmp_path / "plan.json")  # vocab 256, seq_len 32
    cases = {"odd.bin": np.zeros(101, dtype=np.uint8), "short.bin": np.zeros(20, dtype=np.uint16),
             "wide.bin": np.full(500, 70000, dtype=np.uint32)}
    words = {"odd.bin": "whole number", "short.bin": "need at least seq_len + 2", "wide.bin": ">= vocab 256"}
    for name, arr in cases.items():
        arr.tofile(tmp_path / name)
        assert L.launch(plan, device="cpu", report=str(tmp_path / "run" / name / "r.json"),
                        data=str(tmp_path / name)) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words[name] in err, (name, err)
    good = tmp_path / "good.bin"
    np.arange(500, dtype=np.uint16).__mod__(256).astype(np.uint16).tofile(good)
    assert L.launch(plan, dry_run=True, device="cpu", data=str(good)) == 0
    assert "[ok  ] data: " in capsys.readouterr().err


def test_data_dtype_reads_the_file_at_the_width_given(tmp_path, capsys):
    """--data-dtype uint32 reads a uint32 file for a vocabulary that fits 16 bits (the default would read
    every other token as 0); the width reaches the runtime; without --data it is refused."""
    import numpy as np
    plan = write_plan(tiny_plan(tp=2), tmp_path / "plan.json")  # vocab 256
    wide = tmp_path / "wide.bin"
    (np.arange(500, dtype=np.uint32) % 256).tofile(wide)
    assert L.check_data(str(wide), tiny_plan(tp=2), "uint32").ok
    # read as uint16 it is 1000 tokens, every other one 0, all in range: ids below 2^16 cannot tell the width ...
    assert L.check_data(str(wide), tiny_plan(tp=2)).ok
    (np.arange(500, dtype=np.uint32) + 70000).tofile(wide)  # ... but ids past 2^16 can
    c = L.check_data(str(wide), tiny_plan(tp=2))
    assert not c.ok and "--data-dtype uint32" in c.fix
    assert L.launch(plan, dry_run=True, device="cpu", data=str(wide), data_dtype="uint32") == 0
    out, err = capsys.readouterr()
    assert "--data-dtype uint32" in out and "FAIL] data" in err  # ids 70000+ are past vocab 256 at either width
    assert L.launch(plan, device="cpu", data_dtype="uint32", report=str(tmp_path / "r" / "r.json")) == 2
    assert "without --data" in capsys.readouterr().err


def test_resume_is_checked_against_the_saved_steps(tmp_path):
    ck = tmp_path / "ck"
    assert L.check_resume(str(ck), None, 5).ok  # nothing saved yet: starts from step 0
    for step in (2, 4):
        (ck / f"step_{step:08d}").mkdir(parents=True)
        (ck / f"step_{step:08d}" / ".metadata").write_text("")
    (ck / "step_00000006").mkdir()  # a save that did not finish: no .metadata
    c = L.check_resume(str(ck), None, 10)
    assert c.ok and "after step 4" in c.detail and "5..10" in c.detail
    c = L.check_resume(str(ck), 3, 10)
    assert not c.ok and "[2, 4]" in c.fix
    c = L.check_resume(str(ck), 6, 10)
    assert not c.ok and "step 6" in c.detail
    c = L.check_resume(str(ck), None, 4)
    assert not c.ok and "greater than 4" in c.fix
    assert L.check_resume(str(ck), 2, 4).ok
    # a checkpoint written before tp-independent keys (its TP shards keyed by tp rank) resumes with its own tp only:
    # read from the keys, without torch
    (ck / "step_00000004" / ".metadata").write_bytes(b"\x80\x04...model.blocks.0.attn.wq.weight@tp1of2...")
    c = L.check_resume(str(ck), None, 10, tp=1)
    assert not c.ok and "saved with tp=2" in c.detail and "keyed by tp rank" in c.detail and "tp=2 plan" in c.fix
    assert not L.check_resume(str(ck), None, 10, tp=4).ok
    assert L.check_resume(str(ck), None, 10, tp=2).ok
    # one of logical keys (a TP shard saved at its offsets in the logical tensor, as a tp-1 checkpoint's): any tp
    (ck / "step_00000004" / ".metadata").write_bytes(b"\x80\x04...model.blocks.0.attn.wq.weight...")
    assert all(L.check_resume(str(ck), None, 10, tp=tp).ok for tp in (1, 2, 4))
    assert L.check_resume(str(ck), 2, 10, tp=4).ok  # step 2's keys have no TP shard
    argv = L.torchrun_argv("p.json", nproc=1, steps=4, device="cpu", report="r.json", checkpoint_dir=str(ck),
                           resume_step=2)
    assert argv[-3:] == ["--resume", "--resume-step", "2"]


def test_cpu_ranks_must_fit_in_the_host_memory():
    """On cpu each rank holds at least the predicted weights, gradients, optimizer state and activations
    (not the prediction's CUDA context and buffers); an optimizer offloaded on cuda lives on the host too."""
    from planner.schema import Prediction

    plan = tiny_plan(tp=2)
    mem = dict(weights=1e9, grads=1e9, optimizer=2e9, activations=1e9, other=3e9, total=8e9)
    pred = dict(memory_bytes_per_gpu=mem, step_time_s=1.0, tokens_per_s=1.0, model_tflops_per_gpu=1.0,
                hardware_tflops_per_gpu=1.0, mfu=0.4, hfu=0.4, bubble_fraction=0.0, comm_bytes_per_step={},
                amdahl=dict(parallel_fraction=1, speedup=2), fits=True)
    plan.prediction = Prediction.model_validate(pred)
    host = lambda b: L.MachineInfo(torch_version="x", gpus=0, free_memory_bytes=None, host_available_bytes=b)  # noqa: E731
    c = L.check_memory(plan, "cpu", host(9.5e9), nproc=2)  # 2 x 5 GB of state > 9.5 GB
    assert not c.ok and c.exit_code == L.EXIT_DOES_NOT_FIT and "10.0 GB" in c.detail and "9.5 GB" in c.detail
    assert L.check_memory(plan, "cpu", host(10.5e9), nproc=2).ok  # the 3 GB of "other" is not counted
    assert L.check_memory(plan, "cpu", host(None), nproc=64).ok  # unknown: skipped
    plan.prediction = Prediction.model_validate({**pred, "memory_bytes_per_gpu": {**mem, "optimizer": 0.0,
                                                                                  "offloaded": 2e9, "total": 6e9}})
    gpu = L.MachineInfo(torch_version="x", gpus=8, free_memory_bytes=80e9, gpu_name="H100", host_available_bytes=15e9)
    c = L.check_memory(plan, "cuda", gpu, nproc=8)  # 8 ranks x 2 GB offloaded > 15 GB
    assert not c.ok and "offload 16.0 GB" in c.detail
    assert L.check_memory(plan, "cuda", gpu, nproc=4).ok


def test_the_plans_gpu_is_checked_against_this_one(tmp_path):
    """A plan predicted for another GPU, or naming a profile this machine cannot load, warns (the report's
    comparison, or its MFU, would be off) but does not stop the run."""
    plan = tiny_plan(tp=2)
    h100 = L.MachineInfo(torch_version="x", gpus=2, free_memory_bytes=80e9, gpu_name="NVIDIA H100 80GB HBM3")
    plan.hardware.name = "a100-sxm-80gb"
    c = L.check_hardware(plan, "cuda", h100)
    assert c.ok and "warning" in c.detail and "(A100)" in c.detail and "H100 profile" in c.detail
    plan.hardware.name = "h100-sxm-80gb"
    c = L.check_hardware(plan, "cuda", h100)
    assert c.ok and "warning" not in c.detail and "(H100)" in c.detail
    # the H100's PCIe card is not its SXM part (another peak, no NVSwitch): either way round, a warning
    pcie = L.MachineInfo(torch_version="x", gpus=2, free_memory_bytes=80e9, gpu_name="NVIDIA H100 PCIe")
    c = L.check_hardware(plan, "cuda", pcie)
    assert "warning" in c.detail and "(H100)" in c.detail and "H100 PCIE profile" in c.detail
    plan.hardware.name = "h100-pcie-80gb"
    assert "warning" not in L.check_hardware(plan, "cuda", pcie).detail
    assert "warning" in L.check_hardware(plan, "cuda", h100).detail
    # a profile calibrated on a PCIe card from the SXM part's (calibrate's base before h100-pcie-80gb shipped) is the
    # card's: its description's "calibrated on" names it
    from hardware_profiles import load_profile
    data = load_profile("h100-sxm-80gb").model_dump(mode="json")
    data.update(name="h100-sxm-80gb-calibrated", description=data["description"] + " -- calibrated on NVIDIA H100 PCIe")
    (tmp_path / "node.json").write_text(json.dumps(data))
    plan.hardware.name = str(tmp_path / "node.json")
    assert "warning" not in L.check_hardware(plan, "cuda", pcie).detail
    assert "warning" in L.check_hardware(plan, "cuda", h100).detail
    plan.hardware.name = str(tmp_path / "gone.toml")
    c = L.check_hardware(plan, "cuda", h100)
    assert c.ok and "does not load" in c.detail and "MFU will be null" in c.detail
    assert "not used on cpu" in L.check_hardware(plan, "cpu", NO_GPU).detail
    assert [L.gpu_family(n) for n in ("NVIDIA A100-SXM4-80GB", "NVIDIA GH200 480GB", "AMD Instinct MI300X", None)] == \
        ["A100", "GH200", "MI300X", None]


def test_a_plan_edited_after_its_prediction_is_re_predicted():
    """launch compares the run with the plan's own layout: a prediction left from before an edit (or none) is
    replaced by evaluate_plan's, with a warning; an unedited plan keeps its own."""
    from planner.core import recommend
    from planner.models import load_preset
    plan = recommend(load_preset("tiny-llama-test"), 1, seq_len=256, global_batch_size=8, suggest=False)
    same, c = L.repredict(plan)
    assert same is plan and c.ok and "the same" in c.detail
    edited = plan.model_copy(deep=True)
    edited.training.micro_batch_size, edited.training.num_microbatches = 8, 1
    if plan.training.micro_batch_size == 8:
        edited.training.micro_batch_size, edited.training.num_microbatches = 1, 8
    fresh, c = L.repredict(edited)
    assert c.ok and c.detail.startswith("warning: the plan's prediction")
    assert fresh.prediction.memory_bytes_per_gpu.total != plan.prediction.memory_bytes_per_gpu.total
    assert fresh.training.micro_batch_size == edited.training.micro_batch_size
    bare = plan.model_copy(update={"prediction": None})
    fresh, c = L.repredict(bare)
    assert fresh.prediction is not None and "carried none" in c.detail
    assert fresh.prediction.step_time_s == pytest.approx(plan.prediction.step_time_s)
    gone = plan.model_copy(deep=True)
    gone.hardware.name = "/nonexistent/profile.toml"
    kept, c = L.repredict(gone)
    assert kept is gone and c.ok and "cannot re-predict" in c.detail


def test_output_folders_that_are_files_fail_before_the_run(plan8, tmp_path, capsys):
    """--checkpoint-dir, --memory-snapshot and --profile are folders the job writes after training: a file there (or
    on the way) used to fail the run at its end, with no report."""
    f = tmp_path / "f"
    f.write_text("x")
    for opt in ("checkpoint_dir", "memory_snapshot", "profile"):
        for path in (f, f / "sub"):
            assert L.launch(plan8, device="cpu", report=str(tmp_path / "r" / "r.json"), **{opt: str(path)}) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "is a file, not a folder" in err, err
    assert L.check_folder("--checkpoint-dir", str(tmp_path / "new" / "ck")) is None
    assert not (tmp_path / "r").exists()


def test_output_folders_that_cannot_be_written_fail_before_the_run(plan8, tmp_path, capsys):
    """The same for a folder nobody may write in (/proc, even as root; a locked folder for a user): the job had
    trained every step and then failed at its first save ("CheckpointException ranks:dict_keys([0])")."""
    if not Path("/proc").is_dir() or L.can_make_folder_in("/proc"):
        pytest.skip("needs a /proc no folder can be made in")
    for opt in ("checkpoint_dir", "memory_snapshot", "profile"):
        assert L.launch(plan8, device="cpu", report=str(tmp_path / "r" / "r.json"), **{opt: "/proc/parplan-x"}) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot write in /proc" in err and "a folder you can write" in err, err
    assert not (tmp_path / "r").exists()


def test_fsdp2_offload_with_host_gradient_sums_is_refused_on_cuda():
    """FSDP2's CPU offload keeps gradient shards on the host; SP's (and cp's, and tied embeddings') gradient sums
    would all-reduce them over NCCL: refused on cuda, allowed on gloo (cpu), where every tensor is a host one."""
    plan = tiny_plan(tp=2, dp=2, zero_stage=3, offload="optimizer", sp=True)
    c = L.check_runtime_support(plan, "cuda")
    assert not c.ok and "FSDP2 optimizer offload with sequence parallelism" in c.detail
    assert L.check_runtime_support(plan, "cpu").ok
    plan = tiny_plan(tp=1, dp=4, zero_stage=3, offload="optimizer")
    assert L.check_runtime_support(plan, "cuda").ok


def test_a_pipeline_rank_with_nothing_to_train_is_refused():
    """A hand-edited pp past the layers leaves middle ranks with no block, embedding or head: the run had failed
    on that rank ("optimizer got an empty parameter list"); the ends, holding the embedding and the head, and the
    search's uneven interleaved stages are fine."""
    layers = tiny_plan().model.layers
    plan = tiny_plan(pp=layers + 4, global_batch_size=16)
    c = L.check_runtime_support(plan, "cpu")
    assert not c.ok and "with no block, embedding or head" in c.detail, c
    assert L.check_runtime_support(tiny_plan(pp=layers + 2, global_batch_size=16), "cpu").ok
    assert L.check_runtime_support(tiny_plan(pp=2, vpp=layers // 2 + 1, schedule="interleaved-1f1b",
                                             global_batch_size=16), "cpu").ok


def test_a_node_without_global_rank_0_exits_0_and_says_where_the_report_is(plan8, tmp_path, monkeypatch, capsys):
    """Multi-node: global rank 0 writes the report on its own node; the other nodes' launch had read a report they do
    not have and exited 1 after a good run.  Node 1 here: its job succeeds and writes nothing."""
    monkeypatch.setattr(L, "run_job", lambda argv, env, steps, log: (0, [], []))
    monkeypatch.setattr(L, "check_cpu_time", lambda *a, **k: L.Check("time", True, "test"))
    report = tmp_path / "run" / "report.json"
    code = L.launch(plan8, device="cpu", steps=2, nnodes=2, node_rank=1, nproc_per_node=4,
                    rdzv_endpoint="127.0.0.1:29611", report=str(report))
    err = capsys.readouterr().err
    assert code == 0 and not report.exists(), err
    assert "node 1" in err and "global rank 0" in err
    # a report an earlier run left there is not this run's: the same answer
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps({"plan": {}, "steps": [], "world_size": 8}))  # an earlier launch's report
    code = L.launch(plan8, device="cpu", steps=2, nnodes=2, node_rank=1, nproc_per_node=4,
                    rdzv_endpoint="127.0.0.1:29611", report=str(report))
    err = capsys.readouterr().err
    assert code == 0 and "global rank 0" in err and "unreadable" not in err, err
    # one node: a missing report after a good run is still an error
    code = L.launch(plan8, device="cpu", steps=2, nproc_per_node=8, report=str(tmp_path / "one" / "report.json"))
    assert code == 1 and "unreadable" in capsys.readouterr().err


def test_the_rule_check_follows_parplans_runtime_whatever_profile_or_framework():
    """Launch refuses a plan that breaks a rule of the runtime it runs (ZeRO-3 under a zero-bubble schedule with
    op-level checkpoints had crashed every rank), judged as parplan's runtime judges it: a Megatron plan whose
    micro-batches torch's interleaved schedule runs is launched; and a plan whose profile file is not on this machine
    is still checked (the rules do not depend on the GPU)."""
    bad = tiny_plan(pp=2, dp=2, vpp=2, schedule="zbv", zero_stage=3, recompute="selective-op", global_batch_size=8)
    c = L.check_rules(L.repredict(bad)[0])
    assert c is not None and not c.ok and "zero-bubble" in c.detail and "recompute selective or none" in c.fix
    elsewhere = bad.model_copy(update={"hardware": bad.hardware.model_copy(update={"name": "/nowhere/my-h100.toml"})})
    c = L.check_rules(elsewhere)
    assert c is not None and not c.ok and "zero-bubble" in c.detail
    assert L.check_rules(L.repredict(tiny_plan(pp=2, dp=2, vpp=2, schedule="zbv", global_batch_size=8))[0]) is None
    # 6 micro-batches over pp 4: torch's interleaved 1F1B runs them in rounds, Megatron wants a multiple of pp
    torch_ok = tiny_plan({**TINY_LLAMA, "layers": 8}, pp=4, dp=1, vpp=2, schedule="interleaved-1f1b",
                         global_batch_size=6)
    meg = torch_ok.model_copy(update={"training": torch_ok.training.model_copy(update={"framework": "megatron"})})
    from planner.core import evaluate_plan
    assert not evaluate_plan(meg).prediction.fits  # Megatron's rule, which the plan's own prediction names
    assert L.check_rules(meg) is None


def test_checkpoint_options_that_would_lose_or_mix_runs_are_refused(plan8, capsys, tmp_path):
    """--resume on a folder with no checkpoint (a misspelt path) had trained from step 0 without a word; a fresh run
    into a folder of another run's checkpoints had written its steps among them; --checkpoint-every without
    --checkpoint-dir had been dropped."""
    def fails(**kw):
        assert L.launch(plan8, dry_run=True, device="cpu", steps=10, report=str(tmp_path / "r" / "report.json"),
                        **kw) == 0
        return [ln for ln in capsys.readouterr().err.splitlines() if "[FAIL] checkpoint" in ln]

    assert "no checkpoint under" in fails(checkpoint_dir=str(tmp_path / "nock"), resume=True)[0]
    ck = tmp_path / "ck"
    (ck / "step_00000004").mkdir(parents=True)
    (ck / "step_00000004" / ".metadata").write_bytes(b"model.blocks.0.attn.wq.weight@tp1of2")  # plan8's tp 2
    assert "holds checkpoints of an earlier run (steps 4)" in fails(checkpoint_dir=str(ck))[0]
    assert not fails(checkpoint_dir=str(ck), resume=True)  # continuing that run is what the folder is for
    assert not fails(checkpoint_dir=str(tmp_path / "fresh"), checkpoint_every=2)
    assert "without --checkpoint-dir" in fails(checkpoint_every=2)[0]


def test_the_same_plan_beside_the_report_is_not_another_plan(plan8, capsys, tmp_path):
    """A plan.json holding this plan, formatted otherwise (recommend's output, say), is the run's own: not refused."""
    d = tmp_path / "r"
    d.mkdir()
    (d / "plan.json").write_text(json.dumps(json.loads(open(plan8).read())))  # compact, not the run's indent-2 layout
    assert L.launch(plan8, dry_run=True, device="cpu", report=str(d / "report.json")) == 0
    assert "FAIL" not in capsys.readouterr().err
    other = json.loads(open(plan8).read())
    other["training"]["seq_len"] *= 2  # another job
    (d / "plan.json").write_text(json.dumps(other))
    assert L.launch(plan8, dry_run=True, device="cpu", report=str(d / "report.json")) == 0
    assert "holds another plan" in capsys.readouterr().err


def test_the_cpu_device_line_names_the_math_the_ranks_will_do():
    """The device check says what a CPU run computes in, as the report's note does: a bf16 master-weights plan runs
    bf16 parameters (it had said "fp32 math" for every plan)."""
    amp = tiny_plan()
    master = tiny_plan(precision="master-weights")
    master = master.model_copy(update={"training": master.training.model_copy(update={"dtype": "bf16"})})
    assert "fp32 math" in L.resolve_device("cpu", NO_GPU, amp)[1].detail
    line = L.resolve_device("cpu", NO_GPU, master)[1].detail
    assert "bf16 parameters with fp32 masters (master-weights)" in line and "fp32 math" not in line


def test_the_dry_runs_device_line_is_the_plans(tmp_path, capsys):
    master = tiny_plan(precision="master-weights")
    master = master.model_copy(update={"training": master.training.model_copy(update={"dtype": "bf16"})})
    assert L.launch(write_plan(master, tmp_path / "plan.json"), dry_run=True, device="cpu") == 0
    assert "device: cpu (gloo, bf16 parameters with fp32 masters" in capsys.readouterr().err


def test_a_cpu_run_with_optimizer_offload_is_compared_with_what_it_offloads_too():
    """On the CPU the "host" is the device: an offloaded optimizer's states sit in the allocator the run traces, so
    the report compares the traced peak with the GPU's total plus what is offloaded, and says so (it had compared
    the total alone: -7 % where the same plan without offload read +10 %)."""
    import torch
    from parallel_layers.train import RunOptions, build_report
    from planner.core import evaluate_plan
    plan = tiny_plan(tp=1, pp=1, dp=2, seq_len=32, precision="fp32")
    plan = evaluate_plan(plan.model_copy(update={"parallel": plan.parallel.model_copy(
        update={"zero_stage": 1, "offload": "optimizer"})}))
    mem = plan.prediction.memory_bytes_per_gpu
    assert mem.offloaded > 0
    traced = [{"allocated": 3e6, "allocated_without_collective_buffers": 2e6}] * 2
    steps = [{"step": 1, "step_time_s": 1.0, "tokens_per_s": 1.0, "mfu": None}]
    cm = build_report(plan, RunOptions(steps=1), torch.device("cpu"), steps, traced, [1, 1])["cpu_memory"]
    assert cm["predicted"] == pytest.approx(mem.total + mem.offloaded) and "offloaded" in cm["note"]
    line = L.cpu_memory_line({"cpu_memory": cm})
    assert "%" in line and "offloaded" in line


def test_checklist_marks_warnings_and_what_this_machine_cannot_settle():
    """A passed check that warns reads [warn] (it had read [ok  ] "warning: ..."); one a GPU-less machine cannot
    settle for a cuda plan reads [--  ]: the world size, and the profile (it had said "not used on cuda")."""
    assert L.Check("cpu time", True, "warning: at least 3 h a step").line() == "[warn] cpu time: at least 3 h a step"
    assert L.Check("torch", True, "torch 2.13").line() == "[ok  ] torch: torch 2.13"
    assert L.Check("device", False, "no GPU", "add --device cpu").line() == "[FAIL] device: no GPU -- fix: add --device cpu"
    plan = tiny_plan(TINY_LLAMA, tp=2)
    hw = L.check_hardware(plan, "cuda", NO_GPU)
    assert hw.ok and hw.line().startswith("[--  ] hardware: ") and "not used" not in hw.line()
    assert L.check_hardware(plan, "cpu", NO_GPU).line().startswith("[ok  ] hardware: ")
    nproc, world = L.check_world(plan, "cuda", NO_GPU, 1, None)
    assert world.ok and world.line().startswith("[--  ] world size: ") and "has none" in world.line()


def test_a_single_node_says_it_leaves_the_rendezvous_endpoint_unused():
    assert L.check_rendezvous(1, 0, None).detail == "single node (--standalone)"
    said = L.check_rendezvous(1, 0, "foo:29500")
    assert said.ok and "--rdzv-endpoint foo:29500 is not used" in said.detail


def test_a_cpu_runs_phases_line_names_no_device():
    """On CPU the host runs what it dispatches: the phases line had said 'the device done with it' 0.1 ms after the
    host finished dispatching."""
    steps = [{"host_dispatch_s": 0.3427, "fwd_bwd_s": 0.3428, "after_s": 0.05}] * 3
    line = L.phases_line({"device": "cpu", "steps": steps, "warmup_steps": 1})
    assert line == ("phases (rank 0, median): the forward/backward done at 342.8 ms, then 50.0 ms of gradient "
                    "reduction and optimizer step")
    assert "device" in L.phases_line({"device": "cuda", "steps": steps, "warmup_steps": 1})


@pytest.mark.parametrize("code", [0, 1])
def test_torchruns_log_folder_is_launchs_own_and_goes_with_the_job(plan8, tmp_path, monkeypatch, capsys, code):
    """torchrun's agent made a /tmp/torchelastic_* folder per launch and left it (26 launches, 26 empty folders):
    launch hands it a folder of its own (--log-dir, a torchrun option, so before the -m) and removes it when the
    job ends, failed or not."""
    seen = {}

    def job(argv, env, steps, log):
        at = argv.index("--log-dir")
        seen["dir"], seen["before_m"] = argv[at + 1], at < argv.index("-m", at)
        seen["existed"] = os.path.isdir(argv[at + 1])
        Path(argv[at + 1], "attempt_0").mkdir()  # what torchrun makes in it
        return code, [], ["boom"]
    monkeypatch.setattr(L, "run_job", job)
    monkeypatch.setattr(L, "check_cpu_time", lambda *a, **k: L.Check("time", True, "test"))
    L.launch(plan8, device="cpu", steps=2, nproc_per_node=8, report=str(tmp_path / "run" / "report.json"))
    assert seen["existed"] and seen["before_m"] and Path(seen["dir"]).name.startswith("parplan_torchrun_")
    assert not os.path.exists(seen["dir"])
    assert f"--log-dir {seen['dir']}" in capsys.readouterr().err  # the command it says it runs is the one it runs


def test_a_hand_edited_split_is_said_and_predicted_as_its_own(tmp_path, capsys):
    """The runtime trains the plan's stage_layers, and since the thirty-eighth session the prediction is that split's
    too: a hand-edited [5, 1, 1, 1] is said as such, and rank 0's predicted memory holds five blocks, not two (a
    helper's audit had found [77, 1, 1, 1] of llama3-70b passing the dry run with the default split's memory)."""
    from planner.core import evaluate_plan
    plan = tiny_plan({**TINY_LLAMA, "layers": 8}, pp=4, dp=1, global_batch_size=8)
    assert L.check_split(plan) is None
    even = evaluate_plan(plan).prediction.memory_bytes_per_gpu.by_stage
    plan.parallel.stage_layers = [5, 1, 1, 1]
    c = L.check_split(plan)
    assert c.ok and c.line().startswith("[ok  ] split: stage_layers [5, 1 x3] (the default split is [2 x4])")
    own = evaluate_plan(plan).prediction
    assert own.memory_bytes_per_gpu.by_stage["first"] > even["first"]
    assert own.memory_bytes_per_gpu.by_stage["last"] < even["last"]
    assert not any("split" in w for w in own.warnings)
    assert L.launch(write_plan(plan, tmp_path / "p.json"), dry_run=True, device="cpu") == 0
    assert "[ok  ] split: stage_layers [5, 1 x3]" in capsys.readouterr().err


def test_what_the_dry_run_could_not_check_or_the_plan_says_does_not_fit_is_not_ok():
    """A profile this machine lacks leaves the plan's own prediction unchecked ([--  ], not [ok  ]); without a GPU the
    free memory is unknown ([--  ]), but a plan whose own prediction says its GPU cannot hold it fails."""
    from planner.core import evaluate_plan
    plan = tiny_plan(tp=2, pp=2, dp=2)
    lost = plan.model_copy(update={"hardware": plan.hardware.model_copy(update={"name": "h100-sxm-8gb"})})
    assert L.repredict(lost)[1].line().startswith("[--  ] prediction: the plan's own (cannot re-predict")
    assert L.check_memory(evaluate_plan(plan), "cuda", NO_GPU).line().startswith("[--  ] memory:")
    big = tiny_plan({**TINY_LLAMA, "hidden": 8192, "heads": 64, "kv_heads": 64, "ffn_hidden": 28672, "layers": 160,
                     "vocab": 128000}, tp=1, pp=1, dp=1, precision="master-weights")
    pred = evaluate_plan(big)
    assert not pred.prediction.fits
    c = L.check_memory(pred, "cuda", NO_GPU)
    assert not c.ok and c.exit_code == L.EXIT_DOES_NOT_FIT and "does not fit h100-sxm-80gb" in c.detail


def test_a_layout_the_plans_framework_refuses_is_launched_as_parplans_runtime_runs_it():
    """launch runs parplan's runtime whatever framework the plan names (README): a DeepSpeed plan hand-edited to ZeRO-3
    in a pipeline, which DeepSpeed's engine refuses and parplan's runtime runs, had failed the pre-flight with the
    DeepSpeed rule; it is re-predicted as parplan's, with a warning."""
    plan = tiny_plan(pp=2, dp=2, zero_stage=3, global_batch_size=8)
    plan.training.framework = "deepspeed"
    fresh, c = L.repredict(plan)
    assert c.ok and c.line().startswith("[warn] prediction: DeepSpeed") and "parplan's runtime, which launch runs" in c.detail
    assert fresh.training.framework == "parplan" and fresh.prediction is not None


def test_a_gpu_less_dry_run_of_a_multi_node_plan_names_its_node_count():
    """Off a GPU machine the world size cannot be checked; for a plan past one node it says the --nnodes its nodes
    take (it had named one node of 32 GPUs)."""
    plan = tiny_plan({**TINY_LLAMA, "layers": 8}, tp=2, pp=4, dp=4, global_batch_size=16)
    nproc, c = L.check_world(plan, "cuda", NO_GPU, 1, None)
    assert c.line().startswith("[--  ] world size") and c.detail.endswith("the plan's 8-GPU nodes would run it with "
                                                                            "--nnodes 4")
    assert "--nnodes" not in L.check_world(tiny_plan(tp=2, pp=2, dp=2), "cuda", NO_GPU, 1, None)[1].detail


def test_a_report_inside_a_folder_the_user_may_not_enter_is_a_failed_check(plan8, tmp_path, capsys, monkeypatch):
    """--report in a folder the user may not enter (as a non-root user meets chmod 000): a dry run shows a [FAIL] line
    with the fix, where the report checks had raised PermissionError from Path.is_dir."""
    locked = tmp_path / "locked"
    real_exists = Path.exists

    def exists(self, *a, **k):
        if str(self).startswith(str(locked) + "/"):
            raise PermissionError(13, "Permission denied", str(self))
        return real_exists(self, *a, **k)
    monkeypatch.setattr(Path, "exists", exists)
    assert L.launch(plan8, device="cpu", report=str(locked / "r.json"), dry_run=True) == 0
    err = capsys.readouterr().err
    assert "[FAIL] report: --report " in err and "permission denied on the way to it" in err, err
    assert "1 check failed" in err


def test_a_report_that_is_a_device_is_a_failed_check(plan8, capsys):
    """--report /dev/null passed every check and would have written plan.json and torchrun.log into /dev."""
    if not Path("/dev/null").exists():
        pytest.skip("needs /dev/null")
    assert L.launch(plan8, device="cpu", report="/dev/null", dry_run=True) == 0
    err = capsys.readouterr().err
    assert "[FAIL] report: --report /dev/null is a device" in err and "1 check failed" in err, err


def test_a_strict_dry_run_exits_with_its_failed_checks_code(plan8, capsys, tmp_path):
    """`--dry-run` prints the command and exits 0 whatever its checks say (a preview on a login node); `--strict`
    exits as the run would have stopped, so a script or CI step sees the failure; without --dry-run it is refused."""
    import subprocess
    import sys
    assert L.launch(plan8, dry_run=True, device="cpu", nnodes=3) == 0
    assert L.launch(plan8, dry_run=True, device="cpu", nnodes=3, strict=True) == 2
    out, err = capsys.readouterr()
    assert "--rdzv-endpoint '<HOST:PORT>'" in out and "checks failed" in err
    assert L.launch(plan8, dry_run=True, device="cpu", strict=True, report=str(tmp_path / "r" / "report.json")) == 0
    cli = subprocess.run([sys.executable, "-m", "planner.cli", "launch", str(plan8), "--device", "cpu", "--strict"],
                         capture_output=True, text=True)
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1 and "add --dry-run" in cli.stderr


def test_a_rendezvous_host_that_does_not_resolve_here_fails_the_check():
    """A multi-node endpoint whose host this node cannot resolve fails before the job starts (torchrun's rendezvous
    would wait out its timeout on it); an address, localhost and a bracketed IPv6 address pass."""
    bad = L.check_rendezvous(2, 0, "no-such-host.invalid:29500")
    assert not bad.ok and "does not resolve on this machine" in bad.detail and "/etc/hosts" in bad.fix
    for good in ("127.0.0.1:29500", "localhost:29500", "[::1]:29500"):
        assert L.check_rendezvous(2, 1, good).ok, good
