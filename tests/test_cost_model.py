"""Cost-model formulas against hand-derived and published numbers."""
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cost_models import comm
from cost_models.hardware import constants_from_profile
from cost_models.layout import (Layout, ModelDims, TrainingConsts, rank_block_counts, stage_layers,
                                virtual_stage_blocks)
from cost_models.memory import (activation_bytes_per_layer, in_flight_microbatches, interleaved_block_peak,
                                 layer_params_per_gpu, memory_breakdown, rank_inflight)
from cost_models.params import narayanan_eq2, param_counts
from cost_models.total import bubble_factor, evaluate
from hardware_profiles import load_profile
from planner.schema import ModelSpec

REF = Path(__file__).resolve().parent.parent / "benchmarks" / "reference"


def gpt(layers, hidden, heads, vocab=51200, tied=True):
    return ModelSpec(arch="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn_hidden=4 * hidden,
                     vocab=vocab, tied_embeddings=tied)


def test_eq2_reproduces_every_table1_parameter_count():
    rows = json.loads((REF / "megatron_sc21_table1.json").read_text())["rows"]
    for r in rows:
        eq2 = narayanan_eq2(r["layers"], r["hidden"], 51200, 2048)
        assert round(eq2 / 1e9, 1) == pytest.approx(r["params_billion"], abs=0.051)
        # our per-tensor count equals eq. 2 plus the final LayerNorm (2h), which eq. 2 leaves out
        ours = param_counts(gpt(r["layers"], r["hidden"], r["heads"]), 2048)["total"]
        assert ours - eq2 == pytest.approx(2 * r["hidden"], abs=1e-3 * r["hidden"])


def test_llama3_8b_count_by_hand():
    spec = ModelSpec(arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    # per layer: q,o 2*4096^2; k,v 2*4096*1024; mlp 3*4096*14336; norms 2*4096
    per_layer = 2 * 4096 ** 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    total = 32 * per_layer + 2 * 128256 * 4096 + 4096
    assert param_counts(spec, 8192)["total"] == total == 8_030_261_248


def test_ring_collective_volumes():
    # all-reduce moves 2(n-1)/n of the buffer, all-gather (n-1)/n; a group of one moves nothing
    t, moved = comm.all_reduce(8e9, 8, 100e9, 0.0)
    assert moved == pytest.approx(2 * 7 / 8 * 8e9)
    assert t == pytest.approx(moved / 100e9)
    t, moved = comm.all_gather(8e9, 4, 100e9, 1e-6)
    assert moved == pytest.approx(3 / 4 * 8e9)
    assert t == pytest.approx(moved / 100e9 + 3e-6)
    assert comm.all_reduce(8e9, 1, 100e9, 1e-6) == (0.0, 0.0)


def _lay(**kw):
    base = dict(gpus=8, tp=1, pp=1, dp=8, cp=1, vpp=1, mbs=1, zero=0, recompute=0, sp=0, schedule=1, offload=0)
    base.update(kw)
    return Layout(**base)


def test_bubble_factors():
    # Narayanan 2021: (p-1)/m of the ideal time for 1F1B, (p-1)/(v m) interleaved
    assert bubble_factor(_lay(pp=4, schedule=1), 16) == pytest.approx(3)
    assert bubble_factor(_lay(pp=4, vpp=2, schedule=2), 16) == pytest.approx(1.5)
    # zero-bubble schedules: no bubble once m >= p
    assert bubble_factor(_lay(pp=4, vpp=2, schedule=4), 16) == pytest.approx(0)
    assert bubble_factor(_lay(pp=4, vpp=2, schedule=4), 2) == pytest.approx(1.5 * 0.5)


def test_in_flight_microbatches():
    assert in_flight_microbatches(_lay(pp=4, schedule=1), 16) == 4       # 1F1B: p
    assert in_flight_microbatches(_lay(pp=4, schedule=0), 16) == 16      # GPipe: m
    # interleaved: (v p + p - 1) chunks of L/(p v) layers = (1 + (p-1)/(p v)) full stages (Korthikanti 4.2.3)
    assert in_flight_microbatches(_lay(pp=4, vpp=2, schedule=2), 16) == pytest.approx(4 * (1 + 3 / 8))


def test_stage_layers_uneven():
    assert stage_layers(126, 16) == [7] + [8] * 14 + [7]
    assert sum(stage_layers(126, 16)) == 126
    assert stage_layers(10, 1) == [10]
    assert stage_layers(5, 2) == [3, 2]
    for L in (1, 7, 32, 95, 126):
        for s in (1, 2, 3, 4, 8, 16):
            if s > L:
                continue
            sizes = stage_layers(L, s)
            f, mid, last = rank_block_counts(L, np.array([s]), np.array([1]))
            assert (f[0], last[0]) == (sizes[0], sizes[-1])
            assert mid[0] == (max(sizes[1:-1]) if s > 2 else sizes[0])


def _torch_interleaved_orders(p, v, m):
    """Every rank's action list from torch.distributed.pipelining's ScheduleInterleaved1F1B (its order
    builder, without process groups)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B
    s = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)
    s.pp_group_size, s.n_local_stages, s._n_microbatches = p, v, m
    s.number_of_rounds = max(1, m // p)
    s.microbatches_per_round = m // s.number_of_rounds
    return {r: [a for a in s._calculate_single_rank_operations(r) if a is not None] for r in range(p)}


def _torch_orders(schedule: str, p: int, v: int, m: int):
    """Every rank's action list from torch.distributed.pipelining's interleaved-1f1b, interleaved-zb or ZB-V
    order builder (without process groups), and the rank each stage runs on."""
    from torch.distributed.pipelining import schedules as S
    if schedule == "interleaved-1f1b":
        return _torch_interleaved_orders(p, v, m), (lambda st: st % p)
    if schedule == "interleaved-zb":
        s = S.ScheduleInterleavedZeroBubble.__new__(S.ScheduleInterleavedZeroBubble)
        s.pp_group_size, s.n_local_stages, s._n_microbatches = p, v, m
        s.number_of_rounds = max(1, m // p)
        s.microbatches_per_round = m // s.number_of_rounds
        rank_of = lambda st: st % p  # noqa: E731
    else:
        s = S.ScheduleZBVZeroBubble.__new__(S.ScheduleZBVZeroBubble)
        s.pp_group_size, s.n_local_stages, s._n_microbatches, s.num_stages = p, 2, m, 2 * p
        s.stage_index_to_group_rank = S.generate_stage_to_rank_mapping(p, 2 * p, style="v")
        rank_of = s.stage_index_to_group_rank.__getitem__
    return {r: [a for a in s._calculate_single_rank_operations(r) if a is not None] for r in range(p)}, rank_of


def test_held_sends_and_in_flight_counts_follow_torchs_orders():
    """Per rank, the peak over torch's action order of A x chunks whose activations are held + P x chunks
    waiting for their weight-gradient pass + H x sent tensors held to the step's end (the runtime waits on its
    sends when the step ends; a send goes to another rank only), against the model's moments.  ZB-V with as
    many micro-batches as ranks (its order is cut from the one for 2p - 1) is walked (zbv_order_moments)."""
    from torch.distributed.pipelining.schedules import _ComputationType as C
    A, P, H = 8.0, 5.0, 0.5
    codes = {"interleaved-1f1b": 2, "interleaved-zb": 3, "zbv": 4}
    checked = 0
    for schedule, vs in (("interleaved-1f1b", (2, 3)), ("interleaved-zb", (2, 3)), ("zbv", (2,))):
        for v in vs:
            for p in (2, 3, 4, 8):
                for m in (p, 2 * p, 4 * p):
                    orders, rank_of = _torch_orders(schedule, p, v, m)
                    last_stage = p * v - 1
                    model = rank_inflight(_lay(gpus=p, pp=p, dp=1, vpp=v, schedule=codes[schedule]), m, p * v)
                    mid = 1 if schedule == "interleaved-1f1b" else max(p - 2, 1)
                    for kind, r in (("first", 0), ("mid", mid), ("last", p - 1)):
                        if kind == "mid" and p <= 2:
                            continue
                        act = pend = held = 0
                        peak = 0.0
                        for a in orders[r]:
                            t, st = a.computation_type, a.stage_index
                            act += t == C.FORWARD
                            pend += (t == C.BACKWARD_INPUT) - (t == C.BACKWARD_WEIGHT)
                            act -= t in (C.BACKWARD_WEIGHT, C.FULL_BACKWARD)
                            if t in (C.BACKWARD_INPUT, C.FULL_BACKWARD):
                                held += (st != 0 and rank_of(st - 1) != r) + (st != last_stage and rank_of(st + 1) != r)
                            peak = max(peak, act * A + pend * P + held * H)
                        # the model's counts are in stage units (v chunks each)
                        got = max(float(n) * v * A + float(w) * v * P + float(h) * H for n, w, h in model[kind])
                        assert got == pytest.approx(peak), (schedule, p, v, m, kind)
                        checked += 1
    assert checked > 100


def test_virtual_stage_blocks_is_stage_layers():
    for L in (1, 5, 7, 13, 30, 126):
        for p in (1, 2, 3, 4, 16):
            for v in (1, 2, 3, 8):
                if p * v > L + 2:
                    continue
                got = [int(virtual_stage_blocks(L, np.array(p), np.array(v), s)) for s in range(p * v)]
                assert got == stage_layers(L, p * v), (L, p, v)


def test_interleaved_peak_follows_torchs_action_order():
    """The held blocks x micro-batches under interleaved 1F1B, action by action through torch's order,
    with every stage's own block count: the model's peak is the simulated one on every rank, also
    where the stages are uneven and the peak comes after the warm-up."""
    from torch.distributed.pipelining.schedules import _ComputationType
    after_warmup = cases = 0
    for L, p, v, m in [(L, p, v, m) for L in (5, 6, 10, 13, 30, 126) for p in (2, 3, 4, 16) for v in (2, 3, 8)
                       for m in (p, 2 * p, 4 * p) if p * v <= L + 2]:
        sizes = stage_layers(L, p * v)
        for r, ops in _torch_interleaved_orders(p, v, m).items():
            held = peak = 0
            warm = None
            for a in ops:
                if a.computation_type == _ComputationType.FORWARD:
                    held += sizes[a.stage_index]
                    peak = max(peak, held)
                else:
                    warm = held if warm is None else warm
                    held -= sizes[a.stage_index]
            assert held == 0
            assert interleaved_block_peak(L, p, v, m, r) == peak, (L, p, v, m, r)
            after_warmup += peak > warm
            cases += 1
    assert cases > 500 and after_warmup > 50  # the steady state matters, not only the warm-up's end
    # vectorised over candidates: the same answers in one call
    p = np.array([2, 4, 16, 16]); v = np.array([2, 2, 8, 8]); m = np.array([4, 8, 32, 16])
    got = interleaved_block_peak(126, p, v, m, np.array([1, 0, 0, 1]))
    assert list(got) == [interleaved_block_peak(126, *a) for a in zip(p, v, m, (1, 0, 0, 1))]


def test_uneven_interleaved_counts_the_light_chunk_once():
    # even stages: Megatron's warm-up count, (v p + p - 1 - 2r) / v per block
    lay = _lay(pp=4, vpp=2, schedule=2)
    even = rank_inflight(lay, 16, layers=16)
    assert even["first"][0][0] == pytest.approx((8 + 3) / 2) and even["last"][0][0] == pytest.approx((8 - 3) / 2)
    # llama3-405b's 126 layers on pp 16 x vpp 8 with 32 micro-batches: rank 0's first chunk (stage 0) has no
    # block, and it is the chunk with 31 micro-batches in flight: its 7 blocks hold 16 each, 112 in all, not
    # 7 x 143 / 8 = 125.1
    lay = _lay(gpus=128, pp=16, vpp=8, schedule=2)
    first = rank_inflight(lay, 32, layers=126)["first"][0][0]
    assert first * 7 == pytest.approx(112)
    assert rank_inflight(lay, 32)["first"][0][0] * 7 == pytest.approx(7 * 143 / 8)


def test_activation_memory_by_hand():
    # llama block, flash attention, no recompute, no SP, tp=1: per token bytes =
    # 2 * (4h + 2*qw + 2*kvw + 3*ffn) + 8 (norm stats) + 4*heads (lse)
    spec = ModelSpec(arch="llama", layers=2, hidden=1024, heads=8, kv_heads=4, ffn_hidden=2816, vocab=1000)
    m = ModelDims.from_spec(spec, 2048)
    per_tok = 2 * (4 * 1024 + 2 * 1024 + 2 * 512 + 3 * 2816) + 8 + 4 * 8
    got = activation_bytes_per_layer(m, _lay(mbs=2), 2, True)
    assert got == pytest.approx(2 * 2048 * per_tok)
    # full recompute keeps only the block input: 2 bytes x h per token
    assert activation_bytes_per_layer(m, _lay(mbs=2, recompute=2), 2, True) == pytest.approx(2 * 2048 * 2 * 1024)
    # tensor + sequence parallel divides everything by tp (Korthikanti's 34/t)
    a1 = activation_bytes_per_layer(m, _lay(mbs=2, tp=4, sp=1), 2, True)
    assert a1 == pytest.approx(2 * 2048 * ((per_tok - 8) / 4 + 8), rel=1e-9)


def test_model_states_by_recipe_and_zero():
    spec = gpt(4, 1024, 16)
    m = ModelDims.from_spec(spec, 1024)
    counts = param_counts(spec, 1024)
    for precision, per_param in (("master-weights", (2, 4, 12)), ("amp", (4, 4, 8))):
        tr = TrainingConsts(global_batch_size=8, dtype="bf16", precision=precision, flash_attention=True,
                            overlap_grad_reduce=True, overlap_tp_comm=False)
        mem = memory_breakdown(m, _lay(dp=8, zero=0), tr, 1)
        # one stage holds every parameter (tied head shares the embedding)
        assert mem["weights"] == pytest.approx(counts["total"] * per_param[0])
        assert mem["grads"] == pytest.approx(counts["total"] * per_param[1])
        assert mem["optimizer"] == pytest.approx(counts["total"] * per_param[2])
        z1 = memory_breakdown(m, _lay(dp=8, zero=1), tr, 1)
        assert z1["optimizer"] == pytest.approx(counts["total"] * per_param[2] / 8)
        # DeepSpeed stage 3: 16-bit (or fp32) weight shards beside the fp32 master shards
        ds = replace(tr, zero3_fsdp2=False)
        z3 = memory_breakdown(m, _lay(dp=8, zero=3), ds, 1)
        assert z3["weights"] == pytest.approx(counts["total"] * per_param[0] / 8)
        assert z3["grads"] == pytest.approx(counts["total"] * per_param[1] / 8)
        # FSDP2: with a master recipe the fp32 shard is the master (no 16-bit shard); the root's
        # parameters (embedding, final norm: everything outside the blocks) stay gathered
        z3 = memory_breakdown(m, _lay(dp=8, zero=3), tr, 1)
        root = counts["total"] - 4 * layer_params_per_gpu(m, 1)
        shard = 0 if precision == "master-weights" else per_param[0]
        assert z3["weights"] == pytest.approx(root * per_param[0] + counts["total"] * shard / 8)
        assert z3["grads"] == pytest.approx(counts["total"] * per_param[1] / 8)
        assert z3["optimizer"] == pytest.approx(counts["total"] * per_param[2] / 8)
        off = memory_breakdown(m, _lay(dp=8, zero=1, offload=1), tr, 1)
        assert off["optimizer"] == 0 and off["offloaded"] == pytest.approx(counts["total"] * per_param[2] / 8)


def test_mfu_definition():
    """MFU = tokens/s x (6 x matmul params + 12 L h s) / (GPUs x peak)."""
    spec = ModelSpec(arch="llama", layers=24, hidden=2048, heads=16, kv_heads=8, ffn_hidden=5632, vocab=32000)
    m = ModelDims.from_spec(spec, 2048)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    tr = TrainingConsts(global_batch_size=4, dtype="bf16", precision="amp", flash_attention=True,
                        overlap_grad_reduce=True, overlap_tp_comm=False)
    out = evaluate(m, tr, hw, _lay(gpus=1, dp=1, mbs=4))
    counts = param_counts(spec, 2048)
    flops_tok = 6 * (counts["total"] - counts["embedding"] - 24 * 2 * 2048 - 2048) + 12 * 24 * 2048 * 2048
    assert float(out["model_flops_per_token"]) == pytest.approx(flops_tok)
    mfu = float(out["tokens_per_s"]) * flops_tok / (1 * 989.4e12)
    assert float(out["mfu"]) == pytest.approx(mfu)
    # one GPU: Amdahl speedup 1, no communication
    assert float(out["comm_dp_bytes"]) == 0 and float(out["comm_tp_bytes"]) == 0


@pytest.mark.parametrize("schedule", [1, 4])  # 1F1B, ZB-V (layout.SCH_1F1B, SCH_ZBV)
def test_sp_keeps_the_shard_and_gathers_again_in_the_backward(schedule):
    """Sequence parallelism: Megatron and parplan's runtime keep the shard of the column-parallel
    matmuls' input (h/tp per token, twice a block) and all-gather it again in the backward (parplan's
    under a zero-bubble pipeline in the weight-gradient pass); torch's DTensor SP (torchtitan) keeps
    the gathered input (h per token) and gathers nothing in the backward."""
    from planner.core import training_consts
    from planner.schema import Training
    spec = ModelSpec(arch="llama", layers=8, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000)
    m = ModelDims.from_spec(spec, 4096)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(gpus=8, tp=4, pp=2, dp=1, vpp=2 if schedule == 4 else 1, sp=1, schedule=schedule)
    tr = dict(seq_len=4096, global_batch_size=8, micro_batch_size=1, num_microbatches=8, precision="master-weights")
    out = {fw: evaluate(m, training_consts(Training(**tr, framework=fw)), hw, lay)
           for fw in ("parplan", "megatron", "torchtitan")}
    per_block = 2 * m.hidden * (1 - 1 / 4) * 2 * 4096  # two inputs, (1 - 1/tp) of h per token more, bf16
    shard = activation_bytes_per_layer(m, lay, 2, True)
    gathered = activation_bytes_per_layer(m, lay, 2, True, sp_saves_gathered=True)
    assert float(gathered - shard) == pytest.approx(per_block)
    act = {k: float(o["mem_activations"]) for k, o in out.items()}
    tp_s = {k: float(o["tp_comm_s"]) for k, o in out.items()}
    tp_b = {k: float(o["comm_tp_bytes"]) for k, o in out.items()}
    assert act["torchtitan"] > act["parplan"] and tp_s["torchtitan"] < tp_s["parplan"]
    # gathering again moves two all-gathers of the block input per block and micro-batch
    blocks, micro = 4, 8
    assert tp_b["parplan"] - tp_b["torchtitan"] == pytest.approx(micro * blocks * 2 * 3 / 4 * 4096 * 4096 * 2)
    assert tp_b["megatron"] == tp_b["parplan"]


def test_tp_across_nodes_pays_inter_node_tier():
    spec = gpt(8, 8192, 64)
    m = ModelDims.from_spec(spec, 2048)
    tr = TrainingConsts(global_batch_size=16, dtype="bf16", precision="master-weights", flash_attention=True,
                        overlap_grad_reduce=True, overlap_tp_comm=False)
    prof = load_profile("h100-sxm-80gb")
    inside = evaluate(m, tr, constants_from_profile(prof, "bf16", gpus_per_node=16), _lay(gpus=16, tp=16, dp=1))
    across = evaluate(m, tr, constants_from_profile(prof, "bf16", gpus_per_node=8), _lay(gpus=16, tp=16, dp=1))
    # by hand: 16 micro-batches x 8 blocks x 4 all-reduces of 2048 x 8192 x 2 bytes, ring over 16 ranks
    msg = 2048 * 8192 * 2
    for out, tier in ((inside, prof.nvlink), (across, prof.inter_node)):
        one = 2 * 15 / 16 * msg / (tier.gbytes_per_s * 1e9 * tier.efficiency) + 2 * 15 * tier.latency_s
        assert float(out["tp_comm_s"]) == pytest.approx(16 * 8 * 4 * one, rel=1e-6)
    assert float(across["tp_comm_s"]) > 5 * float(inside["tp_comm_s"])


@pytest.mark.parametrize("tp,sp", [(1, 0), (8, 0), (8, 1), (4, 1)])
def test_gpt_with_dropout_reproduces_korthikanti_activation_formula(tp, sp):
    """Korthikanti 2022 eq. 2-5: per layer s*b*h*(34 + 5as/h) bytes without parallelism,
    s*b*h*(10 + 24/t + 5as/(h t)) with TP, s*b*h*(34/t + 5as/(h t)) with TP + SP (16-bit
    activations, dropout, unfused attention).  Ours adds only fp32 norm statistics (8 bytes/token)."""
    a, h, s, b = 32, 4096, 2048, 2
    spec = gpt(2, h, a)
    m = ModelDims.from_spec(spec, s)
    got = activation_bytes_per_layer(m, _lay(tp=tp, sp=sp, mbs=b, dp=1, gpus=tp), 2, False, dropout=True)
    if sp:
        k = s * b * h * (34 / tp + 5 * a * s / (h * tp))
    else:
        k = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
    assert got == pytest.approx(k + 8 * s * b, rel=1e-12)
    # selective recompute drops exactly the 5as/(ht) attention term (Korthikanti sec. 5)
    sel = activation_bytes_per_layer(m, _lay(tp=tp, sp=sp, mbs=b, dp=1, gpus=tp, recompute=1), 2, False, dropout=True)
    assert got - sel == pytest.approx(s * b * h * 5 * a * s / (h * tp), rel=1e-12)


def test_tied_embedding_gradient_sync_across_pipeline_stages():
    """With tied embeddings and pp > 1 the first and last stages all-reduce the V x h / tp embedding
    gradient (2 ranks: the whole buffer moves once) after the backward; untied models skip it."""
    tr = TrainingConsts(global_batch_size=8, dtype="bf16", precision="master-weights", flash_attention=True,
                        overlap_grad_reduce=True, overlap_tp_comm=False)
    prof = load_profile("a100-sxm-80gb")
    hw = constants_from_profile(prof, "bf16")
    lay = _lay(gpus=16, tp=4, pp=4, dp=1, mbs=1)
    tied = evaluate(ModelDims.from_spec(gpt(8, 2048, 16, vocab=250880, tied=True), 2048), tr, hw, lay)
    untied = evaluate(ModelDims.from_spec(gpt(8, 2048, 16, vocab=250880, tied=False), 2048), tr, hw, lay)
    grad_bytes = 250880 * 2048 / 4 * 4  # fp32 grads of the vocab-parallel shard
    tier = prof.inter_node  # tp 4 x (pp - 1) = 12 ranks apart: another node
    expected = grad_bytes / (tier.gbytes_per_s * 1e9 * tier.efficiency) + 2 * tier.latency_s
    assert float(tied["dp_comm_s"]) - float(untied["dp_comm_s"]) == pytest.approx(expected, rel=1e-6)
    assert float(tied["comm_dp_bytes"]) - float(untied["comm_dp_bytes"]) == pytest.approx(grad_bytes)


def test_zero1_gradient_reduction_variants():
    """ZeRO-1 by all-reduce moves 2(n-1)/n of the gradient bytes, by reduce-scatter (n-1)/n; both then
    all-gather the 16-bit weights.  ZeRO-2 always reduce-scatters."""
    spec = gpt(4, 1024, 16)
    m = ModelDims.from_spec(spec, 1024)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    P = param_counts(spec, 1024)["total"]
    moved = {}
    for how in (True, False):
        tr = TrainingConsts(global_batch_size=16, dtype="bf16", precision="master-weights", flash_attention=True,
                            overlap_grad_reduce=False, overlap_tp_comm=False, zero1_all_reduce=how)
        for zero in (1, 2):
            moved[how, zero] = float(evaluate(m, tr, hw, _lay(gpus=8, dp=8, zero=zero))["comm_dp_bytes"])
    ag = 7 / 8 * P * 2
    assert moved[True, 1] == pytest.approx(2 * 7 / 8 * P * 4 + ag)
    assert moved[False, 1] == pytest.approx(7 / 8 * P * 4 + ag)
    assert moved[True, 2] == moved[False, 2] == pytest.approx(7 / 8 * P * 4 + ag)


def test_pipeline_scatter_gather():
    """Megatron's scatter/gather (Narayanan 2021 sec. 4.1): without SP each of the tp ranks sends 1/tp of
    the b x s x h activation to the next stage, which all-gathers it over NVLink; full tensors otherwise.
    With SP the stage output is already sharded: 1/tp and no gather, whatever the flag."""
    spec = gpt(8, 4096, 32)
    m = ModelDims.from_spec(spec, 2048)
    prof = load_profile("a100-sxm-80gb")
    hw = constants_from_profile(prof, "bf16")
    out = {}
    for sg in (False, True):
        tr = TrainingConsts(global_batch_size=8, dtype="bf16", precision="master-weights", flash_attention=True,
                            overlap_grad_reduce=True, overlap_tp_comm=False, p2p_scatter_gather=sg)
        for sp in (0, 1):
            out[sg, sp] = evaluate(m, tr, hw, _lay(gpus=16, tp=8, pp=2, dp=1, mbs=1, sp=sp))
    act = 2048 * 4096 * 2
    n_mb = 8  # micro-batches, each sends activations forward and gradients backward once (vpp 1)
    assert float(out[False, 0]["comm_pp_bytes"]) == pytest.approx(n_mb * 2 * act)
    assert float(out[True, 0]["comm_pp_bytes"]) == pytest.approx(n_mb * 2 * act / 8)
    ib, nv = prof.inter_node, prof.nvlink  # tp 8 fills the node: stages talk over InfiniBand
    send = act / 8 / (ib.gbytes_per_s * 1e9 * ib.efficiency) + ib.latency_s
    gather = 7 / 8 * act / (nv.gbytes_per_s * 1e9 * nv.efficiency) + 7 * nv.latency_s
    assert float(out[True, 0]["pp_comm_s"]) == pytest.approx(n_mb * 2 * (send + gather), rel=1e-6)
    assert float(out[True, 0]["pp_comm_s"]) < float(out[False, 0]["pp_comm_s"]) / 3
    for k in ("comm_pp_bytes", "pp_comm_s"):
        assert float(out[True, 1][k]) == pytest.approx(float(out[False, 1][k]))
    # DeepSpeed's pipeline engine partitions the same way (PartitionedTensor) but runs its four transfers
    # a micro-batch one after another; it gathers after both receives and once more before the backward
    # to rebuild the stage's own output, which it kept partitioned since the forward's send
    ds = TrainingConsts(global_batch_size=8, dtype="bf16", precision="master-weights", flash_attention=True,
                        overlap_grad_reduce=True, overlap_tp_comm=False, p2p_scatter_gather=True,
                        p2p_blocking_transfers=True)
    ds_out = evaluate(m, ds, hw, _lay(gpus=16, tp=8, pp=2, dp=1, mbs=1, sp=0))
    assert float(ds_out["pp_comm_s"]) == pytest.approx(n_mb * (4 * send + 3 * gather), rel=1e-6)


def test_overlapped_communication_slows_the_compute_beside_it():
    """A collective of C s beside X s of compute costs max(C, X + C k/(1+k)) - X extra for the profile's
    compute slowdown k (perfect overlap at k = 0).  By hand for ZeRO-3 over 16 GPUs on two nodes, where
    the gathers (C) are shorter than the micro-batch's compute: exposed 0 at k = 0, C k/(1+k) at k."""
    from dataclasses import replace
    spec = gpt(8, 4096, 32)
    m = ModelDims.from_spec(spec, 2048)
    prof = load_profile("a100-sxm-80gb")
    k = prof.overlap_compute_slowdown
    assert k == pytest.approx(0.189)
    hw = constants_from_profile(prof, "bf16")
    hw0 = replace(hw, overlap_slowdown=0.0)
    assert hw.exposed(1.0, 5.0) == pytest.approx(k / (1 + k)) and hw0.exposed(1.0, 5.0) == 0.0
    assert hw.exposed(5.0, 1.0) == pytest.approx(4.0) == hw0.exposed(5.0, 1.0)
    tr = TrainingConsts(global_batch_size=256, dtype="bf16", precision="master-weights", flash_attention=True,
                        overlap_grad_reduce=True, overlap_tp_comm=False)
    lay = _lay(gpus=16, dp=16, zero=3, mbs=16)  # one micro-batch of 16 sequences per GPU
    with_k, without = evaluate(m, tr, hw, lay), evaluate(m, tr, hw0, lay)
    P = param_counts(spec, 2048)["total"]
    ag, _ = comm.all_gather(P * 2, 16, hw.inter_node.bytes_per_s, hw.inter_node.latency_s)
    rs, _ = comm.reduce_scatter(P * 4, 16, hw.inter_node.bytes_per_s, hw.inter_node.latency_s)
    c = 2 * ag + rs  # gather for forward and backward, reduce-scatter the fp32 gradients
    assert float(without["dp_comm_s"]) == 0.0  # hidden behind the micro-batch
    assert float(with_k["dp_comm_s"]) == pytest.approx(c * k / (1 + k), rel=1e-6)


def test_zero2_gradients_sharded_only_when_reduced_per_micro_batch():
    """ZeRO-2 reduced once per step (parplan's runtime) holds every gradient through the backward, so its
    memory equals ZeRO-1's; reduced per micro-batch (DeepSpeed stage 2) the gradients stay sharded and
    the reduce-scatter traffic is m times larger."""
    spec = gpt(4, 1024, 16)
    m = ModelDims.from_spec(spec, 1024)
    P = param_counts(spec, 1024)["total"]
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    out = {}
    for each in (False, True):
        tr = TrainingConsts(global_batch_size=64, dtype="bf16", precision="master-weights", flash_attention=True,
                            overlap_grad_reduce=True, overlap_tp_comm=False, zero1_all_reduce=False,
                            zero2_each_microbatch=each)
        out[each] = evaluate(m, tr, hw, _lay(gpus=8, dp=8, zero=2, mbs=2))  # 4 micro-batches
        z1 = evaluate(m, tr, hw, _lay(gpus=8, dp=8, zero=1, mbs=2))
        if not each:
            assert float(out[each]["mem_total"]) == pytest.approx(float(z1["mem_total"]))
    assert float(out[False]["num_microbatches"]) == 4
    mem = {each: memory_breakdown(m, _lay(gpus=8, dp=8, zero=2, mbs=2),
                                  TrainingConsts(global_batch_size=64, dtype="bf16", precision="master-weights",
                                                 flash_attention=True, overlap_grad_reduce=True, overlap_tp_comm=False,
                                                 zero2_each_microbatch=each), 4) for each in (False, True)}
    assert mem[False]["grads"] == pytest.approx(P * 4)
    assert mem[True]["grads"] == pytest.approx(P * 4 / 8)
    rs = 7 / 8 * P * 4
    ag = 7 / 8 * P * 2
    assert float(out[False]["comm_dp_bytes"]) == pytest.approx(rs + ag)
    assert float(out[True]["comm_dp_bytes"]) == pytest.approx(4 * rs + ag)
    assert float(out[True]["dp_comm_s"]) >= float(out[False]["dp_comm_s"])


def test_zero3_inside_torch_pipelining_holds_full_weights_and_gradients():
    """torch.distributed.pipelining turns FSDP2 resharding and gradient sync off until the step ends, so
    ZeRO-3 with pp > 1 holds full weights and gradients (optimizer states stay sharded) and communicates
    once per step; frameworks that reshard per micro-batch keep everything sharded."""
    spec = gpt(8, 1024, 16, tied=False)  # no first/last-stage embedding sync in the bytes
    m = ModelDims.from_spec(spec, 1024)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(gpus=8, pp=2, dp=4, zero=3, mbs=1)
    kw = dict(global_batch_size=16, dtype="bf16", precision="master-weights", flash_attention=True,
              overlap_grad_reduce=True, overlap_tp_comm=False)
    torch_pp = TrainingConsts(**kw, zero3_fsdp2=True)
    resharding = TrainingConsts(**kw, zero3_fsdp2=False)
    z1 = memory_breakdown(m, _lay(gpus=8, pp=2, dp=4, zero=1, mbs=1), torch_pp, 4)
    full, sharded = memory_breakdown(m, lay, torch_pp, 4), memory_breakdown(m, lay, resharding, 4)
    for k in ("weights", "grads", "optimizer"):
        assert full[k] == pytest.approx(z1[k])
    assert sharded["weights"] == pytest.approx(full["weights"] / 4)
    assert sharded["grads"] == pytest.approx(full["grads"] / 4)
    once, per_mb = evaluate(m, torch_pp, hw, lay), evaluate(m, resharding, hw, lay)
    assert float(per_mb["comm_dp_bytes"]) == pytest.approx(4 * float(once["comm_dp_bytes"]), rel=1e-9)
    # without a pipeline FSDP2 reshards per micro-batch either way
    flat = _lay(gpus=8, dp=8, zero=3, mbs=1)
    assert float(evaluate(m, torch_pp, hw, flat)["comm_dp_bytes"]) == \
        pytest.approx(float(evaluate(m, resharding, hw, flat)["comm_dp_bytes"]))


def test_memory_by_pipeline_rank_kind():
    """by_stage: each pipeline rank kind's own total; the plan's total is the largest of them."""
    from planner.core import recommend
    from planner.search import Pins
    for pp, kinds in ((1, None), (2, {"first", "last"}), (4, {"first", "middle", "last"})):
        plan = recommend("llama3-8b", 8, seq_len=4096, global_batch_size=64,
                         pins=Pins(tp=1, pp=pp, dp=8 // pp, cp=1, vpp=1, schedule="1f1b"))
        by = plan.prediction.memory_bytes_per_gpu.by_stage
        if kinds is None:
            assert by is None
            continue
        assert set(by) == kinds
        assert max(by.values()) == pytest.approx(plan.prediction.memory_bytes_per_gpu.total)
        # 1F1B: rank 0 holds p micro-batches, the last rank one
        assert by["first"] > by["last"]


def test_all_gather_context_parallel_saves_the_whole_sequences_keys_and_values():
    """parplan's all-gather CP saves the gathered K and V (cp x the rank's tokens) and, with two causal chunks
    per rank, the attention output twice; ring attention (Megatron, torch) saves only the rank's own."""
    spec = ModelSpec(arch="llama", layers=2, hidden=1024, heads=8, kv_heads=2, ffn_hidden=2816, vocab=1000)
    m = ModelDims.from_spec(spec, 8192)
    lay = _lay(cp=4, tp=2, mbs=1)
    T = 8192 / 4
    ring = activation_bytes_per_layer(m, lay, 2, True)
    gathered = activation_bytes_per_layer(m, lay, 2, True, cp_saves_gathered_kv=True)
    assert gathered - ring == pytest.approx(T * (m.q_width + 2 * m.kv_width * 3) / 2 * 2)
    # without context parallelism nothing changes
    assert activation_bytes_per_layer(m, _lay(tp=2), 2, True, cp_saves_gathered_kv=True) == \
        activation_bytes_per_layer(m, _lay(tp=2), 2, True)


def test_deepspeed_pipeline_waits_for_four_transfers_a_micro_batch():
    """DeepSpeed's engine sends and receives one tensor at a time, blocking (TrainSchedule: two
    transfers before each forward and each backward step); Megatron and torch pair a send with the
    opposite receive in one batched call: the pipeline's transfer time per micro-batch doubles."""
    m = ModelDims.from_spec(gpt(24, 2048, 16), 2048)
    hw = constants_from_profile(load_profile("a100-sxm-80gb"), "bf16", 8, 25.0)
    lay = _lay(gpus=16, tp=2, pp=4, dp=2, mbs=1)
    kw = dict(global_batch_size=64, dtype="bf16", precision="master-weights", flash_attention=True,
              overlap_grad_reduce=True, overlap_tp_comm=False)
    paired = evaluate(m, TrainingConsts(**kw), hw, lay)
    blocking = evaluate(m, TrainingConsts(**kw, p2p_blocking_transfers=True), hw, lay)
    assert float(blocking["pp_comm_s"]) == pytest.approx(2 * float(paired["pp_comm_s"]))
    assert float(paired["pp_comm_s"]) > 0
    assert float(blocking["step_time_s"]) > float(paired["step_time_s"])


def test_context_parallel_gather_is_exposed_unless_overlapped():
    """All-gather CP (parplan's runtime; Llama 3: 'the all-gather communication latency is exposed in the
    critical path') pays the K/V gather and the dK/dV reduce-scatter in full; ring attention (Megatron,
    torch: overlap_cp_comm) hides them behind the attention but for the overlap slowdown."""
    m = ModelDims.from_spec(ModelSpec(arch="llama", layers=8, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                                      vocab=32000), 32768)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(gpus=16, tp=8, cp=2, dp=1, mbs=1)
    kw = dict(global_batch_size=4, dtype="bf16", precision="master-weights", flash_attention=True,
              overlap_grad_reduce=True, overlap_tp_comm=False)
    exposed = evaluate(m, TrainingConsts(**kw), hw, lay)
    ring = evaluate(m, TrainingConsts(**kw, overlap_cp_comm=True), hw, lay)
    share = hw.overlap_slowdown / (1 + hw.overlap_slowdown)
    assert float(exposed["cp_comm_s"]) > 0
    assert float(ring["cp_comm_s"]) == pytest.approx(share * float(exposed["cp_comm_s"]), rel=1e-6)
    assert float(exposed["step_time_s"]) > float(ring["step_time_s"])


def test_torch_context_parallel_hides_its_gather_behind_the_local_chunk_only():
    """torch's all-gather rotation (torchtitan) waits for the gathered K/V after the rank's own chunk of the
    attention: 1/cp of it hides the exchange, not all of it as a ring does."""
    m = ModelDims.from_spec(ModelSpec(arch="llama", layers=8, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                                      vocab=32000), 32768)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16", 8, 1.0)  # a slow network: the gather shows
    lay = _lay(gpus=32, tp=8, cp=4, dp=1, mbs=1)
    kw = dict(global_batch_size=4, dtype="bf16", precision="master-weights", flash_attention=True,
              overlap_grad_reduce=True, overlap_tp_comm=False, overlap_cp_comm=True)
    ring = float(evaluate(m, TrainingConsts(**kw), hw, lay)["cp_comm_s"])
    local = float(evaluate(m, TrainingConsts(**kw, cp_overlap_local_chunk_only=True), hw, lay)["cp_comm_s"])
    exposed = float(evaluate(m, TrainingConsts(**{**kw, "overlap_cp_comm": False}), hw, lay)["cp_comm_s"])
    assert ring < local < exposed


def test_groups_that_do_not_tile_a_node_cross_it():
    """tp 6 on 8-GPU nodes puts ranks 6-11 on two nodes: the group pays the network; tp 4 and 8 tile the
    node; on a job of one node every group is inside."""
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    inside = comm.group_inside_node(hw, 1, np.array([2, 4, 6, 8, 16]), 64)
    assert inside.tolist() == [True, True, False, True, False]
    assert bool(comm.group_inside_node(hw, 1, 6, 6))       # six GPUs of one node
    assert not bool(comm.group_inside_node(hw, 2, 3, 64))  # a cp group of 3 over tp 2 spans 6 ranks


def test_async_tp_input_grad_collective_hides_behind_weight_gradients():
    """Megatron-LM starts the column-parallel layers' input-gradient all-reduce (a reduce-scatter with SP)
    asynchronously and computes their weight gradients meanwhile: per block two such collectives cost only
    what the weight-gradient GEMMs (the qkv and fc1 GEMMs' FLOPs again) cannot hide, max(C k/(1+k), C - X).
    By hand for a tp-8 GPT on one node, with and without SP: on NVLink the GEMMs outlast the collectives
    (X > C: the overlap slowdown's share is what is left), and on a link 1/1000 as fast they do not (X < C: C - X
    is left); nothing changes when --tp-comm-overlap already hides every TP collective, or without TP."""
    from cost_models.compute import column_input_grad_time
    spec = gpt(8, 4096, 32)
    m = ModelDims.from_spec(spec, 2048)
    prof = load_profile("a100-sxm-80gb")
    fast = constants_from_profile(prof, "bf16")
    nv = prof.nvlink
    k = prof.overlap_compute_slowdown

    def run(hw, asy, sp, tp=8, overlap=False):
        tr = TrainingConsts(global_batch_size=4, dtype="bf16", precision="master-weights", flash_attention=True,
                            overlap_grad_reduce=True, overlap_tp_comm=overlap, async_tp_grad_comm=asy)
        lay = _lay(gpus=tp, tp=tp, pp=1, dp=1, mbs=1, sp=sp)
        return lay, float(evaluate(m, tr, hw, lay)["tp_comm_s"])

    # X by hand: the qkv (h x 3h) and fc1 (h x 4h) GEMMs of 2048 tokens on a tp-8 rank, at the profile's
    # matmul efficiency for each GEMM's size
    tokens, h = 2048, 4096
    gemms = [2 * tokens * h * 3 * h / 8, 2 * tokens * h * 4 * h / 8]
    x = sum(f / (fast.peak_flops * fast.matmul_efficiency(f)) for f in gemms)
    msg = 2048 * 4096 * 2
    for scale in (1.0, 1e-3):
        hw = replace(fast, nvlink=replace(fast.nvlink, bytes_per_s=fast.nvlink.bytes_per_s * scale))
        bw = nv.gbytes_per_s * 1e9 * nv.efficiency * scale
        t_ar = 2 * 7 / 8 * msg / bw + 14 * nv.latency_s
        t_rs = 7 / 8 * msg / bw + 7 * nv.latency_s
        for sp, c in ((0, 2 * t_ar), (1, 2 * t_rs)):
            lay, waited = run(hw, False, sp)
            _, hidden = run(hw, True, sp)
            assert float(column_input_grad_time(m, lay, hw)) == pytest.approx(x, rel=1e-9)
            if scale == 1.0:
                assert x > c > 0  # the GEMMs are long enough to hide most of it: C k / (1 + k) is left
                saved = c / (1 + k)
            else:
                assert c - x > c * k / (1 + k)  # a slow link: C - X is left, X is saved
                saved = x
            assert waited - hidden == pytest.approx(4 * 8 * saved, rel=1e-6)  # 4 micro-batches x 8 blocks
    assert run(fast, True, 1, overlap=True)[1] == run(fast, False, 1, overlap=True)[1]
    assert run(fast, True, 0, tp=1)[1] == run(fast, False, 0, tp=1)[1] == 0.0


def test_triton_2022_attention_is_flashattention2_capped_and_slowed_by_the_published_ratios():
    """attention_kernel triton-2022 (llm-foundry's attn_impl triton): FlashAttention-2's published best on the GPU
    (Dao 2023 sec. 4.1: 335 TFLOP/s on H100) caps the profile's curve, and the kernel runs its forward 1.4x and its
    backward 2x slower than that (same section: 1.3-1.5x and 2x, A100); the sustained fraction applies to both."""
    from cost_models.compute import attention_core_time
    spec = ModelSpec(arch="gpt", layers=2, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192, vocab=50368)
    lay = Layout(gpus=np.array([4]), tp=np.array([2]), pp=np.array([1]), dp=np.array([1]), cp=np.array([2]), vpp=np.array([1]),
                 mbs=np.array([3]), zero=np.array([0]), recompute=np.array([0]), sp=np.array([0]),
                 schedule=np.array([0]), offload=np.array([0]))
    for name, cap in (("h100-sxm-80gb", 335e12), ("a100-sxm-80gb", 230e12)):
        hw = constants_from_profile(load_profile(name), "bf16")
        for seq in (1024, 8192, 65536):
            m = ModelDims.from_spec(spec, seq)
            flops = 0.5 * 4 * 3 * seq * seq * 2048 / (2 * 2)
            f0, b0 = attention_core_time(m, lay, hw, True)
            f1, b1 = attention_core_time(m, lay, hw, True, kernel="triton-2022")
            rate = min(hw.peak_flops * hw.attention_efficiency(seq), hw.sustained * cap)
            assert float(f1[0]) == pytest.approx(1.4 * flops / rate, rel=1e-9)
            assert float(b1[0]) == pytest.approx(2.0 * 2.5 * flops / rate, rel=1e-9)
            assert float(f0[0]) == pytest.approx(flops / (hw.peak_flops * hw.attention_efficiency(seq)), rel=1e-9)
            assert float(b0[0]) == pytest.approx(2.5 * float(f0[0]), rel=1e-9)
            assert float(f1[0]) > 1.39 * float(f0[0])
        # the H100 curve passes FlashAttention-2's best at long sequences; the A100 one never reaches it
        assert (hw.peak_flops * hw.attention_efficiency(8192) > hw.sustained * cap) == (name == "h100-sxm-80gb")
    # unfused attention has no kernel to choose
    m = ModelDims.from_spec(spec, 2048)
    assert attention_core_time(m, lay, hw, False, kernel="triton-2022") == attention_core_time(m, lay, hw, False)


def test_attention_share_of_compute_is_the_critical_stage_attention_kernel_time():
    """Prediction.time_breakdown.attention_s: the attention core's seconds on the critical stage, forward,
    backward and recompute, all micro-batches; the triton-2022 kernel's is larger by its published ratios."""
    from cost_models.compute import attention_core_time
    from planner.core import evaluate_plan, recommend
    from planner.search import Pins
    spec = ModelSpec(arch="llama", layers=8, hidden=2048, heads=16, kv_heads=4, ffn_hidden=5632, vocab=32000)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    for rec, extra in (("none", 0.0), ("full", 1.0), ("selective", 1.0)):
        pins = Pins(tp=1, pp=1, cp=1, dp=8, mbs=2, zero=1, sp=False, vpp=1, schedule="1f1b", offload="none",
                    recompute=rec)
        plan = recommend(spec, 8, seq_len=8192, global_batch_size=64, pins=pins, top_k=1, suggest=False)
        tb = plan.prediction.time_breakdown
        m = ModelDims.from_spec(plan.model, 8192)
        lay = Layout(gpus=8, tp=1, pp=1, dp=8, cp=1, vpp=1, mbs=2, zero=1, recompute=0, sp=0, schedule=0, offload=0)
        f, b = attention_core_time(m, lay, hw, True)
        assert tb.attention_s == pytest.approx(plan.training.num_microbatches * 8 * (f + b + extra * f), rel=1e-9)
        assert 0 < tb.attention_s < tb.compute_s
        tri = evaluate_plan(plan.model_copy(update={"training": plan.training.model_copy(
            update={"attention_kernel": "triton-2022"})})).prediction.time_breakdown
        assert tri.attention_s > 1.8 * tb.attention_s
        assert tri.compute_s - tb.compute_s == pytest.approx(tri.attention_s - tb.attention_s, rel=1e-6)


def test_loss_memory_by_cross_entropy_kind():
    """Per logit at the loss's backward: autograd over an fp32 upcast 12 B (saved 4); Megatron's fused softmax
    16-bit logits + 4 B (saved 4); flash-attn's, gradient in the logits' dtype, 2 x 2 B (saved 2)."""
    from cost_models.memory import logits_bytes
    spec = ModelSpec(arch="llama", layers=2, hidden=512, heads=8, kv_heads=8, ffn_hidden=1408, vocab=32000)
    m = ModelDims.from_spec(spec, 1024)
    lay = Layout(gpus=2, tp=2, pp=1, dp=1, cp=1, vpp=1, mbs=3, zero=0, recompute=0, sp=0, schedule=0, offload=0)
    logits = 3 * 1024 * 32000 / 2
    norm = 3 * 1024 * 2 * 512 * 2
    for fused, g16, peak, saved in ((False, False, 12, 4), (True, False, 6, 4), (True, True, 4, 2)):
        p, s = logits_bytes(m, lay, 2, fused, g16)
        assert (p, s) == (pytest.approx(logits * peak + norm), pytest.approx(logits * saved + norm))
    assert logits_bytes(m, lay, 2, False, True) == logits_bytes(m, lay, 2, False, False)  # needs the fused kernel


def test_cross_entropy_passes_are_counted_per_loss_kernel():
    """The head's loss moves 52 bytes per logit (Megatron's vocab-parallel cross-entropy and an autograd
    cross-entropy over fp32 logits, counted from their code) or 6 (flash-attn's Triton loss with its 16-bit
    gradient), at HBM bandwidth: the step differs by exactly (52 - 6) x logits / bandwidth per micro-batch."""
    from cost_models.compute import CE_BYTES_PER_LOGIT, CE_BYTES_PER_LOGIT_FLASH_ATTN, head_time
    assert (CE_BYTES_PER_LOGIT, CE_BYTES_PER_LOGIT_FLASH_ATTN) == (2 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 6, 2 + 2 + 2)
    spec = ModelSpec(arch="gpt", layers=2, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096, vocab=50304)
    m = ModelDims.from_spec(spec, 2048)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    lay = _lay(gpus=2, tp=2, dp=1, mbs=2)
    logits = 2 * 2048 * 50304 / 2
    f52, b52 = head_time(m, lay, hw)
    f6, b6 = head_time(m, lay, hw, 6.0)
    assert float(f52 + b52 - f6 - b6) == pytest.approx(46 * logits / hw.hbm_bytes_per_s, rel=1e-12)

    def step(sixteen_bit_grad):
        tr = TrainingConsts(global_batch_size=8, dtype="bf16", precision="master-weights", flash_attention=True,
                            overlap_grad_reduce=True, overlap_tp_comm=False, fused_cross_entropy=True,
                            cross_entropy_16bit_grad=sixteen_bit_grad)
        return float(evaluate(m, tr, hw, lay)["step_time_s"])
    assert step(False) - step(True) == pytest.approx(4 * 46 * logits / hw.hbm_bytes_per_s, rel=1e-9)  # 4 micro-batches


def test_context_parallel_ranks_are_replicas_for_the_gradients_and_zero():
    """cp ranks hold the same parameters: every framework reduces gradients over dp x cp.  Megatron,
    torchtitan and DeepSpeed shard ZeRO's states over dp x cp too (zero_over_cp); parplan's runtime shards over
    dp and averages the cp replicas with an all-reduce of their own after the backward (train.reduce_gradients)."""
    from cost_models.layout import PRECISION_RECIPES
    spec = ModelSpec(arch="llama", layers=4, hidden=2048, heads=16, kv_heads=16, ffn_hidden=5632, vocab=32000)
    m = ModelDims.from_spec(spec, 8192)
    hw = constants_from_profile(load_profile("h100-sxm-80gb"), "bf16")
    rec = PRECISION_RECIPES["master-weights"]

    def run(over_cp, zero, dp=2, cp=2):
        tr = TrainingConsts(global_batch_size=8, dtype="bf16", precision="master-weights", flash_attention=True,
                            overlap_grad_reduce=False, overlap_tp_comm=False, zero_over_cp=over_cp,
                            zero1_all_reduce=False)
        lay = _lay(gpus=dp * cp, tp=1, pp=1, dp=dp, cp=cp, mbs=1, zero=zero)
        return evaluate(m, tr, hw, lay)

    params = param_counts(spec, 8192)["total"]
    for zero in (1, 2):
        apart, over = run(False, zero), run(True, zero)
        assert float(apart["mem_optimizer"]) == pytest.approx(params * (rec["master"] + rec["adam"]) / 2, rel=1e-9)
        assert float(over["mem_optimizer"]) == pytest.approx(params * (rec["master"] + rec["adam"]) / 4, rel=1e-9)
        # the runtime's extra all-reduce of the full gradients over the 2 cp ranks (inside one node), exposed
        nv = hw.nvlink
        cp_ar, _ = comm.all_reduce(params * rec["grad"], 2, nv.bytes_per_s, nv.latency_s)
        rs_dp, _ = comm.reduce_scatter(params * rec["grad"], 2, nv.bytes_per_s, nv.latency_s)
        rs_dpcp, _ = comm.reduce_scatter(params * rec["grad"], 4, nv.bytes_per_s, nv.latency_s)
        ag_dp, _ = comm.all_gather(params * rec["weight"], 2, nv.bytes_per_s, nv.latency_s)
        ag_dpcp, _ = comm.all_gather(params * rec["weight"], 4, nv.bytes_per_s, nv.latency_s)
        assert float(apart["dp_comm_s"]) == pytest.approx(float(rs_dp + ag_dp + cp_ar), rel=1e-9)
        assert float(over["dp_comm_s"]) == pytest.approx(float(rs_dpcp + ag_dpcp), rel=1e-9)
    # ZeRO-0: one all-reduce over dp x cp in both
    ar, _ = comm.all_reduce(params * rec["grad"], 4, hw.nvlink.bytes_per_s, hw.nvlink.latency_s)
    assert float(run(False, 0)["dp_comm_s"]) == float(run(True, 0)["dp_comm_s"]) == pytest.approx(float(ar), rel=1e-9)
    # and with dp 1, ZeRO has cp ranks to shard over where the framework shards over dp x cp
    assert float(run(True, 1, dp=1, cp=4)["mem_optimizer"]) == pytest.approx(
        params * (rec["master"] + rec["adam"]) / 4, rel=1e-9)


def test_megatron_context_parallel_plan_shards_the_optimizer_over_cp():
    """Llama 3 8B at cp 8 on one node: Megatron's distributed optimizer over the cp ranks fits it in 80 GB;
    parplan's runtime, which shards over dp only, does not (nothing to shard over at dp 1)."""
    from planner.core import NothingFits, recommend
    from planner.models import load_preset
    from planner.search import Pins
    spec = load_preset("llama3-8b")
    plan = recommend(spec, 8, seq_len=8192, framework="megatron", pins=Pins(cp=8), suggest=False)
    assert plan.prediction.fits and plan.parallel.cp == 8 and plan.parallel.zero_stage >= 1
    with pytest.raises(NothingFits):
        recommend(spec, 8, seq_len=8192, pins=Pins(cp=8, offload="none"), suggest=False)
