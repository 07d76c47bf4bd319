"""DeepSpeed stage 3's one-weight-ahead prefetch (cost_models/zero3.py) against hand counts."""
from dataclasses import replace

import numpy as np
import pytest

from cost_models import comm, zero3
from cost_models.hardware import constants_from_profile
from cost_models.layout import REC_FULL, Layout, ModelDims, TrainingConsts
from cost_models.memory import layer_params_per_gpu, memory_breakdown
from cost_models.total import evaluate
from hardware_profiles import load_profile
from planner.schema import ModelSpec

GPT_175B = ModelSpec(arch="gpt", layers=96, hidden=12288, heads=96, kv_heads=96, ffn_hidden=4 * 12288, vocab=51200,
                     tied_embeddings=True)


def _tr(one_ahead=True, gbs=1536):
    return TrainingConsts(global_batch_size=gbs, dtype="fp16", precision="master-weights-half-grads",
                          flash_attention=False, overlap_grad_reduce=True, overlap_tp_comm=False, dropout=True,
                          zero3_fsdp2=False, zero3_one_weight_ahead=one_ahead)


def _lay(dp, mbs, recompute=REC_FULL):
    return Layout(gpus=dp, tp=1, pp=1, dp=dp, cp=1, vpp=1, mbs=mbs, zero=3, recompute=recompute, sp=0, schedule=1,
                  offload=0)


def _hw():
    return constants_from_profile(load_profile("a100-sxm-80gb"), "fp16", 8, 25.0)


def test_weights_in_forward_order_and_the_prefetch_bucket():
    m = ModelDims.from_spec(GPT_175B, 2048)
    h = 12288
    assert zero3.weight_elements(m, 1) == [3 * h * h, h * h, 4 * h * h, 4 * h * h]
    assert zero3.one_weight_ahead(m, np.array([1, 8]))[0]
    # a 1B-class block: its output projection (1024^2 elements) is below the 5e7 bucket, so DeepSpeed
    # prefetches several weights at once and the block-level model applies
    small = ModelDims.from_spec(GPT_175B.model_copy(update=dict(hidden=1024, heads=16, kv_heads=16, ffn_hidden=4096)), 2048)
    assert not zero3.one_weight_ahead(small, 1)


def test_weights_kept_from_the_recompute_to_the_backward():
    # DeepSpeed keeps a weight gathered when twice the weights after it stay within 1e9 elements
    h = 12288
    assert int(zero3.kept_after_recompute([3 * h * h, h * h, 4 * h * h, 4 * h * h])) == 1  # fc2 only: 2 x 604M > 1e9
    h = 4096
    assert int(zero3.kept_after_recompute([3 * h * h, h * h, 4 * h * h, 4 * h * h])) == 4  # 2 x 151M: all kept


def test_bytes_per_step_count_the_kept_weight_once():
    m, hw, tr = ModelDims.from_spec(GPT_175B, 2048), _hw(), _tr()
    lay = _lay(384, 4)
    out = evaluate(m, tr, hw, lay)
    per_layer = layer_params_per_gpu(m, 1)
    block_w = sum(zero3.weight_elements(m, 1))
    rest = (out["comm_dp_bytes"] - 96 * 383 / 384 * (
        # forward + recompute gather every weight, the backward all but fc2 (4 of 12 h^2), one reduce-scatter
        (2 + 8 / 12) * block_w * 2 + block_w * 2))
    # what is left is the parameters outside the blocks (biases and norms inside them stay gathered)
    emb = 51200 * 12288 + 2048 * 12288 + 2 * 12288  # word and position embeddings, final LayerNorm
    assert rest == pytest.approx(383 / 384 * emb * 2 * 4, rel=1e-6)
    assert per_layer > block_w


def _block_exposed(m, lay, hw, tr):
    bw, lat = comm.tier_params(hw, False)
    return zero3.block_comm(m, lay, hw, tr, bw, lat)[0]


def test_one_ahead_costs_more_than_whole_block_overlap_when_compute_and_gathers_balance():
    """Where a block's compute and its gathers are about equal (174.6B on 384 GPUs, micro-batch 4), the
    small output projection cannot hide the large fc1's gather: the per-weight schedule is slower than
    max(compute, communication) over the block -- the published 384-GPU ZeRO-3 row ran 25 % slower than
    that bound (Narayanan 2021 Table 2)."""
    m, hw = ModelDims.from_spec(GPT_175B, 2048), _hw()
    lay = _lay(384, 4)
    one = evaluate(m, _tr(True), hw, lay)
    block = evaluate(m, _tr(False), hw, lay)
    assert one["step_time_s"] > 1.1 * block["step_time_s"]


def test_per_weight_schedule_limits():
    """Compute-bound: each gather hides behind its weight, leaving the overlap slowdown's share of the
    communication; communication-bound: the gathers back to back, as for the block-level model.  Each
    reduce-scatter runs after its gradient's concatenation on the reduce stream (reduce_scatter_coalesced's
    torch.cat: a read and a write of 2 B an element through HBM; fp16 is also the communication dtype here)."""
    m, hw, tr = ModelDims.from_spec(GPT_175B, 2048), _hw(), _tr()
    share = hw.overlap_slowdown / (1 + hw.overlap_slowdown)
    fast = replace(hw, inter_node=replace(hw.inter_node, bytes_per_s=hw.inter_node.bytes_per_s * 1e3))
    lay = _lay(384, 4)
    exposed = _block_exposed(m, lay, fast, tr)
    bw, lat = comm.tier_params(fast, False)
    w = zero3.weight_elements(m, 1)
    comm_s = sum(3 * comm.all_gather(x * 2, 384, bw, lat)[0] + comm.reduce_scatter(x * 2, 384, bw, lat)[0]
                 + x * 4 / fast.hbm_bytes_per_s for x in w)
    comm_s -= comm.all_gather(w[-1] * 2, 384, bw, lat)[0]  # fc2 kept from the recompute
    assert float(exposed) == pytest.approx(share * comm_s, rel=1e-6)
    # communication-bound (micro-batch 1 on 1536 GPUs): exposed = communication - compute
    slow = replace(hw, inter_node=replace(hw.inter_node, bytes_per_s=hw.inter_node.bytes_per_s / 100))
    lay = _lay(1536, 1)
    bw, lat = comm.tier_params(slow, False)
    comm_s = sum(3 * comm.all_gather(x * 2, 1536, bw, lat)[0] + comm.reduce_scatter(x * 2, 1536, bw, lat)[0] for x in w)
    comm_s -= comm.all_gather(w[-1] * 2, 1536, bw, lat)[0]
    out = evaluate(m, tr, slow, lay)
    assert out["dp_comm_s"] > 0.9 * comm_s * 96
    # exposed = communication - compute: twice the compute (half the sustained fraction) leaves the step as it was,
    # the exposed communication shorter by exactly the added compute
    slower = evaluate(m, tr, replace(slow, sustained=slow.sustained / 2), lay)
    added = float(slower["compute_s"] - out["compute_s"])
    assert added > 1.0
    assert float(slower["step_time_s"]) == pytest.approx(float(out["step_time_s"]), rel=1e-12)
    assert float(out["dp_comm_s"] - slower["dp_comm_s"]) == pytest.approx(added, rel=1e-9)


def test_fp32_gradients_reach_the_reduce_scatter_through_two_copies():
    """With fp32 gradient shards (master-weights, which the export reduces in fp32) each bucket's bf16 gradients are
    cast to fp32 (read 2 + write 4 B) and concatenated (read 4 + write 4 B) before the reduce-scatter, on the reduce
    stream: compute-bound, the overlap slowdown's share of it all shows."""
    m, tr = ModelDims.from_spec(GPT_175B, 2048), replace(_tr(), precision="master-weights", dtype="bf16")
    hw = constants_from_profile(load_profile("a100-sxm-80gb"), "bf16", 8, 25.0)
    fast = replace(hw, inter_node=replace(hw.inter_node, bytes_per_s=hw.inter_node.bytes_per_s * 1e3))
    share = fast.overlap_slowdown / (1 + fast.overlap_slowdown)
    bw, lat = comm.tier_params(fast, False)
    w = zero3.weight_elements(m, 1)
    comm_s = sum(3 * comm.all_gather(x * 2, 384, bw, lat)[0] + comm.reduce_scatter(x * 4, 384, bw, lat)[0]
                 + x * 14 / fast.hbm_bytes_per_s for x in w) - comm.all_gather(w[-1] * 2, 384, bw, lat)[0]
    assert float(_block_exposed(m, _lay(384, 4), fast, tr)) == pytest.approx(share * comm_s, rel=1e-6)


def test_deepspeed_holds_two_weights_gathered_not_two_blocks():
    m, tr = ModelDims.from_spec(GPT_175B, 2048), _tr()
    lay = _lay(384, 4)
    h = 12288
    one = memory_breakdown(m, lay, tr, 1)
    block = memory_breakdown(m, lay, _tr(False), 1)
    # two blocks of fp16 weights against fc1 + fc2 gathered and fc1's (or fc2's) fp16 gradient
    expect = 2 * layer_params_per_gpu(m, 1) * 2 - (8 * h * h * 2 + 4 * h * h * 2)
    assert float(block["total"] - one["total"]) == pytest.approx(expect, rel=1e-9)
