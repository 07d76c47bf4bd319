"""DeepSpeed ZeRO stage 3: parameters are gathered one weight at a time, one weight ahead.

DeepSpeed's stage 3 fetches a submodule's parameters in its pre-forward (and pre-backward) hook and,
once the first step has traced the order, prefetches the parameters used next -- but only while
nothing else is in flight, and only up to `stage3_prefetch_bucket_size` elements, at least one
tensor (PartitionedParameterCoordinator.prefetch_next_sub_modules / PrefetchCoordinator.
get_params_to_prefetch in deepspeed/runtime/zero/stage3.py of 2021; the same rule in today's
partitioned_param_coordinator.py).  The default bucket is 5e7 elements
(ZERO_OPTIMIZATION_PREFETCH_BUCKET_SIZE_DEFAULT, deepspeed/runtime/zero/constants.py), smaller than
every matmul weight of a model above ~4B parameters, so the gather of weight i+1 runs beside the
compute of weight i only: a block takes sum_i max(compute_i, gather_{i+1}), not
max(sum compute, sum gather) as with FSDP's whole-block prefetch.  With weights of unequal size (a
GPT block's qkv : proj : fc1 : fc2 = 3 : 1 : 4 : 4) the small proj cannot hide the large fc1's
gather even where the block's compute and communication are equal.

Bias and norm parameters are below `stage3_param_persistence_threshold` (1e5 elements) and stay
gathered; they are not counted here.  `stage3_max_live_parameters` (1e9 elements) is taken as not
binding: where it binds (a single weight near 1e9 elements), DeepSpeed stops prefetching and the
gathers run in series with the compute; the published 530B ZeRO-3 runs (Narayanan 2021 Table 2) are
only as fast as they are with prefetching on, so their configuration must have raised it.

After a block's recomputed forward, a weight whose next use (its own backward) is within
`stage3_max_reuse_distance` (1e9 elements, the default) of other parameters' use is kept gathered instead
of released: the block's last weight always (distance 0), and further trailing weights while twice the
weights after them (their recompute forward and backward both come in between) stay within 1e9
(PrefetchCoordinator.get_reuse_distance_in_numel).  The backward gathers only the others.

Each compute segment (one weight's matmul with its share of the block's pointwise work; the attention
core goes with the qkv segment forward and the output projection's segment backward, where it runs)
carries the communication issued at its start, one gather ahead:
  forward:            the gather of the next weight (after the block's last: the next block's first);
  recompute forward:  the same, and at its last weight the first weight the backward must gather;
  backward:           the next weight the backward must gather (after those: the first weight of the
                      block below's recompute) and the reduce-scatter of the gradient just made;
each segment costs compute + hw.exposed(comm, compute) (the profile's overlap slowdown).
"""
from __future__ import annotations

import numpy as np

from . import comm
from .compute import attention_core_time, fp8_cast_time, layer_elementwise_time, layer_gemms, linear_gemm_time
from .layout import PRECISION_RECIPES, REC_FULL, ModelDims, deepspeed_comm_casts, zero_shards

PREFETCH_BUCKET_ELEMENTS = 5e7  # DeepSpeed stage3_prefetch_bucket_size default
MAX_LIVE_ELEMENTS = 1e9  # stage3_max_live_parameters default; taken as not binding (module docstring)
MAX_REUSE_DISTANCE_ELEMENTS = 1e9  # stage3_max_reuse_distance default
REDUCE_BUCKET_ELEMENTS = 5e8  # reduce_bucket_size default (zero/config.py), every ZeRO stage's gradient bucket
SUB_GROUP_ELEMENTS = 1e9  # sub_group_size default (zero/config.py): the optimizer steps a rank's partition by these


def weight_elements(m: ModelDims, tp) -> list:
    """Elements of each matmul weight of one block on one TP rank, in forward order."""
    tokens = 1.0
    return [flops / (2 * tokens) for _, flops in layer_gemms(m, tokens, tp)]


def one_weight_ahead(m: ModelDims, tp):
    """True where DeepSpeed's default prefetch bucket holds at most one of the block's weights, so the
    per-weight schedule applies (else several weights are in flight and the block-level model is used)."""
    return np.minimum.reduce([np.broadcast_to(w, np.shape(tp)) for w in weight_elements(m, tp)]) >= PREFETCH_BUCKET_ELEMENTS


def largest_adjacent_pair(w: list):
    """The most elements gathered at once under one-ahead prefetch: a weight and the next (cyclic)."""
    return np.maximum.reduce([w[i] + w[(i + 1) % len(w)] for i in range(len(w))])


def gathered_bytes(m: ModelDims, lay, precision: str):
    """Live gathered parameters under one-ahead prefetch: the weight computing and the next one (the
    largest adjacent pair, cyclic) or, at the start of a recomputed block's backward, the weights kept
    from the recompute and the one gathered next; plus the unsharded gradient of the largest weight
    before its reduce-scatter."""
    rec = PRECISION_RECIPES[precision]
    w = [np.broadcast_to(x, np.shape(lay.tp)) for x in weight_elements(m, lay.tp)]
    n = len(w)
    live = largest_adjacent_pair(w)
    kept = np.where(np.asarray(lay.recompute) == REC_FULL, kept_after_recompute(w), 0)
    at_bwd = sum(np.where(n - 1 - i < kept, w[i], 0.0) + np.where(n - 1 - i == kept, w[i], 0.0) for i in range(n))
    return np.maximum(live, at_bwd) * rec["weight"] + np.maximum.reduce(w) * rec["grad"]


def kept_after_recompute(w: list):
    """Number of trailing weights kept gathered from the recompute forward to their backward (array)."""
    kept = np.zeros(np.shape(w[0]), dtype=int)
    after = np.zeros(np.shape(w[0]))
    still = np.ones(np.shape(w[0]), dtype=bool)
    for x in reversed(w):
        still = still & (2 * after <= MAX_REUSE_DISTANCE_ELEMENTS)
        kept = kept + still
        after = after + x
    return kept


def block_comm(m: ModelDims, lay, hw, tr, bw, lat):
    """(exposed seconds, bytes sent per rank) of one block's gathers and gradient reduce-scatters for one
    micro-batch under one-weight-ahead prefetch (forward, recompute forward, backward)."""
    rec = PRECISION_RECIPES[tr.precision]
    tokens = lay.mbs * m.seq_len / lay.cp
    dp = zero_shards(lay, tr)
    names_flops = layer_gemms(m, tokens, lay.tp)
    gemm = [linear_gemm_time(f, hw) for _, f in names_flops]
    total_gemm = sum(gemm)
    at_f, at_b = attention_core_time(m, lay, hw, tr.flash_attention, tr.dropout, tr.attention_kernel, tr.act_bytes)
    el_f, el_b, _ = layer_elementwise_time(m, lay, hw, tr.act_bytes, tr.dropout, tr.fused_elementwise,
                                           tr.eager_runtime)
    q_f, q_b = fp8_cast_time(m, lay, hw, tr.fp8, tr.act_bytes)
    el_f, el_b = el_f + q_f, el_b + q_b
    names = [n for n, _ in names_flops]
    fwd = [g + el_f * g / total_gemm + (at_f if n == "qkv" else 0.0) for n, g in zip(names, gemm)]
    bwd = [2 * g + el_b * g / total_gemm + (at_b if n == "proj" else 0.0) for n, g in zip(names, gemm)]
    w = [np.broadcast_to(x, np.shape(dp)) for x in weight_elements(m, lay.tp)]
    n = len(w)
    gath = [comm.all_gather(x * rec["weight"], dp, bw, lat) for x in w]
    red = [comm.reduce_scatter(x * rec["grad"], dp, bw, lat) for x in w]
    g_t, g_b = np.stack([t for t, _ in gath]), np.stack([b for _, b in gath])
    # under optimizer offload each reduce-scatter's partition goes down to the host buffer and comes back up
    # every micro-batch (stage3.py partition_grads; cost_models.total: offload_grads_via_host)
    host = (np.asarray(lay.offload) > 0) & np.asarray(tr.offload_grads_via_host)
    # and each reduce-scatter's gradient goes through copies on the reduce stream first (memory.deepspeed_grad_buckets'
    # reduce): a cast to the communication dtype where it is not the model's (read + write) and reduce_scatter_
    # coalesced's concatenation (read + write of the communication dtype), passes through HBM
    comm_b = rec["grad"]
    copy_b = (rec["weight"] + comm_b if deepspeed_comm_casts(tr) else 0.0) + 2 * comm_b
    r_t = [t + x * copy_b / hw.hbm_bytes_per_s
           + np.where(host, 2 * x / dp * rec["weight"] / hw.host_link_bytes_per_s, 0.0) for (t, _), x in zip(red, w)]
    r_b = [b for _, b in red]
    full = np.asarray(lay.recompute) == REC_FULL
    kept = np.where(full, kept_after_recompute(w), 0)

    # forward: segment i prefetches weight i+1 (the last, the next block's first)
    f_exp = sum(hw.exposed(g_t[(i + 1) % n], fwd[i]) for i in range(n))
    moved = g_b.sum(axis=0) + sum(r_b)

    # the backward's gathers, in the order issued: weights n-1-kept .. 0, then the block below's first
    def backward_gather(s):
        """Gather issued at the s-th segment from the one before the backward (recompute's last weight,
        or without recompute the forward's) on: seconds."""
        idx = n - 1 - kept - s
        own = np.take_along_axis(g_t, np.clip(idx, 0, n - 1)[None, ...], axis=0)[0]
        return np.where(idx >= 0, own, np.where(idx == -1, g_t[0], 0.0))

    # recompute forward: as the forward, but its last segment starts the backward's gathers
    r_exp = sum(hw.exposed(g_t[i + 1], fwd[i]) for i in range(n - 1)) + hw.exposed(backward_gather(0), fwd[n - 1])
    # backward segment of weight i (run in order n-1 .. 0): the next gather and the reduce-scatter of
    # the gradient made just before it (weight i+1's; for the block's last weight, the block above's first)
    b_exp = sum(hw.exposed(backward_gather(n - i) + r_t[(i + 1) % n], bwd[i]) for i in range(n))
    # without recompute the backward gathers every weight, the first prefetched by the forward's end
    b_exp_none = sum(hw.exposed(g_t[(i - 1) % n] + r_t[(i + 1) % n], bwd[i]) for i in range(n))
    regathered = g_b.sum(axis=0) - sum(np.where(n - 1 - i < kept, g_b[i], 0.0) for i in range(n))
    exposed = np.where(full, f_exp + r_exp + b_exp, f_exp + b_exp_none)
    moved = moved + g_b.sum(axis=0) * full + np.where(full, regathered, g_b.sum(axis=0))
    return exposed, moved
