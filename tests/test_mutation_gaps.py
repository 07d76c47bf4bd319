"""Proposed tests for mutations that survived the fast suite (expected values derived by hand)."""
from dataclasses import replace

import numpy as np
import pytest

from cost_models import comm
from cost_models.hardware import constants_from_profile
from cost_models.layout import Layout, ModelDims, TrainingConsts
from cost_models.memory import (layer_params_per_gpu, memory_breakdown, p2p_receive_buffers, rank_inflight,
                                 rank_params)
from cost_models.params import spec_model_flops_per_token
from cost_models.total import evaluate
from hardware_profiles import load_profile
from planner.schema import ModelSpec

PROF = load_profile("h100-sxm-80gb")
HW = constants_from_profile(PROF, "bf16")
LLAMA = ModelSpec(arch="llama", layers=8, hidden=1024, heads=16, kv_heads=8, ffn_hidden=2816, vocab=32000)


def _lay(**kw):
    base = dict(gpus=8, tp=1, pp=1, dp=8, cp=1, vpp=1, mbs=1, zero=0, recompute=0, sp=0, schedule=1, offload=0)
    base.update(kw)
    return Layout(**base)


def _tr(**kw):
    base = dict(global_batch_size=8, dtype="bf16", precision="master-weights", flash_attention=True,
                overlap_grad_reduce=True, overlap_tp_comm=False)
    base.update(kw)
    return TrainingConsts(**base)


def gpt(tied=True):
    return ModelSpec(arch="gpt", layers=4, hidden=1024, heads=16, kv_heads=16, ffn_hidden=4096, vocab=51200,
                     tied_embeddings=tied)


# comm.py:62 -- group_inside_node must require the group's span to tile the node
def test_group_inside_node_needs_the_span_to_tile_the_node():
    assert comm.group_inside_node(HW, 1, 4, gpus=16)
    assert not comm.group_inside_node(HW, 1, 6, gpus=12)   # ranks 6-11 straddle nodes 0 and 1
    assert not comm.group_inside_node(HW, 3, 2, gpus=24)   # span 6 does not divide 8
    assert comm.group_inside_node(HW, 1, 6, gpus=6)        # a single node holds everything


# params.py:69 -- spec_model_flops_per_token (runtime MFU) includes the output projection
def test_spec_model_flops_per_token_llama3_8b_by_hand():
    spec = ModelSpec(arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    per_layer = 2 * 4096 ** 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    want = 6 * (32 * per_layer + 128256 * 4096) + 12 * 32 * 4096 * 8192
    assert spec_model_flops_per_token(spec, 8192) == want == 57_912_852_480


# memory.py:49 -- a tied head keeps its copy on the last stage of a pipeline (Megatron)
def test_tied_head_copy_on_the_last_pipeline_stage():
    h, V = 1024, 51200
    per_layer = 12 * h * h + 13 * h            # gpt block incl. biases and 2 LayerNorms
    want_last = 2 * per_layer + 2 * h + V * h  # 2 blocks + final LN + the head copy
    for tied in (True, False):
        m = ModelDims.from_spec(gpt(tied), 1024)
        assert float(rank_params(m, _lay(pp=2, dp=4))[2]) == want_last == 77_623_296


# memory.py:853 -- torch pipelining receive buffers: 2v-1 stages' worth on rank 0 (stage 0 receives no activation)
def test_receive_buffers_per_rank_interleaved():
    m = ModelDims.from_spec(LLAMA, 2048)
    size = 1 * 2048 * 1024 * 2
    first, mid, last = p2p_receive_buffers(m, _lay(pp=4, vpp=2, schedule=2, dp=2), 2, 8, True)
    assert float(first) == 3 * 8 * size and float(mid) == 4 * 8 * size and float(last) == 3 * 8 * size


# memory.py:443/487 -- 1F1B rank r holds min(p - r, m) micro-batches (Narayanan 2021 sec. 2.2)
@pytest.mark.parametrize("m", [2, 8])
def test_1f1b_in_flight_counts_per_rank(m):
    c = rank_inflight(_lay(pp=4, schedule=1, dp=2), m)
    assert float(c["first"][0][0]) == min(4, m)
    assert float(c["mid"][0][0]) == min(3, m)
    assert float(c["last"][0][0]) == 1


# memory.py:883 -- DDP keeps 2 x 25 MiB of gradient buckets when dp > 1 (ZeRO 0)
def test_ddp_buckets_are_two_25_mib_buffers():
    """parplan's flat buckets (memory.flat_bucket_bytes): at most two of 25 MiB, during the rank's last backward as
    whole buckets fill, the partial last one after it."""
    from cost_models.memory import flat_bucket_bytes
    mib, b = 2 ** 20, 25 * 2 ** 20
    assert [float(x) for x in flat_bucket_bytes(100 * mib, True, 10, 0.0, 10 * mib)] == [2 * b, 2 * b]
    # fewer gradients than one bucket: its copy waits for the backward's end
    assert [float(x) for x in flat_bucket_bytes(24 * mib, True, 10, 0.0, mib)] == [0.0, 24 * mib]
    # the first bucket after 3 blocks of 10 MiB (25 - 3 x 4 MiB freed), the second after 5 (50 - 20): the larger
    assert float(flat_bucket_bytes(100 * mib, True, 10, 4 * mib, 10 * mib)[0]) == 2 * b - 5 * 4 * mib
    # the head's gradients, made first, fill the first bucket before any block frees its activations
    assert float(flat_bucket_bytes(100 * mib, True, 10, 30 * mib, 10 * mib, first_grads=30 * mib)[0]) == b
    # without the overlap every bucket waits for the backward's end
    assert float(flat_bucket_bytes(100 * mib, False, 10, 0.0, 10 * mib)[0]) == 0.0
    # and a dp 2 plan whose activations are small beside them carries them at the backward
    m = ModelDims.from_spec(gpt(), 1024)
    one = memory_breakdown(m, _lay(gpus=1, dp=1, recompute=2), _tr(global_batch_size=1), 1)
    two = memory_breakdown(m, _lay(gpus=2, dp=2, recompute=2), _tr(global_batch_size=2), 1)
    assert 1.5 * b < float(two["other"] - one["other"]) <= 2 * b


# memory.py:728 -- amp's per-forward cast copy is not saved when the forward is recomputed
def test_amp_cast_copies_freed_under_full_recompute():
    m = ModelDims.from_spec(LLAMA, 1024)
    per_layer = float(layer_params_per_gpu(m, 1))
    def diff(rec):
        lay = _lay(gpus=1, dp=1, recompute=rec)
        amp = memory_breakdown(m, lay, _tr(precision="amp", global_batch_size=1), 1)
        f32 = memory_breakdown(m, lay, _tr(precision="fp32", global_batch_size=1), 1)
        return float(amp["total"] - f32["total"])
    assert diff(2) == pytest.approx(2 * per_layer)            # only the block being recomputed
    assert diff(0) == pytest.approx(2 * per_layer * (8 + 1))  # every block's copy + the working block's


# total.py:472 -- pipeline bytes: each of the v chunks sends an activation forward and a gradient back
def test_pp_bytes_count_every_virtual_stage():
    m = ModelDims.from_spec(LLAMA, 2048)
    out = evaluate(m, _tr(global_batch_size=16), HW, _lay(gpus=8, pp=4, vpp=2, dp=2, schedule=2))
    assert float(out["comm_pp_bytes"]) == 8 * 2 * 2 * (2048 * 1024 * 2)


# total.py:274 -- pipeline time: 2 transfers per chunk per micro-batch over NVLink
def test_pp_time_counts_every_virtual_stage():
    m = ModelDims.from_spec(LLAMA, 2048)
    out = evaluate(m, _tr(global_batch_size=8), HW, _lay(gpus=4, pp=4, vpp=2, dp=1, schedule=2))
    one = 2048 * 1024 * 2 / (450e9 * 0.8) + 1.9e-6
    assert float(out["pp_comm_s"]) == pytest.approx(8 * 2 * 2 * one, rel=1e-9)


# total.py:467 -- the Amdahl fraction must reproduce the predicted speedup through Amdahl's law
def test_amdahl_fraction_reproduces_the_speedup():
    m = ModelDims.from_spec(LLAMA, 2048)
    out = evaluate(m, _tr(global_batch_size=64), HW, _lay(gpus=8, tp=2, dp=4, mbs=2))
    a, s, n = float(out["parallel_fraction"]), float(out["speedup"]), 8
    assert 1 < s < n
    assert 1 / ((1 - a) + a / n) == pytest.approx(s, rel=1e-9)


# total.py:164 -- full recompute repeats the forward's 2 TP all-reduces (Narayanan 2021 sec. 3.3)
def test_full_recompute_adds_two_tp_all_reduces_a_block():
    m = ModelDims.from_spec(LLAMA, 2048)
    tr = _tr(global_batch_size=4)
    none, full = (evaluate(m, tr, HW, _lay(gpus=8, tp=8, dp=1, recompute=r)) for r in (0, 2))
    ar = 2 * 7 / 8 * 2048 * 1024 * 2
    assert float(full["comm_tp_bytes"] - none["comm_tp_bytes"]) == pytest.approx(4 * 8 * 2 * ar, rel=1e-12)


# total.py:176 -- SP that keeps the shard re-gathers two inputs a block in the backward (time, not only bytes)
def test_sp_regather_time_is_two_all_gathers_a_block():
    m = ModelDims.from_spec(LLAMA, 2048)
    hw = replace(HW, overlap_slowdown=1e12)  # overlap hides nothing: exposed = the collective's time
    lay = _lay(gpus=4, tp=4, dp=1, sp=1)
    keep, gath = (evaluate(m, _tr(global_batch_size=2, sp_saves_gathered_input=g), hw, lay) for g in (False, True))
    t_ag = 3 / 4 * 2048 * 1024 * 2 / (450e9 * 0.8) + 3 * 1.9e-6
    # 2 micro-batches x (8 blocks x 2 re-gathers + the head's input re-gather)
    assert float(keep["tp_comm_s"] - gath["tp_comm_s"]) == pytest.approx(2 * (8 * 2 + 1) * t_ag, rel=1e-6)


# total.py:422 -- ZeRO-1 steps 1/dp of the parameters (AdamW 28 B/param for amp)
def test_zero1_optimizer_step_is_sharded():
    m = ModelDims.from_spec(LLAMA, 1024)
    tr = _tr(precision="amp", global_batch_size=8)
    z0, z1 = (evaluate(m, tr, HW, _lay(zero=z)) for z in (0, 1))
    P = float(rank_params(m, _lay())[0])
    bw = PROF.hbm_gbytes_per_s * 1e9 * PROF.hbm_efficiency * PROF.optimizer_bandwidth_fraction
    assert float(z0["optimizer_s"] - z1["optimizer_s"]) == pytest.approx(P * 28 * (7 / 8) / bw, rel=1e-9)


# compute.py optimizer_time -- torch's FSDP steps the fp32 shard that is the master, on a gradient its reduce-scatter
# made fp32: AdamW's 28 B a parameter, with neither the master's copy to 16 bit (6 B) nor the gradient's upcast (6 B)
def test_fsdp_steps_its_fp32_shard_without_copies():
    from cost_models.compute import optimizer_time
    bw = PROF.hbm_gbytes_per_s * 1e9 * PROF.hbm_efficiency * PROF.optimizer_bandwidth_fraction
    P = 1e8
    for precision, copies in (("master-weights-half-grads", 12), ("master-weights", 6), ("amp", 0)):
        other, fsdp = (float(optimizer_time(P, 0.0, precision, HW, 8, shard_is_master=s)) for s in (False, True))
        assert fsdp == pytest.approx(P * 28 / bw, rel=1e-9)
        assert other - fsdp == pytest.approx(P * copies / bw, rel=1e-9)


# layout.py:334 -- frameworks that shard over dp x cp divide optimizer states by dp*cp
def test_zero_shards_over_dp_times_cp():
    m = ModelDims.from_spec(LLAMA, 1024)
    P = float(rank_params(m, _lay())[0])
    lay = _lay(gpus=8, dp=2, cp=4, zero=1)
    over = memory_breakdown(m, lay, _tr(global_batch_size=2, zero_over_cp=True), 1)
    apart = memory_breakdown(m, lay, _tr(global_batch_size=2, zero_over_cp=False), 1)
    assert float(over["optimizer"]) == pytest.approx(P * 12 / 8)
    assert float(apart["optimizer"]) == pytest.approx(P * 12 / 2)


# search.py:326 -- complexity: each moving part outweighs all after it
def test_complexity_offload_outweighs_everything_after_it():
    from planner.search import complexity
    off = _lay(offload=1)
    rest = _lay(cp=2, zero=3, pp=2, vpp=2, schedule=2)
    assert complexity(off) > complexity(rest)
    assert complexity(_lay(cp=2)) > complexity(_lay(zero=3, pp=2, vpp=2, schedule=2))


# search.py:276 / 262 -- each cp rank's 2 chunks must split over tp for SP; seq must split into 2cp chunks
def test_sequence_checks_use_the_cp_ranks_share():
    from planner.search import REASONS, structural_infeasibility
    def reason(seq, **kw):
        m = ModelDims.from_spec(LLAMA, seq)
        lay = _lay(gpus=64, dp=1, **kw)
        lay = Layout(**{k: np.array([v]) for k, v in lay.__dict__.items()})
        return int(structural_infeasibility(m, _tr(global_batch_size=1), lay)[0])
    seq = REASONS.index("seq")
    assert reason(48, tp=16, cp=2, sp=1) == seq  # 24 tokens a cp rank do not split over 16
    assert reason(96, tp=16, cp=4, sp=1) == seq  # 24 again, though 96 does split
    assert reason(64, tp=16, cp=2, sp=1) == -1
    assert reason(12, tp=1, cp=4) == seq         # 12 is not 2 x 4 equal chunks
    assert reason(16, tp=1, cp=4) == -1


# compute.py:305 -- selective recompute re-runs the attention core and (llama) the SwiGLU forward
def test_selective_recompute_reruns_attention_and_the_activation_function():
    from cost_models.compute import block_time
    s, b, ffn, qw = 2048, 2, 2816, 1024
    m = ModelDims.from_spec(LLAMA, s)
    none, sel = (block_time(m, _lay(gpus=1, dp=1, mbs=b, recompute=r), HW, 2, True) for r in (0, 1))
    attn_fwd = 0.5 * 4 * b * s * s * qw / (HW.peak_flops * HW.attention_efficiency(s))
    swiglu_fwd = b * s * 3 * ffn * 2 / HW.hbm_bytes_per_s   # read gate, up; write product (bf16)
    assert float(sel["gpu"] - none["gpu"]) == pytest.approx(attn_fwd + swiglu_fwd, rel=1e-9)


# memory.py:117 -- full recompute keeps the block input, sequence-sharded under SP (h/tp per token)
def test_full_recompute_input_is_sharded_under_sp():
    from cost_models.memory import activation_bytes_per_layer
    m = ModelDims.from_spec(LLAMA, 2048)
    got = activation_bytes_per_layer(m, _lay(mbs=2, tp=4, sp=1, recompute=2), 2, True)
    assert float(got) == 2 * 2048 * 1024 / 4 * 2


# memory.py:32 -- llama RMSNorm weights are replicated across TP ranks, the matrices split
def test_llama_block_params_per_tp_rank():
    m = ModelDims.from_spec(LLAMA, 1024)
    matmul = 1024 * (1024 + 2 * 512) + 1024 * 1024 + 3 * 1024 * 2816
    assert float(layer_params_per_gpu(m, 4)) == matmul / 4 + 2 * 1024 == 2_951_168


# memory.py:40 -- gpt's learned position table is replicated (the word embedding is vocab-parallel)
def test_learned_positions_are_replicated_over_tp():
    from cost_models.memory import embedding_params_per_gpu
    m = ModelDims.from_spec(gpt(), 1024)
    assert m.positions == 1024
    assert float(embedding_params_per_gpu(m, 4)) == 51200 * 1024 / 4 + 1024 * 1024


# total.py:374 -- FSDP2 (pp 1) gathers every block for the forward and again for the backward, the root once,
# and reduce-scatters all gradients, per micro-batch
def test_fsdp2_gathers_blocks_twice_a_micro_batch_time():
    from cost_models.memory import embedding_params_per_gpu, head_params_per_gpu
    m = ModelDims.from_spec(LLAMA, 1024)
    hw = replace(HW, overlap_slowdown=1e12)
    out = evaluate(m, _tr(global_batch_size=16), hw, _lay(gpus=8, dp=8, zero=3))
    P = float(rank_params(m, _lay())[0])
    root = float(embedding_params_per_gpu(m, 1) + head_params_per_gpu(m, 1, 1))

    def ring(nbytes):
        return 7 / 8 * nbytes / (450e9 * 0.8) + 7 * 1.9e-6
    # ... and copies each gather's output into the unsharded weights on the compute stream (read + write, 2 B each)
    copy_out = (2 * (P - root) + root) * 2 * 2 / HW.hbm_bytes_per_s
    want = 2 * (2 * ring((P - root) * 2) + ring(root * 2) + ring(P * 4) + copy_out)  # 2 micro-batches
    assert float(out["dp_comm_s"]) == pytest.approx(want, rel=1e-6)


# total.py:258 -- mesh (dp, pp, cp, tp): a pipeline group's ranks are tp*cp apart; pp 2 x cp 4 x tp 2 spans 2 nodes
def test_pipeline_group_stride_includes_cp():
    m = ModelDims.from_spec(LLAMA, 4096)
    out = evaluate(m, _tr(global_batch_size=4), HW, _lay(gpus=16, tp=2, cp=4, pp=2, dp=1, mbs=1))
    one = 1024 * 1024 * 2 / (50e9 * 0.88) + 4e-6   # 4096/cp tokens x h x bf16 over one NIC
    assert float(out["pp_comm_s"]) == pytest.approx(4 * 2 * one, rel=1e-9)


# total.py:347 -- ZeRO-2 reduce-scatters its gradients (ZeRO-1 may all-reduce): bytes per step
def test_zero2_reduce_scatters_and_zero1_all_reduces():
    m = ModelDims.from_spec(LLAMA, 1024)
    P = float(rank_params(m, _lay())[0])
    tr = _tr(global_batch_size=8)  # master-weights: 4 B gradients, 2 B weights; zero1_all_reduce default
    z1, z2 = (evaluate(m, tr, HW, _lay(zero=z)) for z in (1, 2))
    assert float(z2["comm_dp_bytes"]) == pytest.approx(7 / 8 * P * 4 + 7 / 8 * P * 2, rel=1e-12)
    assert float(z1["comm_dp_bytes"]) == pytest.approx(2 * 7 / 8 * P * 4 + 7 / 8 * P * 2, rel=1e-12)


# total.py:337 -- the overlapped gradient all-reduce hides behind the last micro-batch's backward
def test_gradient_all_reduce_hides_behind_the_backward():
    from cost_models.compute import block_time
    m = ModelDims.from_spec(LLAMA, 1024)
    slow = replace(HW, overlap_slowdown=0.0, inter_node=replace(HW.inter_node, bytes_per_s=1e9))
    lay = _lay(gpus=16, dp=16)
    out = evaluate(m, _tr(global_batch_size=16), slow, lay)
    P = float(rank_params(m, lay)[0])
    ar = 2 * 15 / 16 * P * 4 / 1e9 + 2 * 15 * 4e-6       # dp 16 spans two nodes: one NIC a rank
    bwd = 8 * float(block_time(m, lay, slow, 2, True)["bwd"])
    assert ar > bwd
    assert float(out["dp_comm_s"]) == pytest.approx(ar - bwd, rel=1e-9)
