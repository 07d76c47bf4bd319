"""One optimizer step: compute, exposed communication, pipeline bubble, optimizer, MFU/HFU, Amdahl.

``evaluate(model, training, hw, layout)`` is elementwise over the layout: the search calls it
once with arrays of every candidate; ``parplan evaluate`` calls it with one plan's scalars.

Step time (per GPU, critical pipeline stage):
    t_mb    = per micro-batch time of the slowest stage: blocks x (block compute + exposed TP and
              CP communication) + embedding/head + autocast casts + pipeline send/recv
    t_pipe  = (m + bubble_factor) x t_mb      bubble_factor: (p-1) for GPipe/1F1B (Narayanan 2021
              eq. 1: bubble fraction (p-1)/m), (p-1)/v interleaved (eq. 2), more below p micro-batches;
              zero-bubble schedules (Qi et al. 2024) (p-1) max(f, b, f+b-w) / (v (f+b+w)), (p-1)/(3v) at f = b = w, and
              more below p, with f, b, w the block's forward, input- and weight-gradient times (bubble_factor: all
              checked against torch's own orders, benchmarks/results/2026-11-24-schedule-bubble)
    step    = t_pipe + exposed data-parallel communication + optimizer step
Overlap assumptions: TP collectives are exposed (our runtime and Megatron without
--tp-comm-overlap run them on the critical path); with overlap_tp_comm they hide behind the
block's GEMMs.  CP's K/V all-gather (and the dK/dV reduce-scatter) is on the critical path (parplan's
runtime; Llama 3's all-gather CP, Dubey et al. 2024 sec. 3.3.2: "the all-gather communication latency
is exposed"); with overlap_cp_comm (ring attention: Megatron, torch) it hides behind the attention.  Data-parallel reduce-scatter/all-reduce hides behind one micro-batch's backward and the
parameter all-gather behind one forward when overlap_param_gather; ZeRO-3 gathers hide behind the
micro-batch they serve.  "Hides" is not free: while a collective runs, the compute beside it slows
by the profile's overlap_compute_slowdown k (NCCL kernels occupy SMs and HBM bandwidth), so C seconds
of communication overlapped with X seconds of compute cost max(C, X + C k/(1+k)) (hw.exposed).
"""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from . import comm, moe, zero3
from .compute import (CE_BYTES_PER_LOGIT, CE_BYTES_PER_LOGIT_FLASH_ATTN, CE_BYTES_PER_LOGIT_PARPLAN_FUSED, block_time,
                      cast_time, column_input_grad_time, flow_shop_wait, gemm_time,
                      grad_accumulation_time, grad_clip_time, grad_reduce_overlaps, head_time, linear_gemm_time,
                      loss_scale_time, optimizer_time, plan_overlaps_param_gather, scales_loss, wgrad_fusion_applies)
from .layout import (PRECISION_RECIPES, REC_FULL, REC_NONE, REC_SELECTIVE, REC_SELECTIVE_OP, SCH_1F1B,
                     SCH_INTERLEAVED_ZB, SCH_ZBV, ModelDims, deepspeed_comm_casts, head_on_first_rank, num_microbatches,
                     recompute_ends, recomputed_share, critical_recomputed_share, model_recomputed_share,
                     split_by_share, zero_shards)
from .memory import (BLOCK_SHAPE_FIELDS, block_shape_rows, ddp_bucket_copy, deepspeed_fp32_partition,
                     deepspeed_zero_optimizer_steps, embedding_params_per_gpu, fsdp2_offload, head_params_per_gpu,
                     layer_params_per_gpu, memory_breakdown, per_block_shape, rank_blocks, torch_weight_pass,
                     zero_bubble_pipe)
from .params import (layer_matmul_params, model_flops_per_token, op_sac_recomputed_matmuls, recompute_flops_per_token,
                     titan_op_sac_recomputed_params)


def runs_eager_moe(m, tr) -> bool:
    """Whether parplan's runtime runs this model's blocks uncompiled as a mixture of experts (its dense blocks too):
    block_time's eager_moe, the profile's host_moe_block_s / host_moe_expert_s."""
    return bool(m.moe) and tr.eager_runtime == "parplan"


def param_tensors_per_rank(m: ModelDims, pp, blocks_first, blocks_mid, blocks_last, head_first=None):
    """Parameter tensors on the rank holding the most, as parplan's runtime builds them: per llama
    block wq, wk, wv, wo, gate, up, down and two RMSNorm weights (9); per GPT block the same four
    attention and two MLP weights with their biases and two LayerNorms with bias (16); the embedding
    (+ learned positions) on the first stage; the final norm and an untied (or pipeline-copied) head
    on the last, which is rank 0 without a pipeline and under ZB-V (head_first; default pp == 1)."""
    gpt = m.arch == "gpt"
    per_block = 16 if gpt else 9
    first = 2 if m.positions else 1
    last = (2 if gpt else 1) + 1
    single = np.asarray(pp) == 1
    head_first = single if head_first is None else head_first
    head_on_first = np.where(head_first, last - np.where(single & m.tied, 1, 0), 0)
    return np.maximum(np.maximum(blocks_first * per_block + first + head_on_first, blocks_mid * per_block),
                      np.where(head_first & ~single, blocks_last * per_block,
                               np.where(single, 0, blocks_last * per_block + last)))


def bubble_factor(lay, m_micro, costs=None):
    """Idle time of the critical rank in units of t_mb (one micro-batch through one rank's v chunks, forward
    and backward), as torch's own schedule orders give it: benchmarks/schedule_bubble.py times each rank's
    order as a dependency graph (chunk costs f forward, b input-gradient, w weight-gradient; no
    communication), and tests/test_schedule_bubble.py holds these forms to it.  costs: (f, b, w), relative
    (evaluate: the block's forward, its backward less the weight-gradient GEMMs, and those GEMMs); default
    f = b = w (a matmul block: the backward twice the forward, split evenly into I and W).
      GPipe, 1F1B, interleaved 1F1B: (p-1)/v (Narayanan 2021 eqs. 1-2), + (v-1)(p-m)/v below p micro-batches
        (torch's interleaved orders run rounds of m then: micro-batch 0 needs p chunk-times to come back to
        rank 0 for its next chunk, which has m to run; p - m idle at each of the v - 1 chunk changes, forward
        and backward; derived).  Exact for any f, b, w (a full backward is b + w).  Megatron-LM's m, a
        multiple of p, never has the second term.
      interleaved-zb: no order beats (p-1) f, the last rank's first forward waiting for micro-batch 0 through
        p - 1 chunks, and from m = p torch's order idles (p-1) max(f, b, f + b - w): (p-1)/(3v) at f = b = w
        (the deferred W passes do not fill the fill; Qi et al. 2024's zero for ZB-V needs their optimizer
        post-validation, and a step-wide gradient-clipping all-reduce "breaks parallelogram").  Exact on
        5,292 simulated cases (p 2-8, v 2-4, m p-4p, b/f 1-3.2, w/f 0.3-2).  Below p micro-batches (which the
        search does not offer) the makespan is the larger of (vp + m - 1)(f + b) + w and vm(f + b + w) +
        (p-1) max(f, b, f + b - w) + (p - m)((v-1) f + w) (fitted to torch's order, not derived: exact on 6,699
        of 6,888 cases, p 2-8, v 2-4, m 1-4p, w <= b; the rest over by at most 0.09).
      zbv (v = 2), where b >= f and w <= b (a block's input-gradient pass holds the weight pass's GEMMs' twin
        and the attention's backward): the rank idles the larger of 2(p-1) b + 2 f (p-m) - 2 w (m-p) (m
        below p: + 2f a micro-batch fewer; above: - 2w a micro-batch more) and its floor,
        max((p-1) b + (p-2) max(0, w - b), 2 (p-1)(b - w)); at f = b = w, (2p - 1 - m)/3 and (p-1)/6.  Fitted
        to torch's order, not derived: exact on 3,313 of 3,360 simulated cases (p 2-8, m 1-4p), the rest
        under by at most 0.12 just above the floor."""
    p, v = np.asarray(lay.pp, dtype=float), np.asarray(lay.vpp, dtype=float)
    m = np.asarray(m_micro, dtype=float)
    sch = np.asarray(lay.schedule)
    f, b, w = (1.0, 1.0, 1.0) if costs is None else costs
    b = np.maximum(b, f)  # the forms were checked for b >= f; a block's costs always are
    looped = (p - 1.0) / v + (v - 1.0) * np.maximum(0.0, p - m) / v
    short = np.maximum(0.0, p - m)
    izb_fill = (v * p + m - 1) * (f + b) + w
    izb_tail = v * m * (f + b + w) + (p - 1) * np.maximum(np.maximum(f, b), f + b - w) + short * ((v - 1) * f + w)
    izb = np.maximum(izb_fill, izb_tail) / (v * (f + b + w)) - m
    zbv_floor = np.maximum((p - 1) * b + (p - 2) * np.maximum(0.0, w - b), 2 * (p - 1) * (b - w))
    zbv_ramp = 2 * (p - 1) * b + 2 * f * np.maximum(0.0, p - m) - 2 * w * np.maximum(0.0, m - p)
    zbv = np.maximum(zbv_floor, zbv_ramp) / (2 * (f + b + w))
    out = np.where(sch == SCH_INTERLEAVED_ZB, izb, np.where(sch == SCH_ZBV, zbv, looped))
    return np.where(p > 1, out, 0.0)


def _unpipelined_as_1f1b(lay):
    """Without a pipeline there is nothing to schedule: every schedule runs as plain gradient accumulation
    (one micro-batch's activations at a time; parallel_layers.train runs one module), so pp 1 is 1F1B, vpp 1."""
    if np.any((np.asarray(lay.pp) == 1) & ((np.asarray(lay.schedule) != SCH_1F1B) | (np.asarray(lay.vpp) != 1))):
        alone = np.asarray(lay.pp) == 1
        lay = replace(lay, schedule=np.where(alone, SCH_1F1B, lay.schedule), vpp=np.where(alone, 1, lay.vpp))
    return lay


def memory(m: ModelDims, tr, lay) -> dict:
    """The memory half of `evaluate` alone (memory.memory_breakdown of the layout as evaluate sees it).
    The search computes it for every candidate first and times only those that fit; `evaluate(...,
    mem=memory(...))` gives what `evaluate` alone gives, to the bit."""
    lay = _unpipelined_as_1f1b(lay)
    return memory_breakdown(m, lay, tr, num_microbatches(tr, lay))


def step_floor(m: ModelDims, tr, hw, lay):
    """A lower bound of `evaluate`'s step time, at a fraction of its work: the pipeline's (m + bubble) stage
    times, with a rank's stage counted as its blocks' alone (their compute and the tensor- and context-parallel
    collectives on their critical path, block_comm), of the rank whose blocks take longest among the three evaluate
    prices (first, middle, last).  evaluate's step is t_pipe plus the exposed data-parallel time and the optimizer's
    (both >= 0), t_pipe = (m + bubble) x t_stage, t_stage = max(t_first, t_mid, t_last) + p2p, and each t >= its
    rank's blocks x block (the terms left out are times, none negative).  The search prices and times only
    candidates whose floor could still rank (search.run_search)."""
    lay = _unpipelined_as_1f1b(lay)
    # partial recompute's blocks cost at least those of no recompute (partial_recompute's mix)
    part = recomputed_share(m, lay) < 1
    if np.any(part):
        lay = replace(lay, recompute=np.where(part, REC_NONE, np.asarray(lay.recompute)))
    m_micro = num_microbatches(tr, lay)

    def block_parts(sub):
        bt = block_time(m, sub, hw, tr.act_bytes, tr.flash_attention, tr.dropout, tr.fused_elementwise,
                        tr.eager_runtime, tr.attention_kernel, tr.fp8, tr.moe_recompute, tr.mla_recompute,
                        eager_moe=runs_eager_moe(m, tr))
        bc = block_comm(m, tr, hw, sub, bt)
        return (bt["total"] + bc.tp_exposed + bc.cp_exposed + bc.ep_exposed, bt["fwd"], bt["bwd"] - bt["wgrad"],
                bt["wgrad"])
    # a block's time and collectives read its shape and whether the job fits a node (comm.group_inside_node)
    rows = block_shape_rows(lay, BLOCK_SHAPE_FIELDS + ("gpus",))
    block, f, b, w = per_block_shape(lay, block_parts, BLOCK_SHAPE_FIELDS + ("gpus",), rows)
    counts, dense = rank_blocks(m, lay)
    n_first, d = counts[0], dense[0]
    # each priced rank's blocks (evaluate's t_first, t_mid where pp > 2, t_last where pp > 1: t_stage is their largest)
    pp = np.asarray(lay.pp)
    on = (1, pp > 2, pp > 1)
    if m.mixed:  # each rank's dense blocks at their own terms (mixed_blocks)
        md = m.dense_dims()

        def dense_parts(sub):
            bt = block_time(md, sub, hw, tr.act_bytes, tr.flash_attention, tr.dropout, tr.fused_elementwise,
                            tr.eager_runtime, tr.attention_kernel, tr.fp8, tr.moe_recompute, tr.mla_recompute,
                            eager_moe=runs_eager_moe(m, tr))
            bc = block_comm(md, tr, hw, sub, bt)
            return bt["total"] + bc.tp_exposed + bc.cp_exposed, bt["fwd"], bt["bwd"] - bt["wgrad"], bt["wgrad"]
        parts = per_block_shape(lay, dense_parts, BLOCK_SHAPE_FIELDS + ("gpus",), rows)
        stage = np.maximum.reduce([np.where(o, (n - dn) * block + dn * parts[0], 0.0)
                                   for o, n, dn in zip(on, counts, dense)])
        f, b, w = (((n_first - d) * x + d * y) / np.maximum(n_first, 1) for x, y in zip((f, b, w), parts[1:]))
    else:
        stage = np.maximum.reduce([np.where(o, n, 0) for o, n in zip(on, counts)]) * block
    bf = bubble_factor(lay, m_micro, (f, b, w))
    return (m_micro + bf) * stage


# evaluate's outputs that are sums over a rank's blocks (and micro-batches) or follow them linearly: under partial
# recompute, a mix of the no-recompute and full-recompute layouts' (partial_recompute)
BLOCK_LINEAR_KEYS = ("step_time_s", "compute_s", "attention_s", "fp8_cast_s", "tp_comm_s", "cp_comm_s", "ep_comm_s",
                     "pp_comm_s", "dp_comm_s",
                     "bubble_s", "optimizer_s", "block_gpu_s", "block_host_s", "comm_tp_bytes", "comm_pp_bytes",
                     "comm_dp_bytes", "comm_cp_bytes", "comm_ep_bytes")


def evaluate(m: ModelDims, tr, hw, lay, mem: dict | None = None) -> dict:
    """Every prediction for the layout(s); `mem`: `memory(m, tr, lay)` when the caller has it already."""
    lay = _unpipelined_as_1f1b(lay)
    share = recomputed_share(m, lay)
    return split_by_share(share, lay, mem, lambda sub, sm: _evaluate_whole_blocks(m, tr, hw, sub, sm),
                          lambda sub, sm: partial_recompute(m, tr, hw, sub, sm))


def partial_recompute(m: ModelDims, tr, hw, lay, mem: dict | None = None) -> dict:
    """evaluate where full recompute re-runs a share f of each rank's blocks (Layout.recompute_layers): a block's times,
    collectives and bytes are its own, recomputed or not, so a rank's sums over its blocks -- compute, the per-block TP
    and CP exposure, the stage time and with it the 1F1B bubble -- are f x full recompute's + (1 - f) x no recompute's,
    exactly.  The data-parallel and ZeRO-3 exposures hide behind windows that are such sums, and exposure is convex in
    its window, so mixing them linearly over-states them where the overlap changes regime.  FLOPs follow the same mix
    (Narayanan 2021 eq. 3's recompute term over f of the blocks; the hardware FLOPs, a job-wide average, at the share of
    all the model's blocks recomputed, layout.model_recomputed_share).  f is the share of the rank whose blocks take
    longest (layout.critical_recomputed_share: N over the largest stage's blocks unless interleaving gives that rank
    stages of different sizes).  Memory: memory.partial_recompute_memory, each rank at its own share."""
    share = critical_recomputed_share(m, lay)
    none, whole = recompute_ends(lay)
    if mem is None:
        mem = memory_breakdown(m, lay, tr, num_microbatches(tr, lay))
    # (the ends' own memory is not asked for: each end's mem_* terms are the mix's, which replace them below)
    kept, full = _evaluate_whole_blocks(m, tr, hw, none, mem), _evaluate_whole_blocks(m, tr, hw, whole, mem)
    out = dict(full)
    for k in BLOCK_LINEAR_KEYS:
        out[k] = (1 - share) * kept[k] + share * full[k]
    n = np.asarray(lay.gpus, dtype=float)

    def hw_flops_per_token(r):
        return r["hardware_tflops_per_gpu"] * n * 1e12 / r["tokens_per_s"]
    step = out["step_time_s"]
    out["tokens_per_s"] = tr.global_batch_size * m.seq_len / step
    out["model_tflops_per_gpu"] = out["tokens_per_s"] * full["model_flops_per_token"] / n / 1e12
    every = model_recomputed_share(m, lay)
    hf = (1 - every) * hw_flops_per_token(kept) + every * hw_flops_per_token(full)
    out["hardware_tflops_per_gpu"] = out["tokens_per_s"] * hf / n / 1e12
    out["mfu"] = out["model_tflops_per_gpu"] * 1e12 / hw.peak_flops
    out["hfu"] = out["hardware_tflops_per_gpu"] * 1e12 / hw.peak_flops
    out["bubble_fraction"] = out["bubble_s"] / step
    out["speedup"], out["parallel_fraction"] = amdahl(n, out["compute_s"], step)
    for k, key in (("weights", "mem_weights"), ("grads", "mem_grads"), ("optimizer", "mem_optimizer"),
                   ("activations", "mem_activations"), ("other", "mem_other"), ("total", "mem_total"),
                   ("offloaded", "mem_offloaded"), ("worst_stage", "worst_stage"), ("moment", "mem_moment"),
                   ("first_total", "mem_first"), ("mid_total", "mem_mid"), ("last_total", "mem_last")):
        out[key] = mem[k]
    return out


def amdahl(n, t_compute, step):
    """(speedup, Amdahl parallel fraction): T1 = the whole job's pure compute on one GPU = n x per-GPU compute time.
    A layout slower than one GPU's compute (speedup < 1: communication over a slow network) has no Amdahl fraction;
    it reads 0, and the speedup says how much slower."""
    speedup = n * t_compute / step
    alpha = np.where(n > 1, np.maximum(0.0, (1 - 1 / np.maximum(speedup, 1e-12)) / np.where(n > 1, 1 - 1 / n, 1.0)), 1.0)
    return speedup, alpha


def block_comm(m: ModelDims, tr, hw, lay, bt: dict) -> SimpleNamespace:
    """A block's tensor- and context-parallel collectives for one micro-batch on one GPU, and what of them is on the
    critical path (`tp_exposed`, `cp_exposed`: beside `bt`, block_time's compute, a block's time): evaluate's, and
    step_floor's, whose floor counts them (a floor of the blocks' compute alone had let GPT-3's search time a third
    of its fitting candidates)."""
    act_b = tr.act_bytes
    tp, cp = lay.tp, lay.cp
    tokens_mb = lay.mbs * m.seq_len / cp  # tokens per GPU per micro-batch
    full = lay.recompute == REC_FULL
    op = lay.recompute == REC_SELECTIVE_OP  # torchtitan's op-level checkpoints re-run the attention's projection
    # ---- tensor parallel: 2 all-reduces forward, 2 backward (Narayanan 2021 sec. 3.3), +2 when
    # the forward is recomputed; with SP each becomes all-gather + reduce-scatter of the same
    # total volume (Korthikanti 2022 sec. 4.2.2).
    tp_in = comm.group_inside_node(hw, 1, tp, lay.gpus)
    tp_bw, tp_lat = comm.tier_params(hw, tp_in, tp, comm.ranks_per_node(hw, 1, tp), comm.one_pair(1, tp))
    msg = tokens_mb * m.hidden * act_b
    t_ar, moved_ar = comm.all_reduce(msg, tp, tp_bw, tp_lat)
    # a mixture of experts' routed MLP is outside the tensor-parallel region (expert tensor parallelism 1: the MoE layer
    # takes the rank's sequence shard): the attention's collectives only, half a dense block's, unless a shared expert
    # (tensor-parallel as a dense MLP, on the gathered sequence) or a framework that gathers the MoE layer's input as a
    # dense MLP's (TrainingConsts.moe_input_gathered: torchtitan) brings the MLP's back
    # Attention and MLP side by side (ModelDims.parallel_block: parplan's runtime) take one collective a direction too:
    # their five input projections read one gathered input (one input-gradient reduction), their two output
    # projections' partial sums are reduced together
    halves = 1 if (m.moe and not m.shared_ffn and not tr.moe_input_gathered) or m.parallel_block else 2
    n_coll = halves * (2 + full) + op
    tp_block = n_coll * t_ar
    tp_moved = n_coll * moved_ar
    sp_on = (np.asarray(lay.sp) > 0) & (np.asarray(tp) > 1)
    if m.kv_lora and not m.mla_input_gathered:  # (torchtitan's gathers the block input, h: a dense block's)
        # multi-head latent attention: the collective before the attention's column-parallel layers moves the
        # latents a token (Mla.tp_input_width: the down projections run duplicated before it; without a query latent
        # h too, the query projection's input), not h alone -- forward an identity (sequence parallelism: the
        # latents' all-gather), backward the latents' gradient all-reduce (or reduce-scatter); the output
        # projection's stays h.  With sequence parallelism each forward (and a full recompute's) and the backward
        # move one of each; without it the forward the h one, the backward the latents' one
        t_lat, moved_lat = comm.all_reduce(tokens_mb * m.mla.tp_input_width(m.hidden) * act_b, tp, tp_bw, tp_lat)
        attn_t = np.where(sp_on, (2 + full) * (t_ar + t_lat) / 2, (1 + full) * t_ar + t_lat)
        attn_moved = np.where(sp_on, (2 + full) * (moved_ar + moved_lat) / 2, (1 + full) * moved_ar + moved_lat)
        tp_block = tp_block - (2 + full) * t_ar + attn_t
        tp_moved = tp_moved - (2 + full) * moved_ar + attn_moved
    tp_block_exposed = np.where(tr.overlap_tp_comm, hw.exposed(tp_block, bt["gemm"]), tp_block)
    # SP that keeps only the shard of the column-parallel inputs (Megatron, parplan's runtime)
    # all-gathers each again in the backward, twice a block, started before the input-gradient GEMMs
    # of the layers it feeds and overlapped with them (Megatron-LM's
    # LinearWithGradAccumulationAndAsyncCommunication; parplan's _SPGatherLinears, which under the
    # zero-bubble schedules gathers in the weight-gradient pass: the same two gathers, counted alike)
    regather = sp_on & ~np.asarray(tr.sp_saves_gathered_input)
    t_ag, moved_ag = comm.all_gather(msg, tp, tp_bw, tp_lat)
    # (multi-head latent attention's gathered latents are saved by their RMSNorms: its attention gathers nothing again,
    # but for a query projection without a latent, which reads the block input as a column-parallel layer does)
    regathers = halves - (1 if m.kv_lora and m.q_lora and not m.mla_input_gathered else 0)
    tp_block_exposed = tp_block_exposed + np.where(
        regather, hw.exposed(regathers * t_ag, column_input_grad_time(m, lay, hw)), 0.0)
    tp_moved = tp_moved + np.where(regather, regathers * moved_ag, 0.0)
    # Megatron-LM starts the input-gradient collective of the column-parallel layers (qkv, fc1 / gate+up)
    # asynchronously and computes their weight gradients meanwhile (LinearWithGradAccumulationAndAsync-
    # Communication.backward): two of the backward's collectives a block, an all-reduce each, or with SP
    # a reduce-scatter each (the all-gathers backward of SP's reduce-scatters stay on the critical path),
    # hide behind weight-gradient GEMMs of those layers' size (the same FLOPs as their input gradients)
    async_dgrad = np.asarray(tr.async_tp_grad_comm) & ~np.asarray(tr.overlap_tp_comm) & (np.asarray(tp) > 1)
    dgrad_coll = halves * np.where(sp_on, t_ag, t_ar)
    tp_block_exposed = tp_block_exposed - np.where(
        async_dgrad, dgrad_coll - hw.exposed(dgrad_coll, column_input_grad_time(m, lay, hw)), 0.0)
    if m.qk_norm_whole:
        # q/k norms over a token's whole query and key widths (ModelDims.qk_norm_whole: OLMo 2's), split over tp: their
        # fp32 statistics a token (RMSNorm one a norm, LayerNorm two) all-reduced over tp, q's and k's in one collective
        # (parplan's _WholeWidthNorms), forward and backward, and the forward's again where it re-runs: full recompute,
        # op-level selective (its policy re-runs the pointwise work), selective where the norms run inside the
        # checkpoint (qk_norm_recomputed).  Latency-bound, and on the critical path: the attention waits for it
        t_st, moved_st = comm.all_reduce(tokens_mb * 2 * (1 if m.arch == "llama" else 2) * 4.0, tp, tp_bw, tp_lat)
        n_st = 2 + full + op + ((lay.recompute == REC_SELECTIVE) & m.qk_norm_recomputed)
        tp_block_exposed = tp_block_exposed + n_st * t_st
        tp_moved = tp_moved + n_st * moved_st

    # ---- context parallel (Llama 3 sec. 3.3.2): all-gather of the K/V shards forward
    # ((cp-1)/cp of the full-sequence K,V bytes per rank), reduce-scatter of dK/dV backward (same
    # volume); per layer per micro-batch.  Where the gathered K/V is not saved for the backward (Megatron's
    # and torch's ring attention; memory.activation_bytes_per_layer) the backward passes K/V again beside
    # dK/dV: Transformer Engine's "point-to-point communications of KV and dKV" (context_parallel.py,
    # flash_attn_p2p_communicate), torch's _templated_ring_attention_backward (a K/V and a dK/dV rotater).
    # +1 where the forward's exchange runs again: full recompute; selective, whose checkpoint holds the
    # attention with its exchange (Megatron's core_attn, Transformer Engine's checkpointed core attention;
    # parplan's runtime checkpoints the gather with it); op-level selective where the gather sits outside the
    # attention op (parplan's runtime: its K projection is recomputed), not where it runs inside an attention
    # op the policy saves (torchtitan's SDPA under torch's context parallelism).
    cp_in = comm.group_inside_node(hw, tp, cp, lay.gpus)
    cp_local = comm.ranks_per_node(hw, tp, cp)
    # a collective's ranks on a node may pool their NICs (comm.tier_params); Megatron's ring attention passes K/V
    # point to point, each rank over its own NIC (torch's all-gather rotater and the all-gather CP are collectives)
    ring_p2p = np.asarray(tr.overlap_cp_comm) & ~np.asarray(tr.cp_overlap_local_chunk_only)
    cp_bw, cp_lat = comm.tier_params(hw, cp_in, cp, np.where(ring_p2p, 1, cp_local), comm.one_pair(tp, cp))
    # full-sequence K and V of the rank's heads (parplan's latent attention gathers its values padded to head_dim:
    # ModelDims.v_padded, MLAttention._context_parallel_core)
    kv_pair = 2 * m.heads * m.head_dim if m.v_padded else 2 * m.kv_width
    kv_full = tokens_mb * cp * kv_pair / tp * act_b
    t_cp, moved_cp = comm.all_gather(kv_full, cp, cp_bw, cp_lat)
    cp_saved = np.asarray(tr.cp_saves_gathered_kv)
    n_cp = 2 + ~cp_saved + full + (lay.recompute == REC_SELECTIVE) + (op & cp_saved)
    cp_block = n_cp * t_cp
    cp_window = bt["attention"] / np.where(tr.cp_overlap_local_chunk_only, cp, 1)
    cp_block_exposed = np.where(tr.overlap_cp_comm, hw.exposed(cp_block, cp_window), cp_block)

    # ---- expert parallel (a mixture of experts'): the MoE layer's token all-to-alls over the ep group, on the
    # critical path (cost_models/moe.py), or under Megatron-Core's combined 1F1B behind another micro-batch's compute
    if m.moe:
        t_a2a, moved_a2a = moe.all_to_all(m, lay, hw, act_b, tr.moe_dispatcher)
        n_a2a = moe.all_to_alls_per_block(lay, m)
        ep_block_exposed, ep_moved = n_a2a * t_a2a, n_a2a * moved_a2a
        if tr.moe_a2a_overlap:
            ep_block_exposed = moe.overlapped_all_to_alls(t_a2a, n_a2a, bt, hw, lay, num_microbatches(tr, lay))
    else:
        ep_block_exposed = ep_moved = 0.0

    return SimpleNamespace(tp_bw=tp_bw, tp_lat=tp_lat, t_ar=t_ar, moved_ar=moved_ar, n_coll=n_coll, sp_on=sp_on,
                           regather=regather, t_ag=t_ag, moved_ag=moved_ag, async_dgrad=async_dgrad, cp_in=cp_in,
                           cp_local=cp_local, moved_cp=moved_cp, n_cp=n_cp, tp_exposed=tp_block_exposed,
                           cp_exposed=cp_block_exposed, ep_exposed=ep_block_exposed, ep_moved=ep_moved,
                           halves=halves, tp_moved=tp_moved)


def _per_block_terms(m: ModelDims, lay, bt: dict, bc, per_layer) -> dict:
    """One block's terms a rank sums over its blocks (mixed_blocks): block_time's, its parameters, its time with
    the collectives on the critical path, its expert weights, and its tensor- and expert-parallel traffic."""
    out = dict(bt)
    out.update(params=per_layer, block=bt["total"] + bc.tp_exposed + bc.cp_exposed + bc.ep_exposed,
               experts=moe.expert_params_per_gpu(m, lay.ep) if m.moe else 0.0,
               tp_moved=bc.tp_moved,
               tp_exposed=bc.tp_exposed, ep_exposed=bc.ep_exposed, ep_moved=bc.ep_moved)
    return out


def mixed_blocks(m: ModelDims, tr, hw, lay, bt: dict, bc, per_layer, blocks=None) -> SimpleNamespace:
    """A rank's sums over its blocks of a per-block term (_per_block_terms' keys): on_first / on_mid / on_last(key)
    for rank 0, the middle rank priced and rank pp-1 (rank_block_counts), and mean_first(key), rank 0's mean block.
    Every block alike: its count x the term.  A mixture of experts with dense blocks between its MoE ones
    (ModelDims.mixed): its MoE blocks' (bt, bc: the model's own) plus its dense blocks' (ModelDims.dense_dims: the
    attention and a dense SwiGLU of dense_ffn, no router, experts or all-to-alls), each rank's count of each kind
    from rank_dense_blocks.  Where a term is a sequence's and not a sum (the zero-bubble split of a block's work, the
    host / GPU flow shop of a one-stage plan), rank 0's mean block stands for its blocks.  blocks: memory.rank_blocks,
    where the caller has them."""
    counts, dense = rank_blocks(m, lay) if blocks is None else blocks
    terms = _per_block_terms(m, lay, bt, bc, per_layer)
    if not m.mixed:
        def on(kind):
            return lambda key: counts[kind] * terms[key]
        return SimpleNamespace(on_first=on(0), on_mid=on(1), on_last=on(2), mean_first=lambda key: terms[key])
    md = m.dense_dims()
    bt_d = block_time(md, lay, hw, tr.act_bytes, tr.flash_attention, tr.dropout, tr.fused_elementwise,
                      tr.eager_runtime, tr.attention_kernel, tr.fp8, tr.moe_recompute, tr.mla_recompute,
                      eager_moe=runs_eager_moe(m, tr))
    dense_terms = _per_block_terms(md, lay, bt_d, block_comm(md, tr, hw, lay, bt_d), layer_params_per_gpu(md, lay.tp))

    def on(kind):
        return lambda key: (counts[kind] - dense[kind]) * terms[key] + dense[kind] * dense_terms[key]
    first = on(0)
    return SimpleNamespace(on_first=first, on_mid=on(1), on_last=on(2),
                           mean_first=lambda key: first(key) / np.maximum(counts[0], 1))


def _evaluate_whole_blocks(m: ModelDims, tr, hw, lay, mem: dict | None = None) -> dict:
    """evaluate where every block of a rank recomputes alike."""
    rec = PRECISION_RECIPES[tr.precision]
    act_b = tr.act_bytes
    tp, pp, dp, cp, v = lay.tp, lay.pp, lay.dp, lay.cp, lay.vpp
    m_micro = num_microbatches(tr, lay)
    tokens_mb = lay.mbs * m.seq_len / cp  # tokens per GPU per micro-batch
    full = lay.recompute == REC_FULL
    # torchtitan's op-level selective checkpointing re-runs the block's forward up to its last needed
    # tensor: the attention output projection (recomputed) and its all-reduce (or SP's gather/scatter)
    # again, and the K/V gather of context parallelism (its K projection is recomputed)
    op = lay.recompute == REC_SELECTIVE_OP

    # ---- compute per block / micro-batch
    bt = block_time(m, lay, hw, act_b, tr.flash_attention, tr.dropout, tr.fused_elementwise, tr.eager_runtime,
                    tr.attention_kernel, tr.fp8, tr.moe_recompute, tr.mla_recompute,
                    eager_moe=runs_eager_moe(m, tr))

    bc = block_comm(m, tr, hw, lay, bt)
    tp_bw, tp_lat, t_ar, moved_ar, t_ag, moved_ag = bc.tp_bw, bc.tp_lat, bc.t_ar, bc.moved_ar, bc.t_ag, bc.moved_ag
    sp_on, regather, async_dgrad = bc.sp_on, bc.regather, bc.async_dgrad
    cp_in, cp_local, moved_cp, n_cp = bc.cp_in, bc.cp_local, bc.moved_cp, bc.n_cp
    cp_block_exposed = bc.cp_exposed  # the same in a dense and an MoE block (the attention's)

    # ---- pipeline stages: first (embedding), middle, last (head)
    blocks = rank_blocks(m, lay)
    blocks_first, blocks_mid, blocks_last = blocks[0]
    per_layer = layer_params_per_gpu(m, tp, lay.ep)
    # a mixture of experts with dense blocks between its MoE ones (ModelDims.mixed): a rank's sums over its blocks
    # take each kind's own per-block terms (mixed_blocks); the terms above are an MoE block's
    mb = mixed_blocks(m, tr, hw, lay, bt, bc, per_layer, blocks)
    on_first, on_mid, on_last = mb.on_first, mb.on_mid, mb.on_last
    emb_params = embedding_params_per_gpu(m, tp)
    head_params = head_params_per_gpu(m, tp, pp)
    # embedding: the vocab-parallel lookup ends with an all-reduce of T x h, or with SP a reduce-scatter
    # into the sequence shards, half of it (Megatron's VocabParallelEmbedding; forward only)
    emb_comm = np.where(sp_on, 0.5, 1.0)
    emb_time = emb_comm * t_ar + tokens_mb * m.hidden * act_b * 2 / hw.hbm_bytes_per_s
    ce_bytes = CE_BYTES_PER_LOGIT
    if tr.fused_cross_entropy and tr.cross_entropy_16bit_grad:
        ce_bytes = CE_BYTES_PER_LOGIT_PARPLAN_FUSED if tr.ce_eager_chunks else CE_BYTES_PER_LOGIT_FLASH_ATTN
    h_f, h_b = head_time(m, lay, hw, ce_bytes)
    # the head is vocab-parallel (Megatron's and parplan's column-parallel output layer): its input gradient is
    # all-reduced over tp in the backward, or with SP reduce-scattered after an all-gather forward and, where the
    # blocks' inputs are (regather), another in the backward; the input gradient's collective starts beside the
    # head's weight-gradient GEMM where the blocks' do (async_dgrad, or TP overlap) and hides behind it as theirs
    # do.  The vocab-parallel cross-entropy all-reduces three fp32 values a token (the max, the sum of exponentials,
    # the target's logit: Megatron's _VocabParallelCrossEntropy, parplan's layers.vocab_parallel_cross_entropy and
    # its fused loss).  Communication, not compute: compute_stage counts head_compute only.
    t_ce, moved_ce = comm.all_reduce(tokens_mb * 4, tp, tp_bw, tp_lat)
    head_dgrad = np.where(sp_on, t_ag, t_ar)
    head_wgrad = gemm_time(2 * tokens_mb * m.hidden * m.vocab / tp, hw)
    head_hides = (async_dgrad | np.asarray(tr.overlap_tp_comm)) & (np.asarray(tp) > 1)
    head_comm_t = (np.where(head_hides, hw.exposed(head_dgrad, head_wgrad), head_dgrad)
                   + np.where(sp_on, (1 + regather) * t_ag, 0.0) + 3 * t_ce)
    head_comm_moved = np.where(sp_on, (2 + regather) * moved_ag, moved_ar) + 3 * moved_ce
    head_compute = h_f + h_b
    if m.mtp:
        # multi-token prediction (ModelDims.mtp; its blocks are on the head's rank: model_rank_block_counts): per depth
        # the next token's embedding (its lookup and collective), the 2h -> h projection's three GEMMs and the head
        # with its loss and collectives again
        proj = 3 * linear_gemm_time(2 * tokens_mb * 2 * m.hidden * m.hidden / tp, hw)
        head_compute = head_compute * (1 + m.mtp) + m.mtp * proj
        head_comm_t = head_comm_t * (1 + m.mtp) + m.mtp * emb_time
        head_comm_moved = head_comm_moved * (1 + m.mtp) + m.mtp * emb_comm * moved_ar
    head_t = head_compute + head_comm_t
    single = np.asarray(pp) == 1
    # the head runs on the last pipeline rank, or on rank 0 (memory.rank_params places its parameters the same way)
    head_first = head_on_first_rank(lay)
    # amp's autocast casts each weight once a forward, and again in a recomputed forward (full, or op-level
    # selective, which re-runs every op it does not save, the casts included); the head's matmul casts its
    # V x h / tp weight, tied or not (the embedding's lookup reads the fp32 table)
    casts = 1 + (full | op)
    head_cast = m.vocab * m.hidden / tp
    cast_first = cast_time(casts * on_first("params") + np.where(head_first, head_cast, 0.0), tr.precision, hw)
    cast_mid = cast_time(casts * on_mid("params"), tr.precision, hw)
    cast_last = cast_time(casts * on_last("params") + np.where(head_first, 0.0, head_cast), tr.precision, hw)
    t_first = on_first("block") + emb_time + cast_first + np.where(head_first, head_t, 0.0)
    t_mid = np.where(np.asarray(pp) > 2, on_mid("block") + cast_mid, 0.0)
    t_last = np.where(single, 0.0, on_last("block") + cast_last + np.where(head_first, 0.0, head_t))
    # pipeline point-to-point: per chunk, send activations forward and gradients backward
    pp_in = comm.group_inside_node(hw, tp * cp, pp, lay.gpus)
    pp_bw, pp_lat = comm.tier_params(hw, pp_in, 2, pair=comm.one_pair(tp * cp, pp))  # point to point
    # Megatron's scatter/gather (Narayanan 2021 sec. 4.1), and DeepSpeed's partitioned pipeline buffers
    # (PartitionedTensor, deepspeed/runtime/pipe/engine.py): without SP each TP rank sends its 1/tp slice
    # and the receiving stage all-gathers the slices over the (NVLink) TP group; with SP the stage
    # output is already sequence-sharded, so every rank sends 1/tp and nothing is gathered.
    act_full = tokens_mb * m.hidden * act_b
    sg = np.asarray(tr.p2p_scatter_gather) & (np.asarray(lay.sp) == 0) & (np.asarray(tp) > 1)
    p2p_bytes = act_full / np.where((np.asarray(lay.sp) > 0) | sg, tp, 1)
    gather_t = np.where(sg, comm.all_gather(act_full, tp, tp_bw, tp_lat)[0], 0.0)
    # transfers a micro-batch waits for per virtual stage: a forward send and a backward send, each paired
    # with the opposite receive (Megatron, torch: a gather after each), or those four one after another
    # (DeepSpeed's engine: gathers after the two receives, and one before the backward that rebuilds the
    # stage's own output, which it kept partitioned since the forward's send)
    n_p2p = 4 if tr.p2p_blocking_transfers else 2
    n_gather = 3 if tr.p2p_blocking_transfers else 2
    p2p_mb = np.where(single, 0.0, v * (n_p2p * comm.p2p(p2p_bytes, pp_bw, pp_lat) + n_gather * gather_t))
    t_stage = np.maximum(np.maximum(t_first, t_mid), t_last) + p2p_mb
    c_first = on_first("total") + np.where(head_first, head_compute, 0.0)
    c_mid = on_mid("total")
    compute_stage = np.maximum(np.maximum(c_first, c_mid),
                               np.where(single, 0.0, on_last("total") + np.where(head_first, 0.0, head_compute)))

    # the stage that sets compute_stage ("the critical stage"): the time breakdown's per-stage rows (compute, the
    # attention's share, the blocks' TP / CP / EP collectives and their bytes) are its, so that a mixture of experts
    # whose rank 0 holds dense blocks only shows the all-to-alls of the MoE stage that sets the step (rank 0's had
    # read 0 for DeepSeek-V3 at pp 32); explain.step_remainder holds what the slowest stage spends beyond them
    crit_first = compute_stage == c_first
    crit_mid = ~crit_first & (compute_stage == c_mid)

    def on_crit(key):
        """A per-block term summed over the blocks of the critical stage."""
        return np.where(crit_first, on_first(key), np.where(crit_mid, on_mid(key), on_last(key)))
    blocks_crit = np.where(crit_first, blocks_first, np.where(crit_mid, blocks_mid, blocks_last))
    # whether the critical stage holds the head (rank 0 where head_first, else the last rank)
    head_crit = np.where(crit_first, head_first, ~crit_mid & ~head_first & ~single)

    # the zero-bubble schedules' idle time depends on how a block's work splits into forward (f), input
    # gradient (b: the backward less the weight-gradient GEMMs, with the attention's backward and any
    # recompute) and weight gradient (w: those GEMMs, as many FLOPs as the forward's)
    bf = bubble_factor(lay, m_micro, (mb.mean_first("fwd"), mb.mean_first("bwd") - mb.mean_first("wgrad"),
                                      mb.mean_first("wgrad")))
    t_pipe = (m_micro + bf) * t_stage
    bubble_s = bf * t_stage
    # The host dispatches and the GPU runs the same kernels in the same order: a two-machine flow shop, whose
    # makespan is the largest over the job sequence of (host time up to a job + GPU time from it on) (Johnson,
    # "Optimal two- and three-stage production schedules", Naval Research Logistics Quarterly 1, 1954).  Blocks
    # are uniform and a micro-batch's forward then backward are two runs of them, so beyond max(GPU, host) two
    # terms can lead: a host-bound forward before a GPU-bound backward delays the first backward (the GPU waits
    # for the host once), and a GPU-bound last backward runs after the host is done.  One-stage plans only (a
    # pipeline schedule's order is another job sequence); a profile without host_forward_share leaves it out.
    wait = flow_shop_wait(m_micro, blocks_first, mb.mean_first("host_fwd"), mb.mean_first("gpu_fwd"),
                          mb.mean_first("host") - mb.mean_first("host_fwd"),
                          mb.mean_first("gpu") - mb.mean_first("gpu_fwd"))
    dispatch_wait = np.where(single & (bt["host_fwd"] > 0), wait, 0.0)
    t_pipe = t_pipe + dispatch_wait

    # ---- data parallel (per step), on the heaviest stage's parameters
    first_params = on_first("params") + emb_params + np.where(head_first, head_params, 0.0)
    mid_params = on_mid("params")
    last_params = np.where(single, 0.0, on_last("params") + np.where(head_first, 0.0, head_params))
    stage_params = np.maximum(np.maximum(first_params, mid_params), last_params)
    # the heaviest stage's parameters outside its blocks (embedding and a head on rank 0, the head on the last
    # rank, none in the middle): FSDP2's root, DeepSpeed's trailing weights
    stage_root = np.where(first_params >= np.maximum(mid_params, last_params),
                          emb_params + np.where(head_first, head_params, 0.0),
                          np.where(mid_params >= last_params, 0.0, np.where(head_first, 0.0, head_params)))
    # context-parallel ranks are replicas too: gradients are reduced over dp x cp (TrainingConsts.zero_over_cp), the
    # group's tier, NICs a node and bridged pair by comm.data_parallel_tiers
    cp_in = comm.group_inside_node(hw, tp, cp, lay.gpus)
    _, (dpcp_in, dpcp_local, dpcp_pair) = comm.data_parallel_tiers(hw, tp, cp, pp, dp, lay.gpus)
    dpcp = np.asarray(dp) * np.asarray(cp)
    shards = zero_shards(lay, tr)
    # hybrid sharding (ZeRO-3 with dp_replicate > 1; ZeRO-1's Megatron optimizer instances): the states are sharded
    # over groups of dp / dp_replicate consecutive dp ranks (a node's, where they fit in one), with the cp ranks
    # beside them where the framework shards over cp too (zero_shards), and each reduce-scatter is followed by an
    # all-reduce of the 1/shards gradient over the dp_replicate ranks holding the same shard (torch FSDP2's HSDP over
    # torchtitan's (dp_replicate, dp_shard x cp) mesh, FSDP1's HYBRID_SHARD: the replicate dimension's all-reduce
    # after the shard dimension's reduce-scatter).  Mesh order (dp_replicate, dp_shard, pp, cp, tp): a shard group's
    # dp ranks are tp x cp x pp apart, the replicas tp x cp x pp x dp / dp_replicate; with dp_replicate 1 the shard
    # group is the whole dp (dp x cp) group
    rep = np.asarray(lay.dp_replicate)
    dps = np.asarray(dp) // np.maximum(rep, 1)  # dp ranks in a shard group
    shard_dp, shard_dpcp = comm.data_parallel_tiers(hw, tp, cp, pp, dps, lay.gpus)
    sh_in, sh_local, sh_pair = (np.where(tr.zero_over_cp, a, b) for a, b in zip(shard_dpcp, shard_dp))
    sh_bw, sh_lat = comm.tier_params(hw, sh_in, shards, sh_local, sh_pair)
    rep_stride = tp * cp * pp * dps
    rep_bw, rep_lat = comm.tier_params(hw, comm.group_inside_node(hw, rep_stride, rep, lay.gpus), rep,
                                       comm.ranks_per_node(hw, rep_stride, rep), comm.one_pair(rep_stride, rep))
    dpcp_bw, dpcp_lat = comm.tier_params(hw, dpcp_in, dpcp, dpcp_local, dpcp_pair)
    # a mixture of experts: the heaviest stage's expert weights are reduced (and, ZeRO-1/2, sharded and gathered) over
    # their own data-parallel group (moe.expert_data_parallel), the rest as a dense model's
    # of the heaviest stage, the one stage_params is (as stage_root picks it)
    stage_exp = np.where(first_params >= np.maximum(mid_params, last_params), on_first("experts"),
                         np.where(mid_params >= last_params, on_mid("experts"),
                                  np.where(single, 0.0, on_last("experts")))) if m.moe else 0.0
    grad_bytes = (stage_params - stage_exp) * rec["grad"]
    w_bytes = (stage_params - stage_exp) * rec["weight"]
    ar_t, ar_moved = comm.all_reduce(grad_bytes, dpcp, dpcp_bw, dpcp_lat)  # ZeRO-0: over dp x cp everywhere
    rs_t, rs_moved = comm.reduce_scatter(grad_bytes, shards, sh_bw, sh_lat)
    ag_t, ag_moved = comm.all_gather(w_bytes, shards, sh_bw, sh_lat)
    if m.moe:
        e_bw, e_lat, edp = moe.expert_grad_group(m, lay, hw)
        e_ar = comm.all_reduce(stage_exp * rec["grad"], edp, e_bw, e_lat)
        e_rs = comm.reduce_scatter(stage_exp * rec["grad"], edp, e_bw, e_lat)
        e_ag = comm.all_gather(stage_exp * rec["weight"], edp, e_bw, e_lat)
        ar_t, ar_moved = ar_t + e_ar[0], ar_moved + e_ar[1]
        rs_t, rs_moved = rs_t + e_rs[0], rs_moved + e_rs[1]
        ag_t, ag_moved = ag_t + e_ag[0], ag_moved + e_ag[1]
    zero = lay.zero
    zb_pipe = zero_bubble_pipe(lay)
    # torch's own zero-bubble weight pass runs no hook (FSDP2, torchtitan); parplan's queued one does
    torch_wpass = torch_weight_pass(lay, tr)
    # the reduction starts as each bucket's gradients become final and hides behind the rest of the rank's last
    # backward; under a zero-bubble pipeline the linears' gradients become final in the last weight passes,
    # so the window is the weight passes of the rank's last micro-batch (the input-gradient passes and other
    # micro-batches' work between its chunks' last weight passes are not counted: a lower bound)
    bwd_window = np.where(zb_pipe, on_first("wgrad"), on_first("bwd"))
    fwd_window = on_first("fwd")
    ov = grad_reduce_overlaps(tr.overlap_grad_reduce, torch_wpass)
    ov_gather = plan_overlaps_param_gather(tr)
    # torchtitan calls no no_sync, so under DDP every micro-batch's backward all-reduces (the accumulated gradients;
    # DDP waits for its buckets before the backward returns: behind that backward only), and copies into its buckets
    # and back each time (ddp_bucket_copy, below); others reduce once a step
    n_ar = np.where((zero == 0) & np.asarray(tr.ddp_reduces_each_microbatch), m_micro, 1)
    exposed_ar = n_ar * np.where(ov, hw.exposed(ar_t, bwd_window), ar_t)
    # ZeRO-1 by all-reduce (parplan's runtime, DeepSpeed's BF16 optimizer: every rank keeps the
    # full reduced gradient and steps its shard) or by reduce-scatter (Megatron's distributed
    # optimizer, DeepSpeed ZeRO); ZeRO-2 always reduce-scatters (non-owners drop their gradients).
    # The all-reduce runs over the shard group: dp x cp where the framework shards over both, else dp only,
    # after the cp replicas were averaged apart (cp_apart below; parplan's runtime)
    z1_ar = (zero == 1) & tr.zero1_all_reduce
    z1_ar_t, z1_ar_moved = comm.all_reduce(grad_bytes, shards, sh_bw, sh_lat)
    if m.moe:  # and the experts' all-reduce over their own group (parplan's runtime: train.build_expert_grad_reduction)
        z1_ar_t, z1_ar_moved = z1_ar_t + e_ar[0], z1_ar_moved + e_ar[1]
    # hybrid sharding: the replicas' all-reduce of each reduce-scatter's shard, with it (zero for one replica group):
    # FSDP2's HSDP under ZeRO-3 (below), and under ZeRO-1 Megatron's distributed optimizer in dp_replicate instances
    # (TrainingConsts.partial_distopt: the instance's reduce-scatter, then the shard's all-reduce across instances)
    rep_ar_t, rep_ar_moved = comm.all_reduce(grad_bytes / shards, rep, rep_bw, rep_lat)
    if m.moe:  # and the experts' shard across the replica groups (moe.expert_replica_group; zero with one group)
        er_bw, er_lat, er_n = moe.expert_replica_group(lay, hw)
        er_t, er_moved = comm.all_reduce(stage_exp * rec["grad"] / edp, er_n, er_bw, er_lat)
        rep_ar_t, rep_ar_moved = rep_ar_t + er_t, rep_ar_moved + er_moved
    z1_rep = (zero == 1) & ~z1_ar & tr.partial_distopt
    red_t = np.where(z1_ar, z1_ar_t, rs_t + np.where(z1_rep, rep_ar_t, 0.0))
    # DeepSpeed's ZeRO-2 casts each full bucket to the communication dtype where that is not the model's (the export's
    # fp32 beside fp32 gradient shards: average_tensor's allreduce_bucket, tensor.to(communication_data_type)) on the
    # reduction stream before reducing it: a read and a write of the stage's gradients through HBM each reduction
    # (the memory model holds the cast: memory.deepspeed_grad_buckets' reduce)
    ds_cast = (zero == 2) & bool(tr.ds_reduce_bucket_elements) & deepspeed_comm_casts(tr)
    red_t = red_t + np.where(ds_cast, stage_params * (rec["weight"] + rec["grad"]) / hw.hbm_bytes_per_s, 0.0)
    red_moved = np.where(z1_ar, z1_ar_moved, rs_moved + np.where(z1_rep, rep_ar_moved, 0.0))
    # ZeRO-2 reducing per micro-batch: a reduce-scatter after each micro-batch's backward, which runs
    # beside the following micro-batches' work (as ZeRO-3's gathers do); the last one hides behind
    # the last backward only.
    each = (zero == 2) & tr.zero2_each_microbatch
    n_red = np.where(each, m_micro, 1)
    # DeepSpeed's optimizer offload (TrainingConsts.offload_grads_via_host) accumulates the rank's gradient
    # partition in a host buffer of the parameters' dtype through the GPU: a micro-batch after the first copies
    # the buffer up and adds it on the GPU, and the sum goes back down; the boundary's fp32 copy down is
    # optimizer_time's.  ZeRO-1/2: stage_1_and_2.py's copy_grads_in_partition runs
    # async_accumulate_grad_in_cpu_via_gpu where gradient_accumulation_steps > 1, after each reduction on the
    # reduction stream: ZeRO-2 reduces every micro-batch and (since DeepSpeed's PR #7967, 2026) copies down every
    # time and up for all but the first, 2m - 1 copies a step (2(m - 1) before #6550, 2024): counted as a down and
    # an up copy with each but the last reduction and one with the last; ZeRO-1 reduces at the boundary only, one
    # copy.  ZeRO-3: stage3.py's partition_grads copies down and up every micro-batch (the first's
    # `grad_buffer.to(device)` too): 2m, with each micro-batch's reduce-scatters (zero3.block_comm).  The ZeRO-1/2
    # buffers hold whole parameters, so the one or two a partition's edges cut are copied whole (not counted)
    ds_acc = (lay.offload > 0) & np.asarray(tr.offload_grads_via_host)
    acc_copy = np.where(ds_acc, stage_params / shards * rec["weight"] / hw.host_link_bytes_per_s, 0.0)
    accumulates = m_micro > 1
    red_last_t = red_t + np.where(((zero == 1) | (zero == 2)) & accumulates, acc_copy, 0.0)
    red_each_t = red_t + np.where(accumulates, 2 * acc_copy, 0.0)
    last_red = np.where(ov, hw.exposed(red_last_t, bwd_window), red_last_t)
    exposed_rs_ag = (np.where(each, (m_micro - 1) * np.where(ov, hw.exposed(red_each_t, t_stage), red_each_t), 0.0)
                     + last_red + np.where(ov_gather, hw.exposed(ag_t, fwd_window), ag_t))
    # ZeRO-3 / FSDP: per micro-batch gather weights for forward and backward (+ recompute) and
    # reduce-scatter gradients; each hides behind the compute of the micro-batch it serves.  FSDP2
    # unshards a block in its pre-backward hook, before autograd reaches the checkpoint, so the
    # recompute runs on the gathered weights (its pre-forward hook finds them unsharded): no third
    # gather; DeepSpeed's stage 3 fetches for the recompute forward again.
    z3_regather = (full | op) & ~np.asarray(tr.zero3_fsdp2)
    # FSDP2 does not reshard its root unit after the forward ("its parameters would typically be immediately
    # all-gathered for backward": torch's FSDPState._lazy_init): the stage's parameters outside its blocks
    # (embedding, final norm, head; the root in parplan's runtime and torchtitan's of 2024) are gathered once a
    # micro-batch, as the memory model keeps them (memory.memory_breakdown's root_params)
    fsdp2 = np.asarray(tr.zero3_fsdp2)
    root_params = np.where(fsdp2, stage_root, 0.0)
    root_ag_t, root_ag_moved = comm.all_gather(root_params * rec["weight"], shards, sh_bw, sh_lat)
    # a mixture of experts: the blocks' dense weights gathered over the shard group, their experts over their own
    # data-parallel group (e_ag, moe.expert_grad_group: its size and tier), as parplan's runtime shards them (each MoE
    # layer's experts an FSDP2 unit over torchtitan's edp_mesh: parallel_layers.data_parallel.shard_experts); the
    # reduce-scatter rs_t already splits so
    blk_ag_t, blk_ag_moved = comm.all_gather((stage_params - root_params - stage_exp) * rec["weight"], shards, sh_bw,
                                             sh_lat)
    blk_shard = (stage_params - root_params - stage_exp) / shards  # the rank's shard of the blocks' weights
    if m.moe:
        blk_ag_t, blk_ag_moved = blk_ag_t + e_ag[0], blk_ag_moved + e_ag[1]
        blk_shard = blk_shard + stage_exp / edp
    # without a root (not FSDP2, or a middle stage) the blocks' gather is the stage's, and no root gather is timed.
    # Inside a pipeline FSDP2 gathers a block once a step (below: z3_n), not for its forward and again its backward
    blk_gathers = np.where(fsdp2 & (np.asarray(pp) > 1), 1, 2 + z3_regather)
    # FSDP2's CPUOffloadPolicy keeps the shards on the host: each gather first copies the rank's shard up the host
    # link (FSDPParam.all_gather_inputs: the fp32 master under a master recipe, else the weights), and each
    # reduce-scatter copies the gradient shard down (foreach_reduce), both per micro-batch where the gathers are;
    # counted with the collective they serve and hiding as it does (torch runs the uploads on the gathers' stream;
    # the download of a gradient added to an earlier micro-batch's waits for the host's add, not counted).  The
    # optimizer then steps the host shards in place (optimizer_time: no copy a step)
    host_z3 = fsdp2_offload(lay, tr)
    up_bytes = rec["master"] if rec["master"] else rec["weight"]
    blk_up = np.where(host_z3, blk_shard * up_bytes / hw.host_link_bytes_per_s, 0.0)
    root_up = np.where(host_z3, root_params / shards * up_bytes / hw.host_link_bytes_per_s, 0.0)
    grad_down = np.where(host_z3, (blk_shard + root_params / shards) * rec["grad"] / hw.host_link_bytes_per_s, 0.0)
    z3_ag_t = blk_gathers * (blk_ag_t + blk_up) + np.where(root_params > 0, root_ag_t + root_up, 0.0)
    z3_ag_moved = blk_gathers * blk_ag_moved + root_ag_moved
    # HSDP: the replicas' all-reduce of each reduce-scatter's shard (rep_ar_t, above), with it
    z3_mb_t = z3_ag_t + rs_t + rep_ar_t + grad_down + 2 * acc_copy
    # inside a pipeline FSDP2 keeps the weights gathered from a stage's first forward to its last backward
    # (reshard_after_forward off: torchtitan's default whenever pp > 1, and parplan's runtime's; the pipeline
    # schedule turns reshard_after_backward off but for the last backward): the step gathers and reduce-scatters
    # once, not per micro-batch (counted on 4 gloo ranks, tests/test_runtime_fsdp2_gathers.py)
    z3_n = np.where(tr.zero3_fsdp2 & (np.asarray(pp) > 1), 1, m_micro)
    z3_exposed = z3_n * hw.exposed(z3_mb_t, t_stage)
    # FSDP2 copies each gather's output into the unsharded parameters on the compute stream
    # (FSDPParamGroup.wait_for_unshard -> foreach_all_gather_copy_out: split_with_sizes_copy, a read and a write in
    # the parameters' dtype), serial with the blocks' compute; FSDP1 gathers into its flat parameter (no copy)
    copy_out = (blk_gathers * (stage_params - root_params) + root_params) * 2 * rec["weight"] / hw.hbm_bytes_per_s
    z3_exposed = z3_exposed + np.where(fsdp2 & np.asarray(tr.zero3_gather_copy_out), z3_n * copy_out, 0.0)
    # DeepSpeed's stage 3 prefetches one weight ahead: each gather hides behind one weight's compute
    # and trailing weights stay gathered from the recompute to the backward (cost_models/zero3.py);
    # the embedding and head hide behind their own compute
    ds = (zero >= 3) & np.asarray(tr.zero3_one_weight_ahead) & zero3.one_weight_ahead(m, tp)
    ds_moved = 0.0
    if np.any(ds):
        rest = stage_root
        rest_ag, rest_ag_moved = comm.all_gather(rest * rec["weight"], shards, sh_bw, sh_lat)
        rest_rs, rest_rs_moved = comm.reduce_scatter(rest * rec["grad"], shards, sh_bw, sh_lat)
        rest_rs = rest_rs + np.where(ds_acc, 2 * rest / shards * rec["weight"] / hw.host_link_bytes_per_s, 0.0)
        blk_exp, blk_moved = zero3.block_comm(m, lay, hw, tr, sh_bw, sh_lat)
        rest_compute = emb_time + np.where(head_first, head_compute, 0.0)
        ds_mb = blocks_first * blk_exp + hw.exposed((2 + z3_regather) * rest_ag + rest_rs, rest_compute)
        z3_exposed = np.where(ds, m_micro * ds_mb, z3_exposed)
        ds_moved = m_micro * (blocks_first * blk_moved + (2 + z3_regather) * rest_ag_moved + rest_rs_moved)
    dp_exposed = np.where(zero == 0, exposed_ar, np.where(zero >= 3, z3_exposed, exposed_rs_ag))
    dp_moved = np.where(zero == 0, n_ar * ar_moved,
                        np.where(zero >= 3, np.where(ds, ds_moved, z3_n * (z3_ag_moved + rs_moved + rep_ar_moved)),
                                 n_red * red_moved + ag_moved))
    # sharding over dp only (parplan's runtime), after the dp reduction the cp replicas average what each rank
    # holds with an all-reduce over cp, on the critical path: ZeRO-1 the full gradients, ZeRO-2 (which drops
    # the others' pieces) and FSDP2 their 1/dp
    cp_bw, cp_lat = comm.tier_params(hw, cp_in, cp, cp_local, comm.one_pair(tp, cp))
    cp_avg_t, cp_avg_moved = comm.all_reduce(grad_bytes / np.where(zero >= 2, dps, 1), cp, cp_bw, cp_lat)
    cp_apart = (zero >= 1) & ~np.asarray(tr.zero_over_cp)
    dp_exposed = dp_exposed + np.where(cp_apart, cp_avg_t, 0.0)
    dp_moved = dp_moved + np.where(cp_apart, cp_avg_moved, 0.0)
    # Tied embeddings with a pipeline: the first stage's embedding and the last stage's copy of it
    # sum their gradients after the backward (Megatron's embedding group, parplan's runtime's
    # mesh.embedding_group: an all-reduce over the two ranks, V x h / tp gradients), on the critical
    # path before the optimizer step.  Under ZB-V rank 0 holds both: a local sum.
    if m.tied or m.mtp:  # (multi-token prediction's embedding copy on the last stage too: mtp_head_params_per_gpu)
        # the first and last stage of one pipeline replica share a node where the replica does
        first_last_in = comm.group_inside_node(hw, tp * cp, pp, lay.gpus)
        tie_bw, tie_lat = comm.tier_params(hw, first_last_in, 2, pair=comm.one_pair(tp * cp, pp))
        tie_t, tie_moved = comm.all_reduce(m.vocab * m.hidden / tp * rec["grad"], 2, tie_bw, tie_lat)
        tie_on = ~single & ~head_first
        dp_exposed = dp_exposed + np.where(tie_on, tie_t, 0.0)
        dp_moved = dp_moved + np.where(tie_on, tie_moved, 0.0)

    # ---- optimizer
    shard = np.where(zero >= 1, shards, 1)
    opt_params = stage_params / shard
    if m.moe:  # the experts' states sharded over their own group (memory.expert_state_params)
        opt_params = (stage_params - stage_exp) / shard + stage_exp / np.where(zero >= 1, edp, 1)
    off = lay.offload > 0
    gpus_node = np.minimum(lay.gpus, hw.gpus_per_node)
    fsdp2 = (zero >= 3) & np.asarray(tr.zero3_fsdp2)
    opt_t = optimizer_time(np.where(off, 0.0, opt_params), np.where(off, opt_params, 0.0),
                           tr.precision, hw, gpus_node, param_tensors_per_rank(m, pp, blocks_first, blocks_mid, blocks_last,
                                                                                        head_first),
                           over_link=~host_z3, shard_is_master=fsdp2)

    # gradient upcast/accumulation passes (serial, memory-bound), reported with the optimizer step
    # with fusion the linears' gradients need no pass; the embedding's (a lookup's, not a GEMM's) still does, on the
    # first stage (counted on the heaviest; the norms' 2h per layer are left out).  No ZeRO-3 fuses: FSDP2 reduces
    # autograd's gradients, and Megatron-FSDP runs with --no-gradient-accumulation-fusion (its guide's required
    # configuration, which `parplan export --to megatron` writes)
    fused = wgrad_fusion_applies(tr.grad_accumulation_fusion, tr.precision, zero >= 3, torch_wpass,
                                 tr.wgrad_fusion_16bit_grads)
    opt_t = opt_t + grad_accumulation_time(np.where(fused, emb_params, stage_params), m_micro, tr.precision, hw,
                                           fsdp2=fsdp2, pp=pp, shards=shards)
    # parplan's FP8 weight gradients under that fusion: the FP8 GEMM writes an fp32 dW (torch._scaled_mm does not
    # accumulate), which is main_grad on the first micro-batch and added into it on each later one (read 4 + 4, write
    # 4 B a parameter; parallel_layers.layers._param_grads), for the heaviest stage's blocks
    if tr.fp8 == "parplan":
        blocks_max = np.maximum(np.maximum(blocks_first, blocks_mid), blocks_last)
        opt_t = opt_t + np.where(fused, blocks_max * per_layer * 12 * np.maximum(m_micro - 1, 0)
                                 / hw.hbm_bytes_per_s, 0.0)
    # torch DDP without gradient_as_bucket_view (TrainingConsts.ddp_bucket_copy) copies each gradient into its bucket
    # as autograd makes it and back into the gradient after the all-reduce (the Reducer's mark_variable_ready_dense and
    # its finalize): a read and a write of the gradients each way, on the compute stream, at each all-reduce
    opt_t = opt_t + np.where(ddp_bucket_copy(lay, tr), n_ar * stage_params * 4 * rec["grad"] / hw.hbm_bytes_per_s, 0.0)
    # DeepSpeed's ZeRO optimizer makes each group's gradient partition flat before it steps it (memory.
    # step_grad_copy_bytes): a read and a write of the share's gradients in their dtype, in the step's pass (the
    # upcast of 16-bit ones is optimizer_time's); of fp32 weights it then copies its fp32 partition back into them
    # (bit16_partitions[partition_id].data.copy_(fp32_partition.data)): a read and a write of 4 B more
    ds_passes = 2 * rec["grad"] + np.where(deepspeed_fp32_partition(lay, tr), 8.0, 0.0)
    opt_t = opt_t + np.where(deepspeed_zero_optimizer_steps(lay, tr),
                             opt_params * ds_passes / (hw.hbm_bytes_per_s * hw.optimizer_bw_fraction), 0.0)
    # the gradients the rank holds after the reduction: every ZeRO stage but all-reduce ZeRO-1 shards them
    held = stage_params / np.where((zero >= 1) & ~z1_ar, shards, 1)
    if m.moe:
        held = (stage_params - stage_exp) / np.where((zero >= 1) & ~z1_ar, shards, 1) + \
            stage_exp / np.where((zero >= 1) & ~z1_ar, edp, 1)
    if tr.clip_grad:
        opt_t = opt_t + grad_clip_time(held, tr.precision, hw, tr.clip_scales_always)
    if scales_loss(tr.dtype, tr.precision):  # fp16: the check-and-unscale pass
        opt_t = opt_t + loss_scale_time(held, tr.precision, hw)
    step = t_pipe + dp_exposed + opt_t

    # ---- memory
    if mem is None:
        mem = memory_breakdown(m, lay, tr, m_micro)

    # ---- FLOPs, MFU, HFU (Narayanan 2021 eq. 3 for the recompute term)
    # (a mixed model's dense blocks at their own MLP width: ModelDims.dense_dims)
    kinds = ((m.moe_blocks, m), (m.layers - m.moe_blocks, m.dense_dims())) if m.mixed else ((m.layers, m),)
    # multi-token prediction's depths: one more block each, an MoE block in a mixture of experts (kinds[0];
    # model_rank_block_counts), the 2h -> h projection and the head again (Megatron-LM's and NeMo's FLOP counts for
    # DeepSeek-V3 count them so)
    if m.mtp:
        kinds = ((kinds[0][0] + m.mtp, kinds[0][1]),) + kinds[1:]
    layers_mm = sum(n * layer_matmul_params(k.arch, k.hidden, k.heads, k.kv_heads, k.head_dim, k.ffn, k.mla)
                    for n, k in kinds)
    # a sliding window shortens the attended span (ModelDims.attention_span; the full sequence without one)
    span = m.attention_span()
    mtp_mm = m.mtp * (2 * m.hidden * m.hidden + m.vocab * m.hidden)
    mf_tok = model_flops_per_token(layers_mm + m.vocab * m.hidden + mtp_mm, m.layers + m.mtp, m.attn_width, span)
    op_params = sum(n * sum(titan_op_sac_recomputed_params(k) if k.titan_moe
                            else op_sac_recomputed_matmuls(k.arch, k.hidden, k.q_width, k.kv_width, k.ffn, k.qkv_bias))
                    for n, k in kinds)
    hf_extra = recompute_flops_per_token(lay.recompute, layers_mm, m.layers + m.mtp, m.attn_width, span, op_params,
                                         tr.flash_attention)
    tokens_step = tr.global_batch_size * m.seq_len
    tokens_per_s = tokens_step / step
    model_tflops = tokens_per_s * mf_tok / lay.gpus / 1e12
    hw_tflops = tokens_per_s * (mf_tok + hf_extra) / lay.gpus / 1e12
    mfu = model_tflops * 1e12 / hw.peak_flops
    hfu = hw_tflops * 1e12 / hw.peak_flops

    # ---- Amdahl
    t_compute = m_micro * compute_stage + dispatch_wait
    speedup, alpha = amdahl(np.asarray(lay.gpus, dtype=float), t_compute, step)

    # ---- bytes per GPU per step
    # (the critical stage's: on_crit; the embedding's collective on rank 0)
    tp_bytes = m_micro * (on_crit("tp_moved") + np.where(crit_first, emb_comm * moved_ar, 0.0)
                          + np.where(head_crit, head_comm_moved, 0.0))
    ep_bytes = m_micro * on_crit("ep_moved")
    pp_bytes = np.where(single, 0.0, m_micro * 2 * v * p2p_bytes)
    cp_bytes = m_micro * blocks_crit * n_cp * moved_cp

    return {
        "num_microbatches": m_micro,
        "step_time_s": step,
        "tokens_per_s": tokens_per_s,
        "model_tflops_per_gpu": model_tflops,
        "hardware_tflops_per_gpu": hw_tflops,
        "mfu": mfu,
        "hfu": hfu,
        "bubble_fraction": bubble_s / step,
        "compute_s": t_compute,
        "attention_s": m_micro * on_crit("attention_all"),
        "fp8_cast_s": m_micro * on_crit("fp8_cast_all"),
        "tp_comm_s": m_micro * (on_crit("tp_exposed") + np.where(head_crit, head_comm_t, 0.0)),
        "cp_comm_s": m_micro * blocks_crit * cp_block_exposed,
        "ep_comm_s": m_micro * on_crit("ep_exposed") + 0.0 * step,
        "pp_comm_s": m_micro * p2p_mb,
        "dp_comm_s": dp_exposed,
        "bubble_s": bubble_s,
        "optimizer_s": opt_t,
        "block_gpu_s": np.broadcast_to(bt["gpu"], np.shape(step)),  # per block and micro-batch
        "block_host_s": np.broadcast_to(bt["host"], np.shape(step)),
        "comm_tp_bytes": tp_bytes,
        "comm_pp_bytes": pp_bytes,
        "comm_dp_bytes": dp_moved,
        "comm_cp_bytes": cp_bytes,
        "comm_ep_bytes": ep_bytes + 0.0 * step,
        "parallel_fraction": alpha,
        "speedup": speedup,
        "model_flops_per_token": mf_tok + 0.0 * step,
        "mem_weights": mem["weights"],
        "mem_grads": mem["grads"],
        "mem_optimizer": mem["optimizer"],
        "mem_activations": mem["activations"],
        "mem_other": mem["other"],
        "mem_total": mem["total"],
        "mem_offloaded": mem["offloaded"],
        "worst_stage": mem["worst_stage"],
        "mem_moment": mem["moment"],
        "mem_first": mem["first_total"],
        "mem_mid": mem["mid_total"],
        "mem_last": mem["last_total"],
    }
