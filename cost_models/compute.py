"""Compute time of one micro-batch through one block, one embedding and one head, per GPU.

Matrix multiplies: each GEMM's time = FLOPs / (peak x efficiency(FLOPs)), the efficiency from
the profile's measured curve (for the H100, benchmarks/reference/h100_gemm.json): tensor
parallelism shrinks the per-GPU matrices and with them the efficiency.  Backward = 2 GEMMs of
the forward's size (input and weight gradients; Narayanan 2021 sec. 3.2's 3x).

Fused (flash) attention: causal FLOPs (half of 4*b*s^2*h per layer forward), backward 2.5x
the forward (FlashAttention-2, Dao 2023, sec. 3.1), at the profile's attention efficiency.

A block can be launch-bound: it takes max(GPU time, host dispatch time), the latter measured by
`parplan calibrate` for parplan's runtime on the machine (0 when the profile has no measurement).

Everything else (norms, rotary, activation, residual adds, cross-entropy, autocast casts,
optimizer) is memory-bound: bytes moved / achievable HBM bandwidth (roofline model, Williams
et al. 2009).  Byte counts are listed with each function.
"""
from __future__ import annotations

import numpy as np

from .layout import PRECISION_RECIPES, REC_FULL, REC_SELECTIVE, REC_SELECTIVE_OP, ModelDims
from . import moe
from .params import block_norms, mla_projections, op_sac_recomputed_matmuls, titan_op_sac_matmuls


def gemm_time(flops, hw):
    return flops / (hw.peak_flops * hw.matmul_efficiency(flops))


def linear_gemm_time(flops, hw):
    """A GEMM of the blocks' linear layers (qkv, projection, MLP: layer_gemms), forward, input- or weight-gradient.
    Under an FP8 plan (Training.fp8: Transformer Engine's hybrid format, torchao's float8) all three run on the FP8
    tensor cores at the profile's fp8 peak (hw.linear_peak_flops; attention, embedding and output layer stay in the
    16-bit dtype), at the efficiency the profile's 16-bit curve gives a GEMM of the same ideal duration, FLOPs x
    (16-bit peak / fp8 peak) -- a GEMM's fixed costs (launch, prologue, the last wave) are a time, so an FP8 GEMM of
    given FLOPs reaches the fraction of peak a 16-bit one of half the FLOPs does -- times the profile's measured
    ratio of the best FP8 GEMM's fraction of peak to the best 16-bit one's (fp8_matmul_scale: H100 0.882, from the
    maximum achievable matmul FLOPS table; `parplan calibrate` measures the machine's own on a GPU with FP8 tensor
    cores).  The curve's shape under FP8 is that assumption.  Not FP8: gemm_time exactly."""
    ratio = hw.peak_flops / hw.linear_peak_flops
    return flops / (hw.linear_peak_flops * hw.linear_efficiency_scale * hw.matmul_efficiency(flops * ratio))


def layer_gemms(m: ModelDims, tokens, tp, seq_split=1):
    """FLOPs of the forward GEMMs of one block on one TP rank: [(name, flops)].  Multi-head latent attention: its
    projections (params.mla_projections), the up and output ones split by heads, the two down projections whole on
    every rank (Megatron-Core's MLASelfAttention runs them duplicated), on the rank's sequence shard under sequence
    parallelism (seq_split = tp: the latents are gathered after them) and on the whole sequence without it, or where
    the block input is gathered before them (ModelDims.mla_input_gathered: torchtitan's deepseek_v3)."""
    h, qw, kvw, f = m.hidden, m.q_width, m.kv_width, m.ffn
    if m.kv_lora:
        down_split = 1 if m.mla_input_gathered else seq_split
        gemms = [(name, 2 * tokens * i * o / (down_split if replicated else tp))
                 for name, i, o, replicated in mla_projections(h, m.heads, m.head_dim, m.mla)]
    else:
        gemms = [
            ("qkv", 2 * tokens * h * (qw + 2 * kvw) / tp),
            ("proj", 2 * tokens * qw * h / tp),
        ]
    if m.arch == "llama":  # the runtime's SwiGLU: separate gate and up column-parallel matmuls
        gemms += [("gate", 2 * tokens * h * f / tp), ("up", 2 * tokens * h * f / tp)]
    else:
        gemms += [("fc1", 2 * tokens * h * f / tp)]
    return gemms + [("fc2", 2 * tokens * f * h / tp)]


MLP_GEMMS = ("gate", "up", "fc1", "fc2")
# the GEMMs whose input is the attention's normed input or a latent of it (column-parallel, or MLA's down projections):
# the last of them in a block's list feeds the attention core
ATTN_IN_GEMMS = ("qkv", "q_down", "q_up", "q", "kv_down", "kv_up")


def sp_split(lay):
    """How many ways a block's tokens outside the tensor-parallel region are split: tp with sequence parallelism."""
    return np.where(np.asarray(lay.sp) > 0, lay.tp, 1)


def layer_matmul_time(m: ModelDims, lay, hw):
    """(forward, backward) GEMM seconds of one block for one micro-batch.  A mixture of experts' MLP GEMMs are the
    rank's E / ep experts' (moe.local_experts), each at the efficiency of its own share of the FLOPs (routing
    balanced: moe's docstring)."""
    tokens = lay.mbs * m.seq_len / lay.cp
    fwd = 0.0
    n = moe.local_experts(m, lay)
    for name, flops in layer_gemms(m, tokens, lay.tp, sp_split(lay)):
        if m.moe and name in MLP_GEMMS:
            # the routed experts' share of the MLP's FLOPs (a shared expert's is its own tensor-parallel GEMM)
            routed = flops * m.routed_ffn / m.ffn
            fwd = fwd + n * linear_gemm_time(routed / n, hw)
            if m.shared_ffn:
                fwd = fwd + linear_gemm_time(flops - routed, hw)
        else:
            fwd = fwd + linear_gemm_time(flops, hw)
    return fwd, 2 * fwd


def moe_mlp_matmul_time(m: ModelDims, lay, hw):
    """Forward GEMM seconds of a mixture of experts' MLP in one block for one micro-batch: the rank's routed experts'
    (as layer_matmul_time prices them) and a shared expert's -- Megatron-Core's `mlp` node of a layer, which its
    combined 1F1B runs beside another micro-batch's all-to-alls (moe.overlapped_all_to_alls).  0 for a dense model."""
    if not m.moe:
        return 0.0
    tokens = lay.mbs * m.seq_len / lay.cp
    n = moe.local_experts(m, lay)
    out = 0.0
    for name, flops in layer_gemms(m, tokens, lay.tp, sp_split(lay)):
        if name in MLP_GEMMS:
            routed = flops * m.routed_ffn / m.ffn
            out = out + n * linear_gemm_time(routed / n, hw) + (linear_gemm_time(flops - routed, hw)
                                                                 if m.shared_ffn else 0.0)
    return out


def op_sac_recompute_gemm_time(m: ModelDims, lay, hw):
    """Seconds of the forward GEMMs torchtitan's op-level selective checkpointing re-runs in one
    block's backward (params.op_sac_recomputed_matmuls: llama's K projection, attention output
    projection and up projection; a gpt block's qkv, fc1 and fc2)."""
    tokens = lay.mbs * m.seq_len / lay.cp
    out = 0.0
    if m.titan_moe:  # torchtitan's MoE model (params.titan_op_sac_matmuls): every second mm, every expert GEMM
        for j, (i, o, kind) in enumerate(titan_op_sac_matmuls(m)):
            if j % 2 == 1:
                out = out + linear_gemm_time(2 * tokens * i * o / (1 if kind == "rep" else lay.tp), hw)
        if m.moe:  # the rank's routed experts, as layer_matmul_time prices them
            n = moe.local_experts(m, lay)
            out = out + 3 * n * linear_gemm_time(2 * moe.routed_tokens(m, lay) * m.hidden * m.routed_ffn / n, hw)
        return out
    for params in op_sac_recomputed_matmuls(m.arch, m.hidden, m.q_width, m.kv_width, m.ffn, m.qkv_bias):
        out = out + linear_gemm_time(2 * tokens * params / lay.tp, hw)
    return out


def column_input_grad_time(m: ModelDims, lay, hw):
    """Seconds of the input-gradient GEMMs of one block's column-parallel layers (qkv, gate and up
    or fc1) for one micro-batch: each has its forward's FLOPs.  Sequence parallelism's backward
    all-gather of their input runs beside them."""
    tokens = lay.mbs * m.seq_len / lay.cp
    out = 0.0
    # a mixture of experts' routed MLP is not tensor-parallel (expert tensor parallelism 1): its qkv, and a shared
    # expert's gate and up
    for name, flops in layer_gemms(m, tokens, lay.tp, sp_split(lay)):
        if name in ATTN_IN_GEMMS or (name in ("gate", "up", "fc1") and not m.moe):
            out = out + linear_gemm_time(flops, hw)
        elif name in ("gate", "up") and m.shared_ffn:
            out = out + linear_gemm_time(flops * m.shared_ffn / m.ffn, hw)
    return out


# Multi-head latent attention's up projections, as Megatron-LM's --recompute-modules mla_up_proj recomputes them
# (TrainingConsts.mla_recompute): the GEMMs from the latents to the heads' queries, keys and values
MLA_UP_GEMMS = ("q_up", "q", "kv_up")


def mla_up_recompute_time(m: ModelDims, lay, hw):
    """Seconds a block's backward spends re-running multi-head latent attention's up projections (MLA_UP_GEMMS)
    for one micro-batch, whose outputs (the attention core's q, k and v) the forward did not keep
    (memory.mla_up_saved_bytes); their rotary and concatenations are left out (a few % of the GEMMs' time).
    parplan's runtime (ModelDims.v_padded: parallel_layers.model.MLAttention) rebuilds from the latents only: without
    a query latent it keeps the full query projection's output (memory.parplan_mla_up_saved_bytes), so "q" is not
    re-run."""
    tokens = lay.mbs * m.seq_len / lay.cp
    names = tuple(n for n in MLA_UP_GEMMS if n != "q") if m.v_padded else MLA_UP_GEMMS
    return sum(linear_gemm_time(flops, hw) for name, flops in layer_gemms(m, tokens, lay.tp) if name in names)


# The Triton FlashAttention of 2022 against FlashAttention-2 (Dao 2023, "FlashAttention-2", sec. 4.1, A100
# 80GB, fig. 4-6): "FlashAttention-2 is around 1.3-1.5x faster than FlashAttention in Triton in the forward
# pass and around 2x faster in the backward pass".  The forward takes the range's middle.
TRITON_2022_FWD_SLOWDOWN = 1.4
TRITON_2022_BWD_SLOWDOWN = 2.0


def attention_core_time(m: ModelDims, lay, hw, flash: bool, dropout: bool = False, kernel: str = "profile",
                        act_bytes: int = 2):
    """(forward, backward) seconds of softmax(QK^T)V for one block and micro-batch.

    flash: causal FLOPs 0.5 * 4 * b * s^2 * (heads*head_dim) / (tp*cp) forward, backward 2.5x,
    at the profile's measured attention efficiency for this sequence length; a sliding window as the framework
    trains it (ModelDims.window) counts only the band's pairs, s w - w^2 / 2 of a windowed layer's s^2 / 2.
    kernel triton-2022 (llm-foundry's attn_impl triton): FlashAttention-2's speed, which on a GPU newer
    than the kernel is at most FlashAttention-2's published best there (hw.fa2_peak_flops: 335 TFLOP/s
    on H100, whose TMA and wgmma neither kernel uses; Dao 2023 sec. 4.1), slowed by the Triton kernel's
    published gap: 1.4x forward, 2x backward.
    unfused: two batched GEMMs of 2*b*s^2*qw/(tp*cp) each (no causal skipping, nor a window's: it is a mask) plus the softmax
    over b*heads*s^2/(tp*cp) scores of act_bytes each: read+write forward (2 passes), 3 passes backward; attention
    dropout adds read + write + 1-byte mask per score forward and the same backward (fused flash
    kernels regenerate the mask from the RNG state: no extra traffic)."""
    b, s = lay.mbs, m.seq_len
    per_gpu = lay.tp * lay.cp
    if flash:
        # a sliding window: the kernel skips the tiles outside the band (ModelDims.causal_pairs_fraction)
        # (multi-head latent attention: QK^T at head_dim, the values' product at v_dim, or at head_dim where parplan's
        # runtime pads them: ModelDims.core_width; at the efficiency the profile measured, with 128-wide heads: not
        # measured at MLA's 192 / 128)
        fwd_flops = 0.5 * 4 * b * s * s * m.core_width / per_gpu * m.causal_pairs_fraction()
        eff = hw.attention_efficiency(s)
        slow_f = slow_b = 1.0
        if kernel == "triton-2022":
            eff = np.minimum(eff, hw.sustained * hw.fa2_peak_flops / hw.peak_flops)
            slow_f, slow_b = TRITON_2022_FWD_SLOWDOWN, TRITON_2022_BWD_SLOWDOWN
        fwd = fwd_flops / (hw.peak_flops * eff)
        return slow_f * fwd, slow_b * 2.5 * fwd
    bmm = 2 * b * s * s * m.core_width / per_gpu
    scores = b * m.heads * s * s / per_gpu
    gemm = 2 * gemm_time(bmm, hw)
    softmax_fwd = scores * 2 * act_bytes / hw.hbm_bytes_per_s
    drop = scores * (2 * act_bytes + 1) / hw.hbm_bytes_per_s if dropout else 0.0
    return gemm + softmax_fwd + drop, 2 * gemm + 1.5 * softmax_fwd + drop


def layer_elementwise_time(m: ModelDims, lay, hw, act_bytes: int, dropout: bool = False, fused: bool = True,
                           eager_runtime: str = "torchtitan"):
    """(forward, backward, activation-function forward) seconds of the memory-bound kernels of
    one block.

    Elements moved per token, forward (read + write):
      2 norms (read h, write h)                              4h   (/tp with SP)
      2 residual adds (read 2h, write h)                     6h   (/tp with SP)
      rotary on q and k (read, write; llama)                 2(qw+kvw)/tp
      q/k norms where the model has them (ModelDims.qk_norm) 2(qw+kvw)/tp
      2 post-norms where the model has them (ModelDims.post_norms)      4h   (/tp with SP)
      SwiGLU: read gate, up, write product (llama)           3 ffn/tp
      GeLU + bias (gpt): read, write                         2 ffn/tp
      hidden dropout fused into the residual add (Megatron bias-dropout-add): the 1-byte mask of
      each of the 2 dropouts is written forward and read backward                (2h bytes)
    Backward moves about twice the forward's bytes (gradient in, gradient out, saved input).

    fused=False: eager PyTorch, one pass per op, as torchtitan's llama runs without training.compile
    (torchtitan/models/llama at 9dec370, 2024-12; a = act_bytes, per element, forward):
      RMSNorm x.float(), pow(2), mean, x * rsqrt, type_as, * weight (fp32 in between)   28 + 5a  per h, x2
        (gpt: torch's LayerNorm is one native kernel even in eager: 2a)
      residual adds                                                                      3a per h, x2
      rotary as a complex fp32 multiply: float(), complex mul, type_as                   16 + 2a per q/k element
      GQA: repeat_kv materialises K and V at the query width (kv_heads < heads)         a (2 kvw + 2 qw)
      SwiGLU silu(w1 x) * (w3 x): two kernels (gpt: GeLU, one)                           5a per ffn (gpt 2a)
      (the attention output's transpose(1, 2).contiguous() is a no-op: SDPA's output keeps the query's
      (b, s, h, d) layout)
    tests/test_eager_pointwise.py counts every pointwise op of tests/runtime_helpers/torchtitan_block.py
    (that block as written, bf16, CPU): forward and backward within 5 % of this table, the backward 2.07x
    the forward.  For a Llama 3 8B block in bf16 that is 3.3x the fused bytes.

    eager_runtime="parplan": parplan's own runtime uncompiled (`parplan launch --no-compile`; its ops in
    parallel_layers/model.py, each one pass, a = act_bytes, per element; f = 1 where 16-bit inputs are
    upcast, 0 in fp32).  Its backward is counted op by op, not as twice the forward:
      _RMSNorm forward: x.float(), pow, mean, * rstd, * weight, .to               f(2a + 8) + 28   per h, x2
        (the same per q/k element where the model has q/k norms, ModelDims.qk_norm; post-norms: x4)
               backward: x.float() * rstd, grad.float(), g * xhat, sum, g * w, dxhat * xhat,
                         mean, xhat * m, subtract, rstd *, .to                      f(3a + 12) + 76  per h, x2
        (gpt: torch's native LayerNorm, 2a forward and 3a backward)
      residual adds, forward and the backward's gradient sum                       3a each way per h, x2
      rotary, forward: x * cos, -x2, cat, * sin, +                                 10a  per q/k element
              backward: grad * sin, neg, two slice gradients (zeros + copy), grad * cos, two sums   15a
      _SwiGLU forward: silu, *                                                     5a   per ffn element
              backward: sigmoid, gate * sig, grad * up, * sig, 1 - sig, gate *, 1 +, *, grad * silu   24a
        (gpt: GeLU 2a forward, 3a backward)
      GQA: none (SDPA's enable_gqa); the attention output's reshape is a view.
      the input gradient of linears sharing an input (q, k, v; gate, up): one sum per extra    3a per h
      gpt: row-parallel biases added after the reduction (2a per h, x2: the bias an h-vector), bias gradients (a per
        output); attention and MLP side by side (ModelDims.parallel_block): one norm, one input-gradient sum more (the
        five, or four, linears on the norm's output), one residual add and the output projections' partial sums added
        on the whole sequence, one residual-gradient sum, gpt's two output biases added and summed once; llama's
        q/k/v biases where the model has them (ModelDims.qkv_bias): their gradients, a per q, k and v output
      hidden dropout (parallel_layers.dropout), per h, x2: forward the mask drawn (1) and applied by
        native_dropout_backward (a + 1 read, a written); backward the same product on the gradient  2a + 2, 2a + 1
    tests/test_eager_pointwise.py counts every pointwise op of the runtime's blocks (forward and backward,
    bf16, CPU) and checks this table against it.  For the H100 grid's 1.3B llama in bf16 it is 1.11 MB
    per token forward + backward against the torchtitan table's 1.00 (the backward 2.6x the forward)."""
    tokens = lay.mbs * m.seq_len / lay.cp
    seq_split = np.where(lay.sp > 0, lay.tp, 1)
    a = act_bytes
    llama = m.arch == "llama"
    if not fused and eager_runtime == "parplan":
        return _parplan_eager_time(m, lay, hw, a, dropout, tokens, seq_split)
    if fused:
        outside = 10 * m.hidden / seq_split * a
        if m.parallel_block:
            # attention and MLP side by side (ModelDims.parallel_block): one norm, one residual add, and the two output
            # projections' partial sums added before their one reduction (read 2h, write h, on the whole sequence)
            outside = 5 * m.hidden / seq_split * a + 3 * m.hidden * a
        inside = ((2 * (m.q_width + m.kv_width) + 3 * m.ffn) if llama else 2 * m.ffn) / lay.tp * a
        act_elems = (3 if llama else 2) * m.ffn / lay.tp * a
    else:
        norm = (28 + 5 * a) if llama else 2 * a
        outside = 2 * (norm + 3 * a) * m.hidden / seq_split
        # (torchtitan's MoE models, 0.2 and later only, pass SDPA enable_gqa: no repeat_kv; ModelDims.titan_moe)
        gqa = a * 2 * (m.kv_width + m.q_width) if (llama and m.kv_heads < m.heads and not m.titan_moe) else 0.0
        attn = ((16 + 2 * a) * (m.q_width + m.kv_width) if llama else 0.0) + gqa
        act_elems = (5 if llama else 2) * a * m.ffn / lay.tp
        inside = attn / lay.tp + act_elems
    if m.qk_norm:
        # q/k norms (ModelDims.qk_norm): one more pass over q and k (read, write), eager too (torch's nn.RMSNorm
        # runs one fused kernel on a GPU: memory.activation_bytes_per_layer); a compiler that fuses them into the
        # rotary's kernel saves it (an upper bound there)
        inside = inside + 2 * a * (m.q_width + m.kv_width) / lay.tp
    post_bwd = 0.0  # what the backward of eager post-norms moves beyond twice their forward
    if m.post_norms:
        # norms on the sublayers' outputs (ModelDims.post_norms): two norms more, as the input norms run them.  Eager
        # (torchtitan's RMSNorm), each one's backward is counted op by op (tests/test_eager_pointwise.py, bf16 CPU):
        # grad * output and its sum for the weight, grad * weight, .float(), * rstd and * x with its row sum, the
        # mean's and pow's gradients (4 fp32 passes), their sum and the cast back: 6a + 72 + f(2a + 8) bytes per h
        # (f = 1 for 16-bit inputs), 96 in bf16 against the 2 x 38 the block's "twice the forward" gives
        outside = outside + 2 * (2 * a if fused else norm) * m.hidden / seq_split
        if not fused and llama:
            norm_bwd = 6 * a + 72 + ((2 * a + 8) if a < 4 else 0)
            post_bwd = tokens * 2 * (norm_bwd - 2 * norm) * m.hidden / seq_split / hw.hbm_bytes_per_s
    if m.kv_lora:
        # multi-head latent attention's two latent RMSNorms, on the whole sequence on every rank (sequence
        # parallelism gathers the latents before them): read and write, or the eager norm's passes.  Its rotary
        # and the concatenations of the rotary and no-rope parts are taken as the q / k passes above
        outside = outside + (4 * a if fused else norm) * m.mla.latent_norms()
    fwd = tokens * (outside + inside + (2 * m.hidden / seq_split if dropout else 0.0)) / hw.hbm_bytes_per_s
    activation_fwd = tokens * act_elems / hw.hbm_bytes_per_s
    return fwd, 2 * fwd + post_bwd + qkv_bias_grad_time(m, lay, hw, a, tokens), activation_fwd


def qkv_bias_grad_time(m: ModelDims, lay, hw, a: int, tokens):
    """Seconds of the q/k/v biases' gradients (ModelDims.qkv_bias: Qwen2), the output gradients summed over the tokens:
    one read of the q, k and v widths a token (a bytes an element; the forward's bias add is the GEMM's, addmm), in
    the backward; 0 without them (gpt blocks' biases are in their own terms)."""
    return tokens * a * (m.q_width + 2 * m.kv_width) / lay.tp / hw.hbm_bytes_per_s if m.qkv_bias else 0.0


def _parplan_eager_norm_bytes(m: ModelDims, a: int):
    """(forward, backward) bytes an element of one of parplan's uncompiled norms moves (layer_elementwise_time's table:
    its _RMSNorm op by op, f = 1 where 16-bit inputs are upcast; gpt: torch's native LayerNorm)."""
    if m.arch == "llama":
        f = 1.0 if a < 4 else 0.0
        return f * (2 * a + 8) + 28, f * (3 * a + 12) + 76
    return 2 * a, 3 * a


def _parplan_qk_norm_stats(m: ModelDims) -> float:
    """Bytes an element of a q/k norm moves for its statistics beyond _parplan_eager_norm_bytes, each way: gpt's
    LayerNorm writes its fp32 mean and rstd a head-row forward and reads them back (8 B over head_dim: 3 % of its bytes
    on 64-wide heads, where on a whole hidden row they are nothing, as on a whole q or k width: ModelDims.qk_norm_whole);
    llama's RMSNorm table counts its rstd already."""
    return 0.0 if m.arch == "llama" or m.qk_norm_whole else 8 / m.head_dim


def _parplan_eager_time(m: ModelDims, lay, hw, a: int, dropout: bool, tokens, seq_split):
    """layer_elementwise_time for parplan's runtime uncompiled (its docstring has the table)."""
    llama = m.arch == "llama"
    h = m.hidden / seq_split
    # the input gradient of column-parallel linears that share an input (q, k, v; llama's gate and up) is
    # one sum per extra linear, on the whole sequence (inside the TP region)
    # (side by side, ModelDims.parallel_block: the five, or gpt's four, input projections share one input)
    sums = ((4 if llama else 3) if m.parallel_block else (2 + (1 if llama else 0))) * 3 * a * m.hidden
    norm_f, norm_b = _parplan_eager_norm_bytes(m, a)
    # the residual adds, forward, and the backward's sums of the residual's gradient and the norm's: two each, or side
    # by side one residual add beside the two output projections' partial sums added on the whole sequence before their
    # one reduction (whose backward hands both the same gradient), and one sum
    adds_f = (3 * a * h + 3 * a * m.hidden) if m.parallel_block else 2 * 3 * a * h
    adds_b = 3 * a * h if m.parallel_block else 2 * 3 * a * h
    if llama:
        qk = (m.q_width + m.kv_width) / lay.tp
        inside_f, inside_b = 10 * a * qk + 5 * a * m.ffn / lay.tp, 15 * a * qk + 24 * a * m.ffn / lay.tp + sums
        act_elems = 5 * a * m.ffn / lay.tp
    else:
        # row-parallel biases are added after the reduction (2 adds); every bias gradient is a sum of its
        # layer's output gradient over the tokens
        # (side by side: the two output biases added together after the one reduction, one add and one gradient sum;
        # an add of a bias reads the output and writes it, 2a, the bias itself an h-vector)
        out_biases = 1 if m.parallel_block else 2
        bias_grads = a * ((m.q_width + 2 * m.kv_width + m.ffn) / lay.tp + out_biases * h)
        inside_f = 2 * a * m.ffn / lay.tp + out_biases * 2 * a * h
        inside_b = 3 * a * m.ffn / lay.tp + sums + bias_grads
        act_elems = 2 * a * m.ffn / lay.tp
    drop_f, drop_b = (2 * (2 * a + 2) * h, 2 * (2 * a + 1) * h) if dropout else (0.0, 0.0)
    norms = block_norms(m.post_norms, m.parallel_block)  # (post-norms: the same Norm on each sublayer's output)
    # q/k norms (ModelDims.qk_norm): the same Norm on every query and key head, the rank's heads on the whole sequence
    qk_norms = (m.q_width + m.kv_width) / lay.tp if m.qk_norm else 0.0
    qk_stats = _parplan_qk_norm_stats(m)
    fwd = tokens * (norms * norm_f * h + adds_f + qk_norms * (norm_f + qk_stats) + inside_f + drop_f
                    ) / hw.hbm_bytes_per_s
    bwd = tokens * (norms * norm_b * h + adds_b + qk_norms * (norm_b + qk_stats) + inside_b + drop_b
                    ) / hw.hbm_bytes_per_s + qkv_bias_grad_time(m, lay, hw, a, tokens)
    return fwd, bwd, tokens * act_elems / hw.hbm_bytes_per_s


# The cross-entropy's passes over the logits, bytes per logit over forward and backward, counted from the
# code (not measured):
# - Megatron's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py, the unfused
#   path): the cast of the 16-bit logits to fp32 (read 2, write 4), the max (4), the in-place subtraction
#   of it (4 + 4), the in-place exp (4 + 4), the sum (4) and the in-place division (4 + 4) forward, 38;
#   backward the in-place scaling by the loss gradient (4 + 4) and autograd's cast of the fp32 gradient
#   back to the logits' dtype (4 + 2), 14: 52.
# - An autograd F.cross_entropy over fp32 logits (parplan's runtime, torchtitan) comes to the same: the cast
#   (2 + 4), log_softmax's max, sum and write passes (4 + 4 + 4 + 4), nll_loss's dense gradient (4),
#   log_softmax's backward (two reads for the sum, 4 + 4, then 4 + 4 read and 4 written) and the cast
#   back (4 + 2): 52.
# - flash-attn's Triton cross-entropy (flash_attn/ops/triton/cross_entropy.py; llm-foundry's
#   fused_crossentropy, --cross-entropy-16bit-grad): one forward pass reading the 16-bit logits (2), one
#   backward pass reading them again (2) and writing the gradient in their dtype (2): 6.
# - parplan's runtime's fused cross-entropy (parallel_layers.layers._FusedVocabParallelCE: eager kernels over
#   chunks of rows): forward the argmax (2), the upcast of a chunk (2 + 4) and log_softmax's max, sum and write
#   passes (4 + 4 + 4 + 4); backward the upcast, softmax's passes and the scaling written straight into the
#   16-bit gradient (4 + 2): 52, as the autograd loss (where torch's softmax upcasts inside its kernel, as for
#   fp16 on CUDA, 12 less).
CE_BYTES_PER_LOGIT = 52.0
CE_BYTES_PER_LOGIT_FLASH_ATTN = 6.0
CE_BYTES_PER_LOGIT_PARPLAN_FUSED = 52.0


def head_time(m: ModelDims, lay, hw, ce_bytes_per_logit: float = CE_BYTES_PER_LOGIT):
    """(forward, backward) seconds of the output head and the vocab-parallel cross-entropy.
    GEMM 2*T*h*V/tp; the cross-entropy's passes over the logits (ce_bytes_per_logit, forward and
    backward together, split evenly) at HBM bandwidth."""
    tokens = lay.mbs * m.seq_len / lay.cp
    gemm = gemm_time(2 * tokens * m.hidden * m.vocab / lay.tp, hw)
    ce = tokens * m.vocab / lay.tp * ce_bytes_per_logit / hw.hbm_bytes_per_s
    return gemm + 0.5 * ce, 2 * gemm + 0.5 * ce


def cast_time(params_per_gpu, precision: str, hw):
    """autocast (amp) re-casts fp32 weights to 16 bit every forward: read 4 + write 2 bytes."""
    if PRECISION_RECIPES[precision]["cast"] == 0:
        return 0.0 * params_per_gpu
    return params_per_gpu * 6 / hw.hbm_bytes_per_s


def optimizer_time(params_on_gpu, offloaded_params, precision: str, hw, gpus_per_node_used, tensors=0, over_link=True,
                   shard_is_master=False):
    """AdamW step, memory-bound: read param, grad, m, v and write param, m, v (7 x 4 = 28 B per
    fp32 parameter).  The master-weights recipes then copy the fp32 master into the 16-bit parameter
    in a separate pass (read 4 + write 2: parplan's MasterAdamW, Megatron's distributed optimizer),
    and with 16-bit gradients (-half-grads) first upcast the gradient (read 2 + write 4).  Offloaded states
    step on the host (host DRAM bandwidth shared by the node's GPUs) after the gradients cross
    the host link (4 B/param) and before the updated 16-bit/fp32 weights come back; not over_link (FSDP2's
    CPUOffloadPolicy, whose gathers and reduce-scatters copy the shards: cost_models.total) no copy a step.
    Check that the host step is bandwidth-bound, not compute-bound (2026-11-22, this project's 2-core
    CPU VM, torch 2.13 fused CPU AdamW on 50M fp32 params): 33 ms per step = 1.5 Gparam/s = 42 GB/s at
    28 B/param, above the same VM's 26 GB/s tensor copy; the foreach (unfused) AdamW was 4x slower.
    The runtime's offload copies are blocking and per parameter, so for parplan launch this term is
    a lower bound.
    Torch's FSDP (shard_is_master: ZeRO-3 as FSDP2, or FSDP1's flat parameters) steps the fp32 shard, which is
    the master, on a gradient its reduce-scatter already cast to fp32 (grad_accumulation_time's to_shard): no
    copy to 16 bit and no upcast at the step; each all-gather casts the shard on its copy-in stream instead
    (FSDPParam.all_gather_inputs' _to_dtype_if_needed), beside the compute.
    The profile may scale the on-GPU passes by the bandwidth fraction they reach and add host seconds
    per parameter tensor (`tensors` on this rank), both fitted from runs' after-backward phase."""
    rec = PRECISION_RECIPES[precision]
    copies = (6 if rec["master"] else 0) + (6 if rec["master"] and rec["grad"] == 2 else 0)
    bytes_per_param = 28 + np.where(shard_is_master, 0, copies)
    on_gpu = (params_on_gpu * bytes_per_param / (hw.hbm_bytes_per_s * hw.optimizer_bw_fraction)
              + tensors * hw.optimizer_host_per_tensor_s)
    host_bw = hw.host_memory_bytes_per_s_per_node / gpus_per_node_used
    off = offloaded_params * (bytes_per_param / host_bw
                              + np.where(over_link, (4 + rec["weight"]) / hw.host_link_bytes_per_s, 0.0))
    return on_gpu + off


def grad_clip_time(grad_params, precision: str, hw, scales: bool = True):
    """Global gradient-norm clipping, memory-bound, per step: the norm reads every gradient the rank
    holds (the fp32 main_grad under master-weights), and the scaling pass reads and writes them again
    (torch's clip_grad_norm_ and parplan's runtime multiply by the clamped coefficient every step;
    Megatron-LM only when the norm exceeds the threshold, `scales` False: its norm pass alone)."""
    return _grad_passes_time(grad_params, precision, hw, 3 if scales else 1)


def _grad_passes_time(grad_params, precision: str, hw, passes: float):
    """Seconds of `passes` memory-bound passes (a read, or a write) over the gradients a rank holds, in their dtype;
    in the after-backward phase beside the optimizer step: at the bandwidth fraction the profile fits for it."""
    return grad_params * PRECISION_RECIPES[precision]["grad"] * passes / (hw.hbm_bytes_per_s * hw.optimizer_bw_fraction)


def scales_loss(dtype: str, precision: str) -> bool:
    """Whether training scales the loss dynamically: fp16 under a 16-bit recipe (bf16 has fp32's exponent range)."""
    return dtype == "fp16" and precision != "fp32"


def loss_scale_time(grad_params, precision: str, hw):
    """fp16's dynamic loss scaling, per step (Micikevicius et al. 2018 sec. 3.2): after the reduction every gradient
    the rank holds is checked for inf/NaN and multiplied by 1/S in one fused pass, a read and a write of each
    (torch's _amp_foreach_non_finite_check_and_unscale_: torch.amp.GradScaler, Megatron-LM's
    MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan over its fp32 main grads, parplan's runtime:
    parallel_layers.loss_scale).  DeepSpeed's fp16 optimizers check in a pass of their own and unscale inside the
    clipping's multiply, about one pass more; not told apart.  Only where scales_loss (the caller's check)."""
    return _grad_passes_time(grad_params, precision, hw, 2)


def fp8_cast_time(m: ModelDims, lay, hw, fp8: str, act_bytes: int = 2):
    """(forward, backward) seconds of the quantization passes of one block's FP8 linears for one micro-batch
    (memory-bound: bytes / HBM bandwidth; per-tensor scaling).
      te (Transformer Engine under Megatron-LM, delayed scaling: the scale is known before the tensor, so the
        amax comes out of the same pass; each cast reads the 16-bit tensor and writes it in FP8 twice, row-wise for
        one GEMM and transposed for the other, as Hopper's FP8 GEMM takes only the TN layout: act_bytes + 2 bytes
        an element): forward, the attention output before its projection (the norms and
        the MLP's activation write their outputs in FP8 themselves, LayerNormLinear / LayerNormMLP);
        backward, every linear's output gradient (qkv, projection, the MLP's first layer(s), its second).
        The weights' FP8 copies are made once a step (--fp8-param-gather: the optimizer's all-gather hands out
        FP8 weights; their transposes on the first micro-batch), not counted.
      torchao (torchao's float8 under torchtitan, dynamic tensor-wise scaling: an amax pass first, another read)
        forward, every linear's input, once per linear (torchtitan's llama multiplies the attention norm's output
        by wq, wk and wv, the MLP norm's by w1 and w3, each casting it), and every weight once a micro-batch
        (each micro-batch's forward casts its linears' weights); backward, the saved 16-bit inputs again (torchao's
        autograd function saves the input in 16 bits, torchao/float8/float8_linear.py's save_for_backward), every
        weight again (for the input gradient) and every linear's output gradient twice (row-wise for the input
        gradient, column-wise for the weight's).
        2 act_bytes + 1 an element: the amax read, the cast's read and its FP8 write.
      parplan (parplan's runtime, parallel_layers.fp8: torchao's tensor-wise recipe, each cast one amax pass and one
        fused cast pass, 2 act_bytes + 1 an element): forward, each linear input once (q/k/v and the MLP's first
        layers share theirs) and every weight; backward, the saved inputs and the weights again, every output
        gradient once, and FP8 transposes (1 byte read and written an element) of the inputs and the output
        gradients for the weight gradient and of the weights for the input gradient.
    Not FP8 (fp8 ""): 0.  The amax reductions (kilobytes) are not counted."""
    if not fp8:
        return 0.0, 0.0
    tokens = lay.mbs * m.seq_len / lay.cp
    tp = lay.tp
    h, qw, kvw, f = m.hidden, m.q_width, m.kv_width, m.ffn
    mlp_in = 2 * f if m.arch == "llama" else f
    # the linears' output gradients, per token on one TP rank: a row-parallel output is the whole sequence's h
    grads_out = (qw + 2 * kvw + mlp_in) / tp + 2 * h
    # (multi-head latent attention: the output projection's input is o_width; its up projections' outputs are taken
    # as the q / k / v widths, its latents' few thousand elements a token left out)
    if fp8 == "te":
        per = act_bytes + 2
        fwd = tokens * m.o_width / tp * per
        if m.moe:
            # a mixture of experts' MLP has no LayerNormMLP to write its input in FP8: the grouped GEMMs cast the
            # dispatched tokens (k h a routed token) and the activation's output (k expert_ffn), a shared expert its
            # gathered input (h) and its activation's output (shared_ffn / tp); the output gradients are the routed
            # second layer's k h a routed token (not the whole sequence's h) and a shared expert's h
            routed = moe.routed_tokens(m, lay) / tokens  # the rank's share of the micro-batch's tokens
            fwd = fwd + tokens * (routed * m.top_k * (h + m.expert_ffn)
                                  + (h + m.shared_ffn / tp if m.shared_ffn else 0.0)) * per
            grads_out = ((qw + 2 * kvw + mlp_in) / tp + h + routed * m.top_k * h
                         + (h if m.shared_ffn else 0.0))
        bwd = tokens * grads_out * per
    elif fp8 == "parplan":
        per = 2 * act_bytes + 1
        inputs = 2 * h + (m.o_width + f) / tp
        weights = sum(flops / (2 * tokens) for _, flops in layer_gemms(m, tokens, tp))
        fwd = tokens * inputs * per + weights * per
        bwd = tokens * (inputs + grads_out) * (per + 2) + weights * (per + 2)
    else:
        per = 2 * act_bytes + 1
        n_attn_in = 3 if m.arch == "llama" else 1  # wq, wk, wv (torchtitan's llama); one fused qkv (gpt)
        n_mlp_in = 2 if m.arch == "llama" else 1   # w1 and w3
        inputs = ((n_attn_in + n_mlp_in) * h + (m.o_width + f) / tp)
        weights = sum(flops / (2 * tokens) for _, flops in layer_gemms(m, tokens, tp))
        fwd = tokens * inputs * per + weights * per
        # the backward re-casts the saved 16-bit inputs (for the weight gradient) and the weights (for the input
        # gradient: torchao's matmul_with_hp_or_float8_args casts weight_hp_t again unless FSDP's float8 all-gather
        # already made it FP8, which the prediction leaves off) and casts each output gradient twice (as is for the
        # input gradient, transposed for the weight gradient)
        bwd = tokens * (inputs + 2 * grads_out) * per + weights * per
    return fwd / hw.hbm_bytes_per_s, bwd / hw.hbm_bytes_per_s


def qk_norm_forward_time(m: ModelDims, lay, hw, act_bytes: int, fused: bool = True,
                         eager_runtime: str = "torchtitan"):
    """Seconds of the q/k norms' forward (ModelDims.qk_norm) for one block and micro-batch, as
    layer_elementwise_time counts them: one pass over q and k (read, write) fused, parplan's eager norm's passes
    (f(2a + 8) + 28 an element llama, 2a gpt) uncompiled; 0 without them."""
    if not m.qk_norm:
        return 0.0
    if fused or eager_runtime != "parplan":
        per = 2 * act_bytes
    else:  # (as _parplan_eager_time counts their forward)
        per = _parplan_eager_norm_bytes(m, act_bytes)[0] + _parplan_qk_norm_stats(m)
    return lay.mbs * m.seq_len / lay.cp * per * (m.q_width + m.kv_width) / lay.tp / hw.hbm_bytes_per_s


def block_time(m: ModelDims, lay, hw, act_bytes: int, flash: bool, dropout: bool = False, fused: bool = True,
               eager_runtime: str = "torchtitan", attention_kernel: str = "profile", fp8: str = "",
               moe_recompute: str = "none", mla_recompute: bool = False, eager_moe: bool = False):
    """Seconds of one block for one micro-batch, forward + backward (+ recompute), and the
    parts the communication model needs to know about (GEMM time it can overlap with).  fp8: the FP8 linears'
    scheme (TrainingConsts.fp8): their GEMMs at the fp8 peak (linear_gemm_time), their casts (fp8_cast_time)
    with the block's memory-bound work.  eager_moe: a block of a mixture of experts in parplan's runtime, which
    runs that model's blocks uncompiled (parallel_layers.train): its host dispatch is the profile's eager MoE
    block (host_moe_block_s + local experts x host_moe_expert_s) where measured, and a dense block of such a model,
    or any block parplan's runtime runs uncompiled (fused False: launch compiles nothing), the eager dense block's
    (host_block_eager_s)."""
    mm_f, mm_b = layer_matmul_time(m, lay, hw)
    at_f, at_b = attention_core_time(m, lay, hw, flash, dropout, attention_kernel, act_bytes)
    el_f, el_b, act_f = layer_elementwise_time(m, lay, hw, act_bytes, dropout, fused, eager_runtime)
    q_f, q_b = fp8_cast_time(m, lay, hw, fp8, act_bytes)
    moe_f, moe_b = moe.elementwise_time(m, lay, hw, act_bytes)
    el_f, el_b = el_f + q_f + moe_f, el_b + q_b + moe_b
    fwd = mm_f + at_f + el_f
    full = lay.recompute == REC_FULL
    selective = lay.recompute == REC_SELECTIVE
    op = lay.recompute == REC_SELECTIVE_OP
    # selective recompute re-runs the attention core and (llama) the activation function; op-level
    # selective (torchtitan) every second matmul and all elementwise work, keeping the attention
    # kernel's output (unfused attention's batched matmuls are not on its list: re-run)
    op_gemm = op_sac_recompute_gemm_time(m, lay, hw)
    op_re = op_gemm + el_f + (0.0 if flash else at_f)
    recompute = np.where(full, fwd, np.where(selective, at_f + act_f, np.where(op, op_re, 0.0)))
    if m.qk_norm_recomputed:  # parplan's selective checkpoint re-runs the q/k norms too (ModelDims.qk_norm_recomputed)
        recompute = recompute + np.where(selective, qk_norm_forward_time(m, lay, hw, act_bytes, fused, eager_runtime),
                                         0.0)
    # a mixture of experts' recompute modules (moe.recompute_time), where the block is not recomputed whole
    recompute = recompute + np.where(full, 0.0, moe.recompute_time(m, lay, hw, act_bytes, moe_recompute))
    if mla_recompute and m.kv_lora:  # multi-head latent attention's up projections (mla_up_recompute_time)
        # (parplan's runtime leaves them to op-level selective's policy there: MLAttention.up_recompute)
        moot = full | op if m.v_padded else full
        recompute = recompute + np.where(moot, 0.0, mla_up_recompute_time(m, lay, hw))
    bwd = mm_b + at_b + el_b + recompute
    gpu = fwd + bwd
    # The host must dispatch the block's kernels too: a block takes the longer of its GPU time
    # and the profile's measured host time for this recompute mode (CUDA launches are
    # asynchronous, so the two overlap; small blocks are launch-bound).  No measurement: 0.
    rec = np.asarray(lay.recompute, dtype=int)
    host = hw.host_block_s[rec]
    if fp8 == "parplan":  # parplan's FP8 linears dispatch their casts and GEMMs outside the compiled graphs
        host = np.where(hw.host_block_fp8_s[rec] > 0, hw.host_block_fp8_s[rec], host)
    if eager_moe and m.moe:
        eager = hw.host_moe_block_s[rec] + moe.local_experts(m, lay) * hw.host_moe_expert_s[rec]
        host = np.where(hw.host_moe_block_s[rec] > 0, eager, host)
    elif eager_moe or (not fused and eager_runtime == "parplan" and fp8 != "parplan"):  # a dense block, uncompiled
        host = np.where(hw.host_block_eager_s[rec] > 0, hw.host_block_eager_s[rec], host)
    total = np.maximum(gpu, host)
    scale = total / gpu
    # the attention core with its recompute (full and selective re-run it; op-level selective keeps a flash
    # kernel's output and re-runs unfused attention)
    attn_all = at_f + at_b + np.where(full | selective, at_f, np.where(op, 0.0 if flash else at_f, 0.0))
    # the FP8 linears' quantization passes with their recompute (full and op-level selective re-run the forward's
    # casts: op_re holds el_f, which holds q_f); zeros without FP8
    fp8_all = q_f + q_b + np.where(full | op, q_f, 0.0)
    # a mixture of experts' MLP node (moe_mlp_matmul_time), forward and backward with the MoE recompute modules' pass:
    # what Megatron's combined 1F1B runs beside the dispatches, the rest of the block beside the combines
    mlp_f = moe_mlp_matmul_time(m, lay, hw)
    mlp_b = 2 * mlp_f + np.where(full, 0.0, moe.recompute_time(m, lay, hw, act_bytes, moe_recompute))
    return {"total": total, "fwd": fwd * scale, "bwd": bwd * scale, "wgrad": mm_f * scale, "gpu": gpu, "host": host,
            "moe_mlp_fwd": mlp_f * scale, "moe_mlp_bwd": mlp_b * scale,
            "gpu_fwd": fwd, "host_fwd": host * hw.host_fwd_share[rec], "fp8_cast_all": fp8_all,
            "gemm": mm_f + mm_b + np.where(full, mm_f, np.where(op, op_gemm, 0.0)), "attention": at_f + at_b,
            "attention_all": attn_all}


def flow_shop_wait(m, blocks, h_f, g_f, h_b, g_b):
    """Seconds a step of m micro-batches, each `blocks` uniform blocks forward (host h_f, GPU g_f a block) then
    backward (h_b, g_b), takes beyond max(GPU total, host total) when the host dispatches and the GPU runs one
    sequence of kernels: a two-machine flow shop, whose makespan is max over the sequence of (host time up to a
    job + GPU time from it on) (Johnson 1954).  That maximum, linear in the job's place within each run of equal
    jobs and in the micro-batch, lies at the end of the first forward or the start of the last backward:
    max(G + L (h_f - g_f), H + L (g_b - h_b)); one job's time at either end is left out, as in max(G, H)."""
    g_all, h_all = m * blocks * (g_f + g_b), m * blocks * (h_f + h_b)
    flow = np.maximum(g_all + blocks * (h_f - g_f), h_all + blocks * (g_b - h_b)) - np.maximum(g_all, h_all)
    return np.maximum(flow, 0.0)


def wgrad_fusion_applies(fused, precision: str, zero3, torch_weight_pass, half_grads: bool = False):
    """Where gradient-accumulation fusion (the weight-gradient GEMM adding into the main_grad) runs:
    the master-weights recipe (the fp32 main_grad), and master-weights-half-grads where the framework fuses into a
    16-bit main_grad too (`half_grads`: Megatron-LM, TrainingConsts.wgrad_fusion_16bit_grads), outside ZeRO-3 (FSDP2
    reduces the 16-bit gradients autograd makes; Megatron-FSDP runs without the fusion) and outside torch's own
    zero-bubble weight pass (`torch_weight_pass`:
    it assigns the dW autograd returns to p.grad; parplan's queued weight pass runs the fused GEMM in its closures).
    parplan's runtime applies the same rule (parallel_layers.train.wgrad_fusion_mode; half_grads False)."""
    rec = PRECISION_RECIPES[precision]
    main_grad = bool(rec["master"] and (rec["grad"] == 4 or half_grads))
    return np.asarray(fused) & main_grad & ~np.asarray(zero3) & ~np.asarray(torch_weight_pass)


def zero_bubble_pipeline(parallel) -> bool:
    """A zero-bubble schedule (split input- and weight-gradient passes) over a pipeline: planner.schema's Parallel."""
    return parallel.schedule in ("zbv", "interleaved-zb") and parallel.pp > 1


def queued_weight_pass_plan(parallel) -> bool:
    """Whether parplan's runtime runs this plan's zero-bubble weight passes from queued closures
    (parallel_layers.layers.WeightGradStore): a zero-bubble pipeline outside FSDP2 (ZeRO-3), whose unsharded
    gradients belong to autograd's own accumulation and get torch's pass.  The model's rule for every candidate
    is cost_models.memory.queued_weight_pass."""
    return zero_bubble_pipeline(parallel) and parallel.zero_stage < 3


def torch_weight_pass_plan(parallel) -> bool:
    """Whether parplan's runtime runs this plan's weight passes with torch's own stage_backward_weight (a
    zero-bubble pipeline whose weight passes are not queued: FSDP2).  That pass assigns each dW to p.grad
    outside autograd's accumulation and runs no hook, so neither gradient-accumulation fusion nor the
    overlapped gradient reduction can follow it.  The model's rule for every candidate: zero-bubble pipelines
    less cost_models.memory.queued_weight_pass."""
    return zero_bubble_pipeline(parallel) and not queued_weight_pass_plan(parallel)


def plan_fuses_wgrad(training, parallel) -> bool:
    """wgrad_fusion_applies for one plan as parplan's runtime runs it (planner.schema's Training and Parallel;
    ZeRO-3 is FSDP2 there): what launch's pre-flight and the run's report compare with."""
    return bool(wgrad_fusion_applies(training.grad_accumulation_fusion, training.precision, parallel.zero_stage == 3,
                                     torch_weight_pass_plan(parallel)))


def grad_reduce_overlaps(overlap, torch_weight_pass):
    """Where the data-parallel gradient reduction (ZeRO 0-2) starts during the backward: where the framework
    overlaps it, outside torch's own zero-bubble weight pass (`torch_weight_pass`: stage_backward_weight assigns
    each dW to p.grad outside autograd's accumulation, so no hook tells when a gradient is final).  Under
    parplan's queued weight pass a weight-pass hook tells it (layers.WeightGradStore).  parplan's runtime
    applies the same rule (parallel_layers.train.grad_overlap)."""
    return np.asarray(overlap) & ~np.asarray(torch_weight_pass)


def plan_overlaps_grad_reduce(training, parallel) -> bool:
    """grad_reduce_overlaps for one plan (planner.schema's Training and Parallel): what the run's report
    compares with."""
    return bool(grad_reduce_overlaps(training.overlap_grad_reduce, torch_weight_pass_plan(parallel)))


def plan_overlaps_param_gather(training) -> bool:
    """Whether ZeRO-1/2's gather of the stepped parameters overlaps the next forward: the plan's
    overlap_param_gather, or where it is absent (plans before 2026-11-24, frameworks that do not set it) its
    overlap_grad_reduce.  `training`: planner.schema's Training or the model's TrainingConsts (both carry the two).  parplan's runtime broadcasts asynchronously and waits for each part's parameters
    before the forward uses them (data_parallel.ShardedAdamW.wait_for)."""
    gather = training.overlap_param_gather
    return bool(training.overlap_grad_reduce if gather is None else gather)


def grad_accumulation_time(params, m_micro, precision: str, hw, fsdp2=False, pp=1, shards=1):
    """Memory-bound gradient passes outside the GEMMs, per step: master-weights upcasts each 16-bit
    gradient into the fp32 main_grad (read 2 + write 4 B/param for the first micro-batch, read 2 +
    read 4 + write 4 for each later one: parplan's runtime's post-accumulate-grad hook); other
    recipes accumulate in their own dtype from the second micro-batch on (read 2x + write 1x the
    gradient's bytes: autograd's accumulation).  Where gradient-accumulation fusion applies
    (``wgrad_fusion_applies``: Megatron's gradient_accumulation_fusion, parplan's runtime on CUDA) the
    weight-gradient GEMM accumulates into the buffer itself, so the caller (total.py) passes only the parameters
    whose gradients no GEMM makes (the embedding's, a lookup's; the norms' 2h per layer are left out).

    fsdp2 (ZeRO-3 as FSDP2; torch/distributed/fsdp/_fully_shard, _fsdp_collectives.foreach_reduce and
    _fsdp_param): gradients are computed in the compute dtype gu (16-bit under the master-weights recipes'
    MixedPrecisionPolicy, else fp32) and reduced in gr (the recipe's gradient dtype; fp32 without a policy).
    Each reduce-scatter first copies the unsharded gradients into its flat input (chunk_cat: read gu, write
    gr); its output is cast to the fp32 shard where gr is 16-bit (read gr, write 4, per shard) and added
    to the shard's gradient from the second reduction on (read 4 + 4, write 4, per shard).  Without a
    pipeline that happens every micro-batch; inside torch.distributed.pipelining (pp > 1) the gradients
    stay unsharded to the step's last backward (FSDP2 casts the first to gr, then adds each later one:
    read gr + gu, write gr) and are reduced once."""
    rec = PRECISION_RECIPES[precision]
    m = np.asarray(m_micro)
    later = np.maximum(m - 1, 0)
    if rec["master"] and rec["grad"] == 4:
        per_param = 6 + 10 * later
    else:
        per_param = 3 * rec["grad"] * later
    gu = 2 if rec["master"] else 4
    gr = rec["grad"] if rec["master"] else 4
    copy_in = gu + gr
    to_shard = (gr + 4 if gr != 4 else 0) / shards
    fsdp_flat = m * (copy_in + to_shard) + later * 12 / shards
    fsdp_pipe = (copy_in if gu != gr else 0) + later * (2 * gr + gu) + 2 * gr + to_shard
    per_param = np.where(fsdp2, np.where(np.asarray(pp) > 1, fsdp_pipe, fsdp_flat), per_param)
    return params * per_param / hw.hbm_bytes_per_s
