"""Memory per GPU on the worst pipeline stage, by named term.

Model states follow the precision recipe (layout.PRECISION_RECIPES) and the ZeRO stage
(Rajbhandari et al. 2020: stage 1 shards optimizer states, 2 also gradients, 3 also weights over
the data-parallel group).  Activations are derived per architecture from the tensors the runtime
(parallel_layers/model.py) saves for backward; Korthikanti et al. 2022 (eq. 2-6) is the template:
its 34*s*b*h + 5*a*s^2*b per layer is for GPT *with dropout* and unfused attention, which our
runtime does not build, so the coefficients are re-derived below tensor by tensor.

All functions are elementwise over a Layout (scalars or numpy arrays).
"""
from __future__ import annotations

from functools import lru_cache, reduce
from types import SimpleNamespace

import numpy as np

from .layout import (PRECISION_RECIPES, REC_FULL, REC_NONE, REC_SELECTIVE, REC_SELECTIVE_OP, SCH_GPIPE, SCH_INTERLEAVED,
                     SCH_INTERLEAVED_ZB, SCH_ZBV, ModelDims, head_on_first_rank, num_microbatches,
                     model_rank_block_counts, model_split_sizes, rank_recomputed_shares, recompute_ends,
                     recomputed_share, split_by_share, stage_layers, virtual_stage_blocks, zero_shards,
                     deepspeed_comm_casts, distinct_rows, rank_dense_blocks)
from . import moe, zero3
from .params import block_norms, layer_other_params, mla_projections, titan_op_sac_kept_width
from .compute import grad_reduce_overlaps


def attention_params_split(m: ModelDims):
    """(tensor-parallel, whole on every rank) parameters of one block's attention: the q / k / v and output
    projections split; multi-head latent attention's down projections and its latents' RMSNorm weights whole on
    every rank (params.mla_projections)."""
    if not m.kv_lora:
        return m.hidden * (m.q_width + 2 * m.kv_width) + m.q_width * m.hidden, 0
    proj = mla_projections(m.hidden, m.heads, m.head_dim, m.mla)
    return (sum(i * o for _, i, o, whole in proj if not whole),
            sum(i * o for _, i, o, whole in proj if whole) + m.mla.latent_norms())


def layer_params_per_gpu(m: ModelDims, tp, ep=1):
    """Parameters of one block held by one TP rank: matrices and TP-split biases divided by tp,
    norm weights (and the row-parallel output biases) replicated.  A mixture of experts' block: the attention
    as a dense one's, the router replicated, and the rank's E / ep experts whole (moe.expert_params_per_gpu)."""
    attn, attn_whole = attention_params_split(m)
    norms = block_norms(m.post_norms, m.parallel_block) * m.hidden  # RMSNorm weights (params.block_norms)
    if m.qkv_bias:  # Qwen2's q/k/v biases (ModelDims.qkv_bias), split over tp with their projections
        attn = attn + m.q_width + 2 * m.kv_width
    if m.moe:  # (a shared expert is tensor-parallel, as a dense MLP)
        shared = moe.EXPERT_MATRICES * m.hidden * m.shared_ffn
        return ((attn + shared) / tp + attn_whole + norms + moe.router_params_per_layer(m)
                + moe.expert_params_per_gpu(m, ep))
    matmul = attn + (3 if m.arch == "llama" else 2) * m.hidden * m.ffn
    if m.arch == "llama":
        return matmul / tp + attn_whole + norms
    split_bias = m.q_width + 2 * m.kv_width + m.ffn
    replicated = layer_other_params(m.arch, m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn,
                                    post_norms=m.post_norms, parallel_block=m.parallel_block) - split_bias
    return (matmul + split_bias) / tp + replicated


def embedding_params_per_gpu(m: ModelDims, tp):
    """First stage: vocab-parallel embedding (+ learned positions, replicated)."""
    return m.vocab * m.hidden / tp + m.positions * m.hidden


def head_params_per_gpu(m: ModelDims, tp, pp):
    """Last stage: final norm + vocab-parallel head.  A tied head on a single stage shares the
    embedding; with pp > 1 Megatron keeps a copy on the last stage, counted here."""
    norm = m.hidden if m.arch == "llama" else 2 * m.hidden
    head = m.vocab * m.hidden / tp
    if m.tied:
        head = np.where(np.asarray(pp) > 1, head, 0.0)
    return norm + head + mtp_head_params_per_gpu(m, tp, pp)


def mtp_head_params_per_gpu(m: ModelDims, tp, pp):
    """Multi-token prediction's parameters beside its blocks (ModelDims.mtp; Megatron-Core's MultiTokenPredictionLayer),
    on the rank holding the head: per depth the projection of [block output; next token's embedding], 2h x h split
    over tp, and three RMSNorms (the two inputs' and the depth's final one); with a pipeline the input embedding's
    copy, V x h / tp (Megatron builds the embedding on the MTP stage and sums its gradients with the first stage's,
    as a tied head's; a tied model's copy is the head's, counted above)."""
    if not m.mtp:
        return 0.0
    copy = 0.0 if m.tied else np.where(np.asarray(pp) > 1, m.vocab * m.hidden / tp, 0.0)
    return m.mtp * (2 * m.hidden * m.hidden / tp + 3 * m.hidden) + copy


def activation_bytes_per_layer(m: ModelDims, lay, act_bytes: int, flash: bool, dropout: bool = False,
                               sp_saves_gathered: bool = False, cp_saves_gathered_kv: bool = False,
                               eager: bool = False, fp8: str = ""):
    """Bytes saved for backward by one block for one micro-batch on one GPU.

    Tokens per GPU T = mbs * seq / cp.  Per token, in elements (x act_bytes):
      outside the TP region (divided by tp only with sequence parallelism):
        2 norm inputs + 2 norm outputs (= inputs of the QKV and FC1 matmuls)      4h
      inside the TP region (divided by tp):
        attention: q, k, v after rotary + output O (saved by out-proj)          2*qw + 2*kvw
        llama MLP: gate and up (saved by the SwiGLU function, which recomputes
          sigmoid in its backward) + product (saved by the down projection)     3*ffn
        gpt MLP: fc1 output (GeLU input) + GeLU output (fc2 input)              2*ffn
      unfused attention (no flash) also keeps the softmax output a*s per token (Korthikanti's
      5as/h term less its two dropout tensors); selective recompute drops it.
    Plus fp32 norm statistics (2 x 4 bytes per token) and, for flash attention, the fp32
    log-sum-exp (4 bytes per head per token).
    With dropout (published GPT runs) two 1-byte masks of h per token (attention-output and MLP
    dropout, outside the TP region) and, for unfused attention, the attention-dropout mask (1 byte)
    and its 16-bit output per score: then GPT with unfused attention gives exactly Korthikanti's
    s*b*h*(34 + 5*a*s/h) (34/t + 5as/(ht) with SP, 10 + 24/t + 5as/(ht) without).
    Full recompute keeps only the block input (h per token, /tp with SP); the one block being
    recomputed is counted separately as working memory (see other_bytes).
    Op-level selective recompute (torchtitan's selective_ac_option "op", parallel_layers.model.
    op_sac_context) keeps the block input and the outputs of the ops its policy saves: every odd
    aten.mm of the block (llama: wq, wv, gate and down; gpt: the attention output projection, its
    column-parallel linears with bias run as addmm, which the policy does not count, and fc2 is the
    second mm; a row-parallel output is the whole sequence's partial sum, h per token even with SP)
    and the attention kernel's output and fp32 log-sum-exp (flash/SDPA only; the unfused path's
    batched matmuls are not on the list).  Everything else, norm statistics, masks and the CP
    K/V gather included, is recomputed.
    sp_saves_gathered: with SP the two norm outputs are all-gathered over the sequence before the
    column-parallel matmuls; Megatron and parplan's runtime save the shard and gather again in the
    backward (Korthikanti 2022 sec. 4.2.2), torch's DTensor SP saves the gathered tensor (h per
    token: a CPU allocator trace of parplan's runtime found one per norm and block when it did).
    cp_saves_gathered_kv: all-gather context parallelism as parplan's runtime runs it (Llama 3's scheme)
    saves the gathered keys and values, the whole sequence (cp x the rank's tokens), for the attention's
    backward, and with its two causal chunks per rank the attention output twice (each chunk's, saved by
    the attention, and their concatenation, saved by the output projection); Megatron's and torch's
    ring attention pass them again in the backward instead (CPU allocator trace of cp 2 x tp 2:
    benchmarks/results/2026-11-23-cpu-memory).  Under selective recompute the runtime checkpoints the
    gather with the attention, so neither is saved and the backward gathers again (cost_models.total:
    one all-gather more)."""
    T = lay.mbs * m.seq_len / lay.cp
    tp = lay.tp
    seq_split = np.where(lay.sp > 0, tp, 1)
    # (attention and MLP side by side, ModelDims.parallel_block: one norm, its input and its output once, the output
    # read by the five input projections together)
    n_norms = 1 if m.parallel_block else 2
    outside = n_norms * m.hidden / seq_split + n_norms * m.hidden / np.where(sp_saves_gathered, 1, seq_split)
    mlp = 3 * m.ffn if m.arch == "llama" else 2 * m.ffn
    cp_saved = cp_saves_gathered_kv & (lay.cp > 1) & (lay.recompute != REC_SELECTIVE)
    cp_kv = np.where(cp_saved, lay.cp, 1)
    cp_out = np.where(cp_saved, m.o_width, 0)
    inside = (m.q_width + m.o_width + cp_out + 2 * m.kv_width * cp_kv + mlp) / tp
    # + the two norms' fp32 statistics, per token they see: RMSNorm saves its rstd (4 B), LayerNorm its mean and
    # rstd (8 B: torch's native_layer_norm, apex's FusedLayerNorm mean/invvar, Transformer Engine's mu/rsigma)
    norm_stats = 16 if m.arch == "gpt" else 8
    elems = (outside + inside) * act_bytes + norm_stats * n_norms / 2 / seq_split
    if m.qk_norm:
        # q/k norms (ModelDims.qk_norm; Qwen3's per-head RMSNorms): each saves its input, the q or k projection's
        # output, which nothing else keeps (the attention saves q and k after rotary, the projections their input),
        # and its statistics (fp32 a head a token: 4 B RMSNorm, 8 B LayerNorm; a norm over the whole width keeps
        # fewer).  Eager or compiled alike: torch's nn.RMSNorm (torchtitan's qwen3, Hugging Face's) runs
        # aten._fused_rms_norm on a GPU, whose backward takes the input and rstd (its schema), as Transformer
        # Engine's norm (Megatron's --qk-layernorm) does.  On a CPU rms_norm decomposes into fp32 ops that keep
        # two fp32 copies instead (measured, tests/test_activation_memory.py, which checks the count with the
        # fused kernel's saves).  parplan's runtime runs them inside the selective checkpoint (ModelDims.
        # qk_norm_recomputed): nothing more there (its blocks, eager and compiled, by the same test)
        # (over the whole width, ModelDims.qk_norm_whole: one set of statistics a token for each of the two norms, on
        # every tp rank, as parplan's _WholeWidthNorms saves them)
        stats_per_token = 2 if m.qk_norm_whole else (m.heads + m.kv_heads) / tp
        qk = (m.q_width + m.kv_width) / tp * act_bytes + norm_stats / 2 * stats_per_token
        kept = lay.recompute != REC_SELECTIVE if m.qk_norm_recomputed else True
        elems = elems + np.where(kept, qk, 0.0)
    if m.post_norms:
        # norms on the sublayers' outputs (ModelDims.post_norms; Gemma 2 / 3, GLM-4): each saves its input, the
        # attention output projection's or the MLP's output (h a token; the rank's sequence shard with SP, where the
        # row-parallel output is reduce-scattered before it), which nothing else keeps (the norm's output goes into
        # the residual add, which saves nothing), and its fp32 statistics, as the input norms (norm_stats: both)
        # (torch.compile over a whole block rebuilds the residual between them from the block input and the
        # attention's output, one h fewer, measured on CPU; parplan's runtime breaks its compiled blocks' graphs at the
        # linears wherever the gradient accumulation is fused or tp > 1, and keeps it there: both counted, an upper
        # bound for whole-graph blocks: tests/test_activation_memory.py)
        elems = elems + 2 * m.hidden / seq_split * act_bytes + norm_stats / seq_split
    if m.kv_lora and not m.v_padded:
        # multi-head latent attention (Megatron-Core's MLASelfAttention): each latent's RMSNorm saves its input and
        # the up projection its output, on the whole sequence and whole on every tensor-parallel rank (sequence
        # parallelism gathers the latents, not h), with its fp32 statistics; the down projections' input is the
        # attention norm's output, counted above.  q, k (heads x head_dim) and v (heads x v_dim) are the core's
        # inputs above (2 kv_width is k and v: ModelDims.kv_width)
        elems = elems + 2 * m.mla.latent_norms() * act_bytes + 4 * (2 if m.q_lora else 1)
    elif m.kv_lora:
        # parplan's runtime (parallel_layers.model.MLAttention, ModelDims.v_padded): the down projections' outputs on
        # the rank's own tokens (their norms' inputs: q_lora, and kv_lora + rope whose slice the norm keeps) with the
        # norms' fp32 statistics, and the normed latents gathered once, whole (q_lora + kv_lora + rope, the up
        # projections' input); the core saves q, k and v padded to head_dim and its padded output, the output
        # projection its v_dim input: heads x (2 head_dim - v_dim) / tp more than counted above.  Under selective
        # recompute the checkpoint keeps the up projections' outputs and the output projection's input instead:
        # heads x rope / tp fewer, and no log-sum-exp
        # Under all-gather context parallelism (cp_saved) the keys and values kept are the gathered ones, the values
        # padded: cp x heads x (head_dim - v_dim) more than 2 kv_width x cp counts, and the two chunks' outputs padded
        # too: heads x (head_dim - v_dim) more than cp_out (MLAttention._context_parallel_core)
        down = m.mla.down_width()
        elems = elems + (down / seq_split + down) * act_bytes + 4 * (2 if m.q_lora else 1) / seq_split
        selective_save = -(m.heads * m.rope / tp * act_bytes + 4 * m.heads / tp)
        padded = np.where(cp_saved, (1 + lay.cp) * (m.head_dim - m.v_dim), 2 * m.head_dim - m.v_dim)
        elems = elems + np.where(lay.recompute == REC_SELECTIVE, selective_save, m.heads * padded / tp * act_bytes)
    if fp8 == "te":
        # Transformer Engine's FP8 linears save their input for the weight gradient in FP8 (1 byte): the two norm
        # outputs (LayerNormLinear, LayerNormMLP) and the MLP's second layer's input; the attention's output, which
        # the fused attention keeps in 16 bits for its own backward, gains the projection's FP8 copy.  A mixture of
        # experts' MLP norm feeds the 16-bit router (its dispatched tokens are saved in FP8: moe.saved_bytes_per_token)
        norm_out = (1 if m.moe else 2) * m.hidden / np.where(sp_saves_gathered, 1, seq_split)
        elems = elems - (act_bytes - 1) * (norm_out + m.ffn / tp) + m.o_width / tp
    if dropout:
        elems = elems + 2 * m.hidden / seq_split  # two 1-byte hidden-dropout masks
    if flash:
        elems = elems + 4 * m.heads / tp
    else:
        per_score = act_bytes + ((1 + act_bytes) if dropout else 0)  # softmax out (+ mask + dropout out)
        scores = m.heads / tp * m.seq_len * per_score
        elems = elems + np.where(lay.recompute == REC_SELECTIVE, 0.0, scores)
    full = m.hidden / np.where(lay.sp > 0, tp, 1) * act_bytes
    op_mm = (m.q_width + m.kv_width + m.ffn) / tp + m.hidden if m.arch == "llama" else m.hidden
    if m.qkv_bias:  # wq, wk, wv as addmm's (params.op_sac_recomputed_matmuls): the 1st and 3rd mm's are wo and up
        op_mm = m.ffn / tp + m.hidden
    if m.titan_moe:  # torchtitan's MoE model: the 1st, 3rd, ... mm's outputs (params.titan_op_sac_kept_width)
        op_mm = titan_op_sac_kept_width(m, tp)
    op_attn = (m.o_width / tp * act_bytes + 4 * m.heads / tp) if flash else 0.0
    op = full + op_mm * act_bytes + op_attn
    if eager and m.arch == "llama":
        # torchtitan's llama in eager PyTorch (fused_elementwise off, any framework but parplan's runtime,
        # whose own RMSNorm and SwiGLU functions save what fused kernels do) saves more than fused kernels do
        # (tests/test_activation_memory.py emulates its block: exact): each RMSNorm the fp32 upcast of its
        # input and both the normalised and the weighted output (4 h bytes more per norm); SwiGLU the
        # silu output (ffn); GQA's repeat_kv the keys and values at the query width for SDPA
        # (2 (qw - kvw)).  Rotary's complex fp32 product keeps only the constant table.  Selective
        # recompute re-runs the attention core (repeat_kv) and keeps the rest; full and op-level recompute
        # keep none of it.
        seq_split = np.where(lay.sp > 0, tp, 1)
        norms = (4 if m.post_norms else 2) * 4 * m.hidden / seq_split  # (post-norms: two norms more)
        silu = m.ffn / tp * act_bytes
        # (torchtitan's MoE models, 0.2 and later only, pass SDPA enable_gqa and repeat nothing: ModelDims.titan_moe)
        attn = 0.0 if m.titan_moe else 2 * (m.q_width - m.kv_width) * act_bytes / tp
        elems = elems + norms + silu + np.where(lay.recompute == REC_SELECTIVE, 0.0, attn)
    per_token = np.where(lay.recompute == REC_FULL, full, np.where(lay.recompute == REC_SELECTIVE_OP, op, elems))
    if m.moe:  # the MoE layer's own saved tensors, on the rank's routed tokens (moe.saved_bytes_per_token)
        own = (moe.titan_saved_bytes(m, lay, act_bytes, eager) / T if m.titan_moe  # torchtitan's layer
               else moe.routed_tokens(m, lay) / T * moe.saved_bytes_per_token(m, act_bytes, fp8 == "te"))
        # torchtitan's op-level policy keeps nothing of its MoE layer (measured) but, where its model's list names
        # them (moe.titan_keeps_all_to_alls), the all-to-alls' outputs: the tokens received and returned
        op_own = (np.where(np.asarray(lay.ep) > 1, 2 * moe.routed_tokens(m, lay) * m.top_k * m.hidden * act_bytes / T,
                           0.0) if moe.titan_keeps_all_to_alls(m) else 0.0)
        own = np.where((lay.recompute == REC_SELECTIVE_OP) & m.titan_moe, op_own, own)
        per_token = per_token + np.where(lay.recompute == REC_FULL, 0.0, own)
    return T * per_token


def mla_up_saved_bytes(m: ModelDims, lay, act_bytes: int):
    """Bytes a block no longer saves a micro-batch where multi-head latent attention's up projections are recomputed
    (Megatron-LM's --recompute-modules mla_up_proj: their outputs, the attention core's q, k and v, are discarded
    after the core's forward and rebuilt before its backward from the saved latents): q_width + 2 kv_width a token
    over tp (activation_bytes_per_layer's q, k, v).  0 for other attention."""
    if not m.kv_lora:
        return 0.0
    return lay.mbs * m.seq_len / lay.cp * (m.q_width + 2 * m.kv_width) / lay.tp * act_bytes


def parplan_mla_up_saved_bytes(m: ModelDims, lay, act_bytes: int):
    """mla_up_saved_bytes as parplan's runtime frees them (ModelDims.v_padded; parallel_layers.model.MLAttention with
    mla_recompute), which differ from Megatron's because it saves other tensors (activation_bytes_per_layer's
    parplan branch): what a block stops holding a micro-batch, a token over tp, is
      no recompute: the attention kernel's q, k and v, each padded to head_dim (3 heads x head_dim), rebuilt from the
          latents for its backward; without a query latent q is the block input's projection, not rebuilt: kept (2)
      selective: the core's checkpoint takes the latents in place of the up projections' outputs q (heads x
          head_dim; without a query latent still its input) and kv (heads x (head_dim - rope + v_dim))
      full (recompute_layers' other blocks count as none) and op-level selective: nothing (the runtime leaves the
          blocks it checkpoints whole, and the op policy's, alone).
    Measured on 4 gloo ranks: benchmarks/results/2026-12-05-cpu-memory-mla-recompute.  0 for other attention."""
    if not m.kv_lora:
        return 0.0
    width = max(m.head_dim, m.v_dim)  # the kernel's one head width (the padded values)
    q = m.heads * width if m.q_lora else 0
    none = q + 2 * m.heads * width
    selective = (m.q_width if m.q_lora else 0) + m.heads * (m.head_dim - m.rope + m.v_dim)
    per_token = np.where(lay.recompute == REC_NONE, none, np.where(lay.recompute == REC_SELECTIVE, selective, 0.0))
    return lay.mbs * m.seq_len / lay.cp * per_token / lay.tp * act_bytes


def parplan_mla_rebuilt_after_mlp(m: ModelDims, lay, act_bytes: int, drop):
    """Of what parplan's runtime rebuilds for a block's attention kernel (drop: parplan_mla_up_saved_bytes), the part
    that does not raise the block's backward peak: the unpack hook (or the selective checkpoint) rebuilds q, k and v
    when the kernel's backward starts, after the block's MLP backward has freed the MLP's saved tensors (3 ffn a token
    over tp: gate, up and their product), so they add to the block's working memory only where they outgrow those.
    Not under a zero-bubble pipeline, whose weight passes keep the MLP's inputs (queued closures, or torch's retained
    graph) past the attention's backward: there they count whole.  The CPU allocator traces of
    benchmarks/results/2026-12-05-cpu-memory-mla-recompute peak in the MLP's backward of the block being
    back-propagated, with no rebuilt q, k or v live."""
    mlp_saved = lay.mbs * m.seq_len / lay.cp * 3 * m.ffn / lay.tp * act_bytes
    return np.where(zero_bubble_pipe(lay), 0.0, np.minimum(drop, mlp_saved))


def activation_bytes_working_layer(m: ModelDims, lay, act_bytes: int, flash: bool, dropout: bool = False,
                                   sp_saves_gathered: bool = False, cp_saves_gathered_kv: bool = False,
                                   eager: bool = False, fp8: str = ""):
    """One block's activations without recompute (a block being recomputed or back-propagated)."""
    none = _replace(lay, recompute=np.zeros_like(np.asarray(lay.recompute)) + REC_NONE)
    return activation_bytes_per_layer(m, none, act_bytes, flash, dropout, sp_saves_gathered, cp_saves_gathered_kv,
                                      eager, fp8)


def rebuilt_bytes(work_layer, act_layer):
    """What a recomputed block rebuilds beyond what it saved: the no-recompute set less the saved set, never
    negative -- the saved tensors stay live while the rest is rebuilt, and op-level selective under SP saves the
    row-parallel outputs at full width, which outgrow the whole no-recompute set past tp ~ 8 for llama (the
    difference had gone negative and taken memory off the peak)."""
    return np.maximum(work_layer - act_layer, 0.0)


def backward_temporaries_per_layer(m: ModelDims, lay, act_bytes: int, flash: bool, dropout: bool = False,
                                   sp_saves_gathered: bool = False, cp_saves_gathered_kv: bool = False,
                                   eager: bool = False, fp8: str = ""):
    """Peak bytes a block's backward allocates beyond its saved activations and output gradient (one
    micro-batch), the weights' gradients aside.

    Flash attention: one block's activations (activation_bytes_working_layer), the bound the H100 grid
    was checked with.  An upper bound for parplan's own blocks on the GPU too: the CUDA allocator's
    counters over a 1.3B-class block (bf16, seq 2048, micro-batch 4; block_backward_memory.py --device
    cuda, benchmarks/results/2026-11-23-h100/block_backward.md) put the true peak 18 % (llama, the SwiGLU
    backward's five ffn-wide tensors) and 4x (gpt, one) lower without recompute, 9 % and 63 % with full
    recompute -- at most 0.4 GB, about 1 % of those runs' peaks, so the bound stays.

    Unfused attention (Megatron's 2021 GPT block, the published runs): the backward replayed op by op,
    each allocating its input gradients and then freeing its output gradient and the saved tensors it
    was the last to read.  In reverse: MLP dropout; fc2 (the GeLU output freed); GeLU (the fc1 output
    freed); fc1; the norm; the residual sum; attention dropout; the output projection; the
    probabilities x V batched matmul (its gradient of the dropped probabilities is a*s per token); the
    attention dropout; the softmax (Megatron's fused kernel writes its gradient in place); Q K^T.  The
    peak is at the MLP's start or at the a*s-sized score gradients, by which time the MLP's saved
    tensors are gone, so it is far below another block's activations where the scores dominate
    (s*b*h*(34 + 5as/h)).  Checked against the CPU allocator's trace of that block in plain torch
    (benchmarks/block_backward_memory.py; tests/test_backward_temporaries.py: within 0.4 % with and
    without full recompute).  llama's MLP is the SwiGLU (gate and up freed by the product's backward)."""
    if flash:
        return activation_bytes_working_layer(m, lay, act_bytes, flash, dropout, sp_saves_gathered,
                                              cp_saves_gathered_kv, eager, fp8)
    T = lay.mbs * m.seq_len / lay.cp
    tp = lay.tp
    a = act_bytes
    seq_split = np.where(lay.sp > 0, tp, 1)
    H = m.hidden / seq_split * a          # a hidden state outside the TP region
    Hfull = m.hidden * a                  # a column-parallel input / row-parallel output, whole sequence
    mask = m.hidden / seq_split if dropout else 0.0
    q, kv, f = m.q_width / tp * a, m.kv_width / tp * a, m.ffn / tp * a
    S = m.heads / tp * m.seq_len  # scores per token: a rank's query attends the whole sequence under cp too
    hd = H if dropout else 0.0
    sp = lay.sp > 0
    g = np.where(sp, Hfull, 0.0)          # SP: a row-parallel layer's output gradient gathered
    rs = np.where(sp, H, 0.0)             # SP: a column-parallel input gradient reduce-scattered
    llama = m.arch == "llama"
    # (allocated, freed) per op, in backward order; the output gradient dy (H) is live from the start
    ops = [(hd, mask)]                                          # MLP dropout: grad x mask
    if llama:
        ops += [(g + f, hd + g + f),                            # down: d(product); the product freed
                (2 * f, 3 * f),                                 # SwiGLU: d(gate), d(up); gate, up freed
                (2 * Hfull + rs, 2 * f + Hfull + (g + H))]      # gate, up: d(norm out), summed; norm out freed
    else:
        ops += [(g + f, hd + g + f),                            # fc2: d(GeLU out); GeLU output freed
                (f, 2 * f),                                     # GeLU: d(fc1 out); fc1 output freed
                (Hfull + rs, f + g + H)]                        # fc1: d(norm out); norm out freed
    ops += [(H, 2 * H),                                         # norm: d(x); d(norm out), norm in freed
            (H, 2 * H),                                         # residual sum with dy
            (hd, mask),                                         # attention-output dropout
            (g + q, hd + g + q),                                # output projection: d(ctx); ctx freed
            (S * a + kv, q + (S * a if dropout else 0.0)),      # P V: d(P), d(V); dropped P freed
            ((S * a, S * a + S) if dropout else (0.0, 0.0)),    # attention dropout: d(softmax out)
            (0.0, S * a),                                       # fused softmax, in place; its output freed
            (q + kv, S * a)]                                    # Q K^T: d(Q), d(K)
    live, peak = H * 0.0, H * 0.0
    for alloc, free in ops:
        live = live + alloc
        peak = np.maximum(peak, live)
        live = live - free
    return T * peak


def logits_bytes(m: ModelDims, lay, act_bytes: int, fused: bool = True, grad_16bit: bool = False):
    """Last stage, per micro-batch, the loss's peak (during its backward) and what stays saved for it
    while other micro-batches run (GPipe), T x V/tp logits each, plus the final norm's input/output:
      fused (Megatron's vocab-parallel cross-entropy): the 16-bit logits and the fp32 softmax the
        gradient is written into in place, act_bytes + 4 per logit; saved: the softmax, 4;
      fused with grad_16bit (flash-attn's cross-entropy, llm-foundry's default loss: it saves the 16-bit
        logits and a per-row fp32 log-sum-exp, and its backward writes the gradient in the logits' dtype,
        torch.empty_like(logits)): 2 x act_bytes per logit; saved: the logits, act_bytes;
      autograd over an fp32 upcast (parplan's runtime: F.cross_entropy(logits.float()); torchtitan):
        the saved fp32 log-softmax, the gradient arriving at it and the gradient it makes, 12 per
        logit (an H100 allocator snapshot of parplan launch, llama 0.5B micro-batch 4: the three
        1.05 GB tensors live at the allocated peak, benchmarks/results/2026-11-22-h100/snapshots);
        saved: the log-softmax, 4.
    Returns (peak, saved)."""
    T = lay.mbs * m.seq_len / lay.cp
    norm = 2 * m.hidden / np.where(lay.sp > 0, lay.tp, 1) * act_bytes
    logits = T * m.vocab / lay.tp
    if fused and grad_16bit:
        return logits * 2 * act_bytes + T * norm, logits * act_bytes + T * norm
    peak = logits * ((act_bytes + 4) if fused else 12) + T * norm
    return peak, logits * 4 + T * norm


def cached_logits_bytes(m: ModelDims, lay, act_bytes: int, tr) -> np.ndarray:
    """The 16-bit logits of one micro-batch that torch.distributed.pipelining's last stage keeps as its output
    (TrainingConsts.pipeline_keeps_logits) beside what logits_bytes counts: where the stage runs under a schedule
    (pp > 1) and the loss does not save those logits itself (all but the fused cross-entropy with a 16-bit gradient,
    which saves the same tensor).  A CPU allocator trace of parplan's runtime (a head stage without blocks, 1F1B,
    benchmarks/results/2026-12-06-cpu-memory-split) held them at the loss's peak beside the fp32 log-softmax, its
    gradient and the gradient it makes: 1 MiB of the 1.6 MiB its last rank read under the prediction."""
    if not tr.pipeline_keeps_logits or (tr.fused_cross_entropy and tr.cross_entropy_16bit_grad):
        return np.zeros(np.shape(lay.pp))
    T = lay.mbs * m.seq_len / lay.cp
    return np.where(np.asarray(lay.pp) > 1, T * m.vocab / lay.tp * act_bytes, 0.0)


def in_flight_microbatches(lay, m_micro):
    """Micro-batches whose activations the first pipeline rank holds at its peak, in units of
    (full stage = layers/pp blocks) x micro-batch.
      gpipe: all m; 1f1b: min(p, m) (Narayanan 2021 sec. 2.2);
      interleaved: (v*p + p - 1) chunk-micro-batches of L/(p*v) blocks (Megatron's warm-up count,
      = Korthikanti 2022 sec. 4.2.3's factor 1 + (p-1)/(p*v)), capped at m*v;
      interleaved-zb, zbv: p (torch.distributed.pipelining's orders; see rank_inflight)."""
    return rank_inflight(lay, m_micro)["first"][0][0]


def round_size(pp, m_micro):
    """Micro-batches per round of torch's interleaved schedules (ScheduleInterleaved1F1B and
    ScheduleInterleavedZeroBubble: number_of_rounds = max(1, m // p), microbatches_per_round =
    m // number_of_rounds, and they need m to be a multiple of the rounds): a chunk runs this many
    micro-batches before the rank moves to its next chunk.  p when m is a multiple of p (Megatron-LM's
    only case); m itself below 2p."""
    p, m = np.asarray(pp), np.asarray(m_micro)
    return np.where(m >= 1, m // np.maximum(1, m // np.maximum(p, 1)), p)


def runs_in_rounds(pp, m_micro):
    """Whether torch's interleaved schedules take m micro-batches over pp ranks: m a multiple of its max(1, m // pp)
    rounds ("must be a multiple of the number of rounds"); any m below 2 pp, 9 over pp 4 not."""
    p, m = np.asarray(pp), np.asarray(m_micro)
    return m % np.maximum(1, m // np.maximum(p, 1)) == 0


PEAK_POINTS_PER_BATCH = 4096  # interleaved_block_peak's candidate points x (p, v, m) triples evaluated at once


def interleaved_block_peak(layers: int, pp, vpp, m_micro, rank):
    """Peak over time of the blocks x micro-batches whose activations pipeline rank `rank` holds under
    interleaved 1F1B, each chunk weighed by its own blocks.  It differs from blocks x the warm-up count
    when the virtual stages are uneven (stage_layers: 126 layers on pp 16 x vpp 8 give stages 0 and 127
    no block, so rank 0's first chunk, which has the most micro-batches in flight, is empty).  Counted
    from the schedule's action order (Megatron-LM's, and torch.distributed.pipelining's
    ScheduleInterleaved1F1B), with g = round_size(p, m) micro-batches a round (p when m is a multiple of
    p, Megatron's only case): rank r runs W = min((v-1) g + 2 (p-1-r), m v) forwards, then pairs
    (forward W+i, backward i), then the rest of the backwards; forward j runs chunk (j // g) % v, backward
    i chunk v-1 - (i // g) % v.  The held weight after pair i's forward, D(i) = SF(W+1+i) - SB(i) (SF, SB:
    blocks summed over the first forwards, backwards), is periodic in i (period v g) and piecewise linear
    between the points where either chunk changes, so its maximum is at those points.  With even stages
    this is blocks x ((v-1) g + 2 (p-1-r) + 1) / v, Megatron's warm-up count v p + p - 1 - 2r at g = p."""
    p, v, m = np.asarray(pp), np.asarray(vpp), np.asarray(m_micro)
    r = np.broadcast_to(np.asarray(rank), np.broadcast(p, v, m).shape)
    p, v, m = (np.broadcast_to(x, r.shape) for x in (p, v, m))
    g = round_size(p, m)
    vmax = int(v.max()) if v.size else 1
    ks = np.arange(vmax).reshape((-1,) + (1,) * r.ndim)
    b = np.where(ks < v, virtual_stage_blocks(layers, p, v, r + ks * p), 0)  # chunk k's blocks
    b_rev = np.take_along_axis(b, np.clip(v - 1 - ks, 0, None), axis=0) * (ks < v)  # backward chunk order
    total = b.sum(axis=0)
    pre = np.concatenate([np.zeros((1,) + r.shape), np.cumsum(b, axis=0)])
    pre_rev = np.concatenate([np.zeros((1,) + r.shape), np.cumsum(b_rev, axis=0)])

    def summed(n, chunks, prefix):
        # blocks of the first n actions, chunk (j // g) % v of `chunks` for action j; n: (points,) + r.shape
        t = n % (v * g)
        q = np.minimum(t // g, vmax - 1)
        part = np.take_along_axis(prefix, q, axis=0) * g
        cur = np.take_along_axis(chunks, q, axis=0)
        return (n // (v * g)) * g * total + part + (t % g) * cur

    W = np.minimum((v - 1) * g + 2 * (p - 1 - r), m * v)
    steady = m * v - W
    best = summed((m * v)[None], b, pre)[0] * (steady <= 0)  # no steady state: every forward before a backward
    off = (-(W + 1)) % g
    # the candidate points c g, c g + off and the two before them, c < v + 2, taken together (a few
    # thousand values at a time: one call for a handful of (p, v, m) triples, as rank_inflight passes)
    per_call = max(1, PEAK_POINTS_PER_BATCH // max(r.size, 1))
    for c0 in range(0, vmax + 2, per_call):
        cg = np.arange(c0, min(c0 + per_call, vmax + 2)).reshape((-1,) + (1,) * r.ndim) * g
        i = np.clip(np.concatenate([cg, cg + off, cg - 1, cg + off - 1]), 0, np.maximum(steady - 1, 0))
        d = summed(W + 1 + i, b, pre) - summed(i, b_rev, pre_rev)
        best = np.where(steady > 0, np.maximum(best, d.max(axis=0)), best)
    return best


def middle_rank(pp, schedule):
    """The pipeline rank the "mid" kind stands for: the fullest middle rank, rank 1 (fewer micro-batches in
    flight further on), or under the zero-bubble schedules rank pp - 2 (more pending weight-gradient passes
    further on)."""
    zb = (np.asarray(schedule) == SCH_INTERLEAVED_ZB) | (np.asarray(schedule) == SCH_ZBV)
    return np.where(zb, np.maximum(np.asarray(pp) - 2, 1), 1)


@lru_cache(maxsize=256)
def zbv_order_moments(p: int, m: int, r: int, sizes: tuple | None = None
                      ) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """ZB-V's two peak moments on rank r of p with m micro-batches, walked along torch's own order
    (ScheduleZBVZeroBubble._calculate_single_rank_operations, torch 2.5-2.13, rewritten here without
    torch): it builds the order for max(2p - 1, m) micro-batches and drops the actions of those past m,
    so with fewer than 2p - 1 micro-batches the closed forms of rank_inflight (which hold from 2p - 1 on)
    count too many.  Returns (chunks held, chunks pending their weight pass, sends held to the step's
    end) at the moment with the most chunks held, then at the moment with the most pending, chunks in
    stage units (/ 2), as rank_inflight's moments.  sizes: a plan's own split (every virtual stage's blocks,
    layout.model_split_sizes), whose two chunks on rank r may differ: each chunk's micro-batches then weigh its
    blocks over the rank's mean chunk (its blocks / 2), so the units stay the rank's blocks x micro-batch and the
    moments are those with the most blocks held and pending (a CPU allocator trace of 1, 1, 1, 2, 1, 1, 1, 0 on
    pp 4: rank 0 holds seven micro-batches of its one-block chunk and one of its empty one, not four of each)."""
    n_micro, st0, st1, last = max(2 * p - 1, m), r, 2 * p - 1 - r, 2 * p - 1
    ops: list[tuple[str, int, int]] = []  # (F | I | W, stage, micro-batch)
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - r) - 1):
        ops.append(("F", st0, f0)); f0 += 1
    for _ in range(r):
        ops.append(("F", st1, f1)); f1 += 1
        ops.append(("F", st0, f0)); f0 += 1
    for _ in range(p - r):
        ops += [("F", st1, f1), ("I", st1, b1), ("W", st1, b1)]; f1 += 1; b1 += 1
    while f1 < f0 or f0 < n_micro:
        if f0 < n_micro:
            ops.append(("F", st0, f0)); f0 += 1
        ops += [("I", st0, b0), ("W", st0, b0), ("F", st1, f1), ("I", st1, b1), ("W", st1, b1)]
        b0 += 1; f1 += 1; b1 += 1
    w0, w1 = b0, b1
    for _ in range(r):
        ops += [("I", st0, b0), ("I", st1, b1)]; b0 += 1; b1 += 1
    for _ in range(p - r):
        ops += [("I", st0, b0), ("W", st0, w0)]; b0 += 1; w0 += 1
    ops += [("W", st1, k) for k in range(w1, b1)] + [("W", st0, k) for k in range(w0, b0)]
    rank_of = lambda st: st if st < p else last - st  # noqa: E731  (the V: rank r holds r and 2p-1-r)
    weight = {st0: 1.0, st1: 1.0}
    if sizes is not None and sizes[st0] + sizes[st1] > 0:
        weight = {st: 2 * sizes[st] / (sizes[st0] + sizes[st1]) for st in (st0, st1)}
    act = pend = held = 0
    most_act = most_pend = (0, 0, 0)
    for kind, st, mb in ops:
        if mb >= m:
            continue
        act += weight[st] * (kind == "F")
        pend += weight[st] * ((kind == "I") - (kind == "W"))
        act -= weight[st] * (kind == "W")
        if kind == "I":
            held += (st != 0 and rank_of(st - 1) != r) + (st != last and rank_of(st + 1) != r)
        now = (act, pend, held)
        most_act = max(most_act, now)
        most_pend = max(most_pend, (pend, act, held))
    a1, w1_, h1 = most_act
    w2, a2, h2 = most_pend
    return (a1 / 2, w1_ / 2, float(h1)), (a2 / 2, w2 / 2, float(h2))


def zbv_chunk_sizes(layers, p: int) -> tuple | None:
    """The blocks of ZB-V's 2p virtual stages (a plan's own split, a tuple, or the default split of a block count:
    layout.stage_layers) where some rank's two chunks (r and 2p - 1 - r) differ, else None (the closed forms of
    rank_inflight hold)."""
    if layers is None:
        return None
    sizes = tuple(layers) if isinstance(layers, tuple) else tuple(stage_layers(int(layers), 2 * p))
    return sizes if any(sizes[r] != sizes[2 * p - 1 - r] for r in range(p)) else None


def zbv_counts(p: int, m: int, kind: str, sizes: tuple | None) -> np.ndarray:
    """zbv_order_moments of a rank kind ("first": rank 0, "last": rank p - 1, "mid": rank max(p - 2, 1), or with
    unequal chunks (sizes) the largest of ranks 1 .. p - 2, count by count), as a (moment, count) array.  From
    2p + 1 micro-batches on the walk's held and pending chunks stay those of 2p + 1 and the sends held grow by the
    same number each micro-batch, so m's are those of 2p + 1 and 2p + 2, extended (the walk itself agrees on every
    m up to 10p + 6, p 3-8, for the default and hand-made splits tried): a search's many m cost two walks."""
    if kind != "mid":
        ranks = [0 if kind == "first" else p - 1]
    else:
        ranks = list(range(1, p - 1)) if sizes is not None and p > 2 else [max(p - 2, 1)]
    counts = []
    for r in ranks:
        if m <= 2 * p:
            counts.append(np.array(zbv_order_moments(p, m, r, sizes)))
            continue
        a = np.array(zbv_order_moments(p, 2 * p + 1, r, sizes))
        b = np.array(zbv_order_moments(p, 2 * p + 2, r, sizes))
        a[:, 2] += (b[:, 2] - a[:, 2]) * (m - 2 * p - 1)
        counts.append(a)
    return np.max(counts, axis=0)


def izb_order_moments(p: int, v: int, m: int, r: int, sizes: tuple | None = None, output_sends_released: bool = False
                      ) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """Interleaved zero-bubble's two peak moments on rank r of p (v chunks a rank, m micro-batches), walked along
    torch's own order (ScheduleInterleavedZeroBubble._calculate_single_rank_operations with _get_1f1b_rank_ops, torch
    2.5-2.13, rewritten here without torch and as arrays; the bubbles torch adds move no action of a rank): g = m //
    max(1, m // p) micro-batches a round, W = min((v-1) g + p-1-r, m v) warm-up forwards, then per step a forward,
    an input-gradient pass and, from the (r+1)-th step on, the weight pass of the step r before, then the cool-down's
    input passes with their weight passes, then the r weight passes left; forward j runs chunk (j // g) % v, the
    input pass of step j chunk v-1 - ((j - W) // g) % v.  Returns (held, pending, sends held) at the moment with the
    most held, then at the moment with the most pending, in stage units (chunk-micro-batches / v), as rank_inflight's
    moments.  sizes: every virtual stage's blocks (a plan's own split or the default split of a block count), whose
    chunks on rank r may differ: each chunk's micro-batches then weigh its blocks over the rank's mean chunk, so the
    units stay the rank's blocks x micro-batch (as zbv_order_moments).  With equal chunks the walk gives the closed
    forms of rank_inflight (tests/test_stage_split.py).  izb_ranks_moments walks several ranks at once."""
    out = izb_ranks_moments(p, v, m, (r,), sizes, output_sends_released)[0]
    return tuple(map(float, out[0])), tuple(map(float, out[1]))


@lru_cache(maxsize=256)
def izb_ranks_moments(p: int, v: int, m: int, ranks: tuple, sizes: tuple | None = None,
                      output_sends_released: bool = False) -> np.ndarray:
    """izb_order_moments of each of `ranks`, as a (rank, moment, count) array: every rank's actions laid out as a row
    (padded with actions that change nothing), summed along it, and each row's two moments picked together."""
    r = np.asarray(ranks).reshape(-1, 1)
    g = m // max(1, m // p)
    warm = np.minimum((v - 1) * g + p - 1 - r, m * v)
    ops = np.arange(m * v + int(warm.max())).reshape(1, -1)  # every rank's steps, past its own end padded
    live = ops < m * v + warm
    # per step: [forward, input pass, weight pass of step - r], each where it runs
    kind = np.broadcast_to(np.arange(3), ops.shape + (3,))
    back = v - 1 - ((ops - warm) // g) % v
    chunk = np.stack([np.broadcast_to((ops // g) % v, back.shape), back, v - 1 - ((ops - r - warm) // g) % v], axis=-1)
    runs = np.stack([np.broadcast_to(ops < m * v, back.shape), (ops >= warm) & live, (ops - warm >= r) & live],
                    axis=-1)
    n_rows = len(ranks)
    kind, chunk, runs = (x.reshape(n_rows, -1) for x in (np.broadcast_to(kind, chunk.shape), chunk, runs))
    # the r weight passes left at the end (steps warm + m v - r .. warm + m v - 1), after every row's steps
    rmax = int(r.max())
    k_tail = np.arange(rmax).reshape(1, -1)
    tail_runs = k_tail < r
    tail_chunk = v - 1 - ((m * v - r + k_tail) // g) % v
    kind = np.concatenate([kind, np.full((n_rows, rmax), 2)], axis=1)
    chunk = np.concatenate([chunk, np.broadcast_to(tail_chunk, (n_rows, rmax))], axis=1)
    runs = np.concatenate([runs, np.broadcast_to(tail_runs, (n_rows, rmax))], axis=1)
    weight = np.ones((n_rows, v))
    if sizes is not None:
        own = np.array([[sizes[k * p + q] for k in range(v)] for q in ranks], dtype=float)
        total = own.sum(axis=1, keepdims=True)
        weight = np.where(total > 0, own * v / np.maximum(total, 1e-300), 1.0)
    w = np.take_along_axis(weight, chunk, axis=1) * runs
    stage = chunk * p + r
    act = np.cumsum(np.where(kind == 0, w, 0.0) - np.where(kind == 2, w, 0.0), axis=1)
    pend = np.cumsum(np.where(kind == 1, w, 0.0) - np.where(kind == 2, w, 0.0), axis=1)
    # an input pass sends its input gradient (not virtual stage 0's) and lets go of nothing; the stage output's send
    # (not the last virtual stage's) is held to the step's end unless the runtime releases it at this backward
    sent = (stage != 0).astype(float) + (0.0 if output_sends_released else (stage != p * v - 1))
    held = np.cumsum(np.where((kind == 1) & runs, sent, 0.0), axis=1)
    a_r, p_r = np.round(act, 9), np.round(pend, 9)

    def moment(first, second):
        # the most `first`, then the most `second`, then the most sends (the latest such moment), per row
        top = first == first.max(axis=1, keepdims=True)
        s2 = np.where(top, second, -np.inf)
        top &= s2 == s2.max(axis=1, keepdims=True)
        i = np.where(top, held, -np.inf).argmax(axis=1)[:, None]
        return np.concatenate([np.take_along_axis(x, i, axis=1) for x in (act / v, pend / v, held)], axis=1)
    return np.stack([moment(a_r, p_r), moment(p_r, a_r)], axis=1)


def izb_chunk_sizes(layers, p: int, v: int) -> tuple | None:
    """The blocks of interleaved zero-bubble's p v virtual stages (a plan's own split, a tuple, or the default split of
    a block count) where some rank's chunks (r, r + p, ...) differ, else None (the closed forms of rank_inflight
    hold)."""
    if layers is None or v < 2:
        return None
    sizes = tuple(layers) if isinstance(layers, tuple) else tuple(stage_layers(int(layers), p * v))
    if len(sizes) != p * v:
        return None
    return sizes if any(len({sizes[k * p + r] for k in range(v)}) > 1 for r in range(p)) else None


def izb_counts(p: int, v: int, m: int, kind: str, sizes: tuple | None, output_sends_released: bool = False
               ) -> np.ndarray:
    """izb_order_moments of a rank kind ("first": rank 0, "last": rank p - 1, "mid": rank max(p - 2, 1), or with
    unequal chunks the largest of ranks 1 .. p - 2, count by count), as a (moment, count) array."""
    table = izb_rank_table(p, v, m, sizes, output_sends_released)
    if kind != "mid":
        return table[0 if kind == "first" else p - 1]
    return table[1:p - 1].max(axis=0) if sizes is not None and p > 2 else table[max(p - 2, 1)]


@lru_cache(maxsize=512)
def izb_rank_table(p: int, v: int, m: int, sizes: tuple | None, output_sends_released: bool = False) -> np.ndarray:
    """izb_order_moments of every rank 0 .. p - 1, as a (rank, moment, count) array, walked at once.  Where m is a
    multiple of p from IZB_WALKED_ROUNDS + 2 rounds on, a round more (p micro-batches) adds one period of v p steps to
    the steady state, which moves every later moment by a period and adds its sends, so the held and pending chunks
    stay those of IZB_WALKED_ROUNDS rounds and the sends held grow by the same number each round: two walks,
    extended (tests/test_stage_split.py)."""
    ranks = tuple(range(p))
    if m % p or m < (IZB_WALKED_ROUNDS + 2) * p:
        return izb_ranks_moments(p, v, m, ranks, sizes, output_sends_released)
    a, b = (izb_ranks_moments(p, v, k * p, ranks, sizes, output_sends_released)
            for k in (IZB_WALKED_ROUNDS, IZB_WALKED_ROUNDS + 1))
    a = np.array(a)
    a[..., 2] += (b[..., 2] - a[..., 2]) * (m // p - IZB_WALKED_ROUNDS)
    return a


# izb_rank_table walks IZB_WALKED_ROUNDS and one more rounds of p micro-batches and extends them to any multiple of p
IZB_WALKED_ROUNDS = 3


def _scatter(x, shape, where, values) -> np.ndarray:
    """x broadcast to shape, as floats, with `values` at the rows `where` marks."""
    x = np.array(np.broadcast_to(x, shape), dtype=float)
    x[where] = values
    return x


def rank_inflight(lay, m_micro, layers: int | None = None, output_sends_released: bool = False) -> dict:
    """Per pipeline rank kind ("first", "mid" = the fullest middle rank, "last"), the peak moments as
    (micro-batches whose saved activations are held, micro-batches whose weight-gradient pass is
    pending, in stage units (layers/pp blocks x micro-batch); tensors sent and held to the step's end,
    see held()); two moments per rank, the worse counts.
    Counted from the schedules' action orders (rank r of p, v stages per rank, m micro-batches):
      gpipe: m everywhere; 1f1b: p - r; interleaved 1F1B: v*p + p - 1 - 2r chunk-micro-batches
      (Megatron's warm-up count for r = 0; torch.distributed.pipelining's order gives the same), and
      (v-1)*g + 2(p-1-r) + 1 with torch's g = round_size(p, m) micro-batches a round where m is not a
      multiple of p (torch runs those; Megatron-LM does not);
      zero-bubble schedules split the backward into an input-gradient pass (I) and a deferred
      weight-gradient pass (W), and a block waiting for its W keeps its activations and the
      gradients of its linear layers' outputs (pending_w_bytes_per_layer; under parplan's queued weight passes
      its linears' inputs and output gradients only, queued_w_bytes_per_layer).  In torch's orders
      (ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, simulated action by action):
      interleaved-zb: v*p chunk-micro-batches on every rank, r + 1 of them pending; (v-1)*g + p where m is
      not a multiple of p (m >= p: torch's rounds of g = round_size(p, m); below p the held sends differ);
      zbv (v = 2): 2p chunks with 1 pending on every rank, and on rank r >= 1 also p + r chunks with
      2r + 1 pending (its cool-down runs r input passes of both chunks before their W passes), from
      2p - 1 micro-batches on; with fewer (the search allows m = p), torch's order is walked
      (zbv_order_moments).
    A CPU allocator trace of pp 4 x 8 micro-batches found exactly these counts
    (benchmarks/results/2026-11-23-cpu-memory).  output_sends_released (parplan's runtime under the looped
    schedules, parallel_layers.pipeline.release_output_sends): a stage output's send is let go at its
    backward, so only the input gradients sent stay held."""
    p, v, m = np.asarray(lay.pp, dtype=float), np.asarray(lay.vpp, dtype=float), np.asarray(m_micro, dtype=float)
    sch = np.asarray(lay.schedule)
    zero = np.zeros(np.broadcast(p, v, m, sch).shape)

    shape = zero.shape
    pb, vb, mb = (np.broadcast_to(x, shape) for x in (p, v, m))
    # uneven virtual stages (layers not a multiple of p v): the peak, simulated in closed form
    # (interleaved_block_peak), depends on (p, v, m) alone, so it is computed once per distinct triple
    uneven = np.broadcast_to(sch == SCH_INTERLEAVED, shape) & (layers is not None)
    if isinstance(layers, tuple):  # a plan's own split (layout.model_split_sizes)
        uneven = uneven & (len(set(layers)) > 1)
    else:
        uneven = uneven & ((layers or 0) % np.maximum(pb * vb, 1) != 0)
    if uneven.any():
        keys, where = np.unique(np.stack([pb[uneven], vb[uneven], mb[uneven]]).astype(int), axis=1,
                                return_inverse=True)
        where = where.reshape(-1)

    g = round_size(p, m)  # torch's micro-batches a round of the interleaved schedules: p where m is a multiple

    def interleaved(r):
        """r: rank 0, 1 or p - 1 (the kinds' ranks), as the function of p it is."""
        even = np.minimum((v - 1) * g + 2 * (p - 1 - r(p)) + 1, m * v) / v
        if not uneven.any():
            return even
        up, uv, um = keys
        ur = r(up)
        peak = interleaved_block_peak(layers, up, uv, um, ur)
        blocks = sum(virtual_stage_blocks(layers, up, uv, ur + k * up) * (k < uv) for k in range(int(uv.max())))
        out = np.array(np.broadcast_to(even, shape), dtype=float)
        has = (blocks > 0)[where]  # a rank without a block keeps the even count (it holds nothing per block)
        out[uneven] = np.where(has, (peak / np.maximum(blocks, 1))[where], out[uneven])
        return out

    def pick(gpipe, onef1b, inter, izb, zbv):
        out = np.where(sch == SCH_GPIPE, gpipe, onef1b)
        out = np.where(sch == SCH_INTERLEAVED, inter, out)
        out = np.where(sch == SCH_INTERLEAVED_ZB, izb, out)
        return np.where(sch == SCH_ZBV, zbv, out) + zero

    full = np.minimum(p, m)
    # interleaved-zb in torch's rounds of g: (v-1) g + p chunks held, r + 1 pending (at most all m v)
    izb_act = np.minimum(((v - 1) * g + p) / v, m)

    def izb_pend(r):
        return np.minimum(r + 1, m * v) / v
    # the fullest middle rank (middle_rank): rank 1, or p - 2 under the zero-bubble schedules, whose
    # counts below use mid_r
    mid_r = np.maximum(p - 2, 1)
    i_first = interleaved(lambda q: 0 * q)
    i_mid = interleaved(lambda q: np.minimum(1, q - 1))
    i_last = interleaved(lambda q: q - 1)

    def backwards_of_chunk(n, k):
        # among the first n backward (or input-gradient) passes, chunk v-1 - (i // g) % v for pass i
        return (n // (v * g)) * g + np.clip(n % (v * g) - (v - 1 - k) * g, 0, g)

    def sends(n, r):
        # each finished backward freed a stage output that was sent (not the last virtual stage's) and
        # made an input gradient that was sent (not virtual stage 0's); ZB-V's rank 0 holds both ends
        # and rank p - 1 the two middle stages, which pass to each other on the rank: one send each
        zbv_one = (r == 0) | (r == p - 1)
        looped = (2 * n - np.where(r == 0, backwards_of_chunk(n, 0), 0)
                  - np.where(r == p - 1, backwards_of_chunk(n, v - 1), 0))
        if output_sends_released:  # parplan's runtime lets a stage output's send go at its backward
            looped = n - np.where(r == 0, backwards_of_chunk(n, 0), 0)
        return np.where(sch == SCH_ZBV, np.where(zbv_one, n, 2 * n), looped)

    def held(r, zbv_late=False):
        """Sends finished before rank r's peak and held to the step's end (torch's action-list runtime),
        counted from torch's orders: interleaved 1F1B peaks at its last steady pair, after
        m v - W - 1 backwards; interleaved-zb at its last steady input pass, after m v - ((v-1) g + p) + 1
        + r (g: round_size); ZB-V after 2m - 3p + 2 + r in its steady state, and in its cool-down (rank r >= 1) after
        2m - p + 1 + r."""
        inter = m * v - np.minimum((v - 1) * g + 2 * (p - 1 - r), m * v) - 1
        izb = m * v - ((v - 1) * g + p) + 1 + r
        zbv = 2 * m - (p - 1 - r if zbv_late else 3 * p - 2 - r)
        n = pick(0, 0, inter, izb, zbv)
        return sends(np.clip(n, 0, m * v), r)

    held_mid = held(middle_rank(p, sch))
    held_last = held(p - 1)
    first = (pick(m, full, i_first, izb_act, full), pick(0, 0, 0, izb_pend(0), 0.5), held(0 * p))
    mid = (pick(m, np.minimum(p - 1, m), i_mid, izb_act, full), pick(0, 0, 0, izb_pend(mid_r), 0.5), held_mid)
    last = (pick(m, 1, i_last, izb_act, full), pick(0, 0, 0, izb_pend(p - 1), 0.5), held_last)
    # ZB-V's second moment, in its cool-down (the other schedules: the first again)
    mid_zbv = (pick(m, np.minimum(p - 1, m), i_mid, izb_act, (p + mid_r) / 2),
               pick(0, 0, 0, izb_pend(mid_r), (2 * mid_r + 1) / 2),
               np.where(sch == SCH_ZBV, held(mid_r, zbv_late=True), held_mid))
    last_zbv = (pick(m, 1, i_last, izb_act, (2 * p - 1) / 2), pick(0, 0, 0, izb_pend(p - 1), (2 * p - 1) / 2),
                np.where(sch == SCH_ZBV, held(p - 1, zbv_late=True), held_last))
    out = {"first": [first, first], "mid": [mid, mid_zbv], "last": [last, last_zbv]}
    # ZB-V where the closed forms above do not hold: torch's order, walked (zbv_order_moments), with fewer than 2p - 1
    # micro-batches, and where a rank's two chunks differ in blocks (the default split of a block count not a multiple
    # of 2p, or a plan's own split: zbv_chunk_sizes), whose micro-batches the walk weighs by their blocks (zbv_counts).
    # With unequal chunks the middle kind takes, count by count, the largest of the middle ranks' (the rank with the
    # most blocks in its first chunk holds the most at ZB-V's warm-up: a CPU allocator trace of 10 blocks on pp 4,
    # chunks 2 + 1 on ranks 1 and 2, read rank 1 at 182.6 MiB and rank 2 at 175.4, where the closed form's rank 2
    # gave 155.3 for both)
    zbv_rows = np.broadcast_to((sch == SCH_ZBV) & (p > 1), shape)
    if zbv_rows.any():
        chunks = {q: zbv_chunk_sizes(layers, q) for q in np.unique(pb[zbv_rows]).astype(int)}
        uneven_p = np.isin(pb, [q for q, c in chunks.items() if c is not None])
        walk = zbv_rows & ((mb < 2 * pb - 1) | uneven_p)
        if walk.any():
            pairs, which = np.unique(np.stack([pb[walk], mb[walk]]).astype(int), axis=1, return_inverse=True)
            which = which.reshape(-1)
            for kind in ("first", "mid", "last"):
                # per distinct (p, m): [moment][count], scattered onto the walked rows
                table = np.array([zbv_counts(int(q), int(n), kind, chunks[int(q)]) for q, n in pairs.T])
                out[kind] = [tuple(_scatter(x, shape, walk, table[which, k, j]) for j, x in enumerate(mom))
                             for k, mom in enumerate(out[kind])]
    # interleaved zero-bubble where a rank's chunks differ in blocks (the default split of a block count not a multiple
    # of p v, or a plan's own split): torch's order walked, each chunk's micro-batches weighed by its blocks (a CPU
    # allocator trace of 10 blocks on pp 4 x vpp 2 read the largest rank -15.4 % while its chunks counted alike)
    izb_rows = np.broadcast_to((sch == SCH_INTERLEAVED_ZB) & (p > 1) & (v > 1), shape)
    if izb_rows.any():
        keys_pv = {(int(q), int(k)) for q, k in zip(pb[izb_rows], vb[izb_rows])}
        chunks = {key: izb_chunk_sizes(layers, *key) for key in keys_pv}
        # (the rows torch runs: m >= p and a multiple of its rounds; the others, refused by the search's schedule rule,
        # keep the closed forms)
        runs = (mb >= pb) & (np.mod(mb, np.maximum(1, mb // np.maximum(pb, 1))) == 0)
        uneven_pv = np.zeros(shape, dtype=bool)
        for (q, k), c in chunks.items():
            if c is not None:
                uneven_pv |= (pb == q) & (vb == k)
        walk = izb_rows & runs & uneven_pv
        if walk.any():
            triples, which = np.unique(np.stack([pb[walk], vb[walk], mb[walk]]).astype(int), axis=1,
                                       return_inverse=True)
            which = which.reshape(-1)
            for kind in ("first", "mid", "last"):
                table = np.array([izb_counts(int(q), int(k), int(n), kind, chunks[(int(q), int(k))],
                                             output_sends_released) for q, k, n in triples.T])
                out[kind] = [tuple(_scatter(x, shape, walk, table[which, kk, j]) for j, x in enumerate(mom))
                             for kk, mom in enumerate(out[kind])]
    return out


def pending_w_bytes_per_layer(m: ModelDims, lay, act_bytes: int, flash: bool, dropout: bool = False,
                              sp_saves_gathered: bool = False, cp_saves_gathered_kv: bool = False,
                              eager: bool = False, fp8: str = ""):
    """Bytes one block holds for one micro-batch while its weight-gradient pass is pending (zero-bubble
    schedules), beyond its saved activations: the gradient of every linear layer's output (dW = dY^T X),
    q, k, v (TP-split), the attention and MLP output projections (h: with SP too, since the row-parallel
    matmul's output is the whole sequence, reduce-scattered after it, and its gradient is gathered back
    before dW; a CPU allocator trace of ZB-V with SP found these live) and the MLP's first layer(s)
    (gate and up, or fc1; TP-split), and under recomputation the re-run block's activations, kept from
    the input-gradient pass to the weight-gradient pass."""
    T = lay.mbs * m.seq_len / lay.cp
    mlp_in = 2 * m.ffn if m.arch == "llama" else m.ffn
    grads = T * ((m.q_width + 2 * m.kv_width + mlp_in) / lay.tp + 2 * m.hidden) * act_bytes
    saves = (sp_saves_gathered, cp_saves_gathered_kv, eager, fp8)
    recomputed = rebuilt_bytes(activation_bytes_working_layer(m, lay, act_bytes, flash, dropout, *saves),
                               activation_bytes_per_layer(m, lay, act_bytes, flash, dropout, *saves))
    return grads + recomputed


def queued_w_bytes_per_layer(m: ModelDims, lay, act_bytes: int, fp8: str = ""):
    """Bytes one block holds for one micro-batch while its weight-gradient pass is pending, where that pass runs
    from queued closures (TrainingConsts.zb_weight_grad_store; the input-gradient pass freed the block's graph):
    each linear's input X and output gradients dY (dW = dY^T X).  Inputs: the attention's and the MLP's norm
    outputs (h, or h/tp under SP, whose gather the weight pass repeats), the attention's output (q width / tp)
    and the MLP's activation (ffn / tp); the gradients as pending_w_bytes_per_layer's, held as their E5M2 copies
    (1 byte) under parplan's FP8 linears (fp8 "parplan": parallel_layers.fp8.cast_grads)."""
    T = lay.mbs * m.seq_len / lay.cp
    mlp_in = 2 * m.ffn if m.arch == "llama" else m.ffn
    norm_out = np.where(lay.sp > 0, m.hidden / lay.tp, m.hidden)
    inputs = 2 * norm_out + (m.o_width + m.ffn) / lay.tp
    grads = (m.q_width + 2 * m.kv_width + mlp_in) / lay.tp + 2 * m.hidden
    return T * (inputs * act_bytes + grads * (1 if fp8 == "parplan" else act_bytes))


def weight_pass_queued(tr, zero):
    """Whether a zero-bubble weight pass would run from queued closures, by ZeRO stage: parplan's runtime outside
    FSDP2 (TrainingConsts.zb_weight_grad_store)."""
    return (np.asarray(zero) < 3) & bool(tr.zb_weight_grad_store)


def zero_bubble_pipe(lay):
    """A zero-bubble schedule over a pipeline (pp > 1): its weight passes run apart from the input-gradient passes."""
    return ((lay.schedule == SCH_INTERLEAVED_ZB) | (lay.schedule == SCH_ZBV)) & (np.asarray(lay.pp) > 1)


def queued_weight_pass(lay, tr):
    """Where a zero-bubble schedule's weight passes run from queued closures (queued_w_bytes_per_layer): over a
    pipeline, where weight_pass_queued (the runtime's rule for one plan: compute.queued_weight_pass_plan)."""
    return zero_bubble_pipe(lay) & weight_pass_queued(tr, lay.zero)


def torch_weight_pass(lay, tr):
    """Where torch's own weight pass runs (a zero-bubble pipeline's passes not queued: compute.torch_weight_pass_plan),
    which runs no hook: no fused gradient accumulation, no gradient reduction started during it."""
    return zero_bubble_pipe(lay) & ~queued_weight_pass(lay, tr)


def fsdp2_flags(lay, tr):
    """(FSDP2 ZeRO-3, FSDP2 ZeRO-3 inside a pipeline: gathered weights kept through the step)."""
    fsdp2 = (lay.zero >= 3) & tr.zero3_fsdp2
    return fsdp2, fsdp2 & (np.asarray(lay.pp) > 1)


def fsdp2_offload(lay, tr, flags=None):
    """FSDP2 ZeRO-3 under optimizer offload: CPUOffloadPolicy, its parameter and gradient shards on the host.
    flags: fsdp2_flags, where the caller has them."""
    fsdp2 = (fsdp2_flags(lay, tr) if flags is None else flags)[0]
    return np.asarray(fsdp2) & (np.asarray(lay.offload) > 0)  # arrays: callers negate it


def rank_blocks(m: ModelDims, lay):
    """(model_rank_block_counts, rank_dense_blocks) of the layout's first, middle and last rank: what rank_params,
    rank_block_params and rank_expert_params read, computed once where a caller needs several of them (over a
    search's candidates, both once per distinct (pp, vpp, schedule), the only fields either reads, then scattered)."""
    pp, vpp, sch = np.asarray(lay.pp), np.asarray(lay.vpp), np.asarray(lay.schedule)
    if pp.ndim == 1 and pp.shape == vpp.shape == sch.shape and pp.size >= 4096:
        first, where = distinct_rows(pp, vpp, sch)
        counts, dense = rank_blocks(m, SimpleNamespace(pp=pp[first], vpp=vpp[first], schedule=sch[first]))
        return (tuple(np.asarray(x)[where] for x in counts),
                tuple(np.asarray(x)[where] for x in dense) if m.mixed else dense)
    return (model_rank_block_counts(m, pp, lay.vpp, lay.schedule),
            rank_dense_blocks(m, lay.pp, lay.vpp, lay.schedule))


def rank_params(m: ModelDims, lay, blocks=None, block_params=None):
    """Parameters per GPU on pipeline rank 0 (embedding; the head too without a pipeline or under ZB-V,
    whose V puts both ends on rank 0), the heaviest middle rank, and the last rank (the head).  blocks:
    rank_blocks, block_params: rank_block_params, where the caller has them."""
    pp = np.asarray(lay.pp)
    b_first, b_mid, b_last = rank_block_params(m, lay, blocks) if block_params is None else block_params
    head = head_params_per_gpu(m, lay.tp, pp)
    head_first = head_on_first_rank(lay)
    p_first = b_first + embedding_params_per_gpu(m, lay.tp) + np.where(head_first, head, 0.0)
    p_last = b_last + np.where(head_first & (pp > 1), 0.0, head)
    return p_first, b_mid, p_last


def rank_block_params(m: ModelDims, lay, blocks=None):
    """Of rank_params, the blocks' (first, middle and last rank): each block's layer_params_per_gpu, a mixture of
    experts' dense blocks (ModelDims.mixed; rank_dense_blocks) at their own.  blocks: rank_blocks, where the caller
    has them."""
    counts = model_rank_block_counts(m, np.asarray(lay.pp), lay.vpp, lay.schedule) if blocks is None else blocks[0]
    per_layer = layer_params_per_gpu(m, lay.tp, lay.ep)
    if not m.mixed:
        return tuple(b * per_layer for b in counts)
    dense = rank_dense_blocks(m, lay.pp, lay.vpp, lay.schedule) if blocks is None else blocks[1]
    per_dense = layer_params_per_gpu(m.dense_dims(), lay.tp)
    return tuple((b - d) * per_layer + d * per_dense for b, d in zip(counts, dense))


def rank_expert_params(m: ModelDims, lay, blocks=None):
    """Of rank_params, the experts' (a mixture of experts'; zeros for a dense model): first, middle and last rank.
    blocks: rank_blocks, where the caller has them."""
    if not m.moe:
        return 0.0, 0.0, 0.0
    per_layer = moe.expert_params_per_gpu(m, lay.ep)
    counts, dense = rank_blocks(m, lay) if blocks is None else blocks
    return tuple((b - d) * per_layer for b, d in zip(counts, dense))


def expert_scales(lay, tr, shards=None, flags=None) -> tuple:
    """What expert_state_params, expert_weight_params and expert_grad_params read of the layout, each one's scale of
    an expert weight less one, and expert_states_weights' coefficient of the gathered copies: computed once where a
    rank's several parameter counts are priced alike (states_floor, memory_breakdown).  shards: zero_shards, flags:
    fsdp2_flags, where the caller has them."""
    shards = zero_shards(lay, tr) if shards is None else shards
    _, z3_full = fsdp2_flags(lay, tr) if flags is None else flags
    ratio = shards / moe.expert_shards(lay)
    zero = np.asarray(lay.zero)
    return (np.where(zero >= 1, ratio, 1.0) - 1.0, np.where(zero >= 3, ratio, 1.0) - 1.0,
            np.where(grads_sharded(lay, tr, z3_full), ratio, 1.0) - 1.0,
            np.where(z3_full, PRECISION_RECIPES[tr.precision]["weight"], 0.0))


def expert_state_params(params, experts, lay, tr, scales=None):
    """The parameter count whose optimizer states (model_state_coefficients' optimizer and offloaded bytes) a rank
    holds, where `experts` of its `params` are a mixture of experts' expert weights: ZeRO shards the dense states over
    zero_shards ranks and the experts' over their own data-parallel group (moe.expert_data_parallel: Megatron's
    distributed optimizer over the expert-data-parallel group), so an expert weight weighs zero_shards / that as
    much.  scales: expert_scales, where the caller has them."""
    return params + experts * (expert_scales(lay, tr) if scales is None else scales)[0]


def expert_weight_params(params, experts, lay, tr, scales=None):
    """The parameter count whose stored (sharded) weights a rank holds, where `experts` of its `params` are a mixture
    of experts' expert weights: ZeRO-3 shards the dense weights over zero_shards ranks and, as parplan's runtime does
    (FSDP2, torchtitan's layout: each MoE layer's experts a unit of their own over torchtitan's edp_mesh,
    parallel_layers.data_parallel.shard_experts), the experts' over their own data-parallel group
    (moe.expert_data_parallel), so an expert weight weighs zero_shards / that as much; below ZeRO-3 every weight is
    whole.  (FSDP2's gathered copies inside a pipeline are whole either way: expert_states_weights.)  scales:
    expert_scales, where the caller has them."""
    return params + experts * (expert_scales(lay, tr) if scales is None else scales)[1]


def expert_states_weights(params, experts, lay, tr, cw, scales=None):
    """The weight bytes of `params` (`experts` of them expert weights) at weight coefficient cw
    (model_state_coefficients): the stored part by expert_weight_params, FSDP2's gathered copies inside a pipeline
    (fsdp2_flags' z3_full) of every parameter whole.  scales: expert_scales, where the caller has them."""
    scales = expert_scales(lay, tr) if scales is None else scales
    gathered = scales[3]
    return params * gathered + expert_weight_params(params, experts, lay, tr, scales) * (cw - gathered)


def grads_sharded(lay, tr, z3_full=None):
    """Where a rank's gradients are held sharded over the ZeRO group (model_state_coefficients): ZeRO-3 outside
    FSDP2's gathered pipeline copies, and ZeRO-2 reducing them as they are produced (zero2_each_microbatch).  ZeRO-2
    reduced once a step (parplan's runtime) holds them all through the backward, and drops the others' after.
    z3_full: fsdp2_flags' second, where the caller has it."""
    if z3_full is None:
        _, z3_full = fsdp2_flags(lay, tr)
    zero = np.asarray(lay.zero)
    return ((zero >= 3) & ~z3_full) | ((zero == 2) & np.asarray(tr.zero2_each_microbatch))


def expert_grad_params(params, experts, lay, tr, scales=None):
    """The parameter count whose gradients (model_state_coefficients' gradient bytes) a rank holds, where `experts`
    of its `params` are a mixture of experts' expert weights: where the gradients are sharded (grads_sharded: ZeRO-2
    per micro-batch, ZeRO-3) the dense ones over zero_shards ranks and the experts' over their own data-parallel group
    (moe.expert_data_parallel: parplan's runtime reduces each to its owner there under ZeRO-2, and FSDP2
    reduce-scatters them over it under ZeRO-3), so an expert weight weighs zero_shards / that as much; elsewhere every
    gradient is whole.  scales: expert_scales, where the caller has them."""
    return params + experts * (expert_scales(lay, tr) if scales is None else scales)[2]


def model_state_coefficients(lay, tr, shards=None, flags=None):
    """Bytes per parameter of each candidate, as (weights, gradients, optimizer states, offloaded): model
    states are linear in the parameter count, so a rank's are its parameters times these.  shards: zero_shards,
    flags: fsdp2_flags, where the caller has them."""
    rec = PRECISION_RECIPES[tr.precision]
    zero, dp = lay.zero, zero_shards(lay, tr) if shards is None else shards
    off = lay.offload > 0
    fsdp2, z3_full = fsdp2_flags(lay, tr) if flags is None else flags
    # FSDP2 with a master recipe: the fp32 shard is the master (counted with the optimizer states)
    fsdp2_shard = 0.0 if rec["master"] else rec["weight"]
    # persistent weight storage: full, sharded (ZeRO-3), or for FSDP2 with a master recipe none
    # besides the master; FSDP2 inside a pipeline also keeps the gathered compute copies
    stored = np.where(fsdp2, fsdp2_shard, rec["weight"]) / np.where(zero >= 3, dp, 1)
    gathered = np.where(z3_full, rec["weight"], 0.0)
    # ZeRO-2 keeps gradients sharded only when it reduce-scatters them as they are produced;
    # reduced once per step, every rank holds them all through the backward.
    sharded_g = grads_sharded(lay, tr, z3_full)
    # FSDP2 casts each reduce-scatter's output to the sharded parameter's dtype (foreach_reduce:
    # _to_dtype_if_needed(reduce_output, orig_dtype)), so under a master recipe its gradient shards are fp32
    # whatever the reduce dtype (16-bit for master-weights-half-grads)
    g = np.where(fsdp2 & ~z3_full, 4.0 if rec["master"] else rec["grad"], rec["grad"]) / np.where(sharded_g, dp, 1)
    opt_shards = np.where(zero >= 1, dp, 1)  # the ranks the optimizer's share is of
    opt_total = (rec["master"] + rec["adam"]) / opt_shards
    # FSDP2's CPUOffloadPolicy keeps the sharded parameters and gradients on the host as well
    # (the unsharded gradients a pipeline accumulates stay on the device until the reduce; fsdp2_offload)
    host = fsdp2_offload(lay, tr, (fsdp2, z3_full))
    host_g = host & ~z3_full
    w = gathered + np.where(host, 0.0, stored)
    o = np.where(off, 0.0, opt_total)
    # DeepSpeed's ZeRO optimizer keeps an fp32 partition of its own even of fp32 weights (stage_1_and_2.py's
    # weights_partition = ....clone().float(); stage3.py _create_fp32_partitions, ....clone().float()): a master the
    # fp32 recipe does not otherwise have, 4 B a parameter of the share on the device (offloaded: the host mirror
    # below).  amp's DeepSpeed export runs its 16-bit mode instead, which planner.export notes
    o = o + np.where(deepspeed_fp32_partition(lay, tr) & ~off, 4.0 / dp, 0.0)
    # an optimizer stepping on the host needs the fp32 values it steps there: with a master recipe that is the
    # master (in opt_total); with fp32 weights (amp, fp32) a host mirror of the rank's share (parplan's MasterAdamW,
    # as DeepSpeed's CPU Adam keeps its fp32 partition) -- not under FSDP2, whose offloaded shards are the values
    mirror = np.where(off & ~fsdp2 & (rec["master"] == 0), 4.0 / opt_shards, 0.0)
    # DeepSpeed's offload also holds the partition's fp32 gradient on the host (the fp32 partition's .grad, which
    # the boundary's copy fills: stage_1_and_2.py, stage3.py), its host accumulation buffer of the parameters'
    # dtype (ZeRO-1/2's accumulated_grads_in_cpu once gradient_accumulation_steps > 1, ZeRO-3's
    # grad_partitions_flat_buffer always; cost_models.total: offload_grads_via_host), and at ZeRO-1/2 a host copy
    # of the partition's 16-bit parameters that the CPU Adam writes before they go up
    # (param_buffer_of_bit16_for_cpu_offload_groups)
    ds = off & np.asarray(tr.offload_grads_via_host)
    accumulates = num_microbatches(tr, lay) > 1
    ds_host = 4.0 + np.where((zero >= 3) | accumulates, rec["weight"], 0.0) + np.where(zero < 3, rec["weight"], 0.0)
    ds_grads = np.where(ds, ds_host / opt_shards, 0.0)
    # every other optimizer stepping on the host takes the rank's gradients there as fp32 tensors of its share, all
    # of them before it steps: parplan's MasterAdamW (grad.to("cpu", float32) per tensor, then one fused step),
    # Megatron's HybridDeviceOptimizer (a pinned fp32 buffer per offloaded parameter, cpu_copy_map_grad, kept);
    # FSDP2's host gradient shards are counted above, DeepSpeed's fp32 partition gradient in ds_grads
    host_grads = np.where(off & ~fsdp2 & ~ds, 4.0 / opt_shards, 0.0)
    offloaded = (np.where(off, opt_total, 0.0) + mirror + np.where(host, stored, 0.0)
                 + np.where(host_g, g, 0.0) + ds_grads + host_grads)
    return w, np.where(host_g, 0.0, g), o, offloaded


def step_grad_copy_coefficient(lay, tr):
    """Bytes per parameter that the optimizer step adds on the device: with 16-bit gradients and fp32 masters
    (master-weights-half-grads) the step makes an fp32 copy of the gradients of its share before it steps them
    (parplan's MasterAdamW: grad.to(float32) for every tensor, then one fused step; Megatron's
    _copy_model_grads_to_main_grads: main_param.grad = main_grad.float(); DeepSpeed ZeRO-1/2's
    single_grad_partition .to(fp32) per parameter group, ZeRO-3's per sub-group), live beside the weights, the
    16-bit gradients and the optimizer states once the backward has freed the activations.  None with fp32
    gradients (the copy is the gradient itself), under FSDP2 (its reduce-scatter writes the fp32 shard's
    gradient) or with the optimizer offloaded (the copy is made on the host: model_state_coefficients)."""
    rec = PRECISION_RECIPES[tr.precision]
    if not (rec["master"] and rec["grad"] < 4):
        return np.zeros(np.shape(lay.zero))
    fsdp2, _ = fsdp2_flags(lay, tr)
    return np.where(~fsdp2 & (lay.offload == 0), 4.0 / np.where(lay.zero >= 1, zero_shards(lay, tr), 1), 0.0)


def deepspeed_runtime(tr) -> bool:
    """Whether the framework is DeepSpeed (its step's sub-group size is set: ds_step_sub_group_elements)."""
    return bool(tr.ds_step_sub_group_elements)


def deepspeed_fp32_partition(lay, tr):
    """Where DeepSpeed's ZeRO (stages 1-3) keeps an fp32 partition beside fp32 weights: the fp32 recipe under it."""
    return (np.asarray(lay.zero) >= 1) & deepspeed_runtime(tr) & (tr.precision == "fp32")


def deepspeed_zero_optimizer_steps(lay, tr):
    """Where DeepSpeed's ZeRO optimizer (stage_1_and_2.py, stage3.py) steps on the device: ZeRO-1/2/3 with an fp32
    master (the recipe's, or the fp32 recipe's partition: deepspeed_fp32_partition), the optimizer not offloaded, and
    not its BF16_Optimizer (deepspeed_bf16_optimizer_steps)."""
    zero = np.asarray(lay.zero)
    if not (deepspeed_runtime(tr) and (PRECISION_RECIPES[tr.precision]["master"] or tr.precision == "fp32")):
        return np.zeros(np.shape(zero), dtype=bool)
    on_host = np.asarray(lay.offload) > 0
    return ((zero >= 1) & ~on_host
            & ~deepspeed_bf16_optimizer_steps(zero, tr.zero1_all_reduce, tr.precision, tr.dtype, on_host))


def step_grad_copy_bytes(m: ModelDims, params, lay, tr):
    """Bytes the optimizer step adds on the device for a rank holding `params` parameters, beside its model states:
    step_grad_copy_coefficient's fp32 copies, except under DeepSpeed's ZeRO optimizer (ZeRO-1/2/3 stepping on the
    device with an fp32 master; not its BF16_Optimizer), which steps one group at a time and makes each group's
    gradient partition flat first (stage_1_and_2.py step: self.flatten(self.averaged_gradients[i]).to(fp32);
    stage3.py _prepare_fp32_grad_for_sub_group: the same per sub-group): a copy in the gradients' dtype (torch.cat of
    the partition's views) and, with 16-bit gradients, its fp32 cast beside it until the 16-bit copy goes (with fp32
    gradients .to returns the copy itself).  The fp32 gradient is let go after the group's step (single_partition_of_
    fp32_groups[i].grad = None; _release_sub_group).  A ZeRO-1/2 group is a parameter group's partition (the rank's
    whole share taken, an upper bound by the small no-decay group); a ZeRO-3 sub-group closes at the parameter that
    takes it to sub_group_size elements (_create_fp16_sub_groups), so it holds at most sub_group_size + one
    parameter's partition (the model's largest matrix taken)."""
    rec = PRECISION_RECIPES[tr.precision]
    zero = np.asarray(lay.zero)
    shards = np.where(zero >= 1, zero_shards(lay, tr), 1)
    generic = params * step_grad_copy_coefficient(lay, tr)
    ds = deepspeed_zero_optimizer_steps(lay, tr)
    if not np.any(ds):
        return generic
    largest = np.maximum(m.vocab * m.hidden / np.asarray(lay.tp), np.maximum.reduce(zero3.weight_elements(m, lay.tp)))
    group = np.where(zero >= 3, np.minimum(params / shards, tr.ds_step_sub_group_elements + largest / shards),
                     params / shards)
    flat = group * (rec["grad"] + (4.0 if rec["grad"] < 4 else 0.0))
    return np.where(ds, flat, generic)


def ddp_bucket_copy(lay, tr):
    """Where torch DDP's buckets are a second copy of the gradients (TrainingConsts.ddp_bucket_copy): ZeRO-0 over
    dp > 1."""
    return (np.asarray(lay.zero) == 0) & (np.asarray(lay.dp) > 1) & np.asarray(tr.ddp_bucket_copy)


def deepspeed_bf16_optimizer_steps(zero, zero1_all_reduce, precision: str, dtype: str, offloaded):
    """Where DeepSpeed steps with its BF16_Optimizer, not its ZeRO optimizer: ZeRO-1 all-reducing the fp32 gradients
    of a bf16 model (the grad_accum_dtype fp32 planner.export writes there), without CPU offload
    (_do_optimizer_sanity_check).  Array-valued over candidates; planner.export asks it of one plan."""
    return ((np.asarray(zero) == 1) & np.asarray(zero1_all_reduce) & (precision == "master-weights") & (dtype == "bf16")
            & ~np.asarray(offloaded))


def deepspeed_grad_buckets(lay, tr):
    """DeepSpeed's gradient buckets, read in its source (stage_1_and_2.py 02aa38c3, stage3.py, engine.py 007cca6a;
    not measured), as a dict of bytes per rank: `held` at every moment, `backward` in the blocks' backward (and
    `reduce`, ZeRO-2/3's copies of a full bucket while they reduce one: memory_breakdown scales it to the rank's
    gradients where they fill less than a bucket), and what
    the reduction at the step's boundary holds beside the model states once the activations are gone, `flat_cap` (a
    flat copy of at most that many bytes of the rank's gradients) and `boundary` (bytes).  Under contiguous_gradients
    (its default, and what planner.export writes) a reduce bucket is reduce_bucket_size elements (TrainingConsts.
    ds_reduce_bucket_elements, 5e8 by default) of the model's 16-bit dtype, whatever the model's size:
      - ZeRO-3 allocates one when it builds the optimizer (stage3's __ipg_bucket_flat_buffer) and keeps it: held;
      - ZeRO-1/2 allocate one at a backward's first gradient hook (setup_buckets), two with overlap_comm (which its
        pipeline engine turns off), and free them in the reduce epilogue (_release_ipg_buffers): ZeRO-2 at the end of
        each micro-batch's backward, so in the backward; ZeRO-1 only at the step's boundary, so from the first
        backward on through the later micro-batches' forwards: held (inside a pipeline the last stage's alone: the
        engine calls the optimizer's backward there only; an upper bound before a step's first backward;
        the boundary's reduction leaves the other ranks' gradients as views of them, which keep them to the step);
        inside a pipeline its boundary's reduce_gradients(pipeline_parallel=True) makes one of its own, replacing the
        list (self.ipg_buffer = [buf_0]): boundary;
      - the BF16_Optimizer (ZeRO-1 all-reducing fp32 gradients of a bf16 model, where planner.export writes
        grad_accum_dtype fp32) and ZeRO-0 make none: the engine all-reduces their gradients at the boundary through
        buffered_allreduce_fallback, one flat copy (allreduce_bucket's self.flatten) of up to MEMORY_OPT_ALLREDUCE_SIZE
        (5e8) elements of the gradients' dtype at a time: flat_cap.
    Wherever DeepSpeed runs, these stand in for the 2 x 25 MiB of flat buckets _other_bytes charges."""
    zero = np.asarray(lay.zero)
    elements = tr.ds_reduce_bucket_elements
    rec = PRECISION_RECIPES[tr.precision]
    bf16_optimizer = deepspeed_bf16_optimizer_steps(zero, tr.zero1_all_reduce, tr.precision, tr.dtype,
                                                    np.asarray(lay.offload) > 0)
    each = elements * rec["weight"]
    pipeline = np.asarray(lay.pp) > 1
    n = 1 + (tr.overlap_grad_reduce & ~pipeline)
    zero1 = (zero == 1) & ~bf16_optimizer
    # a full bucket's reduction goes through copies: the bucket cast to the communication dtype where that is not the
    # model's (the export's fp32 beside ZeRO-2/3's fp32 gradient shards: ZeRO-2's average_tensor, tensor.to(
    # communication_data_type); ZeRO-3's __avg_scatter_grads, g.to(...) per gradient), and at ZeRO-3 then
    # reduce_scatter_coalesced's torch.cat of them interleaved by rank, live together until the reduce returns
    comm = rec["grad"]
    cast = elements * comm if deepspeed_comm_casts(tr) else 0.0
    return {"held": np.where(zero >= 3, each, np.where(zero1, n * each, 0.0)),
            "backward": np.where(zero == 2, n * each, 0.0),
            "reduce": np.where(zero >= 3, cast + elements * comm, np.where(zero == 2, cast, 0.0)),
            "flat_cap": np.where((zero == 0) | bf16_optimizer, elements * rec["grad"], 0.0),
            "boundary": np.where(zero1 & pipeline, each, 0.0)}


def model_states(params, lay, tr, coefficients=None):
    """(weights, gradients, optimizer states, offloaded) bytes per GPU for `params` parameters under the
    precision recipe, ZeRO stage and offload of each candidate (model_state_coefficients, given or computed)."""
    return tuple(params * c for c in (coefficients or model_state_coefficients(lay, tr)))


def states_floor(m: ModelDims, lay, tr):
    """A floor under memory_breakdown's total, cheap enough to skip candidates that cannot fit before
    the full model: the heaviest present pipeline rank's weights + gradients + optimizer states.
    stage_total adds only non-negative terms to w + o (activations, working memory, casts, buffers),
    and both of its moments hold at least g (the blocks' backward holds the gradients, all of them
    by the end of a one-micro-batch backward)."""
    pp = np.asarray(lay.pp)
    shards, flags = zero_shards(lay, tr), fsdp2_flags(lay, tr)
    cw, cg, co, _ = model_state_coefficients(lay, tr, shards, flags)
    scales = expert_scales(lay, tr, shards, flags) if m.moe else None
    each = cw + cg + co

    def held(params, experts):
        if not m.moe:
            return params * each
        return (expert_states_weights(params, experts, lay, tr, cw, scales)
                + expert_grad_params(params, experts, lay, tr, scales) * cg
                + expert_state_params(params, experts, lay, tr, scales) * co)

    blocks = rank_blocks(m, lay)
    (p_first, p_mid, p_last), (e_first, e_mid, e_last) = rank_params(m, lay, blocks), rank_expert_params(m, lay, blocks)
    return np.maximum(held(p_first, e_first), np.maximum(np.where(pp > 2, held(p_mid, e_mid), 0.0),
                                                         np.where(pp > 1, held(p_last, e_last), 0.0)))


def rank_inflight_by_key(lay, m_micro, layers: int | None = None, output_sends_released: bool = False) -> dict:
    """rank_inflight, computed once per distinct (pp, vpp, schedule, micro-batches) and scattered back: a
    search's hundreds of thousands of candidates share a few hundred of these (the same counts)."""
    shape = np.broadcast(np.asarray(lay.pp), np.asarray(lay.vpp), np.asarray(lay.schedule), np.asarray(m_micro)).shape
    m_arr = np.broadcast_to(np.asarray(m_micro, dtype=float), shape)
    if len(shape) != 1 or shape[0] < 4096 or not np.all(m_arr == np.round(m_arr)):
        return rank_inflight(lay, m_micro, layers, output_sends_released)
    pp, vpp, sch = (np.broadcast_to(np.asarray(x, dtype=np.int64), shape) for x in (lay.pp, lay.vpp, lay.schedule))
    first, where = distinct_rows(pp, vpp, sch, m_arr)
    sub = SimpleNamespace(pp=pp[first], vpp=vpp[first], schedule=sch[first])
    counts = rank_inflight(sub, m_arr[first], layers, output_sends_released)
    return {kind: [tuple(np.asarray(x)[where] for x in moment) for moment in moments]
            for kind, moments in counts.items()}


BLOCK_SHAPE_FIELDS = ("tp", "cp", "mbs", "sp", "recompute", "ep")


def block_shape_rows(lay, fields=BLOCK_SHAPE_FIELDS):
    """distinct_rows over the layout's `fields` (per_block_shape's), or () where per_block_shape computes on every
    row (one plan, a few thousand candidates, a field not of integers): for callers with several such terms."""
    cols = [np.asarray(getattr(lay, f)) for f in fields]
    shape = np.broadcast(*cols).shape
    if len(shape) != 1 or shape[0] < 4096 or any(c.dtype.kind not in "iub" for c in cols):
        return ()
    return distinct_rows(*(np.broadcast_to(c, shape) for c in cols))


def per_block_shape(lay, fn, fields=BLOCK_SHAPE_FIELDS, rows=None):
    """fn(layout) -> tuple of arrays, for terms that read only a block's shape (BLOCK_SHAPE_FIELDS: what one
    block of one micro-batch holds on one GPU; `fields` where the terms read more, as a block's time reads whether
    the job fits a node), computed once per distinct shape and scattered back: a search's hundreds of thousands of
    candidates share a few hundred shapes.  The same numbers as fn(lay), to the bit (elementwise arithmetic on the
    same values; tests/test_search.py).  rows: block_shape_rows(lay, fields), where the caller has it."""
    rows = block_shape_rows(lay, fields) if rows is None else rows
    if not rows:
        return fn(lay)
    first, where = rows
    out = fn(lay.take(first))
    return tuple(np.broadcast_to(np.asarray(x), first.shape)[where] for x in out)


# memory_breakdown's totals of each pipeline rank kind (rank 0, the priced middle rank, rank pp-1)
RANK_TOTALS = ("first_total", "mid_total", "last_total")

# The moment of a rank's peak (memory_breakdown's "moment"; MemoryBreakdown.peak_moment names them): the blocks' or
# the loss's backward, with the saved activations; after the backward, at the reduction at the step's boundary
# (DeepSpeed's flat copies and buckets) or at the optimizer step (its fp32 copies of 16-bit gradients), with none
MOMENT_BACKWARD, MOMENT_REDUCTION, MOMENT_STEP = 0, 1, 2
PEAK_MOMENTS = ("backward", "gradient reduction after the backward", "optimizer step")


def memory_breakdown(m: ModelDims, lay, tr, m_micro):
    """Named memory terms (bytes per GPU) of the worst of: first stage (embedding, most
    micro-batches in flight), second stage (largest middle stage, one fewer in flight), last
    stage (head and logits, one micro-batch in flight for 1F1B).  Returns a dict of arrays.
    Candidates that recompute some blocks of each virtual stage (Layout.recompute_layers): partial_recompute_memory."""
    share = recomputed_share(m, lay)
    if not np.any(share < 1):
        return _whole_blocks_memory(m, lay, tr, m_micro)
    m_arr = np.broadcast_to(np.asarray(m_micro, dtype=float), np.shape(share))
    return split_by_share(share, lay, {"m": m_arr}, lambda sub, sm: _whole_blocks_memory(m, sub, tr, sm["m"]),
                          lambda sub, sm: partial_recompute_memory(m, sub, tr, sm["m"]))


def partial_recompute_memory(m: ModelDims, lay, tr, m_micro):
    """Memory where full recompute re-runs a share f of each rank's blocks, the first of each virtual stage, and the
    others keep their activations (each rank kind its own f where the stages differ in size: rank_recomputed_shares; a
    rank of smaller stages recomputes a larger share of its blocks).  A rank's saved activations (and amp's saved weight
    casts) are f x the recomputed blocks' + (1 - f) x the others': linear in f.  The block being back-propagated adds
    what no recompute's does: a recomputed block runs its backward after the same micro-batch's kept blocks of its stage
    (they come after it in the forward), whose freed activations outweigh what it rebuilds (rebuilt_bytes: less than one
    block's), so its moment is no higher.  So each rank's peak is the larger of a few lines in f, convex, and the chord
    from no recompute (f = 0) to full (f = 1) is exact where one moment leads throughout and an upper bound where the
    lead changes or where the full end's rebuilt block is mixed in (at most f x one block's).  The parts (activations,
    working memory) are mixed on the same chords; the weights, gradients and optimizer states do not change.  The CPU
    allocator trace of 1F1B over four ranks with one of each stage's two blocks recomputed
    (tests/test_runtime_memory.py) reads within the bars the other plans keep."""
    none, whole = recompute_ends(lay)
    full, kept = _whole_blocks_memory(m, whole, tr, m_micro), _whole_blocks_memory(m, none, tr, m_micro)
    out = dict(full)
    shares = rank_recomputed_shares(m, lay)
    shape = np.broadcast_shapes(np.shape(out["total"]), *(np.shape(f) for f in shares))
    shares = [np.broadcast_to(f, shape) for f in shares]
    for k, f in zip(RANK_TOTALS, shares):
        out[k] = (1 - f) * kept[k] + f * full[k]
    # an after-the-backward peak holds no activations, so it is the same at both ends; where the ends peak at
    # different moments the chord mixes a backward's activations in
    out["moment"] = np.where(kept["moment"] == full["moment"], full["moment"], MOMENT_BACKWARD)
    ranks = np.stack([np.broadcast_to(out[k], shape) for k in RANK_TOTALS])
    out["worst_stage"] = np.argmax(np.where(np.isnan(ranks), -np.inf, ranks), axis=0)
    out["total"] = np.nanmax(ranks, axis=0)
    # the named parts on the chord of the worst rank's share (each end's parts are its own worst rank's)
    f = np.choose(out["worst_stage"], shares)
    for k in ("activations", "other"):
        out[k] = (1 - f) * kept[k] + f * full[k]
    return out


def _whole_blocks_memory(m: ModelDims, lay, tr, m_micro):
    """memory_breakdown where every block of a rank recomputes alike."""
    rec = PRECISION_RECIPES[tr.precision]
    act_b = tr.act_bytes
    tp, pp = lay.tp, lay.pp
    # blocks per pipeline *rank* (its v virtual stages; uneven splits allowed), and of them the dense ones
    blocks = rank_blocks(m, lay)
    first_blocks, mid_blocks, last_blocks = blocks[0]
    per_layer = layer_params_per_gpu(m, tp, lay.ep)
    head = head_params_per_gpu(m, tp, pp)
    single = np.asarray(pp) == 1
    block_params = rank_block_params(m, lay, blocks)
    p_first, p_mid, p_last = rank_params(m, lay, blocks, block_params)
    e_first, e_mid, e_last = rank_expert_params(m, lay, blocks)

    zero = lay.zero
    fsdp2, z3_full = flags = fsdp2_flags(lay, tr)
    shards = zero_shards(lay, tr)

    coefficients = model_state_coefficients(lay, tr, shards, flags)
    scales = expert_scales(lay, tr, shards, flags) if m.moe else None

    def states(params, experts=0.0):
        """(weights, gradients, optimizer, offloaded) of `params`, `experts` of them a mixture of experts' expert
        weights (their optimizer states sharded over their own group: expert_state_params; their gradients too where
        the gradients are sharded: expert_grad_params; and under ZeRO-3 their weights: expert_weight_params)."""
        if not m.moe:
            return model_states(params, lay, tr, coefficients)
        optimizer = expert_state_params(params, experts, lay, tr, scales)
        return (expert_states_weights(params, experts, lay, tr, coefficients[0], scales),
                expert_grad_params(params, experts, lay, tr, scales) * coefficients[1],
                optimizer * coefficients[2], optimizer * coefficients[3])

    def grads_of(params):
        """states(params)'s gradients alone."""
        if not m.moe:
            return params * coefficients[1]
        return expert_grad_params(params, 0.0, lay, tr, scales) * coefficients[1]

    # (multi-token prediction's depths are blocks of the last virtual stage: layout.model_rank_block_counts)
    inflight = rank_inflight_by_key(lay, m_micro, model_split_sizes(m), tr.p2p_output_sends_released)
    saves = (tr.sp_saves_gathered_input, tr.cp_saves_gathered_kv, tr.eager_saves_more, tr.fp8)

    def block_terms(sub):
        args = (m, sub, act_b, tr.flash_attention, tr.dropout, *saves)
        return (pending_w_bytes_per_layer(*args), activation_bytes_per_layer(*args),
                activation_bytes_working_layer(*args), backward_temporaries_per_layer(*args),
                *logits_bytes(m, sub, act_b, tr.fused_cross_entropy, tr.cross_entropy_16bit_grad),
                queued_w_bytes_per_layer(m, sub, act_b, tr.fp8))

    shape_rows = block_shape_rows(lay)
    pend_layer, act_layer, work_layer, temp_layer, loss_peak, loss_saved, queued_layer = per_block_shape(
        lay, block_terms, rows=shape_rows)
    if m.mtp:
        # multi-token prediction's losses: each depth's logits are made in the forward after the main head's, and each
        # loss keeps what it saves until its backward, which runs while the others' are still held
        loss_peak, loss_saved = loss_peak + m.mtp * loss_saved, loss_saved * (1 + m.mtp)
    # the logits a pipeline schedule keeps as the last stage's output: at the loss's peak and beside each saved loss
    # (GPipe's), and under torchtitan through the stage's blocks' backward too (logits_to_stage_end, stage_total)
    cached_logits = cached_logits_bytes(m, lay, act_b, tr)
    loss_peak, loss_saved = loss_peak + cached_logits, loss_saved + cached_logits
    logits_to_stage_end = cached_logits if tr.pipeline_keeps_logits == "to-stage-end" else 0.0
    if m.moe and tr.moe_recompute != "none":
        # a mixture of experts' recompute modules drop their outputs from what a block saves (not where the block is
        # recomputed whole); the block being back-propagated rebuilds them (rebuilt_bytes, from work_layer)
        act_layer = act_layer - np.where(lay.recompute == REC_FULL, 0.0,
                                         moe.recomputed_bytes(m, lay, act_b, tr.moe_recompute, tr.fp8))
        if tr.eager_runtime == "parplan":  # parplan's runtime rebuilds the norm's output after the experts' backward
            work_layer = work_layer - np.where(lay.recompute == REC_FULL, 0.0, moe.parplan_rebuilt_after_experts(
                m, lay, act_b, tr.moe_recompute))
    # multi-head latent attention's up projections recomputed: Megatron's q, k and v, or what parplan's runtime frees
    mla_drop = 0.0
    if tr.mla_recompute:
        mla_drop = (parplan_mla_up_saved_bytes(m, lay, act_b) if m.v_padded
                    else np.where(lay.recompute == REC_FULL, 0.0, mla_up_saved_bytes(m, lay, act_b)))
    act_layer = act_layer - mla_drop
    if tr.mla_recompute and m.v_padded:  # (the rebuilt work_layer - act_layer counts the rebuilt q, k, v again)
        work_layer = work_layer - parplan_mla_rebuilt_after_mlp(m, lay, act_b, mla_drop)
    # a pending block counts as held (its saved activations) plus pend_layer; where the weight pass is queued
    # closures the input-gradient pass freed the saved activations and the closures hold the rest
    queued = queued_weight_pass(lay, tr)
    pend_layer = np.where(queued, queued_layer - act_layer, pend_layer)
    # a mixture of experts with dense blocks between its MoE ones (ModelDims.mixed): the terms above are an MoE
    # block's; a rank's saved activations and parameters sum each kind's over its blocks of that kind (kind_mean: the
    # rank's mean block, x its blocks below), and the block being back-propagated is the larger of the two kinds
    counts = (first_blocks, mid_blocks, last_blocks)
    per_dense = 0.0
    if m.mixed:
        md = m.dense_dims()
        dense = blocks[1]
        per_dense = layer_params_per_gpu(md, tp)

        def dense_terms(sub):
            args = (md, sub, act_b, tr.flash_attention, tr.dropout, *saves)
            return (pending_w_bytes_per_layer(*args), activation_bytes_per_layer(*args),
                    activation_bytes_working_layer(*args), backward_temporaries_per_layer(*args),
                    queued_w_bytes_per_layer(md, sub, act_b, tr.fp8))
        pend_d, act_d, work_d, temp_d, queued_d = per_block_shape(lay, dense_terms, rows=shape_rows)
        act_d = act_d - mla_drop  # (a dense block's attention is an MoE block's)
        if tr.mla_recompute and m.v_padded:
            work_d = work_d - parplan_mla_rebuilt_after_mlp(md, lay, act_b, mla_drop)
        pend_d = np.where(queued, queued_d - act_d, pend_d)

    # (each kind's MoE blocks and its blocks at least one, which kind_mean reads for every term)
    kind_moe = tuple(c - d for c, d in zip(counts, dense)) if m.mixed else None
    kind_blocks = tuple(np.maximum(c, 1) for c in counts) if m.mixed else None

    def kind_mean(k, x, x_dense):
        """Rank kind k's (0 first, 1 middle, 2 last) mean block of a per-block term."""
        if not m.mixed:
            return x
        return (kind_moe[k] * x + dense[k] * x_dense) / kind_blocks[k]
    # The stage with the loss runs each micro-batch's backward right after its forward (1F1B and its
    # variants); GPipe holds all m; the loss's saved logits are live for those micro-batches.
    logits_inflight = np.where(lay.schedule == SCH_GPIPE, m_micro, 1)
    # interleaved zero-bubble defers the head's weight-gradient pass too: the last rank keeps the
    # gradient of the logits (activation dtype) of up to p micro-batches, p - 1 of them beside the
    # one the loss's peak counts (torch's order; ZB-V runs the head's W right after its I); queued weight
    # passes queue the blocks' linears only, so the head's gradient is made in its input-gradient pass
    T_loss = lay.mbs * m.seq_len / lay.cp
    head_pending = np.where((lay.schedule == SCH_INTERLEAVED_ZB) & (np.asarray(pp) > 1) & ~queued,
                            (np.asarray(pp) - 1) * T_loss * m.vocab / lay.tp * act_b, 0.0)
    p_np = np.asarray(pp)
    zbv = (lay.schedule == SCH_ZBV) & (p_np > 1)  # the V puts both ends, embedding and head, on rank 0

    # autocast casts each weight to 16 bit once per forward; the copy is saved for the
    # backward of that micro-batch (dX = dY W), so it is held per micro-batch in flight,
    # except under full recompute (the forward pass saves nothing but the block input).
    cast_per_param = rec["cast"] * np.where((lay.recompute == REC_FULL) | (lay.recompute == REC_SELECTIVE_OP), 0.0, 1.0)

    # FSDP2's hybrid sharding with more than one micro-batch a step (outside a pipeline, where it reduces every
    # micro-batch): a block's reduce-dtype gradient shard held from its reduction to the backward's end
    # (TrainingConsts.hsdp_holds_reduce_input; as the accumulated gradient is, where one micro-batch makes it); a
    # mixture of experts' expert weights are sharded over a replica group's share of their own group
    # (moe.expert_shards: data_parallel.shard_experts over mesh.expert_data_parallel_mesh's 2-D mesh)
    held_params = per_layer / shards
    if m.moe:
        e_held = moe.expert_params_per_gpu(m, lay.ep)
        held_params = (per_layer - e_held) / shards + e_held / moe.expert_shards(lay)
    hsdp_held = np.where(fsdp2 & ~z3_full & (np.asarray(lay.dp_replicate) > 1) & (m_micro > 1)
                         & tr.hsdp_holds_reduce_input, held_params * rec["grad"], 0.0)
    # ZeRO-3's gathered compute-dtype weights: two blocks (current + prefetch), or DeepSpeed's two weights
    # and one weight's gradient (one-weight-ahead prefetch, zero3.gathered_bytes); FSDP2 inside a
    # pipeline keeps the gathered weights (counted as weights), so only the block being gathered
    blocks_gathered = np.where(z3_full, 1, 2) * per_layer * rec["weight"]
    if tr.zero3_one_weight_ahead:
        blocks_gathered = np.where(zero3.one_weight_ahead(m, tp), zero3.gathered_bytes(m, lay, tr.precision),
                                   blocks_gathered)
    gathered = np.where(zero >= 3, blocks_gathered, 0.0)
    # a mixture of experts under FSDP2 outside a pipeline (parplan's runtime: each MoE layer's experts a unit of their
    # own over their expert-data-parallel group, data_parallel.shard_experts, torchtitan's layout) gathers and reduces
    # a block's dense weights and its experts apart, so its worst moment is the experts' post-backward reduction: the
    # block's dense weights and the block below's (prefetched when the experts' backward began, FSDP2's backward
    # order) gathered, the experts' reduce-scatter input (reduce dtype) and output (its 1 / edp), and their unsharded
    # compute-dtype gradients, alive through the copy into the input (a group of one copies the input divided instead:
    # the same bytes in the reduce dtype); the block's own dense reduction comes later, beside less (CPU allocator,
    # benchmarks/results/2026-12-05-cpu-memory-moe-zero3)
    fsdp2_units = None
    if m.moe:
        e_layer = moe.expert_params_per_gpu(m, lay.ep)
        d_layer = per_layer - e_layer
        edp = moe.expert_shards(lay)  # (under hybrid sharding a replica group's share of the group)
        experts_reduce = e_layer * (rec["grad"] * (1 + 1 / edp) + np.where(edp > 1, rec["weight"], rec["grad"]))
        # (the moment before it, the experts' backward: their gathered weights beside the gradients they make; and the
        # block's dense reduction: its reduce-scatter input beside its compute-dtype gradients)
        experts_backward = 2 * e_layer * rec["weight"]
        dense_reduce = d_layer * (rec["grad"] + rec["weight"])
        fsdp2_units = np.where(fsdp2 & ~z3_full & (zero >= 3),
                               2 * d_layer * rec["weight"]
                               + np.maximum(np.maximum(experts_reduce, experts_backward), dense_reduce), np.nan)
    # torch DDP's buckets as a whole second copy of the rank's gradients (TrainingConsts.ddp_bucket_copy), allocated
    # when DDP wraps the model and held through every moment: counted with the persistent buffers below
    ddp_copy = ddp_bucket_copy(lay, tr)
    # DeepSpeed's buckets (deepspeed_grad_buckets), in place of the 2 x 25 MiB flat buckets, which only parplan's
    # runtime makes (TrainingConsts.flat_grad_buckets), and only its ZeRO-0/1 all-reduce: its ZeRO-2 reduces each
    # gradient's rows in place to their owner (data_parallel.ShardedAdamW.reduce_start)
    ds = deepspeed_grad_buckets(lay, tr)
    ds_zero_optimizer = deepspeed_zero_optimizer_steps(lay, tr)
    # parplan's flat bucket copies (flat_bucket_bytes), per rank kind below from the rank's own gradients: ZeRO-0
    # reduces over dp x cp, ZeRO-1 over dp (ZeRO-2 in place, FSDP2 its own shards)
    flat_on = ((np.where(zero == 0, np.asarray(lay.dp) * np.asarray(lay.cp), np.asarray(lay.dp)) > 1) & (zero < 2)
               & tr.flat_grad_buckets)
    flat_overlap = grad_reduce_overlaps(tr.overlap_grad_reduce, torch_weight_pass(lay, tr))
    # ZeRO-2/3's reduce copies of a bucket, no larger than the rank's gradients fill one
    bucket_fill = np.minimum(1.0, np.maximum(np.maximum(p_first, p_mid), p_last)
                             / max(tr.ds_reduce_bucket_elements, 1.0))
    # what a block adds to the working memory (the block being back-propagated, its gathered weights, its reduction);
    # a rank of a plan's own split that holds no block has none of it (stage_total)
    of_a_block = _other_bytes(lay, per_layer, work_layer, act_layer, temp_layer, gathered, rec, fsdp2, z3_full,
                              fsdp2_units)
    block_working = rebuilt_bytes(work_layer, act_layer) + temp_layer  # the block being back-propagated (in working)
    if m.mixed:  # the larger kind's (a dense block's ZeRO-3 gathers its own weights: parplan's runtime's FSDP2 units)
        gathered_d = np.where(zero >= 3, np.where(z3_full, 1, 2) * per_dense * rec["weight"], 0.0)
        of_a_block = np.maximum(of_a_block, _other_bytes(lay, per_dense, work_d, act_d, temp_d, gathered_d, rec, fsdp2,
                                                         z3_full))
        block_working = np.maximum(block_working, rebuilt_bytes(work_d, act_d) + temp_d)
    working = of_a_block + ds["backward"] + ds["reduce"] * bucket_fill
    first_bufs, mid_bufs, last_bufs = p2p_receive_buffers(m, lay, act_b, m_micro, tr.p2p_buffers_per_microbatch)
    # DeepSpeed's pipeline engine runs the ZeRO optimizer's backward (which makes ZeRO-1's reduce bucket) on its last
    # stage only; the others call torch.autograd.backward themselves (PipelineEngine._exec_backward_pass)
    held_before_last = np.where(np.asarray(lay.pp) > 1, 0.0, ds["held"])
    first_bufs, mid_bufs, last_bufs = (bufs + np.where(ddp_copy, params * rec["grad"], 0.0) + held
                                       for bufs, params, held in ((first_bufs, p_first, held_before_last),
                                                                  (mid_bufs, p_mid, held_before_last),
                                                                  (last_bufs, p_last, ds["held"])))
    # tensors sent and held until the step ends (torch's action-list runtime): one hidden state each
    sent = np.where(tr.p2p_sends_held_to_step_end, p2p_tensor_bytes(m, lay, act_b), 0.0)
    # a zero-bubble weight pass still to run keeps the output gradient the stage received for it (torch's
    # backward_state); with per-micro-batch receive buffers that tensor is already one of them
    # (queued closures: the last block's output gradient, counted in queued_w_bytes_per_layer)
    pend_recv = np.where(queued, 0.0, 0.0 if tr.p2p_buffers_per_microbatch else p2p_tensor_bytes(m, lay, act_b))

    # Gradients are freed after each optimizer step (zero_grad(set_to_none=True), the runtime's
    # and PyTorch's default).  With several micro-batches per step the whole gradient buffer is
    # live during every backward after the first, beside that micro-batch's activations.  With
    # one micro-batch per step the gradients appear block by block as the backward frees the
    # same blocks' activations, so the peak is the larger end of that sweep: all activations
    # plus the first gradients made (the head's, where this stage holds it, and one block's),
    # or all gradients once the activations are gone.
    one_micro = np.asarray(m_micro) == 1
    cast_block = rec["cast"] * np.maximum(per_layer, per_dense)  # the block being cast (stage_total's casts)

    def stage_total(kind_terms, blocks, n_inflight, has_loss, bufs, n_pending=0.0, n_held=0.0, act_layer=act_layer,
                    pend_layer=pend_layer):
        """The larger of two moments: the loss's backward (all saved activations, the loss's peak, and
        the gradients of earlier micro-batches; no block is being back-propagated yet) and the blocks'
        backward (saved activations, gradients, one block's working memory).  kind_terms: the rank
        kind's terms that do not change with the micro-batches in flight (rank_total).
        A zero-bubble moment where every micro-batch held waits for its weight pass (n_pending = n_inflight:
        ZB-V's cool-down runs its input-gradient passes, then the weight passes) has no input-gradient pass
        running: under queued weight passes a weight pass runs, whose closures add no block's working memory
        (block_working; torch's own weight pass is a backward through the retained graph, which does); the input
        pass that made the last of them ran with one block fewer pending (that chunk's earlier blocks had
        queued theirs), beside that block's working memory.  act_layer, pend_layer: the rank kind's mean block's
        (kind_mean)."""
        (w, g, o, offl, g_early, cast_params, loss_kept, per_micro, buckets, blocks_act, hsdp_k, first_grads, loss_g,
         w_o, loss_shown) = kind_terms
        all_pending = queued & (np.asarray(n_pending) > 0) & (np.asarray(n_pending) >= np.asarray(n_inflight))
        acts = blocks * (act_layer * n_inflight + pend_layer * n_pending) + loss_kept + per_micro * n_inflight
        # the flat buckets of the rank's last backward (flat_bucket_bytes): beside its last micro-batch's activations
        # only, so they add where they outgrow the rest of what is held in flight
        working_k = (working - np.where(np.asarray(blocks) > 0, 0.0, of_a_block)
                     + np.maximum(buckets - np.maximum(acts - blocks_act, 0.0), 0.0))
        # FSDP2's hybrid sharding over several micro-batches: each block the last backward has reduced keeps its
        # all-reduce input, a reduce-dtype gradient shard apart from the accumulated one, to the backward's end,
        # while that block's activations are freed; the sweep's worst moment is its start or its last block (hsdp_k)
        working_k = working_k + hsdp_k
        casts = cast_params * n_inflight + cast_block

        def bwd(held, work, one=one_micro, early=g_early, grads=g, first=None):
            first = np.minimum(early, grads) if first is None else first
            return np.where(one, np.maximum(held + first, grads), held + grads) + work
        blocks_bwd, acts_i = bwd(acts, working_k, first=first_grads), acts
        # the all-pending moment, on the candidates it concerns only (a few % of a search; the same numbers as
        # computing it everywhere and selecting, at a fraction of the time)
        shape = np.broadcast(blocks_bwd, acts, all_pending).shape
        sel = np.flatnonzero(np.broadcast_to(all_pending, shape))
        if sel.size:
            def at(x):
                return np.broadcast_to(x, shape).ravel()[sel]
            n_pend_i = np.maximum(at(n_pending) - 1.0 / np.maximum(at(blocks), 1), 0.0)
            acts_i_sel = (at(blocks) * (at(act_layer) * at(n_inflight) + at(pend_layer) * n_pend_i) + at(loss_kept)
                          + at(per_micro) * at(n_inflight))
            one, early, grads, work = at(one_micro), at(g_early), at(g), at(working_k)
            blocks_bwd = np.array(np.broadcast_to(blocks_bwd, shape), dtype=float)
            acts_i = np.array(np.broadcast_to(acts, shape), dtype=float)
            blocks_bwd.ravel()[sel] = np.maximum(bwd(acts_i_sel, work, one, early, grads),
                                                 bwd(at(acts), work - at(block_working), one, early, grads))
            acts_i.ravel()[sel] = acts_i_sel
        blocks_bwd = blocks_bwd + np.where(has_loss, logits_to_stage_end, 0.0)
        loss_bwd = np.where(has_loss, acts_i + loss_peak + loss_g, 0.0)
        bufs = bufs + n_held * sent + n_pending * pend_recv
        total = w_o + np.maximum(blocks_bwd, loss_bwd) + casts + bufs
        # the named terms are each term's largest size (the total is the worse moment, not their sum)
        return dict(weights=w, grads=g, optimizer=o, activations=acts + loss_shown,
                    other=working_k + casts + bufs, total=total, offloaded=offl, moment=MOMENT_BACKWARD)

    head_first = single | zbv

    def worse(a, b):
        """The moment with the larger total, per candidate, and its named terms.  A term both moments hold as the
        same array (the model states) is kept, and where one moment is the larger on every candidate its terms are
        taken whole: the same numbers as selecting term by term, at a fraction of a large search's time."""
        pick_b = b["total"] > a["total"]
        if not np.any(pick_b):
            return a
        if np.all(pick_b) and np.shape(b["total"]) == np.shape(pick_b):
            return b
        return {k: a[k] if a[k] is b[k] else np.where(pick_b, b[k], a[k]) for k in a}

    # the embedding's dropout (Megatron applies the hidden dropout to the embedding's output; parallel_layers.model)
    # keeps a 1-byte mask of h per token (/tp with SP) for each micro-batch in flight on the first rank, at the rank's
    # in-flight count (its first virtual stage holds at least as many under interleaving: a lower bound there)
    embed_mask = (lay.mbs * m.seq_len / lay.cp * m.hidden / np.where(lay.sp > 0, tp, 1)) if tr.dropout else 0.0

    # (what rank_total reads alike on every rank kind: where FSDP2 keeps a stage's root parameters gathered, the
    # loss's saved logits and deferred head gradient where a rank has the loss, DeepSpeed's ZeRO-1 gradients moved
    # into its buckets at the boundary and the bucket beside the optimizer step)
    roots_gathered = fsdp2 & ~z3_full
    loss_held = loss_saved * (logits_inflight - 1) + head_pending
    zero1_moved = ds_zero_optimizer & (zero == 1)
    step_bucket = np.where((zero >= 3) | zero1_moved, ds["held"], 0.0)

    def rank_total(kind, params, blocks, has_loss, head_here, root_params, bufs, per_micro=0.0, experts=0.0):
        """root_params: the stage's parameters outside its blocks (FSDP2 keeps them gathered through the step);
        per_micro: bytes held per micro-batch in flight outside the blocks and the loss (the embedding's dropout
        mask); experts: of params, a mixture of experts' expert weights."""
        w, g, o, offl = states(params, experts)
        w = w + np.where(roots_gathered, root_params * rec["weight"], 0.0)
        k = ("first", "mid", "last").index(kind)
        act_k, pend_k, per_layer_k = (kind_mean(k, x, x_d) for x, x_d in ((act_layer, act_d), (pend_layer, pend_d),
                                                                          (per_layer, per_dense))) \
            if m.mixed else (act_layer, pend_layer, per_layer)
        g_early = grads_of(np.maximum(per_layer, per_dense) + head_here)
        cast_params = blocks * per_layer_k * cast_per_param
        loss_kept = np.where(has_loss, loss_held, 0.0)
        param_grads = params * rec["grad"]
        buckets_bwd, buckets_after = flat_bucket_bytes(param_grads, flat_overlap, blocks, act_k,
                                                       per_layer_k * rec["grad"], head_here * rec["grad"])
        buckets_bwd, buckets_after = (np.where(flat_on, b, 0.0) for b in (buckets_bwd, buckets_after))
        # (what stage_total reads that no moment changes: the rank's blocks' saved activations of one micro-batch,
        # hybrid sharding's held all-reduce inputs, the first gradients a one-micro-batch backward makes, the loss's
        # backward's gradients, the weights and optimizer states together, the loss's peak where the rank has it)
        terms = (w, g, o, offl, g_early, cast_params, loss_kept, per_micro, buckets_bwd, blocks * act_k,
                 np.maximum(blocks - 1, 0) * np.maximum(hsdp_held - act_k, 0.0), np.minimum(g_early, g),
                 np.where(one_micro, 0.0, g), w + o, np.where(has_loss, loss_peak, 0.0))
        alts = [stage_total(terms, blocks, n, has_loss, bufs, pend, held, act_k, pend_k)
                for n, pend, held in inflight[kind]]
        # after the backward: the activations are gone; the reduction at the step's boundary (DeepSpeed's flat
        # copies and buckets: deepspeed_grad_buckets), then the optimizer step's gradient copies
        # (step_grad_copy_bytes) beside ZeRO-3's bucket, each beside the model states.  DeepSpeed's ZeRO-1 reduces
        # at the boundary by moving each gradient into its reduce buckets (reduce_independent_p_g_buckets_and_
        # remove_grads: grad.data = a view of the bucket) and its partition's into grads_in_partition: the step finds
        # the share's gradients, and the buckets kept alive by the other gradients' views until it lets those go
        # (free_grad_in_param_list(params_not_in_partition), group by group: an upper bound, the whole buckets); inside
        # a pipeline that is the one its boundary's reduce_gradients(pipeline_parallel=True) made (self.ipg_buffer =
        # [buf_0]: the list is replaced, so the bucket a last stage's backward had made goes), the size of `held`
        # there (one bucket: the pipeline engine turns overlap_comm off), on every stage
        boundary = np.minimum(param_grads, ds["flat_cap"]) + ds["boundary"] + buckets_after
        g_step = np.where(zero1_moved, g / shards, g)
        at_step = step_grad_copy_bytes(m, params, lay, tr) + step_bucket
        if np.any(at_step) or np.any(boundary):
            step_leads = g_step + at_step > g + boundary
            other = np.where(step_leads, at_step, boundary)
            grads = np.where(step_leads, g_step, g)
            alts.append(dict(weights=w, grads=grads, optimizer=o, activations=np.zeros(np.shape(other)), other=other,
                             total=w + grads + o + other, offloaded=offl,
                             moment=np.where(step_leads, MOMENT_STEP, MOMENT_REDUCTION)))
        return reduce(worse, alts)

    first = rank_total("first", p_first, first_blocks, head_first, np.where(head_first, head, 0.0),
                       p_first - block_params[0], first_bufs, embed_mask, e_first)
    mid = rank_total("mid", p_mid, mid_blocks, False, 0.0, 0.0, mid_bufs, experts=e_mid)
    last = rank_total("last", p_last, last_blocks, ~zbv, np.where(zbv, 0.0, head), np.where(zbv, 0.0, head), last_bufs,
                      experts=e_last)
    # choose the worst stage per candidate
    out = {k: first[k] for k in first}
    out["worst_stage"] = np.zeros_like(p_np)  # 0 first, 1 middle, 2 last
    # each pipeline rank kind's own total (NaN where the pipeline has no such rank)
    out["first_total"] = first["total"]
    out["mid_total"] = np.where(p_np > 2, mid["total"], np.nan)
    out["last_total"] = np.where(p_np > 1, last["total"], np.nan)
    for code, cand, present in ((1, mid, p_np > 2), (2, last, p_np > 1)):
        better = present & (cand["total"] > out["total"])
        for k in first:
            out[k] = np.where(better, cand[k], out[k])
        out["worst_stage"] = np.where(better, code, out["worst_stage"])
    return out


def p2p_tensor_bytes(m: ModelDims, lay, act_bytes: int):
    """One micro-batch's hidden state as the pipeline sends it (sequence-sharded with SP, a 1/cp chunk
    with CP)."""
    return lay.mbs * m.seq_len / lay.cp * m.hidden / np.where(lay.sp > 0, lay.tp, 1) * act_bytes


def p2p_receive_buffers(m: ModelDims, lay, act_bytes: int, m_micro, per_microbatch: bool):
    """Bytes of the pipeline's persistent receive buffers on the first, a middle and the last pipeline
    rank (torch.distributed.pipelining: per stage, one activation buffer per micro-batch unless the
    stage is the first, one gradient buffer per micro-batch unless it is the last).  A rank holds v
    stages: the first rank's include the first stage, the last rank's the last, except under ZB-V,
    whose first rank holds both ends of the V.  Each buffer is one micro-batch's hidden state
    (sequence-sharded with SP, a 1/cp chunk with CP)."""
    p, v = np.asarray(lay.pp), np.asarray(lay.vpp)
    zbv = lay.schedule == SCH_ZBV
    size = p2p_tensor_bytes(m, lay, act_bytes)
    each = np.where(per_microbatch & (p > 1), m_micro * size, 0.0)
    first = np.where(zbv, 2 * v - 2, 2 * v - 1) * each
    last = np.where(zbv, 2 * v, 2 * v - 1) * each
    return first, 2 * v * each, last


def _other_bytes(lay, per_layer, work_layer, act_layer, temp_layer, gathered, rec, fsdp2, z3_full, fsdp2_units=None):
    """Working memory besides saved activations and model states:
      - the block being back-propagated: its backward's temporaries (backward_temporaries_per_layer:
        with flash attention about one block's activations -- a llama block peaks in the SwiGLU
        backward with six ffn-wide tensors live, 0.9-1.0 x the block's saved bytes for the shapes
        here; CPU allocator traces, benchmarks/results/2026-11-23-cpu-memory -- and with unfused
        attention the op-by-op replay), and under recompute the re-run forward's activations beyond what was
        saved (work_layer - act_layer).  It was 2 x one block's activations until the traces of every
        pipeline rank showed it one block high on the lightly loaded ranks (1F1B's last: +12 %);
        what had hidden it on interleaved and zero-bubble ranks were the sends torch's runtime holds
        (rank_inflight's held());
      - ZeRO-3: the all-gathered compute-dtype parameters (`gathered`: two blocks, current + prefetch;
        DeepSpeed's one-weight-ahead prefetch: two weights and a weight's gradient); FSDP2 inside a
        pipeline keeps the gathered weights (counted as weights), so only the all-gather buffer of the
        block being gathered;
      - FSDP2: the reduce-scatter input of the block just back-propagated (one block's gradients
        in the reduce dtype) and the compute-dtype gradients the block being back-propagated is
        making (the CPU measurement found both live beside the next block's gather);
      - optimizer-step temporaries: none for fused/foreach AdamW beyond one block's worth;
      - fsdp2_units (a mixture of experts under FSDP2, where not NaN): in place of the two terms above, a block's
        dense weights and its experts gathered and reduced as units apart (memory_breakdown).
    parplan's flat gradient buckets are counted per rank kind (flat_bucket_bytes); torch DDP's whole copy and
    DeepSpeed's buckets elsewhere (ddp_bucket_copy, deepspeed_grad_buckets); Megatron's buckets are views of its
    grad buffer (TrainingConsts.flat_grad_buckets)."""
    rs_input = np.where(fsdp2 & ~z3_full, per_layer * (rec["grad"] + rec["weight"]), 0.0)
    units = gathered + rs_input
    if fsdp2_units is not None:
        units = np.where(np.isnan(fsdp2_units), units, fsdp2_units)
    return rebuilt_bytes(work_layer, act_layer) + temp_layer + units


FLAT_BUCKET_BYTES = 25 * 2 ** 20  # parallel_layers.data_parallel.BUCKET_BYTES (PyTorch DDP's bucket_cap_mb 25, as MiB)


def flat_bucket_bytes(grads, overlap, blocks=0.0, block_act=0.0, block_grads=1.0, first_grads=0.0):
    """(during the backward, after it) bytes of parplan's flat bucket copies on a rank holding `grads` bytes of
    gradients (parallel_layers.data_parallel: gradients packed in order into buckets of at most 25 MiB, B, each
    copied flat when its reduction starts, at most two in flight; a gradient of 25 MiB or more is reduced in place,
    which the model does not tell apart: an upper bound).

    During the backward (overlap: GradReduction starts a bucket once its gradients are final), which happens only
    in the rank's last backward, of its last micro-batch: its `blocks` blocks are back-propagated in reverse, each
    freeing its activations (`block_act`, one micro-batch's) and making its gradients final (`block_grads`) after
    `first_grads` made first (the head's, on the rank holding it); bucket k (k = 1, 2) starts after j_k blocks,
    j_k = ceil((k B - first_grads) / block_grads), if the rank's gradients fill it.  Returned: how much more than that
    micro-batch's whole activations the moment holds, max(0, k B - j_k block_act) (the caller compares it with the
    activations of the micro-batches in flight, which the last backward no longer holds).  The last, partial bucket
    starts after the backward, when the activations are gone (a CPU allocator trace of a 20M-parameter ZB-V plan: the
    rank holding 24.5 MiB of gradients made its one bucket in its last weight pass).  After the backward, the
    buckets still to reduce, at most two: min(2 B, G).  Without the overlap every bucket is after the backward."""
    b = FLAT_BUCKET_BYTES
    grads = np.asarray(grads, dtype=float)
    per_block = np.maximum(np.asarray(block_grads, dtype=float), 1.0)
    during = np.zeros(np.broadcast(grads, per_block, np.asarray(blocks), np.asarray(block_act),
                                   np.asarray(first_grads)).shape)
    for k in (1, 2):
        j = np.ceil(np.maximum(k * b - np.asarray(first_grads, dtype=float), 0.0) / per_block)
        fits = (grads >= k * b) & (j <= np.asarray(blocks))
        during = np.maximum(during, np.where(fits, k * b - j * np.asarray(block_act, dtype=float), 0.0))
    return np.where(overlap, during, 0.0), np.minimum(2 * b, grads)


def _replace(lay, **kw):
    from dataclasses import replace
    return replace(lay, **kw)
