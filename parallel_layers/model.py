"""The two architectures the planner costs, built as pipeline-stage modules from a plan's
``model`` dict with Megatron-style tensor parallelism.

llama: RMSNorm, rotary positions, GQA (query and kv heads both split over TP), SwiGLU, no
biases, tied or untied head; q/k norms (Qwen3's) and post-norms (Gemma 2's) where the model has them.  gpt:
LayerNorm, GeLU, learned positions, biases, tied or untied head.  A llama
model with kv_lora_rank (DeepSeek-V2/V3, Kimi K2) runs multi-head latent attention instead (MLAttention).
Attention is ``F.scaled_dot_product_attention(is_causal=True)``.  Dropout (a plan's training.dropout, Megatron's
GPT sites and 0.1 rates: parallel_layers.dropout) on the embedding's output, the attention probabilities and each
residual branch's output, its masks keyed by where they fall so a recompute or another layout draws the same.  With
context parallelism (cp > 1, ``parallel_layers.context_parallel``) each rank holds two chunks
of the sequence, rotary and learned positions use the tokens' global positions, K/V are
all-gathered over cp and attention uses a boolean causal mask from global positions.

Same math in any layout: ``init_parameters`` draws every parameter at its full logical shape
from a generator seeded by (seed, logical name) and keeps the rank's TP slice; logical names
use the global layer index, so a block holds the same weights on whichever stage it lands.

Sequence parallelism (sp, Korthikanti et al. 2022): norms and residuals run on sequence shards; the
column-parallel matmuls all-gather their input and keep only the shard for the backward, which
gathers it again (``layers.column_parallel_linears``; under the zero-bubble schedules only in the
weight-gradient pass).

Recompute (what the cost model assumes): ``selective`` checkpoints the core attention
(rotary + SDPA) and the MLP activation (silu(gate)*up or gelu); ``selective-op`` is torchtitan's
op-level selective checkpointing of each block (``op_sac_context``); ``full`` checkpoints each
whole block so only the block input is saved.  A mixture of experts' recompute modules (training.moe_recompute):
Block.
"""
from __future__ import annotations

import contextlib
import functools
import math
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from collections import defaultdict

from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from cost_models.params import is_moe_block
from parallel_layers.layers import (
    ColumnParallelLinear,
    column_parallel_linears,
    RowParallelLinear,
    ShardSpec,
    VocabParallelEmbedding,
    _ShardedModule,
    _autocast_input,
    padded_size,
)
from parallel_layers.context_parallel import chunk_starts, cp_attention, gather_kv, local_positions
from parallel_layers.data import stable_seed
from parallel_layers.dropout import DropoutState, attention_dropout_p, attention_rng, dropout_layer_key, hidden_dropout
from parallel_layers.outside_graphs import outside_graphs
from parallel_layers.mappings import (_all_reduce, _size, copy_to_tp_region, gather_from_sequence_parallel_region,
                                     reduce_from_tp_region, reduce_scatter_to_sequence_parallel_region)
from parallel_layers.moe import MoEMLP, MoEState
from parallel_layers.rebuild import RebuiltForBackward
from parallel_layers.window import binding, window_attention

# torchtitan's op-level selective activation checkpointing (selective_ac_option = "op";
# pytorch/torchtitan torchtitan/models/llama3/parallelize.py at 9dec370, the commit of its published
# performance tables, 2024-12): inside a checkpointed block, the outputs of matmuls, attention kernels
# and reduce-scatters are saved, except every second matmul; everything else is recomputed in the
# backward.  torchtitan lists the CUDA flash and memory-efficient SDPA kernels; the CPU and cuDNN
# kernels are added here so the same policy holds on every device this runtime runs on.
_OP_SAC_SAVE = {getattr(torch.ops.aten, name).default
                for name in ("mm", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
                if hasattr(torch.ops.aten, name)}
if hasattr(torch.ops, "_c10d_functional"):
    _OP_SAC_SAVE.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
if hasattr(torch.ops.higher_order, "flex_attention"):  # a sliding window's kernel on a GPU (parallel_layers.window),
    _OP_SAC_SAVE.add(torch.ops.higher_order.flex_attention)  # saved as torchtitan's later lists save it


def op_sac_context():
    """Context pair for ``checkpoint(..., context_fn=op_sac_context)``: torchtitan's op-SAC policy,
    counting matmuls separately in the forward and in the recompute, as torchtitan does."""
    mm, counts = torch.ops.aten.mm.default, defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        if func == mm:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            if counts[key] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in _OP_SAC_SAVE else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


INIT_STD = 0.02
ROPE_THETA = 10000.0
NORM_EPS = 1e-5


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    head_dim: int
    tied_embeddings: bool
    max_seq_len: int
    rope_theta: float = ROPE_THETA
    rope: Optional[bool] = None  # rotary positions: llama's, and a gpt-arch model's without a learned table
    # a mixture of experts (parallel_layers.moe): every block's MLP routed to experts_per_token of experts SwiGLU
    # MLPs of ffn_hidden, plus a tensor-parallel shared expert of shared_ffn where set
    experts: Optional[int] = None
    experts_per_token: Optional[int] = None
    shared_ffn: Optional[int] = None
    # dense blocks between the MoE ones (ModelSpec.first_dense_layers, moe_layer_step): a dense MLP of dense_ffn
    first_dense_layers: Optional[int] = None
    moe_layer_step: Optional[int] = None
    dense_ffn: Optional[int] = None
    # multi-head latent attention (MLAttention; ModelSpec.kv_lora_rank): the key/value latent's width, the query
    # latent's (None: a full query projection), the rotary part of head_dim (a query/key head's whole width) and a
    # value head's width
    kv_lora_rank: Optional[int] = None
    q_lora_rank: Optional[int] = None
    qk_rope_head_dim: Optional[int] = None
    v_head_dim: Optional[int] = None
    # a norm on each sublayer's output before its residual add (ModelSpec.post_norms: Gemma 2 / 3, GLM-4)
    post_norms: bool = False
    # norms on each query and key head between their projections and rotary (ModelSpec.qk_norm: Qwen3, Gemma 3,
    # OLMo 2; Attention.q_norm / k_norm)
    qk_norm: bool = False
    # ...each over a token's whole query / key width instead of each head (ModelSpec.qk_norm_whole: OLMo 2 / 3, OLMoE,
    # MiniMax-M2; WholeWidthNorm, _WholeWidthNorms)
    qk_norm_whole: bool = False
    # the block's two norms on the sublayers' outputs instead of their inputs (ModelSpec.norms_after: OLMo 2 / 3,
    # EXAONE 4; Block)
    norms_after: bool = False
    # biases on a llama block's q, k and v projections (ModelSpec.qkv_bias: Qwen2; Attention's wq / wk / wv)
    qkv_bias: bool = False
    # attention and MLP side by side on one norm, their outputs added to the residual together (ModelSpec.parallel_block:
    # GPT-J, Command R; Block)
    parallel_block: bool = False
    # sliding-window attention (ModelSpec.sliding_window, full_attention_every; parallel_layers.window): a windowed
    # layer's query attends the `sliding_window` keys up to itself; every full_attention_every-th layer (from 1)
    # attends the whole prefix (None: none does)
    sliding_window: Optional[int] = None
    full_attention_every: Optional[int] = None
    # packed documents of this many tokens, each attending only within itself (Training.document_length: the plan's
    # data, not the model's; parallel_layers.window)
    document_length: Optional[int] = None
    # chunked attention (ModelSpec.attention_chunk: Llama 4's), in the layers window_of's rule picks
    attention_chunk: Optional[int] = None

    def window_of(self, i: int) -> Optional[int]:
        """Layer i's (from 0) sliding window, None where it attends the whole prefix (ModelSpec.windowed_layers'
        rule)."""
        return self._local(i, self.sliding_window)

    def chunk_of(self, i: int) -> Optional[int]:
        """Layer i's (from 0) attention chunk (ModelConfig.attention_chunk), None where it attends the whole prefix."""
        return self._local(i, self.attention_chunk)

    def _local(self, i: int, size: Optional[int]) -> Optional[int]:
        k = self.full_attention_every
        return None if not size or (k and (i + 1) % k == 0) else size

    def is_moe_block(self, i: int) -> bool:
        """Whether block i (from 0) is an MoE block (ModelSpec.is_moe_block's rule)."""
        return bool(self.experts) and is_moe_block(i, self.first_dense_layers or 0, self.moe_layer_step or 1)

    def __post_init__(self):
        if self.rope is None:  # the arch's default (a frozen dataclass: set once here)
            object.__setattr__(self, "rope", self.arch == "llama")

    @classmethod
    def from_plan(cls, plan) -> "ModelConfig":
        m = plan.model
        return cls(arch=m.arch, layers=m.layers, hidden=m.hidden, heads=m.heads, kv_heads=m.kv_heads,
                   ffn_hidden=m.ffn_hidden, vocab=m.vocab, head_dim=m.head_dim or m.hidden // m.heads,
                   tied_embeddings=m.tied_embeddings,
                   max_seq_len=m.max_seq_len or plan.training.seq_len, rope_theta=m.rope_base,
                   rope=not m.has_learned_positions, experts=m.experts, experts_per_token=m.experts_per_token,
                   shared_ffn=m.shared_expert_ffn, first_dense_layers=m.first_dense_layers,
                   moe_layer_step=m.moe_layer_step, dense_ffn=m.dense_ffn_hidden, kv_lora_rank=m.kv_lora_rank,
                   q_lora_rank=m.q_lora_rank, qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim,
                   post_norms=bool(m.post_norms), qk_norm=bool(m.qk_norm),
                   qk_norm_whole=bool(m.qk_norm and m.qk_norm_whole), norms_after=bool(m.norms_after),
                   qkv_bias=bool(m.qkv_bias), parallel_block=bool(m.parallel_block), sliding_window=m.sliding_window,
                   full_attention_every=m.full_attention_every, document_length=plan.training.document_length,
                   attention_chunk=m.attention_chunk)


class Norm(_ShardedModule):
    """RMSNorm (llama) or LayerNorm with bias (gpt); replicated over TP.  width: what it normalises (default the
    hidden size; multi-head latent attention's latents their own, a q/k norm one head).  Its gradients are partial
    sums over TP (summed there: ShardSpec.sp_partial_grad) where each TP rank norms a part of the tensor: its sequence
    shard under SP (sequence_parallel), or its own heads (per_head: the q/k norms, with or without SP)."""

    def __init__(self, cfg: ModelConfig, tp_group, *, name, sequence_parallel, width: Optional[int] = None,
                 per_head: bool = False):
        super().__init__(tp_group)
        self.rms = cfg.arch == "llama"
        partial = (sequence_parallel or per_head) and self.tp_size > 1
        w = width or cfg.hidden
        self._new_param("weight", ShardSpec(f"{name}.weight", (w,), None, "ones", sp_partial_grad=partial))
        self.bias = None
        if not self.rms:
            self._new_param("bias", ShardSpec(f"{name}.bias", (w,), None, "zeros", sp_partial_grad=partial))

    def forward(self, x):
        if self.rms:
            return _RMSNorm.apply(x, self.weight)
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, NORM_EPS)


def _at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class _RMSNorm(torch.autograd.Function):
    """RMSNorm in fp32 that saves only its input (in its own dtype) and the fp32 1/rms per token,
    as fused kernels do (Megatron/apex); the backward recomputes x/rms.  Written out, the eager
    version would keep an fp32 copy of the input and the fp32 normalised tensor as well (8 bytes
    more per element under bf16), which the cost model's 2 tensors per norm do not count."""

    @staticmethod
    def forward(ctx, x, weight):
        xf = _at_least_fp32(x)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS)
        ctx.save_for_backward(x, rstd, weight)
        return (xf * rstd * weight).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        xhat = _at_least_fp32(x) * rstd
        g = _at_least_fp32(grad)
        d_weight = (g * xhat).reshape(-1, xhat.shape[-1]).sum(0).to(weight.dtype)
        dxhat = g * _at_least_fp32(weight)
        dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
        return dx.to(x.dtype), d_weight


class WholeWidthNorm(_ShardedModule):
    """A q or k norm over a token's whole query or key width (ModelConfig.qk_norm_whole: OLMo 2's q_norm of heads x
    head_dim): RMSNorm (llama) or LayerNorm with bias (gpt), its weight split over TP as the projection's output
    columns are (each rank its heads' slice, whose gradient is whole there: no sum over tp).  Run in pairs by
    whole_width_norms, which all-reduces their statistics over tp."""

    def __init__(self, cfg: ModelConfig, tp_group, *, name, width: int):
        super().__init__(tp_group)
        self.rms, self.width = cfg.arch == "llama", width
        self._new_param("weight", ShardSpec(f"{name}.weight", (width,), 0, "ones"))
        self.bias = None
        if not self.rms:
            self._new_param("bias", ShardSpec(f"{name}.bias", (width,), 0, "zeros"))


class _WholeWidthNorms(torch.autograd.Function):
    """The q and k norms of WholeWidthNorm over inputs whose width is split over the tensor-parallel group: the sums
    each rank makes over its columns are all-reduced over tp, q's and k's in one collective, forward (RMSNorm the sum
    of squares; LayerNorm the sum and the sum of squares, var = E[x^2] - E[x]^2 in fp32) and again backward (the sums
    over the width the input gradient needs: of dxhat * xhat, and of dxhat for LayerNorm); a group of one reduces
    nothing.  As _RMSNorm, in fp32, saving only the inputs (their dtype) and the fp32 statistics a token of each norm
    (1/rms; LayerNorm's mean and 1/std): what cost_models.memory counts for a whole-width q/k norm."""

    @staticmethod
    def forward(ctx, q, k, wq, wk, bq, bk, group, widths, rms):
        xs = [_at_least_fp32(q), _at_least_fp32(k)]
        per = [(x * x).sum(-1) for x in xs] if rms else [t for x in xs for t in (x.sum(-1), (x * x).sum(-1))]
        sums = _all_reduce(torch.stack(per, -1), group)  # (..., 2) RMSNorm, (..., 4) LayerNorm
        outs, stats = [], []
        for i, (x, w, b, n) in enumerate(zip(xs, (wq, wk), (bq, bk), widths)):
            if rms:
                mean, rstd = None, torch.rsqrt(sums[..., i:i + 1] / n + NORM_EPS)
            else:
                mean = sums[..., 2 * i:2 * i + 1] / n
                rstd = torch.rsqrt((sums[..., 2 * i + 1:2 * i + 2] / n - mean * mean).clamp_min(0) + NORM_EPS)
                stats.append(mean)
            stats.append(rstd)
            y = (x if mean is None else x - mean) * rstd * w
            outs.append((y if b is None else y + b).to((q, k)[i].dtype))
        ctx.save_for_backward(q, k, torch.cat(stats, -1), wq, wk)
        ctx.group, ctx.widths, ctx.rms, ctx.has_bias = group, widths, rms, bq is not None
        return tuple(outs)

    @staticmethod
    def backward(ctx, gq, gk):
        q, k, stats, wq, wk = ctx.saved_tensors
        rms, per = ctx.rms, 1 if ctx.rms else 2
        rstds = [stats[..., per * i + per - 1:per * i + per] for i in range(2)]
        xhats, dxhats, dws, dbs, sums = [], [], [], [], []
        for i, (x, g, w, rstd) in enumerate(zip((q, k), (gq, gk), (wq, wk), rstds)):
            xhat = (_at_least_fp32(x) if rms else _at_least_fp32(x) - stats[..., 2 * i:2 * i + 1]) * rstd
            g = _at_least_fp32(g)
            dws.append((g * xhat).reshape(-1, xhat.shape[-1]).sum(0).to(w.dtype))
            dbs.append(g.reshape(-1, g.shape[-1]).sum(0).to(w.dtype) if ctx.has_bias else None)
            dxhat = g * _at_least_fp32(w)
            xhats.append(xhat)
            dxhats.append(dxhat)
            sums += [(dxhat * xhat).sum(-1)] if rms else [dxhat.sum(-1), (dxhat * xhat).sum(-1)]
        sums = _all_reduce(torch.stack(sums, -1), ctx.group)
        dxs = []
        for i, (x, xhat, dxhat, n, rstd) in enumerate(zip((q, k), xhats, dxhats, ctx.widths, rstds)):
            dot = sums[..., per * i + per - 1:per * i + per] / n
            centred = dxhat if rms else dxhat - sums[..., 2 * i:2 * i + 1] / n
            dxs.append((rstd * (centred - xhat * dot)).to(x.dtype))
        return dxs[0], dxs[1], dws[0], dws[1], dbs[0], dbs[1], None, None, None


def whole_width_norms(q, k, q_norm: WholeWidthNorm, k_norm: WholeWidthNorm, group):
    """q (b, s, nh/tp, d) and k (b, s, nkv/tp, d) normed each over its whole width (_WholeWidthNorms), same shapes."""
    fq, fk = _WholeWidthNorms.apply(q.flatten(-2), k.flatten(-2), q_norm.weight, k_norm.weight, q_norm.bias,
                                    k_norm.bias, group, (q_norm.width, k_norm.width), q_norm.rms)
    return fq.view(q.shape), fk.view(k.shape)


_ROPE_TABLES: dict = {}


def _rope_tables(s: int, d: int, device, dtype, positions: Optional[torch.Tensor], key, theta: float = ROPE_THETA) -> tuple:
    """cos and sin (s, d) in x's dtype.  The products x * cos and rotate(x) * sin save them for the
    backward, so tables made per call were saved per call: twice a block (q and k) and micro-batch,
    4 s d elements each time (a CPU allocator trace of tp 4 with SP found 32 of them live in 8 blocks).
    Eager runs share one cached pair per key (sequence length, head size, device, dtype, base, and the cp
    rank for context parallelism); compiled blocks make their own, which the compiler fuses, and inference
    mode makes its own (its tensors cannot be saved for a later backward)."""
    cache = key is not None and not torch.compiler.is_compiling() and not torch.is_inference_mode_enabled()
    if cache and key in _ROPE_TABLES:
        return _ROPE_TABLES[key]
    with torch.no_grad() if cache else contextlib.nullcontext():
        inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
        pos = torch.arange(s, device=device, dtype=torch.float32) if positions is None else positions.float()
        angles = torch.outer(pos, inv_freq)  # (s, d/2)
        cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(dtype)
        sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(dtype)
    if cache:
        _ROPE_TABLES[key] = (cos, sin)
    return cos, sin


def rotary(x: torch.Tensor, positions: Optional[torch.Tensor] = None, key=None, theta: float = ROPE_THETA) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021, half-split form as in Llama/HF) of
    x: (b, heads, s, d) at positions (s,) (default 0..s-1; a cp rank passes its global ones and a
    key naming them, so their tables are cached as the default positions' are), base `theta`."""
    b, nh, s, d = x.shape
    if positions is None:
        key = (s, d, str(x.device), x.dtype, theta)
    elif key is not None:
        key = (key, s, d, str(x.device), x.dtype, theta)
    cos, sin = _rope_tables(s, d, x.device, x.dtype, positions, key, theta)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _core_attention_rope(q, k, v, theta: float = ROPE_THETA, dropout_p: float = 0.0, window: Optional[int] = None,
                         document: Optional[int] = None):
    return _core_attention(rotary(q, theta=theta), rotary(k, theta=theta), v, dropout_p=dropout_p, window=window,
                           document=document)


def _core_attention(q, k, v, dropout_p: float = 0.0, window: Optional[int] = None, document: Optional[int] = None):
    """Causal attention over the whole prefix, or within a sliding window or packed documents shorter than the
    sequence (parallel_layers.window)."""
    window, document = binding(window, k.shape[2]), binding(document, k.shape[2])
    if window is not None or document is not None:
        return window_attention(q, k, v, window, dropout_p=dropout_p, document=document)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, dropout_p=dropout_p)


@outside_graphs
def _dropout_attention(core, state: DropoutState, key: torch.Tensor, layer: int, *tensors):
    """core(*tensors, dropout_p=p) with the device's generator seeded for this (micro-batch, layer, rank): a
    checkpointed call re-run in the backward draws the same mask.  Outside torch.compile's graphs (the generator's
    seeding is host work)."""
    with attention_rng(state, key, layer, tensors[0].device):
        return core(*tensors, dropout_p=state.p_attention)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up that saves only its two inputs: the backward recomputes sigmoid(gate)
    (one pointwise pass) instead of keeping silu(gate) as a third ffn-wide tensor.  The same
    tensors a fused kernel or torch.compile's partitioner keeps; the cost model counts gate and
    up here plus the product (saved by the down projection): 3 x ffn per token."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        silu = gate * sig
        d_gate = grad * up * sig * (1 + gate * (1 - sig))
        return d_gate, grad * silu


def _swiglu(gate, up):
    return _SwiGLU.apply(gate, up)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, i: int, tp_group, sp: bool, recompute: str, cp_group=None):
        super().__init__()
        h, d, gpt = cfg.hidden, cfg.head_dim, cfg.arch == "gpt"
        tp = _size(tp_group)
        self.tp_group, self.sp, self.selective = tp_group, sp, recompute == "selective"
        # dropout: the stage's DropoutState (set by StageModule.set_dropout); the layer as the dropouts take it, and
        # the same on the run's device for the hidden masks' hash (set_dropout puts it there)
        self.dropout, self.dropout_layer, self.dropout_layer_rows = None, dropout_layer_key(i), None
        self.cp_group, self.cp = cp_group, _size(cp_group)
        self.cp_rank = dist.get_rank(cp_group) if self.cp > 1 else 0
        self.local_heads, self.local_kv_heads, self.head_dim = cfg.heads // tp, cfg.kv_heads // tp, d
        self.rope, self.rope_theta = cfg.rope, cfg.rope_theta
        self.window = cfg.window_of(i)  # a sliding window's keys (ModelConfig.window_of), None: the whole prefix
        # the stretches it attends within: packed documents (ModelConfig.document_length) and this layer's chunks
        # (ModelConfig.chunk_of: Llama 4's), None where there are neither
        stretches = tuple(d for d in (cfg.document_length, cfg.chunk_of(i)) if d)
        self.document = stretches[0] if len(stretches) == 1 else stretches or None
        n = f"layers.{i}.attn"
        qkv_bias = gpt or cfg.qkv_bias  # (Qwen2's q/k/v biases on llama blocks: ModelConfig.qkv_bias)
        self.wq = ColumnParallelLinear(h, cfg.heads * d, tp_group, name=f"{n}.wq", bias=qkv_bias)
        self.wk = ColumnParallelLinear(h, cfg.kv_heads * d, tp_group, name=f"{n}.wk", bias=qkv_bias)
        self.wv = ColumnParallelLinear(h, cfg.kv_heads * d, tp_group, name=f"{n}.wv", bias=qkv_bias)
        self.wo = RowParallelLinear(cfg.heads * d, h, tp_group, name=f"{n}.wo", bias=gpt,
                                    sequence_parallel=sp, std=INIT_STD / math.sqrt(2 * cfg.layers))
        # q/k norms (ModelConfig.qk_norm; Qwen3's q_norm / k_norm): one norm of head_dim shared by every query head and
        # one by every key head, on the projections' outputs before rotary; the rank's heads only (the whole sequence,
        # SP or not), so their replicated weights' gradients are summed over tp (Norm's per_head).  Each saves its
        # input, the projection's output, and its fp32 statistics a head a token (cost_models.memory); under selective
        # recompute they run inside the attention's checkpoint, which keeps what it keeps without them
        # Over the whole width instead (ModelConfig.qk_norm_whole: OLMo 2's), each norm's weight is split over tp as
        # the heads are, and the two norms' statistics are all-reduced over tp together (whole_width_norms)
        self.qk_whole = cfg.qk_norm and cfg.qk_norm_whole
        if self.qk_whole:
            self.q_norm = WholeWidthNorm(cfg, tp_group, name=f"{n}.q_norm", width=cfg.heads * d)
            self.k_norm = WholeWidthNorm(cfg, tp_group, name=f"{n}.k_norm", width=cfg.kv_heads * d)
        else:
            self.q_norm, self.k_norm = ((Norm(cfg, tp_group, name=f"{n}.q_norm", sequence_parallel=sp, width=d,
                                              per_head=True),
                                         Norm(cfg, tp_group, name=f"{n}.k_norm", sequence_parallel=sp, width=d,
                                              per_head=True))
                                        if cfg.qk_norm else (None, None))

    def forward(self, x, key: Optional[torch.Tensor] = None):
        q, k, v = column_parallel_linears(x, [self.wq, self.wk, self.wv], self.tp_group,
                                          sequence_parallel=self.sp)  # (b, s, width/tp), full sequence
        return self.wo(self.attend(q, k, v, key))

    def attend(self, q, k, v, key: Optional[torch.Tensor] = None):
        """The attention of the q, k and v projections' outputs (b, s, width/tp each, the whole sequence), before the
        output projection: (b, s, heads/tp x head_dim)."""
        b, s, _ = q.shape
        # local head counts: the reshape must use heads/tp and kv_heads/tp
        q = q.view(b, s, self.local_heads, self.head_dim)
        k = k.view(b, s, self.local_kv_heads, self.head_dim)
        v = v.view(b, s, self.local_kv_heads, self.head_dim).transpose(1, 2)
        # the q/k norms run inside the selective checkpoint (norms_inside), which then keeps the projections' outputs
        # as it does without them and re-runs the norms with the attention; outside it, before it
        norms_inside = self.q_norm is not None and self.selective
        if not norms_inside:
            q, k = self._normed_heads(q, k)
        if self.cp > 1:
            o = self._context_parallel(q, k, v, key, norms_inside)
            return o.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim)
        core = (functools.partial(_core_attention_rope, theta=self.rope_theta, window=self.window,
                                  document=self.document) if self.rope
                else functools.partial(_core_attention, window=self.window, document=self.document))
        if attention_dropout_p(self.dropout, key) > 0:
            core = functools.partial(_dropout_attention, core, self.dropout, key, self.dropout_layer)
        if norms_inside:
            core = functools.partial(self._after_norms, core)
        if self.selective:
            o = checkpoint(core, q, k, v, use_reentrant=False)  # (b, nh/tp, s, d)
        else:
            o = core(q, k, v)
        return o.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim)

    def _normed_heads(self, q, k):
        """q (b, s, nh/tp, d) and k (b, s, nkv/tp, d) as the attention takes them, (b, heads, s, d): normed per head
        first where the model has q/k norms (ModelConfig.qk_norm), or each over its whole width (qk_norm_whole)."""
        if self.qk_whole:
            q, k = whole_width_norms(q, k, self.q_norm, self.k_norm, self.tp_group)
        elif self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2)

    def _after_norms(self, fn, q, k, *rest, **kw):
        return fn(*self._normed_heads(q, k), *rest, **kw)

    def _rotate(self, q, k, pos):
        """q and k rotated at the cp rank's global positions (the rotary tables' cache key: ("cp", rank, cp); `key`
        stays the micro-batch's dropout key); as they are without rotary positions."""
        if not self.rope:
            return q, k
        rope_key = ("cp", self.cp_rank, self.cp)
        return rotary(q, pos, rope_key, self.rope_theta), rotary(k, pos, rope_key, self.rope_theta)

    def _rotated(self, fn, q, k, v, pos, starts, **kw):
        return fn(*self._rotate(q, k, pos), v, pos, starts, **kw)

    def _context_parallel(self, q, k, v, key=None, norms_inside: bool = False):
        """s local tokens (two chunks of the sequence); rotary at global positions before the
        K/V all-gather.  Selective recompute checkpoints the gather with the attention: the rank's own
        K/V are saved, not the gathered whole sequence (cp x as large) nor each chunk's output, and
        the backward gathers again (as full and op-level selective recompute do).  norms_inside: q and k still
        (b, s, heads, d), their norms and rotary checkpointed with it (Attention.forward)."""
        s = v.shape[2]
        pos = local_positions(s, self.cp_rank, self.cp, v.device)
        starts = chunk_starts(s, self.cp_rank, self.cp)
        attend = self._gathered_attention
        if attention_dropout_p(self.dropout, key) > 0:
            attend = functools.partial(_dropout_attention, attend, self.dropout, key, self.dropout_layer)
        if norms_inside:
            attend = functools.partial(self._after_norms, functools.partial(self._rotated, attend))
        else:
            q, k = self._rotate(q, k, pos)
        if self.selective:
            return checkpoint(attend, q, k, v, pos, starts, use_reentrant=False)
        return attend(q, k, v, pos, starts)

    def _gathered_attention(self, q, k, v, pos, starts, dropout_p: float = 0.0):
        k, v = gather_kv(k, v, self.cp_group)  # (b, nkv/tp, S, d) each
        return cp_attention(q, k, v, pos, starts, dropout_p, window=self.window, cp_key=("cp", self.cp_rank, self.cp),
                            document=self.document)


def _mla_q(q, *, heads: int, nope: int, rope: int, width: int, theta: float = ROPE_THETA, positions=None,
           rope_key=None):
    """A query as SDPA takes it (b, heads, s, width) from the query projection's output q (b, s, heads * (nope +
    rope)): cat(q_nope, rope(q_pe)), zero-padded to width.  positions / rope_key: a cp rank's global positions and
    their rotary tables' cache key (rotary), as Attention's context parallelism passes them."""
    b, s, _ = q.shape
    d = nope + rope
    q = q.view(b, s, heads, d).transpose(1, 2)
    q = torch.cat([q[..., :nope], rotary(q[..., nope:], positions, rope_key, theta)], dim=-1)
    return F.pad(q, (0, width - d)) if d < width else q


def _mla_kv(kv, k_pe, *, heads: int, nope: int, rope: int, v_dim: int, width: int, theta: float = ROPE_THETA,
            positions=None, rope_key=None):
    """Keys and values as SDPA takes them (b, heads, s, width) from kv (b, s, heads * (nope + v_dim)), each head's key
    no-rope part and value, and k_pe (b, s, rope), the rotary key part every head shares: k = cat(k_nope, rope(k_pe)),
    v, each zero-padded to width (positions / rope_key: as _mla_q's)."""
    b, s, _ = kv.shape
    k_nope, v = kv.view(b, s, heads, nope + v_dim).transpose(1, 2).split([nope, v_dim], dim=-1)
    k_pe = rotary(k_pe.unsqueeze(1), positions, rope_key, theta)  # (b, 1, s, rope)
    k = torch.cat([k_nope, k_pe.expand(b, heads, s, rope)], dim=-1)
    if nope + rope < width:
        k = F.pad(k, (0, width - nope - rope))
    if v_dim < width:
        v = F.pad(v, (0, width - v_dim))
    return k, v


def _mla_attend(q, k, v, *, d: int, v_dim: int, dropout_p: float = 0.0):
    """SDPA over _mla_q's and _mla_kv's padded heads, causal, scaled by 1 / sqrt(d) (d = nope + rope), the padding's
    output columns dropped: (b, heads, s, width) x 3 -> (b, s, heads * v_dim)."""
    b, heads, s, _ = q.shape
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, scale=d ** -0.5)
    return o[..., :v_dim].transpose(1, 2).reshape(b, s, heads * v_dim)


def _mla_core(q, kv, k_pe, *, heads: int, nope: int, rope: int, v_dim: int, theta: float = ROPE_THETA,
              dropout_p: float = 0.0):
    """Multi-head latent attention's core from the up projections' outputs: q (b, s, heads * (nope + rope)), kv
    (b, s, heads * (nope + v_dim)), each head's key no-rope part and value, and k_pe (b, s, rope), the rotary key
    part every head shares.  q = cat(q_nope, rope(q_pe)), k = cat(k_nope, rope(k_pe)) and v go to SDPA, scaled by
    1 / sqrt(nope + rope) (DeepSeek's softmax_scale without its yarn mscale).  Where the value head is narrower than
    the query/key head (DeepSeek-V3: 128 and 192) v is zero-padded to the query's width, so the fused kernels that
    take one head width (torch's flash kernels, the CPU's) run it, and the padding's output columns are dropped:
    SDPA with two widths falls back to its math path, which keeps the s x s probabilities.  -> (b, s, heads * v_dim)."""
    d = nope + rope
    width = max(d, v_dim)
    k, v = _mla_kv(kv, k_pe, heads=heads, nope=nope, rope=rope, v_dim=v_dim, width=width, theta=theta)
    q = _mla_q(q, heads=heads, nope=nope, rope=rope, width=width, theta=theta)
    return _mla_attend(q, k, v, d=d, v_dim=v_dim, dropout_p=dropout_p)


class MLAttention(_ShardedModule):
    """Multi-head latent attention (DeepSeek-V2, 2024, sec. 2.1; Megatron-Core's MLASelfAttention, as the cost model
    plans it: cost_models.params.mla_projections).  Per block:

      down   h -> q_lora (wq_down) and h -> kv_lora + rope (wkv_down), replicated over tp and run on the rank's own
             tokens (its sequence shard under SP), then the latents' RMSNorms (q_norm, kv_norm; the rope part is the
             one key part every head shares, not normed).  Per-token work, so on the shard as on the whole sequence;
             under SP the replicated weights' gradients are partial sums over the shard (sp_partial_grad: summed
             over tp as a norm's)
      the TP region entered once, on the latents (q_lora + kv_lora + rope a token): all-gathered along the
             sequence under SP (reduce-scattered backward), else the identity (all-reduced backward)
      up     q_lora -> heads * head_dim (wq_up) and kv_lora -> heads * (head_dim - rope + v_dim) (wkv_up: each head's
             key no-rope part and value), column parallel: the rank's heads / tp heads, local matmuls.  Without
             q_lora, wq reads h (column parallel, with its own SP gather of the block input)
      core   _mla_core: rotary on the rope parts, SDPA, causal
      out    heads * v_dim -> h (wo, row parallel)

    Selective recompute checkpoints the core (its inputs are the up projections' outputs), as Attention checkpoints
    rotary + SDPA.  mla_recompute (training.mla_recompute, Megatron-LM's --recompute-modules mla_up_proj): the tensors
    the core would keep that the up projections make from the latents are not held from the forward to the backward
    but rebuilt from the kept latents and weights when the backward needs them (cost_models.memory.
    parplan_mla_up_saved_bytes counts what that frees, compute.mla_up_recompute_time the GEMMs run again):
      no recompute (and the blocks full recompute leaves whole: recompute_layers): the attention kernel's padded q,
          k and v (parallel_layers.rebuild.RebuiltForBackward, around SDPA alone: its output and log-sum-exp are kept,
          the kernel is not re-run); without a query latent the query is the block input's projection, not the
          latents', and is kept
      selective: the checkpoint takes the latents in place of the up projections' outputs, so the up projections
          run again inside it (q and kv are not its inputs to hold); without a query latent q is still one
      full (a block checkpointed whole) and selective-op (the op policy saves what it saves): nothing more to drop;
          mla_recompute does nothing there (StageModule turns it off on the blocks it checkpoints).
    Under torch.compile (opts.compile) the hooks run outside the compiled graph (torch.compiler.disable).
    Context parallelism (cp_group of more than one rank; since the fifty-second session): each cp rank holds its two
    chunks of the sequence (parallel_layers.context_parallel) and runs the down and up projections on them as on any
    tokens; the core rotates the rope parts at the rank's global positions, all-gathers the padded keys and values
    over cp (one collective, reduce-scattered backward) and attends its queries to them chunk by chunk
    (_context_parallel_core), as Attention's all-gather context parallelism does; selective recompute checkpoints the
    gather with the core.  Not run: mla_recompute with context parallelism (refused here and by
    planner.core.parplan_mla_problem)."""

    def __init__(self, cfg: ModelConfig, i: int, tp_group, sp: bool, recompute: str, cp_group=None,
                 mla_recompute: bool = False):
        super().__init__(tp_group)
        self.cp_group, self.cp = cp_group, _size(cp_group)
        self.cp_rank = dist.get_rank(cp_group) if self.cp > 1 else 0
        if self.cp > 1 and mla_recompute:
            raise ValueError("multi-head latent attention's up-projection recompute (mla_recompute) with context "
                             "parallelism (cp > 1) is not run by parplan's runtime: drop one of them")
        h, heads, d = cfg.hidden, cfg.heads, cfg.head_dim
        self.q_lora, self.kv_lora = cfg.q_lora_rank or 0, cfg.kv_lora_rank
        self.rope, self.v_dim = cfg.qk_rope_head_dim, cfg.v_head_dim
        self.nope = d - self.rope
        if heads % self.tp_size:
            raise ValueError(f"{heads} heads do not split over tp={self.tp_size}")
        self.local_heads = heads // self.tp_size
        self.sp, self.selective, self.rope_theta = sp and self.tp_size > 1, recompute == "selective", cfg.rope_theta
        # the up projections recomputed (see above; StageModule sets it False where it checkpoints the whole block)
        self.up_recompute = mla_recompute and recompute != "selective-op"
        # dropout: as Attention's (set by StageModule.set_dropout)
        self.dropout, self.dropout_layer, self.dropout_layer_rows = None, dropout_layer_key(i), None
        n = f"layers.{i}.attn"
        partial = self.sp
        if self.q_lora:
            self._new_param("wq_down", ShardSpec(f"{n}.wq_down.weight", (self.q_lora, h), None, "normal",
                                                 sp_partial_grad=partial))
            self.q_norm = Norm(cfg, tp_group, name=f"{n}.q_norm", sequence_parallel=sp, width=self.q_lora)
            self._new_param("wq_up", ShardSpec(f"{n}.wq_up.weight", (heads * d, self.q_lora), 0, "normal"))
        else:
            self.wq = ColumnParallelLinear(h, heads * d, tp_group, name=f"{n}.wq", sequence_parallel=sp)
        self._new_param("wkv_down", ShardSpec(f"{n}.wkv_down.weight", (self.kv_lora + self.rope, h), None, "normal",
                                              sp_partial_grad=partial))
        self.kv_norm = Norm(cfg, tp_group, name=f"{n}.kv_norm", sequence_parallel=sp, width=self.kv_lora)
        self._new_param("wkv_up", ShardSpec(f"{n}.wkv_up.weight", (heads * (self.nope + self.v_dim), self.kv_lora), 0,
                                            "normal"))
        self.wo = RowParallelLinear(heads * self.v_dim, h, tp_group, name=f"{n}.wo", sequence_parallel=sp,
                                    std=INIT_STD / math.sqrt(2 * cfg.layers))

    def forward(self, x, key: Optional[torch.Tensor] = None):  # (b, s[/tp], h) -> (b, s[/tp], h)
        x = _autocast_input(x)  # once for the two down projections (and wq), as column_parallel_linears casts it
        kv = F.linear(x, self.wkv_down)  # (b, s_local, kv_lora + rope)
        latents = [self.kv_norm(kv[..., :self.kv_lora]), kv[..., self.kv_lora:]]
        if self.q_lora:
            latents.insert(0, self.q_norm(F.linear(x, self.wq_down)))
        lat = torch.cat(latents, dim=-1)
        lat = (gather_from_sequence_parallel_region(lat, self.tp_group) if self.sp
               else copy_to_tp_region(lat, self.tp_group))  # (b, s, [q_lora +] kv_lora + rope)
        if self.q_lora:
            q_lat, kv_lat, k_pe = lat.split([self.q_lora, self.kv_lora, self.rope], dim=-1)
        else:
            kv_lat, k_pe = lat.split([self.kv_lora, self.rope], dim=-1)
            q_lat = self.wq(x)  # not a latent: the full query projection's output, which the up projections pass on
        if self.selective:
            if self.up_recompute:  # the latents into the checkpoint, the up projections run again inside it
                o = checkpoint(self._up_core, q_lat, kv_lat, k_pe, key, use_reentrant=False)
            else:
                o = checkpoint(self._core, *self._up(q_lat, kv_lat), k_pe, key, use_reentrant=False)
        elif self.up_recompute:
            o = self._attend_rebuilding_up(q_lat, kv_lat, k_pe, key)
        else:
            o = self._core(*self._up(q_lat, kv_lat), k_pe, key)
        return self.wo(o)

    def _up(self, q_lat, kv_lat):
        """The up projections: q (b, s, heads/tp * head_dim) from the query latent (without one, q_lat is already
        the query projection's output) and kv (b, s, heads/tp * (head_dim - rope + v_dim)) from the key/value one."""
        return (F.linear(q_lat, self.wq_up) if self.q_lora else q_lat), F.linear(kv_lat, self.wkv_up)

    def _core(self, q, kv, k_pe, key=None):
        core = (self._context_parallel_core if self.cp > 1 else
                functools.partial(_mla_core, heads=self.local_heads, nope=self.nope, rope=self.rope, v_dim=self.v_dim,
                                  theta=self.rope_theta))
        if attention_dropout_p(self.dropout, key) > 0:
            core = functools.partial(_dropout_attention, core, self.dropout, key, self.dropout_layer)
        return core(q, kv, k_pe)

    def _context_parallel_core(self, q, kv, k_pe, dropout_p: float = 0.0):
        """_mla_core on a cp rank's two chunks: q, k and v padded as there, the rope parts rotated at the rank's global
        positions (their tables cached under ("cp", rank, cp), as Attention's), the keys and values all-gathered over
        cp (gather_kv: the whole sequence in global order), each chunk's queries attending the keys up to its end
        (cp_attention), scaled by 1 / sqrt(nope + rope).  -> (b, s, heads * v_dim)."""
        b, s, _ = q.shape
        d = self.nope + self.rope
        pos = local_positions(s, self.cp_rank, self.cp, q.device)
        dims = dict(heads=self.local_heads, nope=self.nope, rope=self.rope, width=max(d, self.v_dim),
                    theta=self.rope_theta, positions=pos, rope_key=("cp", self.cp_rank, self.cp))
        k, v = gather_kv(*_mla_kv(kv, k_pe, v_dim=self.v_dim, **dims), self.cp_group)
        o = cp_attention(_mla_q(q, **dims), k, v, pos, chunk_starts(s, self.cp_rank, self.cp), dropout_p, d ** -0.5)
        return o[..., :self.v_dim].transpose(1, 2).reshape(b, s, self.local_heads * self.v_dim)

    def _up_core(self, q_lat, kv_lat, k_pe, key=None):
        return self._core(*self._up(q_lat, kv_lat), k_pe, key)

    @outside_graphs
    def _attend_rebuilding_up(self, q_lat, kv_lat, k_pe, key=None):
        """The up projections and the core, the attention kernel's q, k and v rebuilt for its backward from the
        latents (RebuiltForBackward, around the kernel) rather than kept: without a query latent only k and v (q is the
        block input's projection, q_lat here, which rebuilding would have to keep)."""
        d = self.nope + self.rope
        dims = dict(heads=self.local_heads, nope=self.nope, rope=self.rope, width=max(d, self.v_dim),
                    theta=self.rope_theta)
        kv_dims = dict(dims, v_dim=self.v_dim)

        def kv_part(kv_lat=kv_lat, k_pe=k_pe):
            return _mla_kv(F.linear(kv_lat, self.wkv_up), k_pe, **kv_dims)

        if self.q_lora:
            def q_part(q_lat=q_lat):
                return _mla_q(F.linear(q_lat, self.wq_up), **dims)

            def rebuild():  # the same ops on the same latents and weights (the current ones: FSDP2's gathered)
                return (q_part(), *kv_part())
            q = q_part()
        else:
            rebuild, q = kv_part, _mla_q(q_lat, **dims)
        k, v = kv_part()
        handle = RebuiltForBackward((q, k, v) if self.q_lora else (k, v), rebuild, k.device.type)
        attend = functools.partial(_mla_attend, d=d, v_dim=self.v_dim)
        if attention_dropout_p(self.dropout, key) > 0:
            attend = functools.partial(_dropout_attention, attend, self.dropout, key, self.dropout_layer)
        with handle.hooks():
            return attend(q, k, v)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, i: int, tp_group, sp: bool, recompute: str, *, ffn: Optional[int] = None,
                 name: str = "mlp"):
        super().__init__()
        h, f, gpt = cfg.hidden, ffn or cfg.ffn_hidden, cfg.arch == "gpt"
        self.tp_group, self.sp, self.selective, self.gpt = tp_group, sp, recompute == "selective", gpt
        n = f"layers.{i}.{name}"
        out_std = INIT_STD / math.sqrt(2 * cfg.layers)
        if gpt:
            self.fc1 = ColumnParallelLinear(h, f, tp_group, name=f"{n}.fc1", bias=True)
            self.fc2 = RowParallelLinear(f, h, tp_group, name=f"{n}.fc2", bias=True, sequence_parallel=sp, std=out_std)
        else:
            self.gate = ColumnParallelLinear(h, f, tp_group, name=f"{n}.gate")
            self.up = ColumnParallelLinear(h, f, tp_group, name=f"{n}.up")
            self.down = RowParallelLinear(f, h, tp_group, name=f"{n}.down", sequence_parallel=sp, std=out_std)

    def _act(self, *args):
        if self.selective:
            return checkpoint(F.gelu if self.gpt else _swiglu, *args, use_reentrant=False)
        return F.gelu(*args) if self.gpt else _swiglu(*args)

    def inputs(self) -> list:
        """The column-parallel linears that read the MLP's input (fc1; gate and up)."""
        return [self.fc1] if self.gpt else [self.gate, self.up]

    def output(self):
        """The row-parallel linear that writes its output (fc2; down)."""
        return self.fc2 if self.gpt else self.down

    def forward(self, x):
        # (b, s, f/tp) each, the whole sequence
        return self.output()(self._act(*column_parallel_linears(x, self.inputs(), self.tp_group,
                                                                 sequence_parallel=self.sp)))


class Block(nn.Module):
    """norm1, attention, residual; norm2, MLP (an MoE block's: router and experts, and a shared expert where the model
    has one), residual; with post-norms (Gemma 2 / 3, GLM-4) a norm on each sublayer's output before its residual, and
    with norms_after (OLMo 2 / 3, EXAONE 4) only those: no input norms.
    moe_recompute (training.moe_recompute; StageModule passes "none" to the blocks it checkpoints whole, where nothing
    more is dropped), in an MoE block only, as Megatron-LM's --recompute-modules moe_act and layernorm touch only the
    routed experts' activation and the MoE block's pre-MLP norm (a dense block's MLP norm is fused into its first
    linear there, and the shared expert's activation is kept):
      act       the routed experts' activation output, the down GEMM's input, not kept but rebuilt for its backward
                from the kept gate, up and probabilities (MoEMLP.act_recompute)
      norm-act  that, and norm2's output (the router's input and the shared expert's, h a token of the rank's sequence
                shard) not kept but rebuilt from norm2's input, which the norm's own backward keeps: every op of the
                MLP that saves it (or a view of it) saves a handle instead (parallel_layers.rebuild)
    Both are saved_tensors_hooks pairs, not checkpoints (which would keep a checkpointed activation's output where the
    next GEMM saves it); the values and gradients are those of the run without them, to the bit.  The memory they free
    is cost_models.moe.recomputed_bytes.  Beside selective recompute (the attention core, and the experts' SwiGLU,
    checkpointed) they free the same; under the zero-bubble schedules the input-gradient pass runs the experts' and
    the router's backward whole (their weight gradients are not queued), so what they rebuild lives through that pass
    only, and a shared expert's queued weight pass holds its input as it would without them."""

    def __init__(self, cfg: ModelConfig, i: int, tp_group, sp: bool, recompute: str, cp_group=None, ep_group=None,
                 moe_state: Optional[MoEState] = None, mla_recompute: bool = False, moe_recompute: str = "none"):
        super().__init__()
        self.layer_id = i
        # the input norms, but where the model puts its two norms after the sublayers (ModelConfig.norms_after: OLMo 2)
        pre = not cfg.norms_after
        self.norm1 = Norm(cfg, tp_group, name=f"layers.{i}.norm1", sequence_parallel=sp) if pre else None
        self.attn = (MLAttention(cfg, i, tp_group, sp, recompute, cp_group, mla_recompute) if cfg.kv_lora_rank
                     else Attention(cfg, i, tp_group, sp, recompute, cp_group))
        # attention and MLP side by side on norm1 (ModelConfig.parallel_block: GPT-J, Command R): no second norm
        self.parallel = cfg.parallel_block
        self.tp_group, self.sp = tp_group, sp
        self.norm2 = Norm(cfg, tp_group, name=f"layers.{i}.norm2", sequence_parallel=sp) \
            if pre and not self.parallel else None
        # post-norms (ModelConfig.post_norms, or norms_after's two): the same Norm on the attention's and the MLP's
        # outputs, on the rank's sequence shard with SP (a row-parallel output is reduce-scattered before it), whole
        # without
        self.post_norm1, self.post_norm2 = ((Norm(cfg, tp_group, name=f"layers.{i}.post_norm1", sequence_parallel=sp),
                                             Norm(cfg, tp_group, name=f"layers.{i}.post_norm2", sequence_parallel=sp))
                                            if cfg.post_norms or cfg.norms_after else (None, None))
        # a mixture of experts' MoE block, or its dense blocks between (ModelConfig.is_moe_block): a dense MLP of dense_ffn
        moe_block = cfg.is_moe_block(i)
        if recompute == "selective-op":  # (refused for a mixture of experts: planner.core.parplan_moe_problem)
            moe_recompute = "none"
        self.mlp = (MoEMLP(cfg, i, tp_group, sp, ep_group, cp_group=cp_group, state=moe_state,
                           selective=recompute == "selective", act_recompute=moe_recompute in ("act", "norm-act"))
                    if moe_block else MLP(cfg, i, tp_group, sp, recompute, ffn=cfg.dense_ffn if cfg.experts else None))
        self.norm_recompute = moe_block and moe_recompute == "norm-act"
        # a mixture of experts' shared expert: a dense tensor-parallel SwiGLU beside the routed ones
        self.shared_mlp = (MLP(cfg, i, tp_group, sp, recompute, ffn=cfg.shared_ffn, name="shared_mlp")
                           if moe_block and cfg.shared_ffn else None)
        # op-level selective checkpointing lives inside the block's forward, so a compiled block
        # (Module.compile) compiles the checkpoint with its policy, as torchtitan wraps before it
        # compiles; checkpointed outside, a compiled block is one opaque function to the policy, which
        # then keeps nearly nothing (a CPU trace: 72 KB where the policy keeps 417 KB, full recompute 5 KB)
        self.op_sac = recompute == "selective-op"

    def forward(self, x, key: Optional[torch.Tensor] = None):
        """key: the micro-batch's dropout key (parallel_layers.dropout), an argument so a checkpointed block's
        recompute draws the same masks."""
        if self.op_sac:
            return checkpoint(self._forward, x, key, use_reentrant=False, context_fn=op_sac_context)
        return self._forward(x, key)

    def _forward(self, x, key=None):
        if self.parallel:
            return self._parallel_forward(x, key)
        drop, layer, rows = self.attn.dropout, self.attn.dropout_layer, self.attn.dropout_layer_rows
        a = self.attn(x if self.norm1 is None else self.norm1(x), key)
        if self.post_norm1 is not None:
            a = self.post_norm1(a)
        x = x + hidden_dropout(a, drop, key, layer, "attention", rows)
        h = x if self.norm2 is None else self.norm2(x)
        if self.norm_recompute and torch.is_grad_enabled():  # norm2's output rebuilt for the MLP's backward
            with RebuiltForBackward([h], lambda x=x: (self.norm2(x),), h.device.type, views=True).hooks():
                y = self._mlp(h)
        else:
            y = self._mlp(h)
        if self.post_norm2 is not None:
            y = self.post_norm2(y)
        return x + hidden_dropout(y, drop, key, layer, "mlp", rows)

    def _mlp(self, h):
        return self.mlp(h) if self.shared_mlp is None else self.mlp(h) + self.shared_mlp(h)

    def _parallel_forward(self, x, key=None):
        """x + attention(norm1(x)) + mlp(norm1(x)) (ModelConfig.parallel_block), with one tensor-parallel collective a
        direction: the attention's q, k, v and the MLP's input projections read norm1's output together (one all-gather
        of it under SP, one reduction of its gradient), and the two output projections' partial sums are added before
        one reduction (an all-reduce, or under SP a reduce-scatter), their biases after it (GPT-J's, PaLM's parallel
        layers; GPT-NeoX's gpt_j_residual reduces the outputs once too)."""
        attn, mlp = self.attn, self.mlp
        h = self.norm1(x)
        q, k, v, *hidden = column_parallel_linears(h, [attn.wq, attn.wk, attn.wv, *mlp.inputs()], self.tp_group,
                                                   sequence_parallel=self.sp)
        out = mlp.output()
        y = attn.wo(attn.attend(q, k, v, key), reduce=False) + out(mlp._act(*hidden), reduce=False)
        y = (reduce_scatter_to_sequence_parallel_region(y, self.tp_group) if self.sp
             else reduce_from_tp_region(y, self.tp_group))
        if attn.wo.bias is not None:  # (gpt: both output projections have biases)
            y = y + (attn.wo.bias + out.bias)
        return x + hidden_dropout(y, attn.dropout, key, attn.dropout_layer, "mlp", attn.dropout_layer_rows)


class PositionEmbedding(_ShardedModule):
    """Learned positions (gpt), replicated over TP; with SP each rank adds its sequence chunk;
    with CP the global positions of the rank's two chunks (then SP's part of them)."""

    def __init__(self, cfg: ModelConfig, tp_group, sequence_parallel, cp_group=None):
        super().__init__(tp_group)
        self.sp = sequence_parallel and self.tp_size > 1
        self.cp = _size(cp_group)
        self.cp_rank = dist.get_rank(cp_group) if self.cp > 1 else 0
        self._new_param("weight", ShardSpec("positions.weight", (cfg.max_seq_len, cfg.hidden), None, "normal",
                                            sp_partial_grad=self.sp))

    def forward(self, x):  # x: (b, s_local, h)
        s_local = x.shape[1]
        start = self.tp_rank * s_local if self.sp else 0
        if self.cp > 1:
            s_cp = s_local * self.tp_size if self.sp else s_local
            pos = local_positions(s_cp, self.cp_rank, self.cp, x.device)[start:start + s_local]
            return x + self.weight[pos]
        return x + self.weight[start:start + s_local]


class StageModule(nn.Module):
    """One (virtual) pipeline stage: optional embedding, a run of blocks, optional final norm +
    head.  forward: token ids (b, s) or hidden (b, s[/tp], h) -> hidden, or logits (b, s, V/tp)
    on the last stage."""

    def __init__(self, cfg: ModelConfig, layer_ids: list[int], *, first: bool, last: bool, tp_group,
                 sp: bool = False, recompute: str = "none", autocast_dtype: Optional[torch.dtype] = None,
                 device_type: str = "cpu", cp_group=None, recompute_layers: Optional[int] = None, ep_group=None,
                 moe_state: Optional[MoEState] = None, mla_recompute: bool = False, moe_recompute: str = "none"):
        super().__init__()
        self.cfg, self.first, self.last = cfg, first, last
        # full recompute checkpoints every block, or with recompute_layers the stage's first that many (Megatron-LM's
        # --recompute-method block), the others keeping their activations
        self.recomputed_blocks = (0 if recompute != "full" else
                                  len(layer_ids) if recompute_layers is None else min(recompute_layers, len(layer_ids)))
        self.autocast_dtype, self.device_type = autocast_dtype, device_type
        self.tp_group, self.sp = tp_group, sp
        if first:
            self.embed = VocabParallelEmbedding(cfg.vocab, cfg.hidden, tp_group, name="embedding", sequence_parallel=sp)
            self.positions = PositionEmbedding(cfg, tp_group, sp, cp_group) if not cfg.rope else None
        # a mixture of experts' recompute modules (Block) on the blocks not checkpointed whole
        self.blocks = nn.ModuleList([Block(cfg, i, tp_group, sp, recompute, cp_group, ep_group, moe_state,
                                           mla_recompute, moe_recompute if n >= self.recomputed_blocks else "none")
                                     for n, i in enumerate(layer_ids)])
        for block in self.blocks[:self.recomputed_blocks]:  # checkpointed whole: MLA's up projections with the rest
            if isinstance(block.attn, MLAttention):
                block.attn.up_recompute = False
        self.separate_tied_head = False
        # called with each part (embedding, block, head) before the forward uses its parameters: ZeRO-1/2's
        # gather of the stepped parameters still in flight from the last step (ShardedAdamW.wait_for)
        self.param_wait: Optional[Callable[[nn.Module], None]] = None
        self.dropout: Optional[DropoutState] = None  # set_dropout
        # free the logits' storage once the loss's backward has made their gradient (free_after_grad): set by the
        # runtime where nothing reads the logits after the loss (not under a pipeline schedule that merges outputs)
        self.free_logits_after_grad = False
        if last:
            self.final_norm = Norm(cfg, tp_group, name="final_norm", sequence_parallel=sp)
            name = "embedding" if cfg.tied_embeddings else "head"
            self.head = ColumnParallelLinear(cfg.hidden, cfg.vocab, tp_group, name=name, sequence_parallel=sp,
                                             pad_out=True)
            if cfg.tied_embeddings:
                if first:
                    self.head.weight = self.embed.weight  # one Parameter, one gradient
                else:
                    # the first stage lives on another rank: a copy whose gradient is summed
                    # with the embedding's (Megatron's embedding group)
                    self.separate_tied_head = True

    def set_dropout(self, state: Optional[DropoutState]) -> None:
        """Dropout as the plan trains (parallel_layers.dropout); None: none."""
        self.dropout = state
        for block in self.blocks:
            block.attn.dropout = state
            block.attn.dropout_layer_rows = None if state is None else torch.as_tensor(block.attn.dropout_layer).to(state.device)

    def forward(self, x):
        if self.autocast_dtype is not None:
            with torch.autocast(self.device_type, dtype=self.autocast_dtype):
                return self._forward(x)
        return self._forward(x)

    def _forward(self, x):
        wait = self.param_wait or (lambda module: None)
        # the micro-batch's dropout key, read once here and passed on as an argument (a recompute gets it again)
        key = self.dropout.current if self.dropout is not None else None
        if self.first:
            wait(self.embed)
            x = self.embed(x)  # (b, s[/tp], h)
            if self.positions is not None:
                wait(self.positions)
                x = self.positions(x)
            x = hidden_dropout(x, self.dropout, key, -1, "embedding")
        for i, block in enumerate(self.blocks):
            wait(block)
            # (op-level selective checkpointing is inside Block.forward)
            x = checkpoint(block, x, key, use_reentrant=False) if i < self.recomputed_blocks else block(x, key)
        if self.last:
            wait(self.final_norm)
            wait(self.head)
            x = self.head(self.final_norm(x))  # (b, s, V/tp)
            if self.free_logits_after_grad and x.requires_grad:
                free_after_grad(x)
        return x


def free_after_grad(t: torch.Tensor) -> None:
    """Release t's storage once autograd has made t's gradient: the logits, whose only reader after the loss's forward
    is the loss's backward (the fused cross-entropy saves them for it; the head's backward reads its input and
    weight).  torch.distributed.pipelining keeps the last stage's output in its forward cache, and its schedules in
    a local, until the stage's backward of that micro-batch ends: T x V/tp values through the blocks' backward, which
    the memory model does not count (a CPU allocator trace of a 1F1B last rank held the 8 MiB of a 512 x 8192 bf16
    micro-batch's logits at its peak).  Megatron-LM frees its pipeline outputs the same way (deallocate_output_tensor).
    The hook holds t weakly."""
    ref = weakref.ref(t)

    def hook(grad):
        out = ref()
        if out is not None:
            out.untyped_storage().resize_(0)
        return grad
    t.register_hook(hook)


def iter_shard_specs(root: nn.Module):
    """(qualified name, parameter, ShardSpec) for every distinct parameter under root,
    resolved through the modules so it survives fully_shard's Parameter replacement."""
    seen = set()
    for mod_name, mod in root.named_modules():
        for attr, spec in getattr(mod, "param_specs", {}).items():
            p = getattr(mod, attr)
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            yield (f"{mod_name}.{attr}" if mod_name else attr), p, spec


def seed_for(seed: int, name: str) -> int:
    """A stable 63-bit seed for (seed, logical name), independent of Python's hash salt."""
    return stable_seed(seed, name)


def full_logical_init(spec: ShardSpec, seed: int) -> torch.Tensor:
    """The parameter at its full logical shape, the same in any layout."""
    if spec.init == "ones":
        return torch.ones(spec.full_shape)
    if spec.init == "zeros":
        return torch.zeros(spec.full_shape)
    g = torch.Generator().manual_seed(seed_for(seed, spec.logical_name))
    return torch.randn(spec.full_shape, generator=g) * spec.std


def pad_tp_dim(full: torch.Tensor, spec: ShardSpec, tp: int) -> torch.Tensor:
    """The logical tensor with zero rows appended along its TP dimension up to a multiple of tp, where
    the spec pads (the vocabulary)."""
    size = full.shape[spec.tp_dim]
    if not spec.pad_tp_dim or size % tp == 0:
        return full
    pad = list(full.shape)
    pad[spec.tp_dim] = padded_size(size, tp) - size
    return torch.cat([full, full.new_zeros(pad)], dim=spec.tp_dim)


@torch.no_grad()
def init_parameters(root: nn.Module, seed: int) -> None:
    """Fill every parameter with its rank's slice of the full logical tensor, one at a time."""
    for mod in root.modules():
        for attr, spec in getattr(mod, "param_specs", {}).items():
            p = getattr(mod, attr)
            full = full_logical_init(spec, seed)
            if spec.tp_dim is not None and mod.tp_size > 1:
                full = pad_tp_dim(full, spec, mod.tp_size).chunk(mod.tp_size, dim=spec.tp_dim)[mod.tp_rank]
            if spec.ep_dim is not None and mod.ep_size > 1:  # a mixture of experts' weights: the rank's experts
                full = full.chunk(mod.ep_size, dim=spec.ep_dim)[mod.ep_rank]
            p.copy_(full.to(p.device, p.dtype))
