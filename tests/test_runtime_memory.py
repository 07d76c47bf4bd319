"""The memory model against what the runtime holds, on CPU, traced through the CPU allocator
(``--memory-snapshot`` on cpu, parallel_layers/host_memory.py): every ZeRO stage with and without a
pipeline, and every pipeline schedule.

LAYOUTS: the model is wide and the sequence short, so model states (bf16 parameters, fp32 gradients,
fp32 masters and AdamW states: the master-weights recipe, which the CPU runs in the GPU's storage
dtypes) are ~99 % of the peak and the comparison checks the ZeRO-2 / ZeRO-3 / pipeline accounting.
SCHEDULES: a narrow model at 1,024 tokens per micro-batch (512 in this test: ``runs``) over four pipeline ranks (and sequence
parallelism at tp 2 x pp 2, tp 4, and cp 2 x tp 2), so saved
activations, the micro-batches each schedule keeps (pending weight gradients for the zero-bubble
ones) and the pipeline's receive buffers dominate.  gloo's own collective staging buffers are left
out (NCCL writes into the caller's tensors).  Measured (4 ranks, torch 2.13 CPU, three runs,
benchmarks/results/2026-11-23-cpu-memory): the model within -3.6 .. +6.3 % of the largest rank's
peak everywhere (22 plans); ZeRO-2's and FSDP2's peaks move by a few % between runs (a gradient that gloo frees
on its own thread is seen free only when its address is handed out again).  Each pipeline rank kind
against its own rank: -6.7 .. +6.3 % (ZB-V + SP's rank 0 moves between runs: -3.8 .. -9.1 % over six).
Since the runtime allocates pipeline receive buffers just in time (parallel_layers.pipeline.
just_in_time_receives; one run, benchmarks/results/2026-11-23-cpu-memory-jit): -6.9 .. +5.1 % of the
largest rank's peak, each rank kind -7.8 .. +5.2 %.  With selective recompute
under CP (23 plans, one run, benchmarks/results/2026-11-24-cpu-memory-cpsel): -8.5 .. +3.4 %, each rank kind
-8.5 .. +4.4 %.  The latest, with ZeRO-1/2's even split (one run, benchmarks/results/2026-11-24-cpu-memory-zerosplit):
-8.5 .. +5.0 %, each rank kind -8.5 .. +6.0 %.  With the gradient reduction during the backward (one run,
benchmarks/results/2026-11-24-cpu-memory-overlap): -8.5 .. +6.0 %, each rank kind -8.5 .. +6.6 %.  With the
zero-bubble weight passes queued (layers.WeightGradStore; one run, benchmarks/results/2026-11-25-cpu-memory-zbqueued):
-4.2 .. +6.8 %, each rank kind -5.4 .. +7.4 %; zbv -3.8 %, interleaved-zb -3.8 %, zbv-full +6.8 % (its rank kinds
+4.8 .. +7.4 %), interleaved-zb-selective-op -0.0 %; re-predicted since ZB-V's cool-down moment holds no input pass's
working memory (memory_breakdown's stage_total): -4.2 .. +4.1 %, zbv-full -0.7 % (its last rank).  The fused cross-entropy's case (2026-11-24, one run of that case
alone): 284.9 MiB measured, 280.6 predicted (-1.5 %)."""
from __future__ import annotations

import json

import pytest
import torch

from parallel_layers.host_memory import CpuMemoryTrace, _replay
from planner.core import evaluate_plan
from planner.launch import rank_kind_memory
from tests.runtime_helpers import suite
from tests.runtime_helpers.plans import tiny_plan, write_plan

WIDE = dict(arch="llama", layers=4, hidden=1024, heads=8, kv_heads=8, ffn_hidden=2816, vocab=4096)
# name -> (layers, parallel): 4 ranks each
LAYOUTS = {
    "zero0-pp2": (4, dict(tp=1, pp=2, dp=2, zero_stage=0)),
    "zero1-pp2": (4, dict(tp=1, pp=2, dp=2, zero_stage=1)),
    "zero2-pp2": (4, dict(tp=1, pp=2, dp=2, zero_stage=2)),
    "zero2-pp1": (4, dict(tp=1, pp=1, dp=4, zero_stage=2)),
    "fsdp2-pp1": (4, dict(tp=1, pp=1, dp=4, zero_stage=3)),
    # hybrid sharding: FSDP2 over (2 replicas, 2 shards), each rank holding half the model states (fsdp2-pp1: a
    # quarter), and each reduced block's all-reduce input to the backward's end (memory's hsdp_held): one run
    # (2026-12-05, benchmarks/results/2026-12-05-cpu-memory-hsdp) -8.2 % without that term, +2.6 % with it
    "hsdp-pp1": (4, dict(tp=1, pp=1, dp=4, zero_stage=3, dp_replicate=2)),
    # four blocks per stage: FSDP2 inside torch.distributed.pipelining keeps gathered weights
    "fsdp2-pp2": (8, dict(tp=1, pp=2, dp=2, zero_stage=3)),
    # 16-bit gradients: the optimizer step makes fp32 copies of its share's gradients, all before it steps
    # (memory.step_grad_copy_coefficient), so with these model states the peak is the step, not the backward.
    # One run (2026-12-02): 1140.2 MiB measured, 967.2 predicted without the copies (-15.2 %), 1140.2 with them;
    # zero 1 x pp 2 (copies of half the gradients, the backward still the peak): -0.6 % -> -0.1 %, not kept here
    # for CI's time
    "zero0-half-grads": (4, dict(tp=1, pp=1, dp=4, zero_stage=0, precision="master-weights-half-grads")),
    # FSDP2 reduces 16-bit gradients but keeps the shards' gradients in fp32 (the reduce-scatter's output is cast
    # to the sharded parameter's dtype)
    "fsdp2-pp1-half-grads": (4, dict(tp=1, pp=1, dp=4, zero_stage=3, precision="master-weights-half-grads")),
    # a rank whose gradients fill less than one 25 MiB bucket (ZB-V's rank 1: two blocks of hidden 512, 24 MiB of fp32
    # gradients) makes its flat copy only after its last backward, with no activation left (memory.flat_bucket_bytes);
    # rank 0 (the ends, 40 MiB) starts one whole bucket inside it.  Charged 2 x 25 MiB at the backward, a 20M-parameter
    # plan of this kind had read its rank 1 at +53 % (2026-12-03)
    "zero1-zbv-small-grads": (4, dict(tp=1, pp=2, dp=2, zero_stage=1, schedule="zbv", vpp=2, hidden=512,
                                      ffn_hidden=1408)),
}
# Activations: a narrow model at 1,024 tokens per micro-batch, eight micro-batches over four pipeline
# ranks, so saved activations, the micro-batches each schedule keeps in flight and the pipeline's
# receive buffers dominate (llama, 8 layers, hidden 256, ffn 704, 4 heads, vocab 512, seq 512, mbs 2; this test runs
# them at mbs 1, 512 tokens per micro-batch: the fixture below).
NARROW = dict(arch="llama", layers=8, hidden=256, heads=4, kv_heads=4, ffn_hidden=704, vocab=512)
SCHEDULES = {
    "gpipe": dict(schedule="gpipe"),
    "1f1b": dict(schedule="1f1b"),
    "interleaved-1f1b": dict(schedule="interleaved-1f1b", vpp=2),
    # uneven virtual stages, as Llama 3 405B's 126 layers on pp 16 x vpp 8: six blocks on 4 x 2 stages leave
    # stage 0 (rank 0's first chunk, the most micro-batches in flight) and stage 7 without a block
    # (cost_models.memory.interleaved_block_peak)
    "interleaved-uneven": dict(schedule="interleaved-1f1b", vpp=2, layers=6),
    "1f1b-selective": dict(schedule="1f1b", recompute="selective"),
    "1f1b-full": dict(schedule="1f1b", recompute="full"),
    # the first of each stage's two blocks recomputed, the second keeping its activations (recompute_layers: the
    # chord of memory.partial_recompute_memory)
    "1f1b-full-1-of-2": dict(schedule="1f1b", recompute="full", recompute_layers=1),
    # torchtitan's op-level selective checkpointing: block input, every second matmul's output and the
    # attention kernel's output and log-sum-exp saved; with SP the down projection's output is the whole
    # sequence's partial sum (cost_models.memory.activation_bytes_per_layer)
    "1f1b-selective-op": dict(schedule="1f1b", recompute="selective-op"),
    "tp2-sp-pp2-selective-op": dict(tp=2, pp=2, schedule="1f1b", sp=True, recompute="selective-op"),
    # deferred weight-gradient passes (counted from torch's action orders: cost_models.memory.rank_inflight)
    "zbv": dict(schedule="zbv", vpp=2),
    "interleaved-zb": dict(schedule="interleaved-zb", vpp=2),
    # a plan's own split (ModelDims.split, since the thirty-eighth session): blocks piled on rank 0, and ZB-V with
    # rank 0's two chunks of 1 and 0 blocks, whose micro-batches the walk of torch's order weighs by their blocks
    # (zbv_order_moments; rank 0 read -34.9 % when they counted as four of each; benchmarks/split_memory.py)
    "1f1b-split": dict(schedule="1f1b", stage_layers=[4, 2, 1, 1]),
    # a head stage without blocks (as `recommend --split balanced` gives a small model with a large vocabulary): its
    # peak is the loss's backward, where the schedule's forward cache still holds the 16-bit logits beside the three
    # fp32 logit-sized tensors (memory.cached_logits_bytes; the last rank read -15.0 % before it counted them)
    "1f1b-head-only": dict(schedule="1f1b", stage_layers=[2, 3, 3, 0]),
    "zbv-split": dict(schedule="zbv", vpp=2, stage_layers=[1, 1, 1, 2, 1, 1, 1, 0]),
    # ZB-V's default split of 10 blocks over 8 stages, 1, 2, 2, 1, 1, 1, 1, 1: ranks 1 and 2 hold chunks of 2 and 1
    # (the largest rank read -15.0 % while the closed forms counted their chunks alike; memory.zbv_counts)
    "zbv-uneven": dict(schedule="zbv", vpp=2, layers=10),
    # interleaved zero-bubble with rank 0's chunks of 2 and 1 blocks and the last rank's of 1 and 0: torch's order
    # walked with each chunk weighed by its blocks (memory.izb_order_moments; the largest rank read -17.3 %, the last
    # -32.6 %, while the chunks counted alike)
    "izb-split": dict(schedule="interleaved-zb", vpp=2, stage_layers=[2, 1, 1, 1, 1, 1, 1, 0]),
    # the first block of each stage recomputed over stages of 2, 3, 3 and 0 blocks: rank 0 recomputes half of its
    # blocks, the middle ranks a third (layout.rank_recomputed_shares; rank 0 read +14.6 % at micro-batch 2, +10.1 %
    # at the test's 1, while every rank was charged the largest stage's third; +2.5 / +1.6 % since)
    "1f1b-full-1-split": dict(schedule="1f1b", recompute="full", recompute_layers=1, stage_layers=[2, 3, 3, 0]),
    # ...and under whole-block recompute (the weight passes run from queued closures, layers.WeightGradStore: a
    # pending block keeps its linears' inputs and output gradients, not its graph; cost_models.memory.
    # queued_w_bytes_per_layer)
    "zbv-full": dict(schedule="zbv", vpp=2, recompute="full"),
    "interleaved-zb-selective-op": dict(schedule="interleaved-zb", vpp=2, recompute="selective-op"),
    # sequence parallelism: the column-parallel matmuls keep their input's shard and gather it again
    # in the backward (under ZB-V in the weight-gradient pass); tp 4 without a pipeline; with context
    # parallelism
    "tp2-sp-pp2": dict(tp=2, pp=2, schedule="1f1b", sp=True),
    "tp2-sp-pp2-zbv": dict(tp=2, pp=2, schedule="zbv", vpp=2, sp=True),
    # Without a pipeline the peak is a later micro-batch's backward over gradients that already exist, so the
    # plans with dp 1 run two micro-batches (global batch 4), not eight: the model predicts the same bytes, and
    # one run at each (4 ranks, 2026-11-28) measured -1.1 / -1.8 / -0.5 / -2.0 % with eight and -0.6 / -2.2 /
    # +0.2 / -1.1 % with two, in 23.5 s instead of 92.7 s (test time on CI's 2 cores, not coverage)
    "tp4-sp": dict(tp=4, pp=1, sp=True, global_batch_size=4),
    "cp2-tp2-sp": dict(tp=2, pp=1, cp=2, sp=True, global_batch_size=4),
    # selective recompute with cp: the gather is checkpointed with the attention, so the rank's own K/V are
    # saved, not the gathered sequence (one run: 79.0 -> 77.0 MiB measured, model 79.2 -> 76.5)
    "cp2-tp2-sp-selective": dict(tp=2, pp=1, cp=2, sp=True, recompute="selective", global_batch_size=4),
    # op-level selective checkpointing with cp: the gathered K/V are not kept (the recompute gathers again)
    "cp2-tp2-sp-selective-op": dict(tp=2, pp=1, cp=2, sp=True, recompute="selective-op", global_batch_size=4),
    # torchtitan's 1D layout in small: FSDP2 over 4 ranks, op-level selective checkpointing, a vocabulary 128x
    # the hidden size (Llama 3 8B: 31x) so the loss's fp32 logit-sized tensors make the peak
    "fsdp2-selective-op-vocab32k": dict(tp=1, pp=1, dp=4, zero_stage=3, recompute="selective-op", vocab=32768),
    # the same with the fused cross-entropy (layers.fused_vocab_parallel_cross_entropy): the 16-bit logits and
    # their 16-bit gradient instead of three fp32 logit-sized tensors at the loss's backward
    "fsdp2-selective-op-vocab32k-fused-loss": dict(tp=1, pp=1, dp=4, zero_stage=3, recompute="selective-op",
                                                   vocab=32768, fused_loss=True),
}
BAR = 0.10  # the memory bar for GPU runs
# cases added after benchmarks/results/2026-11-25-cpu-memory-fp32 was run (test_fp32_recipe_memory_against_the_committed_cpu_run)
ADDED_AFTER_THE_FP32_RUN = {"1f1b-full-1-of-2", "zero0-half-grads", "fsdp2-pp1-half-grads", "zero1-zbv-small-grads",
                           "hsdp-pp1", "1f1b-split", "zbv-split", "zbv-uneven", "1f1b-head-only",
                           "izb-split", "1f1b-full-1-split"}
# Each pipeline rank kind the model names (first, the fullest middle, last) against that rank's own peak.
# The largest rank is held to BAR above; the others to RANK_BAR (measured -6.7 .. +6.3 %, the worst on
# rank 0 of tp 2 x pp 2 ZB-V with SP, -9.1 % in an earlier set of runs; benchmarks/results/2026-11-23-cpu-memory).  This comparison found,
# where the largest rank had hidden them: the uneven-stage count (interleaved_block_peak: interleaved-uneven's
# first and last ranks read +16 % and -21 % before it), a block's backward working memory one block too high
# (1F1B's last rank: +12 %), the sends torch's runtime holds to the step's end (rank_inflight's held()) and
# rotary tables the runtime saved per block (model.rotary now caches them).
RANK_BAR = 0.15


def rank_kind_errors(plan: dict, report: dict) -> dict[str, float]:
    """{kind: predicted / measured - 1} for each pipeline rank kind (planner.launch.rank_kind_memory), with the
    prediction the report carries (benchmarks/cpu_memory.py --repredict replaces it)."""
    kinds = rank_kind_memory({**report, "plan": plan}) or {}
    return {k: v["error"] for k, v in kinds.items()}


def memory_jobs(tmp, steps: int = 2, schedules: dict | None = None, precision: str = "master-weights",
                micro_batch_size: int = 2) -> list[dict]:
    """One multi_run job per layout and schedule under tmp/<name>/ (plan.json, report.json, trace/rankN.json).
    micro_batch_size: the schedules' (their global batches scaled with it, the same count of micro-batches)."""
    jobs = []
    for name, (layers, par) in LAYOUTS.items():
        par = dict(par)
        model = {**WIDE, "layers": layers, **{k: par.pop(k) for k in ("hidden", "ffn_hidden") if k in par}}
        plan = evaluate_plan(tiny_plan(model, seq_len=32, global_batch_size=8,
                                       precision=par.pop("precision", precision), **par))
        d = tmp / name
        d.mkdir(parents=True, exist_ok=True)
        jobs.append({"plan": write_plan(plan, d / "plan.json"), "report": str(d / "report.json"),
                     "opts": {"steps": steps, "device": "cpu", "memory_snapshot": str(d / "trace")}})
    for name, par in (SCHEDULES if schedules is None else schedules).items():
        par = dict(par)
        arch = {**NARROW, "layers": par.pop("layers", NARROW["layers"]), "vocab": par.pop("vocab", NARROW["vocab"])}
        gbs = par.pop("global_batch_size", 16) * micro_batch_size // 2
        plan = evaluate_plan(tiny_plan(arch, seq_len=512, global_batch_size=gbs, micro_batch_size=micro_batch_size,
                                       precision=precision, **{"tp": 1, "pp": 4, "dp": 1, **par}))
        d = tmp / name
        d.mkdir(parents=True, exist_ok=True)
        jobs.append({"plan": write_plan(plan, d / "plan.json"), "report": str(d / "report.json"),
                     "opts": {"steps": steps, "device": "cpu", "memory_snapshot": str(d / "trace")}})
    return jobs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("memory")
    # 31 jobs, 4 ranks on CI's 2 cores: 7 min on a quiet sitting (2026-11-23, 23 jobs), 4.6 min since the harness
    # destroys each job's process groups (2026-11-29), more on a loaded one; the default 600 s would turn a slow
    # machine into a failure.  The schedules at micro-batch 1, not the benchmark's 2 (benchmarks/cpu_memory.py), for
    # CI's time: 118 s against 166 s alone (2026-12-06, this 2-core machine), every case within its bars at both
    # (largest rank -3.0 .. +2.0 % at 1, -3.7 .. +2.6 % at 2; each rank kind -4.3 .. +5.7 % and -5.4 .. +7.4 %), with
    # activations a smaller share of the peak (1f1b: 37 of 67 MiB, 75 of 105 at 2)
    r = suite.run_jobs(memory_jobs(tmp, micro_batch_size=1), 4, tmp, "memory", timeout=1500)
    assert r.returncode == 0, f"torchrun failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return tmp


@pytest.mark.multirank
@pytest.mark.parametrize("name", list(LAYOUTS) + list(SCHEDULES))
def test_memory_model_matches_the_cpu_allocator_peak(runs, name):
    rep = json.loads((runs / name / "report.json").read_text())
    cm = rep["cpu_memory"]
    assert cm["predicted"] == rep["prediction"]["memory_bytes_per_gpu"]["total"]
    assert abs(cm["error"]) <= BAR, (name, cm)
    # every rank traced, and the peak fell inside a step, after the states existed
    for r, m in rep["peak_memory_bytes"].items():
        assert m["peak_phase"].startswith("step"), (r, m)
        assert 0 < m["allocated_without_collective_buffers"] <= m["allocated"]
    trace = json.loads((runs / name / "trace" / "rank0.json").read_text())
    assert trace["live_at_peak"] and trace["at_start"] < trace["allocated"]
    # each pipeline rank kind against its own rank
    plan = json.loads((runs / name / "plan.json").read_text())
    errors = rank_kind_errors(plan, rep)
    assert (len(errors) >= 2) == (plan["parallel"]["pp"] > 1)
    bar = BAR if name in ("interleaved-uneven", "1f1b-full-1-split") else RANK_BAR
    assert all(abs(e) <= bar for e in errors.values()), (name, errors)


def test_trace_peak_is_the_largest_live_total_and_names_its_phase():
    mib = 2**20
    keep = []
    with CpuMemoryTrace() as t:
        with CpuMemoryTrace.phase("build"):
            keep.append(torch.empty(mib, dtype=torch.uint8))
        with CpuMemoryTrace.phase("step1.fwd_bwd"):
            a = torch.empty(3 * mib, dtype=torch.uint8)
            b = torch.empty(2 * mib, dtype=torch.uint8)
            del a, b
        with CpuMemoryTrace.phase("step1.after"):
            c = torch.empty(4 * mib, dtype=torch.uint8)
            del c
    res = t.result
    assert res["allocated"] == 6 * mib  # 1 kept + 3 + 2 live together
    assert res["phase"] == "step1.fwd_bwd"
    assert res["at_start"] == 0  # before the first phase nothing was allocated
    sizes = sorted(row["block_bytes"] for row in res["live_at_peak"] if row["block_bytes"] >= mib)
    assert sizes == [mib, 2 * mib, 3 * mib]


def test_an_address_handed_out_again_frees_the_block_that_was_there():
    """The profiler misses frees on threads it does not profile (gloo drops a collective's tensors on
    its own); no two live blocks share an address, so a block is freed when its address comes back.
    Events: (time, size, ptr, op, inside a collective)."""
    phases = [(0, 100, "step1.fwd_bwd")]
    allocs = [(1, 8, 0xA, "grad", False),   # freed later on gloo's thread: no event
              (2, 8, 0xB, "grad", False),
              (3, 8, 0xA, "grad", False),   # 0xA again: the first block is gone
              (4, 4, 0xC, "gloo staging", True),
              (5, -4, 0xC, "gloo staging", True)]
    assert _replay(allocs, phases, skip_collectives=False)["allocated"] == 20
    assert _replay(allocs, phases, skip_collectives=True)["allocated"] == 16


def test_fp32_recipe_memory_against_the_committed_cpu_run():
    """The fp32 recipe computes and saves activations in fp32 (planner.core.compute_dtype).  Its layouts and
    schedules, measured once with the CPU allocator traced (benchmarks/cpu_memory.py --precision fp32,
    benchmarks/results/2026-11-25-cpu-memory-fp32, after the zero-bubble weight passes were queued), re-predicted
    with today's model: within 10 % of the largest rank's peak (it read -48 % for the schedules when activations
    were counted in 2 bytes).  zero2-pp2 had been held to 12 %: it read +2.1 % in the run of 2026-11-24 and +10.0 % in
    this one (ZeRO-2's peak moves between runs, by what it drops bucket by bucket in the backward, which the model
    keeps to the backward's end), +10.6 % with the runtime's two gradient buckets counted at their 25 MiB
    (2026-11-29), and -3.1 % since the model charges parplan's ZeRO-2 no flat buckets, which it never made
    (2026-12-03; zero2-pp1 +2.1 -> -6.0 %).  A check of committed measurements, not a new run."""
    from pathlib import Path
    from planner.schema import Plan
    run = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "2026-11-25-cpu-memory-fp32" / "run1"
    errors = {}
    names = [n for n in (*LAYOUTS, *SCHEDULES) if (run / n / "report.json").exists()]
    assert set(names) == (set(LAYOUTS) | set(SCHEDULES)) - ADDED_AFTER_THE_FP32_RUN
    for name in names:
        plan = Plan.model_validate_json((run / name / "plan.json").read_text())
        assert plan.training.precision == "fp32"
        measured = json.loads((run / name / "report.json").read_text())["cpu_memory"]["without_collective_buffers_max"]
        errors[name] = evaluate_plan(plan).prediction.memory_bytes_per_gpu.total / measured - 1
    assert max(abs(e) for e in errors.values()) < 0.10, errors


@pytest.mark.parametrize("run_dir", ["2026-11-25-cpu-memory-zbqueued", "2026-11-25-cpu-memory-fp32"])
def test_the_zero_bubble_cool_down_holds_no_input_pass_working_memory(run_dir):
    """ZB-V's last rank ends its cool-down with every micro-batch it holds waiting for its weight pass (rank_inflight:
    p + r chunks, 2r + 1 pending, all of them on the last rank): no input-gradient pass runs then, so no block's
    recomputed forward or backward temporaries sit beside them (memory_breakdown's stage_total).  Charged with them, the
    full and op-level selective recompute plans read +3.5 .. +8.1 % on that rank in these committed traces (one run
    each, master weights and fp32, queued weight passes); the model is within 4 % of each now.  A check of committed
    measurements, re-predicted with today's model, not a new run."""
    from pathlib import Path
    from planner.schema import Plan
    run = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / run_dir / "run1"
    errors = {}
    for name in ("zbv-full", "zbv-selective-op", "tp2-sp-pp2-zbv-full"):
        plan = evaluate_plan(Plan.model_validate_json((run / name / "plan.json").read_text()))
        report = json.loads((run / name / "report.json").read_text())
        report["prediction"] = json.loads(plan.prediction.model_dump_json())
        errors[name] = rank_kind_errors(json.loads(plan.model_dump_json()), report)["last"]
    assert max(abs(e) for e in errors.values()) < 0.04, errors


def test_a_cpu_matmuls_fp32_scratch_is_left_out_of_the_gpu_like_peak():
    """A bf16 matmul on a CPU allocates scratch inside aten::mm and frees it there; a GPU writes the output directly.
    How much depends on the CPU: a 2-core Xeon without native bf16 (AVX512F, no AVX512-BF16 or AMX) made an fp32 buffer
    of the output's size (raw peak 3x the output); one with AMX (2026-11-28) made 0.5-1.0 MiB (529,408 and 1,058,432 bytes in two runs) beside this 8 MiB
    output.  The GPU-like peak (without_collective_buffers) is the bf16 output alone on every CPU.  Without the rule
    the fused-loss memory case read -18.9 % on the machine without native bf16 and -1.4 % on an AMX one."""
    a = torch.randn(512, 64, dtype=torch.bfloat16)
    w = torch.randn(8192, 64, dtype=torch.bfloat16)
    with CpuMemoryTrace() as t:
        with CpuMemoryTrace.phase("step1.fwd_bwd"):
            y = torch.nn.functional.linear(a, w)
    out = y.numel() * y.element_size()
    assert t.result["without_collective_buffers"]["allocated"] == out
    assert t.result["allocated"] >= out  # the raw peak keeps whatever scratch this CPU made


def test_an_in_place_ops_dtype_promotion_is_left_out_of_the_gpu_like_peak():
    """main_grad.add_(a 16-bit gradient) on a CPU copies the gradient to fp32 inside add_ (TensorIterator promotes a
    CPU op's inputs through temporaries; a CUDA kernel casts as it reads), so the raw peak holds a 4-byte copy of it;
    the GPU-like peak does not.  An out-of-place result of the same size is a tensor the job keeps, and counts."""
    n = 1 << 20
    main_grad, grad16 = torch.zeros(n), torch.ones(n, dtype=torch.bfloat16)
    with CpuMemoryTrace() as t:
        with CpuMemoryTrace.phase("step1.fwd_bwd"):
            main_grad.add_(grad16)  # the promotion alone: 4 MiB raw, nothing GPU-like
            main_grad.addcmul_(grad16, grad16)
            kept = main_grad * 2  # 4 MiB kept
            main_grad.add_(grad16)  # beside it: 8 MiB raw, 4 MiB GPU-like
    kept_bytes = kept.numel() * kept.element_size()
    assert kept_bytes == 4 * n
    # (a few bytes more: torch's small bookkeeping allocations of the ops)
    assert 2 * kept_bytes <= t.result["allocated"] < 2 * kept_bytes + 1024
    assert kept_bytes <= t.result["without_collective_buffers"]["allocated"] < kept_bytes + 1024
