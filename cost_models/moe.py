"""Mixture-of-experts terms: Megatron-Core's MoE layer as a mixture-of-experts plan runs it.

The layer (megatron/core/transformer/moe/: TopKRouter, MoEAlltoAllTokenDispatcher, GroupedMLP / TEGroupedMLP):
a linear router (h x E, replicated) scores each token's E experts and keeps the top k; the tokens are permuted by
expert, sent to the ranks holding their experts by an all-to-all over the expert-parallel group (dispatch), run
through the rank's E / ep experts as a grouped GEMM (the router's probabilities applied in the experts' weighted
SwiGLU), sent back by a second all-to-all (combine) and summed (unpermute).  The backward runs the two all-to-alls
again in reverse.

Parallel folding with expert tensor parallelism 1 (--expert-tensor-parallel-size 1, the setting NVIDIA's MoE
recipes use): the attention keeps the plan's tp (with sequence parallelism, which Megatron-LM requires beside tp
for MoE), and the MoE layer sees each rank's sequence shard: the ep ranks of a group are taken from the stage's
tp x cp x dp ranks, and the ranks holding the same experts, tp x cp x dp / ep of them, are the experts' data-
parallel group, over which their gradients are reduced and (distributed optimizer) their optimizer states sharded.
A rank's MoE layer handles T / tp tokens (T = mbs x seq / cp), k copies of each.  A shared expert (Qwen2-MoE,
Llama 4) is a dense SwiGLU every token runs, tensor-parallel over the attention's tp on the gathered sequence as a
dense MLP is (its collectives, parameters / tp, one GEMM of its own: ModelDims.shared_ffn); its overlap with the
dispatch (--moe-shared-expert-overlap) is not modelled.

Assumed, not measured here: routing balanced over the experts (dropless, every expert k T / E tokens; a real run's
imbalance makes its slowest rank slower), the all-to-alls on the critical path (Megatron overlaps them only under
its later --overlap-moe-expert-parallel-comm, not modelled), and each expert's GEMM at the efficiency the profile's
curve gives a GEMM of that expert's FLOPs (a grouped GEMM runs the E / ep experts' tiles in one launch, so this
is the pessimistic end for small experts).
"""
from __future__ import annotations

import numpy as np

from . import comm

# SwiGLU experts: gate, up and down matrices of h x expert_ffn each (Mixtral, Qwen3 MoE)
EXPERT_MATRICES = 3


def expert_params_per_layer(m) -> float:
    """Weights of one block's routed experts (all of them)."""
    return m.experts * EXPERT_MATRICES * m.hidden * m.expert_ffn if m.moe else 0.0


def router_params_per_layer(m) -> float:
    """The router's h x E weight (Megatron's TopKRouter: replicated over tp, reduced with the dense parameters)."""
    return m.hidden * m.experts if m.moe else 0.0


def expert_params_per_gpu(m, ep):
    """One block's expert weights on one rank: its E / ep experts, whole (expert tensor parallelism 1)."""
    return expert_params_per_layer(m) / np.asarray(ep)


def expert_data_parallel(lay):
    """Ranks holding the same experts: the stage's tp x cp x dp ranks over ep."""
    return np.asarray(lay.tp) * np.asarray(lay.cp) * np.asarray(lay.dp) // np.asarray(lay.ep)


def routed_tokens(m, lay):
    """Tokens entering a rank's MoE layer a micro-batch: its sequence shard (T / tp under sequence parallelism)."""
    T = lay.mbs * m.seq_len / lay.cp
    return T / np.where(np.asarray(lay.sp) > 0, lay.tp, 1)


def local_experts(m, lay):
    """Experts a rank runs, each a GEMM of the grouped GEMM."""
    return m.experts / np.asarray(lay.ep) if m.moe else 1.0


def saved_bytes_per_token(m, act_bytes: int, fp8: bool = False) -> float:
    """Saved for the backward per routed token beyond what a dense MLP of width k x expert_ffn saves (that part is
    memory.activation_bytes_per_layer's MLP term at ModelDims.ffn): the permuted, dispatched tokens the experts' first
    GEMM saves for its weight gradient (k h), the probabilities the experts' weighted SwiGLU saves (k fp32: Megatron-
    Core's TEGroupedMLP applies them in its activation, weighted_bias_swiglu_impl, so the unpermute is a plain sum that
    saves nothing), and the router's fp32 scores (E, saved by its softmax / top-k) and the load-balancing loss's (E).
    fp8 (Transformer Engine's FP8 grouped GEMMs): the dispatched tokens are saved as the first GEMM's FP8 copy."""
    if not m.moe:
        return 0.0
    k = m.top_k
    return k * m.hidden * (1 if fp8 else act_bytes) + 4 * k + 2 * 4 * m.experts


# torchtitan pads each expert's token group to a multiple of this many rows for its grouped GEMM
# (torchtitan/models/moe/utils.py TOKEN_GROUP_ALIGN_SIZE_M, 8 for bf16: 16-byte alignment)
TITAN_ALIGN_ROWS = 8


def titan_padded_rows(m, lay):
    """The rows torchtitan's grouped GEMM runs a block and micro-batch: the t k dispatched, padded by
    TITAN_ALIGN_ROWS a local expert and rounded up to it (its _permute's padded_max_len)."""
    rows = routed_tokens(m, lay) * m.top_k
    return np.ceil((rows + local_experts(m, lay) * TITAN_ALIGN_ROWS) / TITAN_ALIGN_ROWS) * TITAN_ALIGN_ROWS


def titan_saved_bytes(m, lay, act_bytes: int, eager: bool):
    """What torchtitan's MoE layer (torchtitan/models/moe/moe.py, 0.2.2: TokenChoiceTopKRouter, TokenReorderer,
    GroupedExperts over torch._grouped_mm) saves for its backward per micro-batch, beyond the experts' dense-MLP-of-
    width-k-x-expert_ffn tensors memory.activation_bytes_per_layer counts (in place of saved_bytes_per_token's
    Megatron-Core layer).  Its router and its combine run on every token of the micro-batch, T (under tp its input is
    gathered over the sequence: TrainingConsts.moe_input_gathered); the reorderer hands the rank t = T / tp of them
    to dispatch (ReordererSequenceParallel), t k rows received under balanced routing:
      - the router: its fp32 scores (E), int64 top-k indices (k), fp32 top scores (k) and route sums, a token of T;
      - the reorderer's int64 sort and gather indices (2 k), the permutation's int32 indices over the padded rows;
      - the dispatched tokens (k h, the first grouped GEMM's input) over rows padded by TITAN_ALIGN_ROWS per local
        expert, and the experts' four k x expert_ffn tensors on the padded rows (w1's and w3's outputs, the silu
        output, w2's input: its experts run eagerly even under training.compile, whose apply_compile skips them, so
        the silu output the compiled count leaves out is added where not `eager`);
      - the combine: torch.bmm of the top scores with the unsorted routed outputs upcast to fp32, saved, k h x 4
        bytes a token of T (zeros for the tokens other tp ranks dispatched: the output is a partial sum), MoE.forward
        itself uncompiled.
    Measured against torchtitan 0.2.2's own MoE module on CPU: benchmarks/titan_moe_saved."""
    T = lay.mbs * m.seq_len / lay.cp
    t = routed_tokens(m, lay)
    k, h, E, f = m.top_k, m.hidden, m.experts, m.expert_ffn
    rows = t * k
    pad = titan_padded_rows(m, lay) - rows
    router = T * (4 * E + 12 * k + 4)
    indices = rows * 16 + (rows + pad) * 4
    experts = (rows + pad) * h * act_bytes + pad * 4 * f * act_bytes + (0.0 if eager else rows * f * act_bytes)
    combine = T * k * (4 * h + 4)
    return router + indices + experts + combine


def elementwise_time(m, lay, hw, act_bytes: int):
    """(forward, backward) seconds of the MoE layer's memory-bound passes a block and micro-batch: the permutation by
    expert (read T h, write k T h) and the unpermute's sum (read k T h, write T h), each again in the backward, and
    the router's small GEMM (2 T h E FLOPs forward, twice that backward) with its fp32 softmax / top-k passes over
    T x E scores (read and write, about twice in the backward)."""
    if not m.moe:
        return 0.0, 0.0
    if m.titan_moe:
        return titan_elementwise_time(m, lay, hw, act_bytes)
    t = routed_tokens(m, lay)
    k, h, E = m.top_k, m.hidden, m.experts
    perm = t * 2 * (1 + k) * h * act_bytes / hw.hbm_bytes_per_s
    router_gemm = 2 * t * h * E / (hw.peak_flops * hw.matmul_efficiency(2 * t * h * E))
    scores = t * E * 4 * 2 / hw.hbm_bytes_per_s
    return perm + router_gemm + scores, perm + 2 * router_gemm + 2 * scores


def titan_elementwise_time(m, lay, hw, act_bytes: int):
    """(forward, backward) seconds of torchtitan's MoE layer's memory-bound passes a block and micro-batch
    (torchtitan/models/moe/moe.py and utils.py, 0.2.2; uncompiled under training.compile too), bytes counted op by
    op (a: act_bytes; R = t k rows dispatched, P those padded, titan_saved_bytes; T k h the combine's rows, every
    token of the micro-batch): the router as elementwise_time's, on T; forward the token gather x[idx] (2 R h a),
    _permute's vstack copy (2 R h a) and padded gather ((R + P) h a), _unpermute's index_put ((P + R) h a), the zeros
    of the unsorted outputs (T k h a) and their index_put (2 R h a), the fp32 upcast (T k h (a + 4)), the bmm's read
    of it with its output (T k h 4 + T h 4) and the cast back (T h (4 + a)); backward the same tensors' gradients:
    the bmm's two (T k h 4 written, T k h 4 + T h 4 read, twice), the upcast's (T k h (4 + a)), the gathers' and
    index_puts' scatters and zeros (about 9 R h a + 2 P h a + T h a), the casts' (T h (4 + a)).  A count from the op
    sequence, not measured on a GPU."""
    T = lay.mbs * m.seq_len / lay.cp
    t = routed_tokens(m, lay)
    k, h, E, a = m.top_k, m.hidden, m.experts, act_bytes
    R = t * k
    P = titan_padded_rows(m, lay)
    Tk = T * k
    fwd_bytes = h * a * (8 * R + 2 * P) + Tk * h * (2 * a + 8) + T * h * (8 + a)
    bwd_bytes = h * a * (9 * R + 2 * P + T) + Tk * h * (12 + a) + T * h * (12 + 2 * a)
    router_gemm = 2 * T * h * E / (hw.peak_flops * hw.matmul_efficiency(2 * T * h * E))
    scores = T * E * 4 * 2 / hw.hbm_bytes_per_s
    return (fwd_bytes / hw.hbm_bytes_per_s + router_gemm + scores,
            bwd_bytes / hw.hbm_bytes_per_s + 2 * router_gemm + 2 * scores)


def remote_nodes_per_token(m, ep, local):
    """Expected nodes other than its own that hold at least one of a token's k experts, the ep group spanning
    ep / local nodes of E local / ep experts each, the k experts uniform without replacement (balanced routing):
    (nodes - 1) x (1 - C(E - E_node, k) / C(E, k))."""
    nodes = np.asarray(ep) / np.asarray(local)
    e_node = m.experts * np.asarray(local) / np.asarray(ep)
    k = m.top_k
    # C(E - e, k) / C(E, k) = prod_{i<k} (E - e - i) / (E - i)
    none = np.ones(np.shape(e_node))
    for i in range(k):
        none = none * np.maximum(m.experts - e_node - i, 0) / (m.experts - i)
    return (nodes - 1) * (1 - none)


def all_to_all(m, lay, hw, act_bytes: int, dispatcher: str = "alltoall"):
    """(seconds, bytes sent per rank) of one token all-to-all over the expert-parallel group: each rank sends the
    (ep - 1) / ep of its k T / tp routed tokens bound for other ranks.  Megatron-Core's expert rank order
    (tp-ep-dp-pp with expert tensor parallelism 1: the pipeline outermost) makes an ep group ep consecutive ranks.
    NCCL runs an all-to-all as every pair's send and receive at once, so a rank's traffic to ranks off its node goes
    through its own NIC and the rest over the node's fabric, concurrently: the longer of the two, and one latency.
    (The dispatcher's all-gather of per-expert token counts and its all-to-all of the probabilities, k fp32 a token,
    are left out: latency and 4 / (h x 2) of this traffic.)
    dispatcher "deepep" (DeepEP's internode kernels under Megatron's flex dispatcher): a token goes over the network
    once to each remote node holding one of its experts (to the rank of its own local index there, which forwards it
    over NVLink), and its combine comes back the same way, reduced on that node: the off-node bytes are the rank's
    tokens x h x the expected remote nodes a token needs (remote_nodes_per_token), not x its off-node expert copies;
    every copy still crosses NVLink once.  The same inside a node."""
    ep = np.asarray(lay.ep)
    tokens_h = routed_tokens(m, lay) * m.hidden * act_bytes
    nbytes = tokens_h * m.top_k
    inside = comm.group_inside_node(hw, 1, ep, lay.gpus)
    local = np.where(inside, ep, comm.ranks_per_node(hw, 1, ep))  # the group's ranks on a rank's node
    intra, _ = comm.tier_params(hw, True, ep, pair=comm.one_pair(1, ep))
    inter, _ = comm.tier_params(hw, False, ep)
    off_node = nbytes * (ep - local) / np.maximum(ep, 1)
    on_node = nbytes * (local - 1) / np.maximum(ep, 1)
    if dispatcher == "deepep":
        off_node = np.where(inside, 0.0, tokens_h * remote_nodes_per_token(m, ep, local))
        on_node = nbytes * (ep - 1) / np.maximum(ep, 1)
    lat = np.where(inside, hw.nvlink.latency_s, hw.inter_node.latency_s)
    t = np.where(ep > 1, np.maximum(off_node / inter, on_node / intra) + lat, 0.0)
    return t, np.where(ep > 1, off_node + on_node, 0.0)


def all_to_alls_per_block(lay, m=None):
    """Token all-to-alls of one MoE block a micro-batch: dispatch and combine forward, their two gradients backward,
    and the forward's two again where the block is recomputed whole (Megatron's selective recompute re-runs the core
    attention only), or under torchtitan's op-level policy with qwen3's save list, which does not keep them
    (ModelDims.titan_moe; titan_keeps_all_to_alls)."""
    from .layout import REC_FULL, REC_SELECTIVE_OP
    rec = np.asarray(lay.recompute)
    dropped = m is not None and m.titan_moe and not titan_keeps_all_to_alls(m)
    again = (rec == REC_FULL) | ((rec == REC_SELECTIVE_OP) & dropped)
    return 4 + 2 * again


def titan_keeps_all_to_alls(m) -> bool:
    """Whether torchtitan's op-level save list for the model keeps the all-to-alls' outputs (_c10d_functional.
    all_to_all_single: deepseek_v3's and llama4's lists, 0.2.2, the models the export writes for latent attention and
    shared experts), not qwen3's (every other mixture of experts)."""
    return bool(m.kv_lora or m.shared_ffn)


def unpaired_share(lay, m_micro):
    """The share of a rank's block forwards (and as many backwards) that Megatron-Core's combined 1F1B
    (--overlap-moe-expert-parallel-comm, megatron/core/pipeline_parallel/combined_1f1b.py) runs alone rather than
    merged with another micro-batch's backward (forward): without a pipeline the first forward and the last
    backward of m; under interleaved 1F1B each warm-up forward and cool-down backward, Megatron's warm-up count
    (p - r - 1) 2 + (v - 1) p plus the one more the overlap adds, taken on rank 0, the most (p stages, v chunks a
    rank, m micro-batches).  1 (nothing merged) for any other pipeline: the overlap needs the interleaved schedule
    where there is a pipeline (Megatron asserts it)."""
    from .layout import SCH_INTERLEAVED
    p, v, m = np.asarray(lay.pp), np.asarray(lay.vpp), np.maximum(np.asarray(m_micro, dtype=float), 1)
    warm = np.where(p > 1, (p - 1) * 2 + (v - 1) * p + 1, 1)
    runs = (p == 1) | ((np.asarray(lay.schedule) == SCH_INTERLEAVED) & (v > 1))
    return np.where(runs, np.minimum(1.0, warm / (m * v)), 1.0)


def overlapped_all_to_alls(t_a2a, n_a2a, bt: dict, hw, lay, m_micro):
    """Seconds a block's token all-to-alls add to a micro-batch's critical path under Megatron-Core's combined 1F1B
    (Training.moe_a2a_overlap).  A merged pair runs one micro-batch's layer forward beside another's layer backward,
    the all-to-alls on a communication stream and the rest on the compute stream, in three phases (megatron/core/
    models/common/model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run):
        comm:     combine backward | forward dispatch, backward dispatch | forward combine
        compute:  attention forward | MLP backward, MLP forward           | attention backward
    so each of the four all-to-alls hides behind the one piece of compute beside it (hw.exposed: what sticks out, or
    the compute's slowdown while it runs): the forward's dispatch behind the MLP's backward, the backward's behind
    the MLP's forward, each combine behind the other pass's attention side (block_time's moe_mlp_fwd / moe_mlp_bwd:
    the experts' GEMMs, with the MoE recompute modules' pass in the backward; the attention side is the rest of the
    block).  The passes run alone (unpaired_share) keep theirs whole.  Megatron's --delay-wgrad-compute, which moves
    the MLP's weight-gradient GEMMs beside the backward's dispatch, is not modelled (its backward runs whole in the
    window above).  (DeepSeek-V3's DualPipe pairs a forward and a backward chunk the same way.)"""
    alone = unpaired_share(lay, m_micro)
    one = np.asarray(n_a2a) / 4 * t_a2a  # each of the four (six under full recompute, which this never runs with)
    mlp_f, mlp_b = bt["moe_mlp_fwd"], bt["moe_mlp_bwd"]
    paired = (hw.exposed(one, bt["fwd"] - mlp_f) + hw.exposed(one, mlp_b) + hw.exposed(one, mlp_f)
              + hw.exposed(one, bt["bwd"] - mlp_b))
    return alone * n_a2a * t_a2a + (1 - alone) * paired


def expert_shards(lay):
    """Ranks the experts' states are sharded (and their gradients reduce-scattered) over: the expert-data-parallel
    group, or with dp_replicate r > 1 one replica group's share of it, edp / r consecutive ranks: under Megatron-LM's
    distributed optimizer in r instances its intra-partial expert-data-parallel group, under FSDP2's hybrid sharding
    (parplan's runtime, torchtitan's (dp_replicate, dp_shard_mod_ep) mesh) the shard dim of the experts' 2-D mesh
    (parallel_layers.mesh.expert_data_parallel_mesh); the r groups all-reduce each shard (expert_replica_group)."""
    return expert_data_parallel(lay) // np.asarray(lay.dp_replicate)


def expert_grad_group(m, lay, hw):
    """(bandwidth, latency, ranks) of the experts' data-parallel group (expert_data_parallel), or under optimizer
    instances its intra-partial group (expert_shards): ranks ep apart within the stage's tp x cp x dp consecutive ranks
    (Megatron-Core's expert order tp-ep-dp-pp), the first edp / r of them: inside a node where those are."""
    edp = expert_shards(lay)
    span = np.asarray(lay.tp) * np.asarray(lay.cp) * np.asarray(lay.dp) // np.asarray(lay.dp_replicate)
    inside = comm.group_inside_node(hw, 1, span, lay.gpus) | (edp <= 1)
    local = comm.ranks_per_node(hw, lay.ep, edp)
    bw, lat = comm.tier_params(hw, inside, edp, local, comm.one_pair(lay.ep, edp))
    return bw, lat, edp


def expert_replica_group(lay, hw):
    """(bandwidth, latency, ranks) of the replicas' expert group (Megatron-Core's inter-partial expert-data-parallel
    group; FSDP2's replicate dim of the experts' mesh): the dp_replicate groups' ranks holding the same expert shard,
    ep x edp / r apart (a group of one with dp_replicate 1)."""
    r = np.asarray(lay.dp_replicate)
    stride = np.asarray(lay.ep) * expert_shards(lay)
    return (*comm.tier_params(hw, comm.group_inside_node(hw, stride, r, lay.gpus), r, comm.ranks_per_node(hw, stride, r),
                              comm.one_pair(stride, r)), r)


# Megatron-Core's MoE recompute modules (--recompute-granularity selective --recompute-modules ...; the modes are
# Training.moe_recompute's): "act" = moe_act (the experts' activation is recomputed in the backward: its output, the
# second GEMM's input, is not saved), "norm-act" = layernorm and moe_act (the pre-MLP norm, not fused with a linear in
# an MoE block, recomputed too: its output, the router's input, is not saved).  parplan's runtime frees the same
# bytes a block (parallel_layers.model.Block: the router's and the shared expert's copies of the norm's output are one
# tensor), counted to the byte by tests/test_runtime_moe_recompute.py; it rebuilds them at other moments
# (parplan_rebuilt_after_experts)


def recomputed_bytes(m, lay, act_bytes: int, mode: str, fp8: str = ""):
    """Bytes a block no longer saves a micro-batch under the MoE recompute modules (mode): the activation's output,
    k x expert_ffn a routed token (its FP8 copy under Transformer Engine's FP8), and with the norm its output, h a
    token of the rank's sequence shard."""
    if not m.moe or mode == "none":
        return 0.0
    t = routed_tokens(m, lay)
    out = t * m.top_k * m.expert_ffn * (1 if fp8 == "te" else act_bytes)
    if mode == "norm-act":
        out = out + t * m.hidden * act_bytes
    return out


def parplan_rebuilt_after_experts(m, lay, act_bytes: int, mode: str):
    """Of recomputed_bytes, what parplan's runtime (parallel_layers.model.Block, framework parplan) rebuilds for the
    block being back-propagated only once its experts' backward is over, so that it adds nothing to that block's
    working memory: the norm's output under norm-act where the block has no shared expert.  The router's backward, the
    MoE layer's last, is the first to ask for it (a shared expert, whose backward runs before the routed experts',
    asks for it first, and it is then held through theirs).  The activation's output is rebuilt for the down GEMM's
    backward and freed after it, as it was freed there without the recompute: the block's working memory is the same
    (CPU allocator traces: benchmarks/results/2026-12-05-cpu-memory-moe-recompute)."""
    if not m.moe or mode != "norm-act" or m.shared_ffn:
        return 0.0
    return routed_tokens(m, lay) * m.hidden * act_bytes


def recompute_time(m, lay, hw, act_bytes: int, mode: str):
    """Seconds a block's backward spends re-running those modules a micro-batch (memory-bound): the SwiGLU's forward
    (read the k x 2 expert_ffn first-GEMM output, write k x expert_ffn) and the RMSNorm's (read and write h)."""
    if not m.moe or mode == "none":
        return 0.0
    t = routed_tokens(m, lay)
    out = t * 3 * m.top_k * m.expert_ffn * act_bytes
    if mode == "norm-act":
        out = out + t * 2 * m.hidden * act_bytes
    return out / hw.hbm_bytes_per_s
