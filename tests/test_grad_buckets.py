"""Gradient buckets other frameworks hold: torch DDP without gradient_as_bucket_view (torchtitan's replicate,
Composer's and Accelerate's DistributedDataParallel) a second copy of the gradients (TrainingConsts.ddp_bucket_copy),
measured on two gloo ranks through the CPU allocator trace; DeepSpeed's ZeRO reduce_bucket_size buckets
(memory.deepspeed_grad_buckets, from its source); and the memory model's count of each."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import hardware_profiles
from cost_models.hardware import constants_from_profile
from cost_models.params import param_counts
from runtime_helpers.two_ranks import run_two

LINEARS, WIDTH = 8, 1024  # 8 fp32 1,024 x 1,024 linears: 32 MiB of parameters, gradients and buckets each


def _worker(rank, port, view, out):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from parallel_layers.host_memory import CpuMemoryTrace

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    with CpuMemoryTrace() as t:
        with CpuMemoryTrace.phase("build"):
            model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LINEARS)])
            ddp = DDP(model, bucket_cap_mb=25, gradient_as_bucket_view=view)
            x = torch.randn(4, WIDTH)
        for step in (1, 2):
            with CpuMemoryTrace.phase(f"step{step}.fwd_bwd"):
                ddp(x).sum().backward()
            with CpuMemoryTrace.phase(f"step{step}.zero_grad"):
                model.zero_grad(set_to_none=True)
    Path(f"{out}.{rank}").write_text(json.dumps({"peak": t.result["allocated"], "phase": t.result["phase"],
                                                 "live": t.result["live_at_peak"][:4],
                                                 "params": sum(p.numel() * 4 for p in model.parameters())}))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.multirank
def test_ddp_buckets_hold_a_second_copy_of_the_gradients(tmp_path):
    # each rank's reading; the lower of the two is the test's: the trace sees a block freed on another thread (gloo's)
    # only when its address is handed out again, so under a loaded machine one rank has once read a block too many
    # (CI, 2026-12-03: 105 MB); the same job on both ranks holds the same tensors
    copy, view = (min(run_two(_worker, tmp_path / name, flag), key=lambda r: r["peak"])
                  for name, flag in (("copy", False), ("view", True)))
    params = copy["params"]
    # parameters, gradients and buckets, three times the parameters' bytes; with the view on the buckets are the
    # gradients (2026-12-02: 100.7 MB against 71.5 MB, 33.5 MB of parameters)
    assert copy["peak"] == pytest.approx(3 * params, rel=0.03), copy
    assert view["peak"] < 2.25 * params, view


def test_the_memory_model_counts_ddps_bucket_copy(monkeypatch):
    """torchtitan and fsdp (torch DDP) hold the rank's gradients twice at ZeRO-0 over dp > 1 (the 2 x 25 MiB of flat
    buckets parplan's runtime makes and frees one at a time are its alone); parplan, Megatron and DeepSpeed do not;
    ZeRO-3 has no DDP."""
    from planner.core import recommend, training_consts
    from planner.search import Pins

    def plan(framework, zero):
        return recommend("llama3.2-1b", 8, framework=framework,
                         pins=Pins(tp=1, pp=1, cp=1, dp=8, mbs=1, recompute="full", zero=zero))
    copies = {fw: training_consts(plan(fw, 0).training).ddp_bucket_copy
              for fw in ("parplan", "torchtitan", "fsdp", "megatron", "deepspeed")}
    assert copies == {"parplan": False, "torchtitan": True, "fsdp": True, "megatron": False, "deepspeed": False}
    titan, titan3 = plan("torchtitan", 0), plan("torchtitan", 3)
    without_copy = _without(monkeypatch, ddp_bucket_copy=False)
    with_copy, without = titan.prediction.memory_bytes_per_gpu, without_copy(titan).memory_bytes_per_gpu
    grads = with_copy.grads
    assert without.grads == grads
    # torch DDP with the view on makes no flat buckets either (only parplan's runtime does: flat_grad_buckets)
    assert with_copy.other - without.other == pytest.approx(grads, rel=1e-9)
    assert with_copy.total - without.total == pytest.approx(grads, rel=1e-9)  # held at every moment
    assert without_copy(titan3) == titan3.prediction
    # the copies' time: each gradient into its bucket and back after each all-reduce (torchtitan's, every micro-batch:
    # below), a read and a write each way
    hbm = constants_from_profile(hardware_profiles.load_profile(titan.hardware.name)).hbm_bytes_per_s
    params, m = param_counts(titan.model)["total"], titan.training.num_microbatches
    assert titan.prediction.step_time_s - without_copy(titan).step_time_s == pytest.approx(m * params * 16 / hbm, rel=1e-9)


# the two flat buckets of llama3.2-1b's last backward at dp 8 (tp 1, pp 1, micro-batch 1, 256 tokens, full recompute),
# beside what is left of the activations: the second starts after one block (240 MB of fp32 gradients fills both), whose
# saved input, 256 x 2048 bf16 values, is freed by then
BESIDE_THE_BACKWARD = 2 * 25 * 2**20 - 256 * 2048 * 2


def test_only_parplans_runtime_makes_flat_gradient_buckets(monkeypatch):
    """parplan's ZeRO-0/1 all-reduce packs gradients into flat buckets of at most 25 MiB (two counted in the rank's
    last backward: the second starts once the first block's backward has made its gradients final and freed its
    saved input, 1 MiB under full recompute at 256 tokens x hidden 2048 in bf16; memory.flat_bucket_bytes); Megatron's
    buckets are views of its contiguous grad buffer, reduced in place: none there."""
    from planner.core import recommend, training_consts
    from planner.search import Pins

    def plan(framework, zero=1):
        return recommend("llama3.2-1b", 8, framework=framework, seq_len=256,
                         pins=Pins(tp=1, pp=1, cp=1, dp=8, mbs=1, recompute="full", zero=zero))
    flat = {fw: training_consts(plan(fw, 0).training).flat_grad_buckets
            for fw in ("parplan", "torchtitan", "fsdp", "megatron", "deepspeed")}
    assert flat == {"parplan": True, "torchtitan": False, "fsdp": False, "megatron": False, "deepspeed": False}
    megatron = plan("megatron")
    as_parplan = _without(monkeypatch, flat_grad_buckets=True)(megatron).memory_bytes_per_gpu
    assert as_parplan.other - megatron.prediction.memory_bytes_per_gpu.other == pytest.approx(BESIDE_THE_BACKWARD, rel=1e-9)


def test_parplans_zero2_makes_no_flat_gradient_buckets(monkeypatch):
    """parplan's ZeRO-2 reduces each gradient's rows in place to their owner (ShardedAdamW.reduce_start: a
    dist.reduce of a view), so of its ZeRO stages only 0 and 1 pack flat buckets: a ZeRO-2 plan's `other` is the
    same with the flag off, a ZeRO-1 plan's 2 x 25 MiB less the first block's saved input more with it on."""
    from planner.core import recommend
    from planner.search import Pins

    def other(zero, **flags):
        plan = recommend("llama3.2-1b", 8, seq_len=256,
                         pins=Pins(tp=1, pp=1, cp=1, dp=8, mbs=1, recompute="full", zero=zero))
        got = _without(monkeypatch, **flags)(plan).memory_bytes_per_gpu.other
        monkeypatch.undo()  # the next call patches the real training_consts again
        return got
    assert other(2) == other(2, flat_grad_buckets=False)
    assert other(1) - other(1, flat_grad_buckets=False) == pytest.approx(BESIDE_THE_BACKWARD, rel=1e-9)


def _without(monkeypatch, **flags):
    """evaluate_plan's prediction with TrainingConsts fields replaced (planner.core.training_consts patched)."""
    from dataclasses import replace

    import planner.core as core
    real = core.training_consts
    monkeypatch.setattr(core, "training_consts", lambda tr: replace(real(tr), **flags))
    return lambda plan: core.evaluate_plan(plan).prediction


@pytest.mark.parametrize("zero, overlap, buffers, held, reduce", [(3, True, 1, True, 4e9), (2, True, 2, False, 2e9),
                                                                  (2, False, 1, False, 2e9), (1, True, 2, True, 0)])
def test_deepspeed_gradient_buckets_are_reduce_bucket_size_each(monkeypatch, zero, overlap, buffers, held, reduce):
    """DeepSpeed's contiguous gradient buckets, 5e8 elements of the 16-bit dtype each whatever the model's size, in
    place of the 2 x 25 MiB of flat buckets: ZeRO-3 one, made with the optimizer and kept; ZeRO-2 one (two with
    overlap_comm) in each backward; ZeRO-1 as many from the first backward to the step's boundary.  ZeRO-2/3's
    reduce of a full bucket adds its copies in the blocks' backward: the bf16 gradients cast to the fp32 the export
    communicates in (4 B x 5e8), and at ZeRO-3 reduce_scatter_coalesced's interleaved torch.cat of those (as much
    again; llama3.2-1b's 1.2e9 gradients fill a bucket)."""
    from planner.core import recommend
    from planner.search import Pins

    plan = recommend("llama3.2-1b", 8, framework="deepspeed", overlap_grad_reduce=overlap,
                     zero1_grad_reduce="reduce-scatter",
                     pins=Pins(tp=1, pp=1, cp=1, dp=8, mbs=1, recompute="full", zero=zero))
    mem = plan.prediction.memory_bytes_per_gpu
    without = _without(monkeypatch, ds_reduce_bucket_elements=0.0)(plan).memory_bytes_per_gpu
    assert mem.other - without.other == pytest.approx(buffers * 5e8 * 2 + reduce, rel=1e-9)
    if held and not reduce:  # every moment holds them, the loss's backward (where these plans peak) included
        assert mem.total - without.total == pytest.approx(buffers * 5e8 * 2, rel=1e-9)


@pytest.mark.parametrize("precision, reduce", [("master-weights", 5e8 * 4 * 2), ("master-weights-half-grads", 5e8 * 2),
                                               ("fp32", 5e8 * 4)])
def test_deepspeed_zero3_reduces_a_bucket_through_copies(monkeypatch, precision, reduce):
    """ZeRO-3's reduce-scatter of a bucket (stage3.py __avg_scatter_grads): each bf16 gradient cast to the
    communication dtype where it is not the model's (the export's fp32 under master-weights), then
    reduce_scatter_coalesced's torch.cat of them interleaved by rank, live together in the blocks' backward; a model
    whose gradients fill less than a bucket copies only those."""
    from dataclasses import replace

    from cost_models.layout import Layout, ModelDims
    from cost_models.memory import deepspeed_grad_buckets, memory_breakdown
    from planner.core import training_consts
    from planner.schema import ModelSpec, Training

    tr = training_consts(Training(seq_len=1024, global_batch_size=8, micro_batch_size=1, num_microbatches=1,
                                  precision=precision, framework="deepspeed"))
    lay = Layout(gpus=8, tp=1, pp=1, dp=8, cp=1, vpp=1, mbs=1, zero=3, recompute=2, sp=0, schedule=1, offload=0)
    assert float(deepspeed_grad_buckets(lay, tr)["reduce"]) == reduce
    # a 0.1B model: its 1.1e8 gradients are a fifth of a bucket
    m = ModelDims.from_spec(ModelSpec(arch="llama", layers=8, hidden=1024, heads=8, kv_heads=8, ffn_hidden=2816,
                                      vocab=32000), 1024)
    with_, without = (memory_breakdown(m, lay, t, 1) for t in (tr, replace(tr, ds_reduce_bucket_elements=0.0)))
    params = float(with_["weights"] + with_["optimizer"]) / ((2 if precision != "fp32" else 4) + 12) * 8
    held = 5e8 * (2 if precision != "fp32" else 4)
    assert float(with_["other"] - without["other"]) == pytest.approx(held + reduce * params / 5e8, rel=1e-6)


def test_deepspeeds_bf16_optimizer_flattens_its_gradients_at_the_boundary(monkeypatch):
    """ZeRO-1 all-reducing the fp32 gradients of a bf16 model runs DeepSpeed's BF16_Optimizer (planner.export writes
    grad_accum_dtype fp32): no reduce bucket, but the engine's all-reduce at the step's boundary flattens up to 5e8
    gradients at a time (buffered_allreduce_fallback), beside the model states once the activations are gone; that
    moment is llama3.2-1b's peak at a short sequence, its 1.2e9 fp32 gradients flattened 5e8 at a time."""
    from cost_models.memory import deepspeed_grad_buckets
    from planner.core import layout_from_parallel, recommend, training_consts
    from planner.search import Pins

    plan = recommend("llama3.2-1b", 8, framework="deepspeed", zero1_grad_reduce="all-reduce", seq_len=256,
                     pins=Pins(tp=1, pp=1, cp=1, dp=8, mbs=1, recompute="full", zero=1))
    t = plan.training
    assert t.precision == "master-weights" and t.dtype == "bf16"
    ds = deepspeed_grad_buckets(layout_from_parallel(plan.parallel, t.micro_batch_size, plan.hardware.gpus),
                                training_consts(t))
    assert {k: float(v) for k, v in ds.items()} == {"held": 0.0, "backward": 0.0, "reduce": 0.0, "flat_cap": 5e8 * 4,
                                                    "boundary": 0.0}
    mem = plan.prediction.memory_bytes_per_gpu
    assert mem.activations == 0 and mem.other == 5e8 * 4
    assert mem.total == pytest.approx(mem.weights + mem.grads + mem.optimizer + 5e8 * 4, rel=1e-12)
    without = _without(monkeypatch, ds_reduce_bucket_elements=0.0)(plan).memory_bytes_per_gpu
    assert without.total < mem.total


def test_deepspeed_zero1_in_a_pipeline_holds_one_bucket_and_makes_one_at_the_boundary(monkeypatch):
    """The pipeline engine turns overlap_comm off (one reduce bucket from the last stage's first backward) and its
    boundary's reduce_gradients(pipeline_parallel=True) makes one of its own (replacing the list), which the
    gradients it moves there keep to the step."""
    from cost_models.memory import deepspeed_grad_buckets
    from planner.core import layout_from_parallel, recommend, training_consts
    from planner.search import Pins

    plan = recommend("llama3-8b", 16, framework="deepspeed", zero1_grad_reduce="reduce-scatter",
                     pins=Pins(tp=1, pp=2, cp=1, dp=8, zero=1))
    t = plan.training
    assert t.overlap_grad_reduce
    ds = deepspeed_grad_buckets(layout_from_parallel(plan.parallel, t.micro_batch_size, plan.hardware.gpus),
                                training_consts(t))
    assert {k: float(v) for k, v in ds.items()} == {"held": 1e9, "backward": 0.0, "reduce": 0.0, "flat_cap": 0.0,
                                                    "boundary": 1e9}
    # the engine runs the ZeRO optimizer's backward on the last stage only: the others make no bucket in theirs
    mem, without = plan.prediction.memory_bytes_per_gpu, _without(monkeypatch, ds_reduce_bucket_elements=0.0)(plan)
    assert mem.peak_moment == "backward"
    assert mem.by_stage["first"] == without.memory_bytes_per_gpu.by_stage["first"]
    assert mem.by_stage["last"] - without.memory_bytes_per_gpu.by_stage["last"] == pytest.approx(1e9, rel=1e-9)
    monkeypatch.undo()
    # llama3.2-3b over pp 2 x dp 2, 16-bit gradients, full recompute: the step is the peak, with the share's 16-bit
    # gradients, the flat copies (6 B a parameter of the share) and the boundary's one bucket, not the backward's too
    small = recommend("llama3.2-3b", 4, framework="deepspeed", zero1_grad_reduce="reduce-scatter", seq_len=2048,
                      precision="master-weights-half-grads", pins=Pins(tp=1, pp=2, dp=2, mbs=1, zero=1, recompute="full"))
    mem = small.prediction.memory_bytes_per_gpu
    share = mem.weights / 2 / 2  # bf16 weights of the stage, over dp 2
    assert mem.peak_moment == "optimizer step"
    assert mem.grads == pytest.approx(share * 2, rel=1e-9) and mem.other == pytest.approx(share * 6 + 1e9, rel=1e-9)


@pytest.mark.parametrize("model, gpus, zero, precision, per_param, buckets", [
    ("llama3-8b", 8, 2, "master-weights-half-grads", 6, 0),
    ("llama3-8b", 8, 3, "master-weights-half-grads", 6, 1),
    ("llama3.2-1b", 2, 1, "master-weights-half-grads", 6, 2)])
def test_deepspeed_steps_a_flat_copy_of_each_groups_gradients(monkeypatch, model, gpus, zero, precision, per_param,
                                                              buckets):
    """DeepSpeed's ZeRO optimizer flattens a group's gradient partition before it steps it (a torch.cat copy in the
    gradients' dtype) and casts that to fp32 (a second copy beside it with 16-bit gradients; with fp32 ones .to
    returns the copy itself): 6 or 4 bytes a parameter of the rank's share at the step, where the other frameworks
    copy 16-bit gradients to fp32 only (4 bytes; none with fp32 gradients).  Full recompute, one sequence a GPU:
    that moment is the peak, beside the model states and the reduce buckets still held (ZeRO-3's one, kept; ZeRO-1's
    two with overlap_comm, alive through the views its boundary left in the other ranks' gradients), and at ZeRO-1
    only the share's gradients (the boundary moved the rest into the buckets).  llama3-8b's 1e9 parameters a rank are
    one ZeRO-3 sub-group (1e9 elements closed by the parameter that reaches it).  (With fp32 gradients these plans
    peak in the backward instead, where the reduce casts a bucket to fp32, ZeRO-3 then copies it once more:
    test_deepspeed_zero3_reduces_a_bucket_through_copies; the 4 B step copy is in the flat-copy time test.)"""
    from cost_models.layout import PRECISION_RECIPES
    from cost_models.memory import rank_params, step_grad_copy_bytes
    from planner.core import layout_from_parallel, recommend, training_consts
    from planner.search import Pins

    plan = recommend(model, gpus, framework="deepspeed", precision=precision, seq_len=2048,
                     zero1_grad_reduce="reduce-scatter", pins=Pins(tp=1, pp=1, cp=1, dp=gpus, mbs=1, recompute="full",
                                                                   zero=zero))
    m, lay = _dims(plan), layout_from_parallel(plan.parallel, 1, gpus)
    params = float(rank_params(m, lay)[0])  # pp 1: the whole model
    mem, share = plan.prediction.memory_bytes_per_gpu, params / gpus
    assert mem.peak_moment == "optimizer step" and mem.activations == 0
    assert mem.other == pytest.approx(per_param * share + buckets * 5e8 * 2, rel=1e-9)
    assert mem.grads == pytest.approx(share * PRECISION_RECIPES[precision]["grad"], rel=1e-9)
    assert mem.total == pytest.approx(mem.weights + mem.grads + mem.optimizer + mem.other, rel=1e-12)
    # Megatron's step makes no flat copy: fp32 copies of 16-bit gradients only
    megatron = training_consts(plan.training.model_copy(update={"framework": "megatron"}))
    assert float(step_grad_copy_bytes(m, params, lay, megatron)) == pytest.approx(
        4 * share if per_param == 6 else 0.0)
    # an offloaded optimizer steps on the host: no copy on the device
    off = layout_from_parallel(plan.parallel.model_copy(update={"offload": "optimizer"}), 1, gpus)
    assert float(step_grad_copy_bytes(m, params, off, training_consts(plan.training))) == 0


def test_deepspeeds_flat_copy_takes_a_read_and_a_write_of_the_shares_gradients(monkeypatch):
    """The flat copy costs time too: a read and a write of the share's gradients in their dtype at HBM bandwidth (the
    fraction the profile gives the step's passes), 8 B a parameter of the share with fp32 gradients."""
    from planner.core import recommend
    from planner.search import Pins

    plan = recommend("llama3-8b", 8, framework="deepspeed", precision="master-weights", seq_len=2048,
                     pins=Pins(tp=1, pp=1, cp=1, dp=8, mbs=1, recompute="full", zero=2))
    without = _without(monkeypatch, ds_step_sub_group_elements=0.0)(plan)
    from cost_models.hardware import constants_from_profile
    from hardware_profiles import load_profile
    hw = constants_from_profile(load_profile(plan.hardware.name), "bf16")
    share = plan.prediction.memory_bytes_per_gpu.grads / 4  # fp32 gradient shards
    extra = plan.prediction.step_time_s - without.step_time_s
    assert extra == pytest.approx(share * 8 / (hw.hbm_bytes_per_s * hw.optimizer_bw_fraction), rel=1e-6)


@pytest.mark.parametrize("precision, cast", [("master-weights", 2 + 4), ("master-weights-half-grads", 0)])
def test_deepspeed_zero2_casts_its_buckets_before_reducing_them(monkeypatch, precision, cast):
    """ZeRO-2's reduction casts each full bucket to the communication dtype where it is not the model's (the export's
    fp32 beside fp32 gradient shards): a read of 2 B and a write of 4 B an element of the stage's gradients through
    HBM before each reduce, which with the reduction exposed (overlap_comm off, one micro-batch) is step time."""
    from planner.core import recommend
    from planner.search import Pins

    plan = recommend("llama3.2-1b", 8, framework="deepspeed", precision=precision, seq_len=2048, global_batch_size=8,
                     pins=Pins(tp=1, pp=1, cp=1, dp=8, mbs=1, recompute="full", zero=2))
    with_ = _without(monkeypatch, overlap_grad_reduce=False)(plan)
    without = _without(monkeypatch, overlap_grad_reduce=False, ds_reduce_bucket_elements=0.0)(plan)
    from cost_models.hardware import constants_from_profile
    from hardware_profiles import load_profile
    hw = constants_from_profile(load_profile(plan.hardware.name), "bf16")
    extra = with_.step_time_s - without.step_time_s
    assert extra == pytest.approx(plan.model.num_params * cast / hw.hbm_bytes_per_s, rel=1e-6, abs=1e-12)
    if cast:
        assert extra > 1e-3


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_deepspeed_keeps_an_fp32_partition_of_fp32_weights(monkeypatch, zero):
    """DeepSpeed's ZeRO optimizer clones the rank's partition into an fp32 master even where the weights are fp32
    (the fp32 recipe): 4 B a parameter of the share beside Adam's 8, where Megatron's distributed optimizer steps the
    fp32 weights themselves; at the step it flattens the share's fp32 gradients (a read and a write of 4 B) and copies
    the stepped partition back into the weights (4 B more each way)."""
    from cost_models.hardware import constants_from_profile
    from hardware_profiles import load_profile
    from planner.core import recommend
    from planner.search import Pins

    plan = recommend("llama3.2-1b", 8, framework="deepspeed", precision="fp32", seq_len=2048,
                     zero1_grad_reduce="reduce-scatter", pins=Pins(tp=1, pp=1, cp=1, dp=8, mbs=1, recompute="full",
                                                                   zero=zero))
    share = plan.prediction.memory_bytes_per_gpu.optimizer / 12
    without = _without(monkeypatch, ds_step_sub_group_elements=0.0)(plan)
    assert without.memory_bytes_per_gpu.optimizer == pytest.approx(share * 8, rel=1e-9)
    hw = constants_from_profile(load_profile(plan.hardware.name), "fp32")
    assert plan.prediction.step_time_s - without.step_time_s == pytest.approx(
        share * 16 / (hw.hbm_bytes_per_s * hw.optimizer_bw_fraction), rel=1e-6)


def test_deepspeed_zero1s_backward_outweighs_its_step_over_more_ranks():
    """At ZeRO-1 the step holds the share's gradients, not all of them: llama3-8b over 8 ranks peaks in the backward
    (all 16-bit gradients and the activations), as it did before the flat copies were counted."""
    from planner.core import recommend
    from planner.search import Pins

    plan = recommend("llama3-8b", 8, framework="deepspeed", precision="master-weights-half-grads", seq_len=2048,
                     zero1_grad_reduce="reduce-scatter", pins=Pins(tp=1, pp=1, cp=1, dp=8, mbs=1, recompute="full",
                                                                   zero=1))
    mem = plan.prediction.memory_bytes_per_gpu
    assert mem.peak_moment == "backward" and mem.grads == pytest.approx(plan.model.num_params * 2, rel=0.01)


def _dims(plan):
    from cost_models.layout import ModelDims
    return ModelDims.from_spec(plan.model, plan.training.seq_len)


def test_deepspeed_zero3_steps_a_sub_group_at_a_time():
    """A ZeRO-3 share above sub_group_size (1e9 elements, DeepSpeed's default; the export writes it) is stepped by
    sub-groups, each closed by the parameter that takes it past 1e9: the flat copy holds at most 1e9 elements plus
    one parameter's partition (the model's largest matrix taken: llama3-70b's 128,256 x 8,192 embedding), not the
    share.  ZeRO-1/2 flatten a parameter group's whole partition."""
    from cost_models.memory import rank_params, step_grad_copy_bytes
    from planner.core import layout_from_parallel, recommend, training_consts
    from planner.export import export_plan
    from planner.search import Pins

    plan = recommend("llama3-70b", 32, framework="deepspeed", precision="master-weights-half-grads", seq_len=2048,
                     pins=Pins(tp=1, pp=1, cp=1, dp=32, mbs=1, recompute="full", zero=3, offload="none"))
    m, tr = _dims(plan), training_consts(plan.training)
    lay = layout_from_parallel(plan.parallel, 1, 32)
    params = float(rank_params(m, lay)[0])
    assert params / 32 > 2e9
    assert float(step_grad_copy_bytes(m, params, lay, tr)) == pytest.approx((1e9 + 128256 * 8192 / 32) * 6)
    zero2 = layout_from_parallel(plan.parallel.model_copy(update={"zero_stage": 2}), 1, 32)
    assert float(step_grad_copy_bytes(m, params, zero2, tr)) == pytest.approx(params / 32 * 6)
    fp32_grads = training_consts(plan.training.model_copy(update={"precision": "master-weights"}))
    assert float(step_grad_copy_bytes(m, params, zero2, fp32_grads)) == pytest.approx(params / 32 * 4)  # the flatten
    assert json.loads(export_plan(plan, "deepspeed"))["zero_optimization"]["sub_group_size"] == 1_000_000_000


def test_torchtitans_ddp_all_reduces_every_micro_batch(monkeypatch):
    """torchtitan's train_step calls loss.backward() per micro-batch with no no_sync, so its DDP all-reduces (and
    copies into its buckets and back) every micro-batch, each behind that micro-batch's backward; fsdp's frameworks
    (Composer, Accelerate) sync once a step."""
    from planner.core import recommend, training_consts
    from planner.search import Pins

    def plan(framework):
        return recommend("llama3.2-1b", 8, framework=framework,
                         pins=Pins(tp=1, pp=1, cp=1, dp=8, mbs=1, recompute="full", zero=0))
    titan, fsdp = plan("torchtitan"), plan("fsdp")
    assert training_consts(titan.training).ddp_reduces_each_microbatch
    assert not training_consts(fsdp.training).ddp_reduces_each_microbatch
    m = titan.training.num_microbatches
    assert m > 1
    once = _without(monkeypatch, ddp_reduces_each_microbatch=False)(titan)
    assert titan.prediction.comm_bytes_per_step.dp == pytest.approx(m * once.comm_bytes_per_step.dp, rel=1e-12)
    hbm = constants_from_profile(hardware_profiles.load_profile(titan.hardware.name)).hbm_bytes_per_s
    copies = param_counts(titan.model)["total"] * 4 * 4 / hbm
    each = titan.prediction.time_breakdown.dp_comm_s / m  # one micro-batch's exposed all-reduce
    assert once.time_breakdown.dp_comm_s == pytest.approx(each, rel=1e-12)
    assert titan.prediction.step_time_s - once.step_time_s == pytest.approx((m - 1) * (each + copies), rel=1e-9)
