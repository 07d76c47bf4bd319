"""Megatron-style tensor-parallel layers: column/row-parallel linear, vocab-parallel embedding
and cross-entropy, each with its sequence-parallel (SP) variant.

Every parameter carries a ``ShardSpec`` (kept on the module in ``param_specs``, because
``fully_shard`` replaces Parameter objects and their attributes): its logical name, its full
logical shape, the dimension split over TP (or None when replicated) and how it is
initialised.  ``parallel_layers.model.init_parameters`` uses the specs to draw every
parameter at full shape from a generator seeded by (seed, logical name) and keep the rank's
slice, so the math is the same in any layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from parallel_layers import fp8 as fp8_gemms
from parallel_layers.precision import run_weight_pass_hooks
from parallel_layers.outside_graphs import outside_graphs
from parallel_layers.mappings import (
    SEQ_DIM,
    _all_reduce_start,
    _gather,
    _gather_start,
    _reduce_scatter_start,
    _size,
    reduce_from_tp_region,
    reduce_scatter_to_sequence_parallel_region,
)


@dataclass(frozen=True)
class ShardSpec:
    logical_name: str
    full_shape: tuple[int, ...]
    tp_dim: Optional[int]  # dimension split over the TP group; None = replicated over TP
    init: str  # "normal", "zeros" or "ones"
    std: float = 0.02
    # Replicated over TP but fed a sequence shard under SP (or, the q/k norms, the rank's own heads): each TP rank
    # holds a partial gradient that must be summed over the TP group (Megatron's sequence_parallel attribute).
    sp_partial_grad: bool = False
    # The TP-split dimension is padded with zero rows up to a multiple of tp where tp does not divide it
    # (the vocabulary, as Megatron pads it): the logical tensor is the unpadded one (init, checkpoints'
    # logical names and one-rank equality), the last TP rank holds the padding.
    pad_tp_dim: bool = False
    # A mixture of experts' expert weights (parallel_layers.moe): the dimension split over the expert-parallel group
    # (each rank its E / ep experts whole), None elsewhere
    ep_dim: Optional[int] = None


def padded_size(size: int, tp: int) -> int:
    """size rounded up to a multiple of tp."""
    return -(-size // tp) * tp


def _rank(group) -> int:
    return 0 if _size(group) == 1 else dist.get_rank(group)


class _ShardedModule(nn.Module):
    def __init__(self, tp_group):
        super().__init__()
        self.tp_group = tp_group
        self.tp_size = _size(tp_group)
        self.tp_rank = _rank(tp_group)
        self.param_specs: dict[str, ShardSpec] = {}

    def _new_param(self, attr: str, spec: ShardSpec) -> None:
        shape = list(spec.full_shape)
        if spec.tp_dim is not None:
            if spec.pad_tp_dim:
                shape[spec.tp_dim] = padded_size(shape[spec.tp_dim], self.tp_size)
            if shape[spec.tp_dim] % self.tp_size:
                raise ValueError(f"{spec.logical_name}: dim {spec.tp_dim} ({shape[spec.tp_dim]}) not divisible by tp={self.tp_size}")
            shape[spec.tp_dim] //= self.tp_size
        if spec.ep_dim is not None:
            shape[spec.ep_dim] //= getattr(self, "ep_size", 1)
        setattr(self, attr, nn.Parameter(torch.empty(shape)))
        self.param_specs[attr] = spec


def _will_run(ctx, n: int):
    """Which of a column-parallel Function's gradients this backward pass must make: (x, [weights],
    [biases given]).  torch's own zero-bubble weight pass (parplan's runtime under FSDP2; elsewhere the
    weight gradients are queued, WeightGradStore) runs the node twice, asking for the input gradient first
    and for the weight gradients later (torch.distributed.pipelining's stage_backward_input/_weight):
    each pass makes only what its graph task will use, so neither communicates twice.  (next_functions:
    one edge per tensor input, in order: x, the weights, the biases given; each a view's node, never a
    leaf's, which the engine cannot be asked about inside autograd.grad.)"""
    will_run = iter([node is not None and torch._C._will_engine_execute_node(node)
                     for node, _ in ctx.next_functions])
    need_x = next(will_run)
    need_w = [next(will_run) for _ in range(n)]
    need_b = [has and next(will_run) for has in ctx.has_bias]
    return need_x, need_w, need_b


def _input_grad(grads, weights, q=None):
    """sum_i dY_i W_i: the input gradient of linears that read one input (q: the gradients cast to FP8 for FP8
    GEMMs, parallel_layers.fp8)."""
    if q is not None:
        return fp8_gemms.input_grad(q, weights)
    gx = None
    for g, w in zip(grads, weights):
        part = g.matmul(w)
        gx = part if gx is None else gx + part
    return gx


class WeightGradStore:
    """The zero-bubble schedules' weight-gradient pass without a second autograd pass: the linears'
    backward makes the input gradient and queues each dW = dY^T X as a closure over the tensors it reads
    (its input X and the output gradients dY), which the weight pass runs (Megatron-LM's and the
    zero-bubble authors' WeightGradStore, sail-sg/zero-bubble-pipeline-parallelism).  A stage hands
    ``take`` to torch's PipelineStage as its ``dw_builder``: the input-gradient pass is then an ordinary
    backward that frees the block's graph, and the weight pass runs the closures it queued.

    torch's own weight pass (stage_backward_weight) runs one autograd.grad per parameter group through the
    retained graph, and a block under activation checkpointing re-runs its forward in every one of them:
    a CPU allocator trace found 7 re-runs per llama block held at once (pytorch/pytorch#136766).  Here a
    checkpointed block is re-run once, in the input-gradient pass, as under 1F1B."""

    def __init__(self):
        self._queued: list = []

    def defer(self, fn) -> None:
        self._queued.append(fn)

    def take(self):
        """The weight pass of what was queued since the last take (the input-gradient pass just run)."""
        fns, self._queued = self._queued, []

        def weight_pass() -> None:
            # outside the backward grad mode is on, and the saved inputs are graph tensors: dW would record a
            # graph that keeps dY and X alive with it
            with torch.no_grad():
                while fns:  # each closure's tensors are freed as it runs
                    fns.pop()()
        return weight_pass


def use_fp8_linears(modules) -> int:
    """Run these modules' column- and row-parallel linears' GEMMs in FP8 (a plan's training.fp8; the blocks',
    not the output layer's: parallel_layers.fp8); returns how many linears."""
    n = 0
    for mod in modules:
        for sub in mod.modules():
            if isinstance(sub, (ColumnParallelLinear, RowParallelLinear)):
                sub.fp8 = True
                n += 1
    return n


def defer_weight_grads(modules, store: WeightGradStore) -> int:
    """Queue the weight gradients of these modules' column- and row-parallel linears in `store` instead of
    making them in the backward; returns how many weights."""
    n = 0
    for mod in modules:
        for sub in mod.modules():
            if isinstance(sub, (ColumnParallelLinear, RowParallelLinear)):
                sub.weight.deferred_wgrad = store
                n += 1
    return n


def _store_of(params, need_w) -> Optional[WeightGradStore]:
    """The queue these weights' gradients go to in this pass (WeightGradStore), or None: made in the backward."""
    return getattr(params[0], "deferred_wgrad", None) if params and any(need_w) else None


def _queue_weight_grads(store: WeightGradStore, params, grads, x, need_w, need_b, sp_group=None, q=None):
    """A linears Function's backward with its weights' gradients queued in `store`: the biases' gradients now, the
    weights' as a closure for the weight pass, which adds them as autograd would and then runs the weights'
    weight-pass hooks (precision.register_weight_pass_hook), as autograd runs its post-accumulate-grad hooks: the
    master-weights hook folding p.grad into the fp32 main_grad, then the data-parallel reduction's count.
    sp_group: x is the saved sequence shard, gathered again in the weight pass.  q: the output gradients cast to
    FP8 (parallel_layers.fp8), which the weight pass then holds instead of the 16-bit ones."""
    # the saved input unpacks as a graph tensor: its grad_fn chain would keep the stage's input (and the graph's
    # nodes) alive until the weight pass
    x = x.detach()
    _, gbs = _param_grads(grads, x, [False] * len(need_w), need_b, params)
    if q is not None:
        grads = None  # the weight pass reads the FP8 copies only

    def weight_pass():
        full = x if sp_group is None else _gather(x, SEQ_DIM, sp_group)
        gws, _ = _param_grads(grads, full, need_w, [], params, q)
        for p, gw, need in zip(params, gws, need_w):
            if gw is not None:
                p.grad = gw if p.grad is None else p.grad.add_(gw)
            if need:  # made here, or added into main_grad by the fused GEMM
                run_weight_pass_hooks(p)
    store.defer(weight_pass)
    return [None] * len(need_w), gbs


def _param_grads(grads, x, need_w, need_b, params, q=None):
    """dW_i = dY_i^T x (over all leading dims) and db_i = sum dY_i, for the ones this pass needs.  A weight
    with a ``fused_wgrad`` kernel (precision.attach_main_grads) gets its dW added into its fp32 main_grad by
    that GEMM and returns no gradient to autograd; under FP8 (q: the output gradients cast once,
    parallel_layers.fp8; grads may then be None where no bias needs them) the GEMM writes fp32 there and the sum
    adds it in."""
    flat = x.flatten(0, -2)
    xq = fp8_gemms.wgrad_input(flat) if q is not None and any(need_w) else None  # once for the linears sharing x
    gws = []
    for i, (need, p) in enumerate(zip(need_w, params)):
        kernel = getattr(p, "fused_wgrad", None)
        if need and q is not None:
            gw = fp8_gemms.weight_grad(q[i], xq, torch.float32 if kernel is not None else q[i].dtype)
            if kernel is not None:
                p.main_grad = gw if p.main_grad is None else p.main_grad.add_(gw)
                gw = None
            gws.append(gw)
            continue
        if need and kernel is not None:
            kernel(p, grads[i].flatten(0, -2), flat)
            need = False
        gws.append(grads[i].flatten(0, -2).t().matmul(flat) if need else None)
    return gws, [g.sum(dim=tuple(range(g.dim() - 1))) if need else None for g, need in zip(grads or [], need_b)]


def _save(ctx, x, weights, group, biases, params, fp8) -> None:
    ctx.save_for_backward(x, *weights)
    ctx.group, ctx.has_bias, ctx.params, ctx.fp8 = group, [b is not None for b in biases], params, fp8


def _grads_fp8(ctx, grads, need_x, need_w):
    """An FP8 Function's output gradients cast to E5M2 once, for both its input- and weight-gradient GEMMs; None
    for a 16-bit one, or where the pass makes neither."""
    return fp8_gemms.cast_grads(grads) if ctx.fp8 and (need_x or any(need_w)) else None


def _linears(x, weights, biases, fp8):
    return fp8_gemms.forward(x, weights, biases) if fp8 else [F.linear(x, w, b) for w, b in zip(weights, biases)]


def _saved(ctx):
    """(x, weights, need_x, need_w, need_b) for a column-parallel Function's backward."""
    x, *weights = ctx.saved_tensors
    return (x, weights, *_will_run(ctx, len(weights)))


def _autocast_input(x):
    dev = x.device.type
    if torch.is_autocast_enabled(dev):  # what F.linear would cast to (and save)
        return x.to(torch.get_autocast_dtype(dev))
    return x


class _TPLinears(torch.autograd.Function):
    """Column-parallel matmuls of one input replicated over TP (no SP).  Forward: apply each (weight,
    bias).  Backward: the input gradient first, its all-reduce over TP started asynchronously, the
    weight gradients meanwhile, then the wait (Megatron-LM's async_tensor_model_parallel_allreduce in
    LinearWithGradAccumulationAndAsyncCommunication; the plain pair, copy_to_tp_region then F.linear,
    waits for the all-reduce after both)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, group, fp8, params, *weights_biases):
        n = len(params)
        weights, biases = weights_biases[:n], weights_biases[n:]
        x = _autocast_input(x)
        # under autocast, keep the 16-bit casts of the weights for the backward, as F.linear's own
        # backward does (the memory model's per-micro-batch casts of the amp recipe)
        weights = [_autocast_input(w) for w in weights]
        _save(ctx, x, weights, group, biases, params, fp8)
        return tuple(_linears(x, weights, biases, fp8))

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, *grads):
        x, weights, need_x, need_w, need_b = _saved(ctx)
        q = _grads_fp8(ctx, grads, need_x, need_w)
        # in place, beside the weight-gradient matmuls
        finish = _all_reduce_start(_input_grad(grads, weights, q), ctx.group, owned=True) if need_x else None
        store = _store_of(ctx.params, need_w)
        gws, gbs = (_queue_weight_grads(store, ctx.params, grads, x, need_w, need_b, q=q) if store is not None
                    else _param_grads(grads, x, need_w, need_b, ctx.params, q))
        return (finish() if finish is not None else None, None, None, None, *gws, *gbs)


class _SPGatherLinears(torch.autograd.Function):
    """Column-parallel matmuls of one sequence-parallel input that keep the input's shard for the
    backward, not the gathered sequence (Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication
    with sequence_parallel; Korthikanti et al. 2022 sec. 4.2.2).  Forward: all-gather x over the
    sequence, apply each (weight, bias).  Backward: start the all-gather of x again, make the input
    gradient meanwhile, start its reduce-scatter, then the weight gradients from the gathered x beside
    it.  Saves h/tp per token instead of h (autograd over the gathered tensor keeps all of it)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, group, fp8, params, *weights_biases):
        n = len(params)
        weights, biases = weights_biases[:n], weights_biases[n:]
        x = _autocast_input(x)  # at 1/tp the size
        full = _gather(x, SEQ_DIM, group)
        _save(ctx, x, weights, group, biases, params, fp8)
        return tuple(_linears(full, weights, biases, fp8))

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, *grads):
        x, weights, need_x, need_w, need_b = _saved(ctx)
        q = _grads_fp8(ctx, grads, need_x, need_w)
        store = _store_of(ctx.params, need_w)  # queued: the weight pass gathers x again for itself
        gather = _gather_start(x, SEQ_DIM, ctx.group) if any(need_w) and store is None else None  # beside the input-gradient matmuls
        gx = _input_grad(grads, weights, q) if need_x else None
        full = gather() if gather is not None else x  # it completes before the next collective is issued
        reduce = _reduce_scatter_start(gx, SEQ_DIM, ctx.group, owned=True) if need_x else None  # beside the weight gradients
        gws, gbs = (_queue_weight_grads(store, ctx.params, grads, x, need_w, need_b, sp_group=ctx.group, q=q)
                    if store is not None else _param_grads(grads, full, need_w, need_b, ctx.params, q))
        return (reduce() if reduce is not None else None, None, None, None, *gws, *gbs)


def column_parallel_linears(x, linears, tp_group, *, sequence_parallel: bool):
    """Outputs of column-parallel linears that read the same input x: one all-gather (SP, keeping
    only x's shard for the backward: _SPGatherLinears) or one all-reduce of the input gradient, started
    before the weight gradients (_TPLinears).  On a TP group of one, F.linear, unless a weight's gradient
    is accumulated by a fused GEMM (``fused_wgrad``): then _TPLinears, whose all-reduce is the identity."""
    weights = [m.weight for m in linears]
    fp8 = any(getattr(m, "fp8", False) for m in linears)
    if _size(tp_group) == 1 and not _fused(weights) and not fp8:  # (SP on a group of one is the identity too)
        return [F.linear(x, m.weight, m.bias) for m in linears]
    fn = _SPGatherLinears if sequence_parallel and _size(tp_group) > 1 else _TPLinears
    return _apply_linears(fn, x, tp_group, weights, [m.bias for m in linears], fp8)


def _fused(weights) -> bool:
    """Whether these weights' gradients are made outside autograd's own linear backward: accumulated by a fused
    GEMM (``fused_wgrad``) or queued for a zero-bubble weight pass (``deferred_wgrad``, WeightGradStore)."""
    return any(getattr(w, "fused_wgrad", None) is not None or getattr(w, "deferred_wgrad", None) is not None
               for w in weights)


def _apply(fn, x, group, weights, biases, fp8=False):
    # views: non-leaf edges the Functions' backward can ask the engine about; the parameters themselves
    # (a tuple, which autograd passes through) for their main_grad
    tensors = [t if t is None else t.view_as(t) for t in [x, *weights, *biases]]
    return list(fn.apply(tensors[0], group, fp8, tuple(weights), *tensors[1:]))


# The fused weight-gradient accumulation outside torch.compile: inside a compiled block (parplan launch's default
# on CUDA) those linears run eagerly, so their backward runs the GEMM that adds into main_grad as the probe tested
# it (precision.wgrad_fusion_kernel).  A llama block then compiles into 5 graphs (15 graph breaks) instead of 1;
# the pointwise work between the linears stays compiled.  (outside_graphs: torch.compiler.disable once anything is
# compiled, parallel_layers.outside_graphs)
@outside_graphs
def _apply_eager(fn, x, group, weights, biases, fp8=False):
    return _apply(fn, x, group, weights, biases, fp8)


def _apply_linears(fn, x, group, weights, biases, fp8=False):
    # FP8 linears run eagerly too: their casts are compiled on their own (parallel_layers.fp8.cast)
    return (_apply_eager if _fused(weights) or fp8 else _apply)(fn, x, group, weights, biases, fp8)


class ColumnParallelLinear(_ShardedModule):
    """Y = X A + b with A split by columns (output features) over TP.

    Input is replicated (or, with SP, sequence-sharded and all-gathered here); output is
    split over the last dim.  weight: (out/tp, in).  fp8: its GEMMs in FP8 (use_fp8_linears)."""

    fp8 = False

    def __init__(self, in_features, out_features, tp_group, *, name, bias=False,
                 sequence_parallel=False, std=0.02, pad_out=False):
        super().__init__(tp_group)
        self.sequence_parallel = sequence_parallel
        self._new_param("weight", ShardSpec(f"{name}.weight", (out_features, in_features), 0, "normal", std,
                                            pad_tp_dim=pad_out))
        self.bias = None
        if bias:
            self._new_param("bias", ShardSpec(f"{name}.bias", (out_features,), 0, "zeros", pad_tp_dim=pad_out))

    def forward(self, x):  # (b, s[/tp], in) -> (b, s, out/tp)
        return column_parallel_linears(x, [self], self.tp_group, sequence_parallel=self.sequence_parallel)[0]


class RowParallelLinear(_ShardedModule):
    """Y = X A + b with A split by rows (input features) over TP.

    Input is split over the last dim; output is all-reduced (or, with SP, reduce-scattered
    over the sequence).  weight: (out, in/tp); bias replicated, added after the reduction.  fp8: its GEMMs in
    FP8 (use_fp8_linears)."""

    fp8 = False

    def __init__(self, in_features, out_features, tp_group, *, name, bias=False,
                 sequence_parallel=False, std=0.02):
        super().__init__(tp_group)
        self.sequence_parallel = sequence_parallel
        self._new_param("weight", ShardSpec(f"{name}.weight", (out_features, in_features), 1, "normal", std))
        self.bias = None
        if bias:
            self._new_param("bias", ShardSpec(f"{name}.bias", (out_features,), None, "zeros",
                                              sp_partial_grad=sequence_parallel and self.tp_size > 1))

    def forward(self, x, reduce: bool = True):
        """reduce False: the rank's partial sums, without the bias, for the caller to reduce with another layer's (a
        parallel block's attention and MLP outputs: parallel_layers.model.Block)."""
        # partial sums, (b, s, out); through _TPLinears on a group of one (no collective) where the weight
        # gradient is accumulated by a fused GEMM
        y = _apply_linears(_TPLinears, x, None, [self.weight], [None], self.fp8)[0] \
            if _fused([self.weight]) or self.fp8 else F.linear(x, self.weight)
        if not reduce:
            return y
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel_region(y, self.tp_group)  # (b, s/tp, out)
        else:
            y = reduce_from_tp_region(y, self.tp_group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(_ShardedModule):
    """Embedding table split by vocabulary rows over TP; rank r owns ids
    [r*V'/tp, (r+1)*V'/tp), V' the vocabulary padded to a multiple of tp (the padding rows, on the
    last rank, are zero and never looked up).  Out-of-range ids look up zeros; the partial results are
    summed over TP (all-reduce, or reduce-scatter over the sequence with SP)."""

    def __init__(self, vocab, hidden, tp_group, *, name, sequence_parallel=False, std=0.02):
        super().__init__(tp_group)
        self.sequence_parallel = sequence_parallel
        self._new_param("weight", ShardSpec(f"{name}.weight", (vocab, hidden), 0, "normal", std, pad_tp_dim=True))
        per_rank = padded_size(vocab, self.tp_size) // self.tp_size
        self.vocab_start = self.tp_rank * per_rank
        self.vocab_end = self.vocab_start + per_rank

    def forward(self, ids):
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        y = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_parallel_region(y, self.tp_group)
        return reduce_from_tp_region(y, self.tp_group)


# Rows of logits the fused cross-entropy upcasts to fp32 at a time.  A chunk's log_softmax/softmax holds two fp32
# chunk-sized tensors (the upcast and the result), each under this many bytes and under 1/32 of the logits' own
# bytes, so together they add at most 1/32 to the loss's peak of logits and gradient (which the memory model
# counts: cost_models.memory.logits_bytes, fused with grad_16bit)
CE_CHUNK_BYTES = 32 * 2**20


def _ce_chunk_rows(flat: torch.Tensor) -> int:
    n, v = flat.shape
    return max(1, min(CE_CHUNK_BYTES, n * v * flat.element_size() // 32) // (4 * v))


class _FusedVocabParallelCE(torch.autograd.Function):
    """Mean token cross-entropy over vocabulary-split logits that keeps them in their own dtype: what flash-attn's
    cross-entropy (flash_attn/ops/triton/cross_entropy.py, llm-foundry's default loss) keeps, in plain torch.
    Forward: per chunk of rows, log_softmax upcast to fp32 gives the chunk's log-sum-exp, read at each row's
    largest logit (z_k - log p_k, log p_k in [-log V, 0]: no cancellation), then over TP one all-reduce of the
    maxima and one of the rescaled sums and target logits; saves the logits and per-row fp32 statistics.
    Backward: per chunk, softmax upcast to fp32, rescaled to the global log-sum-exp and by the incoming gradient,
    minus it at the target, written in the logits' dtype into one new contiguous tensor.  Memory at its peak:
    the logits and their gradient, 2 x their bytes (cost_models.memory.logits_bytes, fused with grad_16bit),
    and two fp32 chunks (_ce_chunk_rows: together at most 1/16 of the logits' bytes, uncounted).  Traffic, eager
    kernels, per logit: forward the argmax (2), the upcast (2 + 4) and log_softmax's max, sum and write passes
    (4 + 4 + 4 + 4); backward the upcast, softmax's passes and the scaling written straight into the 16-bit
    gradient (4 + 2): 52 bytes (compute.CE_BYTES_PER_LOGIT_PARPLAN_FUSED), the autograd loss's, where flash-attn's
    one Triton pass each way moves 6; what it saves is memory.  Every target counts (no ignore_index)."""

    @staticmethod
    def forward(ctx, logits, target, tp_group, vocab):
        v_local = logits.shape[-1]
        flat = logits.reshape(-1, v_local)
        t = target.reshape(-1)
        start = _rank(tp_group) * v_local
        # local columns before the padding past the vocabulary (0 on a rank holding padding only: tiny vocabularies)
        pad_from = v_local if vocab is None else max(0, min(v_local, vocab - start))
        rows = _ce_chunk_rows(flat)
        n = flat.shape[0]
        lse_local = torch.full((n,), float("-inf"), dtype=torch.float32, device=logits.device)
        for r0 in range(0, n, rows) if pad_from else ():
            z = flat[r0:r0 + rows, :pad_from]
            k = z.argmax(dim=-1, keepdim=True)
            logp = torch.log_softmax(z, dim=-1, dtype=torch.float32).gather(-1, k).squeeze(-1)
            lse_local[r0:r0 + rows] = z.gather(-1, k).squeeze(-1).float() - logp
            del logp
        inside = (t >= start) & (t < start + pad_from)
        local_t = (t - start).masked_fill(~inside, 0)
        picked = flat.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).float().masked_fill(~inside, 0.0)
        lse = lse_local
        if _size(tp_group) > 1:
            m = lse_local.clone()
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=tp_group)
            total = (lse_local - m).exp_()
            dist.all_reduce(total, group=tp_group)
            lse = m + total.log_()
            dist.all_reduce(picked, group=tp_group)
        ctx.save_for_backward(logits, lse_local, lse, local_t, inside)
        ctx.pad_from, ctx.rows = pad_from, rows
        return (lse - picked).mean()

    @staticmethod
    def backward(ctx, grad_out):
        logits, lse_local, lse, local_t, inside = ctx.saved_tensors
        v_local = logits.shape[-1]
        flat = logits.reshape(-1, v_local)
        n = flat.shape[0]
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # contiguous, whatever the logits'
        gflat = grad.view(-1, v_local)
        if ctx.pad_from < v_local:
            gflat[:, ctx.pad_from:] = 0  # the padding's logits were masked out of the softmax
        scale = grad_out.float() / n
        # softmax over this rank's columns times exp(lse_local - lse) is the global softmax there
        row_scale = (lse_local - lse).exp_().mul_(scale)
        rows, pad_from = ctx.rows, ctx.pad_from
        for r0 in range(0, n, rows) if pad_from else ():
            p = torch.softmax(flat[r0:r0 + rows, :pad_from], dim=-1, dtype=torch.float32)
            rs = row_scale[r0:r0 + rows].unsqueeze(-1)
            t_c = local_t[r0:r0 + rows].unsqueeze(-1)
            at_t = p.gather(1, t_c) * rs - scale * inside[r0:r0 + rows].unsqueeze(-1)  # fp32, no cancellation in 16 bits
            g = gflat[r0:r0 + rows, :pad_from]
            torch.mul(p, rs, out=g)  # scaled and cast in one pass
            # the target's entry where this rank holds it (elsewhere column 0 gets its own value back): scatter, not
            # nonzero(), whose count would make the host wait for the GPU every chunk
            g.scatter_(1, t_c, at_t.to(g.dtype))
            del p
        return grad, None, None, None


def fused_vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, tp_group,
                                       vocab: int | None = None) -> torch.Tensor:
    """vocab_parallel_cross_entropy's value and gradient without an fp32 copy of the logits
    (_FusedVocabParallelCE); the gradient is in the logits' dtype (flash-attn's, llm-foundry's)."""
    return _FusedVocabParallelCE.apply(logits, target, tp_group, vocab)


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, tp_group,
                                 vocab: int | None = None) -> torch.Tensor:
    """Mean token cross-entropy of logits split over the vocabulary (last dim) across TP.
    vocab: the real vocabulary where the TP-split one is padded to a multiple of tp; the padding's
    logits are masked out of the softmax (their gradient is zero).

    logits: (b, s, V/tp) on each rank, target: (b, s) global ids.  Computes
    log(sum_v exp z_v) - z_target with the max, the exp-sum and the target logit reduced
    over TP (Megatron's _VocabParallelCrossEntropy, written with differentiable pieces: the
    partial exp-sums and target logits are summed with reduce_from_tp_region, whose identity
    backward is exact because every TP rank computes the same loss from the totals)."""
    logits = logits.float()
    n = _size(tp_group)
    if n == 1:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    v_local = logits.shape[-1]
    start = dist.get_rank(tp_group) * v_local
    if vocab is not None and start + v_local > vocab:
        padding = torch.arange(start, start + v_local, device=logits.device) >= vocab
        logits = logits.masked_fill(padding, float("-inf"))
    with torch.no_grad():
        m = logits.max(dim=-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=tp_group)
    z = logits - m.unsqueeze(-1)
    sum_exp = reduce_from_tp_region(z.exp().sum(dim=-1), tp_group)  # (b, s)
    inside = (target >= start) & (target < start + v_local)
    local_t = (target - start).masked_fill(~inside, 0)
    picked = z.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
    picked = reduce_from_tp_region(picked, tp_group)  # (b, s)
    return (sum_exp.log() - picked).mean()
